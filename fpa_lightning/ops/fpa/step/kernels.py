"""FPA's part of the decoding step's Triton kernels (ops/decode/step/kernels.py calls them, inlined): the gate map of
a new token and the path-minimum update and bias of a block of cached keys. naive.py holds their definitions."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def gate_map(GW, GB, X, WALK, b64, h, H, C, MAPS: tl.constexpr, BLOCK_C: tl.constexpr):
    """FPA's gate map for one (row, head): δ (gate row h), g (H + h) and h (2H + h) as fp32 dot products with the
    row x of C values -> the advanced walk W_t = W_{t−1} + δ, the field φ_t = W_t + g and the new key's level
    ψ_t = W_t + h (φ = ψ = W with fewer maps)."""
    offs_c = tl.arange(0, BLOCK_C)
    acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    acc_g = tl.zeros([BLOCK_C], dtype=tl.float32)
    acc_h = tl.zeros([BLOCK_C], dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        ok = c0 + offs_c < C
        x = tl.load(X + b64 * C + c0 + offs_c, mask=ok, other=0.0).to(tl.float32)
        acc += x * tl.load(GW + h * C + c0 + offs_c, mask=ok, other=0.0)
        if MAPS > 1:
            acc_g += x * tl.load(GW + (H + h) * C + c0 + offs_c, mask=ok, other=0.0)
        if MAPS > 2:
            acc_h += x * tl.load(GW + (2 * H + h) * C + c0 + offs_c, mask=ok, other=0.0)
    walk = tl.load(WALK + b64 * H + h) + (tl.sum(acc, axis=0) + tl.load(GB + h))
    phi = walk
    psi = walk
    if MAPS > 1:
        phi = walk + (tl.sum(acc_g, axis=0) + tl.load(GB + H + h))
    if MAPS > 2:
        psi = walk + (tl.sum(acc_h, axis=0) + tl.load(GB + 2 * H + h))
    return walk, phi, psi


@triton.jit
def softplus(x):
    # torch's softplus (threshold 20: linear above it)
    return tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))


@triton.jit
def step_bias(phi, m_old, level, beta, older):
    """A block of cached keys under the new query's field φ_t: the keys where `older` (before the query) get
    m = min(m_old, φ_t); returns m, where it moved (only the minima that fall are written back) and the bias
    β·min(0, m − ψ) with ψ = level."""
    moved = older & (phi < m_old)
    m = tl.where(moved, phi, m_old)
    return m, moved, beta * tl.minimum(m - level, 0.0)
