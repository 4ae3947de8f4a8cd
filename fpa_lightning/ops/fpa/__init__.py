"""FPA attention ops. Training: one signature three ways, the readable reference (naive), the block-wise PyTorch path
(chunked) and the fused Triton kernel (fused). Decoding: the piece op (piece/: queries over the KV cache under the
bias, evicting on the way) and FPA's part of the single-token decoding step (step/: the gate map, the path minimum
and bias, which ops/decode/step's ops call)."""
from fpa_lightning.ops.fpa.chunked import chunked_fpa_attention
from fpa_lightning.ops.fpa.fused import fpa_attention
from fpa_lightning.ops.fpa.naive import fpa_bias, naive_fpa_attention

__all__ = ["chunked_fpa_attention", "fpa_attention", "fpa_bias", "naive_fpa_attention"]
