"""Selective Attention (Leviathan et al. 2024), docs/method.md: the readable definition.

Selection logits S come from one head's attention logits (head 0), ReLU, with the BOS column (key 0) and
the diagonal zeroed; F[t, s] = Σ_{t'<t} S[t', s] (shifted so a token only masks later queries) is
subtracted from every head's logits (layer-shared). bias = −F, (B, 1, T, T).

Document masking (segment_ids (B, T)): every document's first token plays the BOS role (never selected) and keys
of other documents are −inf; F of a same-document pair only sums queries between them, so it never crosses a
boundary.

Everything here materialises (T, T) tensors and runs in any dtype (float64 for references). The fused Triton
kernel (fused.py) computes the same attention without the (T, T) bias; ``selective_attention_gpu`` (sdpa.py)
feeds the materialised bias to SDPA.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fpa_lightning.ops.blockwise import query_cumsum_block
from fpa_lightning.ops.common import dense_attention, document_first_tokens, same_document


def selection_scores(q0: torch.Tensor, k0: torch.Tensor, scale: float) -> torch.Tensor:
    """ReLU(q0·k0·scale) for every query of q0 (B, n, D) and key of k0 (B, S, D): (B, n, S), before any mask."""
    return F.relu(torch.einsum("bqd,bkd->bqk", q0, k0) * scale)


def selection_rows(q0: torch.Tensor, k0: torch.Tensor, lo: int, hi: int, scale: float,
                   first_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """S[t', s] for t' in [lo, hi), s in [0, hi): (B, hi − lo, hi). q0, k0: (B, T, D) of the selecting head;
    first_tokens (B, T) bool: the keys never selected (documents' first tokens; default: key 0 only)."""
    scores = selection_scores(q0[:, lo:hi], k0[:, :hi], scale)  # (B, n, hi)
    rows = torch.arange(lo, hi, device=q0.device)[:, None]
    keys = torch.arange(hi, device=q0.device)[None, :]
    if first_tokens is None:
        selectable = (keys < rows) & (keys > 0)  # causal, no diagonal, BOS never masked
    else:
        selectable = (keys < rows) & ~first_tokens[:, None, :hi]  # (B, n, hi)
    return torch.where(selectable, scores, torch.zeros_like(scores))


def selective_bias(q: torch.Tensor, k: torch.Tensor, *, scale: float | None = None,
                   segment_ids: torch.Tensor | None = None) -> torch.Tensor:
    """All pairs: −F as (B, 1, T, T), −inf above the diagonal (and across documents with segment_ids (B, T)).
    q, k: (B, T, H, D); head 0 selects."""
    T = q.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    first_tokens = None if segment_ids is None else document_first_tokens(segment_ids)
    S = selection_rows(q[:, :, 0], k[:, :, 0], 0, T, scale, first_tokens)  # (B, T, T)
    F_masked = S.cumsum(dim=1) - S  # exclusive: Σ_{t'<t}
    hidden = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)  # future keys
    if segment_ids is not None:
        hidden = hidden | ~same_document(segment_ids)[:, 0]  # (B, T, T)
    return (-F_masked).masked_fill(hidden, float("-inf"))[:, None]


def selective_bias_block(q0, k0, lo: int, hi: int, carry, scale: float, first_tokens: torch.Tensor | None = None):
    """Rows lo..hi-1 of −F over keys 0..hi-1, (B, 1, n, hi), and the carry Σ_{t'<hi} S[t', s] (B, hi)."""
    rows, carry = query_cumsum_block(selection_rows(q0, k0, lo, hi, scale, first_tokens), carry, inclusive=False)
    return -rows[:, None], carry


def selective_attention_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
                              segment_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The definition, materialised: softmax(q·kᵀ·scale − F, causal)·v with the layer-shared F of head 0.
    q, k, v: (B, T, H, D) in any dtype (float64 for references); segment_ids (B, T) or None. Returns (B, T, H, D).
    Gradients reach head 0's q and k through F as well."""
    bias = selective_bias(q, k, scale=scale, segment_ids=segment_ids)
    return dense_attention(q, k, v, bias, scale=scale, segment_ids=segment_ids)

