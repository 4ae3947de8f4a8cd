"""The constructive half of the theory: one hand-built FPA head of constant width d = 4 solves the ladder for
r = 10 and 18 and dip_duration without training; with the dip-sum reduction the same weights fail when the
duration varies (and still solve the fixed duration)."""
import pytest
import torch

from fpa_lightning.probes import IGNORE
from fpa_lightning.probes.ladder import DipDuration, Ladder
from fpa_lightning.probes.theory import HEAD_DIM, hand_built_fpa_head


def accuracy(model, probe, n=2000) -> float:
    batch = probe.sample(n, torch.Generator().manual_seed(11))
    with torch.no_grad():
        predicted = model(batch.tokens).argmax(-1)
    scored = batch.labels != IGNORE
    return float(((predicted == batch.labels) & scored).sum() / scored.sum())


@pytest.mark.parametrize("probe", [Ladder(r=10), Ladder(r=18), DipDuration(duration="variable"),
                                   DipDuration(duration="fixed")], ids=lambda p: p.key)
def test_one_fpa_head_of_constant_width_solves_it(probe):
    model = hand_built_fpa_head(probe)
    assert model.layers[0].head_dim == HEAD_DIM == 4 and model.layers[0].n_head == 1
    assert accuracy(model, probe) == 1.0


def test_dip_sum_confuses_depth_with_duration():
    variable = DipDuration(duration="variable")
    assert accuracy(hand_built_fpa_head(variable, reduction="dipsum"), variable) < 0.85
    fixed = DipDuration(duration="fixed")
    assert accuracy(hand_built_fpa_head(fixed, reduction="dipsum"), fixed) == 1.0
