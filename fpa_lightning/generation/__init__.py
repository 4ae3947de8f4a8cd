"""Generation with a KV cache for every attention backend, with real eviction of dead keys (docs/generation.md).

``generate`` continues prompts (its loop, ``decode_tokens``, is also evaluation's greedy decoding); ``DecodeSession``
is the engine under it (prefill by the parallel forward, extend by pieces, a static-shape step captured in a CUDA
graph); ``KVCache`` holds K, V and each backend's per-key state; ``PruneRule`` is the eviction rule (``rule``: its
one threshold check and its one model check).
"""
from fpa_lightning.generation.cache import KVCache, LayerCache
from fpa_lightning.generation.config import GenerationConfig
from fpa_lightning.generation.generate import continuation_text, decode_tokens, generate
from fpa_lightning.generation.rule import PruneRule, check_threshold
from fpa_lightning.generation.sampling import next_tokens
from fpa_lightning.generation.session import DecodeSession, cast_weights

__all__ = ["DecodeSession", "GenerationConfig", "KVCache", "LayerCache", "PruneRule", "cast_weights",
           "check_threshold", "continuation_text", "decode_tokens", "generate", "next_tokens"]
