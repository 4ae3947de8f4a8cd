"""Decoding through the KV cache equals the parallel forward (float64, to 1e-10), for every backend and variant:
greedy generation, prefill in pieces, and batched prompts of unequal length."""
import pytest
import torch

from fpa_lightning.generation import DecodeSession, generate

from _gen_helpers import VARIANTS, VOCAB

ATOL = 1e-10


def greedy_by_full_forward(decoder, prompt: torch.Tensor, n: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The reference: re-run the whole parallel forward at every step; returns the ids and each step's logits."""
    ids, logits = prompt, []
    for _ in range(n):
        last = decoder(ids[None])[0, -1]
        logits.append(last)
        ids = torch.cat([ids, last.argmax()[None]])
    return ids, logits


@pytest.mark.parametrize("attention", [v for _, v in VARIANTS], ids=[name for name, _ in VARIANTS])
def test_greedy_batched_unequal_prompts_equal_the_full_forward(make_decoder, attention):
    decoder = make_decoder(**attention)
    prompts = [torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n)) for n in (7, 3)]
    n_new = 6
    session = DecodeSession(decoder)
    logits = session.prefill(prompts, max_new_tokens=n_new)
    tokens = [[] for _ in prompts]
    cached_logits = [[] for _ in prompts]
    for _ in range(n_new):
        token = logits.argmax(dim=-1)
        for b in range(len(prompts)):
            tokens[b].append(token[b])
            cached_logits[b].append(logits[b].clone())
        logits = session.step(token)
    for b, prompt in enumerate(prompts):
        ids, reference = greedy_by_full_forward(decoder, prompt, n_new)
        assert torch.equal(torch.stack(tokens[b]), ids[len(prompt):])
        torch.testing.assert_close(torch.stack(cached_logits[b]), torch.stack(reference), atol=ATOL, rtol=0)
    # generate() runs the same machinery and returns the prompts followed by the same tokens
    out = generate(decoder, prompts, n_new)
    assert [o.tolist() for o in out] == [torch.cat([p, torch.stack(t)]).tolist() for p, t in zip(prompts, tokens)]


@pytest.mark.parametrize("attention", [v for _, v in VARIANTS], ids=[name for name, _ in VARIANTS])
def test_prefill_in_pieces_equals_one_parallel_forward(make_decoder, attention):
    decoder = make_decoder(seed=1, **attention)
    ids = torch.randint(0, VOCAB, (2, 17), generator=torch.Generator().manual_seed(3))
    reference = decoder(ids)  # (B, T, V)
    session = DecodeSession(decoder)
    first = session.prefill(list(ids[:, :5]))
    pieces = [session.extend(ids[:, 5:11]), session.extend(ids[:, 11:12]), session.extend(ids[:, 12:16])]
    last = session.step(ids[:, 16])
    torch.testing.assert_close(first, reference[:, 4], atol=ATOL, rtol=0)
    torch.testing.assert_close(torch.cat(pieces, dim=1), reference[:, 5:16], atol=ATOL, rtol=0)
    torch.testing.assert_close(last, reference[:, 16], atol=ATOL, rtol=0)
    assert session.cache.next_pos.tolist() == [17, 17]


def test_a_tensor_prompt_returns_a_tensor_and_eos_ends_rows(make_decoder):
    decoder = make_decoder(backend="fpa")
    prompt = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(0))
    free = generate(decoder, prompt, 5)
    assert free.shape == (2, 9) and torch.equal(free[:, :4], prompt)
    eos = int(free[0, 5])  # row 0's second new token
    ended = generate(decoder, prompt, 5, eos_id=eos)
    assert torch.equal(ended[0, :6], free[0, :6]) and (ended[0, 6:] == eos).all()  # finished rows repeat eos
    assert generate(decoder, prompt[0], 3).shape == (7,)  # a 1-D prompt gives a 1-D result
    assert generate(decoder, prompt, 0).equal(prompt)
