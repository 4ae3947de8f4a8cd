"""Shared by the generation tests: tiny float64 decoders of every backend and FPA variant."""
import torch

from _backend_variants import VARIANTS  # noqa: F401 (the generation tests run every variant)
from fpa_lightning import Decoder, ModelConfig

VOCAB = 50


def tiny_decoder(seed: int = 0, **attention) -> Decoder:
    """A float64 Decoder (2 layers, width 16, 2 heads) whose gate maps are random, so FPA has alive and dead keys."""
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=VOCAB, n_layer=2, d_model=16, n_head=2, d_mlp=32, max_seq_len=32,
                      attention={"impl": "chunked", "block_size": 4, **attention})
    return random_gates(Decoder(cfg).double().eval(), std=2.0)


def random_gates(decoder: Decoder, std: float) -> Decoder:
    """Gate maps with random weights: the ALiBi-like initialisation has every FPA key dead."""
    with torch.no_grad():
        for block in decoder.blocks:
            gate = getattr(block.attn.backend, "gate", None)
            if gate is not None:
                gate.weight.normal_(0.0, std)
    return decoder

