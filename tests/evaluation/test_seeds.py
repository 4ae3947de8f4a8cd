"""Seed-level statistics (fpa_lightning.evaluation.seeds) against hand-computed cases and SciPy where installed."""
import math

import numpy as np
import pytest

from fpa_lightning.evaluation.seeds import (ONE_PAIR_NOTE, cluster_means, compare_seeds, family_confidence,
                                            fingerprint, hierarchical_bootstrap, seed_verdict, sign_test,
                                            student_t_cdf, student_t_quantile, t_interval, token_digest)
from fpa_lightning.evaluation.stats import Interval

# the four retrained pairs (FPA − FoX test loss, nats)
STUDY = [-0.023, 0.060, -0.007, -0.021]


def test_t_quantiles_by_hand_and_against_scipy():
    # df 1 is Cauchy: t(0.975) = tan(0.475 π); df 2 has the closed form t = (2q − 1) √(2 / (1 − (2q − 1)²))
    assert student_t_quantile(0.975, 1) == pytest.approx(math.tan(0.475 * math.pi), rel=1e-10)
    assert student_t_quantile(0.975, 2) == pytest.approx(0.95 * math.sqrt(2 / (1 - 0.95**2)), rel=1e-10)
    assert student_t_quantile(0.975, 3) == pytest.approx(3.182446305, rel=1e-8)  # the textbook table
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 4, 7, 12, 31):
        for t in (-4.0, -1.3, 0.0, 0.4, 2.5):
            assert student_t_cdf(t, df) == pytest.approx(stats.t.cdf(t, df), abs=1e-12), (t, df)
        assert student_t_quantile(0.95, df) == pytest.approx(stats.t.ppf(0.95, df), rel=1e-9)


def test_t_interval_of_a_small_case_by_hand():
    """Values 1, 2, 3: mean 2, sd 1, half width t(0.975, 2) / √3 = 4.302653 / 1.732051 = 2.484138."""
    iv = t_interval([1.0, 2.0, 3.0])
    assert iv.estimate == 2.0
    assert iv.lower == pytest.approx(2 - 2.4841377, abs=1e-6) and iv.upper == pytest.approx(2 + 2.4841377, abs=1e-6)
    # the seeds: mean 0.00225, sd 0.039030, t(0.975, 3) = 3.182446 -> half width 0.062103
    study = t_interval(STUDY)
    assert study.estimate == pytest.approx(0.00225)
    assert study.upper - study.estimate == pytest.approx(3.182446 * np.std(STUDY, ddof=1) / 2, rel=1e-6)


def test_identical_seeds_give_a_zero_width_interval():
    iv = t_interval([-0.02, -0.02, -0.02])
    assert iv.lower == iv.estimate == iv.upper == pytest.approx(-0.02)
    assert seed_verdict(iv, "lower") == "superior" and seed_verdict(iv, "higher") == "inferior"


def test_the_family_level_is_bonferronis():
    assert family_confidence(0.95, 1) == 0.95
    assert family_confidence(0.95, 7) == pytest.approx(1 - 0.05 / 7) and family_confidence(0.9, 4) == pytest.approx(0.975)
    with pytest.raises(ValueError, match="at least one metric"):
        family_confidence(0.95, 0)
    with pytest.raises(ValueError):
        family_confidence(1.5, 3)


def test_two_close_seeds_decide_one_metric_but_not_one_of_seven():
    """Two seeds whose differences happen to agree (the study's pg19_long bucket 256-512 at 6e-4: +0.0043, +0.0049)
    give a 95 % t-interval that excludes 0; read as one of seven buckets, the verdict's interval is the t-interval at
    1 − 0.05/7 (t(0.99643, 1) = cot(0.05 π / 14) ≈ 89.1 where t(0.975, 1) ≈ 12.71), which covers 0."""
    seeds = [np.full(4, 0.0043), np.full(4, 0.0049)]
    alone = compare_seeds(seeds, None, "lower", n_boot=200)
    assert alone["verdict"] == "inferior" and alone["verdict_interval"] == alone["t_interval"]
    assert alone["t_interval"]["lower"] == pytest.approx(0.0046 - math.tan(0.475 * math.pi) * 0.0003, rel=1e-9)
    read_with_six = compare_seeds(seeds, None, "lower", n_boot=200, verdict_confidence=family_confidence(0.95, 7))
    assert read_with_six["verdict"] == "inconclusive"
    assert read_with_six["t_interval"] == alone["t_interval"]  # the reported 95 % interval is unchanged
    basis = read_with_six["verdict_interval"]
    assert basis["confidence"] == pytest.approx(1 - 0.05 / 7)
    half = 1 / math.tan(0.05 * math.pi / 14) * 0.0003  # df 1 is Cauchy: t(q) = tan(π (q − 1/2)); sd/√2 = 0.0003
    assert basis["upper"] - 0.0046 == pytest.approx(half, rel=1e-9) and basis["lower"] < 0 < basis["upper"]


def test_a_seed_set_with_opposite_signs_is_inconclusive():
    result = compare_seeds([np.full(5, d) for d in STUDY], None, "lower", n_boot=500)
    assert result["verdict"] == "inconclusive"
    assert result["t_interval"]["lower"] < 0 < result["t_interval"]["upper"]
    assert [s["estimate"] for s in result["per_seed"]] == pytest.approx(STUDY)
    assert result["sign_test"] == {"positive": 1, "negative": 3, "zero": 0, "p_two_sided": pytest.approx(0.625)}


def test_verdicts_follow_the_direction_and_the_margin():
    def iv(lo, hi):
        return Interval((lo + hi) / 2, lo, hi, 0.95)

    assert seed_verdict(iv(-0.03, -0.01), "lower") == "superior"
    assert seed_verdict(iv(0.01, 0.03), "lower") == "inferior"
    assert seed_verdict(iv(-0.01, 0.005), "lower", margin=0.00995) == "non-inferior"
    assert seed_verdict(iv(-0.01, 0.005), "lower") == "inconclusive"
    assert seed_verdict(iv(0.02, 0.05), "higher") == "superior"  # accuracy: A above B
    assert seed_verdict(iv(-0.005, 0.05), "higher", margin=0.01) == "non-inferior"
    with pytest.raises(ValueError, match="direction"):
        seed_verdict(iv(0, 1), "up")


def test_exact_sign_test_by_hand():
    # 5 of 5 seeds negative: p = 2 · (1/2)^5 = 1/16; 4 of 5: p = 2 · 6/32 = 0.375; zeros are left out
    assert sign_test([-1, -2, -3, -4, -5]).p_two_sided == pytest.approx(1 / 16)
    assert sign_test([-1, -2, -3, -4, 5]).p_two_sided == pytest.approx(0.375)
    assert sign_test([0.0, -1.0, 2.0]).as_dict() == {"positive": 1, "negative": 1, "zero": 1, "p_two_sided": 1.0}
    assert sign_test([0.0, 0.0]).p_two_sided == 1.0


def test_hierarchical_bootstrap_is_reproducible_and_covers_the_t_centre():
    rng = np.random.default_rng(3)
    per_seed = [rng.normal(m, 0.05, 40) for m in (-0.02, -0.01, -0.03, 0.005)]
    clusters = [np.repeat(np.arange(10), 4) for _ in per_seed]  # 10 documents of 4 rows each
    first = hierarchical_bootstrap(per_seed, clusters, n_boot=2000, seed=7)
    assert first == hierarchical_bootstrap(per_seed, clusters, n_boot=2000, seed=7)
    assert first != hierarchical_bootstrap(per_seed, clusters, n_boot=2000, seed=8)
    centre = t_interval([np.mean(v) for v in per_seed]).estimate
    assert first.estimate == pytest.approx(centre) and first.lower < centre < first.upper
    # one seed: only its clusters are resampled, which is that seed's own evaluation-noise interval
    alone = hierarchical_bootstrap(per_seed[:1], clusters[:1], n_boot=2000, seed=7)
    own = cluster_means(per_seed[0], clusters[0], n_boot=2000, seed=7)
    assert alone.estimate == pytest.approx(own.estimate) and alone.lower < own.estimate < alone.upper


def test_clusters_are_resampled_whole():
    """Two clusters, one all 0, one all 1 (NaN items left out): every resample's mean is 0, 1/2 or 1."""
    values = np.array([0.0, 0.0, np.nan, 1.0, 1.0])
    iv = cluster_means(values, ["a", "a", "a", "b", "b"], n_boot=400, seed=0, confidence=0.9)
    assert iv.estimate == 0.5 and iv.lower == 0.0 and iv.upper == 1.0


def test_one_seed_gives_no_verdict():
    result = compare_seeds([np.array([-0.02, -0.01, -0.03])], None, "lower", n_boot=200)
    assert result["verdict"] is None and result["t_interval"] is None and result["note"] == ONE_PAIR_NOTE
    assert "evaluation noise only" in ONE_PAIR_NOTE and "eval.py seeds" in ONE_PAIR_NOTE


def test_fingerprints_tell_item_sets_apart():
    items = [token_digest([1, 2, 3]), token_digest(np.array([4, 5]))]
    assert fingerprint(items) == fingerprint(list(items))
    assert fingerprint(items) != fingerprint(items[::-1]) != fingerprint(items[:1])
    assert token_digest([1, 2, 3]) == token_digest(np.array([1, 2, 3], dtype=np.int32))
