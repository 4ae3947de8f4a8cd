"""``GenerationConfig``: the settings of ``generate`` as a typed config (``train.py predict`` reads it from YAML)."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from fpa_lightning.generation.generate import generate
from fpa_lightning.generation.rule import check_threshold
from fpa_lightning.generation.sampling import check_sampling


@dataclass
class GenerationConfig:
    """How to continue prompts (``fpa_lightning.generation.generate``). ``train.py predict`` reads it from the
    prompt data module's ``generation`` section, which holds it for the whole run (``LanguageModel.predict_step``
    applies it to each batch)."""

    max_new_tokens: int = 64
    """Tokens to add to each prompt (fewer when every row of a batch has ended with EOS)."""
    temperature: float = 0.0
    """0 = greedy; > 0 samples from softmax(logits / temperature)."""
    top_k: int | None = None
    """Sample among the k most likely tokens (needs temperature > 0)."""
    top_p: float | None = None
    """Sample among the smallest set of tokens whose probability reaches top_p (needs temperature > 0)."""
    prune_threshold: float | None = None
    """Evict a cached key for good once its bias falls below this (e.g. -10); null keeps every key."""
    stop_at_eos: bool = True
    """A row that emits EOS has ended (its later tokens are EOS and are not written)."""
    seed: int = 0
    """Seed of the sampling generator (batch i uses seed + i), so runs are reproducible."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise ValueError(f"generation.max_new_tokens must be >= 0, got {self.max_new_tokens}")
        check_sampling(self.temperature, self.top_k, self.top_p, vocab_size=2**31)
        self.prune_threshold = check_threshold(self.prune_threshold)  # the one check, shared with generate()

    def generate(self, model, prompts: list[torch.Tensor], eos_id: int | None, batch_index: int = 0):
        """``generate`` with these settings: (ids, stats). eos_id is used when stop_at_eos is set."""
        device = next(model.parameters()).device
        kwargs = {k: v for k, v in asdict(self).items() if k not in ("max_new_tokens", "stop_at_eos", "seed")}
        return generate(model, prompts, self.max_new_tokens, eos_id=eos_id if self.stop_at_eos else None,
                        generator=torch.Generator(device).manual_seed(self.seed + batch_index), return_stats=True,
                        **kwargs)
