"""FPAForCausalLM: a save_pretrained / AutoModelForCausalLM round trip gives the Decoder's logits exactly, for every
backend; padded rows get the logits of their tokens alone; the loss is our token losses' mean."""
import dataclasses

import pytest
import torch

import transformers  # noqa: E402,F401  declared in the dev extra: a broken install fails here rather than skips
from _hf_helpers import VARIANTS, VOCAB, left_padded, prompts, tiny_config, tiny_model  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from fpa_lightning.export import load_hf  # noqa: E402
from fpa_lightning.hf import FPAConfig, FPAForCausalLM  # noqa: E402


@pytest.mark.parametrize("variant, attention", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_auto_model_round_trip_gives_identical_logits(tmp_path, variant, attention):
    model = tiny_model(**attention)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is FPAForCausalLM and loaded.model.cfg == model.model.cfg
    assert loaded.model.lm_head.weight is loaded.model.embed.weight  # tied embeddings stay tied
    ids = torch.randint(0, VOCAB, (2, 21), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model.model(ids)  # the Decoder itself
        assert torch.equal(loaded(ids).logits, expected)
        assert torch.equal(load_hf(str(tmp_path))(ids), expected)  # our own reader of the same folder


@pytest.mark.parametrize("variant, attention", [VARIANTS[4], VARIANTS[3], VARIANTS[0]], ids=["fpa", "fox", "sdpa"])
def test_padded_rows_get_the_logits_of_their_own_tokens(variant, attention):
    model = tiny_model(**attention)
    rows = prompts()
    ids, mask = left_padded(rows)
    T = ids.shape[1]
    right = torch.zeros_like(ids)  # the same rows right-padded: what our lm-eval adapter runs
    for b, row in enumerate(rows):
        right[b, : len(row)] = row
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits  # (B, T, V)
        reference = model.model(right)
        for b, row in enumerate(rows):
            L = len(row)
            assert torch.equal(logits[b, T - L:], reference[b, :L])
            torch.testing.assert_close(logits[b, T - L:], model.model(row[None])[0], rtol=1e-5, atol=1e-5)
            assert torch.equal(logits[b, : T - L], torch.zeros(T - L, VOCAB))
        flipped = model(right, attention_mask=mask.flip(1)).logits  # right padding through the same path
        assert all(torch.equal(flipped[b, : len(row)], reference[b, : len(row)]) for b, row in enumerate(rows))


def test_loss_is_the_mean_token_loss_and_last_logits_are_kept():
    model = tiny_model(backend="fpa")
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(2))
    labels = ids.clone()
    labels[0, :5] = -100  # no loss on these (e.g. a prompt)
    with torch.no_grad():
        out = model(ids, labels=labels)
        losses = model.model.token_losses(ids[:, :-1], ids[:, 1:])  # (B, T - 1)
        keep = labels[:, 1:] != -100
        torch.testing.assert_close(out.loss, losses[keep].mean(), rtol=1e-6, atol=0)
        assert torch.equal(model(ids, logits_to_keep=3).logits, out.logits[:, -3:])
        assert isinstance(model(ids, return_dict=False), tuple)


def test_unsupported_inputs_raise():
    model = tiny_model(backend="fpa")
    ids = torch.randint(0, VOCAB, (2, 6))
    with pytest.raises(ValueError, match="one contiguous run of ones"):
        model(ids, attention_mask=torch.tensor([[1, 1, 0, 1, 1, 1], [1] * 6]))
    with pytest.raises(ValueError, match="labels need every position's logits"):
        model(ids, labels=ids, logits_to_keep=1)


def test_untied_output_layer_round_trips_and_a_missing_weight_raises(tmp_path):
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    model = FPAForCausalLM(FPAConfig.from_model_config(dataclasses.replace(tiny_config(backend="fox"),
                                                                           tie_embeddings=False))).eval()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.model.lm_head.weight is not loaded.model.embed.weight
    ids = torch.randint(0, VOCAB, (1, 9))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model.model(ids))
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.norm.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing \['model.norm.weight'\]"):
        AutoModelForCausalLM.from_pretrained(tmp_path)
