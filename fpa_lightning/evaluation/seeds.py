"""Comparisons across training seeds: what a reviewer can trust about "A beats B".

A paired interval from one pair of trained models covers only the sampling of evaluation items: retrained with
other initialisation seeds, the same comparison moves by more than that interval (docs/evaluation.md, "Comparing
across seeds"). So the unit of a verdict is the seed: for S seeds, each seed s gives one difference d_s = metric(A_s)
− metric(B_s) on the same items, and

* ``t_interval``: the Student-t interval of the mean of the d_s (S − 1 degrees of freedom); the only basis of a
  verdict (``seed_verdict``), and only with S ≥ 2. Where a task's several metrics are read together (pg19_long's
  position buckets), the verdict's interval is the t-interval at the Bonferroni level ``family_confidence``, so
  that one metric of many crossing 0 by chance is not read as a finding;
* ``hierarchical_bootstrap``: resample seeds, then within each resampled seed its item clusters (documents, works,
  rows), the mean of the resampled seeds' means; it adds the evaluation noise to the seed spread;
* ``sign_test``: the exact two-sided sign test of the d_s against 0 (ties left out);
* ``cluster_means``: one seed's evaluation-noise interval (bootstrap over its clusters).

Pure numpy and exact sums (``fpa_lightning.analysis.binomial``); no SciPy, no printing.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fpa_lightning.analysis.binomial import binomial_cdf
from fpa_lightning.evaluation.stats import Interval, _check_confidence, _slices

LOWER_IS_BETTER, HIGHER_IS_BETTER = "lower", "higher"
ONE_PAIR_NOTE = ("one pair of trained models: the interval covers evaluation noise only (the sampling of items), not "
                 "the spread between training seeds; a verdict needs >= 2 seeds per side (eval.py seeds)")


def fingerprint(items: Sequence) -> str:
    """A short hash of an item set (each item's token ids or text, in order): two result files were scored on the
    same items iff their fingerprints agree."""
    digest = hashlib.sha256()
    for item in items:
        digest.update(json.dumps(item if isinstance(item, (str, int)) else [int(v) for v in item]).encode())
        digest.update(b"\n")
    return digest.hexdigest()[:16]


def token_digest(ids) -> str:
    """A short hash of one item's token ids (a tensor, array or list of ints)."""
    array = np.asarray(ids.cpu() if hasattr(ids, "cpu") else ids, dtype=np.int64).reshape(-1)
    return hashlib.sha256(array.tobytes()).hexdigest()[:16]


def student_t_cdf(t: float, df: int) -> float:
    """P(T ≤ t) for Student's t with an integer number of degrees of freedom, in closed form (Abramowitz & Stegun
    26.7.3 and 26.7.4: a finite series in cos θ, θ = atan(t / √df))."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    theta = math.atan2(abs(t), math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2 == 1:  # P(|T| < |t|) = 2/π (θ + sin θ cos θ (1 + 2/3 cos² θ + … ))
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= c * c * (2 * k) / (2 * k + 1)
            total += term
        central = 2 / math.pi * (theta + s * c * total)
    else:  # P(|T| < |t|) = sin θ (1 + 1/2 cos² θ + 1·3/(2·4) cos⁴ θ + … )
        term, total = 1.0, 1.0
        for k in range(1, df // 2):
            term *= c * c * (2 * k - 1) / (2 * k)
            total += term
        central = s * total
    return 0.5 + math.copysign(central / 2, t)


def student_t_quantile(q: float, df: int) -> float:
    """The t with P(T ≤ t) = q (bisection on ``student_t_cdf`` to ~1e-12)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile level must be in (0, 1), got {q}")
    lo, hi = -1.0, 1.0
    while student_t_cdf(lo, df) > q:
        lo *= 2
    while student_t_cdf(hi, df) < q:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if student_t_cdf(mid, df) < q else (lo, mid)
    return (lo + hi) / 2


def t_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Mean ± t(1 − α/2, S − 1) · sd / √S over S ≥ 2 values (one per seed). Identical values give a zero width."""
    _check_confidence(confidence)
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        raise ValueError(f"a t-interval needs at least 2 values (seeds), got {x.size}")
    mean = float(x.mean())
    half = student_t_quantile(0.5 + confidence / 2, x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return Interval(mean, mean - half, mean + half, confidence)


@dataclass(frozen=True)
class SignTest:
    positive: int
    negative: int
    zero: int
    p_two_sided: float

    def as_dict(self) -> dict:
        return {"positive": self.positive, "negative": self.negative, "zero": self.zero,
                "p_two_sided": self.p_two_sided}


def sign_test(values: Sequence[float]) -> SignTest:
    """Exact two-sided sign test of values against 0: under H0 the nonzero signs split Binomial(n, 1/2);
    p = min(1, 2 P(X ≤ min(#positive, #negative))). Zeros are left out (n = 0 gives p = 1)."""
    x = np.asarray(values, dtype=np.float64)
    positive, negative = int((x > 0).sum()), int((x < 0).sum())
    n = positive + negative
    p = 1.0 if n == 0 else min(1.0, 2.0 * binomial_cdf(min(positive, negative), n, 0.5))
    return SignTest(positive, negative, int(x.size - n), p)


def _cluster_sums(values: np.ndarray, clusters: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Per cluster, the sum and the count of the non-NaN item values (an item a model does not reach is NaN)."""
    values = np.asarray(values, dtype=np.float64)
    keys = np.arange(values.size) if clusters is None else np.unique(np.asarray(clusters), return_inverse=True)[1]
    keys = np.asarray(keys).reshape(-1)
    ok = ~np.isnan(values)
    sums = np.bincount(keys, weights=np.where(ok, values, 0.0))
    counts = np.bincount(keys, weights=ok.astype(np.float64))
    return sums, counts


def _resampled_means(sums: np.ndarray, counts: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n means of cluster resamples (clusters drawn with replacement, the mean over their items), in slices so that
    memory stays O(slice · clusters)."""
    c = sums.size
    out = []
    for size in _slices(n, max(1, 2**22 // max(c, 1))):
        idx = rng.integers(0, c, size=(size, c))
        with np.errstate(invalid="ignore", divide="ignore"):
            out.append(sums[idx].sum(axis=1) / counts[idx].sum(axis=1))
    return np.concatenate(out) if out else np.empty(0)


def cluster_means(values: Sequence[float], clusters: Sequence | None = None, n_boot: int = 10_000,
                  confidence: float = 0.95, seed: int = 0) -> Interval:
    """One seed's mean over items with its evaluation-noise interval: a percentile bootstrap over clusters (items of
    one cluster, a document or a work, are resampled together; None: every item its own cluster)."""
    _check_confidence(confidence)
    labels = None if clusters is None else np.asarray(clusters)
    sums, counts = _cluster_sums(np.asarray(values, dtype=np.float64), labels)
    if counts.sum() == 0:
        raise ValueError("no item has a value")
    means = _resampled_means(sums, counts, n_boot, np.random.default_rng(seed))
    tail = (1 - confidence) / 2
    return Interval(float(sums.sum() / counts.sum()), float(np.nanquantile(means, tail)),
                    float(np.nanquantile(means, 1 - tail)), confidence)


def hierarchical_bootstrap(per_seed: Sequence[Sequence[float]], clusters: Sequence[Sequence] | None = None,
                           n_boot: int = 10_000, confidence: float = 0.95, seed: int = 0) -> Interval:
    """Percentile interval of the mean over seeds of each seed's mean item value, resampling at two levels: the S
    seeds with replacement, then, within each drawn seed independently, its clusters with replacement.

    per_seed[s]: seed s's item values (paired differences A − B); clusters[s]: their cluster labels (None: each item
    its own cluster). The estimate is the plain mean of the seeds' means."""
    _check_confidence(confidence)
    if len(per_seed) < 1:
        raise ValueError("the hierarchical bootstrap needs at least one seed")
    stats = [_cluster_sums(np.asarray(v, dtype=np.float64), None if clusters is None else np.asarray(clusters[s]))
             for s, v in enumerate(per_seed)]
    seed_means = np.array([s.sum() / c.sum() for s, c in stats])
    rng = np.random.default_rng(seed)
    n_seeds = len(per_seed)
    drawn = rng.integers(0, n_seeds, size=(n_boot, n_seeds))  # (n_boot, S): which seed fills each slot
    values = np.empty((n_boot, n_seeds))
    for s, (sums, counts) in enumerate(stats):  # every slot that drew seed s gets its own cluster resample
        slots = np.nonzero(drawn == s)
        values[slots] = _resampled_means(sums, counts, slots[0].size, rng)
    means = np.nanmean(values, axis=1)
    tail = (1 - confidence) / 2
    return Interval(float(seed_means.mean()), float(np.nanquantile(means, tail)),
                    float(np.nanquantile(means, 1 - tail)), confidence)


def family_confidence(confidence: float, metrics: int) -> float:
    """The confidence of each verdict's interval when ``metrics`` verdicts are read together (Bonferroni: the
    chance that any of them excludes 0 when none differs stays ≤ 1 − confidence)."""
    _check_confidence(confidence)
    if metrics < 1:
        raise ValueError(f"a family needs at least one metric, got {metrics}")
    return 1 - (1 - confidence) / metrics


def seed_verdict(interval: Interval, direction: str, margin: float | None = None) -> str:
    """The verdict of a seed-level interval of A − B: superior when the whole interval lies on A's better side of 0,
    inferior when it lies on the worse side, non-inferior when it lies within ``margin`` of 0 on the worse side,
    else inconclusive. ``direction``: "lower" (losses, costs) or "higher" (accuracies) is better."""
    if direction not in (LOWER_IS_BETTER, HIGHER_IS_BETTER):
        raise ValueError(f"direction must be {LOWER_IS_BETTER!r} or {HIGHER_IS_BETTER!r}, got {direction!r}")
    if margin is not None and margin <= 0:
        raise ValueError(f"the non-inferiority margin must be positive, got {margin}")
    sign = 1.0 if direction == LOWER_IS_BETTER else -1.0  # oriented: negative = A better
    worst, best = max(sign * interval.lower, sign * interval.upper), min(sign * interval.lower, sign * interval.upper)
    if worst < 0:
        return "superior"
    if best > 0:
        return "inferior"
    if margin is not None and worst < margin:
        return "non-inferior"
    return "inconclusive"


def compare_seeds(differences: Sequence[Sequence[float]], clusters: Sequence[Sequence] | None, direction: str,
                  margin: float | None = None, confidence: float = 0.95, n_boot: int = 10_000,
                  seed: int = 0, verdict_confidence: float | None = None) -> dict:
    """The seed-level comparison of one metric. differences[s]: seed s's item-level differences A − B (NaN where an
    item has no value); clusters[s]: their clusters. Returns per seed its difference and evaluation-noise interval,
    the mean over seeds, the t-interval, the verdict and the t-interval it rests on (at ``verdict_confidence``,
    default ``confidence``; None with one seed, with ``note`` saying why), the hierarchical bootstrap and the sign
    test."""
    verdict_confidence = confidence if verdict_confidence is None else verdict_confidence
    _check_confidence(verdict_confidence)
    per_seed = [cluster_means(d, None if clusters is None else clusters[s], n_boot, confidence, seed + s)
                for s, d in enumerate(differences)]
    estimates = [iv.estimate for iv in per_seed]
    out = {
        "direction": direction,
        "per_seed": [iv.as_dict() for iv in per_seed],
        "mean": float(np.mean(estimates)),
        "hierarchical_bootstrap": hierarchical_bootstrap(differences, clusters, n_boot, confidence, seed).as_dict(),
        "sign_test": sign_test(estimates).as_dict(),
        "margin": margin,
    }
    if len(differences) < 2:
        out.update(t_interval=None, verdict_interval=None, verdict=None, note=ONE_PAIR_NOTE)
    else:
        basis = t_interval(estimates, verdict_confidence)
        out.update(t_interval=t_interval(estimates, confidence).as_dict(), verdict_interval=basis.as_dict(),
                   verdict=seed_verdict(basis, direction, margin), note=None)
    return out
