"""Simulated cache pruning (``analysis.pruning.pruned_cache``, with the runtime's rule ``generation.PruneRule``, whose
own tests are in tests/generation/test_rule.py): exactness at −inf, monotone FPA bias, kept-key counts, windows,
restoration."""
import pytest
import torch

from fpa_lightning.evaluation.checkpoint import load_decoder
from fpa_lightning.analysis.pruning import pruned_cache, window_for_fraction
from fpa_lightning.generation import PruneRule

T = 96  # several query blocks of 16


@pytest.fixture(scope="module")
def ids():
    return torch.randint(3, 32000, (2, T + 1), generator=torch.Generator().manual_seed(0))


def model(ckpts, backend):
    return load_decoder(ckpts[backend], torch.device("cpu"), impl="chunked").decoder


@torch.no_grad()
def losses(decoder, ids):
    return decoder.token_losses(ids[:, :-1], ids[:, 1:])


@pytest.mark.parametrize("backend", ["fpa", "fox"])
def test_bias_never_rises_again(ckpts, ids, backend):
    """b[t, s] is non-increasing in t for fixed s: dropping a key for good equals masking its later pairs."""
    decoder = model(ckpts, backend)
    for probe in decoder.probe(ids[:, :-1]):
        bias = probe.bias()  # (B, H, T, T), −inf above the diagonal
        step = bias[..., 1:, :] - bias[..., :-1, :]  # b[t+1, s] − b[t, s]
        assert (step[torch.isfinite(bias[..., :-1, :])] <= 1e-6).all()
        if backend == "fpa":  # the fixture model has both alive (b = 0) and dead off-diagonal keys
            off_diagonal = torch.ones(T, T, dtype=torch.bool).tril(-1)
            dead = (bias[..., off_diagonal] < 0).float().mean()
            assert 0.05 < dead < 0.95


@pytest.mark.parametrize("backend", ["fpa", "fox"])
def test_minus_inf_threshold_is_exactly_unpruned(ckpts, ids, backend):
    decoder = model(ckpts, backend)
    reference = losses(decoder, ids)
    with pruned_cache(decoder, PruneRule(threshold=float("-inf"))) as stats:
        pruned = losses(decoder, ids)
    assert torch.equal(pruned, reference)
    assert stats.mean_fraction() == 1.0 and stats.as_dict()["kept_pair_fraction"] == 1.0


def test_threshold_zero_keeps_exactly_the_alive_keys(ckpts, ids):
    decoder = model(ckpts, "fpa")
    with pruned_cache(decoder, PruneRule(threshold=0.0)):  # layer 2's input is layer 1's pruned output
        probes = decoder.probe(ids[:, :-1])
    alive = [(p.bias() == 0) for p in probes]  # (B, H, T, T) incl. the diagonal
    with pruned_cache(decoder, PruneRule(threshold=0.0)) as stats:
        pruned = losses(decoder, ids)
    assert [int(k) for k in stats.kept_pairs] == [int(a.sum()) for a in alive]
    t1 = torch.arange(1, T + 1)
    expected = [float((a.sum(-1) / t1).mean()) for a in alive]
    assert stats.per_layer_fraction() == pytest.approx(expected, rel=1e-6)
    assert stats.as_dict()["revived_pairs"] == 0  # monotone bias: eviction == pair masking
    assert not torch.equal(pruned, losses(decoder, ids))


def test_window_one_keeps_only_the_newest_key(ckpts, ids):
    """(A threshold above 0, which would do the same, is refused: generation.rule.check_threshold.)"""
    decoder = model(ckpts, "fpa")
    with pruned_cache(decoder, PruneRule(window=1)) as stats:
        losses(decoder, ids)
    pairs_per_head = T * (T + 1) // 2
    # one key (the newest) per query; a window is the same for every row and head, so it is counted once
    assert stats.kept_pairs == [T] * 2 and stats.causal_pairs == [pairs_per_head] * 2
    assert stats.mean_fraction() == pytest.approx(float((1 / torch.arange(1, T + 1, dtype=torch.float64)).mean()))


def test_eviction_differs_from_masking_for_a_non_monotone_bias(make_module, ids):
    """FPA with a query level (ablation) is not monotone in t: a key can be evicted while its bias is back up."""
    decoder = make_module("fpa", seed=5, fpa_level="query").model.eval()
    decoder.cfg.attention.impl = "chunked"
    with pruned_cache(decoder, PruneRule(threshold=-1.0)) as stats:
        losses(decoder, ids)
    assert stats.as_dict()["revived_pairs"] > 0


def test_sliding_window_on_softmax(ckpts, ids):
    decoder = model(ckpts, "sdpa")
    reference = losses(decoder, ids)
    with pruned_cache(decoder, PruneRule(window=10)) as stats:
        windowed = losses(decoder, ids)
    t1 = torch.arange(1, T + 1, dtype=torch.float64)
    assert stats.mean_fraction() == pytest.approx(float((t1.clamp(max=10) / t1).mean()))
    assert torch.allclose(windowed[:, :10], reference[:, :10], atol=1e-5)  # the first 10 queries see everything
    assert not torch.allclose(windowed, reference)
    with pruned_cache(decoder, PruneRule(window=T)):
        assert torch.allclose(losses(decoder, ids), reference, atol=1e-6)
    with pruned_cache(decoder, PruneRule(threshold=-10.0)) as stats:  # no bias: nothing to prune
        assert torch.equal(losses(decoder, ids), reference)
    assert stats.mean_fraction() == 1.0


def test_context_restores_the_model(ckpts, ids):
    decoder = model(ckpts, "fpa")
    reference = losses(decoder, ids)
    with pytest.raises(RuntimeError, match="inside"):
        with pruned_cache(decoder, PruneRule(threshold=-0.1)):
            raise RuntimeError("inside")
    assert all(b.attn.backend.bias_hook is None for b in decoder.blocks)
    assert torch.equal(losses(decoder, ids), reference)


def test_window_for_fraction_inverts_the_mean_kept_fraction():
    for length in (64, 2048):
        for window in (1, 7, 50, length):
            t1 = torch.arange(1, length + 1, dtype=torch.float64)
            fraction = float((t1.clamp(max=window) / t1).mean())
            assert window_for_fraction(fraction, length) == window
    with pytest.raises(ValueError):
        window_for_fraction(0.0, 64)


@pytest.mark.parametrize("backend", ["fpa", "fox", "sdpa"])
def test_block_size_changes_nothing(ckpts, ids, backend):
    """The eviction flags carry from block to block, so blocks of 7 rows, the layer's 16 and all T rows at once
    give the same losses (to float32 rounding of the block-wise softmax) and exactly the same kept counts."""
    decoder = model(ckpts, backend)
    rule = PruneRule(window=10) if backend == "sdpa" else PruneRule(threshold=-1.0)
    results = []
    for block_size in (7, None, T):
        with pruned_cache(decoder, rule, block_size) as stats:
            results.append((losses(decoder, ids), stats.as_dict()))
    (reference, kept), others = results[0], results[1:]
    assert 0.05 < kept["kept_pair_fraction"] < 0.95  # the rule prunes, so the flags' carry is exercised
    for pruned, other_kept in others:
        torch.testing.assert_close(pruned, reference, rtol=1e-5, atol=1e-5)
        assert other_kept["kept_pair_fraction"] == kept["kept_pair_fraction"]
        assert other_kept["kept_fraction_per_layer"] == pytest.approx(kept["kept_fraction_per_layer"], rel=1e-12)


def test_no_rule_is_the_unhooked_forward(ckpts, ids):
    """rule None: every key kept on the hooked path, the unpruned partner of a pruned pass."""
    decoder = model(ckpts, "fpa")
    reference = losses(decoder, ids)
    with pruned_cache(decoder, None, 32) as stats:
        unpruned = losses(decoder, ids)
    torch.testing.assert_close(unpruned, reference, rtol=1e-5, atol=1e-5)
    assert stats.mean_fraction() == 1.0


def test_block_size_must_be_positive(ckpts):
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        with pruned_cache(model(ckpts, "fpa"), None, 0):
            pass
