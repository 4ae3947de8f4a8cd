"""Decoder-only transformer: pre-norm RMSNorm blocks, SwiGLU MLP, tied embeddings."""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from fpa_lightning.attention import BiasHook, CausalSelfAttention, LayerProbe
from fpa_lightning.config import ModelConfig
from fpa_lightning.ops.common import at_least_fp32, rms_norm, silu_mul


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_hidden: int):
        super().__init__()
        self.gate_up = nn.Linear(d_model, 2 * d_hidden, bias=False)
        self.down = nn.Linear(d_hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(silu_mul(self.gate_up(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = CausalSelfAttention(cfg, layer)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.d_mlp)

    def forward(self, x: torch.Tensor, segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), segment_ids)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._init_weights()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def _init_weights(self) -> None:
        std = self.cfg.init_std
        residual_std = std / math.sqrt(2 * self.cfg.n_layer)  # keeps the residual stream's variance O(1)
        nn.init.normal_(self.embed.weight, std=std)
        nn.init.normal_(self.lm_head.weight, std=std)
        for block in self.blocks:
            nn.init.normal_(block.attn.qkv.weight, std=std)
            nn.init.normal_(block.mlp.gate_up.weight, std=std)
            nn.init.normal_(block.attn.out.weight, std=residual_std)
            nn.init.normal_(block.mlp.down.weight, std=residual_std)
            # gate maps keep their backend's own documented initialisation

    def document_mask(self, segment_ids: torch.Tensor | None) -> torch.Tensor | None:
        """The segment ids attention uses: the batch's (B, T) under ``attention.document_mask``, else None (packed
        documents see each other, the default)."""
        return segment_ids if self.cfg.attention.document_mask else None

    def features(self, input_ids: torch.Tensor, segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids (B, T) -> final normed hidden states (B, T, C). segment_ids (B, T): the documents of packed
        rows, used when ``attention.document_mask`` is on."""
        segment_ids = self.document_mask(segment_ids)
        x = self.embed(input_ids)
        checkpointing = self.cfg.activation_checkpointing and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            # A block that a strategy has wrapped (an FSDP unit, FSDP's checkpoint wrapper) is no Block: FSDP
            # checkpoints it through its own policy (modules/scaling.py), never twice.
            if checkpointing and isinstance(block, Block):
                x = checkpoint(block, x, segment_ids, use_reentrant=False)
            else:
                x = block(x, segment_ids)
        return self.norm(x)

    def features_with(self, input_ids: torch.Tensor,
                      attention: Callable[[int, CausalSelfAttention, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """``features`` with layer i's attention output computed by ``attention(i, block.attn, x)`` (x: the layer's
        normed input (B, n, C) -> (B, n, C)): the entry of cached decoding (``fpa_lightning.generation``), whose
        attention reads and writes a KV cache. Same embedding, blocks, residuals and norms as ``features``."""
        x = self.embed(input_ids)
        for layer, block in enumerate(self.blocks):
            x = x + attention(layer, block.attn, block.attn_norm(x))
            x = x + block.mlp(block.mlp_norm(x))
        return self.norm(x)

    def step_features_with(self, input_ids: torch.Tensor,
                           attention: Callable[[int, CausalSelfAttention, torch.Tensor], torch.Tensor],
                           add_rms_norm: Callable, silu_mul: Callable) -> torch.Tensor:
        """``features_with`` for one token per row, input_ids (B,) -> (B, C), with each residual add fused into the
        norm after it, ``add_rms_norm(x, delta, weight, eps) -> (x + delta, RMSNorm(x + delta))`` (delta None: no
        add), and SwiGLU's activation given as ``silu_mul``: the fused decoding step's form
        (``fpa_lightning.generation``; ops/decode/step has both ops, naive and fused). The same maths: with the naive
        ops its result equals ``features_with``'s."""
        norms = [norm for block in self.blocks for norm in (block.attn_norm, block.mlp_norm)] + [self.norm]
        x, h = add_rms_norm(self.embed(input_ids), None, norms[0].weight, norms[0].eps)  # (B, C) each
        for layer, block in enumerate(self.blocks):
            after_attn, after_mlp = norms[2 * layer + 1], norms[2 * layer + 2]
            x, h = add_rms_norm(x, attention(layer, block.attn, h), after_attn.weight, after_attn.eps)
            x, h = add_rms_norm(x, block.mlp.down(silu_mul(block.mlp.gate_up(h))), after_mlp.weight, after_mlp.eps)
        return h

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids (B, T) -> logits (B, T, V)."""
        return self.lm_head(self.features(input_ids, segment_ids))

    def token_losses(self, input_ids: torch.Tensor, labels: torch.Tensor, chunk: int = 1024,
                     segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Per-token cross-entropy (B, T) in float32, the vocabulary projection taken `chunk` positions at a
        time so long inputs never hold (T, V) logits at once."""
        hidden = self.features(input_ids, segment_ids)
        losses = [
            F.cross_entropy(
                at_least_fp32(self.lm_head(hidden[:, i : i + chunk])).flatten(0, 1),
                labels[:, i : i + chunk].flatten(),
                reduction="none",
            ).view(labels.shape[0], -1)
            for i in range(0, labels.shape[1], chunk)
        ]
        return torch.cat(losses, dim=1)

    @torch.no_grad()
    def probe(self, input_ids: torch.Tensor, segment_ids: torch.Tensor | None = None) -> list[LayerProbe]:
        """Per layer, the backend's bias ingredients for this batch (float32, no grad): the explicit
        statistics path for callbacks, separate from the training forward. Under document masking the hidden
        states are the masked model's and the walks restart at documents; the bias itself spans all pairs."""
        segment_ids = self.document_mask(segment_ids)
        device_type = input_ids.device.type
        with torch.autocast(device_type, enabled=False):
            x = self.embed(input_ids)
            probes = []
            for block in self.blocks:
                probes.append(block.attn.probe(block.attn_norm(x), segment_ids))
                # the block's call without its compiled wrapper (nn.Module.compile keeps the eager call, hooks
                # included, as _call_impl): where the blocks are compiled (LanguageModel's compile), this float32,
                # no-grad pass would compile each again for its own precision and grad mode, minutes at long
                # context; kernels compiled on their own (FoX's FlexAttention) still run compiled
                # (docs/training.md, "torch.compile")
                x = block._call_impl(x, segment_ids)
        return probes

    def attention_impls(self, device: torch.device | str) -> list[str]:
        """The inner-op implementation each layer runs on `device` (raises for a request that cannot run)."""
        device = torch.device(device)
        return [f"{b.attn.backend.label}:{b.attn.backend.resolve_impl(device)}" for b in self.blocks]

    def attention_fallbacks(self, device: torch.device | str) -> list[str]:
        """One message per reason why ``impl='auto'`` runs the slower chunked path on `device`, naming the layers."""
        device = torch.device(device)
        layers_by_reason: dict[tuple[str, str], list[int]] = {}
        for i, block in enumerate(self.blocks):
            backend = block.attn.backend
            reason = backend.fallback_reason(device)
            if reason is not None:
                layers_by_reason.setdefault((backend.label, reason), []).append(i)
        return [f"attention.impl='auto' falls back to the slower chunked path in layer(s) {layers} ({label}): {reason}"
                for (label, reason), layers in layers_by_reason.items()]

    @contextmanager
    def bias_hooks(self, make_hook: Callable[[int], BiasHook], block_size: int | None = None) -> Iterator[None]:
        """Within the context, layer i passes every bias block through ``make_hook(i)`` (see ``BiasHook``): the
        documented way to change attention biases from outside (cache pruning), never a patched forward.
        block_size: query rows per hooked block (default: the layer's ``attention.block_size``). A hook that
        carries its state from block to block gives the same result at any size; larger blocks launch fewer,
        larger kernels (a GPU's speed) and hold (B, H, block_size, T) temporaries (its memory)."""
        if block_size is not None and block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        backends = [block.attn.backend for block in self.blocks]
        for layer, backend in enumerate(backends):
            backend.bias_hook, backend.bias_hook_block_size = make_hook(layer), block_size
        try:
            yield
        finally:
            for backend in backends:
                backend.bias_hook, backend.bias_hook_block_size = None, None

    def has_bias(self) -> bool:
        """True when some attention layer has a bias of its own (False: plain softmax in every layer)."""
        return any(block.attn.backend.has_bias for block in self.blocks)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
