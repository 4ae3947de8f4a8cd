"""Typed model configuration. YAML files in configs/ are only storage for these dataclasses.

``ModelConfig`` sits above the attention package and holds its ``AttentionConfig``
(``fpa_lightning.attention.config``) as the ``attention`` field. Every check runs in ``__post_init__``, so a bad
config fails when it is parsed, before training.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from fpa_lightning.attention.config import AttentionConfig

# AttentionConfig is owned by fpa_lightning.attention (this module sits above it); it stays importable from here.
__all__ = ["AttentionConfig", "ModelConfig"]


@dataclass
class ModelConfig:
    """Decoder-only transformer: pre-norm (RMSNorm), SwiGLU MLP, tied input/output embeddings."""

    vocab_size: int = 32000
    """Vocabulary size (32000: the Mistral-7B tokenizer)."""
    n_layer: int = 12
    """Number of transformer blocks."""
    d_model: int = 768
    """Residual stream width."""
    n_head: int = 12
    """Attention heads per layer; must divide d_model."""
    d_mlp: int = 2048
    """Hidden width of the SwiGLU MLP."""
    max_seq_len: int = 2048
    """Training context length (RoPE tables are built lazily, so longer inputs work at evaluation)."""
    norm_eps: float = 1e-6
    """RMSNorm epsilon."""
    init_std: float = 0.02
    """Standard deviation of the weight initialisation (output projections are scaled by 1/sqrt(2·n_layer))."""
    tie_embeddings: bool = True
    """Share the token embedding with the output layer (the 110M preset counts them once)."""
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    """The attention backend and its options."""
    activation_checkpointing: bool = False
    """Recompute each Block's activations in the backward instead of storing them (torch.utils.checkpoint,
    non-reentrant): the training forward only (probe, evaluation and decoding never checkpoint); under FSDP the
    strategy's checkpointing policy does it (modules/scaling.py). Less memory for about one more forward per step;
    the losses and gradients are the same (docs/training.md, "Activation checkpointing")."""

    def __post_init__(self) -> None:
        if isinstance(self.attention, dict):  # YAML storage or a plain dict
            self.attention = AttentionConfig(**self.attention)
        for name in ("vocab_size", "n_layer", "d_model", "n_head", "d_mlp", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.n_head:
            raise ValueError(f"model.n_head={self.n_head} must divide model.d_model={self.d_model}")
        if self.attention.positional == "rope" and self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head dim, got {self.head_dim}")
        bad = [i for i in (self.attention.bias_layers or []) if i >= self.n_layer]
        if bad:
            raise ValueError(f"attention.bias_layers {bad} out of range for n_layer={self.n_layer}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head
