"""FoX (forgetting attention) on the GPU through FlexAttention.

    fox_flex_attention(q, k, v, log_gate_cumsum, *, scale=None) -> (B, T, H, D)

q, k, v: (B, T, H, D); log_gate_cumsum c: (B, T, H) fp32, c = cumsum of logsigmoid(forget logits).
Bias b[t, s] = c_t − c_s, causal. Gradients flow to q, k, v and c. CUDA only: no silent fallback.

The score_mod indexes two tensors, `c` for the query side and `c.clone()` for the key side: indexing
one grad-requiring tensor twice does not compile for training (docs/kernel.md, "FlexAttention").
"""
from __future__ import annotations

import functools
import math

import torch


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


def fox_flex_attention(q, k, v, log_gate_cumsum, *, scale=None):
    """Causal FoX attention via compiled FlexAttention; inputs (B, T, H, D) and c (B, T, H)."""
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
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    cq = c.float().transpose(1, 2).contiguous()  # (B, H, T), query side
    ck = cq.clone()  # key side: a second tensor (the trap)
    bm = _causal_block_mask(T, str(q.device))
    out = _compiled()(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), cq, ck, bm, scale)
    return out.transpose(1, 2)
