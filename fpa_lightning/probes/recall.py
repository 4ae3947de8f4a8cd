"""Multi-query associative recall (MQAR): key-value pairs, then every key again; recall its value (docs/probes.md).

It needs an induction-style circuit (a value token must first learn which key preceded it), hence two or more
layers; the paper's finding is that FPA's bias in layer 1 stops that first step from forming.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from fpa_lightning.probes.base import BOS, IGNORE, Probe, ProbeBatch, sample_each


@dataclass(frozen=True)
class Mqar(Probe):
    """<bos> k_1 v_1 … k_P v_P, then the P keys again in a random order. Keys are distinct draws from `keys` keys,
    values uniform over `values` values. Label at each repeated key: its value."""

    pairs: int = 8
    keys: int = 16
    values: int = 16

    name = "mqar"
    family = "recall"
    summary = "key-value pairs, then the keys again: recall each key's value"

    def __post_init__(self):
        if self.pairs > self.keys:
            raise ValueError(f"mqar: pairs ({self.pairs}) cannot exceed keys ({self.keys}): keys are distinct")

    def vocab(self) -> list[str]:
        return ["<bos>", *(f"k{i}" for i in range(self.keys)), *(f"v{i}" for i in range(self.values))]

    def classes(self) -> list[str]:
        return [f"v{i}" for i in range(self.values)]

    def sample(self, n: int, gen) -> ProbeBatch:
        return sample_each(n, gen, self._one)

    def _one(self, rng: random.Random):
        keys = rng.sample(range(self.keys), self.pairs)
        values = [rng.randrange(self.values) for _ in keys]
        order = rng.sample(range(self.pairs), self.pairs)
        tokens = [BOS]
        for k, v in zip(keys, values):
            tokens += [1 + k, 1 + self.keys + v]
        tokens += [1 + keys[i] for i in order]
        return tokens, [IGNORE] * (1 + 2 * self.pairs) + [values[i] for i in order]

    def reference_labels(self, tokens: list[int]) -> list[int]:
        labels = []
        for pos, t in enumerate(tokens):
            earlier = [p for p in range(1, pos) if tokens[p] == t]
            labels.append(tokens[earlier[0] + 1] - 1 - self.keys if 1 <= t <= self.keys and earlier else IGNORE)
        return labels

    def value_positions(self) -> torch.Tensor:
        """(P,) positions of the values v_1..v_P; each pair's key sits just before its value."""
        return torch.arange(1, self.pairs + 1) * 2

    def query_positions(self) -> torch.Tensor:
        """(P,) positions of the repeated keys (the scored queries)."""
        return torch.arange(2 * self.pairs + 1, 3 * self.pairs + 1)

    def answer_positions(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, T) -> (B, P): for each repeated key, the position of the value it must recall."""
        keys = tokens[:, 1:2 * self.pairs:2]  # (B, P) k_1..k_P
        queries = tokens[:, self.query_positions().to(tokens.device)]  # (B, P)
        pair = (queries[:, :, None] == keys[:, None, :]).float().argmax(-1)  # (B, P): index of the matching key
        return 2 * pair + 2
