"""Dynamic Context Pruning ops (Anagnostidis et al. 2023), one signature three ways: the readable definition (naive),
the SDPA fast path over the materialised layer-shared bias (sdpa) and the fused Triton kernel without it (fused)."""
from fpa_lightning.ops.dcp.fused import dcp_attention_fused
from fpa_lightning.ops.dcp.naive import (
    dcp_attention_naive,
    dcp_bias,
    dcp_bias_block,
    log_keep,
    log_keep_rows,
)
from fpa_lightning.ops.dcp.sdpa import dcp_attention_gpu

__all__ = [
    "dcp_attention_fused",
    "dcp_attention_gpu",
    "dcp_attention_naive",
    "dcp_bias",
    "dcp_bias_block",
    "log_keep",
    "log_keep_rows",
]
