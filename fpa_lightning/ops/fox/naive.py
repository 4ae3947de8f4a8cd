"""The readable definition of FoX (Forgetting Transformer) attention, docs/method.md: the bias
b[t, s] = Σ_{s<u≤t} log σ(f_u) = c_t − c_s.

c = cumsum(logsigmoid(f)) (B, T, H) in float32 (float64 for references). ALiBi is the same bias with c_t = −m_h·t
(alibi.py). flex.py computes ``naive_fox_attention`` on the GPU without the (B, H, T, T) bias.
"""
from __future__ import annotations

import torch

from fpa_lightning.ops.common import dense_attention


def fox_bias(c: torch.Tensor) -> torch.Tensor:
    """All pairs: (B, H, T, T) with b[t, s] = c_t − c_s for s ≤ t, −inf for s > t. c: (B, T, H)."""
    c_h = c.transpose(1, 2)  # (B, H, T)
    bias = c_h[..., :, None] - c_h[..., None, :]
    T = c.shape[1]
    future = torch.ones(T, T, dtype=torch.bool, device=c.device).triu(1)
    return bias.masked_fill(future, float("-inf"))


def fox_bias_block(c_h: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Rows lo..hi-1 over keys 0..hi-1: (B, H, hi − lo, hi). c_h: (B, H, T). Entries s > t are masked later."""
    return c_h[..., lo:hi, None] - c_h[..., None, :hi]


def naive_fox_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_gate_cumsum: torch.Tensor, *,
                        scale: float | None = None, segment_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Causal FoX attention, the reference of ``fox_flex_attention`` (same signature): q, k, v (B, T, H, D), c
    (B, T, H), segment_ids (B, T) or None -> (B, T, H, D), materialised."""
    return dense_attention(q, k, v, fox_bias(log_gate_cumsum), scale=scale, segment_ids=segment_ids)
