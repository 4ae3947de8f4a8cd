"""KV-cache pruning: the eviction rule, its bookkeeping, and its simulation in the parallel (chunked) forward pass.

Decoding with a pruned cache drops key s from the cache at the first step t at which the rule rejects it,
and the key never returns. In the parallel forward the same thing is a mask: pair (t, s) is removed iff the
rule rejected key s at some step t' ≤ t. We compute exactly that ("eviction" semantics), one query block at
a time, carrying a per-key "evicted" flag from block to block, so the simulation is exact for any bias:

* threshold rule: key s is rejected at step t when b[t, s] < threshold. For FPA (min reduction, key level),
  FoX, ALiBi, Selective Attention and DCP the bias is non-increasing in t for fixed s, so eviction equals
  masking each pair with b < threshold (``revived_pairs`` counts pairs where the two differ: 0 for a
  monotone bias; FPA with a query level is not monotone).
* window rule (the comparison for softmax): key s is kept while t − s < window.

The newest key (s = t) is never pruned: it was just written, and every query keeps at least one key.
Layers without a bias keep every key under the threshold rule (their bias is 0). The rule reaches the layers
through the documented bias hook (``Decoder.bias_hooks``), which runs the chunked path; training code is untouched.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch

from fpa_lightning.model import Decoder


@dataclass(frozen=True)
class PruneRule:
    """Exactly one of: threshold (drop keys whose bias fell below it) or window (keep the last `window` keys)."""

    threshold: float | None = None
    window: int | None = None

    def __post_init__(self) -> None:
        if (self.threshold is None) == (self.window is None):
            raise ValueError("a prune rule needs exactly one of threshold and window")
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")

    def rejected(self, bias: torch.Tensor | None, rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor | None:
        """Pairs the rule rejects at their own step: (B, H or 1, n, hi) or (n, hi) bool; None: it rejects nothing
        (the threshold rule on a layer without a bias)."""
        return self.rejects(bias, rows[:, None] - keys[None, :])  # a window's (n, hi) broadcasts over (B, H)

    def rejects(self, bias: torch.Tensor | None, age: torch.Tensor) -> torch.Tensor | None:
        """The rule itself, for pairs of any layout: bias and age (t − s, query minus key position) broadcast
        together. The parallel simulation above and the KV cache's real eviction (``fpa_lightning.generation``)
        both ask here. None: the rule rejects nothing (the threshold rule on a layer without a bias)."""
        if self.window is not None:
            return age >= self.window
        return None if bias is None else bias < self.threshold

    def describe(self) -> dict:
        return {"threshold": self.threshold} if self.window is None else {"window": self.window}


@dataclass
class KeptStats:
    """Per layer: Σ over (batch, head, query) of kept/(t+1), the number of such rows, kept and causal pairs,
    and pairs whose key was evicted although the bias is back above the threshold (non-monotone bias).

    The sums stay on the model's device (0-dim tensors) until read: one host sync per read, not per block."""

    fraction_sum: list[torch.Tensor | float]
    rows: list[int]
    kept_pairs: list[torch.Tensor | int]
    causal_pairs: list[torch.Tensor | int]
    revived_pairs: list[torch.Tensor | int]

    @classmethod
    def empty(cls, n_layer: int) -> "KeptStats":
        return cls([0.0] * n_layer, [0] * n_layer, [0] * n_layer, [0] * n_layer, [0] * n_layer)

    def per_layer_fraction(self) -> list[float]:
        return [float(f) / r if r else float("nan") for f, r in zip(self.fraction_sum, self.rows)]

    def mean_fraction(self) -> float:
        """Mean over layers, heads and query positions of the fraction of the cache (t + 1 keys) kept."""
        fractions = self.per_layer_fraction()
        return sum(fractions) / len(fractions)

    def as_dict(self) -> dict:
        return {
            "kept_fraction": self.mean_fraction(),
            "kept_fraction_per_layer": self.per_layer_fraction(),
            "kept_pair_fraction": sum(int(k) for k in self.kept_pairs) / max(1, sum(int(c) for c in self.causal_pairs)),
            "revived_pairs": sum(int(r) for r in self.revived_pairs),
        }


class PruningHook:
    """The bias hook (``BiasHook``) of one layer under a prune rule: pairs whose key was evicted go to −inf
    (rule None: every key kept, the bias passed through and counted).

    Query blocks arrive in order (rows lo..hi-1 over keys 0..hi-1); the carry holds the per-key evicted flags
    (B, H or 1, lo) after row lo − 1, so a key rejected once stays out for every later query.
    """

    def __init__(self, rule: PruneRule | None, stats: KeptStats, layer: int):
        self.rule, self.stats, self.layer = rule, stats, layer

    def __call__(self, bias: torch.Tensor | None, rows: torch.Tensor, keys: torch.Tensor,
                 evicted: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        hi = keys.shape[0]
        causal = keys[None, :] <= rows[:, None]  # (n, hi)
        newest = keys[None, :] == rows[:, None]
        rejected = None if self.rule is None else self.rule.rejected(bias, rows, keys)
        if rejected is None:  # nothing is ever pruned in this layer (or no rule): every key kept
            self._count(causal[None, None], rows, causal, torch.zeros(()))
            return bias, evicted
        if bias is None:  # the window rule on a layer without a bias of its own
            bias = torch.zeros((1, 1, rows.shape[0], hi), device=rows.device)
        rejected = rejected & causal
        # evicted at row t = rejected at some row t' ≤ t (cumulative OR down the rows), or before this block
        evicted_rows = rejected.to(torch.uint8).cummax(dim=-2).values.bool()  # (B, H or 1, n, hi) or (n, hi)
        if evicted is not None:
            evicted_rows = evicted_rows | torch.nn.functional.pad(evicted, (0, hi - evicted.shape[-1]))[..., None, :]
        kept = ~evicted_rows & causal | newest  # the newest key is always kept
        if kept.dim() == 2:  # the window rule broadcasts over batch and heads
            kept = kept[None, None]
        self._count(kept, rows, causal, evicted_rows & ~rejected & causal & ~newest)
        return bias.masked_fill(~kept, float("-inf")), evicted_rows.expand_as(kept)[..., -1, :]

    def _count(self, kept: torch.Tensor, rows: torch.Tensor, causal: torch.Tensor, revived: torch.Tensor) -> None:
        stats, layer = self.stats, self.layer
        kept_rows = kept.sum(dim=-1)  # (B, H or 1, n), exact integer counts
        # float64 sums on the device: no host sync per block, and no rounding drift over many blocks
        stats.fraction_sum[layer] = stats.fraction_sum[layer] + (kept_rows / (rows + 1).double()).sum()
        stats.rows[layer] += kept_rows.numel()
        stats.kept_pairs[layer] = stats.kept_pairs[layer] + kept_rows.sum()
        per_head = kept_rows.numel() // rows.shape[0]  # (batch, head) pairs
        stats.causal_pairs[layer] = stats.causal_pairs[layer] + causal.sum() * per_head
        stats.revived_pairs[layer] = stats.revived_pairs[layer] + revived.sum()


@contextmanager
def pruned_cache(decoder: Decoder, rule: PruneRule | None, block_size: int | None = None) -> Iterator[KeptStats]:
    """Within the context every attention layer of ``decoder`` runs with the pruning rule; yields the kept-key
    statistics, accumulated over every forward pass made inside the context.

    rule None keeps every key: the same hooked path unpruned, the exact partner of a pruned pass (same blocks,
    same rounding). block_size: query rows per block (``Decoder.bias_hooks``); the result does not depend on it."""
    stats = KeptStats.empty(len(decoder.blocks))
    with decoder.bias_hooks(lambda layer: PruningHook(rule, stats, layer), block_size):
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
