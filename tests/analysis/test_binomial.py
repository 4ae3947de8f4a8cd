"""Exact binomial tails (shared by the probes' sign test and the evaluation's tests) against direct sums."""
from math import comb

import pytest

from fpa_lightning.analysis.binomial import binomial_at_least, binomial_cdf


def test_binomial_cdf_matches_direct_sum():
    for n, k, p in [(10, 3, 0.3), (27, 0, 0.5), (100, 73, 0.7)]:
        direct = sum(comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))
        assert binomial_cdf(k, n, p) == pytest.approx(direct, rel=1e-10)


def test_binomial_at_least_matches_direct_sum_and_keeps_tiny_tails():
    for n, k, p in [(10, 3, 0.3), (27, 27, 0.5), (100, 73, 0.7), (12, 0, 0.4)]:
        direct = sum(comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))
        assert binomial_at_least(k, n, p) == pytest.approx(direct, rel=1e-10)
    assert binomial_at_least(60, 60, 0.5) == pytest.approx(2.0**-60, rel=1e-10)  # 1 − P(X ≤ 59) would round to 0
