"""Triton kernels of the fused Selective Attention (fused.py is the public entry point).

Layout: q, k, v, o, do, dq, dk, dv are (B, T, H, D) tensors addressed by strides; head 0's q and k (q0, k0) are
read from the same tensors. Tiles are BM queries × BN keys; every mask is positional, so the two sizes are free
(powers of two). Per pair, with sel[t', s] = [s < t'] · [key s selectable] (not key 0, not a document's first token):

    S[t', s] = sel · ReLU(scale · q0[t']·k0[s])          (head 0 selects, layer-shared)
    F[t, s]  = Σ_{t' < t} S[t', s]                       = CF[row of I's start, s] + Σ_{t' in I, t' < t} S[t', s]
    logit_h  = scale · q_h[t]·k_h[s] − F[t, s]           (causal s ≤ t, same document)

CF (B, Tp / BT, Tp) fp32 is the carry table: CF[r, s] = Σ_{t' < r·BT} S[t', s], column sums over all earlier query
rows at a granularity of BT rows (a kernel's query tile BM is a multiple of BT), written key-major by the carry
kernel. The in-tile part is an exclusive prefix over the tile's queries of the recomputed S tile (a strictly
triangular matmul, or a scan). No (T, T) tensor exists; a program holds one tile of S and F at a time.

Backward, per head h: dS_h = P_h ∘ (dP_h − Δ_h), the flash gradients of q_h, k_h, v_h, and the gradient through F
(layer-shared, so the heads' dS add up): dS_sel[t', s] = −R[t', s], R[t', s] = Σ_{t > t'} Σ_h dS_h[t, s], then
through the ReLU and the masks, dRaw = sel · [raw > 0] · R, into dq0 −= scale · dRaw·k0 and dk0 −= scale · dRawᵀ·q0.
R is linear in the heads' dS, so every head contributes its own share: its in-tile suffix of dS_h. The part over
later query tiles is a per-key running sum in the key-major kernel, which walks the query tiles downwards; it is
also stored per (table row, key), summed over heads, as the table RC[r, s] = Σ_h Σ_{t ≥ (r+1)·BT} dS_h[t, s] for
the query-major kernel.

Kernels, in launch order: carry (CF) -> forward; backward: carry again (at the backward's tile sizes) -> key-major
(dk, dv, the dk0 share, RC; its query tile is BT) -> query-major (dq, the dq0 share). The backward kernels loop over
a group of heads per program: head 0's gradient slot (its own flash gradient plus every head's selection share) is
an fp32 accumulator per group, summed over groups on the host, so nothing needs atomics and every result is
deterministic.
"""
from __future__ import annotations

import triton
import triton.language as tl

from fpa_lightning.ops import common

LOG2E = tl.constexpr(common.LOG2E)


@triton.jit
def _split_tf32(x):
    # x = hi + lo exactly, hi exact in tf32 (x rounded to 10 mantissa bits: +half an ulp, low 13 bits cleared; the
    # int32 add is the unsigned one, so it rounds the magnitude of either sign) and |lo| ≤ 2^-11 |x|
    hi = ((x.to(tl.int32, bitcast=True) + 0x1000) & -8192).to(tl.float32, bitcast=True)
    return hi, x - hi


@triton.jit
def _mask_dot(a, b, A_IS_MASK: tl.constexpr, PREC: tl.constexpr):
    # a @ b where one operand is a 0/1 mask (a when A_IS_MASK). PREC "tf32x2": the mask is exact in tf32, so only
    # the other operand is split and two tf32 products give tf32x3's result (its third product, mask_lo · x_hi,
    # is zero), with one product and the mask's split fewer
    if PREC == "tf32x2":
        if A_IS_MASK:
            hi, lo = _split_tf32(b)
            return tl.dot(a, lo, acc=tl.dot(a, hi, input_precision="tf32"), input_precision="tf32")
        else:
            hi, lo = _split_tf32(a)
            return tl.dot(lo, b, acc=tl.dot(hi, b, input_precision="tf32"), input_precision="tf32")
    else:
        return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _prefix_rows(x, tri, DOT: tl.constexpr, PREC: tl.constexpr):
    # exclusive prefix down the rows: out[t, s] = Σ_{t' < t} x[t', s]; tri[t, t'] = [t' < t]
    if DOT:
        return _mask_dot(tri, x, True, PREC)
    else:
        return tl.cumsum(x, axis=0) - x


@triton.jit
def _suffix_rows(x, tri_t, DOT: tl.constexpr, PREC: tl.constexpr):
    # exclusive suffix down the rows: out[t', s] = Σ_{t > t'} x[t, s]; tri_t[t', t] = [t > t']
    if DOT:
        return _mask_dot(tri_t, x, True, PREC)
    else:
        return tl.cumsum(x, axis=0, reverse=True) - x


@triton.jit
def _prefix_cols(x, tri_t, DOT: tl.constexpr, PREC: tl.constexpr):
    # exclusive prefix along the columns (a transposed tile [key, query]): out[s, t] = Σ_{t' < t} x[s, t']
    if DOT:
        return _mask_dot(x, tri_t, False, PREC)
    else:
        return tl.cumsum(x, axis=1) - x


@triton.jit
def _suffix_cols(x, tri, DOT: tl.constexpr, PREC: tl.constexpr):
    # exclusive suffix along the columns: out[s, t'] = Σ_{t > t'} x[s, t]
    if DOT:
        return _mask_dot(x, tri, False, PREC)
    else:
        return tl.cumsum(x, axis=1, reverse=True) - x


@triton.jit
def _selectable_keys(KEEP, b, Tp, offs_n, SEG: tl.constexpr):
    # keys that can be selected: not key 0 (BOS); with documents, no document's first token (host-computed).
    # Padded keys need no mask: their k0 is 0, so ReLU leaves 0 and the ReLU gradient is 0.
    if SEG:
        return tl.load(KEEP + b * Tp + offs_n) != 0
    else:
        return offs_n > 0


@triton.jit
def _selection(q0, k0, offs_m, offs_n, keysel, scale, PREC: tl.constexpr):
    # (S tile, live mask): S[t', s] = ReLU(scale q0·k0) where selectable, live = where S's gradient flows
    raw = tl.dot(q0, tl.trans(k0), input_precision=PREC) * scale
    live = (offs_n[None, :] < offs_m[:, None]) & keysel[None, :] & (raw > 0.0)
    return tl.where(live, raw, 0.0), live


@triton.jit
def _field(q0, k0, offs_m, offs_n, keysel, tri, CF, b, row, nT, Tp, scale, PREC: tl.constexpr, DOT: tl.constexpr):
    # F on the tile (queries offs_m, keys offs_n): the carry table's row at the tile's first query (all earlier
    # queries) plus the in-tile prefix
    S, live = _selection(q0, k0, offs_m, offs_n, keysel, scale, PREC)
    F = _prefix_rows(S, tri, DOT, PREC) + tl.load(CF + (b * nT + row) * Tp + offs_n)[None, :]
    return F, live


@triton.jit
def _rows(PTR, b, h, offs, s_b, s_t, s_h, offs_d, ok):
    # a (rows, D) tile of a (B, T, H, D) tensor, 0 past T
    return tl.load(PTR + b * s_b + h * s_h + offs[:, None] * s_t + offs_d[None, :], mask=ok[:, None], other=0.0)


@triton.jit
def _attend_mask(offs_m, offs_n, seg_i, seg_j, SEG: tl.constexpr):
    # causal (diagonal included) and same document
    m = offs_n[None, :] <= offs_m[:, None]
    if SEG:
        m = m & (seg_i[:, None] == seg_j[None, :])
    return m


@triton.jit
def _triangles(BM: tl.constexpr):
    # tri[t, t'] = [t' < t] and its transpose, as fp32 0/1 matrices over a tile's BM queries
    r = tl.arange(0, BM)
    tri = tl.where(r[:, None] > r[None, :], 1.0, 0.0)
    tri_t = tl.where(r[:, None] < r[None, :], 1.0, 0.0)
    return tri, tri_t


# ---------------------------------------------------------------------------------------------
# the kernels' shared steps (the DCP kernels use them as well): program ids, tiles and their walks, the flash parts
# ---------------------------------------------------------------------------------------------
@triton.jit
def _query_program():
    # a query-major kernel's query tile I of nI: the last tiles (the longest rows) first, for a shorter tail
    nI = tl.num_programs(0)
    return nI, nI - 1 - tl.program_id(0)


@triton.jit
def _head_program(H, scale):
    # the forward's program axis 1 (b·H + h), its batch row b and head h; and the logits' scale in log2 units
    bh = tl.program_id(1)
    return bh, bh // H, bh % H, scale * LOG2E


@triton.jit
def _group_program(H, HPG, scale):
    # the backward's program axis 1: the number of head groups G = H / HPG, the batch row b and the head group g; and
    # the logits' scale in log2 units
    bg = tl.program_id(1)
    G = H // HPG
    return G, bg // G, bg % G, scale * LOG2E


@triton.jit
def _own_tile(X, BX: tl.constexpr, D: tl.constexpr, T):
    # a program's own tile X: the offsets of its BX positions and of the head dim, and which positions are real (< T)
    offs = X * BX + tl.arange(0, BX)
    offs_d = tl.arange(0, D)
    return offs, offs_d, offs < T


@triton.jit
def _walk_tile(X_hi, i, BX: tl.constexpr, T):
    # step i of a walk down the tiles of BX positions from tile X_hi: the tile X, its offsets, which are real (< T)
    X = X_hi - i
    offs = X * BX + tl.arange(0, BX)
    return X, offs, offs < T


@triton.jit
def _query_walk(SEGP, JLO, b, I, nI, nJ, Tp, offs_m, BM: tl.constexpr, BN: tl.constexpr, SEG: tl.constexpr):
    # query tile I's document ids and its walk over the key tiles, from the diagonal's (j_hi) down to j_lo: 0, or with
    # documents the lowest key tile that can share one with tile I (JLO, host-computed; for the dq kernels with tile
    # I or any later one, as below it dS and R are 0)
    seg_i = offs_m
    j_lo = 0
    if SEG:
        seg_i = tl.load(SEGP + b * Tp + offs_m)
        j_lo = tl.load(JLO + b * nI + I)
    j_hi = tl.minimum((I * BM + BM - 1) // BN, nJ - 1)
    return seg_i, j_lo, j_hi


@triton.jit
def _key_walk(SEGP, IHI, b, J, nJ, T, Tp, offs_n, BT: tl.constexpr, BN: tl.constexpr, SEG: tl.constexpr):
    # key tile J's document ids and its walk over the query tiles of BT rows, from i_hi down to the tile of J's first
    # key (i_lo): i_hi the last tile, or with documents the last that can share one with tile J (IHI, host-computed)
    seg_j = offs_n
    i_lo = (J * BN) // BT
    i_hi = (T + BT - 1) // BT - 1
    if SEG:
        seg_j = tl.load(SEGP + b * Tp + offs_n)
        i_hi = tl.load(IHI + b * nJ + J)
    return seg_j, i_lo, i_hi


@triton.jit
def _key_values(K, V, b, h, offs_n, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, offs_d, col_ok):
    # head h's k and v on a key tile, (BN, D) each, 0 past T
    k = _rows(K, b, h, offs_n, s_kb, s_kt, s_kh, offs_d, col_ok)
    v = _rows(V, b, h, offs_n, s_vb, s_vt, s_vh, offs_d, col_ok)
    return k, v


@triton.jit
def _grad_rows(DO, LSE, DELTA, b, h, H, Tp, offs_m, s_ob, s_ot, s_oh, offs_d, row_ok):
    # head h's dO (BM, D), log-sum-exp and Δ (BM) on a query tile
    do = _rows(DO, b, h, offs_m, s_ob, s_ot, s_oh, offs_d, row_ok)
    lse = tl.load(LSE + (b * H + h) * Tp + offs_m, mask=row_ok, other=0.0)  # padded rows: never written
    delta = tl.load(DELTA + (b * H + h) * Tp + offs_m)
    return do, lse, delta


@triton.jit
def _softmax_start(BM: tl.constexpr, D: tl.constexpr):
    # the forward's online softmax before the first key tile: row maxima -inf, sums 0, output 0 (BM, D)
    return tl.full([BM], -float("inf"), tl.float32), tl.zeros([BM], tl.float32), tl.zeros([BM, D], tl.float32)


@triton.jit
def _masked_softmax_step(s, m_i, l_i, acc, v, SEGP, b, Tp, offs_m, offs_n, seg_i, PREC: tl.constexpr,
                         SPLIT_P: tl.constexpr, SEG: tl.constexpr):
    # one key tile of the forward: the logits s (log2 units) masked (causal, same document), then _online_softmax
    seg_j = offs_n
    if SEG:
        seg_j = tl.load(SEGP + b * Tp + offs_n)
    s = tl.where(_attend_mask(offs_m, offs_n, seg_i, seg_j, SEG), s, -float("inf"))
    return _online_softmax(s, m_i, l_i, acc, v, PREC, SPLIT_P)


@triton.jit
def _key_head(K, V, b, g, HPG, hh, offs_n, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, offs_d, col_ok):
    # head hh of group g in a key-major backward program: the head h, its k and v on the key tile, and its zeroed
    # fp32 dk, dv (BN, D) and running carry rc (BN)
    h = g * HPG + hh
    k, v = _key_values(K, V, b, h, offs_n, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, offs_d, col_ok)
    return h, k, v, tl.zeros(k.shape, tl.float32), tl.zeros(v.shape, tl.float32), tl.zeros(offs_n.shape, tl.float32)


@triton.jit
def _query_rows(Q, X0, DO, LSE, DELTA, b, h, H, Tp, offs_m, row_ok, s_qb, s_qt, s_qh, offs_d, s_xb, s_xt, s_xh,
                offs_x, s_ob, s_ot, s_oh):
    # a query tile of the key-major backward: head h's q, the layer-shared rows x0 (Selective: head 0's q; DCP: qi),
    # and head h's dO, log-sum-exp and Δ
    q = _rows(Q, b, h, offs_m, s_qb, s_qt, s_qh, offs_d, row_ok)
    x0 = _rows(X0, b, 0, offs_m, s_xb, s_xt, s_xh, offs_x, row_ok)
    do, lse, delta = _grad_rows(DO, LSE, DELTA, b, h, H, Tp, offs_m, s_ob, s_ot, s_oh, offs_d, row_ok)
    return q, x0, do, lse, delta


@triton.jit
def _attend_mask_t(offs_m, offs_n, row_ok, seg_j, SEGP, b, Tp, SEG: tl.constexpr):
    # _attend_mask on a transposed tile [key, query], real queries only
    attend = (offs_n[:, None] <= offs_m[None, :]) & row_ok[None, :]
    if SEG:
        attend = attend & (seg_j[:, None] == tl.load(SEGP + b * Tp + offs_m)[None, :])
    return attend


@triton.jit
def _store_carry_in(RCP, rc, b, G, g, nT, I, Tp, offs_n, hh):
    # RCP[b, g, I, s] = rc[s] (as it enters query tile I) summed over the group's heads: a read-modify-write by this
    # program only; the group's first head (hh = 0) writes
    rc_ptr = RCP + ((b * G + g) * nT + I) * Tp + offs_n
    rc_prev = tl.load(rc_ptr, mask=offs_n * 0 + hh > 0, other=0.0)
    tl.store(rc_ptr, rc_prev + rc)


@triton.jit
def _query_head(Q, DO, LSE, DELTA, b, g, HPG, hh, H, Tp, offs_m, s_qb, s_qt, s_qh, s_ob, s_ot, s_oh, offs_d, row_ok):
    # head hh of group g in a query-major backward program: the head h, its q, dO, log-sum-exp and Δ on the query
    # tile, and its zeroed fp32 dq (BM, D)
    h = g * HPG + hh
    q = _rows(Q, b, h, offs_m, s_qb, s_qt, s_qh, offs_d, row_ok)
    do, lse, delta = _grad_rows(DO, LSE, DELTA, b, h, H, Tp, offs_m, s_ob, s_ot, s_oh, offs_d, row_ok)
    return h, q, do, lse, delta, tl.zeros(q.shape, tl.float32)


@triton.jit
def _carry_mask(SEGP, IHI, b, h, I, J, nJ, T, Tp, offs_n, last_row, BM: tl.constexpr, SEG: tl.constexpr):
    # key tile J's document ids, and where the query-major kernel reads RC at query tile I's last table row: with head
    # 0 only (RC holds every head's share), where later queries exist, and with documents up to the key tile's last
    # sharing row (RC is written, and non-zero, up to there)
    seg_j = offs_n
    carry_ok = (offs_n * 0 + h == 0) & (offs_n * 0 + (I + 1) * BM < T)
    if SEG:
        seg_j = tl.load(SEGP + b * Tp + offs_n)
        carry_ok = carry_ok & (offs_n * 0 + last_row <= tl.load(IHI + b * nJ + J))
    return seg_j, carry_ok


@triton.jit
def _flash_q_step(s, attend, lse, delta, do, k, v, dq, PREC: tl.constexpr):
    # one key tile of a query-major flash backward: P, dS = P (dP - Δ) and the dq accumulation (without its scale)
    p = tl.where(attend, tl.exp2(s - lse[:, None]), 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=PREC)
    ds = p * (dp - delta[:, None])
    dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
    return ds, dq


@triton.jit
def _selection_key_tile(K, V, KEEP, CF, q0, b, h, I, offs_m, offs_n, col_ok, offs_d, tri, s_kb, s_kt, s_kh, s_vb,
                        s_vt, s_vh, nT, Tp, scale, RATIO: tl.constexpr, PREC: tl.constexpr, DOT: tl.constexpr,
                        SEG: tl.constexpr):
    # a key tile of the query-major kernels (query tile I, its table row I·RATIO): head 0's k0, head h's k and v, and
    # F on the tile with its live mask (_field)
    k0 = _rows(K, b, 0, offs_n, s_kb, s_kt, s_kh, offs_d, col_ok)
    k, v = _key_values(K, V, b, h, offs_n, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, offs_d, col_ok)
    keysel = _selectable_keys(KEEP, b, Tp, offs_n, SEG)
    F, live = _field(q0, k0, offs_m, offs_n, keysel, tri, CF, b, I * RATIO, nT, Tp, scale, PREC, DOT)
    return k0, k, v, F, live


@triton.jit
def _online_softmax(s, m_i, l_i, acc, v, PREC: tl.constexpr, SPLIT_P: tl.constexpr):
    # one key tile of the forward's online softmax (log2 units): the running row max m_i, sum l_i and output acc.
    # SPLIT_P: P·V with P as the sum of two terms in v's dtype (about 16 bits of P instead of 8 for bf16; one more
    # tensor-core dot), for an output that agrees with the fp32 P of the backward (the DCP kernel's Δ needs it)
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_use = tl.where(m_new == -float("inf"), 0.0, m_new)  # a row with no key yet (its keys come later)
    p = tl.exp2(s - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    p_hi = p.to(v.dtype)
    acc = acc * alpha[:, None] + tl.dot(p_hi, v, input_precision=PREC)
    if SPLIT_P:
        acc += tl.dot((p - p_hi.to(tl.float32)).to(v.dtype), v, input_precision=PREC)
    return m_new, l_i, acc


@triton.jit
def _flash_kv_step(s_t, attend, lse, delta, q, do, v, dk, dv, PREC: tl.constexpr):
    # one query tile of a key-major flash backward on transposed tiles [key, query]: P, dS = P (dP - Δ) and the
    # dv, dk accumulations (dk without its scale)
    p_t = tl.where(attend, tl.exp2(s_t - lse[None, :]), 0.0)
    dv += tl.dot(p_t.to(do.dtype), do, input_precision=PREC)
    dp_t = tl.dot(v, tl.trans(do), input_precision=PREC)
    ds_t = p_t * (dp_t - delta[None, :])
    dk += tl.dot(ds_t.to(q.dtype), q, input_precision=PREC)
    return ds_t, dk, dv


# ---------------------------------------------------------------------------------------------
# carry: CF[b, r, s] = Σ_{t' < r·BT} S[t', s], for the rows r that can be read (0 up to the key's own tile)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _sel_carry_kernel(
    Q, K, CF, KEEP, s_qb, s_qt, s_kb, s_kt, T, Tp, nT, scale,
    BT: tl.constexpr, BN: tl.constexpr, QM: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr, SEG: tl.constexpr,
):
    # key-major: one key tile J per program, walking the query rows downwards in tiles of BT with a running column
    # sum, so every entry is a sum of whole tiles in a fixed order (deterministic). Head 0 only: the table is shared
    # by all heads. The walk starts at the first row that a reader's query tile (QM rows, a multiple of BT) holding
    # one of J's keys starts at; earlier rows are never read.
    J = tl.program_id(0)  # J = 0 walks the most tiles and starts first
    b = tl.program_id(1)
    offs_n = J * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    k0 = _rows(K, b, 0, offs_n, s_kb, s_kt, 0, offs_d, offs_n < T)
    keysel = _selectable_keys(KEEP, b, Tp, offs_n, SEG)
    run = tl.zeros([BN], tl.float32)
    for r in range((J * BN) // QM * (QM // BT), (T + BT - 1) // BT):
        tl.store(CF + (b * nT + r) * Tp + offs_n, run)
        offs_m = r * BT + tl.arange(0, BT)
        q0 = _rows(Q, b, 0, offs_m, s_qb, s_qt, 0, offs_d, offs_m < T)
        S, live = _selection(q0, k0, offs_m, offs_n, keysel, scale, PREC)
        run += tl.sum(S, axis=0)


# ---------------------------------------------------------------------------------------------
# forward
# ---------------------------------------------------------------------------------------------
@triton.jit
def _sel_fwd_kernel(
    Q, K, V, O, LSE, CF, KEEP, SEGP, JLO,
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_ot, s_oh,
    T, H, Tp, nT, nJ, scale,
    BM: tl.constexpr, BN: tl.constexpr, RATIO: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr,
    DOT: tl.constexpr, SEG: tl.constexpr,
):
    # One query tile I (BM rows) of one head per program, walking the key tiles from the diagonal down; the carry
    # table's rows are BM / RATIO queries apart.
    nI, I = _query_program()
    bh, b, h, sl2 = _head_program(H, scale)
    offs_m, offs_d, row_ok = _own_tile(I, BM, D, T)
    q = _rows(Q, b, h, offs_m, s_qb, s_qt, s_qh, offs_d, row_ok)
    q0 = _rows(Q, b, 0, offs_m, s_qb, s_qt, s_qh, offs_d, row_ok)
    tri, tri_t = _triangles(BM)
    seg_i, j_lo, j_hi = _query_walk(SEGP, JLO, b, I, nI, nJ, Tp, offs_m, BM, BN, SEG)
    m_i, l_i, acc = _softmax_start(BM, D)
    for jj in range(0, j_hi + 1 - j_lo):
        J, offs_n, col_ok = _walk_tile(j_hi, jj, BN, T)
        k0, k, v, F, live = _selection_key_tile(K, V, KEEP, CF, q0, b, h, I, offs_m, offs_n, col_ok, offs_d, tri,
                                                s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, nT, Tp, scale, RATIO, PREC, DOT,
                                                SEG)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * sl2 - F * LOG2E
        m_i, l_i, acc = _masked_softmax_step(s, m_i, l_i, acc, v, SEGP, b, Tp, offs_m, offs_n, seg_i, PREC, False,
                                             SEG)
    acc = acc / l_i[:, None]
    tl.store(O + b * s_ob + h * s_oh + offs_m[:, None] * s_ot + offs_d[None, :], acc.to(O.dtype.element_ty),
             mask=row_ok[:, None])
    tl.store(LSE + bh * Tp + offs_m, m_i + tl.log2(l_i))  # log2 units; padded rows are masked in the backward


# ---------------------------------------------------------------------------------------------
# backward, key-major: dk, dv per head, head 0's dk share from the selection, RC
# ---------------------------------------------------------------------------------------------
@triton.jit
def _sel_bwd_kv_kernel(
    Q, K, V, DO, DK, DV, LSE, DELTA, CF, RCP, DK0P, KEEP, SEGP, IHI,
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_ot, s_oh,
    s_dkb, s_dkt, s_dkh, s_dvb, s_dvt, s_dvh,
    T, H, Tp, nT, HPG, scale,
    BT: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr, DOT: tl.constexpr,
    SEG: tl.constexpr,
):
    # One key tile J (BN keys) and one group of HPG heads per program; the query tiles are the tables' rows (BT).
    # Tiles are transposed, [s (keys of J), t (queries)], so P and dS feed dv, dk and the selection share without a
    # transpose. Per head, the query tiles are walked downwards so that rc[s] = Σ_{t ≥ end of tile I} dS_h[t, s] is
    # a running sum: R = in-tile suffix + rc. RCP[b, g, I, s] collects rc (as it enters tile I) summed over the
    # group's heads, for the dq kernel.
    nJ = tl.num_programs(0)
    J = tl.program_id(0)  # J = 0 walks the most tiles and starts first
    G, b, g, sl2 = _group_program(H, HPG, scale)
    offs_n, offs_d, col_ok = _own_tile(J, BN, D, T)
    k0 = _rows(K, b, 0, offs_n, s_kb, s_kt, s_kh, offs_d, col_ok)
    keysel = _selectable_keys(KEEP, b, Tp, offs_n, SEG)
    tri, tri_t = _triangles(BT)
    seg_j, i_lo, i_hi = _key_walk(SEGP, IHI, b, J, nJ, T, Tp, offs_n, BT, BN, SEG)
    acc0 = tl.zeros([BN, D], tl.float32)  # head 0's slot: its own dk and every head's selection share
    for hh in range(0, HPG):
        h, k, v, dk, dv, rc = _key_head(K, V, b, g, HPG, hh, offs_n, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, offs_d, col_ok)
        for ii in range(0, i_hi + 1 - i_lo):
            I, offs_m, row_ok = _walk_tile(i_hi, ii, BT, T)
            q, q0, do, lse, delta = _query_rows(Q, Q, DO, LSE, DELTA, b, h, H, Tp, offs_m, row_ok, s_qb, s_qt, s_qh,
                                                offs_d, s_qb, s_qt, s_qh, offs_d, s_ob, s_ot, s_oh)
            # F transposed: f_t[s, t] = CF[I, s] + Σ_{t' in I, t' < t} S[t', s]
            raw_t = tl.dot(k0, tl.trans(q0), input_precision=PREC) * scale
            live_t = (offs_n[:, None] < offs_m[None, :]) & keysel[:, None] & (raw_t > 0.0)
            f_t = _prefix_cols(tl.where(live_t, raw_t, 0.0), tri_t, DOT, PREC)
            f_t += tl.load(CF + (b * nT + I) * Tp + offs_n)[:, None]
            s_t = tl.dot(k, tl.trans(q), input_precision=PREC) * sl2 - f_t * LOG2E
            attend = _attend_mask_t(offs_m, offs_n, row_ok, seg_j, SEGP, b, Tp, SEG)
            ds_t, dk, dv = _flash_kv_step(s_t, attend, lse, delta, q, do, v, dk, dv, PREC)
            # the selection: RC, then this head's share of R and the running carry
            _store_carry_in(RCP, rc, b, G, g, nT, I, Tp, offs_n, hh)
            r_t = _suffix_cols(ds_t, tri, DOT, PREC) + rc[:, None]
            rc += tl.sum(ds_t, axis=1)
            acc0 -= tl.dot(tl.where(live_t, r_t, 0.0).to(q0.dtype), q0, input_precision=PREC)
        acc0 += tl.where(h == 0, dk, 0.0)
        tl.store(DK + b * s_dkb + h * s_dkh + offs_n[:, None] * s_dkt + offs_d[None, :],
                 (dk * scale).to(DK.dtype.element_ty), mask=col_ok[:, None] & (offs_d[None, :] * 0 + h != 0))
        tl.store(DV + b * s_dvb + h * s_dvh + offs_n[:, None] * s_dvt + offs_d[None, :],
                 dv.to(DV.dtype.element_ty), mask=col_ok[:, None])
        tl.debug_barrier()  # RCP's stores by this head are read back by the next one
    tl.store(DK0P + ((b * G + g) * Tp + offs_n[:, None]) * D + offs_d[None, :], acc0 * scale)


# ---------------------------------------------------------------------------------------------
# backward, query-major: dq per head, head 0's dq share from the selection
# ---------------------------------------------------------------------------------------------
@triton.jit
def _sel_bwd_q_kernel(
    Q, K, V, DO, DQ, LSE, DELTA, CF, RC, DQ0P, KEEP, SEGP, JLO, IHI,
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_ot, s_oh, s_dqb, s_dqt, s_dqh,
    T, H, Tp, nT, nJ, HPG, scale,
    BM: tl.constexpr, BN: tl.constexpr, RATIO: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr,
    DOT: tl.constexpr, SEG: tl.constexpr,
):
    # One query tile I (BM = RATIO table rows) and one group of HPG heads per program. Each head adds its in-tile
    # suffix of dS_h to R; the part over later query tiles, RC at the tile's last table row (every head's, summed),
    # is added once, with head 0.
    nI, I = _query_program()
    G, b, g, sl2 = _group_program(H, HPG, scale)
    offs_m, offs_d, row_ok = _own_tile(I, BM, D, T)
    q0 = _rows(Q, b, 0, offs_m, s_qb, s_qt, s_qh, offs_d, row_ok)
    tri, tri_t = _triangles(BM)
    last_row = I * RATIO + RATIO - 1  # the table row that ends with tile I
    seg_i, j_lo, j_hi = _query_walk(SEGP, JLO, b, I, nI, nJ, Tp, offs_m, BM, BN, SEG)
    acc0 = tl.zeros([BM, D], tl.float32)  # head 0's slot: its own dq and every head's selection share
    for hh in range(0, HPG):
        h, q, do, lse, delta, dq = _query_head(Q, DO, LSE, DELTA, b, g, HPG, hh, H, Tp, offs_m, s_qb, s_qt, s_qh,
                                               s_ob, s_ot, s_oh, offs_d, row_ok)
        for jj in range(0, j_hi + 1 - j_lo):
            J, offs_n, col_ok = _walk_tile(j_hi, jj, BN, T)
            k0, k, v, F, live = _selection_key_tile(K, V, KEEP, CF, q0, b, h, I, offs_m, offs_n, col_ok, offs_d, tri,
                                                    s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, nT, Tp, scale, RATIO, PREC,
                                                    DOT, SEG)
            seg_j, carry_ok = _carry_mask(SEGP, IHI, b, h, I, J, nJ, T, Tp, offs_n, last_row, BM, SEG)
            s = tl.dot(q, tl.trans(k), input_precision=PREC) * sl2 - F * LOG2E
            attend = _attend_mask(offs_m, offs_n, seg_i, seg_j, SEG) & row_ok[:, None]
            ds, dq = _flash_q_step(s, attend, lse, delta, do, k, v, dq, PREC)
            R = _suffix_rows(ds, tri_t, DOT, PREC)
            R += tl.load(RC + (b * nT + last_row) * Tp + offs_n, mask=carry_ok, other=0.0)[None, :]
            acc0 -= tl.dot(tl.where(live, R, 0.0).to(k0.dtype), k0, input_precision=PREC)
        acc0 += tl.where(h == 0, dq, 0.0)
        tl.store(DQ + b * s_dqb + h * s_dqh + offs_m[:, None] * s_dqt + offs_d[None, :],
                 (dq * scale).to(DQ.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] * 0 + h != 0))
    tl.store(DQ0P + ((b * G + g) * Tp + offs_m[:, None]) * D + offs_d[None, :], acc0 * scale)
