"""Attention: one registry of backends, the attention layer, and the probe record."""
from fpa_lightning.attention.backends import BACKEND_CLASSES, AttentionBackend, LayerProbe, build_backend
from fpa_lightning.attention.layer import CausalSelfAttention

__all__ = ["BACKEND_CLASSES", "AttentionBackend", "CausalSelfAttention", "LayerProbe", "build_backend"]
