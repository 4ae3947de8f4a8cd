"""Every probe's generator: its labels equal a plain-loop evaluation of the probe's definition (``reference_labels``)
on random instances, tokens are in the vocabulary, BOS comes first, and balanced probes are balanced."""
import pytest
import torch

from fpa_lightning.probes import IGNORE, PROBES
from fpa_lightning.probes.ladder import DipDuration, Ladder, UnnamedLadder
from fpa_lightning.probes.walks import PushPop, TwoFamilies

INSTANCES = [cls() for cls in PROBES.values()] + [Ladder(r=6), Ladder(r=18), UnnamedLadder(r=18),
                                                   DipDuration(duration="fixed"), DipDuration(order="deepest_first")]


@pytest.mark.parametrize("probe", INSTANCES, ids=lambda p: p.key)
def test_labels_match_the_definition(probe):
    batch = probe.sample(300, torch.Generator().manual_seed(7))
    assert batch.tokens.shape == batch.labels.shape and batch.tokens.dtype == torch.int64
    assert int(batch.tokens.min()) >= 0 and int(batch.tokens.max()) < probe.vocab_size
    assert (batch.tokens[:, 0] == 0).all()
    scored = batch.labels[batch.labels != IGNORE]
    assert scored.numel() >= 300 and int(scored.min()) >= 0 and int(scored.max()) < probe.n_classes
    for tokens, labels in zip(batch.tokens.tolist(), batch.labels.tolist()):
        assert labels == probe.reference_labels(tokens), (probe.key, tokens)


@pytest.mark.parametrize("probe", [Ladder(r=10), UnnamedLadder(r=10), DipDuration(), TwoFamilies(), PushPop()],
                         ids=lambda p: p.key)
def test_balanced_probes_are_balanced(probe):
    labels = probe.sample(4000, torch.Generator().manual_seed(3)).labels[:, -1]
    share = torch.bincount(labels, minlength=probe.n_classes).float() / len(labels)
    assert (share - 1 / probe.n_classes).abs().max() < 0.04, share


def test_same_seed_same_sequences_and_bad_parameters_fail():
    a = Ladder(r=8).sample(50, torch.Generator().manual_seed(1))
    b = Ladder(r=8).sample(50, torch.Generator().manual_seed(1))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.labels, b.labels)
    with pytest.raises(ValueError, match="duration"):
        DipDuration(duration="sometimes")
    with pytest.raises(ValueError, match="at least 3"):
        Ladder(r=2)


def test_mqar_positions_point_at_the_pairs_and_the_answers():
    """The positions the mqar analysis reads (examples/probes/mqar_layer_bias.py) agree with the labels."""
    from fpa_lightning.probes.recall import Mqar

    probe = Mqar()
    batch = probe.sample(64, torch.Generator().manual_seed(3))
    values, queries = probe.value_positions(), probe.query_positions()
    assert bool((batch.tokens[:, values] > probe.keys).all()) and bool((batch.tokens[:, values - 1] <= probe.keys).all())
    assert bool((batch.labels[:, queries] != IGNORE).all()) and int((batch.labels != IGNORE).sum()) == 64 * probe.pairs
    answers = probe.answer_positions(batch.tokens)  # (B, P)
    recalled = batch.tokens.gather(1, answers) - 1 - probe.keys  # value token -> class
    assert torch.equal(recalled, batch.labels[:, queries])
    assert torch.equal(batch.tokens.gather(1, answers - 1), batch.tokens[:, queries])  # the answer follows the key


def test_dip_duration_puts_the_deepest_step_first_or_second():
    """order="any": the deeper of two different steps comes second in about half the sequences (a dip-sum head
    cannot count only the first step); "deepest_first": never."""
    for order, low, high in (("any", 0.4, 0.6), ("deepest_first", 0.0, 0.0)):
        tokens = DipDuration(order=order).sample(4000, torch.Generator().manual_seed(5)).tokens
        first, second = tokens[:, -3], tokens[:, -2]  # dip tokens grow with depth; N (the filler) is below them
        differ = first != second
        deeper_second = float((second > first)[differ].float().mean())
        assert low <= deeper_second <= high, (order, deeper_second)
