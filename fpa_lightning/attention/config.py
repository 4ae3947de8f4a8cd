"""The attention options of a model (``AttentionConfig``), checked against the backend registry.

This package owns its config: ``fpa_lightning.config.ModelConfig`` (above this package) holds one as its
``attention`` field. Every check runs in ``__post_init__``, so a bad config fails when it is parsed, before training.
"""
from __future__ import annotations

from dataclasses import dataclass

from fpa_lightning.attention.registry import backend_entry
from fpa_lightning.ops.fpa.naive import LEVELS as FPA_OP_LEVELS
from fpa_lightning.ops.fpa.naive import REDUCTIONS as FPA_REDUCTIONS
from fpa_lightning.ops.fpa.naive import check_variant

POSITIONALS = ("rope", "none", "alibi")
IMPLS = ("auto", "naive", "chunked", "fused")
FPA_FORMS = ("general", "stack")
# The op's levels plus "none" (h = 0, so ψ = W): a parameterisation, which the op sees as a key level.
FPA_LEVELS = (*FPA_OP_LEVELS, "none")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


@dataclass
class AttentionConfig:
    """Which attention backend a model uses and its options. Only the inner op differs between backends."""

    backend: str = "fpa"
    """Attention backend, a name of the registry (fpa_lightning.attention.registry): sdpa (softmax), fox, fpa,
    selective, dcp, or the probe baselines nope and alibi."""
    positional: str | None = None
    """Positional encoding: rope, none or alibi; null takes the backend's default (none for fpa/fox, rope for sdpa/selective/dcp)."""
    impl: str = "auto"
    """Implementation of the inner op: naive (materialised (T, T)), chunked (block-wise PyTorch, O(T·block) memory),
    fused (GPU kernel: Triton for fpa, FlexAttention for fox, SDPA for the rest) or auto (fused on CUDA where one
    exists, else chunked). An explicit choice that cannot run raises; the resolved choice is recorded in hparams."""
    block_size: int = 64
    """Query block length of the chunked path."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    fpa_form: str = "general"
    """FPA parameterisation: general (φ = W + g, ψ = W + h) or stack (g = h = 0)."""
    fpa_reduction: str = "min"
    """FPA reduction over the path: min (the method) or dipsum (ablation: sum of dips below the level)."""
    fpa_level: str = "key"
    """FPA level: key (ψ_s, the method), none (h = 0, ψ = W) or query (ψ_t in place of ψ_s, ablation)."""
    bias_layers: list[int] | None = None
    """0-based indices of the layers that carry the backend's bias (fpa, fox, selective, dcp); null = all layers.
    A layer without it is plain softmax attention with the configured positional encoding ("no bias in layer 1": [1, 2, ...])."""
    skip_threshold: float | None = None
    """FPA fused kernel only: skip key blocks whose bias is provably below this value (e.g. -10); null = exact."""
    dcp_dim: int = 32
    """DCP: dimension of the interaction queries and keys shared across heads."""
    document_mask: bool = False
    """Restrict every query to keys of its own document in packed rows (from the batch's segment_ids), with FPA's
    walk and FoX's decay restarted at each document start: a packed row then equals its documents run one by one.
    Off by default: packed documents see each other (the published setup)."""

    def __post_init__(self) -> None:
        entry = backend_entry(self.backend)
        if self.positional is None:
            self.positional = entry.default_positional
        _check_choice("attention.positional", self.positional, POSITIONALS)
        _check_choice("attention.impl", self.impl, IMPLS)
        _check_choice("attention.fpa_form", self.fpa_form, FPA_FORMS)
        _check_choice("attention.fpa_reduction", self.fpa_reduction, FPA_REDUCTIONS)
        _check_choice("attention.fpa_level", self.fpa_level, FPA_LEVELS)
        if self.block_size < 1:
            raise ValueError(f"attention.block_size must be positive, got {self.block_size}")
        if self.dcp_dim < 1:
            raise ValueError(f"attention.dcp_dim must be positive, got {self.dcp_dim}")
        if self.backend == "fpa":
            if self.fpa_form == "stack" and self.fpa_level != "key":
                raise ValueError("fpa_form='stack' fixes g = h = 0; fpa_level must stay 'key'")
            check_variant(self.fpa_reduction, self.fpa_op_level)
            if self.skip_threshold is not None and self.skip_threshold >= 0:
                raise ValueError(f"attention.skip_threshold must be negative, got {self.skip_threshold}")
        elif self.skip_threshold is not None:
            raise ValueError("attention.skip_threshold applies to the fpa backend only")
        if self.bias_layers is not None and any(i < 0 for i in self.bias_layers):
            raise ValueError(f"attention.bias_layers must be non-negative layer indices, got {self.bias_layers}")

    @property
    def fpa_op_level(self) -> str:
        """The level the FPA op compares with: "query", or "key" (also for "none", where ψ = W)."""
        return "query" if self.fpa_level == "query" else "key"

    def layer_has_bias(self, layer: int) -> bool:
        return self.bias_layers is None or layer in self.bias_layers
