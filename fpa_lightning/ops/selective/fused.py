"""Fused Selective Attention (Triton): the definition of naive.py without the (T, T) bias.

    selective_attention_fused(q, k, v, *, scale=None, segment_ids=None) -> (B, T, H, D)

q, k, v: (B, T, H, D) in bf16, fp16 or fp32, head dim 16, 32, 64 or 128. Head 0 selects: S[t', s] =
ReLU(scale·q0[t']·k0[s]) for s < t' and selectable s (not key 0; with segment_ids not a document's first token);
F[t, s] = Σ_{t'<t} S[t', s] is subtracted from every head's logits, causal, and with segment_ids (B, T) only keys
of the query's own document are seen. Gradients for q, k, v, head 0's q and k receiving the gradient through F as
well. Anything else (dtype, head dim, shapes, device) raises ValueError; there is no silent fallback.

Memory besides q, k, v and the output, all fp32 (T_p: T padded to whole tiles; tile sizes in ``_tiles``: on the
GPU the forward's tables have rows of BT = 64 queries, the backward's of BT = 32; G: head groups of the backward,
``_head_groups``):
  - carry table CF (B, T_p/BT, T_p): for every BT-th query row, the column sums of S over all earlier queries,
    computed key-major by one kernel. B·T²/BT·4 bytes, e.g. per sequence of T = 16384: 16 MiB in the forward and
    32 MiB in the backward (T = 4096: 1 and 2 MiB). The materialised bias of the SDPA path is 512 MiB (bf16) per
    sequence at 16384. The table is rebuilt in the backward, not kept: between the passes only the log-sum-exp
    (B·H, T_p) is saved, as in flash attention.
  - backward: the reverse carry RC (the same table over later queries), once per head group plus their sum when
    G > 1, i.e. (G + 1)·B·T²/BT·4 bytes (G = 12 at 1 × 16384 on an H200 with H = 12: 416 MiB); Δ (B, H, T_p);
    head 0's gradient partials (B, G, T_p, D) for q and k.
Precision: every accumulation is fp32; with bf16/fp16 inputs the matmuls of fp32 operands (the in-tile prefix and
suffix sums over queries) run in tf32, with fp32 inputs in full fp32 (a correctness path, slow on the GPU).
The carry has to be a table (or a sequential walk over query tiles): F sums a nonlinear function of (query, key)
pairs, so unlike FPA's path minimum it does not factor into per-query and per-key vectors. The kernels never hold
more than one tile of S, F or their gradients.

Layout follows ops/fpa: input checks here; the forward's and the backward's launches (`_forward`, `_backward`) run
in one autograd.Function, or under torch.compile in two custom ops; kernels in kernels.py.
"""
from __future__ import annotations

import functools
import math
import os

import torch

from fpa_lightning.ops.common import document_first_tokens
from fpa_lightning.ops.kernel_inputs import HEAD_DIMS, TRITON_OPTIONS, cdiv, empty_output, require_triton
from fpa_lightning.ops.kernel_inputs import check_device, check_qkv, check_scale, check_segment_ids, env_int
from fpa_lightning.ops.kernel_inputs import register_op_autograd, unit_last_stride, with_env_overrides
from fpa_lightning.ops.kernel_inputs import interpreting as _interpreting


@functools.cache
def load_kernels():
    """kernels.py, imported at the first launch: its @triton.jit kernels need triton, which the naive and chunked
    paths (and so the package, and an export's remote code) do without (``kernel_inputs.require_triton``)."""
    require_triton("selective_attention_fused")
    from fpa_lightning.ops.selective import kernels
    return kernels


# Launch configs on the GPU: one warpgroup per tile, as the FPA kernels use; at D = 128 the backward kernels take 8
# warps (their three (64, 128) fp32 accumulators spill heavily at 4, in an offline sm_90a compile). Tuned by an A/B on
# an H200 (benchmarks/selective_kernel_check.sh, step 3; KERNEL_LOG.md, "Selective Attention", s2): the query-major
# backward pipelines 3 stages (2 at D = 128, where 3 need 240 KiB of shared memory, over the H200's 227 KiB); 8 warps,
# a 128-query forward tile or a scan prefix were slower.
_LAUNCH = {
    "carry": {"num_warps": 4, "num_stages": 2},
    "fwd": {"num_warps": 4, "num_stages": 2},
    "bwd_kv": {"num_warps": 4, "num_stages": 2},
    "bwd_q": {"num_warps": 4, "num_stages": 3},
}
_D128 = {"bwd_kv": {"num_warps": 8}, "bwd_q": {"num_warps": 8, "num_stages": 2}}  # 3 stages exceed shared memory


PROGRAMS_PER_SM = 16
"""The backward's head groups give at least this many programs per SM (``_head_groups``): one head per program at
8 × 2048 and 1 × 16384 on an H200 (H = 12), faster than 4 per SM (3 groups) in its A/B (KERNEL_LOG.md, "Selective
Attention s2"); the reverse-carry table, stored per group, grows with it (fused.py's docstring)."""


def _tiles() -> dict:
    return tile_sizes("SEL")


def _prefix_by_dot() -> bool:
    return prefix_by_dot("SEL")


def tile_sizes(env: str) -> dict:
    """Tile sizes, powers of two >= 16: {"fwd": (BM, BN), "bwd": (BT, BN, BM)}. The forward's query tile BM is its
    carry table's granularity. In the backward, BT is the key-major kernel's query tile and both tables' granularity,
    BN the key tile of every backward kernel, and BM the query-major kernel's query tile (a multiple of BT). GPU:
    64 x 64 forward; backward 32-query tiles in the key-major kernel (its three (BN, D) accumulators leave little
    room: at 64 it spills, in an offline sm_90a compile) and 64 x 64 in the query-major one. The interpreter: 16
    everywhere (its tests stay tiny). {env}_FWD_BM, _FWD_BN, _BWD_BT, _BWD_BN, _BWD_BM override them (for A/B
    benchmarks only; env "SEL" here, "DCP" for the DCP kernels, which share this layout)."""
    if _interpreting():
        fwd, bwd = (16, 16), (16, 16, 16)
    else:
        fwd, bwd = (64, 64), (32, 64, 64)
    fwd = tuple(env_int(f"{env}_FWD_{n}") or v for n, v in zip(("BM", "BN"), fwd))
    bwd = tuple(env_int(f"{env}_BWD_{n}") or v for n, v in zip(("BT", "BN", "BM"), bwd))
    return {"fwd": fwd, "bwd": bwd}


def check_tile_sizes(tiles: dict, op: str) -> None:
    for size in (*tiles["fwd"], *tiles["bwd"]):
        if size < 16 or size & (size - 1):
            raise ValueError(f"{op}: tile sizes must be powers of two >= 16, got {tiles}")
    BT, _, BM = tiles["bwd"]
    if BM % BT:
        raise ValueError(f"{op}: the backward's query tile must be a multiple of BT, got {tiles}")


def prefix_by_dot(env: str, default: str = "dot") -> bool:
    """The in-tile prefix and suffix sums over queries: True = a triangular matmul (tensor cores), False = a scan
    (tl.cumsum). {env}_PREFIX ("dot" or "scan") overrides `default`, for A/B benchmarks only."""
    return (os.environ.get(f"{env}_PREFIX") or default) != "scan"


def _head_groups(B: int, H: int, nJ: int, device: torch.device) -> int:
    """How many head groups the backward kernels run (a divisor of H): each program loops over H / G heads. Fewer
    groups use less memory (the reverse-carry table is stored once per group), more give more programs. On the GPU:
    the fewest groups that give at least PROGRAMS_PER_SM programs per SM; in the interpreter one group (the head loop
    is tested). SEL_HEAD_GROUPS overrides it (A/B benchmarks)."""
    forced = env_int("SEL_HEAD_GROUPS")
    if forced is not None:
        if forced < 1 or H % forced:
            raise ValueError(f"SEL_HEAD_GROUPS must divide H = {H}, got {forced}")
        return forced
    if _interpreting() or device.type != "cuda":
        return 1
    target = PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count
    for groups in range(1, H + 1):
        if H % groups == 0 and B * nJ * groups >= target:
            return groups
    return H


def launch_cfg(kernel: str, D: int, env: str, defaults: dict | None = None) -> dict:
    """Launch config of a kernel ("carry", "fwd", "bwd_kv", "bwd_q") from `defaults` (Selective's ``_LAUNCH``
    unless given); {env}_<KERNEL>_{WARPS,STAGES} override it (A/B benchmarks only)."""
    if _interpreting():
        return {}
    cfg = dict((defaults or _LAUNCH)[kernel])
    if D >= 128:
        cfg.update(_D128.get(kernel, {}))
    return with_env_overrides(cfg, f"{env}_{kernel.upper()}", (("num_warps", "WARPS"), ("num_stages", "STAGES")))


def padded_length(T: int, tiles: dict) -> int:
    """T padded to whole tiles of every size in ``tiles`` (``tile_sizes``: powers of two, so whole tiles of the
    largest)."""
    largest = max(*tiles["fwd"], *tiles["bwd"])
    return cdiv(T, largest) * largest


def _document_ids(segment_ids: torch.Tensor, Tp: int):
    """Document ids padded to (B, Tp) int32 (the padding repeats the last id, so tile minima and maxima stay those of
    real positions) and the selectable keys (B, Tp) int8: not a document's first token, nor padding."""
    B, T = segment_ids.shape
    seg = segment_ids.to(torch.int32, copy=True)  # never the caller's tensor: the custom op's output may not alias it
    if Tp > T:
        seg = torch.cat([seg, seg[:, -1:].expand(B, Tp - T)], dim=1)
    keep = torch.zeros(B, Tp, dtype=torch.int8, device=segment_ids.device)
    keep[:, :T] = (~document_first_tokens(segment_ids)).to(torch.int8)
    return seg.contiguous(), keep


def _tile_bounds(seg: torch.Tensor, T: int, BM: int, BN: int):
    """For query tiles of BM rows and key tiles of BN columns: jlo (B, nI) int32, the lowest key tile that can share
    a document with query tile I, and ihi (B, nJ) int32, the highest query tile that can share one with key tile J.
    From tile minima and maxima of the ids, so both hold for any ids (tight for contiguous documents); no host
    synchronisation."""
    B = seg.shape[0]
    nI, nJ = cdiv(T, BM), cdiv(T, BN)
    qmin = seg[:, : nI * BM].view(B, nI, BM).amin(dim=-1)
    kmax = seg[:, : nJ * BN].view(B, nJ, BN).amax(dim=-1)
    # key tile J can hold query tile I's ids only if kmax[J] >= qmin[I]: the first J where the running max reaches it
    jlo = torch.searchsorted(kmax.cummax(dim=-1).values.contiguous(), qmin.contiguous(), side="left")
    # query tile I can hold key tile J's ids only if qmin[I] <= kmax[J]: the last I whose suffix minimum allows it
    suffix_min = qmin.flip(-1).cummin(dim=-1).values.flip(-1).contiguous()
    ihi = torch.searchsorted(suffix_min, kmax.contiguous(), side="right") - 1
    return jlo.to(torch.int32).contiguous(), ihi.to(torch.int32).contiguous()


def backward_tile_bounds(ids: torch.Tensor, T: int, BT: int, BN: int, BM: int):
    """The backward kernels' document bounds (``_tile_bounds`` at the backward's tiles): jlo_later (B, nI) int32,
    the lowest key tile that shares a document with query tile I (BM rows) or any later one, for the query-major
    kernel (below it, dS and R are 0); ihi (B, nJ) int32, the highest query tile (BT rows) that can share one with
    key tile J, for the key-major kernel."""
    jlo = _tile_bounds(ids, T, BM, BN)[0]
    jlo_later = jlo.flip(-1).cummin(dim=-1).values.flip(-1).contiguous()  # its suffix minimum over the query tiles
    return jlo_later, _tile_bounds(ids, T, BT, BN)[1]


def output_grad_rowsum(do: torch.Tensor, o: torch.Tensor, Tp: int) -> torch.Tensor:
    """Δ (B, H, Tp) fp32 of the flash backward: rowsum(dO * O) per query and head, 0 on padded rows; do, o
    (B, T, H, D)."""
    B, T, H, _ = do.shape
    delta = torch.zeros((B, H, Tp), dtype=torch.float32, device=do.device)
    delta[:, :, :T] = (do.float() * o.float()).sum(-1).transpose(1, 2)
    return delta


def _carry_table(q, k, keep, T, Tp, BT, BN, QM, scale, cx):
    """CF (B, Tp / BT, Tp) fp32: CF[r, s] = Σ_{t' < r·BT} S[t', s], written from the first row that a reader's query
    tile of QM rows holding key s starts at (earlier rows are never read)."""
    B = q.shape[0]
    nT = Tp // BT
    cf = empty_output((B, nT, Tp), dtype=torch.float32, device=q.device)
    load_kernels()._sel_carry_kernel[(cdiv(T, BN), B)](
        q, k, cf, keep, q.stride(0), q.stride(1), k.stride(0), k.stride(1), T, Tp, nT, scale,
        BT=BT, BN=BN, QM=QM, **cx, **launch_cfg("carry", cx["D"], "SEL"), **TRITON_OPTIONS,
    )
    return cf


def _config(q: torch.Tensor, documents: bool):
    """The launch set-up the forward and the backward share: (tiles, Tp, cx, dot)."""
    tiles = _tiles()
    check_tile_sizes(tiles, "selective_attention_fused")
    Tp = padded_length(q.shape[1], tiles)
    cx = {"D": q.shape[-1], "PREC": "ieee" if q.dtype == torch.float32 else "tf32", "SEG": documents}
    return tiles, Tp, cx, _prefix_by_dot()


def _forward(q, k, v, scale, segment_ids):
    """The forward's launches: (o, lse, ids, keep), the output (B, T, H, D), the row log-sum-exp (B*H, Tp) and the
    documents' tables of `_document_ids` (empty tensors without documents), which the backward reads."""
    B, T, H, D = q.shape
    seg = segment_ids is not None
    tiles, Tp, cx, dot = _config(q, seg)
    BM, BN = tiles["fwd"]
    dev = q.device
    ids, keep = _document_ids(segment_ids, Tp) if seg else (q.new_empty(0, dtype=torch.int32),
                                                             q.new_empty(0, dtype=torch.int8))
    jlo = _tile_bounds(ids, T, BM, BN)[0] if seg else None
    o = empty_output((B, T, H, D), dtype=q.dtype, device=dev)
    lse = empty_output((B * H, Tp), dtype=torch.float32, device=dev)
    dummy = lse  # stands for the tables a variant without documents never reads
    cf = _carry_table(q, k, keep if seg else dummy, T, Tp, BM, BN, BM, scale, cx)  # freed after the forward
    load_kernels()._sel_fwd_kernel[(cdiv(T, BM), B * H)](
        q, k, v, o, lse, cf, keep if seg else dummy, ids if seg else dummy, jlo if seg else dummy,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
        T, H, Tp, Tp // BM, cdiv(T, BN), scale,
        BM=BM, BN=BN, RATIO=1, DOT=dot, **cx, **launch_cfg("fwd", cx["D"], "SEL"), **TRITON_OPTIONS,
    )
    return o, lse, ids, keep


def _backward(do, q, k, v, o, lse, ids, keep, scale):
    """The backward's launches from what `_forward` returned: (dq, dk, dv)."""
    B, T, H, D = q.shape
    seg = ids.numel() > 0
    tiles, Tp, cx, dot = _config(q, seg)
    BT, BN, BM = tiles["bwd"]
    dev = q.device
    dummy = lse  # stands for the tables a variant without documents never reads
    ids, keep = (ids, keep) if seg else (dummy, dummy)
    jlo_later, ihi = backward_tile_bounds(ids, T, BT, BN, BM) if seg else (dummy, dummy)
    (do,) = unit_last_stride(do)
    nT, nJ = Tp // BT, cdiv(T, BN)
    G = _head_groups(B, H, nJ, dev)
    delta = output_grad_rowsum(do, o, Tp)
    dq, dk, dv = (empty_output(t.shape, dtype=t.dtype, device=dev) for t in (q, k, v))
    cf = _carry_table(q, k, keep, T, Tp, BT, BN, BM, scale, cx)
    # per group; rows from each key's tile written
    rcp = empty_output((B, G, nT, Tp), dtype=torch.float32, device=dev)
    dk0p = empty_output((B, G, Tp, D), dtype=torch.float32, device=dev)
    dq0p = empty_output((B, G, Tp, D), dtype=torch.float32, device=dev)
    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
               v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2))
    load_kernels()._sel_bwd_kv_kernel[(nJ, B * G)](
        q, k, v, do, dk, dv, lse, delta, cf, rcp, dk0p, keep, ids, ihi,
        *strides, dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2),
        T, H, Tp, nT, H // G, scale, BT=BT, BN=BN, DOT=dot, **cx, **launch_cfg("bwd_kv", cx["D"], "SEL"),
        **TRITON_OPTIONS,
    )
    rc = rcp[:, 0] if G == 1 else rcp.sum(dim=1)  # never-written entries are never read
    load_kernels()._sel_bwd_q_kernel[(cdiv(T, BM), B * G)](
        q, k, v, do, dq, lse, delta, cf, rc, dq0p, keep, ids, jlo_later, ihi,
        *strides, dq.stride(0), dq.stride(1), dq.stride(2),
        T, H, Tp, nT, nJ, H // G, scale, BM=BM, BN=BN, RATIO=BM // BT, DOT=dot, **cx,
        **launch_cfg("bwd_q", cx["D"], "SEL"), **TRITON_OPTIONS,
    )
    # head 0: its own gradient plus every head's gradient through F, summed over the groups
    dq[:, :, 0] = dq0p.sum(dim=1)[:, :T]
    dk[:, :, 0] = dk0p.sum(dim=1)[:, :T]
    return dq, dk, dv


def _setup_context(ctx, inputs, output) -> None:
    """What `_backward` reads after ``do``, saved by the autograd function and the custom op alike."""
    q, k, v, scale, _ = inputs
    o, lse, ids, keep = output
    ctx.save_for_backward(q, k, v, o, lse, ids, keep)
    ctx.cfg = (scale,)


class _SelectiveFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, segment_ids):
        output = _forward(q, k, v, scale, segment_ids)
        _setup_context(ctx, (q, k, v, scale, segment_ids), output)
        return output[0]

    @staticmethod
    def backward(ctx, do):
        return (*_backward(do, *ctx.saved_tensors, *ctx.cfg), None, None)


# Under torch.compile the op is two torch.library custom ops, forward and backward, which Dynamo traces as single
# nodes, as FPA's are (docs/training.md, "torch.compile"): a compiled block holds the attention instead of breaking
# its graph around it.
@torch.library.custom_op(
    "fpa_lightning::selective_forward", mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor v, float scale, Tensor? segment_ids) -> (Tensor, Tensor, Tensor, Tensor)")
def selective_forward_op(q, k, v, scale, segment_ids):
    """`_forward` as one op: (o, lse, ids, keep)."""
    return _forward(q, k, v, scale, segment_ids)


@selective_forward_op.register_fake
def _selective_forward_shapes(q, k, v, scale, segment_ids):
    B, T, H, D = q.shape
    Tp = padded_length(T, _tiles())
    tables = ((B, Tp), (B, Tp)) if segment_ids is not None else ((0,), (0,))
    return (q.new_empty((B, T, H, D)), q.new_empty((B * H, Tp), dtype=torch.float32),
            q.new_empty(tables[0], dtype=torch.int32), q.new_empty(tables[1], dtype=torch.int8))


@torch.library.custom_op(
    "fpa_lightning::selective_backward", mutates_args=(),
    schema="(Tensor do, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor ids, Tensor keep, float scale) -> "
           "(Tensor, Tensor, Tensor)")
def selective_backward_op(do, q, k, v, o, lse, ids, keep, scale):
    """`_backward` as one op: (dq, dk, dv)."""
    return _backward(do, q, k, v, o, lse, ids, keep, scale)


@selective_backward_op.register_fake
def _selective_backward_shapes(do, q, k, v, o, lse, ids, keep, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


register_op_autograd(selective_forward_op, selective_backward_op, _setup_context, n_inputs=5)


def _check(q, k, v, scale, segment_ids):
    B, T, _, _ = check_qkv("selective_attention_fused", q, k, v, HEAD_DIMS)
    dev = check_device("selective_attention_fused", {"q": q, "k": k, "v": v})
    check_scale("selective_attention_fused", scale)
    check_segment_ids("selective_attention_fused", segment_ids, B, T, dev)


def selective_attention_fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
                              segment_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Causal Selective Attention, fused: q, k, v (B, T, H, D) -> (B, T, H, D) in q's dtype.

    Same semantics as ``selective_attention_naive`` (head 0 selects; F is layer-shared; ``segment_ids`` (B, T):
    a query attends only to keys with its own id, and every document's first token is never selected)."""
    _check(q, k, v, scale, segment_ids)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    q, k, v = unit_last_stride(q, k, v)
    if torch.compiler.is_compiling():
        return selective_forward_op(q, k, v, scale, segment_ids)[0]
    return _SelectiveFunction.apply(q, k, v, scale, segment_ids)
