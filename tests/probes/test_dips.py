"""dip_depth (fpa_lightning/probes/dips.py): its labels against a plain loop and an independent walk simulation, class
balance, the split of durations between the training and the extrapolated probe, and the constructive half: a
hand-built one-head FPA model (theory.dip_depth_head) is exact at every duration with the path minimum, and the same
weights with the dip-sum reduction are not."""
import pytest
import torch

from fpa_lightning.probes import IGNORE
from fpa_lightning.probes.dips import DipDepth
from fpa_lightning.probes.theory import dip_depth_head
from fpa_lightning.probes.train import Budget, held_out_set, row_data
from modules.probes.table import GROUPS

PROBES = [DipDepth(), DipDepth(durations=(3, 4)), DipDepth(durations=(1,)), DipDepth(durations=(1, 2, 3, 4)),
          DipDepth(bottom="stay"), DipDepth(durations=(3, 4), bottom="stay")]


def simulate(probe: DipDepth, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An independent walk simulation over a batch: (depth, duration) per sequence, from cumulative sums."""
    heights = ((tokens == probe.U).long() - (tokens == probe.D).long()).cumsum(1)
    positions = torch.arange(tokens.shape[1])[None, :]
    mark = (tokens == probe.M).long().argmax(1, keepdim=True)
    after = positions >= mark
    lowest = heights.masked_fill(~after, 10**6).min(1, keepdim=True).values
    depth = heights.gather(1, mark) - lowest
    duration = ((heights == lowest) & after).sum(1)
    return depth[:, 0], duration


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.key)
def test_labels_match_the_definition_and_a_walk_simulation(probe):
    batch = probe.sample(1000, torch.Generator().manual_seed(11))
    tokens, labels = batch.tokens, batch.labels
    assert tokens.shape == (1000, probe.length) and tokens.dtype == torch.int64
    assert (tokens[:, 0] == 0).all() and int(tokens.min()) >= 0 and int(tokens.max()) < probe.vocab_size
    assert ((labels[:, :-1] == IGNORE).all() and (tokens == probe.M).sum(1).eq(1).all()
            and (tokens[:, -1] == probe.Q).all())
    for row, row_labels in zip(tokens.tolist(), labels.tolist()):
        assert row_labels == probe.reference_labels(row), row
        first = next(i for i, t in enumerate(row) if t not in (0, probe.N))
        assert probe.N not in row[first:], row  # padding only right after BOS
        if probe.bottom == "return":
            assert probe.S not in row
    depth, duration = simulate(probe, tokens)
    assert torch.equal(depth.clamp(max=probe.MAX_CLASS), labels[:, -1])
    assert set(duration.tolist()) == set(probe.durations)
    assert set(depth.tolist()) == set(range(probe.DEEPEST + 1))


@pytest.mark.parametrize("probe", [DipDepth(), DipDepth(durations=(3, 4)), DipDepth(bottom="stay")],
                         ids=lambda p: p.key)
def test_classes_and_durations_are_balanced(probe):
    batch = probe.sample(4000, torch.Generator().manual_seed(3))
    share = torch.bincount(batch.labels[:, -1], minlength=probe.n_classes).float() / 4000
    assert (share - 1 / probe.n_classes).abs().max() < 0.04, share
    _, duration = simulate(probe, batch.tokens)
    for d in probe.durations:
        assert abs(float((duration == d).float().mean()) - 1 / len(probe.durations)) < 0.04


def test_the_duration_does_not_give_the_depth_away():
    """Within each class every duration occurs about equally often, so the duration says nothing of the class."""
    probe = DipDepth(durations=(1, 2, 3, 4))
    batch = probe.sample(8000, torch.Generator().manual_seed(4))
    _, duration = simulate(probe, batch.tokens)
    for c in range(probe.n_classes):
        counts = torch.bincount(duration[batch.labels[:, -1] == c], minlength=5)[1:].float()
        assert (counts / counts.sum() - 0.25).abs().max() < 0.06, (c, counts)


def test_the_extrapolation_group_trains_short_dips_and_tests_long_ones():
    """The table's duration-extrapolation group: its pool has durations 1–2 only, its held-out set 3–4 only, with the
    same depths (labels) in both, through the data path every row uses (train.row_data)."""
    group = next(g for g in GROUPS if isinstance(g.probe, DipDepth) and g.test_probe is not None
                 and g.probe.bottom == "return")
    assert group.probe.durations == (1, 2) and group.test_probe.durations == (3, 4)
    pool, test = row_data(group.probe, Budget(steps=4, batch=128, test=512), group.test_probe)
    for data, durations in ((pool, {1, 2}), (test, {3, 4})):
        depth, duration = simulate(group.probe, data.tokens)
        assert set(duration.tolist()) == durations
        assert set(depth.clamp(max=3).tolist()) == {0, 1, 2, 3}


def test_bad_parameters_fail():
    with pytest.raises(ValueError, match="durations"):
        DipDepth(durations=())
    with pytest.raises(ValueError, match="durations"):
        DipDepth(durations=(0, 1))
    with pytest.raises(ValueError, match="bottom"):
        DipDepth(bottom="sometimes")
    with pytest.raises(ValueError, match="need length"):
        DipDepth(durations=(1, 6))
    assert DipDepth(durations=(1, 6), length=50).longest == 50


def _accuracy(model, probe: DipDepth, n: int = 2048) -> tuple[float, list[float]]:
    data = held_out_set(probe, n)
    with torch.no_grad():
        predicted = model(data.tokens)[:, -1].argmax(-1)
    labels = data.labels[:, -1]
    per_class = [float((predicted[labels == c] == c).float().mean()) for c in range(probe.n_classes)]
    return float((predicted == labels).float().mean()), per_class


# measured on the 2048 held-out sequences (train.held_out_set) of each probe; dip-sum with the FPA head's weights
# is right on classes 0 and 3+, right on class 1 only at duration 1, and never right on class 2 (the descent alone
# sums 1 + 2 levels): training durations 0.623 ("return"), 0.634 ("stay"); extrapolated 0.523 and 0.517
DIPSUM_BELOW = {((1, 2), "return"): 0.70, ((3, 4), "return"): 0.60, ((1, 2), "stay"): 0.70, ((3, 4), "stay"): 0.60}


@pytest.mark.parametrize("durations,bottom", list(DIPSUM_BELOW), ids=lambda x: str(x))
def test_a_hand_built_fpa_head_is_exact_at_every_duration_and_dip_sum_is_not(durations, bottom):
    probe = DipDepth(durations=durations, bottom=bottom)
    accuracy, per_class = _accuracy(dip_depth_head(probe), probe)
    assert accuracy == 1.0, per_class
    accuracy, per_class = _accuracy(dip_depth_head(probe, reduction="dipsum"), probe)
    assert accuracy < DIPSUM_BELOW[(durations, bottom)], per_class
    assert per_class[2] == 0.0 and per_class[0] == 1.0  # depth 2 reads as 3+; an alive key has no dip to sum
    if min(durations) > 1:
        assert per_class[1] == 0.0  # a depth-1 dip that lasts 3 or 4 steps reads as deeper


def test_the_hand_built_head_needs_its_walk():
    """The construction is the walk's doing: without the steps (δ = 0) M never dies and the answer is always 0."""
    probe = DipDepth()
    model = dip_depth_head(probe)
    with torch.no_grad():
        model.layers[0].backend.gate.weight[0].zero_()
    accuracy, per_class = _accuracy(model, probe)
    assert per_class == [1.0, 0.0, 0.0, 0.0] and accuracy < 0.3
