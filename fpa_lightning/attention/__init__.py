"""Attention: the backend contract, the biased backends, their one registry, the config that names a backend and
its options, and the attention layer."""
from fpa_lightning.attention.base import AttentionBackend, BiasHook, LayerProbe
from fpa_lightning.attention.config import AttentionConfig
from fpa_lightning.attention.layer import CausalSelfAttention
from fpa_lightning.attention.registry import BACKENDS, backend_entry

__all__ = ["BACKENDS", "AttentionBackend", "AttentionConfig", "BiasHook", "CausalSelfAttention", "LayerProbe",
           "backend_entry"]
