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


def tile_max_bias(probe: LayerProbe, block: int = 64) -> torch.Tensor:
    """The largest bias of every off-diagonal tile: (B, H or 1, nI, nI) in the ingredients' dtype, nI = ceil(T /
    block), −inf on and above the diagonal (I ≤ J). Streams the bias a row block at a time (never (T, T) at once)."""
    blocks = []
    for lo, rows in probe.row_blocks(block_size=block):  # rows (B, H, R, hi): queries lo..hi-1
        B, H = rows.shape[:2]
        n_keys = lo // block  # the key blocks before this query block (lo is a multiple of block)
        tile_max = rows[..., : n_keys * block].amax(dim=2).unflatten(-1, (n_keys, block)).amax(dim=-1)  # (B, H, J)
        blocks.append(tile_max)
    nI = len(blocks)
    out = torch.full((B, H, nI, nI), float("-inf"), device=rows.device, dtype=rows.dtype)
    for i, tile_max in enumerate(blocks):
        out[:, :, i, :i] = tile_max
    return out


def kept_tile_fraction(probe: LayerProbe, threshold: float, block: int = 64) -> torch.Tensor:
    """Per head (H or 1,), the fraction of off-diagonal tiles whose largest bias is ≥ threshold (the tiles that
    skipping at `threshold` keeps), over the batch's rows. NaN for a sequence of a single block (no such tile)."""
    if probe.owner is None or probe.backend == "none":
        raise ValueError("a layer without a bias has no tile to skip: pass an FPA, FoX, Selective, DCP or ALiBi layer")
    tile_max = tile_max_bias(probe, block)  # (B, H, nI, nI)
    nI = tile_max.shape[-1]
    off_diagonal = torch.ones(nI, nI, dtype=torch.bool, device=tile_max.device).tril(-1)
    kept = (tile_max >= threshold) & off_diagonal
    return kept.sum(dim=(0, 2, 3)) / (off_diagonal.sum() * tile_max.shape[0])
