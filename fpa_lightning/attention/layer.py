"""The attention layer: q/k/v/out projections and RoPE; the backend supplies gate maps and the inner op."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from fpa_lightning.attention.base import AttentionBackend, LayerProbe
from fpa_lightning.attention.registry import backend_entry

if TYPE_CHECKING:
    from fpa_lightning.config import ModelConfig


class RotaryEmbedding(nn.Module):
    """RoPE (rotate-half form); cos/sin tables grow on demand, so evaluation can exceed the training length."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.register_buffer(
            "inv_freq", theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim), persistent=False
        )
        self._cache: tuple[int, torch.device, torch.Tensor, torch.Tensor] | None = None

    def tables(self, T: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self._cache is None or self._cache[0] < T or self._cache[1] != device:
            angles = torch.outer(torch.arange(T, device=device, dtype=torch.float32), self.inv_freq.to(device))
            angles = torch.cat([angles, angles], dim=-1)  # (T, D)
            self._cache = (T, device, angles.cos(), angles.sin())
        return self._cache[2][:T], self._cache[3][:T]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, H, D) -> rotated, same dtype (rotation in float32)."""
        cos, sin = self.tables(x.shape[1], x.device)
        first, second = x.float().chunk(2, dim=-1)
        rotated = torch.cat([-second, first], dim=-1)
        return (x.float() * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        """cfg: a ``ModelConfig``, or any object with its d_model, n_head, head_dim and attention (the probe model,
        ``fpa_lightning.probes.model``, uses heads narrower than its residual stream: n_head·head_dim < d_model)."""
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        inner = cfg.n_head * cfg.head_dim  # = d_model in a ModelConfig; narrower heads in a probe model
        self.qkv = nn.Linear(cfg.d_model, 3 * inner, bias=False)
        self.out = nn.Linear(inner, cfg.d_model, bias=False)
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.attention.rope_theta) if cfg.attention.positional == "rope" else None
        # a layer excluded by bias_layers runs plain softmax with the configured positional encoding
        backend_cls = backend_entry(cfg.attention.backend).cls if cfg.attention.layer_has_bias(layer) else AttentionBackend
        self.backend = backend_cls(cfg.attention, cfg.d_model, cfg.n_head, cfg.head_dim)
        self._register_load_state_dict_pre_hook(_rename_gates_to_backend)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, C) -> q, k, v (B, T, H, D), RoPE applied to q and k."""
        q, k, v = self.qkv(x).unflatten(-1, (3, self.n_head, self.head_dim)).unbind(dim=2)
        if self.rope is not None:
            q, k = self.rope(q), self.rope(k)
        return q, k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.project(x)
        return self.out(self.backend(x, q, k, v).flatten(-2))  # (B, T, C)

    @torch.no_grad()
    def probe(self, x: torch.Tensor) -> LayerProbe:
        q, k, _ = self.project(x)
        return self.backend.probe(x, q, k)


def _rename_gates_to_backend(state_dict, prefix, *args) -> None:
    """Checkpoints written before the layer's ``gates`` attribute was renamed ``backend`` still load."""
    for key in [k for k in state_dict if k.startswith(prefix + "gates.")]:
        state_dict[prefix + "backend." + key[len(prefix + "gates."):]] = state_dict.pop(key)
