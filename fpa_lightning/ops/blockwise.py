"""Memory-efficient attention with an additive bias: one query block at a time, O(T·block) memory.

Each query block computes its bias rows, its scores against all earlier keys and its output, inside
``torch.utils.checkpoint``: the backward pass recomputes the block instead of keeping (T, T) tensors.
Backends whose bias accumulates over queries (Selective Attention, DCP, FPA dip-sum) thread a small
per-key *carry* from block to block.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch.utils.checkpoint import checkpoint

from fpa_lightning.ops.common import same_document

# bias_block(lo, hi, carry) -> (bias rows (B, H or 1, hi - lo, hi) or None, carry for the next block)
BiasBlockFn = Callable[[int, int, Any], tuple[torch.Tensor | None, Any]]


def attend_block(
    q_blk: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, lo: int, scale: float,
    segment_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of queries lo.. (q_blk (B, n, H, D)) over keys 0..hi-1 (k, v (B, hi, H, D)); with
    segment_ids (B, T) a query sees only keys of its own document."""
    n, hi = q_blk.shape[1], k.shape[1]
    scores = torch.einsum("bqhd,bkhd->bhqk", q_blk, k) * scale  # (B, H, n, hi)
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    rows = torch.arange(lo, lo + n, device=q_blk.device)[:, None]
    hidden = torch.arange(hi, device=q_blk.device)[None, :] > rows  # (n, hi): future keys
    if segment_ids is not None:
        hidden = hidden | ~same_document(segment_ids, lo, hi)  # (B, 1, n, hi)
    probs = scores.masked_fill(hidden, float("-inf")).softmax(dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", probs.to(v.dtype), v)


def blockwise_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias_block: BiasBlockFn | None,
    *,
    scale: float | None = None,
    block_size: int = 64,
    carry: Any = None,
    segment_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q·kᵀ·scale + bias, causal)·v computed in query blocks. q, k, v (B, T, H, D) -> (B, T, H, D).

    segment_ids (B, T): document ids of packed rows; a query then attends only to keys of its own document."""
    T = q.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    recompute = torch.is_grad_enabled()

    def one_block(q_blk: torch.Tensor, carry_in: Any, lo: int, hi: int):
        bias, carry_out = bias_block(lo, hi, carry_in) if bias_block is not None else (None, None)
        return attend_block(q_blk, k[:, :hi], v[:, :hi], bias, lo, scale, segment_ids), carry_out

    outs = []
    for lo in range(0, T, block_size):
        hi = min(T, lo + block_size)
        if recompute:
            out, carry = checkpoint(one_block, q[:, lo:hi], carry, lo, hi, use_reentrant=False)
        else:
            out, carry = one_block(q[:, lo:hi], carry, lo, hi)
        outs.append(out)
    return torch.cat(outs, dim=1)


def grow_carry(carry: torch.Tensor | None, length: int, like: torch.Tensor) -> torch.Tensor:
    """A per-key running sum (..., n_keys) zero-padded to `length` keys (new keys have summed nothing yet).

    like: any tensor of shape (..., anything) giving the leading shape, dtype and device of a fresh carry.
    """
    if carry is None:
        return like.new_zeros(*like.shape[:-1], length)
    return torch.nn.functional.pad(carry, (0, length - carry.shape[-1]))


def query_cumsum_block(
    pair_rows: torch.Tensor, carry: torch.Tensor | None, *, inclusive: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows lo..hi-1 of a cumulative sum over queries of a pairwise matrix, and the new carry.

    pair_rows: (..., n, hi), rows lo..hi-1 of P[t', s]. carry: (..., lo) the column sums Σ_{t'<lo} P[t', s].
    Returns rows [t, s] = carry[s] + Σ_{lo≤t'≤t} P[t', s] (inclusive) or Σ_{lo≤t'<t} (exclusive), and the
    new carry Σ_{t'<hi} P[t', s] of shape (..., hi).
    """
    carry = grow_carry(carry, pair_rows.shape[-1], pair_rows[..., 0, :])
    running = pair_rows.cumsum(dim=-2)
    if not inclusive:
        running = running - pair_rows
    return carry[..., None, :] + running, carry + pair_rows.sum(dim=-2)
