"""The biased backends (docs/method.md): ALiBi, FoX, FPA, Selective Attention and DCP. Each owns its gate maps and
says how its bias is computed; the inner op and its three implementations come from ``AttentionBackend``.
The names users write in configs map to these classes in ``registry.py``.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from fpa_lightning.attention.base import AttentionBackend
from fpa_lightning.ops.alibi import alibi_cumulative, alibi_slopes
from fpa_lightning.ops.common import at_least_fp32
from fpa_lightning.ops.dcp import dcp_attention_gpu, dcp_bias, dcp_bias_block
from fpa_lightning.ops.fox import fox_bias, fox_bias_block
from fpa_lightning.ops.fox_flex import fox_flex_attention
from fpa_lightning.ops.fpa.chunked import fpa_bias_block
from fpa_lightning.ops.fpa.fused import HEAD_DIMS as FPA_FUSED_HEAD_DIMS
from fpa_lightning.ops.fpa.fused import fpa_attention as fused_fpa_attention
from fpa_lightning.ops.fpa.naive import fpa_bias
from fpa_lightning.ops.selective import selective_attention_gpu, selective_bias, selective_bias_block


class AlibiBackend(AttentionBackend):
    """The positional baseline: softmax with ALiBi (probes report ALiBi as its bias)."""

    has_bias = True

    def ingredients(self, x, q, k):
        return {"log_gate_cumsum": alibi_cumulative(self.alibi_slope.to(q.device), q.shape[0], q.shape[1])}

    def positional_bias(self, batch, T, device):  # ALiBi is this backend's own bias, added once
        return {}

    def own_bias(self, ingredients):
        return fox_bias(ingredients["log_gate_cumsum"])

    def own_bias_block(self, ingredients, lo, hi, carry):
        return fox_bias_block(ingredients["log_gate_cumsum"].transpose(1, 2), lo, hi), None


def _alibi_like_init(bias: torch.Tensor, n_head: int, transform) -> None:
    """Start every head as ALiBi: per-step decay m_h = ALiBi's slope, mapped through `transform`."""
    with torch.no_grad():
        bias.copy_(transform(alibi_slopes(n_head)))


class FoxBackend(AttentionBackend):
    """FoX: b[t, s] = Σ_{s<u≤t} log σ(f_u), f = per-head linear map of x (docs/method.md).

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

    def own_bias(self, ingredients):
        return fox_bias(ingredients["log_gate_cumsum"])

    def own_bias_block(self, ingredients, lo, hi, carry):
        return fox_bias_block(ingredients["log_gate_cumsum"].transpose(1, 2), lo, hi), None

    def fused(self, q, k, v, ingredients):
        return fox_flex_attention(q, k, v, ingredients["log_gate_cumsum"], scale=self.scale)


class FpaBackend(AttentionBackend):
    """FPA (docs/method.md): per head, δ, g, h are linear maps of x; W = cumsum(δ) in float32;
    φ = W + g, ψ = W + h; β = softplus(β_raw).

    Init (documented choice): zero weights, δ's bias = −m_h (ALiBi's slopes), g = h = 0 and β = 1. Then
    φ = ψ = W is strictly decreasing, every off-diagonal pair is dead and b[t, s] = −m_h·(t − s): the model
    starts exactly as ALiBi (and as our FoX, which starts there too), and gradients reach φ, ψ and β from the
    first step. An all-alive start (φ ≥ ψ everywhere) would give exactly zero gate gradients and never learn.
    """

    has_bias = True
    fused_needs_cuda = True

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

    def own_bias(self, ingredients):
        return fpa_bias(ingredients["phi"], ingredients["psi"], ingredients["beta"], reduction=self.cfg.fpa_reduction,
                        level=self.cfg.fpa_op_level)

    def own_bias_block(self, ingredients, lo, hi, carry):
        phi_h, psi_h = ingredients["phi"].transpose(1, 2), ingredients["psi"].transpose(1, 2)
        return fpa_bias_block(phi_h, psi_h, ingredients["beta"], lo, hi, carry, reduction=self.cfg.fpa_reduction,
                              level=self.cfg.fpa_op_level)

    def fused_unsupported_reason(self):
        # every variant is fused (reduction min or dipsum, level key or query; "none" and the stack form are key
        # levels computed in `ingredients`): only the head dim can rule the kernel out
        if self.head_dim not in FPA_FUSED_HEAD_DIMS:
            return f"the Triton kernel supports head dims {FPA_FUSED_HEAD_DIMS}, got {self.head_dim}"
        return super().fused_unsupported_reason()

    def fused(self, q, k, v, ingredients):
        return fused_fpa_attention(q, k, v, ingredients["phi"], ingredients["psi"], ingredients["beta"],
                                   scale=self.scale, reduction=self.cfg.fpa_reduction, level=self.cfg.fpa_op_level,
                                   skip_threshold=self.cfg.skip_threshold)


class SelectiveBackend(AttentionBackend):
    """Selective Attention: head 0's ReLU logits select, F is subtracted from every head (layer-shared)."""

    has_bias = True
    fused_needs_cuda = True

    def ingredients(self, x, q, k):
        return {"q0": at_least_fp32(q[:, :, 0]), "k0": at_least_fp32(k[:, :, 0])}

    def own_bias(self, ingredients):
        return selective_bias(ingredients["q0"][:, :, None], ingredients["k0"][:, :, None], scale=self.scale)

    def own_bias_block(self, ingredients, lo, hi, carry):
        return selective_bias_block(ingredients["q0"], ingredients["k0"], lo, hi, carry, self.scale)

    def fused(self, q, k, v, ingredients):
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

    def own_bias(self, ingredients):
        return dcp_bias(ingredients["qi"], ingredients["ki"], ingredients["offset"])

    def own_bias_block(self, ingredients, lo, hi, carry):
        return dcp_bias_block(ingredients["qi"], ingredients["ki"], ingredients["offset"], lo, hi, carry)

    def fused(self, q, k, v, ingredients):
        return dcp_attention_gpu(q, k, v, ingredients["qi"], ingredients["ki"], ingredients["offset"], scale=self.scale)
