"""The exact one-sided sign test on discordant seed pairs, against known values."""
import math

import pytest

from fpa_lightning.probes.stats import sign_test, successes


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
