"""FoX (Forgetting Transformer) bias, docs/method.md: b[t, s] = Σ_{s<u≤t} log σ(f_u) = c_t − c_s.

c = cumsum(logsigmoid(f)) (B, T, H) in float32. ALiBi is the same bias with c_t = −m_h·t (ops/alibi.py).
"""
from __future__ import annotations

import torch


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
