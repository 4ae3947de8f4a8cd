"""The single-token decoding step's ops, the readable definitions (any float dtype, float64 for references). The
fused Triton kernels (fused.py) compute the same with one launch each; ``DecodeSession`` runs one or the other.

    add_rms_norm(x, delta, weight, eps) -> (x + delta, RMSNorm(x + delta))     a residual add and the next norm
    silu_mul(gate_up) -> silu(gate) · up                                           SwiGLU's activation
    store_token(qkv, positions, cos, sin, k_cache, v_cache, key_pos, append,
                gate_weight, gate_bias, x, walk, level, path_min) -> (q, k, slots, phi)
    step_attention(q, k_cache, v_cache, key_pos, positions, scale,
                   path_min, level, phi, beta_raw, threshold) -> out

``store_token`` is what a new token does to a layer's cache before it attends: its key takes a slot (its position
without eviction, else the first free slot of each (row, head)), RoPE turns q and k, and k, v and the position are
written there. With FPA's gate map given (gate_weight ... path_min), it also advances the walk and stores the new
key's level ψ_t and empty path minimum (docs/generation.md, "The decoding step"). ``step_attention`` attends the new
query to the cached keys a slot's position makes visible (held, not in the future); with FPA's state it first
advances every older key's path minimum m_s by φ_t, adds the bias β·min(0, m_s − ψ_s) and evicts, for good, the keys
whose bias falls below the threshold (never the newest). Together they are what ``DecodeSession``'s einsum path
does for a key-level FPA layer with the min reduction (or a layer without a bias) in a step; FPA's parts are
ops/fpa/step's (``gate_map``, ``step_bias``).
"""
from __future__ import annotations

import torch

from fpa_lightning.ops.common import FAR, FREE, rms_norm, rope_rotate, silu_mul
from fpa_lightning.ops.decode.naive import cached_attention
from fpa_lightning.ops.fpa.step.naive import gate_map, step_bias

__all__ = ["add_rms_norm", "silu_mul", "step_attention", "store_token"]


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., C) plus delta (x's shape and dtype, or None: nothing added) -> (the sum in x's dtype, its RMSNorm times
    weight (C,) in x's dtype): the pre-norm block's residual add followed by the next norm."""
    total = x if delta is None else x + delta
    return total, rms_norm(total, weight, eps)


def store_token(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
                k_cache: torch.Tensor, v_cache: torch.Tensor, key_pos: torch.Tensor, append: bool,
                gate_weight: torch.Tensor | None = None, gate_bias: torch.Tensor | None = None,
                x: torch.Tensor | None = None, walk: torch.Tensor | None = None, level: torch.Tensor | None = None,
                path_min: torch.Tensor | None = None):
    """One new token per row enters a layer's cache.

    qkv (B, 3·H·D): the token's q, k, v projections (the layer's qkv output); positions (B,) int64; cos, sin (L, D)
    float32 tables indexed by position (RoPE), or None for no rotation; k_cache, v_cache (B, H, S, D) and key_pos
    (B, H, S) int32 (FREE = −1 marks a free slot). append: the slot is the position (a cache without eviction), else
    the first free slot of each (row, head), which must exist.
    FPA (all six given, or none): gate_weight (G·H, C) float32 and gate_bias (G·H,): the gate map δ, g, h (G = 1, 2
    or 3 maps of H heads) of x (B, C), the layer's normed input; walk (B, H) float32, advanced in place to
    W_t = W_{t−1} + δ_t; level, path_min (B, H, S) float32 get ψ_t = W_t + h_t (W_t when G < 3) and FAR at the slot.

    Returns q and k (B, H, D) in qkv's dtype (rotated), slots (B, H) int64, and φ_t = W_t + g_t (W_t when G = 1)
    (B, H) float32 (None without FPA)."""
    B, H, _, D = k_cache.shape
    q, k, v = qkv.view(B, 3, H, D).unbind(dim=1)  # (B, H, D) each
    if cos is not None:
        cos_t, sin_t = cos[positions][:, None], sin[positions][:, None]  # (B, 1, D)
        q, k = rope_rotate(q, cos_t, sin_t), rope_rotate(k, cos_t, sin_t)
    if append:
        slots = positions[:, None].expand(B, H)
    else:  # argmax returns the first maximal index: the first free slot
        slots = (key_pos == FREE).to(torch.uint8).argmax(dim=-1)  # (B, H)
    _put(k_cache, slots, k[:, :, None])
    _put(v_cache, slots, v[:, :, None])
    _put(key_pos, slots, positions[:, None, None].expand(B, H, 1))
    phi = None
    if gate_weight is not None:
        phi, psi = gate_map(gate_weight, gate_bias, x, walk)
        _put(level, slots, psi[:, :, None])
        _put(path_min, slots, torch.full_like(psi[:, :, None], FAR))
    return q, k, slots.long(), phi


def _put(store: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> None:
    """store (B, H, S, ...)[b, h, slots[b, h]] = values (B, H, 1, ...), in place."""
    index = slots.long().view(*slots.shape, 1, *([1] * (store.dim() - 3))).expand(*values.shape)
    store.scatter_(2, index, values.to(store.dtype))


def step_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, key_pos: torch.Tensor,
                   positions: torch.Tensor, scale: float, path_min: torch.Tensor | None = None,
                   level: torch.Tensor | None = None, phi: torch.Tensor | None = None,
                   beta_raw: torch.Tensor | None = None, threshold: float = float("-inf")) -> torch.Tensor:
    """The new query of each row over the cache: q (B, H, D) at positions (B,) int64 over k_cache, v_cache
    (B, H, S, D) whose slots hold the positions key_pos (B, H, S) int32 (FREE: empty) -> (B, H, D) in v's dtype.
    A slot is visible when it holds a key at or before the query's position.

    FPA (path_min, level, phi, beta_raw all given, or none): path_min, level (B, H, S) float32 the cached keys' m_s
    and ψ_s, phi (B, H) float32 the query's φ_t, beta_raw (H,) float32 (β = softplus(beta_raw)). In place, every key
    older than the query gets m_s = min(m_s, φ_t); the bias β·min(0, m_s − ψ_s) is added to the scores; a visible
    key older than the query whose bias is below `threshold` is evicted: its key_pos becomes FREE and it is not
    attended (−inf: no eviction)."""
    t = positions[:, None, None]  # (B, 1, 1)
    visible = (key_pos != FREE) & (key_pos <= t)  # (B, H, S)
    bias = None
    if path_min is not None:
        bias = step_bias(path_min, level, phi, beta_raw, key_pos < t)  # (B, H, S)
        if threshold > float("-inf"):
            evicted = visible & (key_pos < t) & (bias < threshold)  # the newest key (t itself) never
            key_pos.masked_fill_(evicted, FREE)
            visible = visible & ~evicted
        bias = bias[:, :, None]
    return cached_attention(q[:, None], k_cache, v_cache, bias, visible[:, :, None], scale)[:, 0]
