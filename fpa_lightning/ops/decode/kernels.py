"""Triton kernels of the fused decode attention (fused.py is the public entry point): split-K flash-decoding.

Layout: q (B, n, H, D), k, v (B, H, S, D), the output (B, n, H, D), addressed by strides (the last one is 1); bias
(B, H or 1, n, S) float32 (head stride 0 when layer-shared) and visible (B, H, n, S) as uint8, by their four strides.
A row is one (b, h, i) of the B·H·n queries, numbered ((b·H) + h)·n + i.

    partial  grid (B·H·n, SPLITS): program (row, j) takes the slots [j·CHUNK, min((j+1)·CHUNK, S)) in blocks of
             BLOCK_S, scores s = scale·q·k (+ bias) in fp32, −inf where not visible, and keeps an online softmax:
             its max m_j, its sum l_j = Σ exp(s − m_j) and the unnormalised accumulator a_j = Σ exp(s − m_j)·v,
             written to fp32 scratch M (rows, SPLITS), L (rows, SPLITS), ACC (rows, SPLITS, D).
    combine  grid (B·H·n,): out = Σ_j w_j a_j / Σ_j w_j l_j with w_j = exp(m_j − max_j m_j), over blocks of SB splits.

A split (or a block) whose slots are all masked has m = −inf, l = 0, a = 0: every exponent is taken against a finite
reference (0 while the running max is still −inf), so it adds nothing and never makes a NaN. A row without any
visible slot gives 0 (the reference's softmax gives NaN there; the decoder never asks for it: the newest key is
always visible).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _finite(m):
    # the exponent's reference point: the running max, or 0 while nothing was visible (m = −inf)
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def online_softmax_block(s, v, m_i, l_i, acc):
    """One block of slots into a split's online softmax: scores s (BLOCK_S,) fp32, −inf where masked, and their
    values v (BLOCK_S, D) -> the running max, sum and unnormalised accumulator (m_i, l_i, acc) after them. Also the
    decoding step's kernel (ops/decode/step) runs its splits through it."""
    m_new = tl.maximum(m_i, tl.max(s, axis=0))
    ref = _finite(m_new)
    alpha = tl.exp(m_i - ref)  # 0 while m_i = −inf (acc and l_i are 0 then)
    p = tl.exp(s - ref)  # 0 on masked slots
    l_i = l_i * alpha + tl.sum(p, axis=0)
    acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
    return m_new, l_i, acc


@triton.jit
def split_start(split, CHUNK, S, D: tl.constexpr):
    """A split-K program's slots [lo, hi) (split `split` of chunks of CHUNK over S slots) and its empty online
    softmax (m_i, l_i, acc). Also the decoding step's kernel (ops/decode/step) starts its splits here."""
    lo = split * CHUNK
    hi = tl.minimum(lo + CHUNK, S)
    return lo, hi, float("-inf"), 0.0, tl.zeros([D], dtype=tl.float32)


@triton.jit
def store_split(M, L, ACC, row, split, SPLITS, m_i, l_i, acc, offs_d, D: tl.constexpr):
    """A split's running max, sum and unnormalised output into the scratch the combine kernel reads (row-major over
    (rows, SPLITS)). Also the decoding step's kernel stores its splits here."""
    slot = row.to(tl.int64) * SPLITS + split
    tl.store(M + slot, m_i)
    tl.store(L + slot, l_i)
    tl.store(ACC + slot * D + offs_d, acc)


@triton.jit
def _decode_attn_partial_kernel(
    Q, K, V, BIAS, VIS, M, L, ACC,
    s_qb, s_qn, s_qh, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs,
    s_bb, s_bh, s_bn, s_bs, s_mb, s_mh, s_mn, s_ms,
    H, n, S, CHUNK, SPLITS, scale,
    D: tl.constexpr, BLOCK_S: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    i = row % n
    b = (row // n) // H
    h = (row // n) % H
    b64 = b.to(tl.int64)  # the cache of a long context can pass 2^31 elements
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b64 * s_qb + i * s_qn + h * s_qh + offs_d).to(tl.float32) * scale
    k_base = K + b64 * s_kb + h * s_kh
    v_base = V + b64 * s_vb + h * s_vh
    bias_base = BIAS + b64 * s_bb + h * s_bh + i * s_bn
    vis_base = VIS + b64 * s_mb + h * s_mh + i * s_mn
    lo, hi, m_i, l_i, acc = split_start(split, CHUNK, S, D)
    for start in range(lo, hi, BLOCK_S):
        offs_s = start + tl.arange(0, BLOCK_S)
        ok = offs_s < hi
        k = tl.load(k_base + offs_s[:, None] * s_ks + offs_d[None, :], mask=ok[:, None], other=0.0)
        s = tl.sum(k.to(tl.float32) * q[None, :], axis=1)  # (BLOCK_S,) fp32
        if HAS_BIAS:
            s += tl.load(bias_base + offs_s * s_bs, mask=ok, other=0.0)
        seen = tl.load(vis_base + offs_s * s_ms, mask=ok, other=0) != 0
        s = tl.where(seen, s, float("-inf"))
        v = tl.load(v_base + offs_s[:, None] * s_vs + offs_d[None, :], mask=ok[:, None], other=0.0)
        m_i, l_i, acc = online_softmax_block(s, v, m_i, l_i, acc)
    store_split(M, L, ACC, row, split, SPLITS, m_i, l_i, acc, offs_d, D)


@triton.jit
def _decode_attn_combine_kernel(
    M, L, ACC, O, s_ob, s_on, s_oh, H, n, SPLITS,
    D: tl.constexpr, SB: tl.constexpr,
):
    row = tl.program_id(0)
    i = row % n
    b = (row // n) // H
    h = (row // n) % H
    offs_d = tl.arange(0, D)
    first = row.to(tl.int64) * SPLITS
    m_run = float("-inf")
    l_run = 0.0
    acc = tl.zeros([D], dtype=tl.float32)
    for j0 in range(0, SPLITS, SB):
        offs_j = j0 + tl.arange(0, SB)
        ok = offs_j < SPLITS
        m = tl.load(M + first + offs_j, mask=ok, other=float("-inf"))
        l = tl.load(L + first + offs_j, mask=ok, other=0.0)
        a = tl.load(ACC + (first + offs_j)[:, None] * D + offs_d[None, :], mask=ok[:, None], other=0.0)
        m_new = tl.maximum(m_run, tl.max(m, axis=0))
        ref = _finite(m_new)
        alpha = tl.exp(m_run - ref)
        w = tl.exp(m - ref)  # 0 for a split without a visible slot
        l_run = l_run * alpha + tl.sum(w * l, axis=0)
        acc = acc * alpha + tl.sum(w[:, None] * a, axis=0)
        m_run = m_new
    out = acc / tl.where(l_run > 0.0, l_run, 1.0)  # a row without a visible slot: acc = 0, out = 0
    tl.store(O + b.to(tl.int64) * s_ob + i * s_on + h * s_oh + offs_d, out.to(O.dtype.element_ty))
