"""The tile census (fpa_lightning/analysis/tiles.py): hand-worked ALiBi-like fields, and the brute-force maximum of
the materialised bias on random fields of odd size."""
import pytest
import torch

from fpa_lightning.analysis.tiles import kept_tile_fraction, tile_max_bias
from fpa_lightning.attention import AttentionConfig, LayerProbe
from fpa_lightning.attention.backends import FpaBackend
from fpa_lightning.ops.fpa import fpa_bias


def fpa_probe(phi: torch.Tensor, psi: torch.Tensor, beta: torch.Tensor) -> LayerProbe:
    backend = FpaBackend(AttentionConfig(backend="fpa"), d_model=4, n_head=phi.shape[-1], head_dim=2)
    return LayerProbe("fpa", {"phi": phi, "psi": psi, "beta": beta}, owner=backend)


def test_alibi_fields_keep_the_near_tiles():
    # φ = ψ = −t (β = 1): b[t, s] = −(t − s); blocks of 4 over T = 16, so tile (I, J)'s largest bias is at its
    # nearest pair, t = 4I and s = 4J + 3: −(4(I − J) − 3) = −1, −5, −9 at block distances 1, 2, 3
    field = -torch.arange(16.0)[None, :, None]  # (B=1, T=16, H=1)
    probe = fpa_probe(field, field.clone(), torch.ones(1))
    tile_max = tile_max_bias(probe, block=4)[0, 0]
    expected = torch.full((4, 4), float("-inf"))
    for i in range(4):
        for j in range(i):
            expected[i, j] = -(4.0 * (i - j) - 3.0)
    assert torch.equal(tile_max, expected)
    # 6 off-diagonal tiles: 3 at distance 1, 2 at distance 2, 1 at distance 3
    assert kept_tile_fraction(probe, threshold=-2.0, block=4).tolist() == [pytest.approx(3 / 6)]
    assert kept_tile_fraction(probe, threshold=-5.0, block=4).tolist() == [pytest.approx(5 / 6)]
    assert kept_tile_fraction(probe, threshold=-100.0, block=4).tolist() == [pytest.approx(1.0)]


@pytest.mark.parametrize("block", [4, 7])
def test_matches_the_materialised_bias(block):
    # random walks of odd length (the last query block is partial), float64: the maximum is exact
    gen = torch.Generator().manual_seed(3)
    B, T, H = 2, 37, 3
    walk = (0.3 * torch.randn(B, T, H, generator=gen, dtype=torch.float64) - 0.1).cumsum(1)
    phi = walk + 0.5 * torch.randn(B, T, H, generator=gen, dtype=torch.float64)
    psi = walk + 0.5 * torch.randn(B, T, H, generator=gen, dtype=torch.float64)
    beta = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    bias = fpa_bias(phi, psi, beta)  # (B, H, T, T)
    nI = -(-T // block)
    expected = torch.full((B, H, nI, nI), float("-inf"), dtype=torch.float64)
    for i in range(nI):
        for j in range(i):
            expected[:, :, i, j] = bias[:, :, i * block:(i + 1) * block, j * block:(j + 1) * block].amax(dim=(2, 3))
    probe = fpa_probe(phi, psi, beta)
    assert torch.equal(tile_max_bias(probe, block), expected)
    threshold = expected[torch.isfinite(expected)].median().item()  # some tiles kept, some skipped
    kept = ((expected >= threshold) & torch.isfinite(expected)).sum(dim=(0, 2, 3)) / (B * nI * (nI - 1) / 2)
    fraction = kept_tile_fraction(probe, threshold, block)
    assert 0 < fraction.mean() < 1
    assert torch.allclose(fraction, kept.to(fraction.dtype))


def test_a_layer_without_bias_is_refused():
    with pytest.raises(ValueError, match="no tile to skip"):
        kept_tile_fraction(LayerProbe("none"), threshold=-10.0)
