"""The single-token decoding step's ops: a residual add with the next RMSNorm, SwiGLU's activation, a new token's entry
into a layer's KV cache (RoPE, slot, FPA's gate map and per-key state) and its attention over the cache (FPA's bias,
path minimum and eviction made in the pass that reads the keys); one signature two ways, the readable definitions
(naive) and Triton kernels (fused, inference only), with the fused ones also as torch.library custom ops. FPA's
parts (the gate map, the path minimum and bias) are ops/fpa/step's."""
from fpa_lightning.ops.decode.step import fused, naive

__all__ = ["fused", "naive"]
