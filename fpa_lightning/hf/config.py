"""``FPAConfig``: a ``ModelConfig`` as a transformers config, so that ``AutoConfig`` and ``AutoModelForCausalLM`` know
the project's decoders. One model type, ``fpa_lightning``, covers every attention backend (fpa, fox, sdpa, nope,
alibi, selective, dcp): the backend is a field of ``attention``, as in ``ModelConfig``.

The fields are exactly ``ModelConfig``'s (names and defaults; ``tests/hf`` checks it), stored at the top level of
config.json; ``attention`` is the ``AttentionConfig`` as a dict. The usual hub names (``hidden_size``,
``num_hidden_layers``, ...) read and write the same fields through ``attribute_map``, so tools that look for them
(lm-eval's maximum length, ``tie_word_embeddings``) find them.
"""
from __future__ import annotations

import dataclasses

from transformers import PretrainedConfig

from fpa_lightning.attention import AttentionConfig
from fpa_lightning.config import ModelConfig
from fpa_lightning.export import MODEL_TYPE
INSTALLED = "fpa_lightning.hf.config"  # this module's name in the package; the remote-code copy has another


class FPAConfig(PretrainedConfig):
    """The ``ModelConfig`` of a ``fpa_lightning.model.Decoder``; checked by building that ``ModelConfig``."""

    model_type = MODEL_TYPE
    attribute_map = {
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layer",
        "num_attention_heads": "n_head",
        "intermediate_size": "d_mlp",
        "max_position_embeddings": "max_seq_len",
        "rms_norm_eps": "norm_eps",
        "initializer_range": "init_std",
        "tie_word_embeddings": "tie_embeddings",
    }

    vocab_size: int = 32000
    n_layer: int = 12
    d_model: int = 768
    n_head: int = 12
    d_mlp: int = 2048
    max_seq_len: int = 2048
    norm_eps: float = 1e-6
    init_std: float = 0.02
    tie_embeddings: bool = True
    attention: dict | None = None
    """The ``AttentionConfig`` fields (None: its defaults); completed with every default on construction."""
    activation_checkpointing: bool = False
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    pad_token_id: int | None = None

    def __post_init__(self, **kwargs) -> None:
        if __name__ == INSTALLED:
            # the installed classes need no auto_map, and a folder they save holds no code, so it must not name any
            # (fpa_lightning.hf.remote.write_remote_code adds both); as remote code, transformers finds the model
            # class through auto_map and copies the code on saving, so the copy of this module keeps it
            kwargs.pop("auto_map", None)
        super().__post_init__(**kwargs)
        self.attention = dataclasses.asdict(AttentionConfig(**(self.attention or {})))  # every field, defaults resolved
        self.to_model_config()  # a bad value fails here, with ModelConfig's message

    def to_model_config(self) -> ModelConfig:
        """The ``ModelConfig`` these fields describe. ``attention`` must hold every field: a partial dict set after
        construction (``from_pretrained(path, attention={...})``) would silently fall back to defaults, so it raises."""
        missing = sorted({f.name for f in dataclasses.fields(AttentionConfig)} - set(self.attention))
        if missing:
            raise ValueError(f"FPAConfig.attention lacks {missing}: change a field of the complete dict "
                             "(config.attention[\"impl\"] = ...) instead of replacing it")
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(ModelConfig)}
        return ModelConfig(**{**fields, "attention": dict(fields["attention"])})

    @classmethod
    def from_model_config(cls, cfg: ModelConfig, **kwargs) -> "FPAConfig":
        """The config of a ``ModelConfig``; kwargs: further config fields (special token ids, ``dtype``)."""
        return cls(**dataclasses.asdict(cfg), **kwargs)
