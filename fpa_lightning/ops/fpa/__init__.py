"""FPA attention ops: the readable reference (naive), the block-wise PyTorch path and the fused kernel."""
from fpa_lightning.ops.fpa.naive import dense_attention, fpa_bias, naive_fpa_attention
from fpa_lightning.ops.fpa.fused import fpa_attention

__all__ = ["dense_attention", "fpa_attention", "fpa_bias", "naive_fpa_attention"]
