"""KV-cache pruning, simulated in the parallel (chunked) forward pass: ``pruned_cache`` runs every attention layer
with the eviction rule's masking form, and ``window_for_fraction`` matches a softmax sliding window to a kept fraction.

The rule, its masking form and its bookkeeping (``PruneRule``, ``PruningHook``, ``KeptStats``) are the decoding
runtime's own (``fpa_lightning.generation.rule``, which states the eviction semantics), so the simulation and the
real KV cache (``fpa_lightning.generation.DecodeSession``) evict the same keys, to rounding. Imports go one way:
analysis uses generation, never the reverse. The rule reaches the layers through the documented bias hook
(``Decoder.bias_hooks``), which runs the chunked path; training code is untouched.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from fpa_lightning.generation.rule import KeptStats, PruneRule, PruningHook
from fpa_lightning.model import Decoder

__all__ = ["pruned_cache", "window_for_fraction"]


@contextmanager
def pruned_cache(decoder: Decoder, rule: PruneRule | None, block_size: int | None = None) -> Iterator[KeptStats]:
    """Within the context every attention layer of ``decoder`` runs with the pruning rule; yields the kept-key
    statistics, accumulated over every forward pass made inside the context.

    rule None keeps every key: the same hooked path unpruned, the exact partner of a pruned pass (same blocks,
    same rounding). block_size: query rows per block (``Decoder.bias_hooks``); the result does not depend on it."""
    stats = KeptStats.empty(len(decoder.blocks))
    falls = [block.attn.backend.decode_bias_falls for block in decoder.blocks]
    with decoder.bias_hooks(lambda layer: PruningHook(rule, stats, layer, falls[layer]), block_size):
        yield stats


def window_for_fraction(fraction: float, length: int) -> int:
    """The smallest sliding window whose mean kept fraction over queries t = 0..length-1 (min(t+1, w)/(t+1))
    reaches ``fraction``: the softmax comparison "a sliding window of the same mean size"."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"kept fraction must be in (0, 1], got {fraction}")
    t1 = torch.arange(1, length + 1, dtype=torch.float64)  # t + 1

    def mean_kept(window: int) -> float:
        return float((t1.clamp(max=window) / t1).mean())

    lo, hi = 1, length
    while lo < hi:  # mean_kept rises with the window
        mid = (lo + hi) // 2
        if mean_kept(mid) >= fraction:
            hi = mid
        else:
            lo = mid + 1
    return lo
