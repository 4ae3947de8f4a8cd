"""The attention backend contract: per-head gate maps (the bias ingredients) and the inner op in three
implementations, plus the probe record and the bias hook.

Every backend computes softmax(q·kᵀ/√D + bias)·v with its own bias. The attention layer owns the q/k/v/out
projections and RoPE; a backend owns only the small gate maps that produce its bias ingredients and the
inner op, available as
  naive   — the readable definition, (T, T) materialised;
  chunked — block-wise PyTorch, O(T·block) memory (CPU, and wherever no fused kernel applies);
  fused   — the fast path (SDPA for softmax, FlexAttention for FoX, the Triton kernel for FPA, SDPA with a
            layer-shared bias for Selective Attention and DCP).
The base class is plain causal softmax (no bias); the peers in ``backends.py`` add their gate maps and bias.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from fpa_lightning.ops.blockwise import blockwise_attention
from fpa_lightning.ops.common import dense_attention, same_document
from fpa_lightning.ops.fox.alibi import alibi_cumulative, alibi_decode_bias, alibi_slopes
from fpa_lightning.ops.fox.naive import fox_bias, fox_bias_block

Ingredients = dict[str, torch.Tensor]
DecodeState = dict[str, torch.Tensor]
"""A backend's decoding state: per cached key {name: (B, H or 1, S, ...)} (slot axis 2) or per row {name: (B, ...)}."""

BiasHook = Callable[[torch.Tensor | None, torch.Tensor, torch.Tensor, Any], tuple[torch.Tensor | None, Any]]
"""``hook(bias, query_positions, key_positions, carry) -> (bias, carry)``: sees every block of bias rows a layer
computes, before its softmax, and returns the bias to use.

bias: (B, H or 1, n, K) float32, the rows of queries ``query_positions`` (n,) over keys ``key_positions`` (K,);
entries of future keys (s > t) are ignored by the caller; None for a layer without a bias (return None to add none).
carry: whatever the hook returned for the previous block of the same pass (None for the first block).
Installed with ``Decoder.bias_hooks``; a hooked layer runs its chunked path (a fused kernel cannot call back).
Cache pruning (``fpa_lightning.analysis.pruning``) is the hook's first user.
"""


@dataclass
class LayerProbe:
    """One layer's bias ingredients for a batch (float32, no grad), from the probe path.

    backend: the name of the bias ("fpa", "fox", "selective", "dcp", "alibi"), or "none" for a layer without one.
    ingredients: FPA: phi, psi (B, T, H), beta (H,); FoX: log_gate_cumsum (B, T, H); Selective: q0, k0 (B, T, D)
    of the selecting head; DCP: qi, ki (B, T, r), offset; ALiBi: log_gate_cumsum (B, T, H).
    """

    backend: str
    ingredients: Ingredients = field(default_factory=dict)
    owner: AttentionBackend | None = None

    def row_blocks(self, block_size: int = 256, end: int | None = None) -> Iterator[tuple[int, torch.Tensor]]:
        """The bias in one pass, block by block: (lo, rows lo..hi-1 over keys 0..hi-1 as (B, H or 1, hi − lo, hi),
        −inf where s > t), up to row `end` (default T). Each block is computed once, its carry passed on."""
        T = next(iter(self.ingredients.values())).shape[1]
        end = T if end is None else end
        carry = None
        for lo in range(0, end, block_size):
            hi = min(end, lo + block_size)
            block, carry = self.owner.bias_block(self.ingredients, lo, hi, carry)
            rows = torch.arange(lo, hi, device=block.device)[:, None]
            yield lo, block.masked_fill(torch.arange(hi, device=block.device)[None, :] > rows, float("-inf"))

    def bias(self, lo: int = 0, hi: int | None = None, block_size: int = 256) -> torch.Tensor | None:
        """Bias rows lo..hi-1 over keys 0..hi-1: (B, H or 1, hi − lo, hi), −inf where s > t; None without a bias.

        Every block before `lo` is computed too (a carry can need them): to stream all rows, use row_blocks."""
        if self.owner is None or self.backend == "none":
            return None
        hi = next(iter(self.ingredients.values())).shape[1] if hi is None else hi
        rows = [
            F.pad(block, (0, hi - block.shape[-1]), value=float("-inf"))[..., max(lo - start, 0) :, :]
            for start, block in self.row_blocks(block_size, end=hi)
            if start + block.shape[-2] > lo
        ]
        return torch.cat(rows, dim=-2)


class AttentionBackend(nn.Module):
    """Base: plain causal softmax (no bias); subclasses add gate maps and a bias.

    Parameters owned by a backend (its gate maps) are the mechanism under study: the optimiser exempts them
    from weight decay by this owning type (``modules.language_model``).
    """

    has_bias = False
    fused_needs_cuda = False  # SDPA runs on any device
    fused_vmappable = False
    """Whether the fused path runs under ``torch.func.vmap``: the FPA kernel's does (its vmap rule). SDPA's does
    not: under vmap its float32 backward on an H200 (torch 2.11) stops with "LSE is not correctly aligned
    (strideH)". The probes' seed ensembles vmap a model only when every layer's implementation can."""

    def __init__(self, cfg, d_model: int, n_head: int, head_dim: int):
        """cfg: the model's ``AttentionConfig`` (``fpa_lightning.attention.config``)."""
        super().__init__()
        self.cfg = cfg
        self.n_head, self.head_dim = n_head, head_dim
        self.scale = 1.0 / math.sqrt(head_dim)
        self.alibi = cfg.positional == "alibi"
        if self.alibi:
            self.register_buffer("alibi_slope", alibi_slopes(n_head), persistent=False)
        self.bias_hook: BiasHook | None = None
        self.bias_hook_block_size: int | None = None  # query rows per hooked block; None: cfg.block_size

    # --- what a subclass provides -------------------------------------------------------------------
    def ingredients(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                    segment_ids: torch.Tensor | None = None) -> Ingredients:
        """Bias ingredients from the layer input x (B, T, C) and q, k (B, T, H, D), in float32. With segment_ids
        (B, T) (document masking) running sums over positions restart at every document start."""
        return {}

    def own_bias(self, ingredients: Ingredients) -> torch.Tensor | None:
        """The backend's bias for all pairs, (B, H or 1, T, T) (materialised)."""
        return None

    def own_bias_block(self, ingredients: Ingredients, lo: int, hi: int, carry):
        """Rows lo..hi-1 of the backend's bias over keys 0..hi-1 and the carry for the next block."""
        return None, None

    fused_head_dims: tuple[int, ...] | None = None
    """Head dims the backend's fused kernel is built for (None: any, as SDPA)."""

    def fused_unsupported_reason(self) -> str | None:
        """Why the fused path cannot run this configuration (None: it can)."""
        if self.fused_head_dims is not None and self.head_dim not in self.fused_head_dims:
            return f"the Triton kernel supports head dims {self.fused_head_dims}, got {self.head_dim}"
        return "ALiBi is not part of a fused kernel" if self.alibi else None

    def fused(self, q, k, v, ingredients: Ingredients, segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)
        if segment_ids is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
        T = q.shape[2]
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        visible = causal & same_document(segment_ids)  # (B, 1, T, T)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible).transpose(1, 2)

    # --- shared machinery ---------------------------------------------------------------------------
    def positional_bias(self, batch: int, T: int, device) -> Ingredients:
        if not self.alibi:
            return {}
        return {"alibi_cumsum": alibi_cumulative(self.alibi_slope.to(device), batch, T)}

    def bias_block(self, ingredients: Ingredients, lo: int, hi: int, carry):
        bias, carry = self.own_bias_block(ingredients, lo, hi, carry)
        if "alibi_cumsum" in ingredients:
            alibi = fox_bias_block(ingredients["alibi_cumsum"].transpose(1, 2), lo, hi)
            bias = alibi if bias is None else bias + alibi
        return bias, carry

    def dense_bias(self, ingredients: Ingredients) -> torch.Tensor | None:
        bias = self.own_bias(ingredients)
        if "alibi_cumsum" in ingredients:
            alibi = fox_bias(ingredients["alibi_cumsum"])
            bias = alibi if bias is None else bias + alibi
        return bias

    def bias_ingredients(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                         segment_ids: torch.Tensor | None = None) -> Ingredients:
        """Everything the bias of this layer needs: the gate maps' ingredients (outside autocast, so float32)
        and the positional ALiBi term if configured (relative, so it needs no restart at documents)."""
        with torch.autocast(q.device.type, enabled=False):
            ingredients = self.ingredients(x, q, k, segment_ids)
        ingredients.update(self.positional_bias(q.shape[0], q.shape[1], q.device))
        return ingredients

    def fallback_reason(self, device: torch.device) -> str | None:
        """Why ``impl='auto'`` runs the slower chunked path on `device` instead of a fused one; None when it runs
        fused or the implementation was chosen explicitly."""
        if self.cfg.impl != "auto":
            return None
        reason = self.fused_unsupported_reason()
        if reason is None and self.fused_needs_cuda and device.type != "cuda":
            reason = f"the fused path needs a CUDA GPU, the run is on {device.type}"
        return reason

    def resolve_impl(self, device: torch.device) -> str:
        """The implementation that will run on `device`; raises for a request that cannot be met."""
        impl, reason = self.cfg.impl, self.fused_unsupported_reason()
        if impl == "auto":
            return "chunked" if self.fallback_reason(device) else "fused"
        if impl == "fused":
            if reason is not None:
                raise ValueError(f"attention.impl='fused' is not available for backend {self.cfg.backend!r}: {reason}")
            if self.fused_needs_cuda and device.type != "cuda":
                raise RuntimeError(
                    f"attention.impl='fused' for backend {self.cfg.backend!r} needs a CUDA GPU; "
                    "use impl='chunked' (or 'auto') on a CPU"
                )
        return impl

    def forward(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        """q, k, v (B, T, H, D) -> (B, T, H, D). segment_ids (B, T): document ids of packed rows (document masking:
        a query attends only to keys of its own document), or None."""
        impl = self.resolve_impl(q.device)
        ingredients = self.bias_ingredients(x, q, k, segment_ids)
        if self.bias_hook is not None:
            return self._hooked_chunked(q, k, v, ingredients, segment_ids)
        if impl == "fused":
            return self.fused(q, k, v, ingredients, segment_ids)
        if impl == "naive":
            return dense_attention(q, k, v, self.dense_bias(ingredients), scale=self.scale, segment_ids=segment_ids)
        bias_block = (lambda lo, hi, carry: self.bias_block(ingredients, lo, hi, carry)) if ingredients else None
        return blockwise_attention(q, k, v, bias_block, scale=self.scale, block_size=self.cfg.block_size,
                                   segment_ids=segment_ids)

    def _hooked_chunked(self, q, k, v, ingredients: Ingredients, segment_ids: torch.Tensor | None) -> torch.Tensor:
        """The chunked path with every bias block passed through the bias hook."""

        def bias_block(lo: int, hi: int, carry):
            inner, hook_carry = carry if carry is not None else (None, None)
            bias, inner = self.bias_block(ingredients, lo, hi, inner)  # bias None for a layer without one
            rows, keys = torch.arange(lo, hi, device=q.device), torch.arange(hi, device=q.device)
            bias, hook_carry = self.bias_hook(bias, rows, keys, hook_carry)
            return bias, (inner, hook_carry)

        return blockwise_attention(q, k, v, bias_block, scale=self.scale,
                                   block_size=self.bias_hook_block_size or self.cfg.block_size,
                                   segment_ids=segment_ids)

    # --- decoding with a KV cache (fpa_lightning.generation) ------------------------------------------
    # The cache keeps K/V per slot and, per cached key, the state the bias needs: a backend brings its cache form
    # with it through the three methods below. ``cache`` is a ``fpa_lightning.generation.LayerCache``: ``key_pos``
    # (B, H, S) positions of the slots (−1: free), ``k`` (B, H, S, D), ``state`` (per key) and ``carry`` (per row)
    # dicts, and ``put(name, values)``, which writes the state of the keys just added (B, H or 1, n, ...).

    shared_key_state = False
    """True when the per-key state is one per key for all heads (a layer-shared bias): every head must then keep
    the same keys, so pruning by a per-head bias (ALiBi on top) has no cache form."""

    @property
    def decode_bias_falls(self) -> bool:
        """True when no cached key's bias ever rises from one query to a later one (a running sum of terms ≤ 0 or a
        running minimum: FoX, FPA at the key level, Selective, DCP, ALiBi, and no bias at all). A threshold that
        rejects a key at one query of a piece then rejects it at every later one, so the KV cache's eviction needs
        no running OR down the piece's queries. A backend whose bias can rise (FPA at the query level) says False.
        tests/generation/test_eviction.py checks the claim of every backend on decoded pieces."""
        return True

    @property
    def has_piece_kernel(self) -> bool:
        """True when ``decode_piece_fused`` attends a piece of queries over the KV cache in one fused kernel, bias
        and threshold eviction included (FPA at the key level with the min reduction and no ALiBi)."""
        return False

    @property
    def has_step_kernel(self) -> bool:
        """True when the decoding step's fused ops (``fpa_lightning.ops.decode.step``) make this layer's bias and
        eviction in the pass that reads the keys: a layer without any bias (softmax, with RoPE or none), or FPA at the
        key level with the min reduction, no ALiBi and float32 gate maps."""
        return not self.has_bias and not self.alibi

    def step_gate(self, x: torch.Tensor, cache) -> dict:
        """For a backend with ``has_step_kernel``: the gate-map arguments of ``store_token`` (ops/decode/step) for one
        new token per row, x (B, C) the layer's normed input; none for a layer without a bias."""
        return {}

    def step_bias(self, cache, phi: torch.Tensor | None) -> dict:
        """For a backend with ``has_step_kernel``: the bias arguments of ``step_attention`` (ops/decode/step), phi
        (B, H) being what ``store_token`` returned; none for a layer without a bias."""
        return {}

    def decode_piece_fused(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, query_pos: torch.Tensor,
                           cache, threshold: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """n new tokens over the cache in one kernel, for a backend with ``has_piece_kernel``: their attention
        output (B, n, H, D), how many keys each query kept (B, H, n), and the keys the threshold evicts for good
        (B, H, S), None for the threshold −inf. The state is advanced as ``decode_bias`` advances it; the keys are
        already cached."""
        raise NotImplementedError(f"{type(self).__name__} has no fused piece kernel (has_piece_kernel is False)")

    def decode_prefill_state(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                             lengths: torch.Tensor) -> tuple[DecodeState, DecodeState]:
        """After a parallel prefill of x (B, T, C), q, k (B, T, H, D): the state of keys 0..T-1 and of each row as
        they stand after query lengths[b] − 1 of row b (later positions are right padding and ignored)."""
        return {}, {}

    def decode_bias(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, query_pos: torch.Tensor,
                    cache) -> torch.Tensor | None:
        """Bias rows of n new tokens over the cache's S slots, (B, H or 1, n, S), None without a bias; the state is
        advanced past them. x (B, n, C), q, k (B, n, H, D) at query_pos (B, n); their keys are already in the
        cache. Entries of free slots and future keys are garbage, masked by the caller. Adds ALiBi if configured."""
        bias = self.own_decode_bias(x, q, k, query_pos, cache)
        if self.alibi:
            alibi = alibi_decode_bias(self.alibi_slope, query_pos, cache.key_pos)
            bias = alibi if bias is None else bias + alibi
        return bias

    def own_decode_bias(self, x, q, k, query_pos, cache) -> torch.Tensor | None:
        """The backend's own part of ``decode_bias`` (positional ALiBi excluded)."""
        return None

    def prefill_carry(self, ingredients: Ingredients, lengths: torch.Tensor) -> torch.Tensor:
        """The chunked path's per-key carry (e.g. Selective's Σ_{t'<L} S[t', s]) after query lengths[b] − 1 of each
        row b: (B, ..., T), zero past a row's length. Computed with ``own_bias_block`` itself, once per distinct
        length (O(T²), as the parallel forward of these backends)."""
        B, T = lengths.shape[0], next(v for v in ingredients.values() if v.dim() >= 2).shape[1]
        out = None
        for length in lengths.unique().tolist():
            rows = (lengths == length).nonzero()[:, 0]
            # batched ingredients are (B, T, ...); parameters (beta, offset) have fewer dims
            sub = {name: v[rows, :length] if v.dim() >= 2 else v for name, v in ingredients.items()}
            carry = None
            for lo in range(0, length, self.cfg.block_size):
                carry = self.own_bias_block(sub, lo, min(length, lo + self.cfg.block_size), carry)[1]
            if out is None:
                out = carry.new_zeros(B, *carry.shape[1:-1], T)
            out[rows, ..., :length] = carry
        return out

    @torch.no_grad()
    def probe(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
              segment_ids: torch.Tensor | None = None) -> LayerProbe:
        if not self.has_bias:
            return LayerProbe("none")
        return LayerProbe(self.label, self.ingredients(x, q, k, segment_ids), owner=self)

    @property
    def label(self) -> str:
        """The bias this layer carries: the backend's name, or "softmax" for a layer without one."""
        return self.cfg.backend if self.has_bias else "softmax"
