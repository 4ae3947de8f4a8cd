"""The probe model, its backend variants, and the seed ensemble that trains many seeds as one batched model.

The model is deliberately of bounded capacity (docs/probes.md, "The probe model"): token embedding → L layers of the
project's own ``CausalSelfAttention`` (H heads whose q, k and v all have width d; the backend from the registry) with
residual connections → a linear readout of the attention outputs (plus the token embedding only where a probe says
so). By default no MLP, no normalisation and no position embedding: whatever the probe needs must be done by attention
and its bias. A ``Shape`` can add each of them for the rows that need them: a learned absolute position embedding
gives the backends without a positional code (NoPE, FoX, ALiBi) a way to locate positions, so that a capacity row's
control can pass; MLP and normalisation give MQAR the paper's regime (a full transformer block). A ``Variant`` may
build layer 1 otherwise than the rest (``Variant.first_layer``): FPA without its layer-1 bias but with RoPE there.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.func import functional_call, stack_module_state, vmap

from fpa_lightning.attention import AttentionBackend, AttentionConfig, CausalSelfAttention


@dataclass(frozen=True)
class Variant:
    """One row label of the table: a backend of the registry with the options that make it what the row says."""

    backend: str
    options: dict = field(default_factory=dict)
    description: str = ""
    no_first_layer_bias: bool = False
    """FPA "without layer-1 bias": layer 0 is plain softmax, the others carry the bias (multi-layer rows only)."""
    content_retrieval: bool = True
    """False: "without content retrieval", the paper's third find_name ablation trained as such: every layer's query
    projection is held at zero through training (``SeedEnsemble.zero_queries``), so q·k = 0 and each head's scores
    are its bias alone."""
    first_layer: dict | None = None
    """Where set, layer 1 (index 0) is built from these ``AttentionConfig`` options instead of the variant's own,
    e.g. ``{"backend": "sdpa"}``: plain softmax with RoPE in layer 1 under FPA layers (multi-layer rows only)."""

    def attention(self, layers: int, dcp_dim: int, impl: str = "naive") -> AttentionConfig:
        """The ``AttentionConfig`` of this variant for a model of `layers` layers. Probes run the naive
        implementation by default: sequences are short, and it is the readable definition every fast path is tested
        against; groups of long sequences name another (``Group.impl``)."""
        options = dict(self.options)
        if self.no_first_layer_bias:
            if layers < 2:
                raise ValueError("a variant without layer-1 bias needs at least 2 layers")
            options["bias_layers"] = list(range(1, layers))
        if self.backend == "dcp":
            options.setdefault("dcp_dim", dcp_dim)
        return AttentionConfig(backend=self.backend, impl=impl, **options)

    def first_layer_attention(self, layers: int, dcp_dim: int, impl: str = "naive") -> AttentionConfig | None:
        """The ``AttentionConfig`` of layer 1 where the variant builds it otherwise (``first_layer``), else None."""
        if self.first_layer is None:
            return None
        if layers < 2:
            raise ValueError("a variant with its own layer 1 needs at least 2 layers")
        options = {"impl": impl, **self.first_layer}
        if options.get("backend", self.backend) == "dcp":
            options.setdefault("dcp_dim", dcp_dim)
        return AttentionConfig(**{"backend": self.backend, **options})


VARIANTS: dict[str, Variant] = {
    "fpa": Variant("fpa", {}, "FPA, general form (φ = W + g, ψ = W + h), path minimum, key level"),
    "fpa_stack": Variant("fpa", {"fpa_form": "stack"}, "FPA, stack form (g = h = 0)"),
    "fpa_dipsum": Variant("fpa", {"fpa_reduction": "dipsum"}, "FPA ablation: sum of dips instead of the minimum"),
    "fpa_nolevel": Variant("fpa", {"fpa_level": "none"}, "FPA ablation: no key level offset (ψ = W)"),
    "fpa_querylevel": Variant("fpa", {"fpa_level": "query"}, "FPA ablation: the query's level ψ_t instead of ψ_s"),
    "fpa_nobias1": Variant("fpa", {}, "FPA without a bias in layer 1 (softmax there, no positional encoding)",
                           no_first_layer_bias=True),
    # the same ablation with a positional signal in layer 1: FPA's layer-1 bias is what locates the previous token
    # (its walk), so removing it leaves fpa_nobias1's layer 1 with no position at all; here layer 1 is softmax with
    # RoPE, and sdpa_rope1 is the all-softmax model with the same layer 1 (its later layers softmax without
    # positions, as FPA's later layers have none but their bias)
    "fpa_nobias1_rope": Variant("fpa", {}, "FPA without a bias in layer 1, which is softmax with RoPE (the later "
                                "layers FPA)", first_layer={"backend": "sdpa"}),
    "sdpa_rope1": Variant("nope", {}, "softmax with RoPE in layer 1 and without positional encoding in the later "
                          "layers (fpa_nobias1_rope without the later layers' bias)", first_layer={"backend": "sdpa"}),
    "fpa_noretrieval": Variant("fpa", {}, "FPA ablation: no content retrieval (query projections held at zero: "
                               "scores are the bias alone)", content_retrieval=False),
    "fox": Variant("fox", {}, "FoX: forgetting attention (token-wise forget gate), no positional encoding"),
    "selective": Variant("selective", {}, "Selective Attention (layer-shared), RoPE"),
    "dcp": Variant("dcp", {}, "Dynamic Context Pruning (layer-shared, interaction width d), RoPE"),
    "sdpa": Variant("sdpa", {}, "softmax attention with RoPE"),
    "nope": Variant("nope", {}, "softmax attention without positional encoding"),
    "alibi": Variant("alibi", {}, "softmax attention with ALiBi"),
}


def variant(name: str) -> Variant:
    if name not in VARIANTS:
        raise ValueError(f"unknown probe backend {name!r}; known: {', '.join(VARIANTS)}")
    return VARIANTS[name]


@dataclass(frozen=True)
class Shape:
    """The probe model's size."""

    heads: int = 1
    """H: attention heads per layer."""
    head_dim: int = 4
    """d: the width of each head's q, k and v."""
    layers: int = 1
    width: int = 32
    """The embedding (residual) width; the gates and q/k/v projections read it."""
    positions: int = 0
    """A learned absolute position embedding for sequences up to this length, added to the token embedding
    (0: none, the default)."""
    mlp: int = 0
    """Hidden width of a GELU MLP after each attention layer, in its own residual branch (0: no MLP)."""
    norm: bool = False
    """Pre-norm (LayerNorm) before each attention layer and MLP, and before the readout."""

    def __post_init__(self):
        for name in ("heads", "head_dim", "layers", "width"):
            if getattr(self, name) < 1:
                raise ValueError(f"probe model {name} must be positive, got {getattr(self, name)}")
        for name in ("positions", "mlp"):
            if getattr(self, name) < 0:
                raise ValueError(f"probe model {name} must be >= 0 (0: none), got {getattr(self, name)}")

    def describe(self) -> str:
        extras = [f"positions {self.positions}" if self.positions else "", f"MLP {self.mlp}" if self.mlp else "",
                  "LayerNorm" if self.norm else ""]
        return ", ".join([f"{self.layers} layer(s), H={self.heads}, d={self.head_dim}, width {self.width}",
                          *filter(None, extras)])


@dataclass(frozen=True)
class _LayerShape:
    """What ``CausalSelfAttention`` reads from its config: here the heads are narrower than the residual stream."""

    d_model: int
    n_head: int
    head_dim: int
    attention: AttentionConfig


class ProbeModel(nn.Module):
    """tokens (B, T) -> class logits (B, T, K). See the module docstring."""

    def __init__(self, vocab_size: int, n_classes: int, shape: Shape, attention: AttentionConfig,
                 reads_token: bool = False, first_attention: AttentionConfig | None = None):
        """first_attention: layer 1's config where it differs from `attention` (``Variant.first_layer``)."""
        super().__init__()
        self.reads_token = reads_token
        configs = [first_attention or attention, *[attention] * (shape.layers - 1)]
        self.embed = nn.Embedding(vocab_size, shape.width)  # N(0, 1)
        self.position = nn.Embedding(shape.positions, shape.width) if shape.positions else None
        self.layers = nn.ModuleList(
            CausalSelfAttention(_LayerShape(shape.width, shape.heads, shape.head_dim, config), i)
            for i, config in enumerate(configs))
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(shape.width, shape.mlp), nn.GELU(),
                                                nn.Linear(shape.mlp, shape.width)) for _ in range(shape.layers)) \
            if shape.mlp else None
        norm = (lambda: nn.LayerNorm(shape.width)) if shape.norm else nn.Identity
        self.attn_norms = nn.ModuleList(norm() for _ in range(shape.layers))
        self.ffn_norms = nn.ModuleList(norm() for _ in range(shape.layers))
        self.final_norm = norm()
        self.readout = nn.Linear(shape.width, n_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)  # (B, T, C)
        if self.position is not None:
            if tokens.shape[-1] > self.position.num_embeddings:
                raise ValueError(f"sequence of {tokens.shape[-1]} tokens, but the position embedding has "
                                 f"{self.position.num_embeddings} positions (Shape.positions)")
            x = x + self.position.weight[: tokens.shape[-1]]
        # the readout sees what the blocks wrote (and the input embedding only where the probe allows it), so a
        # probe's answer cannot be read off the current token by a model without attention
        read = x if self.reads_token else torch.zeros_like(x)
        for i, layer in enumerate(self.layers):
            out = layer(self.attn_norms[i](x))
            if self.mlps is not None:
                out = out + self.mlps[i](self.ffn_norms[i](x + out))
            x = x + out
            read = read + out
        return self.readout(self.final_norm(read))


def query_projection_rows(model: ProbeModel) -> dict[str, int]:
    """The name of each layer's q/k/v weight -> how many of its leading rows project queries (H·d)."""
    return {f"layers.{i}.qkv.weight": layer.n_head * layer.head_dim for i, layer in enumerate(model.layers)}


class SeedEnsemble(nn.Module):
    """E independently initialised copies of one model, trained as one: parameters are stacked along a leading
    seed axis and the forward is ``vmap`` over it. Seeds never mix: every op acts per seed, the loss is a sum of
    per-seed losses and AdamW is elementwise, so each seed trains exactly as it would alone."""

    def __init__(self, make: Callable[[], nn.Module], seeds: list[int], vmapped: bool = True):
        """vmapped=False: the forward runs the seeds one after another (the same parameters and the same maths), for
        attention implementations that cannot run under ``vmap`` (a Triton kernel)."""
        super().__init__()
        self.vmapped = vmapped
        members = []
        for seed in seeds:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                members.append(make())
        stacked, _ = stack_module_state(members)  # {name: (E, ...)}
        self.names = list(stacked)
        self.stacked = nn.ParameterList(nn.Parameter(stacked[n].detach().clone()) for n in self.names)
        # the template's buffers (RoPE frequencies, ALiBi slopes) are the same for every seed and are used as they are
        self.template = copy.deepcopy(members[0])
        for p in self.template.parameters():
            p.requires_grad_(False)
        self.seeds = list(seeds)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (E, B, T) -> logits (E, B, T, K)."""

        def one(params, x):
            return functional_call(self.template, dict(zip(self.names, params)), (x,))

        if not self.vmapped:
            return torch.stack([one(tuple(p[i] for p in self.stacked), tokens[i]) for i in range(len(self.seeds))])
        return vmap(one)(tuple(self.stacked), tokens)

    def decay_groups(self, weight_decay: float) -> list[dict]:
        """AdamW parameter groups: every parameter decays except those an ``AttentionBackend`` owns (the gate maps
        under study are not regularised, as in the language-model trainer)."""
        owned = {id(p) for m in self.template.modules() if isinstance(m, AttentionBackend) for p in m.parameters()}
        exempt = {n for n, p in self.template.named_parameters() if id(p) in owned}
        pairs = list(zip(self.names, self.stacked))
        return [{"params": [p for n, p in pairs if n not in exempt], "weight_decay": weight_decay},
                {"params": [p for n, p in pairs if n in exempt], "weight_decay": 0.0}]

    @torch.no_grad()
    def zero_queries(self) -> None:
        """Every seed's query projections set to zero (a variant without content retrieval: called after the
        initialisation and after every optimiser step, so every forward sees q = 0)."""
        for name, rows in query_projection_rows(self.template).items():
            self.stacked[self.names.index(name)][:, :rows].zero_()

    def member(self, i: int) -> nn.Module:
        """Seed i as a standalone model (a copy)."""
        model = copy.deepcopy(self.template)
        model.load_state_dict({n: p[i].detach() for n, p in zip(self.names, self.stacked)}, strict=False)
        return model
