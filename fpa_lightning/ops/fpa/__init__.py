"""FPA attention ops, one signature three ways: the readable reference (naive), the block-wise PyTorch path
(chunked) and the fused Triton kernel (fused)."""
from fpa_lightning.ops.fpa.chunked import chunked_fpa_attention
from fpa_lightning.ops.fpa.fused import fpa_attention
from fpa_lightning.ops.fpa.naive import fpa_bias, naive_fpa_attention

__all__ = ["chunked_fpa_attention", "fpa_attention", "fpa_bias", "naive_fpa_attention"]
