"""Pieces every attention op shares: dense causal attention with an additive bias, the float32 floor for bias
ingredients, and the finite stand-in for infinity that keeps masked ranges finite (docs/method.md, "Conventions")."""
from __future__ import annotations

import math

import torch

# A finite stand-in for +inf in masked or empty ranges. exp(−FAR − x) is exactly 0 for any field value a model
# can produce, and every intermediate stays finite, so a masked entry can never turn a zero gradient into NaN
# (0·inf) in the backward pass. The Triton kernels use the same value.
FAR = 1e30


def at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    """t in float32 at least (float64 stays float64), whatever autocast did to it."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def same_document(segment_ids: torch.Tensor) -> torch.Tensor:
    """segment_ids (B, T) -> (B, 1, T, T) bool, True where query t and key s lie in the same document.

    Document masking (docs/method.md, "Document masking"): a packed row's documents never see each other.
    """
    return (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, *, scale: float | None = None,
    segment_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal softmax attention with an additive bias, materialised.

    q, k, v: (B, T, H, D); bias: (B, H or 1, T, T) or None; segment_ids: (B, T) document ids of a packed row, or
    None: with them a query attends only to keys of its own document. Returns (B, T, H, D).
    Scores and softmax run in the promoted dtype of q and bias (float32 at least).
    """
    T, D = q.shape[1], q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale  # (B, H, T, T)
    work_dtype = torch.promote_types(scores.dtype, torch.float32)
    scores = scores.to(work_dtype)
    if bias is not None:
        scores = scores + bias.to(work_dtype)
    allowed = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    if segment_ids is not None:
        allowed = allowed & same_document(segment_ids)
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", probs.to(v.dtype), v)
