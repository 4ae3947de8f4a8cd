"""The attention layer: q/k/v/out projections and RoPE; the backend supplies gate maps and the inner op."""
from __future__ import annotations

from typing import Protocol

import torch
import torch.nn as nn

from fpa_lightning.attention.base import AttentionBackend, LayerProbe
from fpa_lightning.attention.config import AttentionConfig
from fpa_lightning.attention.registry import backend_entry
from fpa_lightning.ops.common import at_least_fp32, rope_rotate


class LayerShape(Protocol):
    """What the attention layer reads of a model's config: a ``ModelConfig`` (``fpa_lightning.config``, which sits
    above this package) or the probe model's shape (``fpa_lightning.probes.model``, heads narrower than its residual
    stream: n_head·head_dim < d_model)."""

    @property
    def d_model(self) -> int: ...
    @property
    def n_head(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def attention(self) -> AttentionConfig: ...


class RotaryEmbedding(nn.Module):
    """RoPE (rotate-half form); cos/sin tables grow on demand, so evaluation can exceed the training length."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self._cache: tuple[int, torch.device, torch.dtype, torch.Tensor, torch.Tensor] | None = None

    def tables(self, T: int, device: torch.device,
               dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (T, D) in `dtype` (float32, or float64 for float64 references: a float32 table would make
        the rotation's rounding depend on absolute positions)."""
        if self._cache is None or self._cache[0] < T or self._cache[1:3] != (device, dtype):
            inv_freq = self.theta ** (-torch.arange(0, self.head_dim, 2, dtype=dtype) / self.head_dim)  # on the host
            angles = torch.outer(torch.arange(T, device=device, dtype=dtype), inv_freq.to(device))
            angles = torch.cat([angles, angles], dim=-1)  # (T, D)
            self._cache = (T, device, dtype, angles.cos(), angles.sin())
        return self._cache[3][:T], self._cache[4][:T]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, H, D) -> rotated, same dtype (rotation in float32 at least)."""
        cos, sin = self.tables(x.shape[1], x.device, at_least_fp32(x).dtype)
        return self.rotate(x, cos[:, None], sin[:, None])

    def rotate_at(self, x: torch.Tensor, positions: torch.Tensor, limit: int) -> torch.Tensor:
        """x (B, n, H, D) of tokens at positions (B, n), each < limit (decoding: one table for every step, so
        nothing grows inside a captured step) -> rotated, same dtype."""
        cos, sin = self.tables(limit, x.device, at_least_fp32(x).dtype)
        return self.rotate(x, cos[positions][:, :, None], sin[positions][:, :, None])

    rotate = staticmethod(rope_rotate)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: LayerShape, layer: int):
        """cfg: a ``ModelConfig``, or any object with its d_model, n_head, head_dim and attention (``LayerShape``)."""
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

    def project_at(self, x: torch.Tensor, positions: torch.Tensor, limit: int):
        """x (B, n, C) of tokens at positions (B, n) -> q, k, v (B, n, H, D), RoPE at those positions (< limit)."""
        q, k, v = self.qkv(x).unflatten(-1, (3, self.n_head, self.head_dim)).unbind(dim=2)
        if self.rope is not None:
            q, k = self.rope.rotate_at(q, positions, limit), self.rope.rotate_at(k, positions, limit)
        return q, k, v

    def forward(self, x: torch.Tensor, segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C); segment_ids (B, T) under document masking, else None."""
        q, k, v = self.project(x)
        return self.out(self.backend(x, q, k, v, segment_ids).flatten(-2))  # (B, T, C)

    @torch.no_grad()
    def probe(self, x: torch.Tensor, segment_ids: torch.Tensor | None = None) -> LayerProbe:
        q, k, _ = self.project(x)
        return self.backend.probe(x, q, k, segment_ids)


def _rename_gates_to_backend(state_dict, prefix, *args) -> None:
    """Checkpoints written before the layer's ``gates`` attribute was renamed ``backend`` still load."""
    for key in [k for k in state_dict if k.startswith(prefix + "gates.")]:
        state_dict[prefix + "backend." + key[len(prefix + "gates."):]] = state_dict.pop(key)
