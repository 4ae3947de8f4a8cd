"""Attention ops. Each op has a plain PyTorch reference beside its fast path (docs/method.md, "Implementations")."""
from fpa_lightning.ops.common import dense_attention
from fpa_lightning.ops.fpa import chunked_fpa_attention, fpa_attention, fpa_bias, naive_fpa_attention

__all__ = ["chunked_fpa_attention", "dense_attention", "fpa_attention", "fpa_bias", "naive_fpa_attention"]
