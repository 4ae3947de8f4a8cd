"""DCP through SDPA: the layer-shared bias of naive.py materialised once as (B, 1, T, T) and fed to SDPA's
memory-efficient kernel. The backend's fused path was this until the Triton kernel of fused.py, which never
materialises the (T, T) bias, replaced it; it stays as a second fast path that the tests and benchmarks/attention.py
compare the kernel with."""
from __future__ import annotations

import torch.nn.functional as F

from fpa_lightning.ops.dcp.naive import dcp_bias


def dcp_attention_gpu(q, k, v, qi, ki, offset, *, scale: float | None = None, segment_ids=None):
    """Fast path: one layer-shared (B, 1, T, T) bias fed to SDPA's memory-efficient kernel."""
    bias = dcp_bias(qi, ki, offset, segment_ids).to(q.dtype)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias, scale=scale
    )
    return out.transpose(1, 2)
