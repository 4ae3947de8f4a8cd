"""FPA piece attention: n consecutive queries over the KV cache's slots under FPA's key-level bias, evicting the keys
a threshold rejects on the way; one signature two ways, the readable definition (naive) and one fused Triton kernel
(fused, inference only). ``path_min_after`` advances the cache's per-key path minimum past a piece."""
from fpa_lightning.ops.fpa.piece import fused, naive
from fpa_lightning.ops.fpa.piece.naive import path_min_after

__all__ = ["fused", "naive", "path_min_after"]
