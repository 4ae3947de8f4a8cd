"""Shared pieces of the tasks: the run-time settings, per-token losses of long inputs, position buckets."""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import torch

from fpa_lightning.analysis.positions import next_token_losses
from fpa_lightning.model import Decoder


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    precision: str  # "32" or "bf16" (autocast; losses are float32 either way)
    seed: int
    n_boot: int
    confidence: float

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return torch.bfloat16 if self.precision == "bf16" else None

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def features(self, decoder: Decoder, ids: torch.Tensor) -> torch.Tensor:
        """The forward pass of the prompt tasks: hidden states (B, L, C); each task projects only its answer
        positions onto the vocabulary."""
        with torch.no_grad(), self.autocast():
            return decoder.features(ids)

    def losses(self, decoder: Decoder, ids: torch.Tensor) -> np.ndarray:
        """The forward pass of the loss tasks: ``token_losses``."""
        return token_losses(decoder, ids, self)


def token_losses(decoder: Decoder, ids: torch.Tensor, runtime: Runtime) -> np.ndarray:
    """ids (B, L) -> per-token next-token loss (B, L − 1) in nats, float64 numpy (analysis.positions)."""
    return next_token_losses(decoder, ids, autocast_dtype=runtime.autocast_dtype).numpy()


def check_vocab(decoder: Decoder, max_id: int) -> None:
    """Token ids from the data must exist in the model's vocabulary (a checkpoint of another tokenizer fails here)."""
    if max_id >= decoder.cfg.vocab_size:
        raise ValueError(f"token id {max_id} is outside the model's vocabulary of {decoder.cfg.vocab_size}: "
                         "the data were tokenised with a different tokenizer than the checkpoint's")


def power_of_two_edges(max_len: int) -> list[int]:
    """Bucket edges 0, f, 2f, 4f, ..., max_len with f the power of two near max_len / 64: ~7 buckets for any
    length (0–256, 256–512, ..., 8192–16384 for 16,384; 0–4, ..., 128–256 for a tiny 256)."""
    if max_len < 2:
        raise ValueError(f"max_len must be >= 2, got {max_len}")
    edge = 2 ** int(math.log2(max(1, max_len // 64)))
    edges = [0]
    while edge < max_len:
        edges.append(edge)
        edge *= 2
    return edges + [max_len]


def check_edges(edges: list[int], max_len: int) -> list[int]:
    if len(edges) < 2 or edges[0] != 0 or any(b <= a for a, b in zip(edges, edges[1:])) or edges[-1] > max_len:
        raise ValueError(f"bucket edges must start at 0, increase strictly and end at most at max_len={max_len}; "
                         f"got {edges}")
    return edges
