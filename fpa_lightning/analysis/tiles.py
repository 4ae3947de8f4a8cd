"""Which tiles of a layer's bias the fused kernel's skipping can pass over (docs/kernel.md, §3), from the probe path.

A tile is one query block I and one key block J < I of `block` rows and columns (the kernels' 64). Skipping keeps a
tile when its bias bound is ≥ the threshold, and each variant's bound is the tile's exact largest bias (over all its
pairs, documents or not), so the fraction counted here is the fraction of off-diagonal tiles the kernel computes
(without documents; with them, tiles no document spans are skipped as well). Diagonal tiles are always computed and
are not counted. Pure tensor maths over the probe path's bias: what the skip can save on a model's own fields
(benchmarks/train_throughput.py --tile-census). `naive_fpa_attention`'s skip_threshold masks the same tiles.
"""
from __future__ import annotations

import torch

from fpa_lightning.attention import LayerProbe
from fpa_lightning.ops.fpa.naive import tile_maxima


def tile_max_bias(probe: LayerProbe, block: int = 64) -> torch.Tensor:
    """The largest bias of every off-diagonal tile: (B, H or 1, nI, nI) in the ingredients' dtype, nI = ceil(T /
    block), −inf on and above the diagonal (I ≤ J). Streams the bias a row block at a time (never (T, T) at once)."""
    blocks = []
    for lo, rows in probe.row_blocks(block_size=block):  # rows (B, H, R, hi): queries lo..hi-1
        B, H = rows.shape[:2]
        n_keys = lo // block  # the key blocks before this query block (lo is a multiple of block)
        blocks.append(tile_maxima(rows[..., : n_keys * block], block)[:, :, 0])  # (B, H, J)
    nI = len(blocks)
    out = torch.full((B, H, nI, nI), float("-inf"), device=rows.device, dtype=rows.dtype)
    for i, tile_max in enumerate(blocks):
        out[:, :, i, :i] = tile_max
    return out


def kept_tile_counts(probe: LayerProbe, threshold: float, block: int = 64) -> tuple[torch.Tensor, int]:
    """Per head (H or 1,), how many off-diagonal tiles have a largest bias ≥ threshold (the tiles that skipping at
    `threshold` keeps), summed over the batch's rows; and how many off-diagonal tiles a head has over those rows."""
    if probe.owner is None or probe.backend == "none":
        raise ValueError("a layer without a bias has no tile to skip: pass an FPA, FoX, Selective, DCP or ALiBi layer")
    tile_max = tile_max_bias(probe, block)  # (B, H, nI, nI), −inf on and above the diagonal
    B, nI = tile_max.shape[0], tile_max.shape[-1]
    return (tile_max >= threshold).sum(dim=(0, 2, 3)), B * nI * (nI - 1) // 2


def kept_tile_fraction(probe: LayerProbe, threshold: float, block: int = 64) -> torch.Tensor:
    """Per head (H or 1,), the fraction of off-diagonal tiles that skipping at `threshold` keeps (`kept_tile_counts`),
    over the batch's rows. NaN for a sequence of a single block (no such tile)."""
    kept, total = kept_tile_counts(probe, threshold, block)
    return kept / total if total else torch.full(kept.shape, float("nan"), device=kept.device)
