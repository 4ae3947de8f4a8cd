"""Choosing the next token from logits: greedy, or sampling with temperature, top-k and top-p (nucleus)."""
from __future__ import annotations

import math

import torch


def check_sampling(temperature: float, top_k: int | None, top_p: float | None, vocab_size: int) -> None:
    """Raise ValueError for settings that cannot mean what the caller wants."""
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and not (isinstance(top_k, int) and 1 <= top_k <= vocab_size):
        raise ValueError(f"top_k must be an integer in [1, {vocab_size}] (the vocabulary), got {top_k!r}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if temperature == 0 and (top_k is not None or top_p is not None):
        raise ValueError("top_k and top_p apply to sampling; with temperature=0 (greedy) they would be ignored. "
                         "Give a temperature > 0 or drop them")


def next_tokens(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """logits (B, V) -> token ids (B,). temperature 0: argmax (the first maximum). Otherwise softmax(logits / T)
    restricted to the top_k most likely tokens and to the smallest set whose probability reaches top_p (the most
    likely token always stays), sampled with ``generator``."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    scores = logits.float() / temperature
    if top_k is not None:
        kth = scores.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        ordered, order = scores.sort(dim=-1, descending=True)
        probs = ordered.softmax(dim=-1)
        outside = probs.cumsum(dim=-1) - probs >= top_p  # the mass before this token already reaches top_p
        scores = scores.scatter(-1, order, ordered.masked_fill(outside, float("-inf")))
    return torch.multinomial(scores.softmax(dim=-1), 1, generator=generator)[:, 0]
