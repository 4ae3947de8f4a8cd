"""Per-row statistics: seed successes and the exact one-sided sign test on discordant seed pairs.

Seeds are paired by index: seed i of backend A and seed i of backend B trained on the same pool and were scored on
the same held-out set. A pair is discordant when exactly one of the two succeeded. Under the null hypothesis (A is
no better than B) each discordant pair favours A with probability 1/2, so the one-sided p-value is
P(X ≥ a_only) for X ~ Binomial(a_only + b_only, 1/2); 11 of 11 discordant pairs for A gives 2⁻¹¹ ≈ 0.00049.

Many such tests are read together (the table holds over a hundred), so the report adjusts them as one family with
Holm's step-down method (``holm``) and bases its verdicts on the adjusted values. A count of ours against the paper's
count of the same row is compared with Fisher's exact test (``fisher_exact``).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from fpa_lightning.analysis.binomial import binomial_at_least

CRITERION = 0.99
"""Default success criterion: held-out accuracy at or above this, per seed."""


@dataclass(frozen=True)
class SignTest:
    a_only: int
    """Pairs where only A succeeded."""
    b_only: int
    """Pairs where only B succeeded."""
    pairs: int
    p_value: float
    """One-sided: A succeeds more often than B."""
    p_value_reverse: float
    """One-sided: B succeeds more often than A."""

    @property
    def discordant(self) -> int:
        return self.a_only + self.b_only

    def as_dict(self) -> dict:
        return {**asdict(self), "discordant": self.discordant}


def successes(accuracies: list[float], criterion: float) -> list[bool]:
    """Per seed: held-out accuracy at or above the criterion."""
    return [a >= criterion for a in accuracies]


def sign_test(a: list[bool], b: list[bool]) -> SignTest:
    """Exact one-sided sign test of paired successes (a[i] and b[i] come from seed i)."""
    if len(a) != len(b):
        raise ValueError(f"sign test needs paired seeds, got {len(a)} and {len(b)}")
    a_only = sum(x and not y for x, y in zip(a, b))
    b_only = sum(y and not x for x, y in zip(a, b))
    n = a_only + b_only
    return SignTest(a_only, b_only, len(a), binomial_at_least(a_only, n, 0.5), binomial_at_least(b_only, n, 0.5))


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of a family of m p-values, in the input order: sort them ascending, p₍ᵢ₎ becomes
    max over j ≤ i of min(1, (m − j + 1)·p₍ⱼ₎). Rejecting where the adjusted value is ≤ α keeps the chance of any
    false rejection in the family at most α, whatever the dependence between the tests. Ties keep their input order
    (the adjusted values of tied p-values are equal anyway)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def fisher_exact(a_successes: int, a_n: int, b_successes: int, b_n: int) -> float:
    """Two-sided exact test that two success counts (a of a_n, b of b_n) come from one success rate: the
    probability, under the hypergeometric law of the 2 × 2 table with its margins fixed, of every table at most as
    likely as the observed one (Fisher's test, as ``scipy.stats.fisher_exact``). Used for a count of ours against
    the paper's count of the same row."""
    if not (0 <= a_successes <= a_n and 0 <= b_successes <= b_n):
        raise ValueError(f"fisher_exact: counts out of range: {a_successes}/{a_n}, {b_successes}/{b_n}")
    total = a_successes + b_successes
    n = a_n + b_n

    def probability(k: int) -> float:  # P(a's count = k | both margins)
        return math.comb(a_n, k) * math.comb(b_n, total - k) / math.comb(n, total)

    observed = probability(a_successes)
    support = range(max(0, total - b_n), min(a_n, total) + 1)
    return min(1.0, sum(p for p in map(probability, support) if p <= observed * (1 + 1e-7)))
