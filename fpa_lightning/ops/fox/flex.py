"""FoX (forgetting attention) on the GPU through FlexAttention.

    fox_flex_attention(q, k, v, log_gate_cumsum, *, scale=None, segment_ids=None) -> (B, T, H, D)

q, k, v: (B, T, H, D); log_gate_cumsum c: (B, T, H) fp32, c = cumsum of logsigmoid(forget logits).
Bias b[t, s] = c_t − c_s, causal; with segment_ids (B, T) also restricted to keys of the query's document (a
document mask_mod). Gradients flow to q, k, v and c. CUDA only: no silent fallback.

The score_mod indexes two tensors, `c` for the query side and `c` for the key side, and only the key side carries a
gradient. The query side's gradient is exactly zero: a term that depends on the query alone adds the same constant to
a softmax row, and each row of the score gradient dS sums to zero (Σ_s P·(dP − Δ) = Δ − Δ); left grad-requiring, it
only cost FlexAttention an atomic accumulation of that zero. (Indexing one grad-requiring tensor twice also does not
compile for training.) The key side's gradient is accumulated with atomic adds in a varying order, so c's gradient
is not bit-for-bit repeatable: docs/kernel.md, "FlexAttention".

Lengths: the inputs are padded at the end to the next power of two, at least ``MIN_LENGTH`` (padded keys lie after
every real query, so causality hides them; padded rows are cut off), and the function is compiled for
static shapes: one graph per (batch, padded length), so prompts of many lengths (pass-key retrieval, long-document
evaluation) need at most one per power of two (8 cover 128 to 16,384 tokens), and the recompile limit is raised to
``MAX_GRAPHS`` around the call. Static, not dynamic: compiled with dynamic shapes the same kernel was several times
slower (KERNEL_LOG.md, "FoX through FlexAttention"). Training lengths are powers of two already.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

MIN_LENGTH = 128  # FlexAttention's block size: whole blocks only, so no length hits a partial-block variant
MAX_GRAPHS = 64  # compiled (batch, padded length) shapes before torch._dynamo gives up on recompiling


def padded_length(T: int) -> int:
    """The length a (B, T) input is padded to: the next power of two, at least MIN_LENGTH."""
    return max(MIN_LENGTH, 1 << (T - 1).bit_length())


@functools.lru_cache(maxsize=None)
def _compiled():
    from torch.nn.attention.flex_attention import flex_attention

    def core(q, k, v, cq, ck, block_mask, scale):
        def score_mod(score, b, h, q_idx, kv_idx):
            return score + cq[b, h, q_idx] - ck[b, h, kv_idx]

        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)

    return torch.compile(core, dynamic=False)


@functools.lru_cache(maxsize=32)
def _causal_block_mask(T: int, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    return create_block_mask(causal, B=None, H=None, Q_LEN=T, KV_LEN=T, device=device)


def _document_block_mask(segment_ids: torch.Tensor):
    """Causal and same-document, per row of segment_ids (B, T): built per batch (the documents change)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def causal_same_document(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (segment_ids[b, q_idx] == segment_ids[b, kv_idx])

    B, T = segment_ids.shape
    return create_block_mask(causal_same_document, B=B, H=None, Q_LEN=T, KV_LEN=T, device=segment_ids.device)


def fox_flex_attention(q, k, v, log_gate_cumsum, *, scale=None, segment_ids=None):
    """Causal FoX attention via compiled FlexAttention; inputs (B, T, H, D), c (B, T, H), segment_ids (B, T) or None."""
    c = log_gate_cumsum
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v, c)):
        raise ValueError("fox_flex_attention: q, k, v, log_gate_cumsum must be tensors")
    if not (q.is_cuda and k.is_cuda and v.is_cuda and c.is_cuda):
        raise RuntimeError(
            "fox_flex_attention needs CUDA tensors (FlexAttention is compiled for the GPU); "
            "use dense_attention with bias c_t - c_s on the CPU"
        )
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"fox_flex_attention: q, k, v must be (B, T, H, D) of one shape, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, T, H, D = q.shape
    if c.shape != (B, T, H):
        raise ValueError(f"fox_flex_attention: log_gate_cumsum must be (B, T, H) = {(B, T, H)}, got {tuple(c.shape)}")
    if segment_ids is not None and segment_ids.shape != (B, T):
        raise ValueError(f"fox_flex_attention: segment_ids must be (B, T) = {(B, T)}, got {tuple(segment_ids.shape)}")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    pad = padded_length(T) - T
    heads_first = [F.pad(t, (0, 0, 0, 0, 0, pad)).transpose(1, 2) for t in (q, k, v)]  # (B, H, Tp, D)
    ck = F.pad(c.float(), (0, 0, 0, pad)).transpose(1, 2).contiguous()  # (B, H, Tp), key side: carries c's gradient
    cq = ck.detach()  # query side: its gradient is exactly zero (the docstring), so none is accumulated
    if segment_ids is None:
        block_mask = _causal_block_mask(T + pad, str(q.device))
    else:  # padded positions form a document of their own (id −1): a padded row still sees its own key
        block_mask = _document_block_mask(F.pad(segment_ids, (0, pad), value=-1))
    with torch._dynamo.config.patch(recompile_limit=MAX_GRAPHS):
        out = _compiled()(*heads_first, cq, ck, block_mask, scale)
    return out.transpose(1, 2)[:, :T]
