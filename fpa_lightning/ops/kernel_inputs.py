"""What the fused Triton ops share around their kernels: the head dims they are built for, the checks of q, k, v, the
scale and document ids (each op adds the checks of its own inputs; every message starts with the op's name), their
output buffers (with the test hook that poisons them), the environment overrides of launch settings that A/B
benchmarks use, and triton itself.

triton is imported only where a fused kernel is launched (each fused.py's ``load_kernels``): the naive and chunked
paths need none, and torch's CPU wheel does not bring it, so the package (and an export's remote code) imports
without it; a fused op asked for without it raises ``require_triton``'s error.
"""
from __future__ import annotations

import importlib.util
import math
import os

import torch

QKV_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
HEAD_DIMS = (16, 32, 64, 128)
"""Head dims every Triton kernel of ops/ is built for (the attention backends refuse others for impl='fused')."""

TRITON_OPTIONS = {"enable_fp_fusion": True}
"""Compile options of every kernel launch in ops/: FMA contraction on, which Triton 3.6 and 3.9 default to and every
measurement and tolerance of docs/kernel.md assumes. Triton 3.10 turns the default off (slower loops, other
roundings), and 3.9 warns at every compile that leaves it unset; the interpreter ignores it."""

# Test hook, for tests only: when True, every output and scratch buffer of a fused op starts as NaN (an integer one as
# −1), so an element a kernel forgets to write (or a read of one never written) shows up in the result instead of
# hiding behind torch.empty's leftovers.
TEST_HOOK_POISON_OUTPUTS = False


def empty_output(shape, *, dtype: torch.dtype, device) -> torch.Tensor:
    """torch.empty for a fused op's output or scratch buffer; NaN (−1 for an integer dtype) under
    TEST_HOOK_POISON_OUTPUTS."""
    if TEST_HOOK_POISON_OUTPUTS:
        return torch.full(shape, float("nan") if dtype.is_floating_point else -1, dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def unit_last_stride(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors as the kernels read them: each as it is when its last dimension is contiguous (the kernels take
    every other stride as an argument, so views of a packed projection need no copy), else a contiguous copy."""
    return tuple(t if t.stride(-1) == 1 else t.contiguous() for t in tensors)


def interpreting() -> bool:
    """Whether Triton runs in its CPU interpreter (TRITON_INTERPRET=1, set before the kernels are imported)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


TRITON_MISSING = ("triton is not installed (torch's CPU wheel does not bring it): pip install triton, or run the "
                  "chunked or naive path")


def triton_available() -> bool:
    """Whether triton can be found, without importing it (an import takes about a second)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # an import hook that refuses it, or a half-removed module
        return False


def require_triton(op: str) -> None:
    """Import triton for a fused op's kernels, or raise a RuntimeError that says what is missing (never a silent
    fallback to another path). TRITON_INTERPRET is read when the kernels are decorated, i.e. after this."""
    try:
        import triton  # noqa: F401
    except ImportError as err:
        raise RuntimeError(f"{op}: the fused path runs Triton kernels, and {TRITON_MISSING}") from err


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for launch grids (triton.cdiv, without importing triton)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (0 for n <= 0, as triton.next_power_of_2)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def check_qkv(op: str, q, k, v, head_dims: tuple[int, ...], others: dict | None = None) -> tuple[int, int, int, int]:
    """q, k, v: tensors of one shape (B, T, H, D), non-empty, D in head_dims, one dtype of QKV_DTYPES, on one CUDA
    device (or any device under the interpreter) with the tensors in `others` ({name: tensor}, checked to be
    tensors first). Returns (B, T, H, D)."""
    tensors = {"q": q, "k": k, "v": v, **(others or {})}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 4:
        raise ValueError(f"{op}: q must be (B, T, H, D), got shape {tuple(q.shape)}")
    B, T, H, D = q.shape
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"{op}: q, k, v must share one shape (B, T, H, D); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if T < 1 or B < 1 or H < 1:
        raise ValueError(f"{op}: empty input shape {tuple(q.shape)}")
    check_head_dim_and_dtype(op, q, k, v, head_dims)
    return B, T, H, D


def unsupported_reason(device: torch.device, head_dim: int, dtype: torch.dtype,
                       head_dims: tuple[int, ...]) -> str | None:
    """Why a Triton op built for `head_dims` cannot run for a model on `device` with this head dim and q/k/v dtype;
    None if it can (each op's ``unsupported_reason`` passes its own head dims)."""
    if not triton_available():
        return TRITON_MISSING
    if device.type != "cuda" and not interpreting():
        return f"it needs a CUDA device (or TRITON_INTERPRET=1 before importing, the CPU interpreter), got {device}"
    if head_dim not in head_dims:
        return f"the head dim must be one of {head_dims}, got {head_dim}"
    if dtype not in QKV_DTYPES:
        return f"q, k, v must be bf16, fp16 or fp32, got {dtype}"
    return None


def check_cached_qkv(op: str, q, k, v, head_dims: tuple[int, ...]) -> tuple[int, int, int, int, int]:
    """The decode ops' queries and KV cache: q (B, n, H, D) and k, v (B, H, S, D) tensors (checked to be tensors
    by the caller), non-empty, D in head_dims, one dtype of QKV_DTYPES. Returns (B, n, H, D, S)."""
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"{op}: q must be (B, n, H, D) and k, v (B, H, S, D); got shapes {tuple(q.shape)}, "
                         f"{tuple(k.shape)}")
    B, n, H, D = q.shape
    S = k.shape[2]
    if k.shape != (B, H, S, D) or v.shape != k.shape:
        raise ValueError(f"{op}: k and v must be (B, H, S, D) = ({B}, {H}, S, {D}) for q of shape "
                         f"{tuple(q.shape)}; got {tuple(k.shape)}, {tuple(v.shape)}")
    if min(B, n, H, S) < 1:
        raise ValueError(f"{op}: empty input: q {tuple(q.shape)}, k {tuple(k.shape)}")
    check_head_dim_and_dtype(op, q, k, v, head_dims)
    return B, n, H, D, S


def check_head_dim_and_dtype(op: str, q, k, v, head_dims: tuple[int, ...]) -> None:
    """q's last dim (the head dim) in head_dims, and q, k, v of one dtype of QKV_DTYPES."""
    D = q.shape[-1]
    if D not in head_dims:
        raise ValueError(f"{op}: head dim D must be one of {head_dims}, got {D}")
    if q.dtype not in QKV_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"{op}: q, k, v must share one dtype among bf16, fp16, fp32; got "
                         f"{q.dtype}, {k.dtype}, {v.dtype}")


def check_device(op: str, tensors: dict) -> torch.device:
    """Every tensor of {name: tensor} on one device, a CUDA one unless the interpreter runs; returns it."""
    devs = {t.device for t in tensors.values()}
    if len(devs) != 1:
        raise ValueError(f"{op}: all inputs must be on one device, got {sorted(map(str, devs))}")
    dev = next(iter(devs))
    if dev.type != "cuda" and not interpreting():
        raise ValueError(f"{op}: inputs must be CUDA tensors (or set TRITON_INTERPRET=1 before "
                         f"importing for the CPU interpreter); got device {dev}")
    return dev


def check_inference_only(op: str, tensors: dict) -> None:
    """An inference-only op (no backward) refuses, clearly, inputs of {name: tensor} that require grad while grad
    mode is on."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors.values()):
        raise ValueError(f"{op}: inference only, there is no backward; call it under torch.no_grad() (or "
                         "torch.inference_mode()), or with inputs that do not require grad")


def check_scale(op: str, scale) -> None:
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise ValueError(f"{op}: scale must be a finite float or None, got {scale!r}")


def check_segment_ids(op: str, segment_ids, B: int, T: int, dev: torch.device) -> None:
    """None, or integer document ids (B, T) on `dev`."""
    if segment_ids is None:
        return
    if not isinstance(segment_ids, torch.Tensor) or segment_ids.shape != (B, T):
        raise ValueError(f"{op}: segment_ids must be a (B, T) = {(B, T)} tensor, got "
                         f"{getattr(segment_ids, 'shape', type(segment_ids).__name__)}")
    if segment_ids.dtype.is_floating_point or segment_ids.dtype.is_complex or segment_ids.dtype == torch.bool:
        raise ValueError(f"{op}: segment_ids must be integer document ids, got {segment_ids.dtype}")
    if segment_ids.device != dev:
        raise ValueError(f"{op}: segment_ids must be on {dev}, got {segment_ids.device}")


def env_int(name: str) -> int | None:
    """The environment variable `name` as an int, or None when unset (A/B benchmarks only)."""
    value = os.environ.get(name)
    return int(value) if value else None


def with_env_overrides(cfg: dict, prefix: str, keys: tuple[tuple[str, str], ...]) -> dict:
    """`cfg` with each (key, SUFFIX) of `keys` replaced by the environment variable <prefix>_<SUFFIX> where it is
    set, e.g. FPA_DQ_WARPS for ("num_warps", "WARPS") under prefix "FPA_DQ" (A/B benchmarks only)."""
    for key, suffix in keys:
        value = env_int(f"{prefix}_{suffix}")
        if value is not None:
            cfg[key] = value
    return cfg


def outputs_setup_context(save):
    """The ``setup_context`` of a fused op's forward whose first output is the attention output and whose other
    outputs are buffers for its backward: those are marked non-differentiable, and ``save(ctx, inputs, output)``
    saves what the backward reads (tensors in ``ctx.saved_tensors``, the rest in the tuple ``ctx.cfg``)."""

    def setup_context(ctx, inputs, output) -> None:
        ctx.mark_non_differentiable(*output[1:])
        save(ctx, inputs, output)

    return setup_context


def register_op_autograd(forward_op, backward_op, save, n_inputs: int) -> None:
    """The autograd of a fused op's forward custom op (set up by ``outputs_setup_context(save)``): the backward
    returns ``backward_op(do, *ctx.saved_tensors, *ctx.cfg)``, one gradient for each of the first inputs and None
    for the rest of the ``n_inputs``."""

    def backward(ctx, do, *_buffers):  # _buffers: gradients of the non-differentiable outputs
        grads = backward_op(do, *ctx.saved_tensors, *ctx.cfg)
        return (*grads, *(None,) * (n_inputs - len(grads)))

    forward_op.register_autograd(backward, setup_context=outputs_setup_context(save))

