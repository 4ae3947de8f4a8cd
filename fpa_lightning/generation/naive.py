"""The readable definition of greedy decoding, beside the fast path (``generate``, through the KV cache): the argmax
of a full forward pass over everything so far, one token at a time. O(T²) per token; tests compare the cache's tokens
with it."""
from __future__ import annotations

import torch


@torch.no_grad()
def greedy_without_cache(decoder, prompt: list[int], steps: int, eos_id: int) -> list[int]:
    """The ``steps`` tokens (fewer when ``eos_id`` comes, which is kept) that greedy decoding adds to ``prompt``, each
    the argmax of ``decoder``'s logits at the last position of a full forward over prompt + tokens so far."""
    device = next(decoder.parameters()).device
    ids, new = list(prompt), []
    for _ in range(steps):
        nxt = int(decoder(torch.tensor([ids], device=device))[0, -1].argmax())  # (1, T, V) -> the last position
        new.append(nxt)
        ids.append(nxt)
        if nxt == eos_id:
            break
    return new
