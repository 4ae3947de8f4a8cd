"""The ladder family: r pushes climb a walk one rung each, then one dip kills the keys above its floor.

``ladder``: read at the dip itself, do most of the keys that survive it carry colour 1? The answer needs the whole
alive set (docs/probes.md, `ladder(r)`, "Why this question"; and "Where we differ from the paper"). Each push names
its rung. ``unnamed_ladder``: the same question with pushes that name only their colour, so a key's rung is its
position and nothing in its token.
``dip_duration``: how many levels below the one marked key did the dip go (0 = alive, 1, 2, 3 or more)? The dip's
deepest step lasts 1 or 2 steps (``variable``) or always 1 (``fixed``): a path minimum ignores the duration, a sum
of dips (Selective Attention, FPA's dip-sum ablation) counts every step.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fpa_lightning.probes.base import BOS, IGNORE, Probe, ProbeBatch, pick_where, scored_at_end, uniform_int


def _balanced_bits(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(n, generator=gen) < 0.5


@dataclass(frozen=True)
class Ladder(Probe):
    """<bos> P_1^c1 … P_r^cr D_k: the push of rung i is its own token, in colour c_i ∈ {0, 1}; D_k (k ∈ 1..r−1)
    puts the field k below the walk, so rungs r−k+1..r die and rungs 1..r−k survive. Label at D_k: 1 if strictly
    more surviving rungs have colour 1 than colour 0. Classes are balanced."""

    r: int = 10

    name = "ladder"
    family = "ladder"
    summary = "r distinct pushes (coloured), a dip of depth k; read at the dip: colour 1 in the majority of survivors?"

    def __post_init__(self):
        if self.r < 3:
            raise ValueError(f"ladder: r must be at least 3, got {self.r}")

    def vocab(self) -> list[str]:
        return ["<bos>", *(f"P{i}{'ab'[c]}" for i in range(1, self.r + 1) for c in (0, 1)),
                *(f"D{k}" for k in range(1, self.r))]

    def classes(self) -> list[str]:
        return ["no majority of colour 1", "majority of colour 1"]

    def push(self, rung, colour):  # rung 1..r, colour 0/1
        return 2 * rung - 1 + colour

    def dip(self, depth):  # depth 1..r-1
        return 2 * self.r + depth

    def sample(self, n: int, gen: torch.Generator) -> ProbeBatch:
        r = self.r
        wanted = _balanced_bits(n, gen)
        depth = uniform_int(1, r - 1, n, gen)
        colours = torch.zeros(n, r, dtype=torch.long)
        todo = torch.ones(n, dtype=torch.bool)
        while todo.any():  # redraw the colours of rows whose majority is not the wanted one
            colours[todo] = (torch.rand(int(todo.sum()), r, generator=gen) < 0.5).long()
            survivors = torch.arange(1, r + 1)[None, :] <= (r - depth)[:, None]
            ones = (colours * survivors).sum(1)
            todo = (2 * ones > survivors.sum(1)) != wanted
        rungs = torch.arange(1, r + 1)[None, :]
        tokens = torch.cat([torch.full((n, 1), BOS), self.push(rungs, colours), self.dip(depth)[:, None]], dim=1)
        return ProbeBatch(tokens, scored_at_end(tokens, wanted.long()))

    def read(self, token: int) -> tuple[str, int] | None:
        """("push", colour) or ("dip", depth) for a token of this probe; None for BOS."""
        if 1 <= token <= 2 * self.r:
            return "push", (token - 1) % 2
        return ("dip", token - 2 * self.r) if token > 2 * self.r else None

    def reference_labels(self, tokens: list[int]) -> list[int]:
        """Walk form: a push climbs one step and writes a key at the new height; D_k puts the field k below the walk;
        a key survives while no later field value is below its height."""
        walk, fields, keys = 0, [], []
        for pos, t in enumerate(tokens):
            kind, value = self.read(t) or ("bos", 0)
            if kind == "push":
                walk += 1
                keys.append((pos, walk, value))
            fields.append(walk - value if kind == "dip" else walk)
        survivors = [colour for pos, level, colour in keys if min(fields[pos + 1:]) >= level]
        return [IGNORE] * (len(tokens) - 1) + [int(2 * sum(survivors) > len(survivors))]


@dataclass(frozen=True)
class UnnamedLadder(Ladder):
    """``Ladder`` with pushes that name only their colour: <bos> P^c1 … P^cr D_k. The rung of a push is its position
    alone, so a key cannot carry its rung in its content: FPA's walk counts the pushes, a softmax head can only
    locate a key by a positional encoding."""

    name = "unnamed_ladder"
    summary = "as ladder, but a push names only its colour (its rung is its position)"

    def vocab(self) -> list[str]:
        return ["<bos>", "Pa", "Pb", *(f"D{k}" for k in range(1, self.r))]

    def push(self, rung, colour):  # the same two tokens on every rung
        return 1 + colour

    def dip(self, depth):
        return 2 + depth

    def read(self, token: int) -> tuple[str, int] | None:
        if token in (1, 2):
            return "push", token - 1
        return ("dip", token - 2) if token > 2 else None


DURATIONS = ("variable", "fixed")
ORDERS = ("any", "deepest_first")


@dataclass(frozen=True)
class DipDuration(Probe):
    """<bos>, r pushes (P, one of them the marked M at rung j), a two-step dip, then Q. One step is D_k (the field k
    below the walk). The other, for ``variable``, repeats D_k (the deepest step lasts 2 steps) or, with probability
    1/2, is a shallower D_j, j uniform in 0..k−1 (D_0 is the neutral N; the deepest step lasts 1 step); for
    ``fixed`` it is always N. ``order="any"``: the two steps come in a random order; ``"deepest_first"`` (the first
    definition): D_k always comes first. Label at Q: min(levels the dip went below M's rung, 3), i.e.
    min(max(0, j_M − (r − k)), 3); classes 0 (alive), 1, 2, 3+ are balanced."""

    r: int = 8
    duration: str = "variable"
    order: str = "any"
    """Why "any": with D_k always first, a dip-sum head could make its walk climb after every dip token, so that the
    second step never reaches below the marked key and the sum of dips is the first (deepest) one (docs/probes.md,
    investigation 4: our reading, not inspected)."""

    name = "dip_duration"
    family = "ladder"
    summary = "how far below the marked key did the dip go (0, 1, 2, 3+)? its deepest step lasts 1 or 2 steps"
    MAX_CLASS = 3
    PUSH, MARK, FILLER, QUERY, FIRST_DIP = 1, 2, 3, 4, 5

    def __post_init__(self):
        if self.duration not in DURATIONS:
            raise ValueError(f"dip_duration: duration must be one of {DURATIONS}, got {self.duration!r}")
        if self.order not in ORDERS:
            raise ValueError(f"dip_duration: order must be one of {ORDERS}, got {self.order!r}")
        if self.r < self.MAX_CLASS + 2:
            raise ValueError(f"dip_duration: r must be at least {self.MAX_CLASS + 2}, got {self.r}")

    def vocab(self) -> list[str]:
        return ["<bos>", "P", "M", "N", "Q", *(f"D{k}" for k in range(1, self.r))]

    def classes(self) -> list[str]:
        return ["alive", "1 below", "2 below", "3+ below"]

    def dip(self, depth):
        return self.FIRST_DIP - 1 + depth

    def sample(self, n: int, gen: torch.Generator) -> ProbeBatch:
        r, top = self.r, self.MAX_CLASS
        label = uniform_int(0, top, n, gen)
        depth = uniform_int(label.clamp(min=1), r - 1, n, gen)  # a dip that can reach the wanted class
        rung = torch.arange(1, r + 1)[None, :]
        below = (rung - (r - depth)[:, None]).clamp(min=0, max=top)
        mark = pick_where(below == label[:, None], gen)  # column of the marked push
        pushes = torch.full((n, r), self.PUSH).scatter(1, mark[:, None], self.MARK)
        if self.duration == "variable":
            shallower = uniform_int(0, depth - 1, n, gen)  # 0: the neutral filler
            second = torch.where(_balanced_bits(n, gen), depth, shallower)
        else:
            second = torch.zeros_like(depth)
        second = torch.where(second > 0, self.dip(second), torch.full_like(depth, self.FILLER))
        steps = torch.stack([self.dip(depth), second], dim=1)  # (n, 2): the deepest step first
        if self.order == "any":
            steps = torch.where(_balanced_bits(n, gen)[:, None], steps.flip(1), steps)
        tokens = torch.cat([torch.full((n, 1), BOS), pushes, steps, torch.full((n, 1), self.QUERY)], dim=1)
        return ProbeBatch(tokens, scored_at_end(tokens, label))

    def reference_labels(self, tokens: list[int]) -> list[int]:
        walk, fields, mark = 0, [], None
        for pos, t in enumerate(tokens):
            if t in (self.PUSH, self.MARK):
                walk += 1
                mark = (pos, walk) if t == self.MARK else mark
            fields.append(walk - (t - self.FIRST_DIP + 1) if t >= self.FIRST_DIP else walk)
        pos, level = mark
        return [IGNORE] * (len(tokens) - 1) + [min(max(0, level - min(fields[pos + 1:])), self.MAX_CLASS)]
