"""The KV cache's eviction rule (``PruneRule``), the one check of a prune threshold (``check_threshold``), the one
check of a rule against a model (``check_rule``), and the rule's masking form for the parallel forward
(``PruningHook``, counting into ``KeptStats``).

Decoding with a pruned cache drops key s from the cache at the first step t at which the rule rejects it, and the
key never returns. In the parallel forward the same thing is a mask: pair (t, s) is removed iff the rule rejected
key s at some step t' ≤ t. ``PruningHook`` computes exactly that ("eviction" semantics), one query block at a time,
carrying a per-key "evicted" flag from block to block, so it is exact for any bias:

* threshold rule: key s is rejected at step t when b[t, s] < threshold. For FPA (min reduction, key level),
  FoX, ALiBi, Selective Attention and DCP the bias is non-increasing in t for fixed s, so eviction equals
  masking each pair with b < threshold (``revived_pairs`` counts pairs where the two differ: 0 for a
  monotone bias; FPA with a query level is not monotone).
* window rule (the comparison for softmax): key s is kept while t − s < window.

The newest key (s = t) is never pruned: it was just written, and every query keeps at least one key. Layers
without a bias keep every key under the threshold rule (their bias is 0).

Users: the real cache (``DecodeSession``: its prefill runs ``PruningHook`` to learn which prompt keys to evict, its
steps ask ``PruneRule.rejects``), ``generate``, ``GenerationConfig`` and the transformers cache (``hf.FPACache``),
and the parallel simulation ``fpa_lightning.analysis.pruning.pruned_cache``, which imports from here (analysis sits
above generation; generation imports nothing from analysis).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fpa_lightning.model import Decoder


def check_threshold(threshold) -> float | None:
    """The one check of a prune threshold, whoever receives it (``PruneRule``, ``GenerationConfig``, ``generate``,
    ``FPACache``, the transformers ``generate``, the evaluation tasks): None (no eviction) or a number <= 0, −inf
    allowed (evicts nothing). Returns it as a float (or None); raises ValueError otherwise."""
    if threshold is None:
        return None
    number = isinstance(threshold, (int, float)) and not isinstance(threshold, bool)
    if not number or math.isnan(threshold):
        raise ValueError(f"prune_threshold must be a number <= 0 (or -inf, or None), got {threshold!r}")
    if threshold > 0:
        raise ValueError(f"prune_threshold must be <= 0: every bias is <= 0, so {threshold} would drop every key "
                         "but the newest")
    return float(threshold)


@dataclass(frozen=True)
class PruneRule:
    """Exactly one of: threshold (drop keys whose bias fell below it; ``check_threshold``) or window (keep the last
    `window` keys)."""

    threshold: float | None = None
    window: int | None = None

    def __post_init__(self) -> None:
        if (self.threshold is None) == (self.window is None):
            raise ValueError("a prune rule needs exactly one of threshold and window")
        if self.threshold is not None:
            object.__setattr__(self, "threshold", check_threshold(self.threshold))
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")

    def rejected(self, bias: torch.Tensor | None, rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor | None:
        """Pairs the rule rejects at their own step: (B, H or 1, n, hi) or (n, hi) bool; None: it rejects nothing
        (the threshold rule on a layer without a bias)."""
        return self.rejects(bias, rows[:, None] - keys[None, :])  # a window's (n, hi) broadcasts over (B, H)

    def rejects(self, bias: torch.Tensor | None, age: torch.Tensor) -> torch.Tensor | None:
        """The rule itself, for pairs of any layout: bias and age (t − s, query minus key position) broadcast
        together. The parallel form (``PruningHook``) and the KV cache's real eviction (``DecodeSession``) both
        ask here. None: the rule rejects nothing (the threshold rule on a layer without a bias)."""
        if self.window is not None:
            return age >= self.window
        return None if bias is None else bias < self.threshold

    def can_evict(self) -> bool:
        """False for the threshold −inf, below which no bias falls."""
        return self.window is not None or self.threshold > float("-inf")

    def describe(self) -> dict:
        return {"threshold": self.threshold} if self.window is None else {"window": self.window}


def threshold_rule(prune_threshold: float | None) -> PruneRule | None:
    """The eviction rule of a ``prune_threshold`` (checked by ``check_threshold``): None for None and for −inf (no
    bias falls below it: exactly no eviction, and no rule at all), else the threshold rule."""
    threshold = check_threshold(prune_threshold)
    return None if threshold is None or threshold == float("-inf") else PruneRule(threshold=threshold)


def check_rule(decoder: Decoder, rule: PruneRule | None) -> None:
    """The checks of a rule that depend on the model, for the real cache (``DecodeSession`` runs them, so
    ``generate`` and ``FPACache`` do): a threshold rule needs an attention bias, and cannot evict per head from a
    state all heads share. The window rule fits every model, and the threshold −inf evicts nothing."""
    if rule is None or rule.threshold is None or not rule.can_evict():
        return
    if not decoder.has_bias():
        raise ValueError("prune_threshold needs an attention bias (fpa, fox, alibi, selective, dcp); this model has "
                         "none, so no key would ever be dropped. For softmax the comparison is a sliding window: "
                         "DecodeSession(decoder, rule=PruneRule(window=...))")
    for i, block in enumerate(decoder.blocks):
        backend = block.attn.backend
        if backend.shared_key_state and backend.alibi:
            raise ValueError(f"layer {i}: {backend.label} keeps one state per key for all heads, but ALiBi makes its "
                             "bias (and so threshold eviction) differ per head: no cache form; use a window rule")


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
    """The bias hook (``BiasHook``, ``Decoder.bias_hooks``) of one layer under a prune rule: pairs whose key was
    evicted go to −inf (rule None: every key kept, the bias passed through and counted).

    Query blocks arrive in order (rows lo..hi-1 over keys 0..hi-1); the carry holds the per-key evicted flags
    (B, H or 1, lo) after row lo − 1, so a key rejected once stays out for every later query. bias_falls: the
    layer's bias never rises along the queries (``AttentionBackend.decode_bias_falls``), so a rejection already
    holds for every later row of the block and the running OR down the rows is skipped.
    """

    def __init__(self, rule: PruneRule | None, stats: KeptStats, layer: int, bias_falls: bool = False):
        self.rule, self.stats, self.layer, self.bias_falls = rule, stats, layer, bias_falls

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
        evicted_rows = rejected if self.bias_falls else rejected.to(torch.uint8).cummax(dim=-2).values.bool()
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
