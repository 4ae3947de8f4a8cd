"""generate(): reproducible sampling, and clear errors for arguments that cannot work."""
import pytest
import torch
from _gen_helpers import VOCAB

from fpa_lightning.generation import DecodeSession, PruneRule, generate, next_tokens


@pytest.fixture(scope="module")
def fpa(make_decoder):
    return make_decoder(backend="fpa")


@pytest.fixture(scope="module")
def prompt():
    return torch.randint(0, VOCAB, (3, 5), generator=torch.Generator().manual_seed(0))


def test_sampling_with_a_fixed_generator_is_reproducible(fpa, prompt):
    def sample(seed):
        return generate(fpa, prompt, 12, temperature=0.9, top_k=20, top_p=0.95,
                        generator=torch.Generator().manual_seed(seed))

    assert torch.equal(sample(1), sample(1))
    assert not torch.equal(sample(1), sample(2))


def test_top_k_and_top_p_restrict_the_candidates():
    logits = torch.tensor([[4.0, 3.0, 2.0, -1.0, -2.0]]).repeat(400, 1)
    draws = next_tokens(logits, 1.0, top_k=2, generator=torch.Generator().manual_seed(0))
    assert set(draws.tolist()) == {0, 1}
    probs = logits[0].softmax(-1)  # 0.66, 0.24, 0.09, ...: the first two already reach 0.9
    draws = next_tokens(logits, 1.0, top_p=float(probs[:2].sum()) - 1e-3, generator=torch.Generator().manual_seed(0))
    assert set(draws.tolist()) == {0, 1}
    assert next_tokens(logits[:1], 1.0, top_p=1e-6).item() == 0  # the most likely token always stays
    assert next_tokens(logits[:1]).item() == 0  # greedy


@pytest.mark.parametrize("kwargs, message", [
    ({"max_new_tokens": -1}, "max_new_tokens must be an integer >= 0"),
    ({"max_new_tokens": 2.5}, "max_new_tokens must be an integer >= 0"),
    ({"prune_threshold": 0.5}, "prune_threshold must be <= 0"),
    ({"prune_threshold": float("nan")}, "prune_threshold must be a number"),
    ({"temperature": -1.0}, "temperature must be a finite number >= 0"),
    ({"top_k": 5}, "with temperature=0 (greedy) they would be ignored"),
    ({"temperature": 1.0, "top_k": 0}, "top_k must be an integer in [1, 50]"),
    ({"temperature": 1.0, "top_p": 1.5}, "top_p must be in (0, 1]"),
    ({"eos_id": VOCAB}, "eos_id must be a token id in [0, 50)"),
])
def test_bad_arguments_say_what_is_wrong(fpa, prompt, kwargs, message):
    kwargs = {"max_new_tokens": 3, **kwargs}
    with pytest.raises(ValueError) as err:
        generate(fpa, prompt, **kwargs)
    assert message in str(err.value)


@pytest.mark.parametrize("input_ids, message", [
    (torch.zeros(2, 0, dtype=torch.long), "must be a non-empty 1-D sequence"),
    ([], "holds no prompt"),
    (torch.tensor([[1, 2, VOCAB]]), "token ids must lie in [0, 50)"),
    (torch.tensor([[1.0, 2.0]]), "token ids must be integers"),
    (torch.zeros(1, 2, 3, dtype=torch.long), "input_ids must be (B, T) or (T,)"),
])
def test_bad_prompts_say_what_is_wrong(fpa, input_ids, message):
    with pytest.raises(ValueError) as err:
        generate(fpa, input_ids, 2)
    assert message in str(err.value)


def test_refusals_of_the_session(make_decoder, fpa):
    with pytest.raises(ValueError, match="exceed max_length=8"):  # a prompt longer than supported
        DecodeSession(fpa, max_length=8).prefill([torch.arange(6)], max_new_tokens=3)
    with pytest.raises(ValueError, match="needs an attention bias"):
        generate(make_decoder(backend="sdpa"), torch.tensor([[1, 2]]), 2, prune_threshold=-10.0)
    with pytest.raises(ValueError, match="no cache form"):  # a layer-shared state with a per-head bias
        DecodeSession(make_decoder(backend="selective", positional="alibi"), rule=PruneRule(threshold=-1.0))
    with pytest.raises(ValueError, match="needs the model on a CUDA device"):
        DecodeSession(fpa, cuda_graph=True)
    with pytest.raises(RuntimeError, match="call prefill"):
        DecodeSession(fpa).step(torch.tensor([1]))
    with pytest.raises(TypeError, match="needs a fpa_lightning Decoder"):
        generate(torch.nn.Linear(2, 2), torch.tensor([[1]]), 1)
