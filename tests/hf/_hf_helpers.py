"""Shared by the transformers tests: tiny float32 models of every backend and FPA variant, as ``FPAForCausalLM``."""
import torch

from _backend_variants import VARIANTS as ALL_VARIANTS
from fpa_lightning import ModelConfig
from fpa_lightning.hf import FPAConfig, FPAForCausalLM

VOCAB = 64

# the transformers tests skip two FPA variants the generation tests cover (its key level "none" and ALiBi on top)
VARIANTS = [v for v in ALL_VARIANTS if v[0] not in ("fpa-level-none", "fpa-alibi")]
BIASED = [v for v in VARIANTS if v[1]["backend"] not in ("sdpa", "nope")]


def tiny_config(**attention) -> ModelConfig:
    """2 layers, width 32, 2 heads, vocabulary 64, chunked attention in blocks of 8."""
    return ModelConfig(vocab_size=VOCAB, n_layer=2, d_model=32, n_head=2, d_mlp=64, max_seq_len=64,
                       attention={"impl": "chunked", "block_size": 8, **attention})


def tiny_model(seed: int = 0, **attention) -> FPAForCausalLM:
    """An FPAForCausalLM in eval mode whose gate maps are random (std 2), so FPA has alive and dead keys."""
    torch.manual_seed(seed)
    model = FPAForCausalLM(FPAConfig.from_model_config(tiny_config(**attention), bos_token_id=1, eos_token_id=None))
    with torch.no_grad():
        for block in model.model.blocks:
            gate = getattr(block.attn.backend, "gate", None)
            if gate is not None:
                gate.weight.normal_(0.0, 2.0)
    return model.eval()


def left_padded(prompts: list[torch.Tensor], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of different lengths as (input_ids, attention_mask), each (B, T), padded on the left."""
    T = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), T), pad, dtype=torch.long)
    mask = torch.zeros(len(prompts), T, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, T - len(prompt):], mask[row, T - len(prompt):] = prompt, 1
    return ids, mask


def prompts(seed: int = 0, lengths: tuple[int, ...] = (7, 12, 3)) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=generator) for n in lengths]
