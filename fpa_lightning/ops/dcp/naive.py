"""Dynamic Context Pruning (Anagnostidis et al. 2023), docs/method.md.

Interaction queries and keys (qi, ki: (B, T, r), shared across heads) give a keep probability per
(query, key) through the sparse sigmoid σ₂(z) = clamp((z + 1) / 2, 0, 1) (α = 2 entmax of [z, 0]);
a key dropped by any query stays dropped: keep(t, s) = Π_{s<t'≤t} σ₂(z[t', s]). The log of that
product is added to every head's logits (layer-shared): bias = Σ_{s<t'≤t} log σ₂(z[t', s]), (B, 1, T, T).

The readable definition: everything here materialises (T, T) tensors and runs in any dtype (float64 for
references). ``dcp_attention_gpu`` (sdpa.py) feeds the materialised bias to SDPA; ``dcp_attention_fused``
(fused.py) computes the same attention without it.
"""
from __future__ import annotations

import math

import torch

from fpa_lightning.ops.blockwise import query_cumsum_block
from fpa_lightning.ops.common import dense_attention, same_document

# log of a hard zero: a finite floor keeps sums and their gradients finite (exp(−69) is 1e-30).
_LOG_FLOOR_PROB = 1e-30


def log_keep(qi: torch.Tensor, ki: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """log σ₂(z[t', s]) for every query t' of qi (B, n, r) and key s of ki (B, S, r): (B, n, S), no causal mask."""
    z = torch.einsum("bqr,bkr->bqk", qi, ki) / math.sqrt(qi.shape[-1]) + offset
    keep = ((z + 1) / 2).clamp(0, 1)
    return keep.clamp_min(_LOG_FLOOR_PROB).log()


def log_keep_rows(qi: torch.Tensor, ki: torch.Tensor, offset: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """log σ₂(z[t', s]) for t' in [lo, hi), s in [0, hi), zero where s ≥ t': (B, hi − lo, hi)."""
    values = log_keep(qi[:, lo:hi], ki[:, :hi], offset)
    rows = torch.arange(lo, hi, device=qi.device)[:, None]
    keys = torch.arange(hi, device=qi.device)[None, :]
    return torch.where(keys < rows, values, torch.zeros_like(values))


def dcp_bias(qi: torch.Tensor, ki: torch.Tensor, offset: torch.Tensor,
             segment_ids: torch.Tensor | None = None) -> torch.Tensor:
    """All pairs: (B, 1, T, T) cumulative log keep probabilities, −inf above the diagonal (and across documents
    with segment_ids (B, T): a same-document pair's product runs over queries of that document only)."""
    T = qi.shape[1]
    bias = log_keep_rows(qi, ki, offset, 0, T).cumsum(dim=1)  # Σ_{t'≤t}; zero for t' ≤ s
    hidden = torch.ones(T, T, dtype=torch.bool, device=qi.device).triu(1)  # future keys
    if segment_ids is not None:
        hidden = hidden | ~same_document(segment_ids)[:, 0]  # (B, T, T)
    return bias.masked_fill(hidden, float("-inf"))[:, None]


def dcp_bias_block(qi, ki, offset, lo: int, hi: int, carry):
    """Rows lo..hi-1 over keys 0..hi-1, (B, 1, n, hi), and the carry Σ_{t'<hi} log keep (B, hi)."""
    rows, carry = query_cumsum_block(log_keep_rows(qi, ki, offset, lo, hi), carry, inclusive=True)
    return rows[:, None], carry


def dcp_attention_naive(q, k, v, qi, ki, offset, *, scale: float | None = None,
                        segment_ids: torch.Tensor | None = None):
    """Readable definition: the materialised bias of ``dcp_bias`` added to every head's logits, (B, T, H, D)."""
    return dense_attention(q, k, v, dcp_bias(qi, ki, offset, segment_ids), scale=scale, segment_ids=segment_ids)
