"""Decode attention: n new queries over a KV cache with a bias and a visibility mask, one signature two ways: the
readable definition (naive) and the fused split-K Triton kernels (fused, inference only)."""
from fpa_lightning.ops.decode.fused import decode_attention, decode_attention_op
from fpa_lightning.ops.decode.naive import cached_attention

__all__ = ["cached_attention", "decode_attention", "decode_attention_op"]
