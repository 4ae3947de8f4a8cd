"""Per-row statistics: seed successes and the exact one-sided sign test on discordant seed pairs.

Seeds are paired by index: seed i of backend A and seed i of backend B trained on the same pool and were scored on
the same held-out set. A pair is discordant when exactly one of the two succeeded. Under the null hypothesis (A is
no better than B) each discordant pair favours A with probability 1/2, so the one-sided p-value is
P(X ≥ a_only) for X ~ Binomial(a_only + b_only, 1/2); 11 of 11 discordant pairs for A gives 2⁻¹¹ ≈ 0.00049.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from fpa_lightning.analysis.stats import binomial_at_least

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
