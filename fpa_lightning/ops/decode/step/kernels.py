"""Triton kernels of the decoding step's ops (fused.py is the public entry point; naive.py the definitions).

    add_rms_norm     grid (rows,): one row of C values, the sum (a copy of x without delta) and the norm in one
                     pass (C ≤ BLOCK_C).
    silu_mul         grid (rows, F / BLOCK): silu(gate) rounded to the output dtype, times up, as torch's two ops.
    store_token      grid (B, H): one (row, head): its slot (the position, or the first free one found by a scan of
                     key_pos), RoPE of q and k from the position's table rows, the k, v and position writes and, for
                     FPA, the gate map's three dot products over C, the walk, and the new key's level and path minimum.
    step_attention   grid (B·H, SPLITS) + ops/decode's combine kernel: split-K flash-decoding whose visibility comes
                     from key_pos (no mask tensor) and, for FPA, whose bias, path-minimum update and eviction are
                     made slot by slot in the pass that reads the keys (no (B, H, S) bias tensor).

Every program owns its slots (store_token: one (row, head); step_attention: one split of one (row, head)), so the
in-place writes never race. Strides address q, k, v and the caches (the last dimension is contiguous); the small
per-row tensors (positions, walk, phi, slots) are contiguous.
"""
from __future__ import annotations

import triton
import triton.language as tl

from fpa_lightning.ops import common
from fpa_lightning.ops.decode.kernels import online_softmax_block, split_start, store_split
from fpa_lightning.ops.fpa.step.kernels import gate_map, softplus, step_bias

FREE = tl.constexpr(common.FREE)  # a free slot's key_pos
FAR = tl.constexpr(common.FAR)  # the path minimum of an empty range


@triton.jit
def _add_rms_norm_kernel(X, DELTA, W, SUM, OUT, C, eps, BLOCK_C: tl.constexpr, HAS_DELTA: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_C)
    ok = offs < C
    x = tl.load(X + row * C + offs, mask=ok, other=0.0)
    if HAS_DELTA:  # the sum rounds to the stream's dtype, as torch's x + delta does
        x = (x.to(tl.float32) + tl.load(DELTA + row * C + offs, mask=ok, other=0.0).to(tl.float32))
        x = x.to(SUM.dtype.element_ty)
    tl.store(SUM + row * C + offs, x, mask=ok)  # without delta a copy of x: the op's outputs never alias its input
    wide = x.to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(wide * wide, axis=0) / C + eps)
    w = tl.load(W + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(OUT + row * C + offs, (wide * inv_rms * w).to(OUT.dtype.element_ty), mask=ok)


@triton.jit
def _silu_mul_kernel(X, OUT, F, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < F
    gate = tl.load(X + row * 2 * F + offs, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(X + row * 2 * F + F + offs, mask=ok, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(OUT.dtype.element_ty).to(tl.float32)
    tl.store(OUT + row * F + offs, (silu * up).to(OUT.dtype.element_ty), mask=ok)


@triton.jit
def _rope_half(first, second, TAB_COS, TAB_SIN, offs_h, HALF: tl.constexpr):
    """Rotate-half RoPE of a head's halves (fp32) by the table rows at TAB_COS / TAB_SIN (a position's row)."""
    cos1 = tl.load(TAB_COS + offs_h)
    cos2 = tl.load(TAB_COS + HALF + offs_h)
    sin1 = tl.load(TAB_SIN + offs_h)
    sin2 = tl.load(TAB_SIN + HALF + offs_h)
    return first * cos1 + (-second) * sin1, second * cos2 + first * sin2


@triton.jit
def _store_token_kernel(
    QKV, POS, COS, SIN, KC, VC, KP, Q_OUT, K_OUT, SLOTS,
    GW, GB, X, WALK, LEVEL, PMIN, PHI,
    s_xb, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_pb, s_ph, s_tab, s_lb, s_lh, s_mb, s_mh,
    H, S, C,
    D: tl.constexpr, HAS_ROPE: tl.constexpr, APPEND: tl.constexpr, BLOCK_S: tl.constexpr,
    FPA: tl.constexpr, MAPS: tl.constexpr, BLOCK_C: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    b64 = b.to(tl.int64)
    HALF: tl.constexpr = D // 2
    # Every load comes before the first store: the compiler cannot move a load past a store that may alias it, so a
    # load after the cache writes would add its latency to the kernel's.
    if FPA:
        walk, phi, psi = gate_map(GW, GB, X, WALK, b64, h, H, C, MAPS, BLOCK_C)
    pos = tl.load(POS + b)  # int64
    kp_base = KP + b64 * s_pb + h * s_ph
    if APPEND:
        slot = pos
    else:  # the first free slot: the smallest index holding FREE
        slot = tl.full((), S, tl.int64)
        for start in range(0, S, BLOCK_S):
            offs_s = start + tl.arange(0, BLOCK_S)
            kp = tl.load(kp_base + offs_s, mask=offs_s < S, other=0)
            slot = tl.minimum(slot, tl.min(tl.where(kp == FREE, offs_s, S), axis=0).to(tl.int64))
    offs_h = tl.arange(0, HALF)
    head = QKV + b64 * s_xb + h * D
    q1 = tl.load(head + offs_h).to(tl.float32)
    q2 = tl.load(head + HALF + offs_h).to(tl.float32)
    k1 = tl.load(head + H * D + offs_h).to(tl.float32)
    k2 = tl.load(head + H * D + HALF + offs_h).to(tl.float32)
    v1 = tl.load(head + 2 * H * D + offs_h)
    v2 = tl.load(head + 2 * H * D + HALF + offs_h)
    if HAS_ROPE:
        q1, q2 = _rope_half(q1, q2, COS + pos * s_tab, SIN + pos * s_tab, offs_h, HALF)
        k1, k2 = _rope_half(k1, k2, COS + pos * s_tab, SIN + pos * s_tab, offs_h, HALF)
    dtype = Q_OUT.dtype.element_ty
    q_out = Q_OUT + (b64 * H + h) * D  # (B, H, D), as K_OUT
    k_out = K_OUT + (b64 * H + h) * D
    tl.store(q_out + offs_h, q1.to(dtype))
    tl.store(q_out + HALF + offs_h, q2.to(dtype))
    tl.store(k_out + offs_h, k1.to(dtype))
    tl.store(k_out + HALF + offs_h, k2.to(dtype))
    k_slot = KC + b64 * s_kb + h * s_kh + slot * s_ks
    v_slot = VC + b64 * s_vb + h * s_vh + slot * s_vs
    tl.store(k_slot + offs_h, k1.to(KC.dtype.element_ty))
    tl.store(k_slot + HALF + offs_h, k2.to(KC.dtype.element_ty))
    tl.store(v_slot + offs_h, v1.to(VC.dtype.element_ty))
    tl.store(v_slot + HALF + offs_h, v2.to(VC.dtype.element_ty))
    tl.store(kp_base + slot, pos.to(tl.int32))
    tl.store(SLOTS + b64 * H + h, slot)
    if FPA:
        tl.store(WALK + b64 * H + h, walk)
        tl.store(PHI + b64 * H + h, phi)
        tl.store(LEVEL + b64 * s_lb + h * s_lh + slot, psi)
        tl.store(PMIN + b64 * s_mb + h * s_mh + slot, FAR)


@triton.jit
def _step_attn_partial_kernel(
    Q, K, V, KP, POS, PMIN, LEVEL, PHI, BETA_RAW, M, L, ACC,
    s_qb, s_qh, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_pb, s_ph, s_mb, s_mh, s_lb, s_lh,
    H, S, CHUNK, SPLITS, scale, threshold,
    D: tl.constexpr, BLOCK_S: tl.constexpr, FPA: tl.constexpr, EVICT: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    b = row // H
    h = row % H
    b64 = b.to(tl.int64)  # the cache of a long context can pass 2^31 elements
    t = tl.load(POS + b)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b64 * s_qb + h * s_qh + offs_d).to(tl.float32) * scale
    k_base = K + b64 * s_kb + h * s_kh
    v_base = V + b64 * s_vb + h * s_vh
    kp_base = KP + b64 * s_pb + h * s_ph
    pm_base = PMIN + b64 * s_mb + h * s_mh
    lv_base = LEVEL + b64 * s_lb + h * s_lh
    if FPA:
        phi = tl.load(PHI + b64 * H + h)
        beta = softplus(tl.load(BETA_RAW + h))
    lo, hi, m_i, l_i, acc = split_start(split, CHUNK, S, D)
    for start in range(lo, hi, BLOCK_S):
        offs_s = start + tl.arange(0, BLOCK_S)
        ok = offs_s < hi
        # the block's stores come last: a load after a store that may alias it cannot be issued early
        kp = tl.load(kp_base + offs_s, mask=ok, other=FREE)
        k = tl.load(k_base + offs_s[:, None] * s_ks + offs_d[None, :], mask=ok[:, None], other=0.0)
        if FPA:
            m_old = tl.load(pm_base + offs_s, mask=ok, other=FAR)
            level = tl.load(lv_base + offs_s, mask=ok, other=0.0)
        seen = (kp != FREE) & (kp <= t)
        s = tl.sum(k.to(tl.float32) * q[None, :], axis=1)  # (BLOCK_S,) fp32
        if FPA:
            older = kp < t  # the query moves every key older than itself (free slots too: they are rewritten)
            m, moved, bias = step_bias(phi, m_old, level, beta, ok & older)
            if EVICT:
                gone = seen & older & (bias < threshold)
                seen = seen & (gone == 0)
            s += bias
        s = tl.where(seen, s, float("-inf"))
        v = tl.load(v_base + offs_s[:, None] * s_vs + offs_d[None, :], mask=ok[:, None], other=0.0)
        m_i, l_i, acc = online_softmax_block(s, v, m_i, l_i, acc)
        if FPA:
            tl.store(pm_base + offs_s, m, mask=moved)
            if EVICT:
                tl.store(kp_base + offs_s, tl.full([BLOCK_S], FREE, tl.int32), mask=ok & gone)
    store_split(M, L, ACC, row, split, SPLITS, m_i, l_i, acc, offs_d, D)
