"""Walk probes: a stack (``push_pop``) and two independent walks read by two heads (``two_families``).

A key is *alive* while its walk never goes below the height at which it was written (docs/probes.md).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from fpa_lightning.probes.base import BOS, IGNORE, Probe, ProbeBatch, sample_each


@dataclass(frozen=True)
class PushPop(Probe):
    """A stack program of `ops` operations: S0 / S1 push an item of colour 0 / 1, POP removes the top (only when the
    stack is not empty); then Q, with the stack not empty. Label at Q: 1 if strictly more items on the stack have
    colour 1 than colour 0. Classes are balanced."""

    ops: int = 12

    name = "push_pop"
    family = "walks"
    summary = "a random stack program of coloured pushes and pops; colour 1 in the majority on the stack?"
    PUSH0, PUSH1, POP, QUERY = 1, 2, 3, 4

    def __post_init__(self):
        if self.ops < 3:
            raise ValueError(f"push_pop: ops must be at least 3, got {self.ops}")

    def vocab(self) -> list[str]:
        return ["<bos>", "S0", "S1", "POP", "Q"]

    def classes(self) -> list[str]:
        return ["no majority of colour 1", "majority of colour 1"]

    def sample(self, n: int, gen) -> ProbeBatch:
        return sample_each(n, gen, self._one, balance=2)

    def _one(self, rng: random.Random):
        tokens, stack = [BOS], []
        for _ in range(self.ops):
            if stack and rng.random() < 0.4:
                stack.pop()
                tokens.append(self.POP)
            else:
                stack.append(rng.randrange(2))
                tokens.append(self.PUSH0 + stack[-1])
        if not stack:
            return None
        return [*tokens, self.QUERY], [IGNORE] * len(tokens) + [int(2 * sum(stack) > len(stack))]

    def label_mask(self, tokens: torch.Tensor) -> torch.Tensor:
        """Every POP and the pushes still on the stack at Q: a popped push's colour cannot change the label (the POPs
        fix which positions hold pushes, and so which pushes are popped)."""
        mask = tokens == self.POP
        for i, row in enumerate(tokens.tolist()):
            stack = []
            for pos, t in enumerate(row):
                if t in (self.PUSH0, self.PUSH1):
                    stack.append(pos)
                elif t == self.POP:
                    stack.pop()
            mask[i, stack] = True
        return mask

    def reference_labels(self, tokens: list[int]) -> list[int]:
        """Walk form: a push climbs one step and writes a key at the new height, POP steps down; a key is on the
        stack while the walk never goes below its height afterwards."""
        heights, walk, keys = [], 0, []
        for pos, t in enumerate(tokens):
            walk += {self.PUSH0: 1, self.PUSH1: 1, self.POP: -1}.get(t, 0)
            heights.append(walk)
            if t in (self.PUSH0, self.PUSH1):
                keys.append((pos, walk, t - self.PUSH0))
        on_stack = [colour for pos, level, colour in keys if min(heights[pos + 1:]) >= level]
        return [IGNORE] * (len(tokens) - 1) + [int(2 * sum(on_stack) > len(on_stack))]


@dataclass(frozen=True)
class TwoFamilies(Probe):
    """Two independent ±1 walks (steps U1/D1 and U2/D2, interleaved at random over `steps` tokens) and one mark M
    written among them, at least 4 steps before the end; then Q. Label: alive1 + 2·alive2, where alive_j says
    that walk j never went below its height at M afterwards. Classes are balanced."""

    steps: int = 12

    name = "two_families"
    family = "walks"
    summary = "one mark, two interleaved walks; is the mark alive under walk 1, under walk 2 (4 classes)?"
    MIN_AFTER = 4

    def __post_init__(self):
        if self.steps < self.MIN_AFTER:
            raise ValueError(f"two_families: steps must be at least {self.MIN_AFTER}, got {self.steps}")

    def vocab(self) -> list[str]:
        return ["<bos>", "U1", "D1", "U2", "D2", "M", "Q"]

    def classes(self) -> list[str]:
        return ["dead in both", "alive in walk 1 only", "alive in walk 2 only", "alive in both"]

    MARK, QUERY = 5, 6
    STEP = {1: (0, 1), 2: (0, -1), 3: (1, 1), 4: (1, -1)}  # token -> (walk, step)

    def sample(self, n: int, gen) -> ProbeBatch:
        return sample_each(n, gen, self._one, balance=4)

    def _one(self, rng: random.Random):
        before = rng.randint(0, self.steps - self.MIN_AFTER)
        steps = [rng.randint(1, 4) for _ in range(self.steps)]
        lowest, walk = [0, 0], [0, 0]
        for token in steps[before:]:  # heights relative to the mark's
            which, step = self.STEP[token]
            walk[which] += step
            lowest[which] = min(lowest[which], walk[which])
        label = int(lowest[0] >= 0) + 2 * int(lowest[1] >= 0)
        tokens = [BOS, *steps[:before], self.MARK, *steps[before:], self.QUERY]
        return tokens, [IGNORE] * (len(tokens) - 1) + [label]

    def label_mask(self, tokens: torch.Tensor) -> torch.Tensor:
        """The walks from M to Q: aliveness is measured from the heights at M, so the steps before M cannot change
        the label."""
        return (tokens == self.MARK).cumsum(dim=1) > 0

    def reference_labels(self, tokens: list[int]) -> list[int]:
        walks, mark_heights, alive = [0, 0], None, [True, True]
        for t in tokens:
            if t in self.STEP:
                which, step = self.STEP[t]
                walks[which] += step
            elif t == self.MARK:
                mark_heights = list(walks)
            if mark_heights is not None:
                alive = [a and w >= m for a, w, m in zip(alive, walks, mark_heights)]
        return [IGNORE] * (len(tokens) - 1) + [int(alive[0]) + 2 * int(alive[1])]
