"""Decoding ops over a KV cache, for every backend. Decode attention: n new queries over the cache with a bias and a
visibility mask, one signature two ways, the readable definition (naive) and the fused split-K Triton kernels (fused,
inference only). The single-token decoding step's own ops: step/ (FPA's parts in ops/fpa/step)."""
from fpa_lightning.ops.decode.fused import decode_attention, decode_attention_op
from fpa_lightning.ops.decode.naive import cached_attention

__all__ = ["cached_attention", "decode_attention", "decode_attention_op"]
