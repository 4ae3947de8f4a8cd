"""The decoding step's ops fused (Triton, inference only): naive.py's definitions, one launch each (step_attention:
two, a split-K pass and ops/decode's combine).

A decoding step at batch 1 is bound by its number of kernels, not by bytes (BENCHMARKS.md, "Decoding with the KV
cache (H200)"): the composite RMSNorm, RoPE, the cache's scatters, the visibility mask, FPA's gate map and path minimum
took about 50 small kernels per layer around the 4 matmuls. With these ops a layer runs 10: add_rms_norm, the qkv
matmul, store_token, step_attention (2), the out matmul, add_rms_norm, gate_up, silu_mul, down.

Inputs: activations, q, k, v and the caches in bf16, fp16 or fp32 (the caches in the activations' dtype), head dim 16,
32, 64 or 128; key_pos int32, positions int64; FPA's state, the RoPE tables and the gate map float32; on one CUDA
device (or any under the interpreter). With grad mode on, an input that requires grad raises ValueError (no
backward). Anything else that does not fit raises ValueError; there is no silent fallback.

Each op is also a torch.library custom op (``*_op``), so that a compiled step (``DecodeSession(compile=True)``)
traces it as one node that mutates the caches it names, instead of breaking the graph at every layer.
"""
from __future__ import annotations

import functools

import torch

from fpa_lightning.ops.decode.fused import load_kernels as load_decode_kernels
from fpa_lightning.ops.decode.fused import plan_splits
from fpa_lightning.ops.kernel_inputs import HEAD_DIMS, TRITON_OPTIONS, cdiv, next_power_of_2, require_triton
from fpa_lightning.ops.kernel_inputs import (QKV_DTYPES, check_device, check_inference_only, check_scale,
                                            env_int)
from fpa_lightning.ops.kernel_inputs import interpreting as _interpreting

MAX_WIDTH = 16384
"""The widest row add_rms_norm takes (one program holds a row)."""

# GPU launch choices, from A/Bs on an H200 at batch 1, one process per setting (KERNEL_LOG.md, "The decoding step", s1
# and s2): a norm row on 4 warps (8 from 4096 values) and silu_mul blocks of 1024 on 4 warps, set by
# reasoning; store_token appending on 1 warp (a head is 64 values; 4 warps were no faster), evicting on 4 warps with
# its slot scan in blocks of 4096 (faster than 1 warp and blocks of 1024); step_attention planned as ops/decode's
# partial kernel (chunks of at least MIN_CHUNK slots, PROGRAMS_PER_SM programs per SM) on 8192-value blocks (128 slots
# at D = 64) and 4 warps, with or without FPA's state (faster than 8 warps, and for FPA than 64-slot blocks). The
# interpreter: ops/decode's attention plan (blocks of 8 slots in chunks of 16), a scan block of 8 and a gate block of
# 16, so its tiny tests cross every boundary. STEP_BLOCK_S, STEP_CHUNK and STEP_WARPS override the attention's blocks
# and warps, STEP_STORE_WARPS and STEP_SCAN_BLOCK store_token's warps and slot-scan block (A/B benchmarks only).
_INTERPRETER = {"scan": 8, "gate": 16}


@functools.cache
def load_kernels():
    """kernels.py, imported at the first launch: its @triton.jit kernels need triton, which the naive and chunked
    paths (and so the package, and an export's remote code) do without (``kernel_inputs.require_triton``)."""
    require_triton("the decoding step's fused ops")
    from fpa_lightning.ops.decode.step import kernels
    return kernels


def _fail(op: str, message: str):
    raise ValueError(f"{op}: {message}")


def _check_tensors(op: str, tensors: dict) -> None:
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            _fail(op, f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_device(op, tensors)
    check_inference_only(op, tensors)


def _check_like(op: str, tensors: dict, wanted: dict) -> None:
    """Each tensors[name] is contiguous with wanted[name] = (shape, dtype)."""
    for name, (shape, dtype) in wanted.items():
        t = tensors[name]
        if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
            _fail(op, f"{name} must be {dtype} of shape {tuple(shape)}, got {t.dtype} {tuple(t.shape)}")
        if not t.is_contiguous():
            _fail(op, f"{name} must be contiguous")


# --- add_rms_norm -------------------------------------------------------------------------------------------------
def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """naive.py's ``add_rms_norm`` in one kernel: x (..., C) contiguous, delta like x or None, weight (C,). The sum
    is a new tensor even without delta (a copy of x, made by the same kernel), so the custom op's outputs never
    alias its inputs."""
    op = "add_rms_norm"
    _check_tensors(op, {"x": x, "weight": weight, **({} if delta is None else {"delta": delta})})
    if x.dtype not in QKV_DTYPES or x.dim() < 1 or x.numel() == 0 or not x.is_contiguous():
        _fail(op, f"x must be a non-empty contiguous bf16, fp16 or fp32 tensor (..., C), got {x.dtype} "
                  f"{tuple(x.shape)}")
    C = x.shape[-1]
    if C > MAX_WIDTH:
        _fail(op, f"rows of at most {MAX_WIDTH} values, got {C}")
    if delta is not None:
        _check_like(op, {"delta": delta}, {"delta": (x.shape, x.dtype)})
    if weight.shape != (C,):
        _fail(op, f"weight must have shape ({C},), got {tuple(weight.shape)}")
    if not isinstance(eps, float) or not eps >= 0:
        _fail(op, f"eps must be a float >= 0, got {eps!r}")
    total, out = torch.empty_like(x), torch.empty_like(x)
    block = next_power_of_2(C)
    launch = {} if _interpreting() else {"num_warps": 8 if block >= 4096 else 4}
    load_kernels()._add_rms_norm_kernel[(x.numel() // C,)](
        x, x if delta is None else delta, weight.contiguous(), total, out, C, eps,
        BLOCK_C=block, HAS_DELTA=delta is not None, **launch, **TRITON_OPTIONS)
    return total, out


@torch.library.custom_op("fpa_lightning::add_rms_norm", mutates_args=(),
                         schema="(Tensor x, Tensor? delta, Tensor weight, float eps) -> (Tensor, Tensor)")
def add_rms_norm_op(x, delta, weight, eps):
    """``add_rms_norm`` as a custom op."""
    return add_rms_norm(x, delta, weight, eps)


@add_rms_norm_op.register_fake
def _add_rms_norm_shape(x, delta, weight, eps):
    return torch.empty_like(x), torch.empty_like(x)


# --- silu_mul -----------------------------------------------------------------------------------------------------
def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """naive.py's (ops.common's) ``silu_mul`` in one kernel: gate_up (..., 2F) contiguous -> (..., F)."""
    op = "silu_mul"
    _check_tensors(op, {"gate_up": gate_up})
    if (gate_up.dtype not in QKV_DTYPES or gate_up.dim() < 1 or gate_up.numel() == 0 or gate_up.shape[-1] % 2
            or not gate_up.is_contiguous()):
        _fail(op, f"gate_up must be a non-empty contiguous bf16, fp16 or fp32 tensor (..., 2F), got {gate_up.dtype} "
                  f"{tuple(gate_up.shape)}")
    width = gate_up.shape[-1] // 2
    out = gate_up.new_empty(*gate_up.shape[:-1], width)
    block = 16 if _interpreting() else 1024
    load_kernels()._silu_mul_kernel[(gate_up.numel() // (2 * width), cdiv(width, block))](
        gate_up, out, width, BLOCK=block, **TRITON_OPTIONS)
    return out


@torch.library.custom_op("fpa_lightning::silu_mul", mutates_args=(), schema="(Tensor gate_up) -> Tensor")
def silu_mul_op(gate_up):
    """``silu_mul`` as a custom op."""
    return silu_mul(gate_up)


@silu_mul_op.register_fake
def _silu_mul_shape(gate_up):
    return gate_up.new_empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2)


# --- store_token --------------------------------------------------------------------------------------------------
def _check_store(qkv, positions, cos, sin, k_cache, v_cache, key_pos, fpa: dict | None) -> None:
    op = "store_token"
    if (cos is None) != (sin is None):
        _fail(op, "cos and sin go together (both None: no RoPE)")
    tensors = {"qkv": qkv, "positions": positions, "k_cache": k_cache, "v_cache": v_cache, "key_pos": key_pos,
               **({} if cos is None else {"cos": cos, "sin": sin}), **(fpa or {})}
    _check_tensors(op, tensors)
    if k_cache.dim() != 4:
        _fail(op, f"k_cache must be (B, H, S, D), got {tuple(k_cache.shape)}")
    B, H, S, D = k_cache.shape
    if D not in HEAD_DIMS:
        _fail(op, f"head dim D must be one of {HEAD_DIMS}, got {D}")
    if k_cache.dtype not in QKV_DTYPES or v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype:
        _fail(op, f"k_cache and v_cache must share one shape and one dtype among bf16, fp16, fp32; got "
                  f"{k_cache.dtype} {tuple(k_cache.shape)}, {v_cache.dtype} {tuple(v_cache.shape)}")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.stride(-1) != 1:
            _fail(op, f"{name}'s last dimension must be contiguous")
    _check_like(op, {"qkv": qkv, "positions": positions},
                {"qkv": ((B, 3 * H * D), k_cache.dtype), "positions": ((B,), torch.int64)})
    if key_pos.shape != (B, H, S) or key_pos.dtype != torch.int32 or key_pos.stride(-1) != 1:
        _fail(op, f"key_pos must be int32 of shape {(B, H, S)} with a contiguous last dimension, got "
                  f"{key_pos.dtype} {tuple(key_pos.shape)}")
    if cos is not None:
        for name, table in (("cos", cos), ("sin", sin)):
            if table.dim() != 2 or table.shape[1] != D or table.dtype != torch.float32 or table.stride(-1) != 1:
                _fail(op, f"{name} must be a float32 table (L, {D}) with a contiguous last dimension, got "
                          f"{table.dtype} {tuple(table.shape)}")
    if fpa is not None:
        C = fpa["x"].shape[-1]
        maps = fpa["gate_weight"].shape[0] // H
        if fpa["gate_weight"].dim() != 2 or maps not in (1, 2, 3) or fpa["gate_weight"].shape[0] != maps * H:
            _fail(op, f"gate_weight must be (G·H, C) with G in 1, 2, 3 and H = {H}, got "
                      f"{tuple(fpa['gate_weight'].shape)}")
        if fpa["x"].dtype not in QKV_DTYPES:
            _fail(op, f"x must be bf16, fp16 or fp32, got {fpa['x'].dtype}")
        _check_like(op, fpa, {"gate_weight": ((maps * H, C), torch.float32), "gate_bias": ((maps * H,), torch.float32),
                              "x": ((B, C), fpa["x"].dtype), "walk": ((B, H), torch.float32)})
        for name in ("level", "path_min"):
            t = fpa[name]
            if t.shape != (B, H, S) or t.dtype != torch.float32 or t.stride(-1) != 1:
                _fail(op, f"{name} must be float32 of shape {(B, H, S)} with a contiguous last dimension, got "
                          f"{t.dtype} {tuple(t.shape)}")


def store_token(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
                k_cache: torch.Tensor, v_cache: torch.Tensor, key_pos: torch.Tensor, append: bool,
                gate_weight: torch.Tensor | None = None, gate_bias: torch.Tensor | None = None,
                x: torch.Tensor | None = None, walk: torch.Tensor | None = None, level: torch.Tensor | None = None,
                path_min: torch.Tensor | None = None):
    """naive.py's ``store_token`` in one kernel (same arguments and results). Without eviction (append) the caller
    guarantees that every position is below S, with eviction that a free slot exists."""
    names = ("gate_weight", "gate_bias", "x", "walk", "level", "path_min")
    given = dict(zip(names, (gate_weight, gate_bias, x, walk, level, path_min)))
    if any(t is None for t in given.values()) and any(t is not None for t in given.values()):
        _fail("store_token", "FPA's gate map needs all of gate_weight, gate_bias, x, walk, level, path_min (or none)")
    fpa = given if gate_weight is not None else None
    _check_store(qkv, positions, cos, sin, k_cache, v_cache, key_pos, fpa)
    B, H, S, D = k_cache.shape
    q, k = qkv.new_empty(B, H, D), qkv.new_empty(B, H, D)
    slots = torch.empty(B, H, dtype=torch.int64, device=qkv.device)
    phi = torch.empty(B, H, dtype=torch.float32, device=qkv.device) if fpa else None
    state = fpa or {}
    dummy = key_pos  # never read when its flag is off
    C = x.shape[-1] if fpa else 1
    interpreting = _interpreting()
    load_kernels()._store_token_kernel[(B, H)](
        qkv, positions, cos if cos is not None else dummy, sin if sin is not None else dummy,
        k_cache, v_cache, key_pos, q, k, slots,
        *(state.get(name, dummy) for name in ("gate_weight", "gate_bias", "x", "walk", "level", "path_min")),
        phi if phi is not None else dummy,
        qkv.stride(0), *k_cache.stride()[:3], *v_cache.stride()[:3], *key_pos.stride()[:2],
        cos.stride(0) if cos is not None else 0,
        *(level.stride()[:2] if fpa else (0, 0)), *(path_min.stride()[:2] if fpa else (0, 0)),
        H, S, C,
        D=D, HAS_ROPE=cos is not None, APPEND=bool(append),
        BLOCK_S=_INTERPRETER["scan"] if interpreting else env_int("STEP_SCAN_BLOCK") or 4096,
        FPA=fpa is not None, MAPS=gate_weight.shape[0] // H if fpa else 1,
        BLOCK_C=_INTERPRETER["gate"] if interpreting else min(1024, next_power_of_2(C)),
        **({} if interpreting else {"num_warps": env_int("STEP_STORE_WARPS") or (1 if append else 4)}),
        **TRITON_OPTIONS,
    )
    return q, k, slots, phi


@torch.library.custom_op("fpa_lightning::store_token",
                         mutates_args=("k_cache", "v_cache", "key_pos", "walk", "level", "path_min"),
                         schema="(Tensor qkv, Tensor positions, Tensor? cos, Tensor? sin, Tensor(a!) k_cache, "
                                "Tensor(b!) v_cache, Tensor(c!) key_pos, bool append, Tensor? gate_weight, "
                                "Tensor? gate_bias, Tensor? x, Tensor(d!)? walk, Tensor(e!)? level, "
                                "Tensor(f!)? path_min) -> (Tensor, Tensor, Tensor, Tensor)")
def store_token_op(qkv, positions, cos, sin, k_cache, v_cache, key_pos, append, gate_weight, gate_bias, x, walk,
                   level, path_min):
    """``store_token`` as a custom op; without FPA its φ is an empty tensor (a custom op's outputs are tensors)."""
    q, k, slots, phi = store_token(qkv, positions, cos, sin, k_cache, v_cache, key_pos, append, gate_weight,
                                   gate_bias, x, walk, level, path_min)
    return q, k, slots, qkv.new_empty(0, dtype=torch.float32) if phi is None else phi


@store_token_op.register_fake
def _store_token_shape(qkv, positions, cos, sin, k_cache, v_cache, key_pos, append, gate_weight, gate_bias, x, walk,
                       level, path_min):
    B, H, _, D = k_cache.shape
    phi = qkv.new_empty((0,) if gate_weight is None else (B, H), dtype=torch.float32)
    return qkv.new_empty(B, H, D), qkv.new_empty(B, H, D), qkv.new_empty(B, H, dtype=torch.int64), phi


# --- step_attention -----------------------------------------------------------------------------------------------
def _check_attention(q, k_cache, v_cache, key_pos, positions, scale, fpa: dict | None, threshold) -> None:
    op = "step_attention"
    _check_tensors(op, {"q": q, "k_cache": k_cache, "v_cache": v_cache, "key_pos": key_pos, "positions": positions,
                        **(fpa or {})})
    if k_cache.dim() != 4 or q.dim() != 3:
        _fail(op, f"q must be (B, H, D) and k_cache, v_cache (B, H, S, D); got {tuple(q.shape)}, "
                  f"{tuple(k_cache.shape)}")
    B, H, S, D = k_cache.shape
    if D not in HEAD_DIMS:
        _fail(op, f"head dim D must be one of {HEAD_DIMS}, got {D}")
    if S < 1 or q.shape != (B, H, D) or v_cache.shape != k_cache.shape:
        _fail(op, f"q must be (B, H, D) = {(B, H, D)} and v_cache like k_cache {tuple(k_cache.shape)} (S >= 1); got "
                  f"{tuple(q.shape)}, {tuple(v_cache.shape)}")
    if q.dtype not in QKV_DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        _fail(op, f"q, k_cache, v_cache must share one dtype among bf16, fp16, fp32; got {q.dtype}, "
                  f"{k_cache.dtype}, {v_cache.dtype}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("key_pos", key_pos)):
        if t.stride(-1) != 1:
            _fail(op, f"{name}'s last dimension must be contiguous")
    if key_pos.shape != (B, H, S) or key_pos.dtype != torch.int32:
        _fail(op, f"key_pos must be int32 of shape {(B, H, S)}, got {key_pos.dtype} {tuple(key_pos.shape)}")
    _check_like(op, {"positions": positions}, {"positions": ((B,), torch.int64)})
    check_scale(op, scale)
    if fpa is not None:
        for name in ("path_min", "level"):
            t = fpa[name]
            if t.shape != (B, H, S) or t.dtype != torch.float32 or t.stride(-1) != 1:
                _fail(op, f"{name} must be float32 of shape {(B, H, S)} with a contiguous last dimension, got "
                          f"{t.dtype} {tuple(t.shape)}")
        _check_like(op, fpa, {"phi": ((B, H), torch.float32), "beta_raw": ((H,), torch.float32)})
    if not isinstance(threshold, (int, float)) or threshold != threshold or threshold == float("inf"):
        _fail(op, f"threshold must be a float below +inf (−inf: no eviction), got {threshold!r}")
    if fpa is None and threshold > float("-inf"):
        _fail(op, "a threshold evicts by FPA's bias: it needs path_min, level, phi and beta_raw")


def step_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, key_pos: torch.Tensor,
                   positions: torch.Tensor, scale: float, path_min: torch.Tensor | None = None,
                   level: torch.Tensor | None = None, phi: torch.Tensor | None = None,
                   beta_raw: torch.Tensor | None = None, threshold: float = float("-inf")) -> torch.Tensor:
    """naive.py's ``step_attention`` as split-K kernels (same arguments, result and in-place updates)."""
    names = ("path_min", "level", "phi", "beta_raw")
    given = dict(zip(names, (path_min, level, phi, beta_raw)))
    if any(t is None for t in given.values()) and any(t is not None for t in given.values()):
        _fail("step_attention", "FPA's bias needs all of path_min, level, phi, beta_raw (or none)")
    fpa = given if path_min is not None else None
    _check_attention(q, k_cache, v_cache, key_pos, positions, scale, fpa, threshold)
    B, H, S, D = k_cache.shape
    rows = B * H
    block, chunk, splits, sb = plan_splits(rows, S, D, q.device, block_values=8192, env="STEP", op="step_attention")
    out = q.new_empty(B, H, D, dtype=v_cache.dtype)
    m = torch.empty(rows, splits, dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    acc = torch.empty(rows, splits, D, dtype=torch.float32, device=q.device)
    dummy = m  # never read without FPA
    evict = fpa is not None and threshold > float("-inf")
    launch = {} if _interpreting() else {"num_warps": env_int("STEP_WARPS") or 4, "num_stages": 2}
    load_kernels()._step_attn_partial_kernel[(rows, splits)](
        q, k_cache, v_cache, key_pos, positions, *(given[name] if fpa else dummy for name in names), m, l, acc,
        q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3], *key_pos.stride()[:2],
        *(path_min.stride()[:2] if fpa else (0, 0)), *(level.stride()[:2] if fpa else (0, 0)),
        H, S, chunk, splits, float(scale), float(threshold) if evict else 0.0,
        D=D, BLOCK_S=block, FPA=fpa is not None, EVICT=evict, **launch, **TRITON_OPTIONS,
    )
    load_decode_kernels()._decode_attn_combine_kernel[(rows,)](
        m, l, acc, out, out.stride(0), 0, out.stride(1), H, 1, splits,
        D=D, SB=sb, **({} if _interpreting() else {"num_warps": 4, "num_stages": 2}), **TRITON_OPTIONS,
    )
    return out


@torch.library.custom_op("fpa_lightning::step_attention", mutates_args=("key_pos", "path_min"),
                         schema="(Tensor q, Tensor k_cache, Tensor v_cache, Tensor(a!) key_pos, Tensor positions, "
                                "float scale, Tensor(b!)? path_min, Tensor? level, Tensor? phi, Tensor? beta_raw, "
                                "float threshold) -> Tensor")
def step_attention_op(q, k_cache, v_cache, key_pos, positions, scale, path_min, level, phi, beta_raw, threshold):
    """``step_attention`` as a custom op."""
    return step_attention(q, k_cache, v_cache, key_pos, positions, scale, path_min, level, phi, beta_raw, threshold)


@step_attention_op.register_fake
def _step_attention_shape(q, k_cache, v_cache, key_pos, positions, scale, path_min, level, phi, beta_raw, threshold):
    return q.new_empty(q.shape, dtype=v_cache.dtype)
