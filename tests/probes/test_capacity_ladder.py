"""multi_dip_ladder (issue #22, item 2).

- The generator against an independent simulation: the alive set kept as a list of (height, colour) that each dip
  trims from the top, never a path minimum; exhaustively for a small r, on random draws for the table's r.
- One hand-built FPA head of width 4 (min reduction) solves it at r = 10, 14, 18. The same weights with the sum of
  dips solve it too, and must: Σ min(0, φ_u − ψ_s) = 0 exactly when min φ_u ≥ ψ_s, so both reductions keep the same
  alive set for any weights, and a question about the alive set cannot tell them apart (docs/probes.md).
- The alive sets are a prefix of the pushes in a minority of sequences and never a suffix.
- Four sequences that no one-head peer answers all right at any width (``theory.one_head_obstruction``).

The capacity-control rule of the table and its report: tests/modules/probes/test_capacity_controls.py.
"""
from itertools import combinations, product

import pytest
import torch

from fpa_lightning.probes import IGNORE
from fpa_lightning.probes.ladder import MultiDipLadder
from fpa_lightning.probes.theory import HEAD_DIM, hand_built_fpa_head, one_head_obstruction

PA, PB = 1, 2  # the two push tokens (colour a = 0, b = 1); D_k is token 2 + k


def simulate(tokens: list[int]) -> tuple[list[bool], int]:
    """An independent reading of the probe: per push, whether it survives to the end, and the label. The alive keys
    are kept as a list of heights; a dip of depth k removes those above the walk's height minus k."""
    height, alive, pushes = 0, [], []  # alive: indices into pushes
    for token in tokens[1:]:
        if token in (PA, PB):
            height += 1
            pushes.append((height, token - PA))
            alive.append(len(pushes) - 1)
        else:
            floor = height - (token - 2)
            alive = [i for i in alive if pushes[i][0] <= floor]
    survivors = [pushes[i][1] for i in alive]
    return [i in alive for i in range(len(pushes))], int(2 * sum(survivors) > len(survivors))


def support(r: int, dips: int):
    """Every sequence the generator may draw, listed: layouts, depths in 1..min(W − 1, run + 2), colours."""
    for inner in combinations(range(2, r), dips - 1):
        ends = [*inner, r]
        reach = MultiDipLadder.REACH
        ranges = [range(1, min(end - 1, end - start + reach) + 1) for start, end in zip([0, *ends], ends)]
        for depths in product(*ranges):
            for colours in product((0, 1), repeat=r):
                tokens, done = [0], 0
                for end, k in zip(ends, depths):
                    tokens += [PA + c for c in colours[done:end]] + [2 + k]
                    done = end
                yield tuple(tokens)


def accuracy(model, batch) -> float:
    with torch.no_grad():
        predicted = model(batch.tokens).argmax(-1)
    scored = batch.labels != IGNORE
    return float(((predicted == batch.labels) & scored).sum() / scored.sum())


def test_the_generator_draws_only_the_support_and_labels_it_as_the_simulation_does():
    probe = MultiDipLadder(r=6, dips=2)
    listed = {tokens: simulate(list(tokens))[1] for tokens in support(6, 2)}
    assert sum(probe.support_size()) == len(listed)
    assert probe.support_size() == (sum(1 for y in listed.values() if y == 0), sum(listed.values()))
    batch = probe.sample(3000, torch.Generator().manual_seed(1))
    drawn = [tuple(t) for t in batch.tokens.tolist()]
    assert all(t in listed for t in drawn)
    assert [listed[t] for t in drawn] == batch.labels[:, -1].tolist()
    assert len(set(drawn)) > 0.4 * len(listed)  # the draws spread over the space


@pytest.mark.parametrize("r,dips", [(10, 3), (14, 3), (18, 3), (10, 2), (12, 5)])
def test_labels_and_alive_sets_match_the_simulation(r, dips):
    probe = MultiDipLadder(r=r, dips=dips)
    batch = probe.sample(500, torch.Generator().manual_seed(r + dips))
    assert batch.tokens.shape == (500, probe.length) and (batch.tokens[:, 0] == 0).all()
    assert int(batch.tokens.max()) < probe.vocab_size
    assert (batch.labels[:, :-1] == IGNORE).all()
    for tokens, labels in zip(batch.tokens.tolist(), batch.labels.tolist()):
        alive, label = simulate(tokens)
        assert labels[-1] == label and probe.reference_labels(tokens) == labels
        assert probe.alive(tokens) == alive
        assert sum(t in (PA, PB) for t in tokens) == r and sum(t > PB for t in tokens) == dips and tokens[-1] > PB


@pytest.mark.parametrize("r", [10, 18])
def test_classes_are_balanced(r):
    labels = MultiDipLadder(r=r).sample(4000, torch.Generator().manual_seed(3)).labels[:, -1]
    assert abs(labels.float().mean().item() - 0.5) < 0.03


# the sequence space, per class (support_size): beside a pool of 32768 there is room for a held-out set far larger
# than 2048 (train.py holds out one sequence in 8 of the space)
SUPPORT = {10: (975840, 658464), 14: (77512928, 54591264), 18: (4004055232, 2926507840)}


@pytest.mark.parametrize("r", [10, 14, 18])
def test_the_sequence_space_is_large(r):
    sizes = MultiDipLadder(r=r).support_size()
    assert sizes == SUPPORT[r]
    assert min(sizes) / 8 > 32768 + 2048


@pytest.mark.parametrize("r", [10, 14, 18])
def test_one_fpa_head_of_width_4_solves_it_and_so_does_the_dip_sum_with_the_same_weights(r):
    probe = MultiDipLadder(r=r)
    batch = probe.sample(2000, torch.Generator().manual_seed(11))
    model = hand_built_fpa_head(probe)
    assert model.layers[0].head_dim == HEAD_DIM == 4 and model.layers[0].n_head == 1
    assert accuracy(model, batch) == 1.0
    assert accuracy(hand_built_fpa_head(probe, reduction="dipsum"), batch) == 1.0


def test_minimum_and_dip_sum_have_the_same_alive_set_for_any_weights():
    """Why the dip sum cannot fail an alive-set question: b = 0 under one reduction iff under the other; the dead
    keys' biases differ (the sum is at least as negative)."""
    from fpa_lightning.ops.fpa.naive import fpa_bias

    gen = torch.Generator().manual_seed(0)
    phi, psi = torch.randn(4, 24, 3, generator=gen).double(), torch.randn(4, 24, 3, generator=gen).double()
    phi, psi = phi.round(decimals=1), psi.round(decimals=1)  # ties φ = ψ occur
    beta = torch.tensor([0.5, 1.0, 3.0], dtype=torch.float64)
    minimum, dipsum = fpa_bias(phi, psi, beta), fpa_bias(phi, psi, beta, reduction="dipsum")
    causal = torch.ones(24, 24).tril(-1).bool()
    # alive: b = 0, up to the straight-through minimum's rounding (soft + (exact − soft) is −1e-16 at a tie φ = ψ)
    assert torch.equal(minimum[..., causal].abs() < 1e-12, dipsum[..., causal].abs() < 1e-12)
    assert bool((dipsum[..., causal] <= minimum[..., causal] + 1e-12).all())
    assert bool((dipsum[..., causal] < minimum[..., causal] - 1e-6).any())  # several dips: different magnitudes


# fractions of 20000 draws (seed 5): alive sets that are not a prefix of the pushes (some push dead, a later one
# alive); none is a suffix (the last dip kills at least the newest push, rung 1 always survives)
NON_PREFIX = {10: 0.571, 14: 0.693, 18: 0.777}


@pytest.mark.parametrize("r", [10, 14, 18])
def test_alive_sets_are_mostly_not_a_prefix_and_never_a_suffix(r):
    probe = MultiDipLadder(r=r)
    alive = [probe.alive(t) for t in probe.sample(4000, torch.Generator().manual_seed(r)).tokens.tolist()]
    non_prefix = sum(any(a[a.index(False):]) for a in alive) / len(alive)
    assert abs(non_prefix - NON_PREFIX[r]) < 0.03
    assert all(a[0] and not a[-1] for a in alive)


@pytest.mark.parametrize("r", [10, 18])
def test_four_sequences_no_one_head_peer_answers_all_right(r):
    probe = MultiDipLadder(r=r)
    batch = one_head_obstruction(probe)
    assert batch.labels[:, -1].tolist() == [0, 1, 1, 0]
    for tokens, labels in zip(batch.tokens.tolist(), batch.labels.tolist()):
        assert simulate(tokens)[1] == labels[-1]
    # they differ only in the first dip and the colours of rungs 1-3, all before that dip, and lie in the support
    differs = (batch.tokens != batch.tokens[:1]).any(0).nonzero().flatten().tolist()
    first_dip = next(i for i, t in enumerate(batch.tokens[0].tolist()) if t > PB)
    assert differs == [1, 2, 3, first_dip] and first_dip == 5
    for tokens in batch.tokens.tolist():
        walk, run = 0, 0
        for t in tokens[1:]:
            if t in (PA, PB):
                walk, run = walk + 1, run + 1
            else:
                assert 1 <= t - 2 <= min(walk - 1, run + MultiDipLadder.REACH)
                run = 0
    assert accuracy(hand_built_fpa_head(probe), batch) == 1.0
