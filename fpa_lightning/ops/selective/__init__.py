"""Selective Attention ops (Leviathan et al. 2024), one signature three ways: the readable definition (naive), the
SDPA fast path over the materialised layer-shared bias (sdpa) and the fused Triton kernel without it (fused)."""
from fpa_lightning.ops.selective.fused import selective_attention_fused
from fpa_lightning.ops.selective.naive import (
    selection_rows,
    selection_scores,
    selective_attention_naive,
    selective_bias,
    selective_bias_block,
)
from fpa_lightning.ops.selective.sdpa import selective_attention_gpu

__all__ = [
    "selection_rows",
    "selection_scores",
    "selective_attention_fused",
    "selective_attention_gpu",
    "selective_attention_naive",
    "selective_bias",
    "selective_bias_block",
]
