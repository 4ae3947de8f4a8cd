"""KV-cache pruning simulated in the parallel (chunked) forward pass.

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
Layers without a bias keep every key under the threshold rule. The patch replaces each attention backend's
forward on the instance only for the duration of the context; training code is untouched.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch

from fpa_lightning.attention.backends import AttentionBackend
from fpa_lightning.model import Decoder
from fpa_lightning.ops.blockwise import blockwise_attention


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
        """Pairs the rule rejects at their own step: (B, H or 1, n, hi) bool, or None (rejects nothing)."""
        if self.window is not None:
            return (rows[:, None] - keys[None, :]) >= self.window  # (n, hi), broadcast over batch and heads
        return None if bias is None else bias < self.threshold

    def describe(self) -> dict:
        return {"threshold": self.threshold} if self.window is None else {"window": self.window}


@dataclass
class KeptStats:
    """Per layer: Σ over (batch, head, query) of kept/(t+1), the number of such rows, kept and causal pairs,
    and pairs whose key was evicted although the bias is back above the threshold (non-monotone bias)."""

    fraction_sum: list[float]
    rows: list[int]
    kept_pairs: list[int]
    causal_pairs: list[int]
    revived_pairs: list[int]

    @classmethod
    def empty(cls, n_layer: int) -> "KeptStats":
        return cls([0.0] * n_layer, [0] * n_layer, [0] * n_layer, [0] * n_layer, [0] * n_layer)

    def per_layer_fraction(self) -> list[float]:
        return [f / r if r else float("nan") for f, r in zip(self.fraction_sum, self.rows)]

    def mean_fraction(self) -> float:
        """Mean over layers, heads and query positions of the fraction of the cache (t + 1 keys) kept."""
        fractions = self.per_layer_fraction()
        return sum(fractions) / len(fractions)

    def as_dict(self) -> dict:
        return {
            "kept_fraction": self.mean_fraction(),
            "kept_fraction_per_layer": self.per_layer_fraction(),
            "kept_pair_fraction": sum(self.kept_pairs) / max(1, sum(self.causal_pairs)),
            "revived_pairs": sum(self.revived_pairs),
        }


def _prune_block(
    rule: PruneRule, bias: torch.Tensor | None, lo: int, hi: int, evicted: torch.Tensor | None,
    stats: KeptStats, layer: int,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Bias rows lo..hi-1 with evicted pairs at −inf, and the per-key evicted flags after row hi − 1.

    bias: (B, H or 1, n, hi) or None. evicted: (B, H or 1, lo) bool flags for keys < lo, or None before any.
    """
    device = bias.device if bias is not None else None  # None only for a bias-less layer under the threshold rule
    rows = torch.arange(lo, hi, device=device)
    keys = torch.arange(hi, device=device)
    causal = keys[None, :] <= rows[:, None]  # (n, hi)
    rejected = rule.rejected(bias, rows, keys)
    if rejected is None:  # nothing is ever pruned in this layer (threshold rule, no bias): keep all keys
        n = hi - lo
        stats.fraction_sum[layer] += float(n)
        stats.rows[layer] += n
        stats.kept_pairs[layer] += int(causal.sum())
        stats.causal_pairs[layer] += int(causal.sum())
        return bias, evicted
    rejected = rejected & causal
    # evicted at row t = rejected at some row t' ≤ t (cumulative OR down the rows), or before this block
    evicted_rows = rejected.to(torch.uint8).cummax(dim=-2).values.bool()  # (B, H or 1, n, hi) or (n, hi)
    if evicted is not None:
        evicted_rows = evicted_rows | torch.nn.functional.pad(evicted, (0, hi - lo))[..., None, :]
    kept = ~evicted_rows & causal | (keys[None, :] == rows[:, None])  # the newest key is always kept
    if kept.dim() == 2:  # the window rule broadcasts over batch and heads
        kept = kept[None, None]
    kept_rows = kept.sum(dim=-1).float()  # (B, H or 1, n)
    stats.fraction_sum[layer] += float((kept_rows / (rows + 1).float()).sum())
    stats.rows[layer] += kept_rows.numel()
    stats.kept_pairs[layer] += int(kept_rows.sum())
    stats.causal_pairs[layer] += int(causal.sum()) * (kept_rows.numel() // (hi - lo))  # per (batch, head)
    stats.revived_pairs[layer] += int((evicted_rows & ~rejected & causal & (keys[None, :] != rows[:, None])).sum())
    # bias is a tensor here: the window rule always gets one (zeros for a layer without a bias)
    return bias.masked_fill(~kept, float("-inf")), evicted_rows.expand_as(kept)[..., -1, :]


def _pruned_forward(backend: AttentionBackend, rule: PruneRule, stats: KeptStats, layer: int):
    """A replacement for ``backend.forward``: the chunked path with the rule applied to every bias block."""

    def forward(x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ing = backend.bias_ingredients(x, q, k)

        def bias_block(lo: int, hi: int, carry):
            inner, evicted = carry if carry is not None else (None, None)
            bias, inner = backend.bias_block(ing, lo, hi, inner)  # (None, None) for a layer without a bias
            if bias is None and rule.window is not None:
                bias = q.new_zeros((1, 1, hi - lo, hi), dtype=torch.float32)
            bias, evicted = _prune_block(rule, bias, lo, hi, evicted, stats, layer)
            return bias, (inner, evicted)

        return blockwise_attention(q, k, v, bias_block, scale=backend.scale, block_size=backend.cfg.block_size)

    return forward


@contextmanager
def pruned_cache(decoder: Decoder, rule: PruneRule) -> Iterator[KeptStats]:
    """Within the context every attention layer of ``decoder`` runs with the pruning rule; yields the kept-key
    statistics, accumulated over every forward pass made inside the context."""
    stats = KeptStats.empty(len(decoder.blocks))
    backends = [block.attn.gates for block in decoder.blocks]
    for layer, backend in enumerate(backends):
        backend.forward = _pruned_forward(backend, rule, stats, layer)  # instance attribute shadows the method
    try:
        yield stats
    finally:
        for backend in backends:
            del backend.forward


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
