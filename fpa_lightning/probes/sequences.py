"""Sequence probes that every model in the paper's table handles (docs/probes.md): flip-flop, copy, counting."""
from __future__ import annotations

import random
from dataclasses import dataclass

from fpa_lightning.probes.base import BOS, IGNORE, Probe, ProbeBatch, sample_each


@dataclass(frozen=True)
class FlipFlop(Probe):
    """`length` instructions after BOS, the first a write: W0/W1 write a bit (probability 0.2), I0/I1 carry a bit
    to ignore (0.5), R reads (0.3). Label at every R: the bit of the latest write."""

    length: int = 32

    name = "flip_flop"
    family = "sequences"
    summary = "write / ignore / read instructions; at each read, the last written bit"

    def vocab(self) -> list[str]:
        return ["<bos>", "W0", "W1", "I0", "I1", "R"]

    def classes(self) -> list[str]:
        return ["0", "1"]

    READ = 5

    def sample(self, n: int, gen) -> ProbeBatch:
        return sample_each(n, gen, self._one)

    def _one(self, rng: random.Random):
        tokens, labels, bit = [BOS], [IGNORE], None
        for i in range(self.length):
            u = rng.random()
            if i == 0 or u < 0.2:
                bit = rng.randrange(2)
                tokens.append(1 + bit)
                labels.append(IGNORE)
            elif u < 0.7:
                tokens.append(3 + rng.randrange(2))
                labels.append(IGNORE)
            else:
                tokens.append(self.READ)
                labels.append(bit)
        return tokens, labels

    def reference_labels(self, tokens: list[int]) -> list[int]:
        return [tokens[max(p for p in range(pos) if tokens[p] in (1, 2))] - 1 if t == self.READ else IGNORE
                for pos, t in enumerate(tokens)]


@dataclass(frozen=True)
class Copy(Probe):
    """<bos> a_1 … a_n SEP a_1 … a_{n−1} with a_i uniform over `symbols` symbols. Label at SEP: a_1; at the
    second a_i: a_{i+1} (the copy, one step ahead, as a language model is trained)."""

    n: int = 8
    symbols: int = 8

    name = "copy"
    family = "sequences"
    summary = "copy a string after a separator (predict the next symbol of the copy)"

    def vocab(self) -> list[str]:
        return ["<bos>", *(f"a{i}" for i in range(self.symbols)), "SEP"]

    def classes(self) -> list[str]:
        return [f"a{i}" for i in range(self.symbols)]

    def sample(self, n: int, gen) -> ProbeBatch:
        return sample_each(n, gen, self._one)

    def _one(self, rng: random.Random):
        string = [rng.randrange(self.symbols) for _ in range(self.n)]
        tokens = [BOS, *(1 + a for a in string), self.symbols + 1, *(1 + a for a in string[:-1])]
        return tokens, [IGNORE] * (self.n + 1) + string

    def reference_labels(self, tokens: list[int]) -> list[int]:
        sep = tokens.index(self.symbols + 1)
        return [tokens[pos - sep + 1] - 1 if pos >= sep else IGNORE for pos in range(len(tokens))]


@dataclass(frozen=True)
class Counting(Probe):
    """`length` symbols after BOS, uniform over `symbols`. Label at every symbol: how many times it has occurred so
    far (itself included), capped at `cap` (classes 1, 2, …, cap+)."""

    length: int = 20
    symbols: int = 4
    cap: int = 4

    name = "counting"
    family = "sequences"
    summary = "at every token, how many times it has occurred so far (capped)"

    def vocab(self) -> list[str]:
        return ["<bos>", *(f"s{i}" for i in range(self.symbols))]

    def classes(self) -> list[str]:
        return [*(str(c) for c in range(1, self.cap)), f"{self.cap}+"]

    def sample(self, n: int, gen) -> ProbeBatch:
        return sample_each(n, gen, self._one)

    def _one(self, rng: random.Random):
        tokens, labels, counts = [BOS], [IGNORE], [0] * self.symbols
        for _ in range(self.length):
            s = rng.randrange(self.symbols)
            counts[s] += 1
            tokens.append(1 + s)
            labels.append(min(counts[s], self.cap) - 1)
        return tokens, labels

    def reference_labels(self, tokens: list[int]) -> list[int]:
        return [IGNORE if pos == 0 else min(tokens[1:pos + 1].count(t), self.cap) - 1 for pos, t in enumerate(tokens)]
