"""Pieces every attention op shares: dense causal attention with an additive bias, the float32 floor for bias
ingredients, the finite stand-in for infinity that keeps masked ranges finite (docs/method.md, "Conventions") and the
other constants the Triton kernels share."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# A finite stand-in for +inf in masked or empty ranges. exp(−FAR − x) is exactly 0 for any field value a model
# can produce, and every intermediate stays finite, so a masked entry can never turn a zero gradient into NaN
# (0·inf) in the backward pass. The Triton kernels use the same value.
FAR = 1e30

FREE = -1  # a KV cache slot's key position when it holds no key (generation/cache.py; the FPA piece op reads it)

LOG2E = 1.4426950408889634  # log2(e): the Triton kernels take exp(x) as exp2(x·LOG2E)


def at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    """t in float32 at least (float64 stays float64), whatever autocast did to it."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x (..., C) over its last dim, statistics in float32 at least, times weight (C,), in x's dtype: the
    model's norm (``model.RMSNorm``) and the reference of the decoding step's fused norm (ops/decode/step)."""
    wide = at_least_fp32(x)  # statistics in float32 under bf16 autocast
    normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight).to(x.dtype)


def rope_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE's rotate-half rotation of x (..., D) by cos and sin tables broadcast to it, in float32 at least, returned
    in x's dtype: the attention layer's RoPE (``attention.layer.RotaryEmbedding``) and the reference of the decoding
    step's fused one (ops/decode/step)."""
    wide = at_least_fp32(x)
    first, second = wide.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return (wide * cos + rotated * sin).to(x.dtype)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up (..., 2F) -> silu(gate) · up (..., F), the halves in that order: SwiGLU's activation (``model.SwiGLU``)
    and the reference of the decoding step's fused one (ops/decode/step)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def same_document(segment_ids: torch.Tensor, lo: int = 0, hi: int | None = None) -> torch.Tensor:
    """segment_ids (B, T) -> (B, 1, hi − lo, hi) bool, True where query t (rows lo..hi-1) and key s (0..hi-1) lie in
    the same document; all rows and keys by default, (B, 1, T, T).

    Document masking (docs/method.md, "Document masking"): a packed row's documents never see each other. Documents
    are contiguous runs of one id (the data pipeline numbers them 0, 1, ... along a row).
    """
    hi = segment_ids.shape[1] if hi is None else hi
    return (segment_ids[:, lo:hi, None] == segment_ids[:, None, :hi])[:, None]


def document_first_tokens(segment_ids: torch.Tensor) -> torch.Tensor:
    """segment_ids (B, T) -> (B, T) bool, True at every document's first token (position 0 included)."""
    first = torch.ones_like(segment_ids, dtype=torch.bool)
    first[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    return first


def cumsum_within_documents(x: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
    """x (B, T, ...) -> its cumulative sum along T restarted at every document start of segment_ids (B, T).

    Equal to running each document on its own. The sums run in float64 and are cast back once, so a value is the
    rounded within-document sum, not a difference of two long row sums.
    """
    wide = x.double()
    # the scan runs over the innermost dimension of a copy: along an outer dimension CUDA scans serially per column
    inclusive = wide.movedim(1, -1).contiguous().cumsum(dim=-1).movedim(-1, 1)
    exclusive = inclusive - wide  # Σ_{u<t} x_u
    positions = torch.arange(x.shape[1], device=x.device).expand_as(segment_ids)
    first = torch.where(document_first_tokens(segment_ids), positions, 0).cummax(dim=1).values  # (B, T)
    first = first.view(*first.shape, *([1] * (x.dim() - 2))).expand_as(x)
    return (exclusive + wide - exclusive.gather(1, first)).to(x.dtype)


def running_sum(values: torch.Tensor, segment_ids: torch.Tensor | None = None) -> torch.Tensor:
    """values (B, T, H) summed along T (W_t = Σ_{u≤t} values_u), restarted at every document start of segment_ids
    (B, T) if given; the same dtype and shape. The gate fields of FPA and FoX are running sums; the restart changes no
    same-document difference and keeps the values as small as in a lone document.

    The scan runs over the innermost dimension of a (B, H, T) copy: along an outer dimension CUDA's scan walks all T
    steps in one thread per (b, h), a large share of a training step (BENCHMARKS.md, "Whole-model training
    throughput (H200)"). Under torch.compile the sum is one opaque op (``running_sum_op``): for long rows and few of
    them Inductor picks its split scan on CUDA, whose code generation failed on this sum (BENCHMARKS.md, "Whole-model
    training on one H100"). Eager code, vmap included, calls the scan directly."""
    if torch.compiler.is_compiling():
        return running_sum_op(values, segment_ids)
    return _running_sum(values, segment_ids)


def _running_sum(values: torch.Tensor, segment_ids: torch.Tensor | None) -> torch.Tensor:
    if segment_ids is not None:
        return cumsum_within_documents(values, segment_ids)
    return values.transpose(1, 2).contiguous().cumsum(dim=-1).transpose(1, 2)  # (B, T, H), strides of (B, H, T)


# The schema is spelled out so that it does not depend on how a torch version reads string annotations.
@torch.library.custom_op("fpa_lightning::running_sum", mutates_args=(),
                         schema="(Tensor values, Tensor? segment_ids) -> Tensor")
def running_sum_op(values, segment_ids):
    """``running_sum`` as a torch.library custom op: what torch.compile sees (same signature and result, always in
    (B, H, T) strides, which its fake below promises)."""
    return _running_sum(values, segment_ids).transpose(1, 2).contiguous().transpose(1, 2)  # no copy without documents


@running_sum_op.register_fake
def _running_sum_shape(values, segment_ids):
    return values.new_empty(values.shape[0], values.shape[2], values.shape[1]).transpose(1, 2)


def _running_sum_setup(ctx, inputs, output):
    ctx.segment_ids = inputs[1]


def _running_sum_backward(ctx, grad):
    # d/dx_u of Σ_t g_t·W_t is Σ_{t≥u, same document} g_t: the running sum of the reversed rows, reversed back (a
    # reversed document is still one contiguous run of ids); through the op again, so the compiled backward holds no
    # scan either
    ids = ctx.segment_ids.flip(1) if ctx.segment_ids is not None else None
    return running_sum_op(grad.flip(1), ids).flip(1), None


running_sum_op.register_autograd(_running_sum_backward, setup_context=_running_sum_setup)


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, *, scale: float | None = None,
    segment_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal softmax attention with an additive bias, materialised.

    q, k, v: (B, T, H, D); bias: (B, H or 1, T, T) or None; segment_ids: (B, T) document ids of a packed row, or
    None: with them a query attends only to keys of its own document. Returns (B, T, H, D).
    Scores and softmax run in the promoted dtype of q and bias (float32 at least).
    """
    T, D = q.shape[1], q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale  # (B, H, T, T)
    work_dtype = torch.promote_types(scores.dtype, torch.float32)
    scores = scores.to(work_dtype)
    if bias is not None:
        scores = scores + bias.to(work_dtype)
    allowed = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    if segment_ids is not None:
        allowed = allowed & same_document(segment_ids)
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", probs.to(v.dtype), v)
