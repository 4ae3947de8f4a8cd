"""Interval estimates and paired tests used by the evaluation tasks (no SciPy: exact binomial sums in float64, from
``fpa_lightning.analysis.binomial``, which the probes' sign test shares).

* ``bootstrap_mean``: percentile bootstrap of a mean over independent units (books, sequences), one
  resample shared by every column so that per-bucket intervals come from the same resampled sets.
* ``clopper_pearson``: exact binomial interval, found by bisection on the binomial tail probabilities.
* ``mcnemar_exact``: exact McNemar test = a sign test on the discordant pairs.
* ``non_inferiority``: the verdict rule of the paper's SlimPajama comparison (upper bound of the paired
  difference A − B below the margin). Applied to one pair of trained models it judges evaluation noise only, so the
  tasks give no verdict from one pair; the verdict across training seeds is ``seeds.seed_verdict``.

Statistics across training seeds (t-interval, hierarchical bootstrap, sign test) are in ``seeds.py``.
"""
from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass

import numpy as np

from fpa_lightning.analysis.binomial import binomial_at_least, binomial_cdf


@dataclass(frozen=True)
class Interval:
    estimate: float
    lower: float
    upper: float
    confidence: float

    def as_dict(self) -> dict:
        return asdict(self)


def bootstrap_mean(
    values: np.ndarray, n_boot: int = 10_000, confidence: float = 0.95, seed: int = 0
) -> list[Interval]:
    """Mean of each column of ``values`` (N units, K columns; a 1-D array is one column) with a percentile
    bootstrap interval over the N units. NaN entries (a unit that does not reach a column) are left out of
    that column's mean, in the estimate and in every resample."""
    data = np.asarray(values, dtype=np.float64)
    data = data[:, None] if data.ndim == 1 else data  # (N, K)
    if data.shape[0] == 0:
        raise ValueError("bootstrap_mean needs at least one unit")
    _check_confidence(confidence)
    rng = np.random.default_rng(seed)
    with warnings.catch_warnings():  # all-NaN slices (no unit reaches a column) are expected, not errors
        warnings.simplefilter("ignore", RuntimeWarning)
        estimate = np.nanmean(data, axis=0)  # (K,)
        means = np.concatenate([  # (n_boot, K), built in slices so memory stays O(slice · N · K)
            np.nanmean(data[rng.integers(0, data.shape[0], size=(n, data.shape[0]))], axis=1)
            for n in _slices(n_boot, max(1, 2**22 // data.size))
        ])
        tail = (1.0 - confidence) / 2.0
        # a resample without any unit reaching a column is NaN; nanquantile ignores it
        lower = np.nanquantile(means, tail, axis=0)
        upper = np.nanquantile(means, 1.0 - tail, axis=0)
    return [Interval(float(e), float(lo), float(hi), confidence) for e, lo, hi in zip(estimate, lower, upper)]


def _slices(total: int, size: int) -> list[int]:
    return [min(size, total - start) for start in range(0, total, size)]


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def _bisect(f, target: float, increasing: bool) -> float:
    """The p in [0, 1] where the monotone f(p) crosses target (to ~1e-15)."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if (f(mid) < target) == increasing:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def clopper_pearson(successes: int, trials: int, confidence: float = 0.95) -> Interval:
    """Exact (Clopper–Pearson) interval for a binomial proportion: the bounds are the p at which each tail
    probability equals (1 − confidence) / 2; 0 successes give lower 0, all successes upper 1."""
    _check_confidence(confidence)
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials >= 1, got {successes}/{trials}")
    tail = (1.0 - confidence) / 2.0
    # P(X ≥ k | p) rises with p; P(X ≤ k | p) falls with p
    lower = 0.0 if successes == 0 else _bisect(lambda p: binomial_at_least(successes, trials, p), tail, True)
    upper = 1.0 if successes == trials else _bisect(lambda p: binomial_cdf(successes, trials, p), tail, False)
    return Interval(successes / trials, lower, upper, confidence)


@dataclass(frozen=True)
class McNemar:
    """Exact McNemar test on paired binary outcomes. a_only: pairs where only A succeeded; b_only: only B."""

    both: int
    a_only: int
    b_only: int
    neither: int
    p_two_sided: float
    p_a_better: float  # one-sided: H1 = A succeeds more often than B (the paper's test)

    def as_dict(self) -> dict:
        return asdict(self)


def mcnemar_exact(a: np.ndarray, b: np.ndarray) -> McNemar:
    """Exact McNemar test for paired successes a, b (bool arrays over the same trials): under H0 the
    discordant pairs split Binomial(n_discordant, 1/2)."""
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"paired outcomes need equal shapes, got {a.shape} and {b.shape}")
    a_only, b_only = int((a & ~b).sum()), int((~a & b).sum())
    n = a_only + b_only
    p_a_better = binomial_at_least(a_only, n, 0.5)
    p_two = min(1.0, 2.0 * binomial_cdf(min(a_only, b_only), n, 0.5))
    return McNemar(int((a & b).sum()), a_only, b_only, int((~a & ~b).sum()), p_two, p_a_better)


def non_inferiority(difference: Interval, margin: float) -> str:
    """Verdict for a loss difference A − B (lower is better for A) against a non-inferiority margin > 0."""
    if margin <= 0:
        raise ValueError(f"the non-inferiority margin must be positive, got {margin}")
    if difference.upper < 0:
        return "superior"  # the whole interval lies below zero: A's loss is lower
    if difference.upper < margin:
        return "non-inferior"
    return "not shown non-inferior"
