"""Interval estimates and tests against known values."""
import numpy as np
import pytest

from fpa_lightning.analysis.binomial import binomial_cdf
from fpa_lightning.evaluation.stats import Interval, bootstrap_mean, clopper_pearson, mcnemar_exact, non_inferiority


@pytest.mark.parametrize("k, n, lower, upper", [
    (0, 10, 0.0, 0.308497),  # upper = 1 − 0.025^(1/10)
    (10, 10, 0.691503, 1.0),  # lower = 0.025^(1/10)
    (5, 10, 0.187086, 0.812914),
    (73, 100, 0.631984, 0.813934),
])
def test_clopper_pearson_known_values(k, n, lower, upper):
    iv = clopper_pearson(k, n)
    assert iv.estimate == k / n
    assert iv.lower == pytest.approx(lower, abs=1e-6)
    assert iv.upper == pytest.approx(upper, abs=1e-6)


def test_clopper_pearson_closed_forms_at_the_edges():
    for n in (1, 7, 100):
        assert clopper_pearson(0, n, 0.9).upper == pytest.approx(1 - 0.05 ** (1 / n), rel=1e-9)
        assert clopper_pearson(n, n, 0.9).lower == pytest.approx(0.05 ** (1 / n), rel=1e-9)


def test_mcnemar_paper_table():
    """FPA 100/100 vs FoX 73/100: 27 discordant pairs all for A; one-sided p = 2^-27 = 7.45e-9 (paper: 7.5e-9)."""
    a = np.ones(100, bool)
    b = np.arange(100) < 73
    t = mcnemar_exact(a, b)
    assert (t.both, t.a_only, t.b_only, t.neither) == (73, 27, 0, 0)
    assert t.p_a_better == pytest.approx(2.0**-27, rel=1e-9)
    assert t.p_two_sided == pytest.approx(2.0**-26, rel=1e-9)


def test_mcnemar_known_table_and_symmetry():
    # 10 pairs only A, 2 only B: two-sided p = 2 · P(X ≤ 2 | 12, 1/2) = 2 · 79 / 4096
    a = np.array([1] * 10 + [0] * 2 + [1] * 5 + [0] * 3, bool)
    b = np.array([0] * 10 + [1] * 2 + [1] * 5 + [0] * 3, bool)
    t = mcnemar_exact(a, b)
    assert t.p_two_sided == pytest.approx(2 * 79 / 4096)
    assert t.p_a_better == pytest.approx(79 / 4096)  # P(X ≥ 10) = P(X ≤ 2)
    reverse = mcnemar_exact(b, a)
    assert reverse.p_two_sided == t.p_two_sided
    assert reverse.p_a_better == pytest.approx(1 - binomial_cdf(1, 12, 0.5))  # P(X ≥ 2)
    assert mcnemar_exact(a, a).p_two_sided == 1.0  # no discordant pairs: no evidence


def test_bootstrap_of_a_constant_is_a_point():
    (iv,) = bootstrap_mean(np.full(25, 3.25), n_boot=500)
    assert iv.estimate == iv.lower == iv.upper == 3.25


def test_bootstrap_columns_with_missing_units_and_determinism():
    values = np.array([[1.0, np.nan], [2.0, 5.0], [3.0, 7.0]])
    first, second = bootstrap_mean(values, n_boot=2000, seed=3)
    assert first.estimate == 2.0 and second.estimate == 6.0  # NaN: the unit does not reach that column
    assert 1.0 <= first.lower < first.upper <= 3.0
    assert 5.0 <= second.lower < second.upper <= 7.0
    assert bootstrap_mean(values, n_boot=2000, seed=3) == [first, second]


def test_bootstrap_coverage_is_near_nominal():
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(200):
        (iv,) = bootstrap_mean(rng.normal(1.0, 2.0, size=40), n_boot=1000, seed=int(rng.integers(1 << 30)))
        hits += iv.lower <= 1.0 <= iv.upper
    assert 0.88 <= hits / 200 <= 0.99  # percentile bootstrap at n=40 under-covers slightly


def test_non_inferiority_verdicts():
    assert non_inferiority(Interval(-0.0192, -0.0198, -0.0186, 0.95), 0.00995) == "superior"  # the paper's case
    assert non_inferiority(Interval(0.001, -0.002, 0.005, 0.95), 0.00995) == "non-inferior"
    assert non_inferiority(Interval(0.008, 0.004, 0.012, 0.95), 0.00995) == "not shown non-inferior"
    with pytest.raises(ValueError, match="margin"):
        non_inferiority(Interval(0, 0, 0, 0.95), 0.0)


def test_bad_inputs_are_errors():
    with pytest.raises(ValueError):
        clopper_pearson(11, 10)
    with pytest.raises(ValueError):
        clopper_pearson(1, 10, confidence=1.5)
    with pytest.raises(ValueError):
        mcnemar_exact(np.ones(3, bool), np.ones(4, bool))
    with pytest.raises(ValueError):
        bootstrap_mean(np.zeros(0))
