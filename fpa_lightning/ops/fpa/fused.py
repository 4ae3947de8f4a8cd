"""Fused FPA attention (Triton): the fast path of `naive_fpa_attention`, same signature and semantics.

    fpa_attention(q, k, v, phi, psi, beta, *, scale=None, reduction="min", level="key", segment_ids=None,
                  skip_threshold=None) -> (B, T, H, D)

q, k, v: (B, T, H, D) in bf16/fp16 (fp32 allowed); phi, psi: (B, T, H) fp32; beta: (H,) fp32.
Causal; exact range-minimum (or dip-sum) forward; straight-through soft-minimum backward (τ = 1) with
gradients for q, k, v, phi, psi and beta. Every variant of docs/method.md is fused: `reduction` "min" or
"dipsum", `level` "key" or "query" (the "none" level and the stack form are key levels computed upstream).
`segment_ids` (B, T) masks attention across documents. `skip_threshold` (a negative float, e.g. -10; None =
off) skips every (query block, key block) tile whose bias is provably below it, in forward and backward.

Layout follows fla: input checks here (shared ones in ops/kernel_inputs.py), the forward's and the backward's launches
as two functions, called by one autograd.Function (and its vmap-capable form) and, under torch.compile, by two custom
ops that the compiled graph holds (docs/training.md, "torch.compile"); kernels in kernels.py.
"""
from __future__ import annotations

import functools
import math

import torch

from fpa_lightning.ops.fpa.naive import check_skip_threshold, check_variant
from fpa_lightning.ops.kernel_inputs import HEAD_DIMS, cdiv, empty_output, next_power_of_2, require_triton
from fpa_lightning.ops.kernel_inputs import TRITON_OPTIONS, outputs_setup_context, register_op_autograd
from fpa_lightning.ops.kernel_inputs import unit_last_stride
from fpa_lightning.ops.kernel_inputs import check_device, check_qkv, check_scale, check_segment_ids, env_int
from fpa_lightning.ops.kernel_inputs import with_env_overrides
from fpa_lightning.ops.kernel_inputs import interpreting as _interpreting

def _block_size() -> int:
    """Rows and columns of a tile: 64 on the GPU, 16 in the interpreter (its tests stay tiny)."""
    return 16 if _interpreting() else 64


def _chunk() -> int:
    """Blocks per vector step in the scalar passes over block minima (J1 and the middle sums); tiny in
    the interpreter so that its small tests cross chunk boundaries."""
    return 4 if _interpreting() else 32


# One warpgroup (4 warps) per 64-row tile everywhere: at 8 warps Triton lays 64-row tiles out as
# warpsPerCTA [8, 1], so both warpgroups would compute the same elements (KERNEL_LOG.md, "FPA, the fused kernel", v5).
# Stages: 3 for the forward and dq kernels, 2 for dk/dv (H200 A/B, KERNEL_LOG.md, "FPA, the fused kernel", v7).
_LAUNCH = {
    "fwd": {"num_warps": 4, "num_stages": 3},
    "dq": {"num_warps": 4, "num_stages": 3},
    "dkdv": {"num_warps": 4, "num_stages": 2},
    # the field kernel's warps wait on memory, and uncapped only two blocks fit an SM: under the cap four fit, and it
    # runs faster though it spills outside its loops (KERNEL_LOG.md, "FPA, the fused kernel", v9.11)
    "field": {"num_warps": 4, "num_stages": 3, "maxnreg": 128},
    "dip_carry": {"num_warps": 4, "num_stages": 2},
    "dipsum_bwd": {"num_warps": 4, "num_stages": 2},
    "dphi_sum": {"num_warps": 1, "num_stages": 2},
}
# With skipping (KERNEL_LOG.md, "FPA, the fused kernel", v8): the backward tiles run as two sub-tiles of 32 keys (dq)
# or 32 queries (dk/dv), whose temporaries die in turn, under a register cap of 168, so three blocks fit on an SM. On
# the H200 this made fwd+bwd with skipping faster at every length; without skipping the same change gained nothing, so
# dense keeps v7's. dq's transposed tile (key level, min, no documents) keeps dense's launch with skipping too.
_LAUNCH_SKIP = {
    "dq": {"num_warps": 4, "num_stages": 2, "maxnreg": 168},
    "dkdv": {"num_warps": 4, "num_stages": 2, "maxnreg": 168},
}
_SUBTILES_SKIP = {"dq": 2, "dkdv": 2}


def _launch_cfg(kernel: str, constexprs: dict) -> dict:
    """Launch config of a kernel ("fwd", "dq", "dkdv", ...) with these compile-time parameters (skipping's launch
    where they say SKIP, except dq's transposed tile). FPA_<KERNEL>_{WARPS,STAGES,MAXNREG} override it for A/B
    benchmarks (MAXNREG=0 removes a cap); nothing else reads them."""
    if _interpreting():
        return {}
    skip_launch = constexprs.get("SKIP", False) and not constexprs.get("TRANSPOSED", False)
    cfg = dict(_LAUNCH_SKIP.get(kernel, _LAUNCH[kernel]) if skip_launch else _LAUNCH[kernel])
    with_env_overrides(cfg, f"FPA_{kernel.upper()}", (("num_warps", "WARPS"), ("num_stages", "STAGES"),
                                                      ("maxnreg", "MAXNREG")))
    if not cfg.get("maxnreg"):
        cfg.pop("maxnreg", None)
    return cfg


def _subtiles(kernel: str, skip: bool) -> int:
    """Sub-tiles per 64-wide tile of the dq ("dq") or dk/dv ("dkdv") kernel; FPA_<KERNEL>_SUBTILES for A/B only.
    dq's transposed tile is never split, so FPA_DQ_SUBTILES reaches only the query level and documents."""
    value = env_int(f"FPA_{kernel.upper()}_SUBTILES")
    return value if value is not None else (_SUBTILES_SKIP[kernel] if skip else 1)


@functools.cache
def load_kernels():
    """kernels.py, imported at the first launch: its @triton.jit kernels need triton, which the naive and chunked
    paths (and so the package, and an export's remote code) do without (``kernel_inputs.require_triton``)."""
    require_triton("fpa_attention")
    from fpa_lightning.ops.fpa import kernels
    return kernels


_KERNELS = {  # the kernels of kernels.py by role
    "dip_carry": "_fpa_dip_carry_kernel",
    "fwd": "_fpa_fwd_kernel",
    "dq": "_fpa_bwd_dq_kernel",
    "dkdv": "_fpa_bwd_dkdv_kernel",
    "field": "_fpa_field_kernel",
    "dipsum_bwd": "_fpa_bwd_dipsum_kernel",
    "dphi_sum": "_fpa_dphi_sum_kernel",
}


def _kernel(name: str):
    """The @triton.jit kernel of a role in ``_KERNELS``."""
    return getattr(load_kernels(), _KERNELS[name])


def _constexprs(D: int, dtype: torch.dtype, *, skip: bool, level: str, reduction: str, segments: bool) -> dict:
    """The compile-time parameters of every kernel for one variant: the single source for launches and for the
    offline compile statistics (benchmarks/kernel_offline.py)."""
    BS = _block_size()
    # float32 inputs (the probe path's pass, float32 training) take three TF32 products a product (tf32x3) on the
    # tensor cores: IEEE products run on the FMA units and spill in every kernel (KERNEL_LOG.md, "FPA, the fused
    # kernel")
    prec = "tf32x3" if dtype == torch.float32 else "tf32"
    qlevel, dipsum = level == "query", reduction == "dipsum"
    common = {"BS": BS, "D": D, "SKIP": skip, "PREC": prec, "SEG": segments}
    # skipping's walk ranges (docs/kernel.md §3): the method's variant (min, key level) walks only the key blocks
    # (query blocks) that a per-block bound cannot rule out
    walk_range = skip and not (qlevel or dipsum)
    # the transposed off-diagonal tile (kernels._dq_tile_t) where it is faster: key level, min, no documents
    # (docs/kernel.md §2); with skipping too, a kept tile whole on dense's launch
    transposed = not (qlevel or dipsum or segments)
    return {
        "dip_carry": {"BS": BS, "SEG": segments},
        "fwd": {**common, "STORE32": True, "QLEVEL": qlevel, "DIPSUM": dipsum, "RANGE": walk_range, "CB": _chunk()},
        "dq": {**common, "FAST": not _interpreting(), "CB": _chunk(),
               "NSUB": 1 if transposed else _subtiles("dq", skip),
               "QLEVEL": qlevel, "DIPSUM": dipsum, "TRANSPOSED": transposed, "RANGE": walk_range},
        "dkdv": {**common, "MSUB": _subtiles("dkdv", skip), "QLEVEL": qlevel, "RANGE": walk_range, "CB": _chunk()},
        "field": {"BS": BS, "D": D, "CB": _chunk(), "PREC": prec, "QLEVEL": qlevel, "SEG": segments,
                  "RANGE": walk_range},
        "dipsum_bwd": common,
        "dphi_sum": {"BS": BS, "SEG": segments},
    }


def _kernels_of(reduction: str) -> tuple[str, ...]:
    """The kernels one call runs, in launch order (forward, then backward)."""
    if reduction == "dipsum":
        return ("dip_carry", "fwd", "dq", "dipsum_bwd", "dphi_sum")
    return ("fwd", "dq", "dkdv", "field")


def kernel_plan(D: int = 64, *, skip: bool = False, level: str = "key", reduction: str = "min",
                segments: bool = False, dtype: torch.dtype = torch.bfloat16) -> list[tuple[str, object, dict, dict]]:
    """[(name, kernel, constexprs, launch config)] of one variant, as `fpa_attention` launches them (the prep
    kernel aside): what benchmarks/kernel_offline.py compiles."""
    cx = _constexprs(D, dtype, skip=skip, level=level, reduction=reduction, segments=segments)
    return [(name, _kernel(name), cx[name], _launch_cfg(name, cx[name]) or _LAUNCH[name])
            for name in _kernels_of(reduction)]


def _launch(name: str, grid, cx: dict, *args, **overrides) -> None:
    _kernel(name)[grid](*args, **{**cx[name], **overrides}, **_launch_cfg(name, cx[name]), **TRITON_OPTIONS)


def _prep(phi, psi, BS) -> torch.Tensor:
    """Per-block field quantities in one padded fp32 buffer (`_prep_views` names its parts): phi, psi, suffix/prefix
    minima and their normalisers, block minima, their normalisers, the minimum of each block's suffix minima and each
    block's lowest psi (the backward's ten); and, for the forward alone, the key side of the bias min(0, suf - psi)."""
    B, T, H = phi.shape
    nB = cdiv(T, BS)
    Tp = nB * BS
    BH = B * H
    # one allocation: host overhead matters at short T, where the kernels are short (KERNEL_LOG.md, "FPA, the fused
    # kernel", v6)
    flat = empty_output((_prep_numel(BH, Tp, nB),), dtype=torch.float32, device=phi.device)
    (phip, psip, suf, zsuf, pre, zpre, bmin, zblk, minsuf, minpsi), asuf = _prep_views(flat, BH, Tp, nB)
    load_kernels()._fpa_prep_kernel[(nB, BH)](
        phi, psi, phi.stride(0), phi.stride(1), phi.stride(2),
        phip, psip, suf, zsuf, pre, zpre, asuf, bmin, zblk, minsuf, minpsi,
        T, H, Tp, nB, BS=BS, **({} if _interpreting() else {"num_warps": 1}), **TRITON_OPTIONS,
    )
    return flat


def _prep_numel(BH: int, Tp: int, nB: int) -> int:
    return 7 * BH * Tp + 4 * BH * nB


def _prep_views(flat: torch.Tensor, BH: int, Tp: int, nB: int):
    """`_prep`'s buffer as (the backward's ten tables, asuf): seven (B*H, Tp) rows, then four (B*H, nB)."""
    phip, psip, suf, zsuf, pre, zpre, asuf = flat[: 7 * BH * Tp].view(7, BH, Tp).unbind(0)
    bmin, zblk, minsuf, minpsi = flat[7 * BH * Tp:].view(4, BH, nB).unbind(0)
    return (phip, psip, suf, zsuf, pre, zpre, bmin, zblk, minsuf, minpsi), asuf


def segment_tables_reference(segment_ids: torch.Tensor, BS: int, nB: int):
    """Document ids padded to (B, Tp) int32, and per block the walk bounds (B, nB) int32 of docs/kernel.md §3, in
    torch (the reference of `_segment_tables`, which makes them in one launch):
    jlo[I] = the lowest key block that can share a document with query block I, ihi[J] = the highest query block
    that can share one with key block J. Both hold for any ids (from block minima and maxima); for contiguous
    documents they are tight. No host synchronisation."""
    B, T = segment_ids.shape
    Tp = nB * BS
    seg = segment_ids.to(torch.int32)
    if Tp > T:  # padding repeats the last id: block minima and maxima stay those of the real positions
        seg = torch.cat([seg, seg[:, -1:].expand(B, Tp - T)], dim=1)
    seg = seg.contiguous()
    blocks = seg.view(B, nB, BS)
    smin, smax = blocks.amin(dim=-1), blocks.amax(dim=-1)  # (B, nB)
    # key block J can hold query block I's ids only if smax[J] >= smin[I]: the first J where the running max reaches it
    jlo = torch.searchsorted(smax.cummax(dim=-1).values.contiguous(), smin.contiguous(), side="left")
    # query block I can hold key block J's ids only if smin[I] <= smax[J]: the last I whose suffix minimum allows it
    suffix_min = smin.flip(-1).cummin(dim=-1).values.flip(-1).contiguous()
    ihi = torch.searchsorted(suffix_min, smax.contiguous(), side="right") - 1
    return seg, jlo.to(torch.int32).contiguous(), ihi.to(torch.int32).contiguous()


def _segment_tables(segment_ids: torch.Tensor, BS: int, nB: int):
    """`segment_tables_reference`'s tables by one kernel launch per call instead of a dozen small torch operations
    (their launches were a visible share of a short forward with documents): the same (B, Tp) ids, and both (B, nB)
    bounds in one (2, B, nB) tensor (jlo, ihi)."""
    B, T = segment_ids.shape
    Tp = nB * BS
    seg = empty_output((B, Tp), dtype=torch.int32, device=segment_ids.device)
    bounds = empty_output((2, B, nB), dtype=torch.int32, device=segment_ids.device)
    stats = empty_output((B, 4, nB), dtype=torch.int32, device=segment_ids.device)
    steps = max(1, nB.bit_length())  # binary-search halvings: 2**steps > nB
    load_kernels()._fpa_segment_tables_kernel[(B,)](
        segment_ids, segment_ids.stride(0), segment_ids.stride(1), seg, stats, bounds[0], bounds[1], T, Tp, nB, steps,
        BS=BS, CB=min(64, max(2, next_power_of_2(nB))), **({} if _interpreting() else {"num_warps": 4}),
        **TRITON_OPTIONS)
    return seg, bounds


def _dip_carry(phip, psip, ihi, B, H, Tp, nB, cx):
    """Dip-sum's CARRY table (B*H, nB, Tp): C[I, s] = sum over s < u < start of block I of min(0, phi_u - psi_s),
    written for key blocks J < I (up to ihi[J] with segments; without, ihi is any tensor and unread)."""
    carry = empty_output((B * H, nB, Tp), dtype=torch.float32, device=phip.device)
    _launch("dip_carry", (nB, B * H), cx, phip, psip, carry, ihi, H, Tp, nB)
    return carry


def _forward(q, k, v, phi, psi, beta, scale, skip_threshold, reduction, level, segment_ids, store32):
    """The forward's launches: o (B, T, H, D) and what the backward reads, (o32, lse, prep, seg, bounds): the fp32
    output (B*H, Tp, D) (an empty tensor unless store32), the row log-sum-exp (B*H, Tp), `_prep`'s buffer, and the
    document tables of `_segment_tables` (empty tensors without documents)."""
    q, k, v = unit_last_stride(q, k, v)
    phi, psi = phi.contiguous(), psi.contiguous()  # one set of strides serves phi and psi in the kernels
    B, T, H, D = q.shape
    BS = _block_size()
    nB = cdiv(T, BS)
    Tp = nB * BS
    skip = skip_threshold is not None
    seg, bounds = _segment_tables(segment_ids, BS, nB) if segment_ids is not None else (q.new_empty(0), q.new_empty(0))
    cx = _constexprs(D, q.dtype, skip=skip, level=level, reduction=reduction, segments=segment_ids is not None)
    prep = _prep(phi, psi, BS)
    (phip, psip, suf, _, pre, _, bmin, _, _, minpsi), asuf = _prep_views(prep, B * H, Tp, nB)
    o = empty_output((B, T, H, D), dtype=q.dtype, device=q.device)
    lse = empty_output((B * H, Tp), dtype=torch.float32, device=q.device)
    o32 = empty_output((B * H, Tp, D) if store32 else (0,), dtype=torch.float32, device=q.device)
    jlo, ihi = bounds.unbind(0) if segment_ids is not None else (lse, lse)  # unread without documents
    segp = seg if segment_ids is not None else lse
    # the dip-sum table is recomputed in the backward rather than kept: it is (B*H, nB, Tp)
    carry = _dip_carry(phip, psip, ihi, B, H, Tp, nB, cx) if reduction == "dipsum" else lse
    _launch(
        "fwd", (nB, B * H), cx,
        q, k, v, o, o32 if store32 else lse, lse,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
        phip, psip, suf, asuf, pre, bmin, minpsi, carry, segp, jlo, beta,
        T, H, Tp, nB, scale, float(skip_threshold) if skip else 0.0, STORE32=store32,
    )
    return o, (o32, lse, prep, seg, bounds)


def _backward(do, q, k, v, beta, o32, lse, prep, seg, bounds, scale, skip_threshold, reduction, level):
    """The backward's launches from what `_forward` kept: (dq, dk, dv, dphi, dpsi, dbeta), dphi and dpsi (B, T, H) in
    (B, H, T) strides."""
    q, k, v = unit_last_stride(q, k, v)  # as `_forward` read them
    B, T, H, D = q.shape
    BS = _block_size()
    nB = cdiv(T, BS)
    Tp = nB * BS
    BH = B * H
    dev = q.device
    segments = seg.numel() > 0
    skip = skip_threshold is not None
    cx = _constexprs(D, q.dtype, skip=skip, level=level, reduction=reduction, segments=segments)
    threshold = float(skip_threshold) if skip else 0.0
    dipsum = reduction == "dipsum"
    (phip, psip, suf, zsuf, pre, zpre, bmin, zblk, minsuf, minpsi), _ = _prep_views(prep, BH, Tp, nB)
    jlo, ihi = bounds.unbind(0) if segments else (lse, lse)
    segp = seg if segments else lse
    (do,) = unit_last_stride(do)
    dq = empty_output(q.shape, dtype=q.dtype, device=dev)
    dk = empty_output(k.shape, dtype=k.dtype, device=dev)
    dv = empty_output(v.shape, dtype=v.dtype, device=dev)
    delta = empty_output((BH, Tp), dtype=torch.float32, device=dev)
    # min: a_s partials per (query block I, key position s), only J < I written and read;
    # dip-sum: dphi partials per (key block J, position u), only J <= block of u
    partial = empty_output((BH, nB, Tp), dtype=torch.float32, device=dev)
    csum = empty_output((BH, Tp), dtype=torch.float32, device=dev) if not dipsum else lse
    kappa = empty_output((BH, nB, nB), dtype=torch.float32, device=dev) if not dipsum else lse
    # with skipping's walk ranges: where each query block's walk stopped, for the field kernel
    jkeep = empty_output((BH, nB), dtype=torch.int32, device=dev) if cx["dq"]["RANGE"] else lse
    carry = _dip_carry(phip, psip, ihi, B, H, Tp, nB, cx) if dipsum else lse
    dphi = empty_output((BH, Tp), dtype=torch.float32, device=dev)
    dpsi = empty_output((BH, Tp), dtype=torch.float32, device=dev)
    dbeta = empty_output((BH, Tp), dtype=torch.float32, device=dev)
    qkv_strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                   v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2))
    dkdv_strides = (dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2))
    _launch(
        "dq", (nB, BH), cx,
        q, k, v, do, dq, *qkv_strides, dq.stride(0), dq.stride(1), dq.stride(2),
        lse, o32, delta, phip, psip, suf, zsuf, pre, zpre, bmin, zblk, minsuf, minpsi, carry, segp, jlo, beta,
        csum, partial, kappa, jkeep, dpsi, dbeta,
        T, H, Tp, nB, scale, threshold,
    )
    if dipsum:
        _launch(
            "dipsum_bwd", (nB, BH), cx,
            q, k, v, do, dk, dv, *qkv_strides, *dkdv_strides,
            lse, delta, phip, psip, carry, segp, ihi, beta, dpsi, dbeta, partial,
            T, H, Tp, nB, scale, threshold,
        )
        _launch("dphi_sum", (nB, BH), cx, partial, ihi, dphi, H, Tp, nB)
    else:
        _launch(
            "dkdv", (nB, BH), cx,
            q, k, v, do, dk, dv, *qkv_strides, *dkdv_strides,
            lse, delta, phip, psip, suf, pre, bmin, segp, ihi, beta, dpsi, dbeta,
            T, H, Tp, nB, scale, threshold,
        )
        _launch(
            "field", (nB, BH), cx,
            q, k, v, do, *qkv_strides,
            lse, delta, phip, psip, suf, pre, bmin, segp, jlo, ihi, jkeep, beta, kappa, csum, partial, dphi,
            T, H, Tp, nB, scale,
        )
    dphi_out = dphi.view(B, H, Tp)[:, :, :T].permute(0, 2, 1)
    dpsi_out = dpsi.view(B, H, Tp)[:, :, :T].permute(0, 2, 1)
    dbeta_out = dbeta.view(B, H, Tp)[:, :, :T].sum(dim=(0, 2))
    return dq, dk, dv, dphi_out, dpsi_out, dbeta_out.to(beta.dtype)


def _save_for_backward(ctx, inputs, kept) -> None:
    """On ctx, what `_backward` reads after ``do``: q, k, v and beta of `_forward`'s `inputs`, the tensors it `kept`,
    and the variant (ctx.cfg)."""
    q, k, v, _, _, beta, scale, skip_threshold, reduction, level = inputs[:10]
    ctx.save_for_backward(q, k, v, beta, *kept)
    ctx.cfg = (scale, skip_threshold, reduction, level)


def _save_outputs(ctx, inputs, output) -> None:
    """`_save_for_backward` in the forms whose forward returns (o, *kept): `_FPAVmappable` and the custom op."""
    _save_for_backward(ctx, inputs, output[1:])


class _FPAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, phi, psi, beta, scale, skip_threshold, reduction, level, segment_ids):
        store32 = any(ctx.needs_input_grad[:6])
        o, kept = _forward(q, k, v, phi, psi, beta, scale, skip_threshold, reduction, level, segment_ids, store32)
        _save_for_backward(ctx, (q, k, v, phi, psi, beta, scale, skip_threshold, reduction, level), kept)
        return o

    @staticmethod
    def backward(ctx, do):
        return (*_backward(do, *ctx.saved_tensors, *ctx.cfg), None, None, None, None, None)


class _FPAVmappable(torch.autograd.Function):
    """`_FPAFunction` in the ``setup_context`` form, which ``torch.func.vmap`` requires, with a vmap rule: the mapped
    axis folds into the heads (every (batch, head) pair is an independent program), so a vmapped model (the probes'
    ``SeedEnsemble``, seeds stacked) runs one launch for all its copies. The same forward and backward code: the
    buffers the backward needs leave the forward as extra, non-differentiable outputs. Used only under a functorch
    transform; plain calls keep `_FPAFunction`, without the extra outputs' overhead."""

    @staticmethod
    def forward(q, k, v, phi, psi, beta, scale, skip_threshold, reduction, level, segment_ids, store32):
        o, kept = _forward(q, k, v, phi, psi, beta, scale, skip_threshold, reduction, level, segment_ids, store32)
        return (o, *kept)

    setup_context = staticmethod(outputs_setup_context(_save_outputs))

    @staticmethod
    def backward(ctx, do, *_buffers):  # _buffers: (zero) gradients of the non-differentiable outputs
        return (*_backward(do, *ctx.saved_tensors, *ctx.cfg), None, None, None, None, None, None)

    @staticmethod
    def vmap(info, in_dims, q, k, v, phi, psi, beta, scale, skip_threshold, reduction, level, segment_ids, store32):
        """The mapped axis (size E) becomes E times as many heads: q, k, v (E, B, T, H, D) -> (B, T, E*H, D);
        phi, psi (E, B, T, H) -> (B, T, E*H); beta (E, H) -> (E*H,). Document ids must be shared by the copies."""
        if in_dims[10] is not None:
            raise NotImplementedError("fpa_attention under vmap: segment_ids must be the same for every mapped "
                                      "copy (not mapped)")
        E = info.batch_size

        def leading(x, dim):  # the mapped axis first, a broadcast copy where x is not mapped
            return x.movedim(dim, 0) if dim is not None else x.expand(E, *x.shape)

        q, k, v, phi, psi, beta = (leading(x, d) for x, d in zip((q, k, v, phi, psi, beta), in_dims[:6]))
        H = q.shape[3]
        heads = lambda x: x.movedim(0, 2).flatten(2, 3)  # noqa: E731  (E, B, T, H, ...) -> (B, T, E*H, ...)
        # here the tensors are the real ones: whether the backward needs the float32 output can be read off them
        store32 = store32 or (torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, phi, psi, beta)))
        out = _FPAVmappable.apply(heads(q), heads(k), heads(v), heads(phi).contiguous(), heads(psi).contiguous(),
                                  beta.flatten().contiguous(), scale, skip_threshold, reduction, level, segment_ids,
                                  store32)
        o = out[0].unflatten(2, (E, H)).movedim(2, 0)  # (E, B, T, H, D)
        return (o, *out[1:]), (0,) + (None,) * (len(out) - 1)


# Under torch.compile the op is two torch.library custom ops, forward and backward, which Dynamo traces as single
# nodes: a compiled block then holds the attention instead of breaking its graph around it (docs/training.md,
# "torch.compile"). The schemas are spelled out so that they do not depend on how a torch version reads annotations.
@torch.library.custom_op(
    "fpa_lightning::fpa_forward", mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor v, Tensor phi, Tensor psi, Tensor beta, float scale, float? skip_threshold, "
           "str reduction, str level, Tensor? segment_ids, bool store32) -> (Tensor, Tensor, Tensor, Tensor, Tensor, "
           "Tensor)")
def fpa_forward_op(q, k, v, phi, psi, beta, scale, skip_threshold, reduction, level, segment_ids, store32):
    """`_forward` as one op: (o, o32, lse, prep, seg, bounds)."""
    o, kept = _forward(q, k, v, phi, psi, beta, scale, skip_threshold, reduction, level, segment_ids, store32)
    return (o, *kept)


@fpa_forward_op.register_fake
def _fpa_forward_shapes(q, k, v, phi, psi, beta, scale, skip_threshold, reduction, level, segment_ids, store32):
    B, T, H, D = q.shape
    nB = cdiv(T, _block_size())
    Tp, BH = nB * _block_size(), B * H
    f32 = {"dtype": torch.float32, "device": q.device}
    tables = {"dtype": torch.int32 if segment_ids is not None else q.dtype, "device": q.device}
    seg, bounds = ((B, Tp), (2, B, nB)) if segment_ids is not None else ((0,), (0,))
    o32 = torch.empty((BH, Tp, D) if store32 else (0,), **f32)
    lse, prep = torch.empty((BH, Tp), **f32), torch.empty((_prep_numel(BH, Tp, nB),), **f32)
    return q.new_empty((B, T, H, D)), o32, lse, prep, torch.empty(seg, **tables), torch.empty(bounds, **tables)


@torch.library.custom_op(
    "fpa_lightning::fpa_backward", mutates_args=(),
    schema="(Tensor do, Tensor q, Tensor k, Tensor v, Tensor beta, Tensor o32, Tensor lse, Tensor prep, Tensor seg, "
           "Tensor bounds, float scale, float? skip_threshold, str reduction, str level) -> (Tensor, Tensor, Tensor, "
           "Tensor, Tensor, Tensor)")
def fpa_backward_op(do, q, k, v, beta, o32, lse, prep, seg, bounds, scale, skip_threshold, reduction, level):
    """`_backward` as one op: (dq, dk, dv, dphi, dpsi, dbeta)."""
    return _backward(do, q, k, v, beta, o32, lse, prep, seg, bounds, scale, skip_threshold, reduction, level)


@fpa_backward_op.register_fake
def _fpa_backward_shapes(do, q, k, v, beta, o32, lse, prep, seg, bounds, scale, skip_threshold, reduction, level):
    B, T, H, _ = q.shape
    Tp = cdiv(T, _block_size()) * _block_size()
    field = {"size": (B, T, H), "stride": (H * Tp, 1, Tp), "dtype": torch.float32, "device": q.device}
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), torch.empty_strided(**field),
            torch.empty_strided(**field), beta.new_empty(beta.shape))


register_op_autograd(fpa_forward_op, fpa_backward_op, _save_outputs, n_inputs=12)


def _check(q, k, v, phi, psi, beta, scale, skip_threshold, reduction, level, segment_ids):
    fields = {"phi": phi, "psi": psi, "beta": beta}
    B, T, H, _ = check_qkv("fpa_attention", q, k, v, HEAD_DIMS, others=fields)
    if phi.shape != (B, T, H) or psi.shape != (B, T, H):
        raise ValueError(f"fpa_attention: phi and psi must be (B, T, H) = {(B, T, H)}, got "
                         f"{tuple(phi.shape)}, {tuple(psi.shape)}")
    if beta.shape != (H,):
        raise ValueError(f"fpa_attention: beta must be (H,) = ({H},), got {tuple(beta.shape)}")
    for name, t in fields.items():
        if t.dtype != torch.float32:
            raise ValueError(f"fpa_attention: {name} must be float32, got {t.dtype}")
    dev = check_device("fpa_attention", {"q": q, "k": k, "v": v, **fields})
    check_scale("fpa_attention", scale)
    check_skip_threshold("fpa_attention", skip_threshold)
    check_variant(reduction, level)
    check_segment_ids("fpa_attention", segment_ids, B, T, dev)


def fpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    phi: torch.Tensor,
    psi: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    reduction: str = "min",
    level: str = "key",
    segment_ids: torch.Tensor | None = None,
    skip_threshold: float | None = None,
) -> torch.Tensor:
    """Causal FPA attention, fused: q, k, v (B, T, H, D); phi, psi (B, T, H) fp32; beta (H,) fp32.

    Returns (B, T, H, D) in q's dtype. Same semantics as `naive_fpa_attention` (``reduction``, ``level``,
    ``segment_ids``: a query attends only to keys with its own id; ids are compared as int32, and contiguous
    documents, as in a packed row, let whole tiles be skipped). With ``skip_threshold`` (negative) tiles whose
    bias is provably below it are dropped. Runs under ``torch.func.vmap`` too (one launch for every mapped copy,
    `_FPAVmappable`), with document ids shared by the copies.
    """
    _check(q, k, v, phi, psi, beta, scale, skip_threshold, reduction, level, segment_ids)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    args = (q, k, v, phi, psi, beta.contiguous(), scale, skip_threshold, reduction, level, segment_ids)
    # whether the backward will need the float32 output; inside vmap the tensors do not report requires_grad, so the
    # vmap rule reads it off the real ones
    store32 = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, phi, psi, beta))
    if torch.compiler.is_compiling():
        return fpa_forward_op(*args, store32)[0]
    # the test autograd.Function.apply itself uses to route a call through functorch
    if torch._C._are_functorch_transforms_active():
        return _FPAVmappable.apply(*args, store32)[0]
    return _FPAFunction.apply(*args)
