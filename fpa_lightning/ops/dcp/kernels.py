"""Triton kernels of the fused DCP attention (fused.py is the public entry point).

Layout: q, k, v, o, do, dq, dk, dv are (B, T, H, D) tensors and qi, ki (B, T, r) tensors, addressed by strides. Tiles
are BM queries × BN keys (powers of two). Per pair, with live[t', s] = [s < t' < T]:

    z[t', s]  = qi[t']·ki[s] / √r + offset                    (one tl.dot over r in the inputs' dtype, fp32 result)
    L[t', s]  = live · log(max(clamp((z + 1) / 2, 0, 1), 1e-30))
    B[t, s]   = Σ_{t' ≤ t} L[t', s]  = CF[row of I's start, s] + Σ_{t' in I, t' ≤ t} L[t', s]   (inclusive)
    logit_h   = scale · q_h[t]·k_h[s] + B[t, s]                (causal s ≤ t, same document)

CF (B, Tp / BT, Tp) fp32 is the carry table: CF[r, s] = Σ_{t' < r·BT} L[t', s], column sums over all earlier query
rows at a granularity of BT rows, written key-major by the carry kernel (as Selective's: the structure is the same,
with a score from qi, ki and the offset instead of head 0, and an inclusive in-tile sum). The in-tile part is an
exclusive prefix (a strictly triangular matmul, or a scan) plus the tile itself. L does not look at documents: for
any ids the bias of a same-document pair sums every query between them, as ``dcp_bias`` does; other documents are
only masked out of the softmax.

Backward, per head h: dS_h = P_h ∘ (dP_h − Δ_h) (natural-log units), the flash gradients of q_h, k_h, v_h, and the
gradient through the layer-shared bias: dL[t', s] = R[t', s] = Σ_{t ≥ t'} Σ_h dS_h[t, s] (inclusive), then
dz = R · g with g = ∂L/∂z = live · [1e-30 ≤ x ≤ 1] · 1 / (2x), x = (z + 1) / 2, torch autograd's convention for
``((z + 1) / 2).clamp(0, 1).clamp_min(1e-30).log()`` (at x = 1 the gradient passes, below the floor it is 0).
dqi = dz·ki / √r, dki = dzᵀ·qi / √r, doffset = Σ dz. R is linear in the heads' dS, so each head adds its own
share; the part over later query tiles is a per-key running sum in the key-major kernel (walking query tiles
downwards) and, summed over heads, the table RC[r, s] = Σ_h Σ_{t ≥ (r+1)·BT} dS_h[t, s] for the query-major kernel.

Kernels, in launch order: carry (CF) -> forward; backward: carry again (at the backward's tile sizes) -> key-major
(dk, dv, dki share, offset partials, RC; its query tile is BT) -> query-major (dq, dqi share). The backward kernels
loop over a group of heads per program; dqi, dki and the offset gradient are fp32 partials per group (and per key
tile for the offset), summed on the host: nothing uses atomics, every result is deterministic.
"""
from __future__ import annotations

import triton
import triton.language as tl

from fpa_lightning.ops.selective.kernels import (
    LOG2E,
    _attend_mask,
    _attend_mask_t,
    _carry_mask,
    _flash_kv_step,
    _flash_q_step,
    _group_program,
    _head_program,
    _key_head,
    _key_values,
    _key_walk,
    _masked_softmax_step,
    _prefix_cols,
    _prefix_rows,
    _query_head,
    _query_program,
    _query_rows,
    _query_walk,
    _rows,
    _softmax_start,
    _store_carry_in,
    _suffix_cols,
    _suffix_rows,
    _triangles,
    _walk_tile,
)


@triton.jit
def _keep_terms(a, b, live, rs, off, PREC: tl.constexpr):
    # (L, g) on a tile whose rows are a's and columns b's: z = a·bᵀ/√r + offset, L = log keep where live, g = ∂L/∂z.
    # The same helper serves query-major tiles (a = qi, b = ki) and key-major ones (a = ki, b = qi).
    z = tl.dot(a, tl.trans(b), input_precision=PREC) * rs + off
    x = (z + 1.0) * 0.5
    keep = tl.minimum(tl.maximum(x, 0.0), 1.0)
    L = tl.where(live, tl.log(tl.maximum(keep, 1e-30)), 0.0)  # the reference's floor of a hard zero (naive.py)
    g = tl.where(live & (x >= 1e-30) & (x <= 1.0), 0.5 / tl.maximum(x, 1e-30), 0.0)
    return L, g


@triton.jit
def _live(offs_m, offs_n, T):
    # query-major [t', s]: pairs whose L enters the bias (s < t', and t' a real query: padded rows give z = offset)
    return (offs_n[None, :] < offs_m[:, None]) & (offs_m < T)[:, None]


@triton.jit
def _bias(qi, ki, live, tri, cf_row, rs, off, PREC: tl.constexpr, BPREC: tl.constexpr, DOT: tl.constexpr):
    # query-major bias tile: carry row + inclusive in-tile prefix of L; and g for the backward
    L, g = _keep_terms(qi, ki, live, rs, off, PREC)
    return _prefix_rows(L, tri, DOT, BPREC) + L + cf_row[None, :], g


@triton.jit
def _own_tile_r(X, BX: tl.constexpr, D: tl.constexpr, R: tl.constexpr, T):
    # Selective's _own_tile with the interaction width's offsets: tile X's positions, the head dim's and r's offsets,
    # and which positions are real (< T)
    offs = X * BX + tl.arange(0, BX)
    offs_d = tl.arange(0, D)
    offs_r = tl.arange(0, R)
    return offs, offs_d, offs_r, offs < T


@triton.jit
def _bias_key_tile(K, V, KI, CF, qi, b, h, I, offs_m, offs_n, col_ok, offs_d, offs_r, tri, s_kb, s_kt, s_kh, s_vb,
                   s_vt, s_vh, s_jb, s_jt, T, nT, Tp, rs, off, RATIO: tl.constexpr, PREC: tl.constexpr,
                   BPREC: tl.constexpr, DOT: tl.constexpr):
    # a key tile of the query-major kernels (query tile I, its table row I·RATIO): head h's k and v, ki, and the bias
    # on the tile with g (_bias)
    k, v = _key_values(K, V, b, h, offs_n, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, offs_d, col_ok)
    ki = _rows(KI, b, 0, offs_n, s_jb, s_jt, 0, offs_r, col_ok)
    bias, g = _bias(qi, ki, _live(offs_m, offs_n, T), tri, tl.load(CF + (b * nT + I * RATIO) * Tp + offs_n), rs, off,
                    PREC, BPREC, DOT)
    return k, v, ki, bias, g


# ---------------------------------------------------------------------------------------------
# carry: CF[b, r, s] = Σ_{t' < r·BT} L[t', s], for the rows r that can be read
# ---------------------------------------------------------------------------------------------
@triton.jit
def _dcp_carry_kernel(
    QI, KI, OFF, CF, s_ib, s_it, s_jb, s_jt, T, Tp, nT, rs,
    BT: tl.constexpr, BN: tl.constexpr, QM: tl.constexpr, R: tl.constexpr, PREC: tl.constexpr,
):
    # key-major: one key tile J per program walks the query rows downwards in tiles of BT with a running column sum
    # (sums of whole tiles in a fixed order: deterministic), from the first row that a reader's query tile (QM rows,
    # a multiple of BT) holding one of J's keys starts at; earlier rows are never read.
    J = tl.program_id(0)
    b = tl.program_id(1)
    offs_n = J * BN + tl.arange(0, BN)
    offs_r = tl.arange(0, R)
    ki = _rows(KI, b, 0, offs_n, s_jb, s_jt, 0, offs_r, offs_n < T)  # (BN, r)
    off = tl.load(OFF)
    run = tl.zeros([BN], tl.float32)
    for row in range((J * BN) // QM * (QM // BT), (T + BT - 1) // BT):
        tl.store(CF + (b * nT + row) * Tp + offs_n, run)
        offs_m = row * BT + tl.arange(0, BT)
        qi = _rows(QI, b, 0, offs_m, s_ib, s_it, 0, offs_r, offs_m < T)  # (BT, r)
        L, g = _keep_terms(qi, ki, _live(offs_m, offs_n, T), rs, off, PREC)
        run += tl.sum(L, axis=0)


# ---------------------------------------------------------------------------------------------
# forward
# ---------------------------------------------------------------------------------------------
@triton.jit
def _dcp_fwd_kernel(
    Q, K, V, QI, KI, OFF, O, O32, LSE, CF, SEGP, JLO,
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_ot, s_oh, s_ib, s_it, s_jb, s_jt,
    T, H, Tp, nT, nJ, scale, rs,
    BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, R: tl.constexpr, PREC: tl.constexpr,
    BPREC: tl.constexpr, DOT: tl.constexpr, SEG: tl.constexpr, STORE32: tl.constexpr,
):
    # One query tile I (BM rows, the carry table's granularity) of one head per program, key tiles from the diagonal
    # down. STORE32: the fp32 output as well, for the backward's Δ (see fused.py: Δ from a rounded output would put
    # a coherent error into every row's dS, which the offset gradient sums without cancellation).
    nI, I = _query_program()
    bh, b, h, sl2 = _head_program(H, scale)
    offs_m, offs_d, offs_r, row_ok = _own_tile_r(I, BM, D, R, T)
    q = _rows(Q, b, h, offs_m, s_qb, s_qt, s_qh, offs_d, row_ok)  # (BM, D)
    qi = _rows(QI, b, 0, offs_m, s_ib, s_it, 0, offs_r, row_ok)  # (BM, r)
    off = tl.load(OFF)
    tri, tri_t = _triangles(BM)
    seg_i, j_lo, j_hi = _query_walk(SEGP, JLO, b, I, nI, nJ, Tp, offs_m, BM, BN, SEG)
    m_i, l_i, acc = _softmax_start(BM, D)
    for jj in range(0, j_hi + 1 - j_lo):
        J, offs_n, col_ok = _walk_tile(j_hi, jj, BN, T)
        # RATIO 1: the forward's table has a row per query tile
        k, v, ki, bias, g = _bias_key_tile(K, V, KI, CF, qi, b, h, I, offs_m, offs_n, col_ok, offs_d, offs_r, tri,
                                           s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_jb, s_jt, T, nT, Tp, rs, off, 1,
                                           PREC, BPREC, DOT)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * sl2 + bias * LOG2E
        # STORE32: Δ's output, with P to ~16 bits (_online_softmax's SPLIT_P)
        m_i, l_i, acc = _masked_softmax_step(s, m_i, l_i, acc, v, SEGP, b, Tp, offs_m, offs_n, seg_i, PREC, STORE32,
                                             SEG)
    acc = acc / l_i[:, None]
    o_ptr = b * s_ob + h * s_oh + offs_m[:, None] * s_ot + offs_d[None, :]
    tl.store(O + o_ptr, acc.to(O.dtype.element_ty), mask=row_ok[:, None])
    if STORE32:
        tl.store(O32 + ((b * Tp + offs_m[:, None]) * H + h) * D + offs_d[None, :], acc)  # (B, Tp, H, D)
    tl.store(LSE + bh * Tp + offs_m, m_i + tl.log2(l_i))  # log2 units; padded rows are masked in the backward


# ---------------------------------------------------------------------------------------------
# backward, key-major: dk, dv per head; dki share, offset partials, RC per head group
# ---------------------------------------------------------------------------------------------
@triton.jit
def _dcp_bwd_kv_kernel(
    Q, K, V, QI, KI, OFF, DO, DK, DV, LSE, DELTA, CF, RCP, DKIP, OFFP, SEGP, IHI,
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_ot, s_oh, s_ib, s_it, s_jb, s_jt,
    s_dkb, s_dkt, s_dkh, s_dvb, s_dvt, s_dvh,
    T, H, Tp, nT, HPG, scale, rs,
    BT: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, R: tl.constexpr, PREC: tl.constexpr,
    BPREC: tl.constexpr, DOT: tl.constexpr, SEG: tl.constexpr,
):
    # One key tile J (BN keys) and one group of HPG heads per program; query tiles of BT rows (the tables' rows),
    # walked downwards per head so that rc[s] = Σ_{t ≥ end of tile I} dS_h[t, s] is a running sum. Tiles are
    # transposed, [s (keys of J), t (queries)], so P, dS and dz feed dv, dk and dki without a transpose.
    # RCP[b, g, I, s] collects rc as it enters tile I, summed over the group's heads; OFFP[b, g, J] is the group's
    # Σ dz over J's keys.
    nJ = tl.num_programs(0)
    J = tl.program_id(0)
    G, b, g_id, sl2 = _group_program(H, HPG, scale)
    offs_n, offs_d, offs_r, col_ok = _own_tile_r(J, BN, D, R, T)
    ki = _rows(KI, b, 0, offs_n, s_jb, s_jt, 0, offs_r, col_ok)  # (BN, r)
    off = tl.load(OFF)
    tri, tri_t = _triangles(BT)
    seg_j, i_lo, i_hi = _key_walk(SEGP, IHI, b, J, nJ, T, Tp, offs_n, BT, BN, SEG)  # R = 0 past i_hi
    dki = tl.zeros([BN, R], tl.float32)
    doff = tl.zeros([BN], tl.float32)
    for hh in range(0, HPG):
        h, k, v, dk, dv, rc = _key_head(K, V, b, g_id, HPG, hh, offs_n, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, offs_d,
                                        col_ok)
        for ii in range(0, i_hi + 1 - i_lo):
            I, offs_m, row_ok = _walk_tile(i_hi, ii, BT, T)
            q, qi, do, lse, delta = _query_rows(Q, QI, DO, LSE, DELTA, b, h, H, Tp, offs_m, row_ok, s_qb, s_qt, s_qh,
                                                offs_d, s_ib, s_it, 0, offs_r, s_ob, s_ot, s_oh)
            live_t = (offs_n[:, None] < offs_m[None, :]) & row_ok[None, :]
            L_t, g_t = _keep_terms(ki, qi, live_t, rs, off, PREC)
            # bias transposed: CF[I, s] + Σ_{t' in I, t' ≤ t} L[t', s]
            bias_t = _prefix_cols(L_t, tri_t, DOT, BPREC) + L_t + tl.load(CF + (b * nT + I) * Tp + offs_n)[:, None]
            s_t = tl.dot(k, tl.trans(q), input_precision=PREC) * sl2 + bias_t * LOG2E
            attend = _attend_mask_t(offs_m, offs_n, row_ok, seg_j, SEGP, b, Tp, SEG)
            ds_t, dk, dv = _flash_kv_step(s_t, attend, lse, delta, q, do, v, dk, dv, PREC)
            _store_carry_in(RCP, rc, b, G, g_id, nT, I, Tp, offs_n, hh)
            # this head's share of R (inclusive: t ≥ t'), then of dz
            dz_t = g_t * (_suffix_cols(ds_t, tri, DOT, BPREC) + ds_t + rc[:, None])
            rc += tl.sum(ds_t, axis=1)
            dki += tl.dot(dz_t.to(qi.dtype), qi, input_precision=PREC)
            doff += tl.sum(dz_t, axis=1)
        tl.store(DK + b * s_dkb + h * s_dkh + offs_n[:, None] * s_dkt + offs_d[None, :],
                 (dk * scale).to(DK.dtype.element_ty), mask=col_ok[:, None])
        tl.store(DV + b * s_dvb + h * s_dvh + offs_n[:, None] * s_dvt + offs_d[None, :],
                 dv.to(DV.dtype.element_ty), mask=col_ok[:, None])
        tl.debug_barrier()  # RCP's stores by this head are read back by the next one
    tl.store(DKIP + ((b * G + g_id) * Tp + offs_n[:, None]) * R + offs_r[None, :], dki * rs)
    tl.store(OFFP + (b * G + g_id) * nJ + J, tl.sum(doff, axis=0))


# ---------------------------------------------------------------------------------------------
# backward, query-major: dq per head, dqi share per head group
# ---------------------------------------------------------------------------------------------
@triton.jit
def _dcp_bwd_q_kernel(
    Q, K, V, QI, KI, OFF, DO, DQ, LSE, DELTA, CF, RC, DQIP, SEGP, JLO, IHI,
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_ot, s_oh, s_ib, s_it, s_jb, s_jt,
    s_dqb, s_dqt, s_dqh,
    T, H, Tp, nT, nJ, HPG, scale, rs,
    BM: tl.constexpr, BN: tl.constexpr, RATIO: tl.constexpr, D: tl.constexpr, R: tl.constexpr,
    PREC: tl.constexpr, BPREC: tl.constexpr, DOT: tl.constexpr, SEG: tl.constexpr,
):
    # One query tile I (BM = RATIO table rows) and one group of HPG heads per program. Each head adds its in-tile
    # inclusive suffix of dS_h to R; the part over later query tiles, RC at the tile's last table row (every
    # head's, summed over groups), is added once, with head 0.
    nI, I = _query_program()
    G, b, g_id, sl2 = _group_program(H, HPG, scale)
    offs_m, offs_d, offs_r, row_ok = _own_tile_r(I, BM, D, R, T)
    qi = _rows(QI, b, 0, offs_m, s_ib, s_it, 0, offs_r, row_ok)  # (BM, r)
    off = tl.load(OFF)
    tri, tri_t = _triangles(BM)
    last_row = I * RATIO + RATIO - 1  # the table row that ends with tile I
    seg_i, j_lo, j_hi = _query_walk(SEGP, JLO, b, I, nI, nJ, Tp, offs_m, BM, BN, SEG)
    dqi = tl.zeros([BM, R], tl.float32)
    for hh in range(0, HPG):
        h, q, do, lse, delta, dq = _query_head(Q, DO, LSE, DELTA, b, g_id, HPG, hh, H, Tp, offs_m, s_qb, s_qt, s_qh,
                                               s_ob, s_ot, s_oh, offs_d, row_ok)
        for jj in range(0, j_hi + 1 - j_lo):
            J, offs_n, col_ok = _walk_tile(j_hi, jj, BN, T)
            k, v, ki, bias, g = _bias_key_tile(K, V, KI, CF, qi, b, h, I, offs_m, offs_n, col_ok, offs_d, offs_r, tri,
                                               s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_jb, s_jt, T, nT, Tp, rs, off,
                                               RATIO, PREC, BPREC, DOT)
            seg_j, carry_ok = _carry_mask(SEGP, IHI, b, h, I, J, nJ, T, Tp, offs_n, last_row, BM, SEG)
            s = tl.dot(q, tl.trans(k), input_precision=PREC) * sl2 + bias * LOG2E
            attend = _attend_mask(offs_m, offs_n, seg_i, seg_j, SEG) & row_ok[:, None]
            ds, dq = _flash_q_step(s, attend, lse, delta, do, k, v, dq, PREC)
            r_in = _suffix_rows(ds, tri_t, DOT, BPREC) + ds
            r_in += tl.load(RC + (b * nT + last_row) * Tp + offs_n, mask=carry_ok, other=0.0)[None, :]
            dqi += tl.dot((g * r_in).to(ki.dtype), ki, input_precision=PREC)
        tl.store(DQ + b * s_dqb + h * s_dqh + offs_m[:, None] * s_dqt + offs_d[None, :],
                 (dq * scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])
    tl.store(DQIP + ((b * G + g_id) * Tp + offs_m[:, None]) * R + offs_r[None, :], dqi * rs)
