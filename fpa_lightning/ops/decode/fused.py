"""Fused decode attention (Triton, inference only): the definition of naive.py without the (B, H, n, S) scores.

    decode_attention(q, k, v, bias, visible, scale) -> (B, n, H, D) in v's dtype

q (B, n, H, D): the n new queries; k, v (B, H, S, D): the KV cache's S slots; bias (B, H or 1, n, S) float32 or None
(one head: layer-shared); visible (B, H, n, S) bool: the slots each query sees. softmax(scale·q·kᵀ + bias) · v over
the visible slots, scores, softmax and the weighted sum of v in fp32. q, k, v in bf16, fp16 or fp32 (one dtype), head
dim 16, 32, 64 or 128, on one CUDA device (or any under the interpreter). No backward: with grad mode on, an input
that requires grad raises ValueError. Anything else that does not fit raises ValueError; there is no silent fallback.

Split-K (flash-decoding): the S slots are cut into SPLITS chunks of CHUNK slots; kernel 1 (grid B·H·n × SPLITS)
writes each chunk's max, sum and unnormalised accumulator to fp32 scratch ((B·H·n)·SPLITS·(D + 2)·4 bytes: 99 KiB at
B = 1, H = 12, D = 64, SPLITS = 32), kernel 2 (grid B·H·n) combines them. Two launches per layer replace the
reference's einsum, bias add, mask, softmax and einsum. A row without any visible slot gives 0, not NaN. Each query
row reads its chunk of k and v by itself: built for steps (n = 1); a piece of n tokens (``extend``) reads them n times
(mostly from L2, the programs of one (b, h, chunk) run side by side), where the reference makes one batched matmul.

Layout follows ops/fpa and ops/selective: input checks here, kernels in kernels.py.
"""
from __future__ import annotations

import functools

import torch

from fpa_lightning.ops.kernel_inputs import HEAD_DIMS, cdiv, empty_output, next_power_of_2, require_triton
from fpa_lightning.ops.kernel_inputs import TRITON_OPTIONS, unit_last_stride
from fpa_lightning.ops.kernel_inputs import (check_cached_qkv, check_device, check_inference_only, check_scale,
                                            env_int)
from fpa_lightning.ops.kernel_inputs import unsupported_reason as kernel_unsupported_reason
from fpa_lightning.ops.kernel_inputs import with_env_overrides
from fpa_lightning.ops.kernel_inputs import interpreting as _interpreting

OP = "decode_attention"
# GPU launch choices, not yet tuned by an A/B (benchmarks/decode.py with the overrides below; KERNEL_LOG.md, "Decode
# attention", v1): blocks of 4096 / D slots (64 at D <= 64) on 8 warps at D >= 64 (4 below), 128 registers per thread
# at D = 64 and 128 in an offline sm_90a compile (Triton 3.9; 4 warps took 197 at D = 64), chunks of at least
# MIN_CHUNK slots and enough (row, chunk) programs for PROGRAMS_PER_SM on every SM; the combine takes 16 splits at a
# time on 4 warps. The interpreter: blocks of 8 in chunks of 16 slots, combined 4 splits at a time, so its tiny tests
# cross every boundary. DECODE_BLOCK_S, DECODE_CHUNK (a fixed chunk, a multiple of the block), DECODE_WARPS,
# DECODE_STAGES override them (A/B benchmarks only).
MIN_CHUNK, PROGRAMS_PER_SM, COMBINE_SPLITS = 128, 4, 16
_INTERPRETER = {"block_s": 8, "chunk": 16, "sb": 4}


@functools.cache
def load_kernels():
    """kernels.py, imported at the first launch: its @triton.jit kernels need triton, which the naive and chunked
    paths (and so the package, and an export's remote code) do without (``kernel_inputs.require_triton``)."""
    require_triton(OP)
    from fpa_lightning.ops.decode import kernels
    return kernels


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def plan_splits(rows: int, S: int, D: int, device: torch.device, *, block_values: int = 4096, env: str = "DECODE",
                op: str = OP) -> tuple[int, int, int, int]:
    """(BLOCK_S, CHUNK, SPLITS, SB) for `rows` queries over S slots of head dim D. GPU: blocks of block_values / max(D,
    64) slots; the smallest power-of-two chunk >= MIN_CHUNK that still gives about PROGRAMS_PER_SM programs per SM
    (rows · SPLITS), e.g. 1 × 12 heads at S = 8192 on 132 SMs: 256 slots, 32 splits; 8 × 12 at 16384: 4096 slots, 4
    splits. {env}_BLOCK_S and {env}_CHUNK override them (A/B benchmarks). Also the decoding step's attention
    (ops/decode/step) plans its splits here, with its own block size, environment prefix and op name."""
    if _interpreting() or device.type != "cuda":
        block, chunk, sb = _INTERPRETER["block_s"], _INTERPRETER["chunk"], _INTERPRETER["sb"]
    else:
        block = env_int(f"{env}_BLOCK_S") or block_values // max(D, 64)
        target = PROGRAMS_PER_SM * _sm_count(device.index if device.index is not None else torch.cuda.current_device())
        chunk = max(MIN_CHUNK, block, next_power_of_2(cdiv(S * rows, target)))
        sb = COMBINE_SPLITS
    chunk = env_int(f"{env}_CHUNK") or chunk
    if block < 1 or block & (block - 1) or chunk % block:
        raise ValueError(f"{op}: the block must be a power of two and divide the chunk, got {block} and {chunk}")
    splits = cdiv(S, chunk)
    return block, chunk, splits, min(sb, next_power_of_2(splits))


def _launch_cfg(kernel: str, D: int) -> dict:
    if _interpreting():
        return {}
    cfg = {"num_warps": 8 if kernel == "partial" and D >= 64 else 4, "num_stages": 2}
    return with_env_overrides(cfg, "DECODE", (("num_warps", "WARPS"), ("num_stages", "STAGES")))


def unsupported_reason(device: torch.device, head_dim: int, dtype: torch.dtype) -> str | None:
    """Why ``decode_attention`` cannot run for a model on `device` with this head dim and q/k/v dtype; None if it
    can. For callers choosing between the fused op and the reference."""
    return kernel_unsupported_reason(device, head_dim, dtype, HEAD_DIMS)


def _check(q, k, v, bias, visible, scale) -> None:
    tensors = {"q": q, "k": k, "v": v, "visible": visible, **({} if bias is None else {"bias": bias})}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{OP}: {name} must be a torch.Tensor{' or None' if name == 'bias' else ''}, "
                             f"got {type(t).__name__}")
    B, n, H, D, S = check_cached_qkv(OP, q, k, v, HEAD_DIMS)
    if bias is not None:
        if bias.dim() != 4 or bias.shape[1] not in (1, H) or bias.shape[0] != B or bias.shape[2:] != (n, S):
            raise ValueError(f"{OP}: bias must be None or (B, H or 1, n, S) = ({B}, {H} or 1, {n}, {S}), got "
                             f"{tuple(bias.shape)}")
        if bias.dtype != torch.float32:
            raise ValueError(f"{OP}: bias must be float32, got {bias.dtype}")
    if visible.shape != (B, H, n, S):
        raise ValueError(f"{OP}: visible must be (B, H, n, S) = {(B, H, n, S)}, got {tuple(visible.shape)}")
    if visible.dtype != torch.bool:
        raise ValueError(f"{OP}: visible must be a bool tensor, got {visible.dtype}")
    check_device(OP, tensors)
    if scale is None:
        raise ValueError(f"{OP}: scale must be a finite float, got None")
    check_scale(OP, scale)
    check_inference_only(OP, tensors)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                     visible: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q·kᵀ·scale + bias) · v over the visible slots, fused: q (B, n, H, D); k, v (B, H, S, D); bias (B, H or
    1, n, S) float32 or None; visible (B, H, n, S) bool -> (B, n, H, D) in v's dtype. Same semantics as
    ``cached_attention`` (naive.py), inference only; see the module docstring."""
    _check(q, k, v, bias, visible, scale)
    q, k, v = unit_last_stride(q, k, v)
    B, n, H, D = q.shape
    S = k.shape[2]
    rows = B * H * n
    block, chunk, splits, sb = plan_splits(rows, S, D, q.device)
    out = empty_output((B, n, H, D), dtype=v.dtype, device=q.device)
    m = empty_output((rows, splits), dtype=torch.float32, device=q.device)
    l = empty_output((rows, splits), dtype=torch.float32, device=q.device)
    acc = empty_output((rows, splits, D), dtype=torch.float32, device=q.device)
    vis = visible.view(torch.uint8)  # same strides; a bool pointer is an int1 one in Triton
    if bias is None:
        bias_arg, bias_strides = vis, (0, 0, 0, 0)  # never read
    else:
        bias_arg = bias
        bias_strides = (bias.stride(0), bias.stride(1) if bias.shape[1] > 1 else 0, bias.stride(2), bias.stride(3))
    load_kernels()._decode_attn_partial_kernel[(rows, splits)](
        q, k, v, bias_arg, vis, m, l, acc,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), *bias_strides, *vis.stride(),
        H, n, S, chunk, splits, float(scale),
        D=D, BLOCK_S=block, HAS_BIAS=bias is not None, **_launch_cfg("partial", D), **TRITON_OPTIONS,
    )
    load_kernels()._decode_attn_combine_kernel[(rows,)](
        m, l, acc, out, out.stride(0), out.stride(1), out.stride(2), H, n, splits,
        D=D, SB=sb, **_launch_cfg("combine", D), **TRITON_OPTIONS,
    )
    return out


# The same op as one opaque node for torch.compile: Dynamo traces through the fake below instead of breaking the graph
# at every layer (as torch.compiler.disable would), and Inductor calls the kernels between the code it fuses. The
# schema is spelled out so that it does not depend on how a torch version reads this module's string annotations.
@torch.library.custom_op("fpa_lightning::decode_attention", mutates_args=(),
                         schema="(Tensor q, Tensor k, Tensor v, Tensor? bias, Tensor visible, float scale) -> Tensor")
def decode_attention_op(q, k, v, bias, visible, scale):
    """``decode_attention`` registered as a torch.library custom op (same signature, checks and result)."""
    return decode_attention(q, k, v, bias, visible, scale)


@decode_attention_op.register_fake
def _decode_attention_shape(q, k, v, bias, visible, scale):
    return q.new_empty(q.shape, dtype=v.dtype)
