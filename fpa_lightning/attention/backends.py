"""Attention backends: per-head gate maps (the bias ingredients) and the inner op in three implementations.

Every backend computes softmax(q·kᵀ/√D + bias)·v with its own bias. The attention layer owns the q/k/v/out
projections and RoPE; a backend owns only the small gate maps that produce its bias ingredients and the
inner op, available as
  naive   — the readable definition, (T, T) materialised;
  chunked — block-wise PyTorch, O(T·block) memory (CPU, and wherever no fused kernel applies);
  fused   — the fast path (SDPA for softmax, FlexAttention for FoX, the Triton kernel for FPA, SDPA with a
            layer-shared bias for Selective Attention and DCP).
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from fpa_lightning.config import AttentionConfig
from fpa_lightning.ops.blockwise import blockwise_attention
from fpa_lightning.ops.dcp import dcp_attention_gpu, dcp_bias, dcp_bias_block
from fpa_lightning.ops.fox import alibi_cumulative, alibi_slopes, fox_bias, fox_bias_block
from fpa_lightning.ops.fpa.chunked import fpa_bias_block
from fpa_lightning.ops.fpa.naive import dense_attention, fpa_bias
from fpa_lightning.ops.selective import selective_attention_gpu, selective_bias, selective_bias_block

Ingredients = dict[str, torch.Tensor]


def at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    """Bias ingredients are computed in float32 (float64 stays float64), whatever autocast does to q, k, x."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


@dataclass
class LayerProbe:
    """One layer's bias ingredients for a batch (float32, no grad), from the probe path.

    backend: the name of the bias ("fpa", "fox", "selective", "dcp", "alibi"), or "none" for a layer without one.
    ingredients: FPA: phi, psi (B, T, H), beta (H,); FoX: log_gate_cumsum (B, T, H); Selective: q0, k0 (B, T, D)
    of the selecting head; DCP: qi, ki (B, T, r), offset; ALiBi: log_gate_cumsum (B, T, H).
    """

    backend: str
    ingredients: Ingredients = field(default_factory=dict)
    owner: "AttentionBackend | None" = None

    def row_blocks(self, block_size: int = 256, end: int | None = None) -> Iterator[tuple[int, torch.Tensor]]:
        """The bias in one pass, block by block: (lo, rows lo..hi-1 over keys 0..hi-1 as (B, H or 1, hi − lo, hi),
        −inf where s > t), up to row `end` (default T). Each block is computed once, its carry passed on."""
        T = next(iter(self.ingredients.values())).shape[1]
        end = T if end is None else end
        carry = None
        for lo in range(0, end, block_size):
            hi = min(end, lo + block_size)
            block, carry = self.owner.bias_block(self.ingredients, lo, hi, carry)
            rows = torch.arange(lo, hi, device=block.device)[:, None]
            yield lo, block.masked_fill(torch.arange(hi, device=block.device)[None, :] > rows, float("-inf"))

    def bias(self, lo: int = 0, hi: int | None = None, block_size: int = 256) -> torch.Tensor | None:
        """Bias rows lo..hi-1 over keys 0..hi-1: (B, H or 1, hi − lo, hi), −inf where s > t; None without a bias.

        Every block before `lo` is computed too (a carry can need them): to stream all rows, use row_blocks."""
        if self.owner is None or self.backend == "none":
            return None
        hi = next(iter(self.ingredients.values())).shape[1] if hi is None else hi
        rows = [
            F.pad(block, (0, hi - block.shape[-1]), value=float("-inf"))[..., max(lo - start, 0) :, :]
            for start, block in self.row_blocks(block_size, end=hi)
            if start + block.shape[-2] > lo
        ]
        return torch.cat(rows, dim=-2)


class AttentionBackend(nn.Module):
    """Base: plain causal softmax (no bias); subclasses add gate maps and a bias."""

    has_bias = False
    fused_needs_cuda = False  # SDPA runs on any device

    def __init__(self, cfg: AttentionConfig, d_model: int, n_head: int, head_dim: int):
        super().__init__()
        self.cfg = cfg
        self.n_head, self.head_dim = n_head, head_dim
        self.scale = 1.0 / math.sqrt(head_dim)
        self.alibi = cfg.positional == "alibi"
        if self.alibi:
            self.register_buffer("alibi_slope", alibi_slopes(n_head), persistent=False)

    # --- what a subclass provides -------------------------------------------------------------------
    def ingredients(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> Ingredients:
        """Bias ingredients from the layer input x (B, T, C) and q, k (B, T, H, D), in float32."""
        return {}

    def own_bias(self, ing: Ingredients) -> torch.Tensor | None:
        """The backend's bias for all pairs, (B, H or 1, T, T) (materialised)."""
        return None

    def own_bias_block(self, ing: Ingredients, lo: int, hi: int, carry):
        """Rows lo..hi-1 of the backend's bias over keys 0..hi-1 and the carry for the next block."""
        return None, None

    def fused_unavailable(self) -> str | None:
        """Why the fused path cannot run this configuration (None: it can)."""
        return "ALiBi is not part of a fused kernel" if self.alibi else None

    def fused(self, q, k, v, ing: Ingredients) -> torch.Tensor:
        return F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        ).transpose(1, 2)

    # --- shared machinery ---------------------------------------------------------------------------
    def positional_bias(self, batch: int, T: int, device) -> Ingredients:
        if not self.alibi:
            return {}
        return {"alibi_cumsum": alibi_cumulative(self.alibi_slope.to(device), batch, T)}

    def bias_block(self, ing: Ingredients, lo: int, hi: int, carry):
        bias, carry = self.own_bias_block(ing, lo, hi, carry)
        if "alibi_cumsum" in ing:
            alibi = fox_bias_block(ing["alibi_cumsum"].transpose(1, 2), lo, hi)
            bias = alibi if bias is None else bias + alibi
        return bias, carry

    def dense_bias(self, ing: Ingredients) -> torch.Tensor | None:
        bias = self.own_bias(ing)
        if "alibi_cumsum" in ing:
            alibi = fox_bias(ing["alibi_cumsum"])
            bias = alibi if bias is None else bias + alibi
        return bias

    def bias_ingredients(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> Ingredients:
        """Everything the bias of this layer needs: the gate maps' ingredients (outside autocast, so float32)
        and the positional ALiBi term if configured."""
        with torch.autocast(q.device.type, enabled=False):
            ing = self.ingredients(x, q, k)
        ing.update(self.positional_bias(q.shape[0], q.shape[1], q.device))
        return ing

    def resolve_impl(self, device: torch.device) -> str:
        """The implementation that will run on `device`; raises for a request that cannot be met."""
        impl, reason = self.cfg.impl, self.fused_unavailable()
        if impl == "auto":
            usable = reason is None and (device.type == "cuda" or not self.fused_needs_cuda)
            return "fused" if usable else "chunked"
        if impl == "fused":
            if reason is not None:
                raise ValueError(f"attention.impl='fused' is not available for backend {self.cfg.backend!r}: {reason}")
            if self.fused_needs_cuda and device.type != "cuda":
                raise RuntimeError(
                    f"attention.impl='fused' for backend {self.cfg.backend!r} needs a CUDA GPU; "
                    "use impl='chunked' (or 'auto') on a CPU"
                )
        return impl

    def forward(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v (B, T, H, D) -> (B, T, H, D)."""
        impl = self.resolve_impl(q.device)
        ing = self.bias_ingredients(x, q, k)
        if impl == "fused":
            return self.fused(q, k, v, ing)
        if impl == "naive":
            return dense_attention(q, k, v, self.dense_bias(ing), scale=self.scale)
        bias_block = (lambda lo, hi, carry: self.bias_block(ing, lo, hi, carry)) if ing else None
        return blockwise_attention(q, k, v, bias_block, scale=self.scale, block_size=self.cfg.block_size)

    @torch.no_grad()
    def probe(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> LayerProbe:
        if not self.has_bias:
            return LayerProbe("none")
        ing = self.ingredients(x, q, k)
        return LayerProbe(self.label, ing, owner=self)

    @property
    def label(self) -> str:
        """The bias this layer carries: the backend's name, or "softmax" for a layer without one."""
        return self.cfg.backend if self.has_bias else "softmax"


class AlibiBackend(AttentionBackend):
    """The positional baseline: softmax with ALiBi (probes report ALiBi as its bias)."""

    has_bias = True

    def ingredients(self, x, q, k):
        return {"log_gate_cumsum": alibi_cumulative(self.alibi_slope.to(q.device), q.shape[0], q.shape[1])}

    def positional_bias(self, batch, T, device):  # ALiBi is this backend's own bias, added once
        return {}

    def own_bias(self, ing):
        return fox_bias(ing["log_gate_cumsum"])

    def own_bias_block(self, ing, lo, hi, carry):
        return fox_bias_block(ing["log_gate_cumsum"].transpose(1, 2), lo, hi), None


def _alibi_like_init(bias: torch.Tensor, n_head: int, transform) -> None:
    """Start every head as ALiBi: per-step decay m_h = ALiBi's slope, mapped through `transform`."""
    with torch.no_grad():
        bias.copy_(transform(alibi_slopes(n_head)))


class FoxBackend(AttentionBackend):
    """FoX: b[t, s] = Σ_{s<u≤t} log σ(f_u), f = per-head linear map of x (SPEC.md §5).

    Init: zero weights and f's bias set so that log σ(f) = −m_h (ALiBi's slopes): the model starts as ALiBi.
    """

    has_bias = True
    fused_needs_cuda = True

    def __init__(self, cfg, d_model, n_head, head_dim):
        super().__init__(cfg, d_model, n_head, head_dim)
        self.gate = nn.Linear(d_model, n_head)
        nn.init.zeros_(self.gate.weight)
        # σ(f) = e^{−m}  <=>  f = log(e^{−m} / (1 − e^{−m})) = −log(e^{m} − 1)
        _alibi_like_init(self.gate.bias, n_head, lambda m: -torch.log(torch.expm1(m)))

    def ingredients(self, x, q, k):
        log_gate = F.logsigmoid(self.gate(at_least_fp32(x)))  # (B, T, H), ≤ 0
        return {"log_gate_cumsum": log_gate.cumsum(dim=1)}

    def own_bias(self, ing):
        return fox_bias(ing["log_gate_cumsum"])

    def own_bias_block(self, ing, lo, hi, carry):
        return fox_bias_block(ing["log_gate_cumsum"].transpose(1, 2), lo, hi), None

    def fused(self, q, k, v, ing):
        from fpa_lightning.ops.fox_flex import fox_flex_attention  # needs CUDA; imported on use

        return fox_flex_attention(q, k, v, ing["log_gate_cumsum"], scale=self.scale)


class FpaBackend(AttentionBackend):
    """FPA (SPEC.md §2): per head, δ, g, h are linear maps of x; W = cumsum(δ) in float32;
    φ = W + g, ψ = W + h; β = softplus(β_raw).

    Init (documented choice): zero weights, δ's bias = −m_h (ALiBi's slopes), g = h = 0 and β = 1. Then
    φ = ψ = W is strictly decreasing, every off-diagonal pair is dead and b[t, s] = −m_h·(t − s): the model
    starts exactly as ALiBi (and as our FoX, which starts there too), and gradients reach φ, ψ and β from the
    first step. An all-alive start (φ ≥ ψ everywhere) would give exactly zero gate gradients and never learn.
    """

    has_bias = True
    fused_needs_cuda = True
    FUSED_HEAD_DIMS = (16, 32, 64, 128)

    def __init__(self, cfg, d_model, n_head, head_dim):
        super().__init__(cfg, d_model, n_head, head_dim)
        # outputs: δ, then g (unless stack form), then h (general form with a key or query level)
        self.n_maps = 1 if cfg.fpa_form == "stack" else (2 if cfg.fpa_level == "none" else 3)
        self.gate = nn.Linear(d_model, self.n_maps * n_head)
        nn.init.zeros_(self.gate.weight)
        nn.init.zeros_(self.gate.bias)
        _alibi_like_init(self.gate.bias[:n_head], n_head, torch.neg)
        self.beta_raw = nn.Parameter(torch.full((n_head,), math.log(math.e - 1.0)))  # softplus⁻¹(1)

    def ingredients(self, x, q, k):
        maps = self.gate(at_least_fp32(x)).unflatten(-1, (self.n_maps, self.n_head))  # (B, T, maps, H)
        walk = maps[:, :, 0].cumsum(dim=1)  # W_t = Σ_{u≤t} δ_u, (B, T, H), float32
        phi = walk + maps[:, :, 1] if self.n_maps > 1 else walk
        psi = walk + maps[:, :, 2] if self.n_maps > 2 else walk
        return {"phi": phi, "psi": psi, "beta": F.softplus(at_least_fp32(self.beta_raw))}

    @property
    def level(self) -> str:
        return "query" if self.cfg.fpa_level == "query" else "key"

    def own_bias(self, ing):
        return fpa_bias(ing["phi"], ing["psi"], ing["beta"], reduction=self.cfg.fpa_reduction, level=self.level)

    def own_bias_block(self, ing, lo, hi, carry):
        phi_h, psi_h = ing["phi"].transpose(1, 2), ing["psi"].transpose(1, 2)
        return fpa_bias_block(
            phi_h, psi_h, ing["beta"], lo, hi, carry, reduction=self.cfg.fpa_reduction, level=self.level
        )

    def fused_unavailable(self):
        if self.cfg.fpa_reduction != "min" or self.level != "key":
            return "the Triton kernel implements the min reduction with a key level only"
        if self.head_dim not in self.FUSED_HEAD_DIMS:
            return f"the Triton kernel supports head dims {self.FUSED_HEAD_DIMS}, got {self.head_dim}"
        return super().fused_unavailable()

    def fused(self, q, k, v, ing):
        from fpa_lightning.ops.fpa.fused import fpa_attention  # Triton kernels are built on first use

        return fpa_attention(
            q, k, v, ing["phi"], ing["psi"], ing["beta"], scale=self.scale, skip_threshold=self.cfg.skip_threshold
        )


class SelectiveBackend(AttentionBackend):
    """Selective Attention: head 0's ReLU logits select, F is subtracted from every head (layer-shared)."""

    has_bias = True
    fused_needs_cuda = True

    def ingredients(self, x, q, k):
        return {"q0": at_least_fp32(q[:, :, 0]), "k0": at_least_fp32(k[:, :, 0])}

    def own_bias(self, ing):
        return selective_bias(ing["q0"][:, :, None], ing["k0"][:, :, None], scale=self.scale)

    def own_bias_block(self, ing, lo, hi, carry):
        return selective_bias_block(ing["q0"], ing["k0"], lo, hi, carry, self.scale)

    def fused(self, q, k, v, ing):
        return selective_attention_gpu(q, k, v, scale=self.scale)


class DcpBackend(AttentionBackend):
    """DCP: low-dimensional interaction queries/keys shared across heads, sparse-sigmoid keep probabilities,
    cumulative product over queries, log added to every head's logits.

    Init: interaction maps N(0, 0.02²) and an offset of 0.9, so keep ≈ 0.95 per step at the start
    (a gentle recency bias, comparable to the ALiBi-like start of FoX and FPA) with gradients flowing.
    """

    has_bias = True
    fused_needs_cuda = True

    def __init__(self, cfg, d_model, n_head, head_dim):
        super().__init__(cfg, d_model, n_head, head_dim)
        self.interaction = nn.Linear(d_model, 2 * cfg.dcp_dim, bias=False)
        nn.init.normal_(self.interaction.weight, std=0.02)
        self.offset = nn.Parameter(torch.tensor(0.9))

    def ingredients(self, x, q, k):
        qi, ki = self.interaction(at_least_fp32(x)).chunk(2, dim=-1)  # (B, T, r) each
        return {"qi": qi, "ki": ki, "offset": at_least_fp32(self.offset)}

    def own_bias(self, ing):
        return dcp_bias(ing["qi"], ing["ki"], ing["offset"])

    def own_bias_block(self, ing, lo, hi, carry):
        return dcp_bias_block(ing["qi"], ing["ki"], ing["offset"], lo, hi, carry)

    def fused(self, q, k, v, ing):
        return dcp_attention_gpu(q, k, v, ing["qi"], ing["ki"], ing["offset"], scale=self.scale)


BACKEND_CLASSES: dict[str, type[AttentionBackend]] = {
    "sdpa": AttentionBackend,
    "nope": AttentionBackend,
    "alibi": AlibiBackend,
    "fox": FoxBackend,
    "fpa": FpaBackend,
    "selective": SelectiveBackend,
    "dcp": DcpBackend,
}


def build_backend(cfg: AttentionConfig, d_model: int, n_head: int, layer: int) -> AttentionBackend:
    """The one registry: resolves a backend name (raising on unknown ones) for one layer.

    A layer excluded by ``bias_layers`` runs plain softmax with the configured positional encoding.
    """
    if cfg.backend not in BACKEND_CLASSES:
        raise ValueError(f"unknown attention backend {cfg.backend!r}; known: {sorted(BACKEND_CLASSES)}")
    cls = BACKEND_CLASSES[cfg.backend] if cfg.layer_has_bias(layer) else AttentionBackend
    return cls(cfg, d_model, n_head, d_model // n_head)
