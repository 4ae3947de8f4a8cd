"""Selective Attention (Leviathan et al. 2024), docs/method.md.

Selection logits S come from one head's attention logits (head 0), ReLU, with the BOS column (key 0) and
the diagonal zeroed; F[t, s] = Σ_{t'<t} S[t', s] (shifted so a token only masks later queries) is
subtracted from every head's logits (layer-shared). bias = −F, (B, 1, T, T).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fpa_lightning.ops.blockwise import query_cumsum_block


def selection_scores(q0: torch.Tensor, k0: torch.Tensor, scale: float) -> torch.Tensor:
    """ReLU(q0·k0·scale) for every query of q0 (B, n, D) and key of k0 (B, S, D): (B, n, S), before any mask."""
    return F.relu(torch.einsum("bqd,bkd->bqk", q0, k0) * scale)


def selection_rows(q0: torch.Tensor, k0: torch.Tensor, lo: int, hi: int, scale: float) -> torch.Tensor:
    """S[t', s] for t' in [lo, hi), s in [0, hi): (B, hi − lo, hi). q0, k0: (B, T, D) of the selecting head."""
    scores = selection_scores(q0[:, lo:hi], k0[:, :hi], scale)  # (B, n, hi)
    rows = torch.arange(lo, hi, device=q0.device)[:, None]
    keys = torch.arange(hi, device=q0.device)[None, :]
    selectable = (keys < rows) & (keys > 0)  # causal, no diagonal, BOS never masked
    return torch.where(selectable, scores, torch.zeros_like(scores))


def selective_bias(q: torch.Tensor, k: torch.Tensor, *, scale: float | None = None) -> torch.Tensor:
    """All pairs: −F as (B, 1, T, T), −inf above the diagonal. q, k: (B, T, H, D); head 0 selects."""
    T = q.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    S = selection_rows(q[:, :, 0], k[:, :, 0], 0, T, scale)  # (B, T, T)
    F_masked = S.cumsum(dim=1) - S  # exclusive: Σ_{t'<t}
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return (-F_masked).masked_fill(future, float("-inf"))[:, None]


def selective_bias_block(q0, k0, lo: int, hi: int, carry, scale: float):
    """Rows lo..hi-1 of −F over keys 0..hi-1, (B, 1, n, hi), and the carry Σ_{t'<hi} S[t', s] (B, hi)."""
    rows, carry = query_cumsum_block(selection_rows(q0, k0, lo, hi, scale), carry, inclusive=False)
    return -rows[:, None], carry


def selective_attention_gpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None):
    """Fast path: one layer-shared (B, 1, T, T) bias (not one per head) fed to SDPA's memory-efficient kernel."""
    bias = selective_bias(q, k, scale=scale).to(q.dtype)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias, scale=scale
    )
    return out.transpose(1, 2)
