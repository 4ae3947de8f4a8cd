"""Attention ops. Each op has a plain PyTorch reference beside its fast path."""
from fpa_lightning.ops.fpa import dense_attention, fpa_bias, naive_fpa_attention
from fpa_lightning.ops.fpa.fused import fpa_attention

__all__ = ["dense_attention", "fpa_attention", "fpa_bias", "naive_fpa_attention"]
