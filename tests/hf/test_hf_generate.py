"""generate() through FPACache: greedy tokens equal fpa_lightning.generation.generate on the same model for every
backend, with and without eviction (the same keys kept); beam search reorders whole rows; misuse raises."""
import pytest
import torch

import transformers  # noqa: E402,F401  declared in the dev extra: a broken install fails here rather than skips
from _hf_helpers import BIASED, VARIANTS, left_padded, prompts, tiny_model  # noqa: E402

from fpa_lightning.generation import generate  # noqa: E402
from fpa_lightning.hf import FPACache  # noqa: E402

NEW = 10


def hf_greedy(model, rows, **kwargs):
    """HF generate on the left-padded rows -> (new tokens per row, the cache it decoded with)."""
    ids, mask = left_padded(rows)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, return_dict_in_generate=True,
                         **kwargs)
    return out.sequences[:, ids.shape[1]:].tolist(), out.past_key_values


def our_greedy(model, rows, **kwargs):
    ids, stats = generate(model.model, rows, NEW, return_stats=True, **kwargs)
    return [row[len(p):].tolist() for row, p in zip(ids, rows)], stats


@pytest.mark.parametrize("variant, attention", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_greedy_tokens_equal_our_generate(variant, attention):
    model, rows = tiny_model(**attention), prompts()
    hf, cache = hf_greedy(model, rows)
    ours, stats = our_greedy(model, rows)
    assert isinstance(cache, FPACache) and cache.get_seq_length() == 12 + NEW - 1  # the last token is not fed
    assert hf == ours


@pytest.mark.parametrize("variant, attention", BIASED, ids=[v[0] for v in BIASED])
def test_greedy_tokens_with_eviction_equal_our_generate(variant, attention):
    model, rows = tiny_model(**attention), prompts()
    threshold = -0.01 if variant == "selective" else -1.0  # Selective's bias is small in an untrained model
    hf, cache = hf_greedy(model, rows, prune_threshold=threshold)
    ours, stats = our_greedy(model, rows, prune_threshold=threshold)
    assert hf == ours
    assert cache.kept_fraction() == stats["kept_fraction"] < 1.0  # keys were really evicted, the same ones


def test_beam_search_through_the_cache_equals_beam_search_without_it():
    model, rows = tiny_model(backend="fpa"), prompts(seed=3)
    ids, mask = left_padded(rows)
    kwargs = {"attention_mask": mask, "max_new_tokens": 8, "num_beams": 3, "do_sample": False}
    cached = model.generate(ids, **kwargs)
    full = model.generate(ids, use_cache=False, **kwargs)  # a full forward per token
    assert torch.equal(cached, full)


def test_reordered_rows_continue_as_the_rows_they_came_from():
    model, rows = tiny_model(backend="fpa"), prompts(seed=4)
    ids, mask = left_padded(rows)
    steps = torch.randint(3, 64, (4, 3), generator=torch.Generator().manual_seed(5))
    order = torch.tensor([2, 0, 0])
    caches = [FPACache(model.model, prune_threshold=-1.0), FPACache(model.model, prune_threshold=-1.0)]
    with torch.no_grad():
        for cache in caches:
            model(ids, attention_mask=mask, past_key_values=cache, logits_to_keep=1)
            model(steps[0][:, None].expand(3, 1).contiguous(), past_key_values=cache)
        caches[1].reorder_cache(order)
        for step in steps[1:]:
            original = model(step[:, None], past_key_values=caches[0]).logits
            reordered = model(step[order][:, None], past_key_values=caches[1]).logits
            assert torch.equal(reordered, original[order])


def test_misuse_raises():
    fpa, sdpa = tiny_model(backend="fpa"), tiny_model(backend="sdpa")
    ids, mask = left_padded(prompts())
    with pytest.raises(ValueError, match="prune_threshold needs an attention bias"):
        sdpa.generate(ids, attention_mask=mask, max_new_tokens=2, prune_threshold=-5.0)
    with pytest.raises(ValueError, match="needs use_cache=True"):
        fpa.generate(ids, attention_mask=mask, max_new_tokens=2, prune_threshold=-5.0, use_cache=False)
    with pytest.raises(ValueError, match="leave cache_implementation unset"):
        fpa.generate(ids, attention_mask=mask, max_new_tokens=2, cache_implementation="static")
    with pytest.raises(ValueError, match="differs from the given cache"):
        fpa.generate(ids, attention_mask=mask, max_new_tokens=2, prune_threshold=-5.0,
                     past_key_values=FPACache(fpa.model))
    cache = FPACache(fpa.model)
    with pytest.raises(ValueError, match="pass logits_to_keep=1"):
        fpa(ids, attention_mask=mask, past_key_values=cache)
    with pytest.raises(NotImplementedError, match="cannot be cropped"):
        cache.crop(1)
