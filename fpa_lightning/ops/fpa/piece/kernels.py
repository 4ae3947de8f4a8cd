"""Triton kernel of FPA piece attention (fused.py is the public entry point; naive.py the definition).

Layout: q and the output (B, n, H, D), k, v (B, H, S, D), addressed by strides (the last one is 1); key_pos (int32),
path_min and level (float32) (B, H, S), by strides; the sparse table RMQ (B·H, LEVELS, n) float32 and kept
(B·H, n) int32, contiguous; start (B,) int64; beta (H,) float32.

    grid (cdiv(n, BLOCK_M), B·H): program (i, bh) takes the queries [i·BLOCK_M, (i+1)·BLOCK_M) of one (b, h) and
    streams the S slots in blocks of BLOCK_N: scores in fp32, the bias β·min(0, min(m_s, R(s, t)) − ψ_s) made on
    the fly, −inf where the key is free, after the query or evicted, an online softmax, and the count of kept keys.
    A block of free slots is skipped after reading its positions, and a block whose keys the tile's queries all
    drop (or do not see yet) after its bias: eviction leaves many of both.

R(s, t), the minimum of φ over the piece's queries u with s < u ≤ t, is a range-minimum query on the sparse table
RMQ[k][i] = min φ[i, i + 2^k): for the range [lo, t] of width w = t − lo + 1 and k = ⌊log₂ w⌋ it is
min(RMQ[k][lo], RMQ[k][t − 2^k + 1]), two loads per pair, exact (a minimum, no rounding). A key older than the piece
has lo = 0 for every query; a block holding only such keys (or free slots) reads R from the per-query prefix minimum
instead. The piece's own key j has lo = j + 1; at its own query (w = 0) the range is empty and R = FAR.
"""
from __future__ import annotations

import triton
import triton.language as tl

from fpa_lightning.ops import common

FAR = tl.constexpr(common.FAR)


@triton.jit
def _finite(m):
    # the exponent's reference point: the running max, or 0 while nothing was kept (m = −inf)
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def _range_min(rmq, lo, hi, n):
    """min φ[lo..hi] from the sparse table rmq (LEVELS, n) of one (b, h), where hi ≥ lo; FAR where hi < lo."""
    width = hi - lo + 1
    has = width > 0
    # ⌊log₂ w⌋ from the float's exponent bits: exact for every w < 2^24
    level = (tl.maximum(width, 1).to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127
    left = tl.load(rmq + level * n + lo, mask=has, other=FAR)
    right = tl.load(rmq + level * n + hi - (1 << level) + 1, mask=has, other=FAR)
    return tl.minimum(left, right)


@triton.jit
def _fpa_piece_kernel(
    Q, K, V, KEY_POS, PATH_MIN, LEVEL, RMQ, START, BETA, OUT, KEPT,
    s_qb, s_qn, s_qh, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_pb, s_ph, s_ps, s_mb, s_mh, s_ms, s_lb, s_lh, s_ls,
    s_ob, s_on, s_oh,
    H, n, S, LEVELS, scale, threshold,
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
):
    tile = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)  # the cache of a long context can pass 2^31 elements
    h = bh % H
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # the queries' indices t in the piece
    row_ok = offs_m < n
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * s_qb + offs_m[:, None] * s_qn + h * s_qh + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    start = tl.load(START + b).to(tl.int32)  # positions fit in int32 (a cache of 2^31 tokens does not fit anyway)
    query_pos = start + offs_m  # (BLOCK_M,)
    beta = tl.load(BETA + h)
    rmq = RMQ + bh.to(tl.int64) * LEVELS * n
    t = tl.minimum(offs_m, n - 1)
    prefix = _range_min(rmq, tl.zeros_like(t), t, n)  # min φ over the piece's queries up to t: R of older keys
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    kept = tl.zeros([BLOCK_M], tl.int32)
    for s0 in range(0, S, BLOCK_N):
        offs_n = s0 + tl.arange(0, BLOCK_N)
        ok = offs_n < S
        key_pos = tl.load(KEY_POS + b * s_pb + h * s_ph + offs_n * s_ps, mask=ok, other=-1)
        if tl.max(key_pos, axis=0) >= 0:  # a block of free slots adds nothing (eviction frees many)
            m_s = tl.load(PATH_MIN + b * s_mb + h * s_mh + offs_n * s_ms, mask=ok, other=FAR)
            psi = tl.load(LEVEL + b * s_lb + h * s_lh + offs_n * s_ls, mask=ok, other=0.0)
            j = key_pos - start  # the key's index in the piece, < 0 when older (or free)
            if tl.max(j, axis=0) >= 0:  # a key of the piece itself: ranges start after it
                moved = _range_min(rmq, tl.maximum(j + 1, 0)[None, :], t[:, None], n)
            else:
                moved = tl.broadcast_to(prefix[:, None], [BLOCK_M, BLOCK_N])
            bias = beta * tl.minimum(tl.minimum(m_s[None, :], moved) - psi[None, :], 0.0)  # (BLOCK_M, BLOCK_N)
            after = key_pos[None, :] < query_pos[:, None]
            seen = (key_pos[None, :] >= 0) & (after | (key_pos[None, :] == query_pos[:, None])) & row_ok[:, None]
            keep = seen & ~((bias < threshold) & after)  # the query's own key is never dropped
            kept_here = tl.sum(keep.to(tl.int32), axis=1)
            kept += kept_here
            if tl.max(kept_here, axis=0) > 0:  # keys all evicted (or all later) for this tile add nothing
                k = tl.load(K + b * s_kb + h * s_kh + offs_n[:, None] * s_ks + offs_d[None, :], mask=ok[:, None],
                            other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale + bias
                s = tl.where(keep, s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                ref = _finite(m_new)
                alpha = tl.exp(m_i - ref)  # 0 while m_i = −inf (acc and l_i are 0 then)
                p = tl.exp(s - ref[:, None])  # 0 where not kept
                v = tl.load(V + b * s_vb + h * s_vh + offs_n[:, None] * s_vs + offs_d[None, :], mask=ok[:, None],
                            other=0.0)
                l_i = l_i * alpha + tl.sum(p, axis=1)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
                m_i = m_new
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]  # a query keeps at least its own key
    tl.store(OUT + b * s_ob + offs_m[:, None] * s_on + h * s_oh + offs_d[None, :], out.to(OUT.dtype.element_ty),
             mask=row_ok[:, None])
    tl.store(KEPT + bh.to(tl.int64) * n + offs_m, kept, mask=row_ok)
