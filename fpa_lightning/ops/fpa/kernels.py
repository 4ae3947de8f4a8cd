"""Triton kernels of the fused FPA attention (fused.py is the public entry point).

Layout: q, k, v, o, do, dq, dk, dv are (B, T, H, D) tensors addressed by strides. Every per-position
field quantity lives in a padded (B*H, Tp) fp32 buffer (Tp = nB * BS), per-block ones in (B*H, nB).
One block size BS serves queries, keys and the field decomposition of docs/kernel.md:

    M(s, t) = min(suf_J(s), mid(J, I), pre_I(t))          J < I
    M(s, t) = masked cumulative min inside the block       J = I

The backward is the stable straight-through form of docs/kernel.md: every exponent argument ≤ 0.
All field arithmetic is fp32; FAR (1e30) stands for +inf so that empty ranges stay finite.

Variants (constexpr flags, so each compiles to its own code and the default one carries nothing extra):
QLEVEL compares the path minimum with the query's level ψ_t instead of the key's ψ_s; DIPSUM sums the dips
instead of taking the minimum (key level; the dips of the keys before each query block come from the CARRY
table); SEG masks pairs across documents (segment ids) and walks only the tiles that can share one.

Launch order, per call: prep (block minima, normalisers; dip-sum: the CARRY table) -> forward; in the backward,
dq (query-major: dq, Delta and the off-diagonal field sums c_t, a_s partials, kappa) -> dk/dv (key-major: dk, dv,
dpsi, dbeta) -> field (per block: the diagonal block's field gradient and the scatters into dphi). Dip-sum's
backward is dq -> dk/dv with its field gradient (key-major, walking down) -> a fixed-order sum of dphi partials.
"""
from __future__ import annotations

import triton
import triton.language as tl

from fpa_lightning.ops import common

FAR = tl.constexpr(common.FAR)
LOG2E = tl.constexpr(common.LOG2E)


@triton.jit
def _min_combine(a, b):
    return tl.minimum(a, b)


@triton.jit
def _minsum_combine(m1, z1, m2, z2):
    # (m, z) represents sum_u exp(m - phi_u) with m = min phi_u: a stable running soft sum. One exponential: the
    # side that holds the minimum keeps its z as it is (its factor exp(0) is 1), the other is scaled.
    first = m1 <= m2
    e = tl.exp(-tl.abs(m1 - m2))
    return tl.minimum(m1, m2), tl.where(first, z1 + z2 * e, z1 * e + z2)


@triton.jit
def _maxsum_combine(r1, w1, r2, w2):
    # (r, w) represents sum_t x_t exp(M_t) as w * exp(r) with r = max M_t; one exponential, as in _minsum_combine.
    first = r1 >= r2
    e = tl.exp(-tl.abs(r1 - r2))
    return tl.maximum(r1, r2), tl.where(first, w1 + w2 * e, w1 * e + w2)


@triton.jit
def _add2(a1, b1, a2, b2):
    return a1 + a2, b1 + b2


@triton.jit
def _recip(x, FAST: tl.constexpr):
    # 1/x for x >= 1 (every normaliser Z' here is): one MUFU.RCP, no range scaling (div.full.f32
    # costs ~8 extra instructions and predicate pressure). The interpreter has no inline asm.
    if FAST:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        return 1.0 / x


@triton.jit
def _program(H, LONG_FIRST: tl.constexpr):
    # grid (blocks, B*H): the program's block and its row bh = b*H + h. LONG_FIRST takes the blocks last first:
    # a query block's walk grows with its index, so the longest walks start first (a shorter tail)
    if LONG_FIRST:
        blk = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        blk = tl.program_id(0)
    bh = tl.program_id(1)
    return blk, bh, bh // H, bh % H


@triton.jit
def _documents(SEGP, WALK, b, Tp, nB, blk, offs, bound, SEG: tl.constexpr):
    # the document ids of the positions offs (the positions themselves without documents: every pair shares one)
    # and the bound of block blk's walk: bound without documents, else the walk table's entry (docs/kernel.md §3)
    ids = offs
    if SEG:
        ids = tl.load(SEGP + b * Tp + offs)
        bound = tl.load(WALK + b * nB + blk)
    return ids, bound


@triton.jit
def _rows(P, b, h, s_b, s_t, s_h, offs, offs_d):
    # pointers to the (positions offs, features offs_d) tile of head h of sequence b in a (B, T, H, D) tensor
    return P + b * s_b + h * s_h + offs[:, None] * s_t + offs_d[None, :]


@triton.jit
def _load_rows(P, b, h, s_b, s_t, s_h, offs, offs_d, ok):
    # the tile of _rows, 0 on the rows that are not ok (past T)
    return tl.load(_rows(P, b, h, s_b, s_t, s_h, offs, offs_d), mask=ok[:, None], other=0.0)


# ---------------------------------------------------------------------------------------------
# prep: per-block prefix/suffix minima and their normalisers
# ---------------------------------------------------------------------------------------------
@triton.jit
def _fpa_prep_kernel(
    PHI, PSI, s_pb, s_pt, s_ph,
    PHIP, PSIP, SUF, ZSUF, PRE, ZPRE, ASUF, BMIN, ZBLK, MINSUF, MINPSI,
    T, H, Tp, nB,
    BS: tl.constexpr,
):
    # One block per program, all by scans over BS positions: (min, soft sum) pairs combine stably.
    blk, bh, b, h = _program(H, False)
    base_in = PHI + b * s_pb + h * s_ph
    offs = blk * BS + tl.arange(0, BS)
    valid = offs < T
    phi = tl.load(base_in + offs * s_pt, mask=valid, other=FAR).to(tl.float32)
    psi = tl.load(PSI + b * s_pb + h * s_ph + offs * s_pt, mask=valid, other=0.0).to(tl.float32)
    one = tl.where(valid, 1.0, 0.0)
    # prefix over [start, t]: pre = min phi, zpre = sum exp(pre - phi)
    pre, zpre = tl.associative_scan((phi, one), 0, _minsum_combine)
    # suffix over (s, end]: the same scan, reversed, over phi shifted by one position
    nxt = offs + 1
    nxt_ok = (nxt < (blk + 1) * BS) & (nxt < T)
    phi_next = tl.load(base_in + nxt * s_pt, mask=nxt_ok, other=FAR).to(tl.float32)
    suf, zsuf = tl.associative_scan((phi_next, tl.where(nxt_ok, 1.0, 0.0)), 0, _minsum_combine, reverse=True)
    bmin = tl.min(phi, axis=0)
    base = bh * Tp + offs
    tl.store(PHIP + base, phi)
    tl.store(PSIP + base, psi)
    tl.store(SUF + base, suf)
    tl.store(ZSUF + base, zsuf)
    tl.store(PRE + base, pre)
    tl.store(ZPRE + base, zpre)
    tl.store(ASUF + base, tl.minimum(suf - psi, 0.0))  # the forward's key side of the bias (_fwd_tile)
    tl.store(BMIN + bh * nB + blk, bmin)
    tl.store(ZBLK + bh * nB + blk, tl.sum(tl.exp(bmin - phi), axis=0))
    tl.store(MINSUF + bh * nB + blk, tl.min(suf, axis=0))
    tl.store(MINPSI + bh * nB + blk, tl.min(tl.where(valid, psi, FAR), axis=0))  # skipping's walk ranges


# ---------------------------------------------------------------------------------------------
# document tables (docs/kernel.md §3): the padded ids and each block's walk bounds, in one launch
# ---------------------------------------------------------------------------------------------
@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _search(A, x, n, steps, RIGHT: tl.constexpr):
    # per element of x: how many of the n nondecreasing values A[0..n) are < x (RIGHT: <= x), a binary search of
    # `steps` >= log2(n + 1) halvings (torch.searchsorted's left and right sides)
    lo = tl.zeros(x.shape, tl.int32)
    hi = tl.zeros(x.shape, tl.int32) + n
    for _ in range(steps):
        active = lo < hi
        mid = (lo + hi) // 2
        a = tl.load(A + mid, mask=active, other=0)
        if RIGHT:
            below = a <= x
        else:
            below = a < x
        lo = tl.where(active & below, mid + 1, lo)
        hi = tl.where(active & ~below, mid, hi)
    return lo


@triton.jit
def _fpa_segment_tables_kernel(IDS, s_ib, s_it, SEGP, STATS, JLO, IHI, T, Tp, nB, steps,
                               BS: tl.constexpr, CB: tl.constexpr):
    # One program per sequence b. SEGP (B, Tp) int32: the ids, padding repeating the last one; STATS (B, 4, nB) int32
    # scratch: block minima, block maxima, the running max of the maxima, the suffix min of the minima. Then
    # jlo[I] = #{J : runmax[J] < min_I} and ihi[J] = #{I : sufmin[I] <= max_J} - 1 (fused.segment_tables_reference).
    b = tl.program_id(0)
    u = tl.arange(0, BS)
    chunk = tl.arange(0, CB)
    stats = STATS + b * 4 * nB
    last = tl.load(IDS + b * s_ib + (T - 1) * s_it).to(tl.int32)
    run_max = tl.full([], -2147483648, tl.int32)
    for c0 in range(0, nB, CB):
        blk = c0 + chunk
        blk_ok = blk < nB
        pos = blk[:, None] * BS + u[None, :]  # (CB, BS)
        ids = tl.load(IDS + b * s_ib + pos * s_it, mask=blk_ok[:, None] & (pos < T), other=0).to(tl.int32)
        ids = tl.where(pos < T, ids, last)
        tl.store(SEGP + b * Tp + pos, ids, mask=blk_ok[:, None])
        bmin = tl.where(blk_ok, tl.min(ids, axis=1), 2147483647)
        bmax = tl.where(blk_ok, tl.max(ids, axis=1), -2147483648)
        tl.store(stats + blk, bmin, mask=blk_ok)
        tl.store(stats + nB + blk, bmax, mask=blk_ok)
        tl.store(stats + 2 * nB + blk, tl.maximum(tl.associative_scan(bmax, 0, _max_combine), run_max), mask=blk_ok)
        run_max = tl.maximum(run_max, tl.max(bmax, axis=0))
    tl.debug_barrier()
    suf_min = tl.full([], 2147483647, tl.int32)
    for c in range(0, tl.cdiv(nB, CB)):
        blk = (tl.cdiv(nB, CB) - 1 - c) * CB + chunk
        blk_ok = blk < nB
        bmin = tl.load(stats + blk, mask=blk_ok, other=2147483647)
        scan = tl.associative_scan(bmin, 0, _min_combine, reverse=True)
        tl.store(stats + 3 * nB + blk, tl.minimum(scan, suf_min), mask=blk_ok)
        suf_min = tl.minimum(suf_min, tl.min(bmin, axis=0))
    tl.debug_barrier()
    for c0 in range(0, nB, CB):
        blk = c0 + chunk
        blk_ok = blk < nB
        bmin = tl.load(stats + blk, mask=blk_ok, other=0)
        bmax = tl.load(stats + nB + blk, mask=blk_ok, other=0)
        tl.store(JLO + b * nB + blk, _search(stats + 2 * nB, bmin, nB, steps, False), mask=blk_ok)
        tl.store(IHI + b * nB + blk, _search(stats + 3 * nB, bmax, nB, steps, True) - 1, mask=blk_ok)


@triton.jit
def _keep_tile(kvec, psi, mid, phi_start, pre_i, psi_i, beta, threshold,
               QLEVEL: tl.constexpr, DIPSUM: tl.constexpr):
    # Upper bound on the bias of every pair of a (query block I, key block J) tile, J < I; keep unless it is
    # below the threshold. Min: M(s, t) = min(suf_J(s), mid(J, I), pre_I(t)) exactly, and pre_I(t) <=
    # phi(start of I), so the bound is the tile's maximum. Dip-sum: every dip is <= 0, so
    # D(t, s) <= C[I, s] + min(0, phi(start of I) - psi_s). kvec is suf_J (min) or C[I, .] (dip-sum).
    # psi_i (query level) must be FAR on padded rows (_bound_levels): their buffers' level 0 would raise the bound.
    if DIPSUM:
        ub = tl.max(kvec + tl.minimum(phi_start - psi, 0.0), axis=0)
    elif QLEVEL:
        ub = tl.max(tl.minimum(pre_i, tl.max(tl.minimum(kvec, mid), axis=0)) - psi_i, axis=0)
    else:
        ub = tl.max(tl.minimum(tl.minimum(mid, phi_start), kvec) - psi, axis=0)
    return beta * tl.minimum(ub, 0.0) >= threshold


@triton.jit
def _bound_levels(psi_i, rows_ok):
    # the query levels _keep_tile takes: FAR on the padded rows of a partial last block, so they bound nothing
    return tl.where(rows_ok, psi_i, FAR)


@triton.jit
def _block_may_keep(mid, phi_start, minpsi, beta, threshold):
    # the walk ranges' per-block bound (min, key level): every tile (I, J) has bias at most
    # beta*min(0, min(mid(J, I), phi(start of I)) - min psi over J) (every M(s, t) <= both, every psi_s >= the
    # minimum), so where this is False _keep_tile fails too
    return beta * tl.minimum(tl.minimum(mid, phi_start) - minpsi, 0.0) >= threshold


@triton.jit
def _lowest_kept_block(BMIN, MINPSI, bh, I, nB, j_lo, phi_start, beta, threshold, CB: tl.constexpr):
    # The query-major walk's lower end with skipping (min, key level; docs/kernel.md §3): the lowest J where
    # _block_may_keep holds. A vector pass over the blocks in chunks of CB, mid(J, I) as a running min of bmin[J + 1].
    j_keep = I
    carry = FAR
    idx = tl.arange(0, CB)
    for c0 in range(0, I - j_lo, CB):
        js = I - 1 - c0 - idx  # descending
        ok = js >= j_lo
        x = tl.load(BMIN + bh * nB + js + 1, mask=ok & (js + 1 < I), other=FAR)
        mid = tl.minimum(tl.associative_scan(x, 0, _min_combine), carry)
        minpsi = tl.load(MINPSI + bh * nB + js, mask=ok, other=FAR)
        may = ok & _block_may_keep(mid, phi_start, minpsi, beta, threshold)
        j_keep = tl.minimum(j_keep, tl.min(tl.where(may, js, I), axis=0))
        carry = tl.minimum(carry, tl.min(x, axis=0))
    return j_keep


@triton.jit
def _highest_kept_block(BMIN, PHIP, fbase, bh, J, i_hi, nB, minpsi, beta, threshold, BS: tl.constexpr,
                        CB: tl.constexpr):
    # The key-major walk's upper end with skipping: the highest I where _block_may_keep holds, mid(J, I) now a
    # running min of bmin[I - 1] as I rises and phi(start of I) read per block.
    i_keep = J
    carry = FAR
    idx = tl.arange(0, CB)
    for c0 in range(J + 1, i_hi + 1, CB):
        ic = c0 + idx  # ascending
        ok = ic <= i_hi
        x = tl.load(BMIN + bh * nB + ic - 1, mask=ok & (ic - 1 > J), other=FAR)
        mid = tl.minimum(tl.associative_scan(x, 0, _min_combine), carry)
        phi_start = tl.load(PHIP + fbase + ic * BS, mask=ok, other=FAR)
        may = ok & _block_may_keep(mid, phi_start, minpsi, beta, threshold)
        i_keep = tl.maximum(i_keep, tl.max(tl.where(may, ic, J), axis=0))
        carry = tl.minimum(carry, tl.min(x, axis=0))
    return i_keep


@triton.jit
def _key_vector(SUF, CARRY, fbase, bh, nB, Tp, I, offs_n, DIPSUM: tl.constexpr):
    # The key-side vector of an off-diagonal tile's bias: suf_J(s) for the min reduction, and for dip-sum
    # C[I, s] = sum of min(0, phi_u - psi_s) over s < u < start of I (the CARRY table)
    if DIPSUM:
        return tl.load(CARRY + (bh * nB + I) * Tp + offs_n)
    else:
        return tl.load(SUF + fbase + offs_n)


@triton.jit
def _offdiag_depth(kvec, psi, mid, pre_i, psi_i, phi_i, QLEVEL: tl.constexpr, DIPSUM: tl.constexpr):
    # bias / beta of an off-diagonal tile [t, s] before the min with 0 (min) or as it is (dip-sum, already <= 0)
    if DIPSUM:  # C[I, s] + sum over u in [start of I, t] of min(0, phi_u - psi_s): a cumulative sum down the rows
        return kvec[None, :] + tl.cumsum(tl.minimum(phi_i[:, None] - psi[None, :], 0.0), axis=0)
    Mt = tl.minimum(tl.minimum(kvec[None, :], mid), pre_i[:, None])
    if QLEVEL:
        return Mt - psi_i[:, None]
    else:
        return Mt - psi[None, :]


@triton.jit
def _diag_depth(phi, psi, after, QLEVEL: tl.constexpr, DIPSUM: tl.constexpr):
    # bias / beta on a diagonal tile [t, s] (rows and columns are the same positions): <= 0, and 0 where t <= s
    if DIPSUM:
        return tl.cumsum(tl.where(after, tl.minimum(phi[:, None] - psi[None, :], 0.0), 0.0), axis=0)
    # masked cumulative min down the rows: FAR where t <= s, so min(0, .) is 0 there
    Mt = tl.associative_scan(tl.where(after, phi[:, None], FAR), 0, _min_combine)
    if QLEVEL:
        return tl.minimum(Mt - psi[:, None], 0.0)
    else:
        return tl.minimum(Mt - psi[None, :], 0.0)


@triton.jit
def _softmax_step(s, v, m_i, l_i, acc, PREC: tl.constexpr):
    # one online-softmax step over a tile's scores s (log2 units) and values v: row maxima, sums, accumulator
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return m_new, l_i, acc


@triton.jit
def _level_sums(g, gd, beta, dpsi, dbeta):
    # the row sums of a tile's level and beta gradients: dpsi -= beta * sum G/beta (g: dS on the dead pairs, else
    # 0), dbeta += sum dS * depth (gd)
    s_g, s_b = tl.reduce((g, gd), 1, _add2)
    return dpsi - beta * s_g, dbeta + s_b


@triton.jit
def _fwd_tile(q, K, V, SEGP, ASUF, b, h, Tp, fbase, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, offs_n, offs_d,
              kvec, psi, mid, pre_i, psi_i, phi_i, seg_i, sl2, bl2, m_i, l_i, acc,
              PREC: tl.constexpr, QLEVEL: tl.constexpr, DIPSUM: tl.constexpr, SEG: tl.constexpr):
    k = tl.load(_rows(K, b, h, s_kb, s_kt, s_kh, offs_n, offs_d))
    v = tl.load(_rows(V, b, h, s_vb, s_vt, s_vh, offs_n, offs_d))
    if DIPSUM or QLEVEL:
        depth = _offdiag_depth(kvec, psi, mid, pre_i, psi_i, phi_i, QLEVEL, DIPSUM)
        if not DIPSUM:
            depth = tl.minimum(depth, 0.0)
    else:
        # min(0, min(suf_s, mid, pre_t) - psi_s) = min(a_s, min(mid, pre_t) - psi_s) with a_s = min(0, suf_s - psi_s)
        # from the prep kernel: one subtraction and one min per pair, and no per-key arithmetic in the loop. Bitwise
        # the same values: a rounded subtraction is monotone, so min(x, y) - c = min(x - c, y - c) exactly.
        depth = tl.minimum(tl.load(ASUF + fbase + offs_n)[None, :], tl.minimum(mid, pre_i)[:, None] - psi[None, :])
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * sl2 + depth * bl2
    if SEG:
        s = tl.where(seg_i[:, None] == tl.load(SEGP + b * Tp + offs_n)[None, :], s, -float("inf"))
    return _softmax_step(s, v, m_i, l_i, acc, PREC)


@triton.jit
def _dq_tile(q, do, K, V, SEGP, A_PARTIAL, b, h, bh, I, nB, Tp,
             s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, offs_n, offs_d,
             kvec, zsuf, psi, mid, zmid, pre_i, zpre_i, psi_i, phi_i, seg_i, lse, delta, beta, sl2, bl2,
             dq, c, kap, qpsi, qbeta,
             PREC: tl.constexpr, FAST: tl.constexpr, GENERAL: tl.constexpr,
             QLEVEL: tl.constexpr, DIPSUM: tl.constexpr, SEG: tl.constexpr):
    # One off-diagonal tile [t (queries of I), s (keys of J)], J < I: dq and, for the min reduction, the field
    # sums of docs/kernel.md, step 2 (c_t and kappa[J, I] accumulated here, a_s stored); with a query level also
    # the row sums of dpsi_t and dbeta_t. Padded query rows have lse = +inf, so p = ds = r = 0 there.
    k = tl.load(_rows(K, b, h, s_kb, s_kt, s_kh, offs_n, offs_d))
    v = tl.load(_rows(V, b, h, s_vb, s_vt, s_vh, offs_n, offs_d))
    if DIPSUM:
        dlt = _offdiag_depth(kvec, psi, mid, pre_i, psi_i, phi_i, QLEVEL, DIPSUM)  # already <= 0
    elif GENERAL:
        # M = min(m2_s, pre_t) with m2 = min(suf, mid); rho1 = e^{m2 - suf}, rho2 = e^{m2 - mid} (<= 1)
        m2 = tl.minimum(kvec, mid)
        rho1 = tl.exp2((m2 - kvec) * LOG2E)
        rho2 = tl.exp2((m2 - mid) * LOG2E)
        X = zsuf * rho1 + zmid * rho2
        if QLEVEL:
            dlt = tl.minimum(m2[None, :], pre_i[:, None]) - psi_i[:, None]
        else:
            dlt = tl.minimum(m2[None, :], pre_i[:, None]) - psi[None, :]
    else:
        # mid(J, I) <= min_s suf_J(s): M(s, t) = m_t = min(mid, pre_t) does not depend on s
        m_t = tl.minimum(pre_i, mid)
        if QLEVEL:
            dlt = (m_t - psi_i)[:, None]  # (BS, 1): a whole row is dead or alive
        else:
            dlt = m_t[:, None] - psi[None, :]
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * sl2 + tl.minimum(dlt, 0.0) * bl2
    if SEG:
        s = tl.where(seg_i[:, None] == tl.load(SEGP + b * Tp + offs_n)[None, :], s, -float("inf"))
    p = tl.exp2(s - lse[:, None])
    dp = tl.dot(do, tl.trans(v), input_precision=PREC)
    ds = p * (dp - delta[:, None])
    dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
    if not DIPSUM:
        gm = tl.where(dlt < 0.0, ds, 0.0)  # G / beta: the field gradient lives on dead pairs only
        if QLEVEL:
            qpsi, qbeta = _level_sums(gm, ds * tl.minimum(dlt, 0.0), beta, qpsi, qbeta)
        if GENERAL:
            # one exp per pair: d = pre_t - m2_s, E = e^{-|d|}; f = e^{M - m2}, e3 = e^{M - pre}
            d = pre_i[:, None] - m2[None, :]
            E = tl.exp2(-tl.abs(d) * LOG2E)
            neg = d < 0.0
            f = tl.where(neg, E, 1.0)
            e3 = tl.where(neg, 1.0, E)
            r = gm * _recip(f * X[None, :] + zpre_i[:, None] * e3, FAST)
            c += beta * tl.sum(r * e3, axis=1)
            s_f = tl.sum(r * f, axis=0)
            tl.store(A_PARTIAL + (bh * nB + I) * Tp + offs_n, (beta * rho1) * s_f)
            kap += beta * tl.sum(rho2 * s_f, axis=0)
        else:
            y, e3, es, x = _fast_tile_factors(mid, pre_i, kvec, zsuf, zmid)
            r = gm * _recip(y[:, None] * x[None, :] + (zpre_i * e3)[:, None], FAST)
            c += beta * e3 * tl.sum(r, axis=1)
            # kappa = beta sum_t y_t sum_s r = beta sum_s (sum_t y_t r): from the column sums, which every warp
            # holds once they are reduced, instead of a second reduction across the warps' rows
            col = tl.sum(r * y[:, None], axis=0)
            kap += beta * tl.sum(col, axis=0)
            tl.store(A_PARTIAL + (bh * nB + I) * Tp + offs_n, (beta * es) * col)
    return dq, c, kap, qpsi, qbeta


@triton.jit
def _dq_tile_t(q, do, K, V, A_PARTIAL, b, h, bh, I, nB, Tp,
               s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, offs_n, offs_d,
               kvec, zsuf, psi, mid, zmid, pre_i, zpre_i, lse, delta, beta, sl2, bl2,
               dq, c, kap,
               BS: tl.constexpr, PREC: tl.constexpr, FAST: tl.constexpr, GENERAL: tl.constexpr):
    # _dq_tile's key-level min reduction with the tile transposed, [s (keys of J), t (queries of I)]: a_s, a sum
    # over queries, runs along the rows, inside a warp, instead of down the columns across the four warps; c_t,
    # a sum over keys, accumulates in c (BS // 16, 8, BS) (_fold_rows), which the kernel reduces across the warps
    # once after its walk. dq takes dS's transpose through shared memory. The query level and documents keep
    # _dq_tile: this form spills there, and with documents it measured slower (docs/kernel.md §2).
    k = tl.load(_rows(K, b, h, s_kb, s_kt, s_kh, offs_n, offs_d))
    v = tl.load(_rows(V, b, h, s_vb, s_vt, s_vh, offs_n, offs_d))
    if GENERAL:
        m2 = tl.minimum(kvec, mid)
        rho1 = tl.exp2((m2 - kvec) * LOG2E)
        rho2 = tl.exp2((m2 - mid) * LOG2E)
        X = zsuf * rho1 + zmid * rho2
        dlt = tl.minimum(m2[:, None], pre_i[None, :]) - psi[:, None]
    else:
        m_t = tl.minimum(pre_i, mid)
        dlt = m_t[None, :] - psi[:, None]
    sT = tl.dot(k, tl.trans(q), input_precision=PREC) * sl2 + tl.minimum(dlt, 0.0) * bl2
    pT = tl.exp2(sT - lse[None, :])
    dpT = tl.dot(v, tl.trans(do), input_precision=PREC)
    dsT = pT * (dpT - delta[None, :])
    dq += tl.dot(tl.trans(dsT).to(k.dtype), k, input_precision=PREC)
    gm = tl.where(dlt < 0.0, dsT, 0.0)  # G / beta: the field gradient lives on dead pairs only
    if GENERAL:
        d = pre_i[None, :] - m2[:, None]
        E = tl.exp2(-tl.abs(d) * LOG2E)
        neg = d < 0.0
        f = tl.where(neg, E, 1.0)
        e3 = tl.where(neg, 1.0, E)
        r = gm * _recip(f * X[:, None] + zpre_i[None, :] * e3, FAST)
        c += _fold_rows(r * e3, BS)
        s_f = tl.sum(r * f, axis=1)
        tl.store(A_PARTIAL + (bh * nB + I) * Tp + offs_n, (beta * rho1) * s_f)
        kap += beta * tl.sum(rho2 * s_f, axis=0)
    else:
        y, e3, es, x = _fast_tile_factors(mid, pre_i, kvec, zsuf, zmid)
        r = gm * _recip(x[:, None] * y[None, :] + (zpre_i * e3)[None, :], FAST)
        c += _fold_rows(r * e3[None, :], BS)
        col = tl.sum(r * y[None, :], axis=1)
        kap += beta * tl.sum(col, axis=0)
        tl.store(A_PARTIAL + (bh * nB + I) * Tp + offs_n, (beta * es) * col)
    return dq, c, kap


@triton.jit
def _fast_tile_factors(mid, pre_i, kvec, zsuf, zmid):
    # A fast tile's field factors (mid(J, I) <= min_s suf_J(s), so M(s, t) = m_t): y_t = e^{m_t - mid},
    # e3_t = e^{m_t - pre_t}, es_s = e^{mid - suf_s} and x_s = zsuf_s es_s + zmid, so that Z' = y_t x_s + zpre_t e3_t
    # and the only per-pair transcendental of the field part is one reciprocal (both tile forms of dq).
    # m_t = min(pre_t, mid), so one of y_t, e3_t is e^0 = 1 and the other e^{-|pre_t - mid|}: one exponential per
    # query instead of two, the same bits (fl(mid - pre) = -fl(pre - mid)). It counts: a query vector's exponential
    # runs in every thread that holds one of its columns (16 a thread in the transposed tile)
    d = pre_i - mid
    E = tl.exp2(-tl.abs(d) * LOG2E)
    before = d < 0.0
    y = tl.where(before, E, 1.0)
    e3 = tl.where(before, 1.0, E)
    es = tl.exp2((mid - kvec) * LOG2E)
    x = zsuf * es + zmid
    return y, e3, es, x


@triton.jit
def _fold_rows(x, BS: tl.constexpr):
    # x (BS, BS) -> (BS // 16, 8, BS), rows s and s + 8 of each 16-row slice added: the warpgroup's accumulator
    # layout gives each warp 16 consecutive rows and each thread rows i and i + 8 of them, so the sum stays inside a
    # thread, and c needs half the registers of a (BS, BS) tile (its spills were dq's local-memory traffic)
    return tl.sum(tl.reshape(x, (BS // 16, 2, 8, BS)), axis=1)


@triton.jit
def _query_rows(Q, DO, LSE, DELTA, b, h, fbase, offs_m, T, s_qb, s_qt, s_qh, s_ob, s_ot, s_oh, offs_d):
    # q and dO of the query rows offs_m (0 past T), with their lse and Delta: what a key-major tile reads
    row_ok = offs_m < T
    q = _load_rows(Q, b, h, s_qb, s_qt, s_qh, offs_m, offs_d, row_ok)
    do = _load_rows(DO, b, h, s_ob, s_ot, s_oh, offs_m, offs_d, row_ok)
    return q, do, tl.load(LSE + fbase + offs_m), tl.load(DELTA + fbase + offs_m)


@triton.jit
def _query_block(Q, BETA, s_qb, s_qt, s_qh, T, H, qk_scale, BS: tl.constexpr, D: tl.constexpr):
    # the program's query block I of a query-major kernel (the last block first): beta, the log2-unit scales of the
    # bias and of q·k (scores are exp2 arguments), the rows' positions and q (0 past T)
    I, bh, b, h = _program(H, True)
    beta = tl.load(BETA + h).to(tl.float32)
    bl2 = beta * LOG2E
    sl2 = qk_scale * LOG2E
    offs_m = I * BS + tl.arange(0, BS)
    offs_d = tl.arange(0, D)
    row_ok = offs_m < T
    q = _load_rows(Q, b, h, s_qb, s_qt, s_qh, offs_m, offs_d, row_ok)
    return I, bh, b, h, beta, bl2, sl2, offs_m, offs_d, row_ok, q


@triton.jit
def _diagonal_query_tile(q, K, V, b, h, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, offs_m, offs_d, row_ok, phi_i, psi_i,
                         sl2, bl2, PREC: tl.constexpr, QLEVEL: tl.constexpr, DIPSUM: tl.constexpr):
    # the diagonal tile [t, s] of a query-major kernel (the columns are the rows' positions): k and v (0 past T),
    # the bias depth and the log2-unit scores, before the causal, length and document masks
    k = _load_rows(K, b, h, s_kb, s_kt, s_kh, offs_m, offs_d, row_ok)
    v = _load_rows(V, b, h, s_vb, s_vt, s_vh, offs_m, offs_d, row_ok)
    depth = _diag_depth(phi_i, psi_i, offs_m[:, None] > offs_m[None, :], QLEVEL, DIPSUM)
    return k, v, depth, tl.dot(q, tl.trans(k), input_precision=PREC) * sl2 + depth * bl2


@triton.jit
def _key_block(K, V, SEGP, IHI, BETA, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, T, H, Tp, nB, qk_scale,
               BS: tl.constexpr, D: tl.constexpr, SEG: tl.constexpr):
    # the program's key block J of a key-major kernel: k and v (0 past T), beta and the log2-unit scales, document
    # ids, and the last query block the walk visits (with documents, none after ihi[J] shares one with block J)
    J, bh, b, h = _program(H, False)
    beta = tl.load(BETA + h).to(tl.float32)
    offs_n = J * BS + tl.arange(0, BS)
    offs_d = tl.arange(0, D)
    col_ok = offs_n < T
    k = _load_rows(K, b, h, s_kb, s_kt, s_kh, offs_n, offs_d, col_ok)
    v = _load_rows(V, b, h, s_vb, s_vt, s_vh, offs_n, offs_d, col_ok)
    seg_j, i_hi = _documents(SEGP, IHI, b, Tp, nB, J, offs_n, nB - 1, SEG)
    return J, bh, b, h, beta, beta * LOG2E, qk_scale * LOG2E, bh * Tp, offs_n, offs_d, k, v, seg_j, i_hi


@triton.jit
def _diagonal_key_tile(q, k, v, do, lse, delta, depth, seg_j, offs_n, T, sl2, bl2, dk, dv,
                       PREC: tl.constexpr, SEG: tl.constexpr):
    # the diagonal tile [t, s] of a key-major kernel (rows and columns are the block's positions): flash dk and dv
    # with the bias beta·depth; returns dS as well, for the level and field sums
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * sl2 + depth * bl2
    p = tl.exp2(s - lse[:, None])
    p = tl.where((offs_n[:, None] >= offs_n[None, :]) & (offs_n < T)[:, None], p, 0.0)
    if SEG:
        p = tl.where(seg_j[:, None] == seg_j[None, :], p, 0.0)
    dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision=PREC)
    dp = tl.dot(do, tl.trans(v), input_precision=PREC)
    ds = p * (dp - delta[:, None])
    dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PREC)
    return dk, dv, ds


@triton.jit
def _offdiag_key_tile(k, v, q, do, lse, delta, depth, seg_j, SEGP, b, Tp, offs_m, sl2, bl2, dk, dv,
                      PREC: tl.constexpr, SEG: tl.constexpr):
    # a transposed off-diagonal tile [s (keys), t (queries offs_m)] of a key-major kernel: flash dk and dv with the
    # bias beta·depth; returns dS^T as well, for the level and field sums
    sT = tl.dot(k, tl.trans(q), input_precision=PREC) * sl2 + depth * bl2
    if SEG:
        sT = tl.where(seg_j[:, None] == tl.load(SEGP + b * Tp + offs_m)[None, :], sT, -float("inf"))
    pT = tl.exp2(sT - lse[None, :])
    dv += tl.dot(pT.to(do.dtype), do, input_precision=PREC)
    dpT = tl.dot(v, tl.trans(do), input_precision=PREC)
    dsT = pT * (dpT - delta[None, :])
    dk += tl.dot(dsT.to(q.dtype), q, input_precision=PREC)
    return dk, dv, dsT


@triton.jit
def _store_key_grads(DK, DV, b, h, offs_n, offs_d, T, s_dkb, s_dkt, s_dkh, s_dvb, s_dvt, s_dvh, dk, dv, qk_scale):
    col_ok = offs_n < T
    tl.store(_rows(DK, b, h, s_dkb, s_dkt, s_dkh, offs_n, offs_d), (dk * qk_scale).to(DK.dtype.element_ty),
             mask=col_ok[:, None])
    tl.store(_rows(DV, b, h, s_dvb, s_dvt, s_dvh, offs_n, offs_d), dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


@triton.jit
def _dkdv_tile(k, v, Q, DO, LSE, DELTA, PRE, PSIP, SEGP, seg_j, b, h, offs_m, fbase, T, Tp,
               s_qb, s_qt, s_qh, s_ob, s_ot, s_oh, offs_d,
               psi, m2, beta, sl2, bl2, dk, dv, dpsi, dbeta,
               PREC: tl.constexpr, QLEVEL: tl.constexpr, SEG: tl.constexpr):
    # transposed tile [s (keys of J), t (queries offs_m of I)], J < I: flash dk/dv with the recomputed bias,
    # plus (key level) the row sums of dpsi and dbeta. m2_s = min(suf_J(s), mid(J, I)), so M = min(m2_s, pre_t).
    # Padded query rows (t >= T) have q = do = 0, lse = +inf and Delta = 0: every term there is 0.
    q, do, lse, delta = _query_rows(Q, DO, LSE, DELTA, b, h, fbase, offs_m, T, s_qb, s_qt, s_qh, s_ob, s_ot, s_oh,
                                    offs_d)
    pre_i = tl.load(PRE + fbase + offs_m)
    # min(0, M - level) with the clamp and the level's side of the minimum taken on vectors: one subtraction and one
    # min per pair instead of two mins and a subtraction. Bitwise the same values: a rounded subtraction is
    # monotone, so min(x, y) - c = min(x - c, y - c) exactly.
    if QLEVEL:
        psi_t = tl.load(PSIP + fbase + offs_m)
        dlt = tl.minimum(tl.minimum(pre_i - psi_t, 0.0)[None, :], m2[:, None] - psi_t[None, :])
    else:
        dlt = tl.minimum(tl.minimum(m2 - psi, 0.0)[:, None], pre_i[None, :] - psi[:, None])
    dk, dv, dsT = _offdiag_key_tile(k, v, q, do, lse, delta, dlt, seg_j, SEGP, b, Tp, offs_m, sl2, bl2, dk, dv,
                                    PREC, SEG)
    if not QLEVEL:  # with a query level these are row sums of the query-major kernel
        dpsi, dbeta = _level_sums(tl.where(dlt < 0.0, dsT, 0.0), dsT * dlt, beta, dpsi, dbeta)
    return dk, dv, dpsi, dbeta


# ---------------------------------------------------------------------------------------------
# dip-sum's CARRY table: C[I, s] = sum over s < u < start of I of min(0, phi_u - psi_s), J < I
# ---------------------------------------------------------------------------------------------
@triton.jit
def _fpa_dip_carry_kernel(PHIP, PSIP, CARRY, IHI, H, Tp, nB, BS: tl.constexpr, SEG: tl.constexpr):
    # key-major: one key block J per program, walking I = J+1 .. upward; the sum is a running one, so every
    # entry is a sum of whole blocks in a fixed order (no cancellation, deterministic)
    J = tl.program_id(0)
    bh = tl.program_id(1)
    fbase = bh * Tp
    u = tl.arange(0, BS)
    offs_s = J * BS + u
    psi = tl.load(PSIP + fbase + offs_s)
    phi = tl.load(PHIP + fbase + offs_s)
    # dips inside block J after s (rows u, columns s); padded phi is FAR, so padding adds 0
    carry = tl.sum(tl.where(u[:, None] > u[None, :], tl.minimum(phi[:, None] - psi[None, :], 0.0), 0.0), axis=0)
    i_hi = nB - 1
    if SEG:  # no query block after i_hi shares a document with block J
        i_hi = tl.load(IHI + (bh // H) * nB + J)
    for I in range(J + 1, i_hi + 1):
        tl.store(CARRY + (bh * nB + I) * Tp + offs_s, carry)
        phi_i = tl.load(PHIP + fbase + I * BS + u)
        carry += tl.sum(tl.minimum(phi_i[:, None] - psi[None, :], 0.0), axis=0)


# ---------------------------------------------------------------------------------------------
# forward
# ---------------------------------------------------------------------------------------------
@triton.jit
def _fpa_fwd_kernel(
    Q, K, V, O, O32, LSE,
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_ot, s_oh,
    PHIP, PSIP, SUF, ASUF, PRE, BMIN, MINPSI, CARRY, SEGP, JLO, BETA,
    T, H, Tp, nB, qk_scale, threshold,
    BS: tl.constexpr, D: tl.constexpr, SKIP: tl.constexpr, PREC: tl.constexpr, STORE32: tl.constexpr,
    QLEVEL: tl.constexpr, DIPSUM: tl.constexpr, SEG: tl.constexpr, RANGE: tl.constexpr, CB: tl.constexpr,
):
    I, bh, b, h, beta, bl2, sl2, offs_m, offs_d, row_ok, q = _query_block(
        Q, BETA, s_qb, s_qt, s_qh, T, H, qk_scale, BS, D)
    fbase = bh * Tp
    phi_i = tl.load(PHIP + fbase + offs_m)
    pre_i = tl.load(PRE + fbase + offs_m)
    psi_i = tl.load(PSIP + fbase + offs_m)
    phi_start = tl.load(PHIP + fbase + I * BS)
    # key blocks below j_lo share no document with block I
    seg_i, j_lo = _documents(SEGP, JLO, b, Tp, nB, I, offs_m, 0, SEG)
    if RANGE:  # the key blocks below j_lo are skipped without a visit
        j_lo = _lowest_kept_block(BMIN, MINPSI, bh, I, nB, j_lo, phi_start, beta, threshold, CB)
    m_i = tl.full([BS], -float("inf"), tl.float32)
    l_i = tl.zeros([BS], tl.float32)
    acc = tl.zeros([BS, D], tl.float32)

    # diagonal block
    k, v, depth, s = _diagonal_query_tile(q, K, V, b, h, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, offs_m, offs_d, row_ok,
                                          phi_i, psi_i, sl2, bl2, PREC, QLEVEL, DIPSUM)
    s = tl.where((offs_m[:, None] >= offs_m[None, :]) & (offs_m[None, :] < T), s, -float("inf"))
    if SEG:
        s = tl.where(seg_i[:, None] == seg_i[None, :], s, -float("inf"))
    m_i, l_i, acc = _softmax_step(s, v, m_i, l_i, acc, PREC)

    mid = FAR
    psi_rows = _bound_levels(psi_i, row_ok)
    for jj in range(0, I - j_lo):
        J = I - 1 - jj
        offs_n = J * BS + tl.arange(0, BS)
        kvec = _key_vector(SUF, CARRY, fbase, bh, nB, Tp, I, offs_n, DIPSUM)
        psi = tl.load(PSIP + fbase + offs_n)
        keep = True
        if SKIP:
            keep = _keep_tile(kvec, psi, mid, phi_start, pre_i, psi_rows, beta, threshold, QLEVEL, DIPSUM)
        if keep:
            m_i, l_i, acc = _fwd_tile(q, K, V, SEGP, ASUF, b, h, Tp, fbase, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh,
                                      offs_n, offs_d,
                                      kvec, psi, mid, pre_i, psi_i, phi_i, seg_i, sl2, bl2, m_i, l_i, acc,
                                      PREC, QLEVEL, DIPSUM, SEG)
        if not DIPSUM:
            mid = tl.minimum(mid, tl.load(BMIN + bh * nB + J))

    acc = acc / l_i[:, None]
    tl.store(_rows(O, b, h, s_ob, s_ot, s_oh, offs_m, offs_d), acc.to(O.dtype.element_ty), mask=row_ok[:, None])
    if STORE32:  # (B*H, Tp, D) fp32: the backward's rowsum(dO * O) without O's rounding
        tl.store(O32 + (fbase + offs_m[:, None]) * D + offs_d[None, :], acc)
    # log2 units; +inf on padded rows, so that the backward's p = exp2(s - lse) is 0 there unmasked
    tl.store(LSE + fbase + offs_m, tl.where(row_ok, m_i + tl.log2(l_i), float("inf")))


# ---------------------------------------------------------------------------------------------
# backward, query-major: dq, Delta, and the off-diagonal field sums (c_t, a_s partials, kappa)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _first_general_block(BMIN, MINSUF, bh, I, nB, CB: tl.constexpr):
    # J1: the off-diagonal tiles J1 <= J < I take the general path; every J < J1 has
    # mid(J, I) <= min_s suf_J(s). mid(J, I) = min bmin over (J, I) = min over J' in [J, I-2] of
    # x[J'] = bmin[J' + 1]: a running min while J walks down, in chunks of CB blocks.
    j1 = I
    carry = FAR
    idx = tl.arange(0, CB)
    for c0 in range(0, I, CB):
        js = I - 1 - c0 - idx  # descending
        ok = js >= 0
        x = tl.load(BMIN + bh * nB + js + 1, mask=ok & (js + 1 < I), other=FAR)
        minsuf = tl.load(MINSUF + bh * nB + js, mask=ok, other=-FAR)
        mid = tl.minimum(tl.associative_scan(x, 0, _min_combine), carry)
        j1 = tl.minimum(j1, tl.min(tl.where(ok & (mid > minsuf), js, I), axis=0))
        carry = tl.minimum(carry, tl.min(x, axis=0))
    return j1


@triton.jit
def _fpa_bwd_dq_kernel(
    Q, K, V, DO, DQ,
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_ot, s_oh, s_dqb, s_dqt, s_dqh,
    LSE, O32, DELTA, PHIP, PSIP, SUF, ZSUF, PRE, ZPRE, BMIN, ZBLK, MINSUF, MINPSI, CARRY, SEGP, JLO, BETA,
    CSUM, A_PARTIAL, KAPPA, JKEEP, DPSI, DBETA,
    T, H, Tp, nB, qk_scale, threshold,
    BS: tl.constexpr, D: tl.constexpr, SKIP: tl.constexpr, PREC: tl.constexpr, FAST: tl.constexpr,
    CB: tl.constexpr, NSUB: tl.constexpr, QLEVEL: tl.constexpr, DIPSUM: tl.constexpr, SEG: tl.constexpr,
    TRANSPOSED: tl.constexpr, RANGE: tl.constexpr,
):
    # The field part lives here, not in the key-major kernel: this kernel's only tile accumulator is
    # dq (the key-major one holds dk and dv), so the field temporaries fit in registers. c_t is a row
    # quantity and stays in registers; a_s (a column quantity) is stored per (query block, key block)
    # and summed in fixed order by the field kernel, so the result is deterministic. Dip-sum has no field
    # part here (its field gradient needs sums over later queries: the key-major kernel has them).
    I, bh, b, h, beta, bl2, sl2, offs_m, offs_d, row_ok, q = _query_block(
        Q, BETA, s_qb, s_qt, s_qh, T, H, qk_scale, BS, D)
    do = _load_rows(DO, b, h, s_ob, s_ot, s_oh, offs_m, offs_d, row_ok)
    fbase = bh * Tp
    # Delta_t = rowsum(dO * O) with the forward's fp32 O (0 on padded rows, where dO = 0); stored for
    # the key-major and field kernels
    o32 = tl.load(O32 + (fbase + offs_m[:, None]) * D + offs_d[None, :])
    delta = tl.sum(do.to(tl.float32) * o32, axis=1)
    lse = tl.load(LSE + fbase + offs_m)
    phi_i = tl.load(PHIP + fbase + offs_m)
    pre_i = tl.load(PRE + fbase + offs_m)
    zpre_i = tl.load(ZPRE + fbase + offs_m)
    psi_i = tl.load(PSIP + fbase + offs_m)
    phi_start = tl.load(PHIP + fbase + I * BS)
    seg_i, j_lo = _documents(SEGP, JLO, b, Tp, nB, I, offs_m, 0, SEG)
    dq = tl.zeros([BS, D], tl.float32)
    if TRANSPOSED:
        c = tl.zeros([BS // 16, 8, BS], tl.float32)  # c_t / beta before its sum over the keys (_dq_tile_t)
    else:
        c = tl.zeros([BS], tl.float32)
    qpsi = tl.zeros([BS], tl.float32)  # query level: dpsi_t and dbeta_t, row sums
    qbeta = tl.zeros([BS], tl.float32)

    # diagonal (its field gradient belongs to the field kernel, or to dip-sum's key-major kernel)
    k, v, depth, s = _diagonal_query_tile(q, K, V, b, h, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, offs_m, offs_d, row_ok,
                                          phi_i, psi_i, sl2, bl2, PREC, QLEVEL, DIPSUM)
    p = tl.exp2(s - lse[:, None])
    p = tl.where((offs_m[:, None] >= offs_m[None, :]) & row_ok[:, None], p, 0.0)
    if SEG:
        p = tl.where(seg_i[:, None] == seg_i[None, :], p, 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=PREC)
    ds = p * (dp - delta[:, None])
    dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
    if QLEVEL:
        qpsi, qbeta = _level_sums(tl.where(depth < 0.0, ds, 0.0), ds * depth, beta, qpsi, qbeta)

    # Off-diagonal tiles walk away from the diagonal (J = I-1 .. j_lo) so mid(J, I) and its normaliser
    # zmid are running combines; the general tiles (J >= j_general) come first, the fast ones after: two
    # loops (the two passes of a static range, GENERAL = 1 then 0), no branch in either.
    if RANGE:  # the key blocks below j_lo are skipped without a visit; the field kernel reads where the walk ends
        j_lo = _lowest_kept_block(BMIN, MINPSI, bh, I, nB, j_lo, phi_start, beta, threshold, CB)
        tl.store(JKEEP + bh * nB + I, j_lo)
    mid = FAR
    zmid = 0.0
    j_general = j_lo
    if not DIPSUM:
        j_general = tl.maximum(_first_general_block(BMIN, MINSUF, bh, I, nB, CB), j_lo)
    psi_rows = _bound_levels(psi_i, row_ok)
    for GENERAL in tl.static_range(1, -1, -1):
        for jj in range(0 if GENERAL else I - j_general, I - j_general if GENERAL else I - j_lo):
            dq, c, mid, zmid, qpsi, qbeta = _dq_step(
                q, do, K, V, SUF, ZSUF, PSIP, BMIN, ZBLK, CARRY, SEGP, A_PARTIAL, KAPPA, b, h, bh, I, I - 1 - jj,
                nB, fbase, Tp, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, offs_d, mid, zmid, pre_i, zpre_i, psi_i, psi_rows,
                phi_i, seg_i, lse, delta, beta, sl2, bl2, phi_start, threshold, dq, c, qpsi, qbeta,
                BS, NSUB, SKIP, PREC, FAST, GENERAL, QLEVEL, DIPSUM, SEG, TRANSPOSED)

    tl.store(_rows(DQ, b, h, s_dqb, s_dqt, s_dqh, offs_m, offs_d), (dq * qk_scale).to(DQ.dtype.element_ty),
             mask=row_ok[:, None])
    tl.store(DELTA + fbase + offs_m, delta)
    if not DIPSUM:
        if TRANSPOSED:
            tl.store(CSUM + fbase + offs_m, beta * tl.sum(tl.reshape(c, (BS // 2, BS)), axis=0))
        else:
            tl.store(CSUM + fbase + offs_m, c)
    if QLEVEL:
        tl.store(DPSI + fbase + offs_m, qpsi)
        tl.store(DBETA + fbase + offs_m, qbeta)


@triton.jit
def _dq_step(q, do, K, V, SUF, ZSUF, PSIP, BMIN, ZBLK, CARRY, SEGP, A_PARTIAL, KAPPA, b, h, bh, I, J, nB, fbase, Tp,
             s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, offs_d, mid, zmid, pre_i, zpre_i, psi_i, psi_rows, phi_i, seg_i,
             lse, delta, beta, sl2, bl2, phi_start, threshold, dq, c, qpsi, qbeta,
             BS: tl.constexpr, NSUB: tl.constexpr, SKIP: tl.constexpr, PREC: tl.constexpr, FAST: tl.constexpr,
             GENERAL: tl.constexpr, QLEVEL: tl.constexpr, DIPSUM: tl.constexpr, SEG: tl.constexpr,
             TRANSPOSED: tl.constexpr):
    # key block J of the query-major walk, as NSUB sub-tiles of BS // NSUB keys (each sub-tile's temporaries
    # die before the next starts): its tile (a skipped tile contributes nothing, but the field kernel reads
    # every visited entry of A_PARTIAL and KAPPA), then block J joins mid and zmid
    BN: tl.constexpr = BS // NSUB
    if not DIPSUM:  # block J's minimum and normaliser, loaded before the tile so that their latency hides behind it
        bm = tl.load(BMIN + bh * nB + J)
        zb = tl.load(ZBLK + bh * nB + J)
    keep = True
    if SKIP:
        offs_blk = J * BS + tl.arange(0, BS)
        keep = _keep_tile(_key_vector(SUF, CARRY, fbase, bh, nB, Tp, I, offs_blk, DIPSUM),
                          tl.load(PSIP + fbase + offs_blk), mid, phi_start, pre_i, psi_rows, beta, threshold,
                          QLEVEL, DIPSUM)
    kap = 0.0
    if TRANSPOSED and keep:  # NSUB = 1: a kept tile is kept whole
        offs_n = J * BS + tl.arange(0, BS)
        dq, c, kap = _dq_tile_t(
            q, do, K, V, A_PARTIAL, b, h, bh, I, nB, Tp, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, offs_n, offs_d,
            tl.load(SUF + fbase + offs_n), tl.load(ZSUF + fbase + offs_n), tl.load(PSIP + fbase + offs_n), mid, zmid,
            pre_i, zpre_i, lse, delta, beta, sl2, bl2, dq, c, kap, BS, PREC, FAST, GENERAL)
    elif keep:
        for sub in tl.static_range(NSUB):
            offs_n = J * BS + sub * BN + tl.arange(0, BN)
            dq, c, kap, qpsi, qbeta = _dq_tile(
                q, do, K, V, SEGP, A_PARTIAL, b, h, bh, I, nB, Tp, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, offs_n, offs_d,
                _key_vector(SUF, CARRY, fbase, bh, nB, Tp, I, offs_n, DIPSUM), tl.load(ZSUF + fbase + offs_n),
                tl.load(PSIP + fbase + offs_n), mid, zmid, pre_i, zpre_i, psi_i, phi_i, seg_i, lse, delta, beta,
                sl2, bl2, dq, c, kap, qpsi, qbeta, PREC, FAST, GENERAL, QLEVEL, DIPSUM, SEG)
    elif not DIPSUM:
        tl.store(A_PARTIAL + (bh * nB + I) * Tp + J * BS + tl.arange(0, BS), tl.zeros([BS], tl.float32))
    if not DIPSUM:
        tl.store(KAPPA + (bh * nB + J) * nB + I, kap)
        mid_new = tl.minimum(mid, bm)
        zmid = zmid * tl.exp(mid_new - mid) + zb * tl.exp(mid_new - bm)
        mid = mid_new
    return dq, c, mid, zmid, qpsi, qbeta


# ---------------------------------------------------------------------------------------------
# backward, key-major: dk, dv and the dpsi, dbeta partials (the field gradient is elsewhere)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _fpa_bwd_dkdv_kernel(
    Q, K, V, DO, DK, DV,
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_ot, s_oh,
    s_dkb, s_dkt, s_dkh, s_dvb, s_dvt, s_dvh,
    LSE, DELTA, PHIP, PSIP, SUF, PRE, BMIN, SEGP, IHI, BETA,
    DPSI, DBETA,
    T, H, Tp, nB, qk_scale, threshold,
    BS: tl.constexpr, D: tl.constexpr, SKIP: tl.constexpr, PREC: tl.constexpr, MSUB: tl.constexpr,
    QLEVEL: tl.constexpr, SEG: tl.constexpr, RANGE: tl.constexpr, CB: tl.constexpr,
):
    J, bh, b, h, beta, bl2, sl2, fbase, offs_n, offs_d, k, v, seg_j, i_hi = _key_block(
        K, V, SEGP, IHI, BETA, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, T, H, Tp, nB, qk_scale, BS, D, SEG)
    phi_j = tl.load(PHIP + fbase + offs_n)
    psi = tl.load(PSIP + fbase + offs_n)
    if RANGE:  # the query blocks after i_hi are skipped without a visit (block J's keys are all real here); before
        # the accumulators exist, so that the scan's temporaries do not add to the loop's registers
        i_hi = _highest_kept_block(BMIN, PHIP, fbase, bh, J, i_hi, nB, tl.min(psi, axis=0), beta, threshold, BS, CB)
    suf = tl.load(SUF + fbase + offs_n)
    dk = tl.zeros([BS, D], tl.float32)
    dv = tl.zeros([BS, D], tl.float32)

    # diagonal block (I = J): rows t, columns s, both in this block
    q, do, lse, delta = _query_rows(Q, DO, LSE, DELTA, b, h, fbase, offs_n, T, s_qb, s_qt, s_qh, s_ob, s_ot, s_oh,
                                    offs_d)
    dlt = _diag_depth(phi_j, psi, offs_n[:, None] > offs_n[None, :], QLEVEL, False)
    dk, dv, ds = _diagonal_key_tile(q, k, v, do, lse, delta, dlt, seg_j, offs_n, T, sl2, bl2, dk, dv, PREC, SEG)
    dpsi = -beta * tl.sum(tl.where(dlt < 0.0, ds, 0.0), axis=0)
    dbeta = tl.sum(ds * dlt, axis=0)

    mid = FAR
    for I in range(J + 1, i_hi + 1):
        m2 = tl.minimum(suf, mid)
        keep = True
        if SKIP:
            offs_i = I * BS + tl.arange(0, BS)
            keep = _keep_tile(suf, psi, mid, tl.load(PHIP + fbase + I * BS), tl.load(PRE + fbase + offs_i),
                              _bound_levels(tl.load(PSIP + fbase + offs_i), offs_i < T), beta, threshold, QLEVEL,
                              False)
        if keep:
            for sub in tl.static_range(MSUB):  # query sub-tiles: fewer live temporaries
                dk, dv, dpsi, dbeta = _dkdv_tile(
                    k, v, Q, DO, LSE, DELTA, PRE, PSIP, SEGP, seg_j, b, h,
                    I * BS + sub * (BS // MSUB) + tl.arange(0, BS // MSUB), fbase, T, Tp,
                    s_qb, s_qt, s_qh, s_ob, s_ot, s_oh, offs_d,
                    psi, m2, beta, sl2, bl2, dk, dv, dpsi, dbeta, PREC, QLEVEL, SEG)
        mid = tl.minimum(mid, tl.load(BMIN + bh * nB + I))

    _store_key_grads(DK, DV, b, h, offs_n, offs_d, T, s_dkb, s_dkt, s_dkh, s_dvb, s_dvt, s_dvh, dk, dv, qk_scale)
    if not QLEVEL:  # a query level's dpsi and dbeta are the query-major kernel's
        tl.store(DPSI + fbase + offs_n, dpsi)
        tl.store(DBETA + fbase + offs_n, dbeta)


# ---------------------------------------------------------------------------------------------
# dip-sum's backward, key-major: dk, dv, dpsi, dbeta and the field gradient, as partials per key block
#   R[u, s] = sum_{t >= u} dS[t, s];  dphi_u = beta sum_{s<u} R[u, s] [phi_u < psi_s];
#   dpsi_s = -beta sum_{u>s} R[u, s] [phi_u < psi_s];  dbeta = sum dS * D   (docs/kernel.md)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _fpa_bwd_dipsum_kernel(
    Q, K, V, DO, DK, DV,
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_ot, s_oh,
    s_dkb, s_dkt, s_dkh, s_dvb, s_dvt, s_dvh,
    LSE, DELTA, PHIP, PSIP, CARRY, SEGP, IHI, BETA,
    DPSI, DBETA, DPHI_PARTIAL,
    T, H, Tp, nB, qk_scale, threshold,
    BS: tl.constexpr, D: tl.constexpr, SKIP: tl.constexpr, PREC: tl.constexpr, SEG: tl.constexpr,
):
    # Walks the query blocks downwards (I = i_hi .. J+1, then the diagonal), so R's sum over later queries is a
    # running column sum. dphi_u for u in block I gets a partial from every key block J <= I, stored in
    # DPHI_PARTIAL[J, u] and summed in fixed order by _fpa_dphi_sum_kernel (deterministic, no atomics).
    J, bh, b, h, beta, bl2, sl2, fbase, offs_n, offs_d, k, v, seg_j, i_hi = _key_block(
        K, V, SEGP, IHI, BETA, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, T, H, Tp, nB, qk_scale, BS, D, SEG)
    psi = tl.load(PSIP + fbase + offs_n)
    dk = tl.zeros([BS, D], tl.float32)
    dv = tl.zeros([BS, D], tl.float32)
    dpsi = tl.zeros([BS], tl.float32)
    dbeta = tl.zeros([BS], tl.float32)
    colsum = tl.zeros([BS], tl.float32)  # sum of dS[t, s] over the query blocks after the current one

    for ii in range(0, i_hi - J):
        I = i_hi - ii
        offs_m = I * BS + tl.arange(0, BS)
        carry = tl.load(CARRY + (bh * nB + I) * Tp + offs_n)
        phi_i = tl.load(PHIP + fbase + offs_m)
        keep = True
        if SKIP:
            keep = _keep_tile(carry, psi, 0.0, tl.load(PHIP + fbase + I * BS), phi_i, phi_i, beta, threshold,
                              False, True)
        dead = phi_i[None, :] < psi[:, None]  # [s, t]
        inner = tl.zeros([BS, BS], tl.float32)  # sum of dS[t, s] over t >= u inside block I, at [s, u]
        tile_sum = tl.zeros([BS], tl.float32)
        if keep:  # transposed tile [s, t]
            q, do, lse, delta = _query_rows(Q, DO, LSE, DELTA, b, h, fbase, offs_m, T, s_qb, s_qt, s_qh, s_ob, s_ot,
                                            s_oh, offs_d)
            depth = carry[:, None] + tl.cumsum(tl.where(dead, phi_i[None, :] - psi[:, None], 0.0), axis=1)
            dk, dv, dsT = _offdiag_key_tile(k, v, q, do, lse, delta, depth, seg_j, SEGP, b, Tp, offs_m, sl2, bl2,
                                            dk, dv, PREC, SEG)
            inner = tl.cumsum(dsT, axis=1, reverse=True)
            b_s, tile_sum = tl.reduce((dsT * depth, dsT), 1, _add2)
            dbeta += b_s
        # R[u, s] for u in block I: the later blocks' column sum plus the sum over t >= u inside block I. A
        # skipped tile has dS = 0, but its dips still lie on the paths of the later kept pairs (colsum).
        xr = tl.where(dead, colsum[:, None] + inner, 0.0)
        dpsi -= beta * tl.sum(xr, axis=1)
        tl.store(DPHI_PARTIAL + (bh * nB + J) * Tp + offs_m, beta * tl.sum(xr, axis=0))
        colsum += tile_sum

    # diagonal block (I = J), rows t, columns s, after every later block has joined colsum
    phi = tl.load(PHIP + fbase + offs_n)
    q, do, lse, delta = _query_rows(Q, DO, LSE, DELTA, b, h, fbase, offs_n, T, s_qb, s_qt, s_qh, s_ob, s_ot, s_oh,
                                    offs_d)
    dead = (offs_n[:, None] > offs_n[None, :]) & (phi[:, None] < psi[None, :])
    depth = tl.cumsum(tl.where(dead, phi[:, None] - psi[None, :], 0.0), axis=0)
    dk, dv, ds = _diagonal_key_tile(q, k, v, do, lse, delta, depth, seg_j, offs_n, T, sl2, bl2, dk, dv, PREC, SEG)
    xr = tl.where(dead, colsum[None, :] + tl.cumsum(ds, axis=0, reverse=True), 0.0)  # [u, s]
    dpsi -= beta * tl.sum(xr, axis=0)
    dbeta += tl.sum(ds * depth, axis=0)
    tl.store(DPHI_PARTIAL + (bh * nB + J) * Tp + offs_n, beta * tl.sum(xr, axis=1))

    _store_key_grads(DK, DV, b, h, offs_n, offs_d, T, s_dkb, s_dkt, s_dkh, s_dvb, s_dvt, s_dvh, dk, dv, qk_scale)
    tl.store(DPSI + fbase + offs_n, dpsi)
    tl.store(DBETA + fbase + offs_n, dbeta)


@triton.jit
def _fpa_dphi_sum_kernel(DPHI_PARTIAL, IHI, DPHI, H, Tp, nB, BS: tl.constexpr, SEG: tl.constexpr):
    # dphi_u for u in block K: the partials of key blocks J = 0 .. K in ascending order (those a key block's
    # walk never reached, after its i_hi, are zero by construction and are not read)
    K = tl.program_id(0)
    bh = tl.program_id(1)
    offs = K * BS + tl.arange(0, BS)
    acc = tl.zeros([BS], tl.float32)
    for J in range(0, K + 1):
        if SEG:
            if tl.load(IHI + (bh // H) * nB + J) >= K:
                acc += tl.load(DPHI_PARTIAL + (bh * nB + J) * Tp + offs)
        else:
            acc += tl.load(DPHI_PARTIAL + (bh * nB + J) * Tp + offs)
    tl.store(DPHI + bh * Tp + offs, acc)


# ---------------------------------------------------------------------------------------------
# the field kernel, per block K: the diagonal block's field gradient (docs/kernel.md, step 4) and
# the scatters of step 3 into dphi_u, u in K:
#   middle:       exp(bmin_K - phi_u) * sum_{J<K<I} kappa[J, I] exp(mid(J, I) - bmin_K)
#   key suffix:   sum_{s < u in K} a_s exp(suf(s) - phi_u),     a_s = sum over I > K of A_PARTIAL
#   query prefix: sum_{t >= u in K} c_t exp(pre(t) - phi_u)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _diagonal_field_grad(Q, K, V, DO, SEGP, b, h, s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh,
                         s_ob, s_ot, s_oh, lse, delta, phi, psi, beta, sl2, bl2, offs, T, Tp,
                         D: tl.constexpr, PREC: tl.constexpr, QLEVEL: tl.constexpr, SEG: tl.constexpr):
    # rows t, columns s of one diagonal block; dphi_u = sum_{s<u<=t} G[t,s] e^{M(s,t) - phi_u} / Z'(s,t)
    offs_d = tl.arange(0, D)
    ok = offs < T
    q = _load_rows(Q, b, h, s_qb, s_qt, s_qh, offs, offs_d, ok)
    k = _load_rows(K, b, h, s_kb, s_kt, s_kh, offs, offs_d, ok)
    v = _load_rows(V, b, h, s_vb, s_vt, s_vh, offs, offs_d, ok)
    do = _load_rows(DO, b, h, s_ob, s_ot, s_oh, offs, offs_d, ok)
    after = offs[:, None] > offs[None, :]
    Mt, Zt = tl.associative_scan(
        (tl.where(after, phi[:, None], FAR), tl.where(after, 1.0, 0.0)), 0, _minsum_combine)
    if QLEVEL:
        dlt = Mt - psi[:, None]
    else:
        dlt = Mt - psi[None, :]
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * sl2 + tl.minimum(dlt, 0.0) * bl2
    pair = after & ok[:, None]  # the t = s pair has no field term
    if SEG:
        seg = tl.load(SEGP + b * Tp + offs)
        pair = pair & (seg[:, None] == seg[None, :])
    p = tl.where(pair, tl.exp2(s - lse[:, None]), 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=PREC)
    dead = (dlt < 0.0) & after
    r = tl.where(dead, p * (dp - delta[:, None]) * beta / tl.where(dead, Zt, 1.0), 0.0)
    # S_u = sum_{t >= u} r_t exp(M_t - M_u), a reverse scan down the rows (M_u = max over t >= u)
    Rr, Sw = tl.associative_scan((tl.where(after, Mt, -FAR), r), 0, _maxsum_combine, reverse=True)
    wdiag = tl.where(after, Sw * tl.exp(tl.minimum(Mt - phi[:, None], 0.0)), 0.0)
    return tl.sum(wdiag, axis=1)  # indexed by u (rows)


@triton.jit
def _walk_start(JKEEP, JLO, bh, b, nB, blocks, ok, RANGE: tl.constexpr):
    # the lowest key block that the query-major walk of each of `blocks` visited (nB where not ok): where skipping's
    # walk ranges stopped it (JKEEP, per (batch, head), documents' j_lo included) or documents' j_lo (JLO, per batch)
    if RANGE:
        return tl.load(JKEEP + bh * nB + blocks, mask=ok, other=nB)
    else:
        return tl.load(JLO + b * nB + blocks, mask=ok, other=nB)


@triton.jit
def _fpa_field_kernel(
    Q, K, V, DO,
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_ot, s_oh,
    LSE, DELTA, PHIP, PSIP, SUF, PRE, BMIN, SEGP, JLO, IHI, JKEEP, BETA, KAPPA, CSUM, A_PARTIAL, DPHI,
    T, H, Tp, nB, qk_scale,
    BS: tl.constexpr, D: tl.constexpr, CB: tl.constexpr, PREC: tl.constexpr, QLEVEL: tl.constexpr,
    SEG: tl.constexpr, RANGE: tl.constexpr,
):
    # With segments, the query-major walk of block I stops at j_lo(I): A_PARTIAL[I, .] and KAPPA[., I] are read
    # for key blocks J >= j_lo(I) only (the others were never written and hold no pair of one document). With
    # skipping's walk ranges (RANGE), the dq kernel wrote where each walk stopped to JKEEP, read instead.
    Kb, bh, b, h = _program(H, False)
    beta = tl.load(BETA + h).to(tl.float32)
    fbase = bh * Tp
    offs = Kb * BS + tl.arange(0, BS)
    phi = tl.load(PHIP + fbase + offs)
    dphi = _diagonal_field_grad(Q, K, V, DO, SEGP, b, h, s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh,
                                s_ob, s_ot, s_oh, tl.load(LSE + fbase + offs), tl.load(DELTA + fbase + offs),
                                phi, tl.load(PSIP + fbase + offs), beta, qk_scale * LOG2E, beta * LOG2E,
                                offs, T, Tp, D, PREC, QLEVEL, SEG)

    # middle: mid(J, I) = min(A_J, B_I) with A_J = min bmin over [J+1, K] and B_I = min bmin over
    # [K, I-1] (the range (J, I) contains K), so e^{mid - bmin_K} = min(e^{A_J - bmin_K}, e^{B_I - bmin_K}):
    # no exponential per (J, I) pair, and both arguments are <= 0.
    bmin_k = tl.load(BMIN + bh * nB + Kb)
    idx = tl.arange(0, CB)
    acc = tl.zeros([CB, CB], tl.float32)
    carry_b = FAR
    for i0 in range(Kb + 1, nB, CB):
        ic = i0 + idx  # ascending I
        i_ok = ic < nB
        x_i = tl.load(BMIN + bh * nB + ic - 1, mask=i_ok, other=FAR)  # bmin[I - 1]
        eb = tl.exp(tl.minimum(tl.associative_scan(x_i, 0, _min_combine), carry_b) - bmin_k)
        if RANGE or SEG:
            jlo_i = _walk_start(JKEEP, JLO, bh, b, nB, ic, i_ok, RANGE)
        carry_a = FAR
        for c0 in range(0, Kb, CB):
            jr = Kb - 1 - c0 - idx  # descending J
            j_ok = jr >= 0
            x_j = tl.load(BMIN + bh * nB + jr + 1, mask=j_ok, other=FAR)  # bmin[J + 1]
            ea = tl.exp(tl.minimum(tl.associative_scan(x_j, 0, _min_combine), carry_a) - bmin_k)
            kmask = j_ok[:, None] & i_ok[None, :]
            if RANGE or SEG:
                kmask = kmask & (jr[:, None] >= jlo_i[None, :])
            kap = tl.load(KAPPA + (bh * nB + jr[:, None]) * nB + ic[None, :], mask=kmask, other=0.0)
            acc += kap * tl.minimum(ea[:, None], eb[None, :])
            carry_a = tl.minimum(carry_a, tl.min(x_j, axis=0))
        carry_b = tl.minimum(carry_b, tl.min(x_i, axis=0))
    y = tl.sum(tl.sum(acc, axis=1), axis=0)

    # key-suffix sums of this block, a_s = sum over query blocks I > K, CB partial rows a load (one at a time, each
    # program waited on one row's memory latency after another); a fixed order: chunks ascending, a fixed tree inside
    a = tl.zeros([BS], tl.float32)
    i_hi = nB - 1
    if SEG:
        i_hi = tl.load(IHI + b * nB + Kb)
    for i0 in range(Kb + 1, i_hi + 1, CB):
        ic = i0 + idx  # ascending I
        rows_ok = ic <= i_hi
        if RANGE or SEG:  # a walk that stopped above block K wrote no row for it
            rows_ok = rows_ok & (_walk_start(JKEEP, JLO, bh, b, nB, ic, rows_ok, RANGE) <= Kb)
        a += tl.sum(tl.load(A_PARTIAL + (bh * nB + ic[:, None]) * Tp + offs[None, :], mask=rows_ok[:, None],
                            other=0.0), axis=0)
    c = tl.load(CSUM + fbase + offs)
    suf = tl.load(SUF + fbase + offs)
    pre = tl.load(PRE + fbase + offs)
    u = tl.arange(0, BS)
    # tiles [u, s] and [u, t]
    wa = tl.where(u[:, None] > u[None, :], a[None, :] * tl.exp(tl.minimum(suf[None, :] - phi[:, None], 0.0)), 0.0)
    wc = tl.where(u[None, :] >= u[:, None], c[None, :] * tl.exp(tl.minimum(pre[None, :] - phi[:, None], 0.0)), 0.0)
    tl.store(DPHI + fbase + offs, dphi + y * tl.exp(bmin_k - phi) + tl.sum(wa + wc, axis=1))
