"""Fused FPA piece attention (Triton, inference only): naive.py's definition without any (n, S) tensor.

    fpa_piece_attention(q, k, v, key_pos, path_min, level, phi, beta, start, scale, threshold)
        -> out (B, n, H, D) in v's dtype, kept (B, H, n) int64

Shapes and meaning as in naive.py. q, k, v in bf16, fp16 or fp32 (one dtype), head dim 16, 32, 64 or 128; key_pos
int32; path_min, level, phi, beta float32 (FPA's fields are); start int64; on one CUDA device (or any under the
interpreter). No backward: with grad mode on, an input that requires grad raises ValueError. Anything else that does
not fit raises ValueError; there is no silent fallback.

One launch per layer replaces the reference's path-minimum table, bias, eviction mask, einsums and softmax over
(B, H, n, S): scoring a long document with real eviction made several such tensors per layer and piece
(BENCHMARKS.md, "Scoring with real eviction (H200)"). The piece's φ goes in as a sparse table of range minima, log₂ n
levels of n (kernels.py says how it is read). Layout follows ops/decode: input checks here, kernels in kernels.py.
"""
from __future__ import annotations

import functools
import torch
import torch.nn.functional as F

from fpa_lightning.ops.common import FAR
from fpa_lightning.ops.kernel_inputs import HEAD_DIMS, TRITON_OPTIONS, cdiv, empty_output, require_triton
from fpa_lightning.ops.kernel_inputs import (check_cached_qkv, check_device, check_inference_only, check_scale,
                                            env_int)
from fpa_lightning.ops.kernel_inputs import unsupported_reason as kernel_unsupported_reason
from fpa_lightning.ops.kernel_inputs import unit_last_stride, with_env_overrides
from fpa_lightning.ops.kernel_inputs import interpreting as _interpreting

OP = "fpa_piece_attention"
# GPU launch choices from an A/B on an H200 (benchmarks/piece_attention.py, KERNEL_LOG.md, "FPA piece attention", p3):
# 64 queries × 128 slots per step on 4 warps, 2 stages; 128 slots took less time than 64 for long pieces, while 128
# queries, 8 warps, 3 stages or 32-wide blocks were slower or no faster. The interpreter: 16 × 16, so
# its tiny tests cross query tiles and slot blocks. PIECE_BLOCK_M, PIECE_BLOCK_N, PIECE_WARPS and PIECE_STAGES
# override them (A/B benchmarks only).
GPU_BLOCKS, INTERPRETER_BLOCKS = (64, 128), (16, 16)


@functools.cache
def load_kernels():
    """kernels.py, imported at the first launch: its @triton.jit kernels need triton, which the naive and chunked
    paths (and so the package, and an export's remote code) do without (``kernel_inputs.require_triton``)."""
    require_triton(OP)
    from fpa_lightning.ops.fpa.piece import kernels
    return kernels


def unsupported_reason(device: torch.device, head_dim: int, dtype: torch.dtype) -> str | None:
    """Why ``fpa_piece_attention`` cannot run for a model on `device` with this head dim and q/k/v dtype; None if it
    can. For callers choosing between the fused op and the reference."""
    return kernel_unsupported_reason(device, head_dim, dtype, HEAD_DIMS)


def _check(q, k, v, key_pos, path_min, level, phi, beta, start, scale, threshold) -> None:
    tensors = {"q": q, "k": k, "v": v, "key_pos": key_pos, "path_min": path_min, "level": level, "phi": phi,
               "beta": beta, "start": start}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{OP}: {name} must be a torch.Tensor, got {type(t).__name__}")
    B, n, H, D, S = check_cached_qkv(OP, q, k, v, HEAD_DIMS)
    wanted = {"key_pos": ((B, H, S), torch.int32), "path_min": ((B, H, S), torch.float32),
              "level": ((B, H, S), torch.float32), "phi": ((B, H, n), torch.float32), "beta": ((H,), torch.float32),
              "start": ((B,), torch.int64)}
    for name, (shape, dtype) in wanted.items():
        t = tensors[name]
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise ValueError(f"{OP}: {name} must be {dtype} of shape {shape}, got {t.dtype} {tuple(t.shape)}")
    check_device(OP, tensors)
    if scale is None:
        raise ValueError(f"{OP}: scale must be a finite float, got None")
    check_scale(OP, scale)
    if not isinstance(threshold, (int, float)) or threshold != threshold or threshold == float("inf"):
        raise ValueError(f"{OP}: threshold must be a float below +inf (−inf: no eviction), got {threshold!r}")
    check_inference_only(OP, tensors)


def range_min_table(phi: torch.Tensor) -> torch.Tensor:
    """phi (B, H, n) -> the sparse table (B·H, LEVELS, n) float32 with [k][i] = min phi[i, i + 2^k) (FAR past n):
    LEVELS = ⌊log₂ n⌋ + 1 minima of pairs from the level below."""
    level = phi.reshape(-1, phi.shape[-1]).float()
    levels, width = [level], 1
    while 2 * width <= phi.shape[-1]:
        level = torch.minimum(level, F.pad(level[:, width:], (0, width), value=FAR))  # one op for the shifted level
        levels.append(level)
        width *= 2
    return torch.stack(levels, dim=1).contiguous()


def _blocks() -> tuple[int, int]:
    block_m, block_n = INTERPRETER_BLOCKS if _interpreting() else GPU_BLOCKS
    return env_int("PIECE_BLOCK_M") or block_m, env_int("PIECE_BLOCK_N") or block_n


def _launch_cfg() -> dict:
    if _interpreting():
        return {}
    return with_env_overrides({"num_warps": 4, "num_stages": 2}, "PIECE", (("num_warps", "WARPS"),
                                                                           ("num_stages", "STAGES")))


def fpa_piece_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_pos: torch.Tensor,
                        path_min: torch.Tensor, level: torch.Tensor, phi: torch.Tensor, beta: torch.Tensor,
                        start: torch.Tensor, scale: float, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """FPA attention of n consecutive queries over the KV cache with threshold eviction, fused: out (B, n, H, D),
    kept (B, H, n). Same semantics as naive.py's ``fpa_piece_attention``, inference only; see the module doc."""
    _check(q, k, v, key_pos, path_min, level, phi, beta, start, scale, threshold)
    B, n, H, D = q.shape
    S = k.shape[2]
    q, k, v = unit_last_stride(q, k, v)
    start, beta = start.contiguous(), beta.contiguous()  # read by index: start is often a column of query_pos
    rmq = range_min_table(phi)
    block_m, block_n = _blocks()
    out = empty_output((B, n, H, D), dtype=v.dtype, device=q.device)
    kept = empty_output((B * H, n), dtype=torch.int32, device=q.device)
    load_kernels()._fpa_piece_kernel[(cdiv(n, block_m), B * H)](
        q, k, v, key_pos, path_min, level, rmq, start, beta, out, kept,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), *key_pos.stride(), *path_min.stride(), *level.stride(),
        out.stride(0), out.stride(1), out.stride(2),
        H, n, S, rmq.shape[1], float(scale), float(threshold),
        D=D, BLOCK_M=block_m, BLOCK_N=block_n, PREC="ieee" if q.dtype == torch.float32 else "tf32",
        **_launch_cfg(), **TRITON_OPTIONS,
    )
    return out, kept.view(B, H, n).long()
