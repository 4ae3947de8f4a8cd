"""``FPAForCausalLM``: the project's ``Decoder`` as a transformers causal LM (``from_pretrained``, ``generate``,
pipelines, lm-eval's ``hf`` model).

The decoder is ``self.model`` unchanged, so the weights are the Decoder's under ``model.`` and the logits are the
Decoder's own, bit for bit on the same device and attention implementation.

* ``forward(input_ids, attention_mask, labels)``: padded rows (one run of ones per row in ``attention_mask``, left or
  right) are shifted so that their tokens start at position 0, run, and shifted back: a row's logits are those of
  its tokens alone (FPA's walk and FoX's decay start at its first real token). Logits at padding are 0. ``labels``:
  the mean next-token cross-entropy over labels != -100 (float32), transformers' convention.
* ``generate``: through ``FPACache`` (the project's KV cache, eviction by the generation config's
  ``prune_threshold``), never a full forward per token; greedy tokens equal ``fpa_lightning.generation.generate``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from fpa_lightning.attention.base import AttentionBackend
from fpa_lightning.generation.rule import check_threshold
from fpa_lightning.hf.cache import FPACache, check_contiguous
from fpa_lightning.hf.config import FPAConfig
from fpa_lightning.model import Block, Decoder
from fpa_lightning.ops.fox.alibi import alibi_slopes

IGNORE_INDEX = -100  # transformers' label for positions without a loss


class FPAForCausalLM(PreTrainedModel, GenerationMixin):
    """A ``Decoder`` of any backend behind transformers' causal-LM interface (see the module docstring)."""

    config_class = FPAConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = [Block.__name__]
    _input_embed_layer = "embed"
    _tied_weights_keys = {"model.lm_head.weight": "model.embed.weight"}  # applied when config.tie_embeddings
    _is_stateful = True  # the cache's per-key state cannot be rolled back: no assisted decoding

    def __init__(self, config: FPAConfig):
        super().__init__(config)
        self.model = Decoder(config.to_model_config())
        self.post_init()

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.model.lm_head

    @torch.no_grad()
    def _init_weights(self, module: torch.nn.Module) -> None:
        """The Decoder initialises its own parameters, and ``from_pretrained`` loads every one of them; only the
        non-persistent ALiBi slopes must be rebuilt after transformers built the model on the meta device."""
        if isinstance(module, AttentionBackend) and module.alibi:
            module.alibi_slope.copy_(alibi_slopes(module.n_head, module.alibi_slope.device))

    def _adjust_missing_and_unexpected_keys(self, loading_info) -> None:
        """``from_pretrained``: every weight must come from the file and every stored weight must be used; a missing
        one would stay uninitialised memory (the model is built on the meta device), so this raises, not warns."""
        super()._adjust_missing_and_unexpected_keys(loading_info)
        missing = sorted(set(loading_info.missing_keys) - set(self.all_tied_weights_keys))
        if missing or loading_info.unexpected_keys or loading_info.mismatched_keys:
            raise ValueError(f"the weights do not match config.json: missing {missing}, unexpected "
                             f"{sorted(loading_info.unexpected_keys)}, mismatched {sorted(loading_info.mismatched_keys)}")

    def forward(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None,
                past_key_values: FPACache | None = None, labels: torch.LongTensor | None = None,
                use_cache: bool | None = None, logits_to_keep: int = 0,
                return_dict: bool | None = None) -> CausalLMOutputWithPast | tuple:
        """input_ids (B, T) -> logits (B, T, V) (the last ``logits_to_keep`` positions when > 0).

        With ``past_key_values`` (an ``FPACache``, which ``generate`` creates): an empty cache prefills the rows and
        returns the logits of each row's last token (B, 1, V), so it needs ``logits_to_keep=1``; a filled one
        continues every row by the T new tokens. Without a cache the whole input runs in parallel and no cache is
        returned (``use_cache`` is then ignored: only ``generate`` or the caller creates one, with its eviction rule).
        """
        if labels is not None and (past_key_values is not None or logits_to_keep):
            raise ValueError("labels need every position's logits: call without past_key_values and logits_to_keep")
        if past_key_values is not None:
            logits = self._cached_logits(past_key_values, input_ids, attention_mask, logits_to_keep)
        else:
            logits = self._parallel_logits(input_ids, attention_mask)
            logits = logits[:, -logits_to_keep:] if logits_to_keep else logits
        loss = None if labels is None else causal_lm_loss(logits, labels)
        out = CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=past_key_values)
        return out if return_dict is not False else out.to_tuple()

    def _parallel_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """(B, T) -> (B, T, V) by the Decoder's parallel forward, padded rows shifted to start at position 0."""
        if attention_mask is None or bool(attention_mask.bool().all()):
            return self.model(input_ids)
        check_contiguous(attention_mask)
        T = input_ids.shape[1]
        mask = attention_mask.bool()
        start = mask.int().argmax(dim=1, keepdim=True)  # (B, 1): first real token
        columns = torch.arange(T, device=input_ids.device)[None, :]  # (1, T)
        shifted = input_ids.gather(1, (columns + start).clamp(max=T - 1))  # (B, T): real tokens first
        logits = self.model(shifted)  # (B, T, V); causal, so what follows a row's tokens does not reach them
        back = (columns - start).clamp(min=0)[..., None].expand(-1, -1, logits.shape[-1])
        return logits.gather(1, back).masked_fill(~mask[..., None], 0.0)

    def _cached_logits(self, cache: FPACache, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                       logits_to_keep: int) -> torch.Tensor:
        """Logits through the cache: a prefill (B, 1, V) or a continuation (B, n, V)."""
        if not isinstance(cache, FPACache):
            raise TypeError(f"past_key_values must be an FPACache, got {type(cache).__name__}")
        if cache.get_seq_length() == 0:
            if logits_to_keep != 1:
                raise ValueError("a prefill through FPACache gives the logits of each row's last token only: pass "
                                 "logits_to_keep=1 (generate does), or call without past_key_values for every "
                                 "position's logits")
            return cache.prefill(input_ids, attention_mask)[:, None]
        n = input_ids.shape[1]
        if attention_mask is not None and not bool(attention_mask[:, -n:].bool().all()):
            raise ValueError("tokens after the prefill cannot be padding (attention_mask 0): FPACache continues "
                             "every row")
        logits = cache.extend(input_ids)
        return logits[:, -logits_to_keep:] if logits_to_keep else logits

    def _prepare_generation_config(self, generation_config, **kwargs):
        """transformers' merge of the generation settings, with ``prune_threshold`` as one of them: from
        ``generate(prune_threshold=...)``, else from the generation config passed in or the model's, else None;
        checked here (``generation.rule.check_threshold``), with or without a cache to come."""
        given = kwargs.pop("prune_threshold", None)
        generation_config, model_kwargs = super()._prepare_generation_config(generation_config, **kwargs)
        if given is None:
            given = getattr(generation_config, "prune_threshold", None)
        generation_config.prune_threshold = check_threshold(given)
        return generation_config, model_kwargs

    def _prepare_cache_for_generation(self, generation_config, model_kwargs: dict, generation_mode, batch_size: int,
                                      max_cache_length: int) -> None:
        """``generate``'s cache: an ``FPACache`` with the generation config's ``prune_threshold`` (transformers'
        own caches cannot hold the backends' per-key state). A cache passed in by the caller is used as it is."""
        prune_threshold = generation_config.prune_threshold
        given = model_kwargs.get("past_key_values")
        if given is not None:
            if not isinstance(given, FPACache):
                raise TypeError(f"past_key_values must be an FPACache, got {type(given).__name__}")
            if prune_threshold is not None and prune_threshold != given.prune_threshold:
                raise ValueError(f"prune_threshold={prune_threshold} differs from the given cache's "
                                 f"({given.prune_threshold}): the cache's eviction rule is fixed when it is created")
            return
        if generation_config.cache_implementation is not None:
            raise ValueError(f"cache_implementation={generation_config.cache_implementation!r}: FPAForCausalLM "
                             "decodes through its own cache (FPACache); leave cache_implementation unset")
        if not generation_config.use_cache:
            if prune_threshold is not None:
                raise ValueError("prune_threshold evicts keys from the KV cache, so it needs use_cache=True")
            return
        model_kwargs["past_key_values"] = FPACache(self.model, prune_threshold, max_length=max_cache_length + 1)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in float32: logits (B, T, V) at t predict labels (B, T) at t + 1; labels equal
    to -100 are left out."""
    return F.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].to(logits.device).flatten(),
                           ignore_index=IGNORE_INDEX)
