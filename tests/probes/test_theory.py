"""The constructive half of the theory: one hand-built FPA head of constant width d = 4 solves the ladder (named or
unnamed pushes) for r = 10 and 18 and dip_duration without training; with the dip-sum reduction the same weights
fail when the duration varies (and still solve the fixed duration). And the bound on the other side: without
positions, no softmax head of any width reaches the criterion on the unnamed ladder."""
import pytest
import torch

from fpa_lightning.attention import AttentionConfig
from fpa_lightning.probes import IGNORE
from fpa_lightning.probes.ladder import DipDuration, Ladder, UnnamedLadder
from fpa_lightning.probes.model import ProbeModel, Shape
from fpa_lightning.probes.stats import CRITERION
from fpa_lightning.probes.theory import (HEAD_DIM, best_accuracy_from, hand_built_fpa_head, linear_threshold_head,
                                         position_blind_features)


def accuracy(model, probe, n=2000) -> float:
    batch = probe.sample(n, torch.Generator().manual_seed(11))
    with torch.no_grad():
        predicted = model(batch.tokens).argmax(-1)
    scored = batch.labels != IGNORE
    return float(((predicted == batch.labels) & scored).sum() / scored.sum())


@pytest.mark.parametrize("probe", [Ladder(r=10), Ladder(r=18), UnnamedLadder(r=10), UnnamedLadder(r=18),
                                   DipDuration(duration="variable"), DipDuration(duration="fixed")],
                         ids=lambda p: p.key)
def test_one_fpa_head_of_constant_width_solves_it(probe):
    model = hand_built_fpa_head(probe)
    assert model.layers[0].head_dim == HEAD_DIM == 4 and model.layers[0].n_head == 1
    assert accuracy(model, probe) == 1.0


def test_dip_sum_confuses_depth_with_duration():
    variable = DipDuration(duration="variable")
    assert accuracy(hand_built_fpa_head(variable, reduction="dipsum"), variable) < 0.85
    fixed = DipDuration(duration="fixed")
    assert accuracy(hand_built_fpa_head(fixed, reduction="dipsum"), fixed) == 1.0


@pytest.mark.parametrize("r", [10, 18])
def test_a_linear_threshold_over_the_rungs_does_not_solve_the_ladder(r):
    """docs/probes.md, "Hand-built heads and bounds": linear scores weigh the survivors geometrically, so the majority
    is missed."""
    model = linear_threshold_head(Ladder(r=r))
    assert model.layers[0].head_dim == 2
    assert accuracy(model, Ladder(r=r)) < 0.8


def test_best_accuracy_from_features():
    features = torch.tensor([[0], [0], [0], [1], [1]])
    assert best_accuracy_from(features, torch.tensor([1, 1, 0, 0, 0])) == 0.8  # 2 of 3, then 2 of 2
    assert best_accuracy_from(torch.arange(5)[:, None], torch.tensor([1, 1, 0, 0, 1])) == 1.0


@pytest.mark.parametrize("r", [10, 18])
def test_no_position_blind_head_reaches_the_criterion_on_the_unnamed_ladder(r):
    probe = UnnamedLadder(r=r)
    batch = probe.sample(2048, torch.Generator().manual_seed(2))  # the size of the table's held-out set
    bound = best_accuracy_from(position_blind_features(probe, batch), batch.labels[:, -1])
    assert 0.6 < bound < CRITERION
    # the premise: a softmax head without positions (random weights, two heads of width 16) answers the same for
    # every order of the pushes, i.e. from the two features alone
    model = ProbeModel(probe.vocab_size, probe.n_classes, Shape(heads=2, head_dim=16),
                       AttentionConfig(backend="nope", impl="naive")).double()
    pushes = batch.tokens[:64, 1:-1]
    shuffled = pushes.gather(1, torch.rand(pushes.shape, generator=torch.Generator().manual_seed(3)).argsort(1))
    assert not torch.equal(shuffled, pushes)
    tokens = batch.tokens[:64]
    reordered = torch.cat([tokens[:, :1], shuffled, tokens[:, -1:]], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(reordered)[:, -1], model(tokens)[:, -1], rtol=1e-12, atol=1e-12)
