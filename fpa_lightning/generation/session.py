"""``DecodeSession``: a decoder, its KV cache and an optional eviction rule; prefill, extend, step.

* ``prefill(prompts)``: the parallel forward (the configured path: the fused kernel on a GPU) runs over the
  right-padded prompts; each layer hands its K, V and its backend's per-key state
  (``AttentionBackend.decode_prefill_state``) to the cache. Returns the logits after each prompt.
* ``extend(ids)``: n more tokens per row through the cache (prefill in pieces, teacher forcing): each layer
  attends over its cached keys with the bias the backend computes from its state (``decode_bias``), or, for FPA at
  the key level, in one fused kernel that makes the bias and the eviction on the fly (``decode_piece_fused``).
* ``step(ids)``: one token per row with static shapes; on CUDA the step is captured once in a CUDA graph and
  replayed (optionally compiled first). The cache only changes size between steps (``reserve``).

Eviction (``rule``, ``fpa_lightning.generation.rule.PruneRule``, checked against the model by ``check_rule``): a key
is dropped for good at the first query whose bias for it the rule rejects, in the prompt as in the continuation; the
newest key never is. This is exactly what ``analysis.pruning.pruned_cache`` simulates with masks (the same
``PruningHook``), so the two agree to rounding. Under an eviction rule the prompt is prefilled by that same
simulation (the chunked path with the rule's mask), which hands the cache its eviction flags; then the cache is
compacted. A rule that can evict nothing (threshold −inf) keeps the fast prefill.
"""
from __future__ import annotations

import torch

from fpa_lightning.generation.cache import FREE, KVCache, LayerCache
from fpa_lightning.generation.rule import KeptStats, PruneRule, PruningHook, check_rule
from fpa_lightning.model import Decoder
from fpa_lightning.ops.decode import cached_attention, decode_attention_op
from fpa_lightning.ops.decode.fused import unsupported_reason as fused_decode_unsupported
from fpa_lightning.ops.decode.step import fused as step_ops

ATTENTION_IMPLS = ("auto", "naive", "fused")

SLOT_MULTIPLE = 64  # capacities are rounded up to this many slots (aligned matmuls, fewer resizes)
PIECE_TOKENS = {"fpa_piece": 8192, "other": 512}
"""``cached_token_losses``' default piece: FPA's piece kernel holds no (n, S) tensor, so a long piece costs memory
only for the model's activations and logits, and the longest pieces scored fastest (BENCHMARKS.md, "Scoring with real
eviction (H200)"); the einsums and the decode op hold several (B, H, n, S) temporaries, so 512 rows of them."""


def _round_up(n: int, multiple: int = SLOT_MULTIPLE) -> int:
    return -(-n // multiple) * multiple


def cast_weights(decoder: Decoder, dtype: torch.dtype) -> Decoder:
    """Every weight but the attention backends' gate maps to `dtype` (e.g. bfloat16 for fast decoding), in place.
    The gate maps stay float32: the bias ingredients are computed in float32 anyway (``at_least_fp32``), and
    buffers (RoPE frequencies, ALiBi slopes) keep their precision."""
    backend_params = {id(p) for block in decoder.blocks for p in block.attn.backend.parameters()}
    for param in decoder.parameters():
        if id(param) not in backend_params:
            param.data = param.data.to(dtype)
    return decoder


# torch.compile modes a session's step may take: the others ("reduce-overhead", "max-autotune") capture CUDA graphs
# of their own, which would nest inside the session's capture
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")


def _compiled(step, compile: bool | str):
    """`step` under torch.compile: True for the default mode, or a mode of ``COMPILE_MODES`` by name."""
    mode = "default" if compile is True else compile
    if not isinstance(mode, str) or mode not in COMPILE_MODES:  # "", None or 0 too: never a silent eager step
        raise ValueError(f"compile must be a bool or one of {COMPILE_MODES}, got {compile!r}")
    return torch.compile(step, dynamic=False, mode=mode)


def _resolve_attention(impl: str, decoder: Decoder, device: torch.device) -> str:
    """The cached attention a session runs: "naive" or "fused" (see ``DecodeSession``'s attention_impl)."""
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention_impl must be one of {ATTENTION_IMPLS}, got {impl!r}")
    if impl == "naive":
        return impl
    attn = decoder.blocks[0].attn
    reason = fused_decode_unsupported(device, attn.head_dim, attn.qkv.weight.dtype)
    if impl == "auto":
        return "fused" if reason is None and device.type == "cuda" else "naive"
    if reason is not None:
        raise ValueError(f"attention_impl='fused' cannot run here: {reason}; use 'naive' or 'auto'")
    return impl


def default_piece_tokens(decoder: Decoder, rule: PruneRule | None, attention_impl: str = "auto") -> int:
    """``DecodeSession.default_piece`` of a session of `decoder` under `rule`, without building one."""
    device = next(decoder.parameters()).device
    step_impl = _resolve_attention(attention_impl, decoder, device)
    return _piece_for(_resolve_piece_attention(attention_impl, step_impl, decoder, rule))


def _piece_for(piece_impls: list[str]) -> int:
    """``PIECE_TOKENS``: the long pieces only where every layer runs FPA's piece kernel."""
    return PIECE_TOKENS["fpa_piece" if set(piece_impls) == {"fpa_piece"} else "other"]


def rows_per_pass(piece: int, tokens: int) -> int:
    """Documents of `tokens` ids (tokens − 1 scored positions each) that one ``cached_token_losses`` call scores as
    one batch: as many as fill a piece of `piece` query tokens over its rows, at least one. A piece's memory grows
    with rows × piece tokens, so this adds none; its fixed cost (launches, host syncs, the session) is shared by the
    rows, which is what short documents pay for most (docs/evaluation.md)."""
    return max(1, piece // max(1, tokens - 1))


def _resolve_piece_attention(impl: str, step_impl: str, decoder: Decoder, rule: PruneRule | None) -> list[str]:
    """Per layer, the attention of a piece of several tokens: "fpa_piece" (one kernel with the bias and the threshold
    eviction, ``decode_piece_fused``) where the backend has it and the rule is a threshold (or none), else the op of
    ``decode_attention`` under "fused" and the einsums otherwise (see ``DecodeSession``)."""
    if impl == "naive" or step_impl == "naive":
        return ["naive"] * len(decoder.blocks)
    threshold_rule = rule is None or rule.window is None
    other = "fused" if impl == "fused" else "naive"
    return ["fpa_piece" if threshold_rule and block.attn.backend.has_piece_kernel else other
            for block in decoder.blocks]


def _resolve_step_attention(step_impl: str, decoder: Decoder, rule: PruneRule | None, track_kept: bool) -> list[str]:
    """Per layer, the attention of a single-token step: "fused_step" (ops/decode/step: bias, path minimum and
    eviction made in the kernel that reads the keys) where the step's ops are fused, the layer's backend has
    ``has_step_kernel``, the rule is a threshold (or none) and no kept fraction is counted; else the step's op
    ("fused": the decode op over a bias made by torch ops; "naive": the einsums)."""
    step_kernel = step_impl == "fused" and not track_kept and (rule is None or rule.window is None)
    return ["fused_step" if step_kernel and block.attn.backend.has_step_kernel else step_impl
            for block in decoder.blocks]


class KeptCounter:
    """Per layer, Σ over queries of the fraction of the t + 1 keys kept (mean over heads), and the query count."""

    def __init__(self, n_layer: int):
        self.fraction_sum: list[torch.Tensor | float] = [0.0] * n_layer
        self.queries = [0] * n_layer

    def add(self, layer: int, kept: torch.Tensor, query_pos: torch.Tensor) -> None:
        """kept (B, H, n): the keys each query attended to after eviction; query_pos (B, n)."""
        fraction = kept.to(torch.float64) / (query_pos[:, None, :] + 1)  # (B, H, n)
        self.fraction_sum[layer] = self.fraction_sum[layer] + fraction.mean(dim=1).sum()
        self.queries[layer] += query_pos.numel()

    def add_simulated(self, stats: KeptStats | None, queries: int) -> None:
        """`queries` prompt positions counted by the parallel simulation (``PruningHook``); None: nothing evicted."""
        fractions = [1.0] * len(self.queries) if stats is None else stats.per_layer_fraction()
        for layer, fraction in enumerate(fractions):
            self.fraction_sum[layer] = self.fraction_sum[layer] + fraction * queries
            self.queries[layer] += queries

    def as_dict(self) -> dict:
        device = next((f.device for f in self.fraction_sum if isinstance(f, torch.Tensor)), None)
        sums = torch.stack([torch.as_tensor(f, dtype=torch.float64, device=device)  # one synchronisation
                            for f in self.fraction_sum]).tolist()
        per_layer = [f / q if q else float("nan") for f, q in zip(sums, self.queries)]
        return {"kept_fraction": sum(per_layer) / len(per_layer), "kept_fraction_per_layer": per_layer}


class _EvictionRecorder:
    """A layer's bias hook: the rule's ``PruningHook``, keeping the per-key eviction flags after the last row."""

    def __init__(self, hook: PruningHook):
        self.hook, self.evicted = hook, None

    def __call__(self, bias, rows, keys, carry):
        bias, carry = self.hook(bias, rows, keys, carry)
        self.evicted = carry  # (B, H or 1, hi) after row hi − 1; None while nothing can be evicted
        return bias, carry


class DecodeSession:
    """Decoding ``decoder`` (eval mode, no grad) with a KV cache; see the module docstring.

    rule: eviction rule, or None. cuda_graph: capture the single-token step in a CUDA graph (default: on CUDA).
    compile: ``torch.compile`` the step first (compiles again whenever the cache is resized); True for the default
    mode, or one of ``COMPILE_MODES`` by name (the modes that capture CUDA graphs themselves are refused: the session
    captures its own). track_kept: count
    the kept fraction of every query (``stats()["kept_per_query"]``), for evaluation. max_length: refuse prompts
    and continuations longer than this many tokens (default: only memory bounds the length). check_every: steps
    between capacity checks under an eviction rule (each check synchronises with the device once).
    attention_impl: the attention over the cache, "naive" (``cached_attention``), "fused" (``decode_attention``, the
    split-K Triton kernels: a CUDA device or the interpreter, head dim 16-128, bf16/fp16/fp32; raises otherwise) or
    "auto": for single-token steps fused on CUDA where it can run, naive otherwise. Pieces of several tokens
    (``extend``, ``cached_token_losses``) take FPA's piece kernel ("fpa_piece": bias, eviction and attention in one
    kernel, for FPA at the key level under a threshold rule or none) under "fused", and under "auto" where the fused
    op would run; other layers take the einsums under "auto" (the decode op reads its slots once per query row
    where the einsums make one batched matmul: docs/generation.md) and the decode op under "fused". The choices
    are ``attention_impl_used`` (steps) and ``piece_attention_impl_used`` (pieces: the layers' choices joined by
    "+", e.g. "fpa_piece+naive" for a model with FPA and softmax layers). Under "fused" a single-token step runs the
    step's fused ops (ops/decode/step: norms, RoPE and cache writes, and for layers without a bias or of FPA at the
    key level, the bias and eviction inside the attention's kernel); each layer's attention in a step is in
    ``step_impls`` ("fused_step", "fused" or "naive"), joined in ``step_attention_impl_used``.
    """

    def __init__(self, decoder: Decoder, *, rule: PruneRule | None = None, cuda_graph: bool | None = None,
                 compile: bool | str = False, track_kept: bool = False, max_length: int | None = None,
                 check_every: int = 64, attention_impl: str = "auto"):
        check_rule(decoder, rule)
        self.decoder, self.rule = decoder, rule
        self.device = next(decoder.parameters()).device
        self.attention_impl_used = _resolve_attention(attention_impl, decoder, self.device)
        self.piece_impls = _resolve_piece_attention(attention_impl, self.attention_impl_used, decoder, rule)
        self.piece_attention_impl_used = "+".join(sorted(set(self.piece_impls)))
        self.step_impls = _resolve_step_attention(self.attention_impl_used, decoder, rule, track_kept)
        self.step_attention_impl_used = "+".join(sorted(set(self.step_impls)))
        self.cuda_graph = self.device.type == "cuda" if cuda_graph is None else cuda_graph
        if self.cuda_graph and self.device.type != "cuda":
            raise ValueError(f"cuda_graph=True needs the model on a CUDA device, it is on {self.device}")
        if self.cuda_graph and track_kept:
            raise ValueError("track_kept counts on the host side of every step: use cuda_graph=False with it")
        if check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}")
        self.max_length, self.check_every = max_length, check_every
        self.counter = KeptCounter(len(decoder.blocks)) if track_kept else None
        self.step_fn = self._step if compile is False else _compiled(self._step, compile)
        self.cache: KVCache | None = None
        self.host_next: list[int] = []  # per row, the position of the next token (a host copy: no sync)
        self.limit = 0  # RoPE tables cover positions < limit
        self.reserved = 0  # steps that fit without another capacity check
        self._graph = None
        self._warm = False  # a step has run since the last resize (capture needs warm kernels)
        self._ids: torch.Tensor | None = None
        self._logits: torch.Tensor | None = None

    # --- prefill ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, prompts: list[torch.Tensor], max_new_tokens: int = 0) -> torch.Tensor:
        """Prompts (1-D LongTensors, lengths may differ) -> logits after each prompt's last token (B, V).
        max_new_tokens: how many steps will follow (sizes the cache and the RoPE tables once)."""
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        B, T = len(prompts), int(lengths.max())
        self._check_length(T + max_new_tokens)
        ids = torch.zeros(B, T, dtype=torch.long, device=self.device)
        for b, prompt in enumerate(prompts):
            ids[b, : len(prompt)] = prompt.to(self.device)
        evicting = self.rule is not None and (self.counter is not None or self.rule.can_evict())
        # the simulation's eviction flags are those after a group's last row: one group per length
        groups = [lengths == L for L in lengths.unique().tolist()] if evicting else [lengths > 0]
        parts: list[list] = [[] for _ in self.decoder.blocks]
        logits = None
        for rows in groups:
            rows = rows.nonzero()[:, 0]
            group_logits = self._prefill_group(ids[rows, : int(lengths[rows].max())], lengths[rows], rows, parts,
                                               evicting)
            logits = group_logits.new_empty(B, group_logits.shape[-1]) if logits is None else logits
            logits[rows] = group_logits
        self.cache = KVCache([_assemble(B, T, layer_parts) for layer_parts in parts],
                             next_pos=lengths.clone(), append=self.rule is None)
        self.host_next = lengths.tolist()
        self.limit, self.reserved, self._graph, self._warm = 0, 0, None, False
        self.reserve(min(max_new_tokens, self.check_every) if self.rule is not None else max_new_tokens,
                     positions=max_new_tokens)
        return logits

    @torch.no_grad()
    def begin(self, batch: int) -> None:
        """An empty cache of `batch` rows, so that ``extend`` runs from position 0. ``cached_token_losses`` starts this
        way: the parallel prefill of a one-token prompt launched about as many kernels as the rest of a scoring
        call (docs/generation.md). Each layer's per-key state is a one-token prefill's cut to no key, from zero
        inputs under the caller's autocast (so K, V and the state take the dtypes the real tokens will give), and
        its per-row carry is zero: the carries are sums over the prompt (FPA's walk), zero before any token."""
        if batch < 1:
            raise ValueError(f"begin needs at least one row, got {batch}")
        x = torch.zeros(batch, 1, self.decoder.cfg.d_model, device=self.device,
                        dtype=self.decoder.blocks[0].attn.qkv.weight.dtype)
        one = torch.ones(batch, dtype=torch.long, device=self.device)
        layers = []
        for block in self.decoder.blocks:
            q, k, v = block.attn.project(x)  # (B, 1, H, D)
            state, carry = block.attn.backend.decode_prefill_state(x, q, k, one)
            k, v = k.transpose(1, 2)[:, :, :0], v.transpose(1, 2)[:, :, :0]  # (B, H, 0, D)
            layers.append(LayerCache(k.contiguous(), v.contiguous(), k.new_full(k.shape[:3], FREE, dtype=torch.int32),
                                     {name: t[:, :, :0].contiguous() for name, t in state.items()},
                                     {name: torch.zeros_like(t) for name, t in carry.items()}))
        self.cache = KVCache(layers, next_pos=torch.zeros(batch, dtype=torch.long, device=self.device),
                             append=self.rule is None)
        self.host_next = [0] * batch
        self.limit, self.reserved, self._graph, self._warm = 0, 0, None, False

    def _prefill_group(self, ids: torch.Tensor, lengths: torch.Tensor, rows: torch.Tensor, parts: list,
                       evicting: bool) -> torch.Tensor:
        """Prompts of one group through the parallel forward; each layer's K, V and state go to ``parts``."""
        stats = KeptStats.empty(len(self.decoder.blocks))
        recorders = [_EvictionRecorder(PruningHook(self.rule, stats, i, block.attn.backend.decode_bias_falls))
                     for i, block in enumerate(self.decoder.blocks)]

        def attention(layer: int, attn, x: torch.Tensor) -> torch.Tensor:
            q, k, v = attn.project(x)
            out = attn.out(attn.backend(x, q, k, v).flatten(-2))  # the layer's own parallel path
            key_state, carry = attn.backend.decode_prefill_state(x, q, k, lengths)
            parts[layer].append((rows, lengths, k.transpose(1, 2), v.transpose(1, 2), key_state, carry,
                                 recorders[layer]))
            return out

        if evicting:
            with self.decoder.bias_hooks(lambda layer: recorders[layer]):
                hidden = self.decoder.features_with(ids, attention)
        else:
            hidden = self.decoder.features_with(ids, attention)
        if self.counter is not None:
            self.counter.add_simulated(stats if evicting else None, int(lengths.sum()))
        last = hidden[torch.arange(len(rows), device=ids.device), lengths - 1]  # (b, C)
        return self.decoder.lm_head(last)

    # --- capacity -----------------------------------------------------------------------------------------
    def reserve(self, steps: int, positions: int | None = None) -> None:
        """Make room for `steps` more tokens per row without another check, and RoPE tables for `positions`
        (default: steps) more positions. Resizes the cache (and drops a captured step) when needed; under an
        eviction rule, also compacts a cache that is more than twice as large as needed."""
        cache = self.cache
        top = max(self.host_next) + max(steps, positions or 0)
        self._check_length(top)
        if top > self.limit:
            self.limit = _round_up(max(top, 2 * self.limit) if self.limit else top, 256)
            for block in self.decoder.blocks:
                if block.attn.rope is not None:
                    block.attn.rope.tables(self.limit, self.device)
            self._invalidate()
        # an empty cache (begin) holds no key: no need to count them (a synchronisation and an op per layer)
        held = 0 if cache.capacity == 0 else max(self.host_next) if cache.append else cache.max_live()
        needed = held + steps
        too_big = not cache.append and cache.capacity > 2 * needed + SLOT_MULTIPLE
        if needed > cache.capacity or too_big:
            self._check_fits(_round_up(needed) - cache.capacity)
            cache.resize(_round_up(needed))
            self._invalidate()
        self.reserved = steps

    def _invalidate(self) -> None:
        self._graph, self._warm = None, False

    def _check_length(self, total: int) -> None:
        if self.max_length is not None and total > self.max_length:
            raise ValueError(f"{total} tokens (prompt + new tokens) exceed max_length={self.max_length}")

    def _check_fits(self, extra_slots: int) -> None:
        """On CUDA, refuse (clearly) a cache growth that cannot fit in the free device memory."""
        if self.device.type != "cuda" or extra_slots <= 0:
            return
        # a resize holds the old and the new cache at once
        needed = self.cache.bytes_per_slot() * (self.cache.capacity + extra_slots)
        free = torch.cuda.mem_get_info(self.device)[0]
        if needed > free:
            raise ValueError(f"the KV cache needs {needed / 2**30:.2f} GiB for {self.cache.capacity + extra_slots} "
                             f"slots per head, but only {free / 2**30:.2f} GiB of device memory are free: use shorter "
                             "prompts, fewer new tokens, a smaller batch, or eviction (prune_threshold)")

    # --- cached attention ---------------------------------------------------------------------------------
    def _attend(self, layer: int, attn, x: torch.Tensor, query_pos: torch.Tensor) -> torch.Tensor:
        """One layer over the cache for n new tokens x (B, n, C) at query_pos (B, n); their keys join the cache."""
        cache = self.cache.layers[layer]
        B, n = query_pos.shape
        q, k, v = attn.project_at(x, query_pos, self.limit)  # (B, n, H, D)
        slots = query_pos[:, None, :].expand(B, attn.n_head, n) if self.cache.append else None
        cache.write(k, v, query_pos, slots)
        impl = self.attention_impl_used if n == 1 else self.piece_impls[layer]
        if impl == "fpa_piece":
            threshold = float("-inf") if self.rule is None else self.rule.threshold
            out, kept, evicted = attn.backend.decode_piece_fused(x, q, k, query_pos, cache, threshold)
            if evicted is not None:
                cache.free(evicted)
            if self.counter is not None:
                self.counter.add(layer, kept, query_pos)
            return attn.out(out.flatten(-2))
        return attn.out(self._attend_cached(layer, attn, x, q, k, query_pos, impl).flatten(-2))

    def _attend_cached(self, layer: int, attn, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                       query_pos: torch.Tensor, impl: str) -> torch.Tensor:
        """The attention of n new queries q (B, n, H, D) whose keys k are already cached, through the backend's
        ``decode_bias``, the rule's eviction and the decode op ("fused") or the einsums: (B, n, H, D)."""
        cache = self.cache.layers[layer]
        n = query_pos.shape[1]
        bias = attn.backend.decode_bias(x, q, k, query_pos, cache)  # (B, H or 1, n, S) or None
        key_pos = cache.key_pos[:, :, None, :]  # (B, H, 1, S)
        age = query_pos[:, None, :, None] - key_pos  # (B, H, n, S): t − s
        visible = (key_pos != FREE) & (age >= 0)
        if self.rule is not None:
            rejected = self.rule.rejects(bias, age)
            if rejected is not None:
                evicted = rejected & visible & (age > 0)  # the newest key (age 0) is never dropped
                if n > 1 and not attn.backend.decode_bias_falls:  # a key rejected by one query of the piece is
                    evicted = evicted.to(torch.uint8).cummax(dim=2).values.bool()  # gone for the later ones
                visible = visible & ~evicted
                cache.free(evicted[:, :, -1])
        if self.counter is not None:
            self.counter.add(layer, visible.sum(dim=-1), query_pos)
        if impl == "fused":
            bias = bias if bias is None else bias.float()  # as the reference adds it: in float32
            # the torch.library custom op: one opaque node under torch.compile (compile=True), no graph break per
            # layer; inside a CUDA graph its two kernels are replayed like any other
            return decode_attention_op(q, cache.k, cache.v, bias, visible, attn.backend.scale)
        return cached_attention(q, cache.k, cache.v, bias, visible, attn.backend.scale)

    def _attend_step(self, layer: int, attn, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One layer of a fused step: the new token of each row, x (B, C) normed, at positions (B,), enters the
        cache (``store_token``: RoPE, slot, K/V, FPA's gate map and per-key state) and attends over it ->
        (B, C). Its attention: ``step_attention`` for a "fused_step" layer, else the decode op over the backend's
        bias (``_attend_cached``)."""
        cache, backend = self.cache.layers[layer], attn.backend
        fused_step = self.step_impls[layer] == "fused_step"
        cos, sin = (None, None) if attn.rope is None else attn.rope.tables(self.limit, x.device)
        gate = backend.step_gate(x, cache) if fused_step else {}
        q, k, slots, phi = step_ops.store_token_op(attn.qkv(x), positions, cos, sin, cache.k, cache.v, cache.key_pos,
                                                   self.cache.append, **_step_gate_args(gate))
        cache.slots = slots[:, :, None]  # (B, H, 1): where the backend's ``put`` stores the new keys' state
        if not fused_step:
            out = self._attend_cached(layer, attn, x[:, None], q[:, None], k[:, None], positions[:, None], "fused")
            return attn.out(out[:, 0].flatten(-2))
        bias = backend.step_bias(cache, phi)
        threshold = self.rule.threshold if self.rule is not None and bias else float("-inf")
        out = step_ops.step_attention_op(q, cache.k, cache.v, cache.key_pos, positions, backend.scale,
                                         *_step_bias_args(bias), threshold)  # (B, H, D)
        return attn.out(out.flatten(-2))

    @property
    def default_piece(self) -> int:
        """Tokens per ``extend`` piece when scoring a document (``cached_token_losses``): ``PIECE_TOKENS``, the long
        pieces only where every layer runs FPA's piece kernel."""
        return _piece_for(self.piece_impls)

    @torch.no_grad()
    def extend(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B, n): n more tokens per row through the cache -> their logits (B, n, V)."""
        if self.cache is None:
            raise RuntimeError("extend() needs a cache: call prefill() (or begin() for an empty one) first")
        n = ids.shape[1]
        self.reserve(n)
        query_pos = self.cache.next_pos[:, None] + torch.arange(n, device=self.device)
        hidden = self.decoder.features_with(ids.to(self.device), lambda i, attn, x: self._attend(i, attn, x, query_pos))
        self._advance(n)
        return self.decoder.lm_head(hidden)

    def _advance(self, n: int) -> None:
        self.cache.next_pos += n
        self.host_next = [p + n for p in self.host_next]
        self.reserved -= n

    # --- one token per row --------------------------------------------------------------------------------
    def _step(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B,) -> logits (B, V), static shapes throughout (the body a CUDA graph captures). With the fused op
        ("fused"), the step runs the fused step ops (ops/decode/step): a layer launches 10 kernels, norms, RoPE,
        cache writes and FPA's bias included (docs/generation.md, "The decoding step")."""
        if self.attention_impl_used == "fused":
            positions = self.cache.next_pos  # (B,), read by every layer before it advances
            hidden = self.decoder.step_features_with(
                ids, lambda i, attn, x: self._attend_step(i, attn, x, positions), step_ops.add_rms_norm_op,
                step_ops.silu_mul_op)
        else:
            query_pos = self.cache.next_pos[:, None].clone()  # (B, 1)
            hidden = self.decoder.features_with(ids[:, None], lambda i, attn, x: self._attend(i, attn, x, query_pos))
            hidden = hidden[:, 0]
        self.cache.next_pos.add_(1)
        return self.decoder.lm_head(hidden)

    @torch.no_grad()
    def step(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B,): one token per row -> logits (B, V). With a CUDA graph the returned tensor is reused by the
        next step: read it (or clone it) before stepping again."""
        if self.cache is None:
            raise RuntimeError("step() needs a prefilled cache: call prefill() first")
        if self.reserved < 1:
            self.reserve(self.check_every)
        # contiguous: a compiled step guards on strides (dynamic=False), and the captured step reads a contiguous
        # buffer, so a strided slice such as ids[:, t] warming the step would recompile it inside the capture
        ids = ids.to(self.device).contiguous()
        if not self.cuda_graph:
            logits = self.step_fn(ids)
        elif self._graph is None and not self._warm:
            logits = self._warm_step(ids)
        else:
            if self._graph is None:
                self._capture(ids)
            self._ids.copy_(ids)
            self._graph.replay()
            logits = self._logits
        self.host_next = [p + 1 for p in self.host_next]
        self.reserved -= 1
        return logits

    def _warm_step(self, ids: torch.Tensor) -> torch.Tensor:
        """A real step on a side stream: lazy initialisation (and compilation) happens before any capture."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            logits = self.step_fn(ids)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self._warm = True
        return logits

    def _capture(self, ids: torch.Tensor) -> None:
        """Record one step (nothing runs during capture); replays then run it on the static input buffer."""
        self._ids = ids.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._logits = self.step_fn(self._ids)
        self._graph = graph

    # --- what the cache holds -----------------------------------------------------------------------------
    def stats(self) -> dict:
        """kept_fraction (cached keys over keys seen, mean over layers, heads and rows), the cache's allocated bytes
        ("cache_bytes", split into kv / state / positions), the bytes of the kept keys alone ("live_bytes"), the
        capacity in slots, and the per-key state as a fraction of K/V bytes."""
        sizes = self.cache.nbytes()
        out = {"kept_fraction": self.cache.kept_fraction(), "cache_bytes": sizes["total"], "kv_bytes": sizes["kv"],
               "state_bytes": sizes["state"], "position_bytes": sizes["positions"], "live_bytes": sizes["live"],
               "capacity": self.cache.capacity, "state_fraction_of_kv": sizes["state"] / sizes["kv"]}
        if self.counter is not None:
            out["kept_per_query"] = self.counter.as_dict()
        return out


@torch.no_grad()
def cached_token_losses(decoder: Decoder, ids: torch.Tensor, rule: PruneRule | None, piece: int | None = None,
                        attention_impl: str = "auto") -> tuple[torch.Tensor, DecodeSession]:
    """ids (B, L + 1) -> next-token losses (B, L) in float32 computed through the KV cache, and its session (whose
    ``stats()`` hold the kept fraction of every query): from an empty cache (``begin``) the tokens are extended
    `piece` at a time (default: the session's ``default_piece``), so every key the rule rejects is really evicted on
    the way (cache_prune's real mode). A key one query rejects is hidden from the piece's later queries and freed
    after it, so the result is per-token eviction's for any piece. attention_impl: as ``DecodeSession``'s."""
    session = DecodeSession(decoder, rule=rule, cuda_graph=False, track_kept=True, attention_impl=attention_impl)
    piece = session.default_piece if piece is None else piece
    if piece < 1:
        raise ValueError(f"piece must be a positive number of tokens, got {piece}")
    L = ids.shape[1] - 1
    session.begin(ids.shape[0])
    losses = []
    for lo in range(0, L, piece):  # tokens lo..hi-1 predict lo+1..hi
        hi = min(L, lo + piece)
        losses.append(_next_token_losses(session.extend(ids[:, lo:hi]), ids[:, lo + 1 : hi + 1]))
    return torch.cat(losses, dim=1), session


_GATE_ARGS = ("gate_weight", "gate_bias", "x", "walk", "level", "path_min")
_BIAS_ARGS = ("path_min", "level", "phi", "beta_raw")


def _step_gate_args(gate: dict) -> dict:
    """``store_token``'s gate-map keywords, None where a backend gives none (the custom op takes them all)."""
    return {name: gate.get(name) for name in _GATE_ARGS}


def _step_bias_args(bias: dict) -> tuple:
    """``step_attention``'s bias arguments in order, None where a backend gives none."""
    return tuple(bias.get(name) for name in _BIAS_ARGS)


def _next_token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.to(logits.device).flatten(),
                                             reduction="none").view(targets.shape)


def _assemble(B: int, T: int, parts: list) -> LayerCache:
    """One layer's cache of capacity T from its prefill groups (rows, lengths, k, v, key state, carry, recorder)."""
    _, _, k0, _, state0, carry0, _ = parts[0]
    H = k0.shape[1]
    k = k0.new_zeros(B, H, T, k0.shape[-1])
    v = torch.zeros_like(k)
    key_pos = torch.full((B, H, T), FREE, dtype=torch.int32, device=k0.device)
    state = {name: s.new_zeros(B, s.shape[1], T, *s.shape[3:]) for name, s in state0.items()}
    carry = {name: c.new_zeros(B, *c.shape[1:]) for name, c in carry0.items()}
    positions = torch.arange(T, device=k0.device, dtype=torch.int32)
    for rows, lengths, k_g, v_g, state_g, carry_g, recorder in parts:
        L = k_g.shape[2]
        k[rows, :, :L], v[rows, :, :L] = k_g, v_g
        held = (positions[:L][None, :] < lengths[:, None])[:, None, :]  # (b, 1, L)
        pos = torch.where(held, positions[:L], FREE).expand(-1, H, -1)
        if recorder.evicted is not None:  # keys the rule dropped during the prompt
            pos = pos.masked_fill(recorder.evicted.expand(-1, H, -1), FREE)
        key_pos[rows, :, :L] = pos
        for name, s in state_g.items():
            state[name][rows, :, :L] = s
        for name, c in carry_g.items():
            carry[name][rows] = c
    return LayerCache(k, v, key_pos, state, carry)
