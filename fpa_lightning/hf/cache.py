"""``FPACache``: the project's KV cache (``fpa_lightning.generation.DecodeSession``) as a transformers ``Cache``, so that
``FPAForCausalLM.generate`` decodes through it: each backend's per-key state (FPA's level ψ_s and path minimum per
key and head, FoX's running decay, Selective's selection, ...), the per-row walk, and real eviction of keys whose
bias falls below ``prune_threshold``, instead of a full forward pass per token.

The session owns the positions: row b's real tokens (``attention_mask`` == 1, left padding dropped) are prefilled as
a prompt of its own length and each later token continues at that row's next position, exactly as
``fpa_lightning.generation.generate`` does with prompts of different lengths. Rows are independent, so beam search's
reordering moves whole rows (``reorder_cache``); what a row evicted stays evicted, so nothing can be cropped back.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from fpa_lightning.generation.rule import check_threshold, threshold_rule
from fpa_lightning.generation.session import DecodeSession
from fpa_lightning.model import Decoder


class FPACache(Cache):
    """The KV cache of one ``generate`` call (or of a manual decoding loop) over ``decoder``.

    prune_threshold: evict a key for good once its bias falls below it (e.g. -10; None keeps every key), checked as
    everywhere (``fpa_lightning.generation.rule.check_threshold``); models without a bias raise
    (``fpa_lightning.generation.rule.check_rule``). max_length: prompt + new tokens of
    the padded batch, when known: the cache and RoPE tables are sized once at prefill (as ``generate`` does).
    """

    def __init__(self, decoder: Decoder, prune_threshold: float | None = None, max_length: int | None = None):
        super().__init__(layers=[])  # the session holds the layers' state; transformers' layer list stays empty
        self.prune_threshold, self.max_length = check_threshold(prune_threshold), max_length
        self.session = DecodeSession(decoder, rule=threshold_rule(self.prune_threshold))
        self.seen = 0  # columns of input_ids processed so far (padding included): transformers' sequence length

    # --- what the model's forward calls -------------------------------------------------------------------
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """input_ids (B, T), left-padded where attention_mask (B, T) is 0 -> logits after each row's last token
        (B, V). Each row's tokens are prefilled as a prompt of their own length."""
        if attention_mask is None:
            prompts = list(input_ids)
        else:
            check_contiguous(attention_mask)
            prompts = [row[keep.bool()] for row, keep in zip(input_ids, attention_mask)]
        T = input_ids.shape[1]
        logits = self.session.prefill(prompts, max(0, self.max_length - T) if self.max_length else 0)
        self.seen = T
        return logits

    def extend(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids (B, n): n more tokens per row -> their logits (B, n, V) (a copy: a CUDA-graph step reuses its
        output buffer)."""
        if input_ids.shape[1] == 1:
            logits = self.session.step(input_ids[:, 0])[:, None].clone()
        else:
            logits = self.session.extend(input_ids)
        self.seen += input_ids.shape[1]
        return logits

    def kept_fraction(self) -> float:
        """Cached keys over keys seen, averaged over layers, heads and rows (1.0 without eviction)."""
        return self.session.stats()["kept_fraction"]

    # --- transformers' Cache interface --------------------------------------------------------------------
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1  # grows as needed

    @property
    def is_compileable(self) -> bool:
        return False  # the session captures its own CUDA graph on a GPU

    @property
    def is_croppable(self) -> bool:
        return False

    @property
    def batch_size(self) -> int:
        return -1 if self.session.cache is None else int(self.session.cache.next_pos.shape[0])

    def reset(self) -> None:
        """Forget every row: the next forward prefills again."""
        self.session.cache, self.seen = None, 0

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Row i becomes row beam_idx[i] (beam search), in place: the tensors a captured step reads stay the same."""
        cache = self.session.cache
        rows = beam_idx.to(cache.next_pos.device)
        for layer in cache.layers:
            for tensor in (layer.k, layer.v, layer.key_pos, *layer.state.values(), *layer.carry.values()):
                tensor.copy_(tensor.index_select(0, rows))
        cache.next_pos.copy_(cache.next_pos.index_select(0, rows))
        self.session.host_next = [self.session.host_next[i] for i in rows.tolist()]

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("FPACache cannot be cropped: decoding advanced each row's per-key state (and "
                                  "evicted keys for good); assisted and speculative decoding are not supported")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("FPACache cannot repeat rows after the prefill: expand the inputs before "
                                  "generate prefills them (num_return_sequences does)")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("FPACache cannot drop rows; beam search's reordering (reorder_cache) is supported")


def check_contiguous(attention_mask: torch.Tensor) -> None:
    """Each row of attention_mask (B, T) must be one run of ones (left or right padding): holes are refused."""
    mask = attention_mask.bool()
    starts = (mask[:, 1:] & ~mask[:, :-1]).sum(dim=1) + mask[:, 0]  # (B,): runs of ones per row
    if not bool((starts == 1).all()):
        raise ValueError("attention_mask: every row needs one contiguous run of ones (left or right padding); "
                         f"rows {(starts != 1).nonzero()[:, 0].tolist()} have none or several")
