"""Fused DCP attention (Triton): the definition of naive.py without the (T, T) bias.

    dcp_attention_fused(q, k, v, qi, ki, offset, *, scale=None, segment_ids=None) -> (B, T, H, D)

q, k, v: (B, T, H, D) in bf16, fp16 or fp32, head dim 16, 32, 64 or 128; qi, ki: (B, T, r) interaction queries and
keys shared by all heads, r in 16, 32, 64, 128, one dtype among bf16, fp16, fp32 (it may differ from q's: the
backend makes them in fp32); offset: a one-element float tensor (shape () or (1,)). z[t', s] = qi[t']·ki[s]/√r +
offset, L = log max(clamp((z + 1)/2, 0, 1), 1e-30), bias[t, s] = Σ_{s<t'≤t} L[t', s] added to every head's logits,
causal, and with segment_ids (B, T) only keys of the query's own document are seen (the bias of a pair sums every
query between them, as ``dcp_bias`` does for any ids). Gradients for q, k, v, qi, ki and offset. Anything else
(dtype, head dim, r, shapes, device) raises ValueError; there is no silent fallback.

Memory besides the inputs and the output, all fp32 (T_p: T padded to whole tiles; BT: a table's row granularity, 64
queries in the forward and 32 in the backward on the GPU; G: head groups of the backward, Selective's
``_head_groups``; r: the interaction width):
  - carry table CF (B, T_p/BT, T_p): column sums of L over all earlier queries at every BT-th row, B·T²/BT·4 bytes
    (T = 16384: 16 MiB in the forward, 32 MiB in the backward; the SDPA path's bf16 bias is 512 MiB per sequence).
    Rebuilt in the backward, not kept.
  - saved between the passes: the log-sum-exp (B·H, T_p) and, for bf16/fp16 q, the fp32 output (B, T_p, H, D) (see
    below), i.e. B·T·H·(D + 1)·4 bytes.
  - backward: the reverse carry RC, once per head group plus their sum when G > 1, (G + 1)·B·T²/BT·4 bytes; Δ
    (B, H, T_p); dqi and dki partials (B, G, T_p, r) each; offset partials (B, G, T_p/BN).
Precision: every accumulation is fp32. z is one tl.dot over r in the interaction inputs' dtype (bf16/fp16 on tensor
cores; fp32 operands in tf32 when q is bf16/fp16, in full fp32 when q is fp32); the in-tile prefix and suffix sums
over queries are fp32 scans (tl.cumsum) when q is bf16/fp16, and a triangular matmul in full fp32 when q is fp32
(``_prefix_by_dot``). DCP_PREFIX=dot gives bf16/fp16 the matmul as well (A/B only), in "tf32x2" (the 0/1 triangle is
exact in tf32, so the summed operand alone is split in two and two tf32 dots give tf32x3's result: ``_mask_dot``),
DCP_BIAS_PREC overriding that ("tf32", "tf32x3", "ieee"). The offset gradient is a sum of dz over all T²/2
pairs, so it collects coherently any error that makes a row of dS = P(dP − Δ) sum to other than zero. Hence
Δ = rowsum(dO·O) is taken from an fp32 output whose P·V product takes P to about 16 bits (P split into two terms in
v's dtype, one more tensor-core dot per tile, ``_online_softmax``'s SPLIT_P), so that it matches the backward's fp32
P. The second attempt took it from round(P)·V in fp32 and failed the 2x rule in bf16 on the offset gradient; a
float64 emulation of that rounding, and of tf32 bias sums, accounts for that error (KERNEL_LOG.md, "Rejected
candidates", d2).
"""
from __future__ import annotations

import functools
import math
import os

import torch

from fpa_lightning.ops.kernel_inputs import HEAD_DIMS, TRITON_OPTIONS, cdiv, empty_output, require_triton
from fpa_lightning.ops.kernel_inputs import QKV_DTYPES, check_device, check_qkv, check_scale, check_segment_ids
from fpa_lightning.ops.kernel_inputs import register_op_autograd, unit_last_stride
from fpa_lightning.ops.selective import fused as _sel

INTERACTION_DIMS = (16, 32, 64, 128)
"""Interaction widths r the kernels are built for."""

OP = "dcp_attention_fused"

# Tiles and launch configs: Selective's (``tile_sizes``, ``launch_cfg``) but for two choices of an A/B on an H200
# (benchmarks/dcp_kernel_check.sh; KERNEL_LOG.md, "DCP", d5): the key-major backward without pipelining (1 stage),
# and the in-tile prefix and suffix sums as scans for bf16/fp16 q (``_prefix_by_dot``), each faster
# forward+backward. DCP_* variables override them (A/B only).
_LAUNCH = {**_sel._LAUNCH, "bwd_kv": {"num_warps": 4, "num_stages": 1}}


@functools.cache
def load_kernels():
    """kernels.py, imported at the first launch: its @triton.jit kernels need triton, which the naive and chunked
    paths (and so the package, and an export's remote code) do without (``kernel_inputs.require_triton``)."""
    require_triton(OP)
    from fpa_lightning.ops.dcp import kernels
    return kernels


def _tiles() -> dict:
    return _sel.tile_sizes("DCP")


def _prefix_by_dot(dtype: torch.dtype) -> bool:
    """The in-tile sums over queries: scans for bf16/fp16 q; for fp32 q the triangular matmul in full fp32, since the
    offset gradient (a sum over all pairs with heavy cancellation) meets the 2x rule in fp32 only that way (the scan:
    12x PyTorch's error, tests/ops/_carry_table_tests.py)."""
    return _sel.prefix_by_dot("DCP", default="dot" if dtype == torch.float32 else "scan")


def _head_groups(B: int, H: int, nJ: int, device: torch.device) -> int:
    """Head groups of the backward: Selective's rule (a divisor of H; SEL_HEAD_GROUPS overrides it)."""
    return _sel._head_groups(B, H, nJ, device)


def _launch_cfg(kernel: str, D: int) -> dict:
    return _sel.launch_cfg(kernel, D, "DCP", _LAUNCH)


def _carry_table(qi, ki, offset, T, Tp, BT, BN, QM, cx):
    """CF (B, Tp / BT, Tp) fp32: CF[row, s] = Σ_{t' < row·BT} L[t', s], from the first row a reader needs."""
    B = qi.shape[0]
    nT = Tp // BT
    cf = empty_output((B, nT, Tp), dtype=torch.float32, device=qi.device)
    load_kernels()._dcp_carry_kernel[(cdiv(T, BN), B)](
        qi, ki, offset, cf, qi.stride(0), qi.stride(1), ki.stride(0), ki.stride(1), T, Tp, nT, cx["rs"],
        BT=BT, BN=BN, QM=QM, R=cx["R"], PREC=cx["PREC"], **_launch_cfg("carry", cx["D"]), **TRITON_OPTIONS,
    )
    return cf


def _consts(cx):
    """The constexprs every attention kernel takes."""
    return {k: cx[k] for k in ("D", "R", "PREC", "BPREC", "DOT", "SEG")}


def _config(q: torch.Tensor, qi: torch.Tensor, documents: bool):
    """The launch set-up the forward and the backward share: (tiles, Tp, cx)."""
    tiles = _tiles()
    _sel.check_tile_sizes(tiles, OP)
    Tp = _sel.padded_length(q.shape[1], tiles)
    prec = "ieee" if q.dtype == torch.float32 else "tf32"
    bias_prec = "ieee" if q.dtype == torch.float32 else "tf32x2"  # the bias path's sums near fp32 (see above)
    cx = {"D": q.shape[-1], "R": qi.shape[-1], "PREC": prec, "BPREC": os.environ.get("DCP_BIAS_PREC") or bias_prec,
          "DOT": _prefix_by_dot(q.dtype), "SEG": documents, "rs": 1.0 / math.sqrt(qi.shape[-1])}
    return tiles, Tp, cx


def _forward(q, k, v, qi, ki, offset, scale, segment_ids):
    """The forward's launches: (o, o32, lse, ids), the output (B, T, H, D), the fp32 output (B, Tp, H, D) for
    bf16/fp16 q (an empty tensor for fp32 q, whose own output serves), the row log-sum-exp (B*H, Tp) and the
    documents' ids of Selective's `_document_ids` (an empty tensor without documents), which the backward reads."""
    B, T, H, D = q.shape
    seg = segment_ids is not None
    tiles, Tp, cx = _config(q, qi, seg)
    BM, BN = tiles["fwd"]
    dev = q.device
    off = offset.detach().reshape(1).to(torch.float32)
    ids = _sel._document_ids(segment_ids, Tp)[0] if seg else q.new_empty(0, dtype=torch.int32)
    jlo = _sel._tile_bounds(ids, T, BM, BN)[0] if seg else None
    o = empty_output((B, T, H, D), dtype=q.dtype, device=dev)
    store32 = q.dtype != torch.float32
    lse = empty_output((B * H, Tp), dtype=torch.float32, device=dev)
    o32 = empty_output((B, Tp, H, D) if store32 else (0,), dtype=torch.float32, device=dev)
    cf = _carry_table(qi, ki, off, T, Tp, BM, BN, BM, cx)  # freed after the forward
    dummy = lse  # stands for the tables a variant without documents never reads
    load_kernels()._dcp_fwd_kernel[(cdiv(T, BM), B * H)](
        q, k, v, qi, ki, off, o, o32 if store32 else dummy, lse, cf, ids if seg else dummy, jlo if seg else dummy,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
        qi.stride(0), qi.stride(1), ki.stride(0), ki.stride(1),
        T, H, Tp, Tp // BM, cdiv(T, BN), scale, cx["rs"],
        BM=BM, BN=BN, STORE32=store32, **_consts(cx), **_launch_cfg("fwd", D), **TRITON_OPTIONS,
    )
    return o, o32, lse, ids


def _backward(do, q, k, v, qi, ki, offset, o, o32, lse, ids, scale):
    """The backward's launches from what `_forward` returned: (dq, dk, dv, dqi, dki, doffset)."""
    B, T, H, D = q.shape
    R = qi.shape[-1]
    dev = q.device
    seg = ids.numel() > 0
    tiles, Tp, cx = _config(q, qi, seg)
    BT, BN, BM = tiles["bwd"]
    off = offset.detach().reshape(1).to(torch.float32)
    dummy = lse
    ids = ids if seg else dummy
    jlo_later, ihi = _sel.backward_tile_bounds(ids, T, BT, BN, BM) if seg else (dummy, dummy)
    (do,) = unit_last_stride(do)
    nT, nJ = Tp // BT, cdiv(T, BN)
    G = _head_groups(B, H, nJ, dev)
    delta = _sel.output_grad_rowsum(do, o32[:, :T] if o32.numel() else o, Tp)  # from the fp32 output (see above)
    dq, dk, dv = (empty_output(t.shape, dtype=t.dtype, device=dev) for t in (q, k, v))
    cf = _carry_table(qi, ki, off, T, Tp, BT, BN, BM, cx)
    rcp = empty_output((B, G, nT, Tp), dtype=torch.float32, device=dev)
    dkip = empty_output((B, G, Tp, R), dtype=torch.float32, device=dev)
    dqip = empty_output((B, G, Tp, R), dtype=torch.float32, device=dev)
    offp = empty_output((B, G, nJ), dtype=torch.float32, device=dev)
    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
               v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
               qi.stride(0), qi.stride(1), ki.stride(0), ki.stride(1))
    load_kernels()._dcp_bwd_kv_kernel[(nJ, B * G)](
        q, k, v, qi, ki, off, do, dk, dv, lse, delta, cf, rcp, dkip, offp, ids, ihi,
        *strides, dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2),
        T, H, Tp, nT, H // G, scale, cx["rs"], BT=BT, BN=BN, **_consts(cx), **_launch_cfg("bwd_kv", D),
        **TRITON_OPTIONS,
    )
    rc = rcp[:, 0] if G == 1 else rcp.sum(dim=1)  # never-written entries are never read
    load_kernels()._dcp_bwd_q_kernel[(cdiv(T, BM), B * G)](
        q, k, v, qi, ki, off, do, dq, lse, delta, cf, rc, dqip, ids, jlo_later, ihi,
        *strides, dq.stride(0), dq.stride(1), dq.stride(2),
        T, H, Tp, nT, nJ, H // G, scale, cx["rs"], BM=BM, BN=BN, RATIO=BM // BT, **_consts(cx),
        **_launch_cfg("bwd_q", D), **TRITON_OPTIONS,
    )
    dqi = dqip.sum(dim=1)[:, :T].to(qi.dtype)
    dki = dkip.sum(dim=1)[:, :T].to(ki.dtype)
    doff = offp.sum().reshape(offset.shape).to(offset.dtype)  # a fixed-order sum of per-program fp32 partials
    return dq, dk, dv, dqi, dki, doff


def _setup_context(ctx, inputs, output) -> None:
    """What `_backward` reads after ``do``, saved by the autograd function and the custom op alike."""
    q, k, v, qi, ki, offset, scale, _ = inputs
    ctx.save_for_backward(q, k, v, qi, ki, offset.detach(), *output)
    ctx.cfg = (scale,)


class _DcpFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, qi, ki, offset, scale, segment_ids):
        output = _forward(q, k, v, qi, ki, offset, scale, segment_ids)
        _setup_context(ctx, (q, k, v, qi, ki, offset, scale, segment_ids), output)
        return output[0]

    @staticmethod
    def backward(ctx, do):
        return (*_backward(do, *ctx.saved_tensors, *ctx.cfg), None, None)


# Under torch.compile the op is two torch.library custom ops, forward and backward, as FPA's and Selective's are
# (docs/training.md, "torch.compile"): a compiled block holds the attention instead of breaking its graph around it.
@torch.library.custom_op(
    "fpa_lightning::dcp_forward", mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor v, Tensor qi, Tensor ki, Tensor offset, float scale, Tensor? segment_ids) "
           "-> (Tensor, Tensor, Tensor, Tensor)")
def dcp_forward_op(q, k, v, qi, ki, offset, scale, segment_ids):
    """`_forward` as one op: (o, o32, lse, ids)."""
    return _forward(q, k, v, qi, ki, offset, scale, segment_ids)


@dcp_forward_op.register_fake
def _dcp_forward_shapes(q, k, v, qi, ki, offset, scale, segment_ids):
    B, T, H, D = q.shape
    Tp = _sel.padded_length(T, _tiles())
    f32 = {"dtype": torch.float32}
    return (q.new_empty((B, T, H, D)), q.new_empty((B, Tp, H, D) if q.dtype != torch.float32 else (0,), **f32),
            q.new_empty((B * H, Tp), **f32), q.new_empty((B, Tp) if segment_ids is not None else (0,),
                                                         dtype=torch.int32))


@torch.library.custom_op(
    "fpa_lightning::dcp_backward", mutates_args=(),
    schema="(Tensor do, Tensor q, Tensor k, Tensor v, Tensor qi, Tensor ki, Tensor offset, Tensor o, Tensor o32, "
           "Tensor lse, Tensor ids, float scale) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
def dcp_backward_op(do, q, k, v, qi, ki, offset, o, o32, lse, ids, scale):
    """`_backward` as one op: (dq, dk, dv, dqi, dki, doffset)."""
    return _backward(do, q, k, v, qi, ki, offset, o, o32, lse, ids, scale)


@dcp_backward_op.register_fake
def _dcp_backward_shapes(do, q, k, v, qi, ki, offset, o, o32, lse, ids, scale):
    return tuple(t.new_empty(t.shape) for t in (q, k, v, qi, ki, offset))


register_op_autograd(dcp_forward_op, dcp_backward_op, _setup_context, n_inputs=8)


def _check(q, k, v, qi, ki, offset, scale, segment_ids):
    B, T, _, _ = check_qkv(OP, q, k, v, HEAD_DIMS, {"qi": qi, "ki": ki, "offset": offset})
    for name, t in (("qi", qi), ("ki", ki)):
        if t.dim() != 3 or t.shape[:2] != (B, T):
            raise ValueError(f"{OP}: {name} must be (B, T, r) with (B, T) = {(B, T)}, got shape {tuple(t.shape)}")
    if ki.shape != qi.shape:
        raise ValueError(f"{OP}: qi and ki must share one shape (B, T, r); got {tuple(qi.shape)}, {tuple(ki.shape)}")
    if qi.shape[-1] not in INTERACTION_DIMS:
        raise ValueError(f"{OP}: interaction width r must be one of {INTERACTION_DIMS}, got {qi.shape[-1]}")
    if qi.dtype not in QKV_DTYPES or ki.dtype != qi.dtype:
        raise ValueError(f"{OP}: qi, ki must share one dtype among bf16, fp16, fp32; got {qi.dtype}, {ki.dtype}")
    if offset.numel() != 1 or offset.dim() > 1 or offset.dtype not in QKV_DTYPES:
        raise ValueError(f"{OP}: offset must be a one-element bf16/fp16/fp32 tensor of shape () or (1,), got "
                         f"{tuple(offset.shape)} {offset.dtype}")
    dev = check_device(OP, {"q": q, "k": k, "v": v, "qi": qi, "ki": ki, "offset": offset})
    check_scale(OP, scale)
    check_segment_ids(OP, segment_ids, B, T, dev)


def dcp_attention_fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qi: torch.Tensor, ki: torch.Tensor,
                        offset: torch.Tensor, *, scale: float | None = None,
                        segment_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Causal DCP attention, fused: q, k, v (B, T, H, D), qi, ki (B, T, r), offset (one element) -> (B, T, H, D) in
    q's dtype. Same semantics as ``dcp_attention_naive`` (naive.py)."""
    _check(q, k, v, qi, ki, offset, scale, segment_ids)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    q, k, v, qi, ki = unit_last_stride(q, k, v, qi, ki)
    if torch.compiler.is_compiling():
        return dcp_forward_op(q, k, v, qi, ki, offset, scale, segment_ids)[0]
    return _DcpFunction.apply(q, k, v, qi, ki, offset, scale, segment_ids)
