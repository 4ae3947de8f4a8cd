"""Head statistics on hand-built FPA fields and levels, with expectations worked out by hand; and a naive
per-query reference on real model biases of every backend."""
import math

import pytest
import torch

from fpa_lightning.analysis.survival import (
    count_nonsuffix_heads,
    document_boundaries,
    document_starts,
    effective_query_start,
    layer_survival,
    measure_heads,
    pooled_boundary_ratio,
    walk_steps,
)
from fpa_lightning.attention import AttentionConfig, LayerProbe
from fpa_lightning.attention.backends import FpaBackend
from fpa_lightning.config import ModelConfig
from fpa_lightning.model import Decoder

# Two heads over T = 6, one batch row, threshold −1 (alive: β·depth ≥ −1).
# Head 0 (β = 1, stack form φ = ψ): φ = 0 10 20 5 30 40. The dip to 5 at t = 3 kills keys 1 and 2 (levels 10, 20);
#   key 0 (level 0) and every later key survive. Alive sets: {0} {0,1} {0,1,2} {0,3} {0,3,4} {0,3,4,5}.
# Head 1 (β = 0.6): φ = ψ = 0 −1 −2 −3 −4 −5, so b[t, s] = −0.6·(t − s): alive iff t − s ≤ 1, A_t = {t−1, t}.
PHI = torch.tensor([[0.0, 10, 20, 5, 30, 40], [0.0, -1, -2, -3, -4, -5]]).T[None]  # (B=1, T=6, H=2)
BETA = torch.tensor([1.0, 0.6])
SEGMENTS = torch.tensor([[0, 0, 0, 1, 1, 1]])  # a document starts at t = 3


def hand_built_probe() -> LayerProbe:
    backend = FpaBackend(AttentionConfig(backend="fpa"), d_model=4, n_head=2, head_dim=2)
    return LayerProbe("fpa", {"phi": PHI, "psi": PHI.clone(), "beta": BETA}, owner=backend)


@pytest.mark.parametrize("block_size", [1, 2, 4, 6])  # carries across block edges must not change anything
def test_hand_built_fpa_statistics(block_size):
    stats = layer_survival(hand_built_probe().row_blocks(block_size), SEGMENTS, query_start=3)
    # queries 3, 4, 5: |A_t| / (t + 1)
    assert stats.alive_fraction.tolist() == pytest.approx([(2 / 4 + 3 / 5 + 4 / 6) / 3, (2 / 4 + 2 / 5 + 2 / 6) / 3])
    # head 0: A_3 = {0, 3}: suffix {3} -> 1/2; A_4 = {0, 3, 4}: suffix {3, 4} -> 1/3; A_5: suffix {3, 4, 5} -> 1/4
    assert stats.nonsuffix_fraction.tolist() == pytest.approx([(1 / 2 + 1 / 3 + 1 / 4) / 3, 0.0])
    # boundaries: t = 2 (the first document's EOS) and t = 3 (the next one's BOS)
    # head 0: 2 deaths (keys 1, 2) at t = 3, none at t = 2; 5 queries t ≥ 1 -> rate 0.4; boundary 2 / 2 -> ratio 2.5
    # head 1: key t − 2 dies at each t ≥ 2 -> 4 deaths, rate 0.8; 1 at each boundary -> ratio 1.25
    assert stats.death_rate.tolist() == pytest.approx([0.4, 0.8])
    assert stats.boundary_death_rate.tolist() == pytest.approx([1.0, 1.0])
    assert stats.boundary_ratio.tolist() == pytest.approx([2.5, 1.25])
    # pooled over both heads: 4 boundary deaths / 4 (boundary, head) pairs ÷ 6 deaths / 10 (query, head) pairs
    assert pooled_boundary_ratio([stats]) == pytest.approx(1.0 / 0.6)
    assert count_nonsuffix_heads(stats.nonsuffix_fraction, 0.10) == 1


def test_threshold_zero_is_the_exact_alive_set():
    # head 1 with threshold 0: only the query's own key (b = 0) is alive, every key dies the step after
    stats = layer_survival(hand_built_probe().row_blocks(4), SEGMENTS, query_start=3, threshold=0.0)
    assert stats.alive_fraction[1].item() == pytest.approx((1 / 4 + 1 / 5 + 1 / 6) / 3)
    assert stats.boundary_ratio[1].item() == pytest.approx(1.0)


def test_holes_in_a_hand_written_bias():
    # one query row t = 4 over keys 0..4: alive {0, 2, 4}; the last dead key is 3, so the suffix is {4}
    bias = torch.full((5, 5), -5.0)
    bias[4] = torch.tensor([0.0, -5.0, -0.5, -5.0, 0.0])
    bias.fill_diagonal_(0.0)
    bias = bias.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))[None, None]  # (1, 1, 5, 5)
    stats = layer_survival([(0, bias)], torch.zeros(1, 5, dtype=torch.long), query_start=4)
    assert stats.alive_fraction.item() == pytest.approx(3 / 5)
    assert stats.nonsuffix_fraction.item() == pytest.approx(2 / 3)
    assert math.isnan(stats.boundary_ratio.item())  # no document start: undefined, not 0 or inf


def test_document_starts_and_walk_steps():
    assert document_starts(torch.tensor([[0, 0, 1, 1, 2], [3, 3, 3, 3, 3]])).tolist() == [
        [False, False, True, False, True], [False] * 5]
    # an EOS at t = 0 has no death to count (deaths start at t = 1); the row's last token ends nothing it can see
    assert document_boundaries(torch.tensor([[0, 1, 1, 2, 2, 2], [3, 3, 3, 3, 3, 3]])).tolist() == [
        [False, True, True, True, False, False], [False] * 6]
    walk = walk_steps(PHI, 2 * PHI)
    # head 0 steps 10 10 −15 25 10: mean 8, population std sqrt((4 + 4 + 529 + 289 + 4) / 5); head 1 steps all −1
    assert walk["field_step_mean"].tolist() == pytest.approx([8.0, -1.0])
    assert walk["field_step_std"].tolist() == pytest.approx([math.sqrt(166.0), 0.0])
    assert walk["level_step_mean"].tolist() == pytest.approx([16.0, -2.0])


def test_query_start_clamps_for_short_probes():
    assert effective_query_start(1024, 2048) == 1024
    assert effective_query_start(1024, 256) == 128


def naive_reference(bias: torch.Tensor, starts: list[int], query_start: int, threshold: float):
    """One head's dense (T, T) bias, query by query: alive fraction, non-suffix fraction, deaths at starts, all deaths."""
    T = bias.shape[0]
    alive = [{s for s in range(t + 1) if bias[t, s] >= threshold} for t in range(T)]
    late = range(query_start, T)
    fraction = sum(len(alive[t]) / (t + 1) for t in late) / len(late)
    nonsuffix = 0.0
    for t in late:
        j = t
        while j - 1 in alive[t]:
            j -= 1
        nonsuffix += (len(alive[t]) - (t - j + 1)) / len(alive[t]) / len(late)
    deaths = [len(alive[t - 1] - alive[t]) for t in range(1, T)]  # deaths[t − 1] = deaths(t)
    return fraction, nonsuffix, sum(deaths[t - 1] for t in starts), sum(deaths)


@pytest.mark.parametrize("backend", ["fpa", "fox", "selective", "dcp", "alibi"])
def test_blockwise_statistics_match_a_naive_reference(backend):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50, n_layer=1, d_model=16, n_head=2, d_mlp=32, max_seq_len=48,
                      attention=AttentionConfig(backend=backend))
    model = Decoder(cfg)
    with torch.no_grad():  # random gate maps so alive sets have holes and deaths (the inits are smooth decays)
        for name, p in model.named_parameters():
            if "backend" in name or "qkv" in name:
                p.normal_(0.0, 1.0)
    ids = torch.randint(0, 50, (2, 40))
    segments = torch.tensor([[0] * 10 + [1] * 17 + [2] * 13, [0] * 25 + [1] * 15])
    report = measure_heads(model, ids, segments, query_start=20, block_size=16)
    dense = model.probe(ids)[0].bias()  # (B, H or 1, T, T)
    stats = report.layers[0]
    for h in range(2):
        per_row = [naive_reference(dense[b, min(h, dense.shape[1] - 1)], starts, 20, -1.0)
                   for b, starts in enumerate([[9, 10, 26, 27], [24, 25]])]  # each document's EOS and the next BOS
        fraction, nonsuffix, at_starts, deaths = (sum(r[i] for r in per_row) for i in range(4))
        assert stats.alive_fraction[h].item() == pytest.approx(fraction / 2)
        assert stats.nonsuffix_fraction[h].item() == pytest.approx(nonsuffix / 2)
        assert stats.boundary_death_rate[h].item() == pytest.approx(at_starts / 6)  # 3 EOS and 3 BOS
        assert stats.death_rate[h].item() == pytest.approx(deaths / (2 * 39))  # 2 rows × queries 1..39
        assert 0.0 <= stats.alive_fraction[h].item() <= 1.0
    if backend == "fpa":
        assert report.beta[0].shape == (2,) and set(report.walk[0]) == {
            "field_step_mean", "field_step_std", "level_step_mean", "level_step_std"}


def test_a_model_without_any_bias_is_refused():
    cfg = ModelConfig(vocab_size=50, n_layer=1, d_model=16, n_head=2, d_mlp=32, max_seq_len=16,
                      attention=AttentionConfig(backend="sdpa"))
    with pytest.raises(ValueError, match="no attention layer with a bias"):
        measure_heads(Decoder(cfg), torch.zeros(1, 16, dtype=torch.long), torch.zeros(1, 16, dtype=torch.long), 8)
