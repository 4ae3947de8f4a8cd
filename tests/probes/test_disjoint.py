"""The held-out set of every row is disjoint from its training pool (fpa_lightning/probes/train.py, module docstring):
for every group of the table, through ``train.row_data``, the function ``train_row`` draws its data with (small
sizes here, the same mechanism)."""
import pytest
import torch

from fpa_lightning.probes import train
from fpa_lightning.probes.base import Probe, ProbeBatch
from fpa_lightning.probes.dips import DipDepth
from fpa_lightning.probes.ladder import DipDuration, Ladder
from fpa_lightning.probes.model import Shape, variant
from fpa_lightning.probes.train import Budget, held_out_set, in_held_out, row_data, train_row
from fpa_lightning.probes.walks import PushPop
from modules.probes.runner import row_identity
from modules.probes.table import GROUPS, Group

SMALL = Budget(steps=4, batch=64, test=128)  # a pool of 256 sequences, 128 held out
DATA = list({(g.probe.key, g.test_probe.key if g.test_probe is not None else None): g for g in GROUPS}.values())


def rows(tokens: torch.Tensor) -> set[tuple[int, ...]]:
    return set(map(tuple, tokens.tolist()))


@pytest.mark.parametrize("group", DATA, ids=lambda g: g.label)
def test_no_held_out_sequence_is_in_the_pool(group):
    pool, test = row_data(group.probe, SMALL, group.test_probe)
    assert pool.tokens.shape[0] == 256 and test.tokens.shape[0] == 128
    assert not rows(pool.tokens) & rows(test.tokens)
    assert not in_held_out(pool.tokens, SMALL.holdout).any() and in_held_out(test.tokens, SMALL.holdout).all()
    assert (pool.labels != -1).any(dim=1).all() and (test.labels != -1).any(dim=1).all()


def test_the_split_is_a_function_of_the_tokens_and_about_one_in_four():
    probe = PushPop()
    batch = probe.sample(4000, torch.Generator().manual_seed(0))
    flags = in_held_out(batch.tokens, SMALL.holdout)
    assert SMALL.holdout == 4 and 0.22 < float(flags.float().mean()) < 0.28
    again = in_held_out(batch.tokens.flip(0), 4).flip(0)  # each row's side, whatever else is in the batch
    assert torch.equal(flags, again)
    fixed = torch.tensor([[0, 1, 2, 3], [0, 5, 1, 2], [0, 2, 4, 1]])  # pinned: the same split on every machine
    assert in_held_out(fixed, 4).tolist() == [False, True, True]


def test_a_pool_of_any_size_avoids_the_held_out_part():
    """The side of a sequence does not depend on the draw: a pool as large as the table's (ladder(r=10), 9216
    sequences in all) still has none of the held-out sequences."""
    probe = Ladder(r=10)
    pool, test = row_data(probe, Budget())
    assert pool.tokens.shape[0] == Budget().pool and len(rows(pool.tokens)) > 6000
    assert not rows(pool.tokens) & rows(test.tokens)


@pytest.mark.parametrize("probe", [Ladder(r=6), DipDuration(), DipDuration(duration="fixed")], ids=lambda p: p.key)
def test_small_spaces_are_split_too(probe):
    """The probes whose whole space is a few hundred sequences still get a disjoint held-out set, with few distinct
    sequences in it (in 512 draws: 81 of ladder(r=6)'s 320, 107 of dip_duration's 504, 28 of the fixed variant's
    112, and none of the latter's class 2: such probes need a larger space)."""
    pool, test = row_data(probe, Budget(steps=64, batch=64, test=512))
    assert not rows(pool.tokens) & rows(test.tokens)
    assert 20 <= len(rows(test.tokens)) < 150


class OneSequence(Probe):
    """A probe with a one-sequence space, outside the held-out part."""

    def vocab(self):
        return ["<bos>", "a"]

    def classes(self):
        return ["0", "1"]

    def sample(self, n, gen):
        tokens = torch.tensor([[0, 1, 1, 1]]).expand(n, -1)
        return ProbeBatch(tokens, torch.full_like(tokens, -1))


def test_a_space_without_a_held_out_part_is_a_clear_error():
    assert not in_held_out(OneSequence().sample(1, None).tokens, 4).any()
    with pytest.raises(RuntimeError, match="too small"):
        held_out_set(OneSequence(), 16)


def test_train_row_draws_its_data_through_row_data(monkeypatch):
    calls = []
    real = train.row_data

    def spy(probe, budget, test_probe=None):
        calls.append((probe.key, test_probe.key if test_probe is not None else None))
        return real(probe, budget, test_probe)

    monkeypatch.setattr(train, "row_data", spy)
    probe, longer = DipDepth(), DipDepth(durations=(3, 4))
    run = train_row(probe, variant("fpa"), Shape(width=8), [0], Budget(steps=2, batch=8, test=32), torch.device("cpu"),
                    test_probe=longer)
    assert calls == [(probe.key, longer.key)] and len(run.accuracies) == 1


def test_a_test_probe_must_share_tokens_and_classes_and_is_part_of_the_row_identity():
    with pytest.raises(ValueError, match="vocabulary or classes"):
        row_data(Ladder(r=6), SMALL, Ladder(r=10))
    plain = Group("g", DipDepth(), Shape(), ("fpa",))
    longer = Group("g", DipDepth(), Shape(), ("fpa",), test_probe=DipDepth(durations=(3, 4)))
    a, b = row_identity(plain, "fpa", [0], SMALL), row_identity(longer, "fpa", [0], SMALL)
    assert a["test_probe"] is None and b["test_probe"] == "dip_depth(durations=(3, 4), bottom=return, length=42)"
    assert a != b and a["budget"]["holdout"] == 4
