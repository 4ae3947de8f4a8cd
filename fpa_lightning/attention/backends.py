"""The biased backends (docs/method.md): ALiBi, FoX, FPA, Selective Attention and DCP. Each owns its gate maps and
says how its bias is computed; the inner op and its three implementations come from ``AttentionBackend``.
The names users write in configs map to these classes in ``registry.py``.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from fpa_lightning.attention.base import AttentionBackend
from fpa_lightning.ops.common import FAR, FREE, at_least_fp32, document_first_tokens, running_sum
from fpa_lightning.ops.dcp import dcp_attention_fused, dcp_bias, dcp_bias_block, log_keep
from fpa_lightning.ops.dcp.fused import INTERACTION_DIMS as DCP_FUSED_INTERACTION_DIMS
from fpa_lightning.ops.fox.alibi import alibi_cumulative, alibi_slopes
from fpa_lightning.ops.fox.flex import fox_flex_attention
from fpa_lightning.ops.fox.naive import fox_bias, fox_bias_block
from fpa_lightning.ops.fpa.chunked import fpa_bias_block
from fpa_lightning.ops.fpa.fused import fpa_attention as fused_fpa_attention
from fpa_lightning.ops.fpa.naive import fpa_bias
from fpa_lightning.ops.fpa.piece import fused as fpa_piece, path_min_after
from fpa_lightning.ops.kernel_inputs import HEAD_DIMS as FUSED_HEAD_DIMS
from fpa_lightning.ops.selective import (
    selection_scores,
    selective_attention_fused,
    selective_bias,
    selective_bias_block,
)


def fp32_linear(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``linear(x)`` in float32 at least, weights included: the gate maps run outside autocast
    (``AttentionBackend.bias_ingredients``), and FSDP's mixed precision hands the layer bf16 weights."""
    dtype = torch.promote_types(torch.promote_types(x.dtype, linear.weight.dtype), torch.float32)
    bias = None if linear.bias is None else linear.bias.to(dtype)
    return F.linear(x.to(dtype), linear.weight.to(dtype), bias)


def _offset_as_vector(state_dict, prefix, *args) -> None:
    """Checkpoints written when DCP's offset was a 0-dim parameter still load."""
    key = prefix + "offset"
    if key in state_dict and state_dict[key].dim() == 0:
        state_dict[key] = state_dict[key].reshape(1)


class AlibiBackend(AttentionBackend):
    """The positional baseline: softmax with ALiBi (probes report ALiBi as its bias)."""

    has_bias = True

    def ingredients(self, x, q, k, segment_ids=None):  # relative: no restart needed
        return {"log_gate_cumsum": alibi_cumulative(self.alibi_slope.to(q.device), q.shape[0], q.shape[1])}

    def positional_bias(self, batch, T, device):  # ALiBi is this backend's own bias, added once
        return {}

    def own_bias(self, ingredients):
        return fox_bias(ingredients["log_gate_cumsum"])

    def own_bias_block(self, ingredients, lo, hi, carry):
        return fox_bias_block(ingredients["log_gate_cumsum"].transpose(1, 2), lo, hi), None

    # decoding: the base class's positional ALiBi term (from the cached keys' positions) is this backend's bias


# Under torch.compile (``model.compile``) these run between graphs, a graph break per layer: the Triton autograd
# functions are launched as they are, and FlexAttention is compiled on its own (with its own length handling). FPA's
# op is traced whole instead, as two custom ops (ops/fpa/fused.py): its compiled block is one graph.
_fox_flex = torch.compiler.disable(fox_flex_attention)
_fused_selective = torch.compiler.disable(selective_attention_fused)
_fused_dcp = torch.compiler.disable(dcp_attention_fused)


def _alibi_like_init(bias: torch.Tensor, n_head: int, transform) -> None:
    """Start every head as ALiBi: per-step decay m_h = ALiBi's slope, mapped through `transform`."""
    with torch.no_grad():
        bias.copy_(transform(alibi_slopes(n_head)))


class FoxBackend(AttentionBackend):
    """FoX: b[t, s] = Σ_{s<u≤t} log σ(f_u), f = per-head linear map of x (docs/method.md).

    Init: zero weights and f's bias set so that log σ(f) = −m_h (ALiBi's slopes): the model starts as ALiBi.
    """

    has_bias = True
    fused_needs_cuda = True

    def __init__(self, cfg, d_model, n_head, head_dim):
        super().__init__(cfg, d_model, n_head, head_dim)
        self.gate = nn.Linear(d_model, n_head)
        nn.init.zeros_(self.gate.weight)
        # σ(f) = e^{−m}  <=>  f = log(e^{−m} / (1 − e^{−m})) = −log(e^{m} − 1)
        _alibi_like_init(self.gate.bias, n_head, lambda m: -torch.log(torch.expm1(m)))

    def ingredients(self, x, q, k, segment_ids=None):
        log_gate = F.logsigmoid(fp32_linear(self.gate, x))  # (B, T, H), ≤ 0
        return {"log_gate_cumsum": running_sum(log_gate, segment_ids)}

    def own_bias(self, ingredients):
        return fox_bias(ingredients["log_gate_cumsum"])

    def own_bias_block(self, ingredients, lo, hi, carry):
        return fox_bias_block(ingredients["log_gate_cumsum"].transpose(1, 2), lo, hi), None

    def fused(self, q, k, v, ingredients, segment_ids=None):
        return _fox_flex(q, k, v, ingredients["log_gate_cumsum"], scale=self.scale, segment_ids=segment_ids)

    # decoding: per cached key its running log-decay Σ_{s<u≤t} log σ(f_u), one scalar per key and head
    def decode_prefill_state(self, x, q, k, lengths):
        c = self.ingredients(x, q, k)["log_gate_cumsum"]  # (B, T, H)
        c_end = c.gather(1, (lengths - 1)[:, None, None].expand(-1, 1, c.shape[2]))  # (B, 1, H): c at L − 1
        return {"log_decay": (c_end - c).transpose(1, 2)}, {}  # (B, H, T)

    def own_decode_bias(self, x, q, k, query_pos, cache):
        c = self.ingredients(x, q, k)["log_gate_cumsum"].transpose(1, 2)  # (B, H, n), summed from the piece start
        cache.put("log_decay", -c)  # so that a new key s sees c_t − c_s
        decay = cache.state["log_decay"]  # (B, H, S)
        rows = decay[:, :, None, :] + c[..., :, None]  # (B, H, n, S)
        decay.add_(c[..., -1:])
        return rows


class FpaBackend(AttentionBackend):
    """FPA (docs/method.md): per head, δ, g, h are linear maps of x; W = cumsum(δ) in float32;
    φ = W + g, ψ = W + h; β = softplus(β_raw).

    Init (documented choice): zero weights, δ's bias = −m_h (ALiBi's slopes), g = h = 0 and β = 1. Then
    φ = ψ = W is strictly decreasing, every off-diagonal pair is dead and b[t, s] = −m_h·(t − s): the model
    starts exactly as ALiBi (and as our FoX, which starts there too), and gradients reach φ, ψ and β from the
    first step. An all-alive start (φ ≥ ψ everywhere) would give exactly zero gate gradients and never learn.
    """

    has_bias = True
    fused_needs_cuda = True
    fused_vmappable = True  # the kernel's vmap rule folds the mapped axis into its heads
    # every variant is fused (reduction min or dipsum, level key or query; "none" and the stack form are key levels
    # computed in `ingredients`): only the head dim can rule the kernel out
    fused_head_dims = FUSED_HEAD_DIMS

    def __init__(self, cfg, d_model, n_head, head_dim):
        super().__init__(cfg, d_model, n_head, head_dim)
        # outputs: δ, then g (unless stack form), then h (general form with a key or query level)
        self.n_maps = 1 if cfg.fpa_form == "stack" else (2 if cfg.fpa_level == "none" else 3)
        self.gate = nn.Linear(d_model, self.n_maps * n_head)
        nn.init.zeros_(self.gate.weight)
        nn.init.zeros_(self.gate.bias)
        _alibi_like_init(self.gate.bias[:n_head], n_head, torch.neg)
        self.beta_raw = nn.Parameter(torch.full((n_head,), math.log(math.e - 1.0)))  # softplus⁻¹(1)

    def fields(self, x: torch.Tensor, walk_start: torch.Tensor | None = None,
               segment_ids: torch.Tensor | None = None):
        """φ, ψ and the walk W of tokens x (B, n, C), each (B, n, H) in float32; the walk continues from
        walk_start (B, H) (decoding) or starts at 0, and restarts at every document of segment_ids (B, n)
        (document masking)."""
        maps = fp32_linear(self.gate, x).unflatten(-1, (self.n_maps, self.n_head))  # (B, n, maps, H)
        walk = running_sum(maps[:, :, 0], segment_ids)  # W_t = Σ_{u≤t} δ_u, (B, n, H), float32
        if walk_start is not None:
            walk = walk + walk_start[:, None]
        phi = walk + maps[:, :, 1] if self.n_maps > 1 else walk
        psi = walk + maps[:, :, 2] if self.n_maps > 2 else walk
        return phi, psi, walk

    def ingredients(self, x, q, k, segment_ids=None):
        phi, psi, _ = self.fields(x, segment_ids=segment_ids)
        return {"phi": phi, "psi": psi, "beta": F.softplus(at_least_fp32(self.beta_raw))}

    def own_bias(self, ingredients):
        return fpa_bias(ingredients["phi"], ingredients["psi"], ingredients["beta"], reduction=self.cfg.fpa_reduction,
                        level=self.cfg.fpa_op_level)

    def own_bias_block(self, ingredients, lo, hi, carry):
        phi_h, psi_h = ingredients["phi"].transpose(1, 2), ingredients["psi"].transpose(1, 2)
        return fpa_bias_block(phi_h, psi_h, ingredients["beta"], lo, hi, carry, reduction=self.cfg.fpa_reduction,
                              level=self.cfg.fpa_op_level)

    def fused(self, q, k, v, ingredients, segment_ids=None):
        return fused_fpa_attention(q, k, v, ingredients["phi"], ingredients["psi"], ingredients["beta"],
                                   scale=self.scale, reduction=self.cfg.fpa_reduction, level=self.cfg.fpa_op_level,
                                   skip_threshold=self.cfg.skip_threshold, segment_ids=segment_ids)

    # decoding: per cached key s and head, its level ψ_s and the running path statistic of (s, t]: the minimum
    # m_s = min φ_u (min reduction) or the dip sum Σ min(0, φ_u − ψ_s) (dipsum); per row, the walk so far.
    # The query level compares with ψ_t instead and needs no ψ_s.
    def decode_prefill_state(self, x, q, k, lengths):
        phi, psi, walk = self.fields(x)  # (B, T, H)
        H, T = self.n_head, x.shape[1]
        walk_end = walk.gather(1, (lengths - 1)[:, None, None].expand(-1, 1, H))[:, 0]  # (B, H)
        phi_h, psi_h = phi.transpose(1, 2), psi.transpose(1, 2)  # (B, H, T)
        state = {} if self.cfg.fpa_op_level == "query" else {"level": psi_h}
        if self.cfg.fpa_reduction == "min":
            inside = torch.arange(T, device=x.device)[None, None, :] < lengths[:, None, None]  # (B, 1, T)
            field = torch.where(inside, phi_h, FAR)
            from_s = field.flip(-1).cummin(dim=-1).values.flip(-1)  # min over u in [s, L)
            state["path_min"] = torch.cat([from_s[..., 1:], torch.full_like(from_s[..., :1], FAR)], dim=-1)  # (s, L)
        else:
            state["dip_sum"] = self.prefill_carry({"phi": phi, "psi": psi, "beta": phi.new_ones(H)}, lengths)
        return state, {"walk": walk_end}

    @property
    def decode_bias_falls(self) -> bool:  # the query level compares with ψ_t, which can rise
        return self.cfg.fpa_op_level == "key"

    def _advance_fields(self, x, cache) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """φ and ψ of n new tokens x (B, n, C), (B, H, n) each, continuing the cached walk; their keys' level (key
        level) and empty path minimum (min reduction) go into the cache. Returns φ, ψ and β (H,)."""
        phi, psi, walk = self.fields(x, cache.carry["walk"])  # (B, n, H)
        cache.carry["walk"].copy_(walk[:, -1])
        phi_h, psi_h = phi.transpose(1, 2), psi.transpose(1, 2)  # (B, H, n)
        if self.cfg.fpa_op_level == "key":
            cache.put("level", psi_h)
        if self.cfg.fpa_reduction == "min":
            cache.put("path_min", torch.full_like(phi_h, FAR))  # a new key's range is empty
        return phi_h, psi_h, F.softplus(at_least_fp32(self.beta_raw))

    @property
    def has_piece_kernel(self) -> bool:
        return self.cfg.fpa_op_level == "key" and self.cfg.fpa_reduction == "min" and not self.alibi

    @property
    def has_step_kernel(self) -> bool:
        return self.has_piece_kernel and self.gate.weight.dtype == self.beta_raw.dtype == torch.float32

    def step_gate(self, x, cache):
        return {"gate_weight": self.gate.weight, "gate_bias": self.gate.bias, "x": x, "walk": cache.carry["walk"],
                "level": cache.state["level"], "path_min": cache.state["path_min"]}

    def step_bias(self, cache, phi):
        return {"path_min": cache.state["path_min"], "level": cache.state["level"], "phi": phi,
                "beta_raw": self.beta_raw}

    def decode_piece_fused(self, x, q, k, query_pos, cache, threshold):
        phi_h, _, beta = self._advance_fields(x, cache)
        start = query_pos[:, 0]  # a piece's positions are consecutive
        stored, level = cache.state["path_min"], cache.state["level"]  # (B, H, S)
        out, kept = fpa_piece.fpa_piece_attention(q, cache.k, cache.v, cache.key_pos, stored, level,
                                                  phi_h.contiguous(), beta, start, self.scale, threshold)
        stored.copy_(path_min_after(stored, phi_h, cache.key_pos, start))
        if threshold == float("-inf"):
            return out, kept, None
        last = query_pos[:, -1][:, None, None]  # (B, 1, 1): after the last query, as the kernel decided
        evicted = ((cache.key_pos != FREE) & (cache.key_pos < last)
                   & (beta[:, None] * (stored - level).clamp(max=0) < threshold))
        return out, kept, evicted

    def own_decode_bias(self, x, q, k, query_pos, cache):
        phi_h, psi_h, beta = self._advance_fields(x, cache)
        level = psi_h[..., :, None] if self.cfg.fpa_op_level == "query" else cache.state["level"][:, :, None, :]
        beta = beta[:, None, None]
        if self.cfg.fpa_reduction == "min":
            stored = cache.state["path_min"]  # (B, H, S)
            path_min = _piece_path_min(stored, phi_h, cache.key_pos, query_pos, cache.slots)  # (B, H, n, S)
            stored.copy_(path_min[:, :, -1])
            return beta * (path_min - level).clamp(max=0)  # (B, H, n, S)
        after = cache.key_pos[:, :, None, :] < query_pos[:, None, :, None]  # (B, H, n, S): query u moves key s < u
        cache.put("dip_sum", torch.zeros_like(phi_h))
        stored = cache.state["dip_sum"]
        dip_sum = stored[:, :, None, :] + torch.where(after, (phi_h[..., None] - level).clamp(max=0), 0.0).cumsum(dim=2)
        stored.copy_(dip_sum[:, :, -1])
        return beta * dip_sum  # (B, H, n, S)


def _piece_path_min(stored: torch.Tensor, phi: torch.Tensor, key_pos: torch.Tensor, query_pos: torch.Tensor,
                    slots: torch.Tensor) -> torch.Tensor:
    """The path minimum min(m_s, min_{s<u≤t} φ_u) of every cached key s for the n queries t of a piece: (B, H, n, S).
    stored m_s (B, H, S) (FAR for the piece's own keys, just written), phi (B, H, n), key_pos (B, H, S), query_pos
    (B, n) (consecutive per row), slots (B, H, n) of the piece's keys.

    One query (a decoding step, captured in a CUDA graph): min(m_s, φ_t) for the keys before it, no scan or
    scatter. A longer piece does not scan all S slots: a key older than the piece sees every query, so its minimum
    is min(m_s, running min of φ), and only the piece's own n keys need a scan, an (n, n) table scattered into their
    slots (a scan over (n, S) was the largest cost of scoring with real eviction: BENCHMARKS.md, "Scoring with real
    eviction (H200)")."""
    n = phi.shape[-1]
    if n == 1:
        before = key_pos < query_pos[:, None, :]  # (B, H, S): the query moves every key older than itself
        return torch.minimum(stored, torch.where(before, phi, FAR))[:, :, None, :]
    path_min = torch.minimum(stored[:, :, None, :], phi.cummin(dim=-1).values[..., None])  # (B, H, n, S)
    order = torch.arange(n, device=phi.device)
    moves = order[None, :] > order[:, None]  # (n_j, n_t): query t moves the piece's key j when t > j
    own = torch.where(moves, phi[..., None, :], FAR).cummin(dim=-1).values  # (B, H, n_j, n_t), a scan along t
    return path_min.scatter_(-1, slots[:, :, None, :].expand(-1, -1, n, -1), own.transpose(-1, -2))


class SelectiveBackend(AttentionBackend):
    """Selective Attention: head 0's ReLU logits select, F is subtracted from every head (layer-shared)."""

    has_bias = True
    fused_needs_cuda = True
    fused_head_dims = FUSED_HEAD_DIMS

    def ingredients(self, x, q, k, segment_ids=None):
        # under document masking every document's first token is never selected (the BOS rule, per document)
        documents = {} if segment_ids is None else {"segment_ids": segment_ids}
        return {"q0": at_least_fp32(q[:, :, 0]), "k0": at_least_fp32(k[:, :, 0]), **documents}

    def own_bias(self, ingredients):
        return selective_bias(ingredients["q0"][:, :, None], ingredients["k0"][:, :, None], scale=self.scale,
                              segment_ids=ingredients.get("segment_ids"))

    def own_bias_block(self, ingredients, lo, hi, carry):
        segment_ids = ingredients.get("segment_ids")
        first_tokens = None if segment_ids is None else document_first_tokens(segment_ids)
        return selective_bias_block(ingredients["q0"], ingredients["k0"], lo, hi, carry, self.scale, first_tokens)

    def fused(self, q, k, v, ingredients, segment_ids=None):
        # the Triton kernel: the (T, T) bias is never materialised (BENCHMARKS.md, "Attention kernels (H200)")
        return _fused_selective(q, k, v, scale=self.scale, segment_ids=segment_ids)

    # decoding: per cached key its selection so far F_s = Σ_{t'<t} S[t', s], one scalar for all heads
    shared_key_state = True

    def decode_prefill_state(self, x, q, k, lengths):
        return {"selected": self.prefill_carry(self.ingredients(x, q, k), lengths)[:, None]}, {}  # (B, 1, T)

    def own_decode_bias(self, x, q, k, query_pos, cache):
        cache.put("selected", q.new_zeros(q.shape[0], 1, q.shape[1], dtype=cache.state["selected"].dtype))
        key_pos = cache.key_pos[:, 0]  # (B, S): every head keeps the same keys (shared_key_state)
        selectable = (key_pos[:, None, :] > 0) & (key_pos[:, None, :] < query_pos[:, :, None])  # (B, n, S)
        scores = selection_scores(at_least_fp32(q[:, :, 0]), at_least_fp32(cache.k[:, 0]), self.scale)
        selection = torch.where(selectable, scores, 0.0)  # S[t', s] of the new queries t'
        stored = cache.state["selected"]  # (B, 1, S)
        rows = stored[:, :, None, :] + (selection.cumsum(dim=1) - selection)[:, None]  # exclusive: Σ_{t'<t}
        stored.add_(selection.sum(dim=1)[:, None])
        return -rows  # (B, 1, n, S)


class DcpBackend(AttentionBackend):
    """DCP: low-dimensional interaction queries/keys shared across heads, sparse-sigmoid keep probabilities,
    cumulative product over queries, log added to every head's logits.

    Init: interaction maps N(0, 0.02²) and an offset of 0.9, so keep ≈ 0.95 per step at the start
    (a gentle recency bias, comparable to the ALiBi-like start of FoX and FPA) with gradients flowing.
    """

    has_bias = True
    fused_needs_cuda = True

    def __init__(self, cfg, d_model, n_head, head_dim):
        super().__init__(cfg, d_model, n_head, head_dim)
        self.interaction = nn.Linear(d_model, 2 * cfg.dcp_dim, bias=False)
        nn.init.normal_(self.interaction.weight, std=0.02)
        self.offset = nn.Parameter(torch.tensor([0.9]))  # (1,): FSDP shards no 0-dim parameter
        self._register_load_state_dict_pre_hook(_offset_as_vector)

    def ingredients(self, x, q, k, segment_ids=None):  # a pair's product runs between its query and key: no restart
        qi, ki = fp32_linear(self.interaction, x).chunk(2, dim=-1)  # (B, T, r) each
        return {"qi": qi, "ki": ki, "offset": at_least_fp32(self.offset[0])}

    def own_bias(self, ingredients):
        return dcp_bias(ingredients["qi"], ingredients["ki"], ingredients["offset"])

    def own_bias_block(self, ingredients, lo, hi, carry):
        return dcp_bias_block(ingredients["qi"], ingredients["ki"], ingredients["offset"], lo, hi, carry)

    fused_head_dims = FUSED_HEAD_DIMS

    def fused_unsupported_reason(self):
        if self.cfg.dcp_dim not in DCP_FUSED_INTERACTION_DIMS:
            return f"the Triton kernel supports dcp_dim in {DCP_FUSED_INTERACTION_DIMS}, got {self.cfg.dcp_dim}"
        return super().fused_unsupported_reason()

    def fused(self, q, k, v, ingredients, segment_ids=None):  # the Triton kernel (ops/dcp/fused.py), no (T, T) bias
        return _fused_dcp(q, k, v, ingredients["qi"], ingredients["ki"], ingredients["offset"], scale=self.scale,
                          segment_ids=segment_ids)

    # decoding: per cached key its interaction key ki_s (r floats) and its log keep so far, for all heads
    shared_key_state = True

    def decode_prefill_state(self, x, q, k, lengths):
        ingredients = self.ingredients(x, q, k)
        keep = self.prefill_carry(ingredients, lengths)  # (B, T): Σ_{t'<L} log keep[t', s]
        return {"log_keep": keep[:, None], "key": ingredients["ki"][:, None]}, {}  # (B, 1, T), (B, 1, T, r)

    def own_decode_bias(self, x, q, k, query_pos, cache):
        ingredients = self.ingredients(x, q, k)  # qi, ki (B, n, r)
        cache.put("key", ingredients["ki"][:, None])
        cache.put("log_keep", ingredients["ki"].new_zeros(x.shape[0], 1, x.shape[1]))
        key_pos = cache.key_pos[:, 0]  # (B, S): every head keeps the same keys (shared_key_state)
        values = log_keep(ingredients["qi"], cache.state["key"][:, 0], ingredients["offset"])  # (B, n, S)
        values = torch.where(key_pos[:, None, :] < query_pos[:, :, None], values, 0.0)
        stored = cache.state["log_keep"]  # (B, 1, S)
        rows = stored[:, :, None, :] + values.cumsum(dim=1)[:, None]  # inclusive: Σ_{s<t'≤t}
        stored.add_(values.sum(dim=1)[:, None])
        return rows  # (B, 1, n, S)
