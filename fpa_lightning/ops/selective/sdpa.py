"""Selective Attention through SDPA: the layer-shared bias of naive.py materialised once as (B, 1, T, T) and fed
to SDPA's memory-efficient kernel. The backend's fused path was this until the Triton kernel of fused.py, which
never materialises the (T, T) bias, replaced it; it stays as a second fast path that the tests and
benchmarks/attention.py compare the kernel with."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fpa_lightning.ops.selective.naive import selective_bias


def selective_attention_gpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
                            segment_ids: torch.Tensor | None = None):
    """Fast path: one layer-shared (B, 1, T, T) bias (not one per head) fed to SDPA's memory-efficient kernel."""
    bias = selective_bias(q, k, scale=scale, segment_ids=segment_ids).to(q.dtype)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias, scale=scale
    )
    return out.transpose(1, 2)
