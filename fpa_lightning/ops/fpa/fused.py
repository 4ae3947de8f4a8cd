"""Fused FPA attention (Triton): the fast path of `naive_fpa_attention`, same signature and semantics.

    fpa_attention(q, k, v, phi, psi, beta, *, scale=None, skip_threshold=None) -> (B, T, H, D)

q, k, v: (B, T, H, D) in bf16/fp16 (fp32 allowed); phi, psi: (B, T, H) fp32; beta: (H,) fp32.
Causal; exact range-minimum forward; straight-through soft-minimum backward (τ = 1) with gradients
for q, k, v, phi, psi and beta. `skip_threshold` (a negative float, e.g. -10; None = off) skips every
(query block, key block) tile whose bias is provably below the threshold, in forward and backward.

Layout follows fla: input checks here, one autograd.Function, kernels in kernels.py.
"""
from __future__ import annotations

import math
import os

import torch
import triton

from fpa_lightning.ops.fpa import kernels

HEAD_DIMS = (16, 32, 64, 128)
"""Head dims the kernels are built for (the attention backends refuse others for impl='fused')."""
QKV_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# Test hook, for tests only: when True, every output buffer starts as NaN, so an element a kernel forgets to
# write shows up in the result instead of hiding behind torch.empty's leftovers.
TEST_HOOK_POISON_OUTPUTS = False


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _block_size() -> int:
    """Rows and columns of a tile: 64 on the GPU, 16 in the interpreter (its tests stay tiny)."""
    return 16 if _interpreting() else 64


def _chunk() -> int:
    """Blocks per vector step in the scalar passes over block minima (J1 and the middle sums); tiny in
    the interpreter so that its small tests cross chunk boundaries."""
    return 4 if _interpreting() else 32


def _empty(shape, *, dtype, device):
    if TEST_HOOK_POISON_OUTPUTS:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


# One warpgroup (4 warps) per 64-row tile everywhere: at 8 warps Triton lays 64-row tiles out as
# warpsPerCTA [8, 1], so both warpgroups would compute the same elements (KERNEL_LOG.md, v5).
# Stages: 3 for the forward and dq kernels, 2 for dk/dv (H200 A/B, KERNEL_LOG.md v7).
_LAUNCH = {
    "fwd": {"num_warps": 4, "num_stages": 3},
    "dq": {"num_warps": 4, "num_stages": 3},
    "dkdv": {"num_warps": 4, "num_stages": 2},
}


def _launch_cfg(D: int, kernel: str):
    """Launch config of "fwd", "dq" or "dkdv". FPA_<KERNEL>_{WARPS,STAGES,MAXNREG} override it for
    A/B benchmarks (benchmarks/attention.py); nothing else reads them."""
    if _interpreting():
        return {}
    cfg = dict(_LAUNCH[kernel])
    for key, suffix in (("num_warps", "WARPS"), ("num_stages", "STAGES"), ("maxnreg", "MAXNREG")):
        value = os.environ.get(f"FPA_{kernel.upper()}_{suffix}")
        if value:
            cfg[key] = int(value)
    return cfg


def _prep(phi, psi, BS):
    """Per-block field quantities in padded (B*H, Tp) / (B*H, nB) fp32 buffers:
    phi, psi, suffix/prefix minima and their normalisers, block minima, their normalisers, and the
    minimum of each block's suffix minima."""
    B, T, H = phi.shape
    nB = triton.cdiv(T, BS)
    Tp = nB * BS
    BH = B * H
    # one allocation (host overhead matters at short T, where the forward takes ~0.25 ms)
    flat = _empty((6 * BH * Tp + 3 * BH * nB,), dtype=torch.float32, device=phi.device)
    phip, psip, suf, zsuf, pre, zpre = flat[: 6 * BH * Tp].view(6, BH, Tp).unbind(0)
    bmin, zblk, minsuf = flat[6 * BH * Tp:].view(3, BH, nB).unbind(0)
    kernels._fpa_prep_kernel[(nB, BH)](
        phi, psi, phi.stride(0), phi.stride(1), phi.stride(2),
        phip, psip, suf, zsuf, pre, zpre, bmin, zblk, minsuf,
        T, H, Tp, nB, BS=BS, **({} if _interpreting() else {"num_warps": 1}),
    )
    return phip, psip, suf, zsuf, pre, zpre, bmin, zblk, minsuf


class _FPAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, phi, psi, beta, scale, skip_threshold):
        B, T, H, D = q.shape
        BS = _block_size()
        nB = triton.cdiv(T, BS)
        Tp = nB * BS
        prep = _prep(phi, psi, BS)
        phip, psip, suf, zsuf, pre, zpre, bmin, zblk, minsuf = prep
        o = _empty((B, T, H, D), dtype=q.dtype, device=q.device)
        lse = _empty((B * H, Tp), dtype=torch.float32, device=q.device)
        skip = skip_threshold is not None
        prec = "ieee" if q.dtype == torch.float32 else "tf32"
        need_grad = any(ctx.needs_input_grad[:6])
        o32 = _empty((B * H, Tp, D), dtype=torch.float32, device=q.device) if need_grad else lse
        kernels._fpa_fwd_kernel[(nB, B * H)](
            q, k, v, o, o32, lse,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
            phip, psip, suf, pre, bmin, beta,
            T, H, Tp, nB, scale, float(skip_threshold) if skip else 0.0,
            BS=BS, D=D, SKIP=skip, PREC=prec, STORE32=need_grad, **_launch_cfg(D, "fwd"),
        )
        ctx.save_for_backward(q, k, v, beta, o32, lse, *prep)
        ctx.cfg = (scale, skip_threshold, BS)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, beta, o32, lse, phip, psip, suf, zsuf, pre, zpre, bmin, zblk, minsuf = ctx.saved_tensors
        scale, skip_threshold, BS = ctx.cfg
        B, T, H, D = q.shape
        nB = triton.cdiv(T, BS)
        Tp = nB * BS
        BH = B * H
        dev = q.device
        skip = skip_threshold is not None
        prec = "ieee" if q.dtype == torch.float32 else "tf32"
        threshold = float(skip_threshold) if skip else 0.0
        if do.stride(-1) != 1:
            do = do.contiguous()
        dq = _empty(q.shape, dtype=q.dtype, device=dev)
        dk = _empty(k.shape, dtype=k.dtype, device=dev)
        dv = _empty(v.shape, dtype=v.dtype, device=dev)
        delta = _empty((BH, Tp), dtype=torch.float32, device=dev)
        csum = _empty((BH, Tp), dtype=torch.float32, device=dev)
        # a_s partials per (query block I, key position s) and kappa[J, I]: only J < I is written and read
        a_partial = _empty((BH, nB, Tp), dtype=torch.float32, device=dev)
        kappa = _empty((BH, nB, nB), dtype=torch.float32, device=dev)
        dphi = _empty((BH, Tp), dtype=torch.float32, device=dev)
        dpsi = _empty((BH, Tp), dtype=torch.float32, device=dev)
        dbeta = _empty((BH, Tp), dtype=torch.float32, device=dev)
        qkv_strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                       v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2))
        kernels._fpa_bwd_dq_kernel[(nB, BH)](
            q, k, v, do, dq, *qkv_strides, dq.stride(0), dq.stride(1), dq.stride(2),
            lse, o32, delta, phip, psip, suf, zsuf, pre, zpre, bmin, zblk, minsuf, beta,
            csum, a_partial, kappa,
            T, H, Tp, nB, scale, threshold,
            BS=BS, D=D, SKIP=skip, PREC=prec, FAST=not _interpreting(), CB=_chunk(), **_launch_cfg(D, "dq"),
        )
        kernels._fpa_bwd_dkdv_kernel[(nB, BH)](
            q, k, v, do, dk, dv, *qkv_strides,
            dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2),
            lse, delta, phip, psip, suf, pre, bmin, beta,
            dpsi, dbeta,
            T, H, Tp, nB, scale, threshold,
            BS=BS, D=D, SKIP=skip, PREC=prec, **_launch_cfg(D, "dkdv"),
        )
        kernels._fpa_field_kernel[(nB, BH)](
            q, k, v, do, *qkv_strides,
            lse, delta, phip, psip, suf, pre, bmin, beta, kappa, csum, a_partial, dphi,
            T, H, Tp, nB, scale,
            BS=BS, D=D, CB=_chunk(), PREC=prec,
        )
        dphi_out = dphi.view(B, H, Tp)[:, :, :T].permute(0, 2, 1)
        dpsi_out = dpsi.view(B, H, Tp)[:, :, :T].permute(0, 2, 1)
        dbeta_out = dbeta.view(B, H, Tp)[:, :, :T].sum(dim=(0, 2))
        return dq, dk, dv, dphi_out, dpsi_out, dbeta_out.to(beta.dtype), None, None


def _check(q, k, v, phi, psi, beta, scale, skip_threshold):
    tensors = {"q": q, "k": k, "v": v, "phi": phi, "psi": psi, "beta": beta}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"fpa_attention: {name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 4:
        raise ValueError(f"fpa_attention: q must be (B, T, H, D), got shape {tuple(q.shape)}")
    B, T, H, D = q.shape
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"fpa_attention: q, k, v must share one shape (B, T, H, D); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if T < 1 or B < 1 or H < 1:
        raise ValueError(f"fpa_attention: empty input shape {tuple(q.shape)}")
    if D not in HEAD_DIMS:
        raise ValueError(f"fpa_attention: head dim D must be one of {HEAD_DIMS}, got {D}")
    if q.dtype not in QKV_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"fpa_attention: q, k, v must share one dtype among bf16, fp16, fp32; got "
                         f"{q.dtype}, {k.dtype}, {v.dtype}")
    if phi.shape != (B, T, H) or psi.shape != (B, T, H):
        raise ValueError(f"fpa_attention: phi and psi must be (B, T, H) = {(B, T, H)}, got "
                         f"{tuple(phi.shape)}, {tuple(psi.shape)}")
    if beta.shape != (H,):
        raise ValueError(f"fpa_attention: beta must be (H,) = ({H},), got {tuple(beta.shape)}")
    for name in ("phi", "psi", "beta"):
        if tensors[name].dtype != torch.float32:
            raise ValueError(f"fpa_attention: {name} must be float32, got {tensors[name].dtype}")
    devs = {t.device for t in tensors.values()}
    if len(devs) != 1:
        raise ValueError(f"fpa_attention: all inputs must be on one device, got {sorted(map(str, devs))}")
    dev = q.device
    if dev.type != "cuda" and not _interpreting():
        raise ValueError(f"fpa_attention: inputs must be CUDA tensors (or set TRITON_INTERPRET=1 before "
                         f"importing for the CPU interpreter); got device {dev}")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise ValueError(f"fpa_attention: scale must be a finite float or None, got {scale!r}")
    if skip_threshold is not None and not (
        isinstance(skip_threshold, (int, float)) and math.isfinite(skip_threshold) and skip_threshold < 0
    ):
        raise ValueError(f"fpa_attention: skip_threshold must be a finite negative float or None, got {skip_threshold!r}")


def fpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    phi: torch.Tensor,
    psi: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    skip_threshold: float | None = None,
) -> torch.Tensor:
    """Causal FPA attention, fused: q, k, v (B, T, H, D); phi, psi (B, T, H) fp32; beta (H,) fp32.

    Returns (B, T, H, D) in q's dtype. Same semantics as `naive_fpa_attention`; with
    `skip_threshold` (negative) tiles whose bias is provably below it are dropped.
    """
    _check(q, k, v, phi, psi, beta, scale, skip_threshold)
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    # one set of strides serves phi and psi in the kernels
    return _FPAFunction.apply(q, k, v, phi.contiguous(), psi.contiguous(), beta.contiguous(), scale, skip_threshold)
