"""Attention of a few new queries over a KV cache (decoding), the readable definition: two einsums around a masked
softmax, in any dtype (float64 for references). The fused Triton op (fused.py) computes the same without the
(B, H, n, S) scores."""
from __future__ import annotations

import torch


def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                     visible: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q·kᵀ·scale + bias) · v over the visible slots. q (B, n, H, D); k, v (B, H, S, D); bias (B, H or 1,
    n, S) or None; visible (B, H, n, S) bool. Scores and softmax in float32 at least, as the parallel paths."""
    scores = torch.einsum("bqhd,bhkd->bhqk", q, k) * scale  # (B, H, n, S)
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
    return torch.einsum("bhqk,bhkd->bqhd", probs.to(v.dtype), v)
