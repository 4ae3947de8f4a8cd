"""FPA's part of the single-token decoding step, the readable definitions (any float dtype, float64 for references):
what ops/decode/step's ``store_token`` and ``step_attention`` add for a key-level FPA layer with the min reduction
(docs/generation.md, "The decoding step"). kernels.py computes the same inside the step's fused kernels.

    gate_map(gate_weight, gate_bias, x, walk) -> (phi, psi)     the new token's field φ_t and key level ψ_t
    step_bias(path_min, level, phi, beta_raw, older) -> bias       the cached keys' bias for the new query
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fpa_lightning.ops.common import FAR


def gate_map(gate_weight: torch.Tensor, gate_bias: torch.Tensor, x: torch.Tensor,
             walk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gate map δ, g, h of the new token: gate_weight (G·H, C) float32 and gate_bias (G·H,) (G = 1, 2 or 3 maps
    of H heads) of x (B, C), the layer's normed input. walk (B, H) float32 is advanced in place to
    W_t = W_{t−1} + δ_t. Returns φ_t = W_t + g_t (W_t when G = 1) and ψ_t = W_t + h_t (W_t when G < 3), (B, H)."""
    maps = F.linear(x.to(gate_weight.dtype), gate_weight, gate_bias).unflatten(-1, (-1, walk.shape[1]))  # (B, G, H)
    walk.add_(maps[:, 0])
    phi = walk + maps[:, 1] if maps.shape[1] > 1 else walk.clone()
    psi = walk + maps[:, 2] if maps.shape[1] > 2 else walk
    return phi, psi


def step_bias(path_min: torch.Tensor, level: torch.Tensor, phi: torch.Tensor, beta_raw: torch.Tensor,
              older: torch.Tensor) -> torch.Tensor:
    """The new query's bias over the cached keys: path_min, level (B, H, S) float32 the keys' m_s and ψ_s, phi (B, H)
    the query's φ_t, beta_raw (H,) (β = softplus(beta_raw)), older (B, H, S) bool the slots before the query. In
    place, every older slot gets m_s = min(m_s, φ_t); returns β·min(0, m_s − ψ_s) (B, H, S)."""
    path_min.copy_(torch.minimum(path_min, torch.where(older, phi[..., None], FAR)))
    beta = F.softplus(beta_raw)[:, None]  # (H, 1)
    return beta * (path_min - level).clamp(max=0)
