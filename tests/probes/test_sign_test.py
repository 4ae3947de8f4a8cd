"""The exact one-sided sign test on discordant seed pairs, Holm's adjustment of a family of p-values and Fisher's exact
test of two counts, against known values."""
import math

import pytest

from fpa_lightning.probes.stats import fisher_exact, holm, sign_test, successes


def test_known_values():
    eleven = sign_test([True] * 11 + [True] * 4, [False] * 11 + [True] * 4)  # 11 discordant, all for A
    assert (eleven.a_only, eleven.b_only, eleven.discordant, eleven.pairs) == (11, 0, 11, 15)
    assert eleven.p_value == pytest.approx(2**-11, rel=1e-12)  # 0.00049, as in the paper
    assert eleven.p_value_reverse == 1.0
    assert sign_test([True] * 13, [False] * 13).p_value == pytest.approx(2**-13, rel=1e-12)  # 0.00012
    mixed = sign_test([True] * 5 + [False] + [False] * 4, [False] * 5 + [True] + [False] * 4)  # 5 : 1
    assert mixed.p_value == pytest.approx(7 / 64, rel=1e-12)  # P(X ≥ 5 | n = 6)
    assert mixed.p_value_reverse == pytest.approx(63 / 64, rel=1e-12)
    assert sign_test([True, False], [True, False]).p_value == 1.0  # no discordant pair: no evidence


def test_successes_and_unpaired_input():
    assert successes([0.99, 0.989, 1.0], 0.99) == [True, False, True]
    with pytest.raises(ValueError, match="paired"):
        sign_test([True], [True, False])
    assert math.isclose(sign_test([True] * 3, [False] * 3).p_value, 0.125)


def test_holm_against_a_hand_computed_case():
    """Four p-values: sorted 0.005, 0.01, 0.03, 0.04 are multiplied by 4, 3, 2, 1 (0.02, 0.03, 0.06, 0.04) and made
    non-decreasing (0.04 -> 0.06); the result comes back in the input order."""
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02], rel=1e-12)
    assert holm([0.5, 0.9]) == [1.0, 1.0]  # capped at 1
    assert holm([0.2]) == [0.2] and holm([]) == []
    tied = holm([0.01, 0.01, 0.2])  # ties: 3·0.01, max(3·0.01, 2·0.01), max(.., 0.2)
    assert tied == pytest.approx([0.03, 0.03, 0.2])


def test_holm_keeps_the_family_wise_error_rate():
    """Under the null (uniform p-values, independent here) Holm rejects anything at 0.05 in at most 5 % of families."""
    import random
    rng = random.Random(0)
    families = [[rng.random() for _ in range(20)] for _ in range(2000)]
    rate = sum(min(holm(f)) <= 0.05 for f in families) / len(families)
    assert rate <= 0.06


def test_fisher_exact_against_hand_computed_cases():
    """Two counts of 15: 0 against 15 is the most extreme table of the margin 15: 2 / C(30, 15); equal counts give 1;
    5 against 0: P = Σ over tables at most as likely as the observed = 2·C(15,5)·C(15,0)/C(30,5) (symmetric)."""
    assert fisher_exact(0, 15, 15, 15) == pytest.approx(2 / math.comb(30, 15), rel=1e-12)
    assert fisher_exact(7, 15, 7, 15) == pytest.approx(1.0)
    assert fisher_exact(5, 15, 0, 15) == pytest.approx(2 * math.comb(15, 5) / math.comb(30, 5), rel=1e-12)
    with pytest.raises(ValueError, match="out of range"):
        fisher_exact(16, 15, 0, 15)
