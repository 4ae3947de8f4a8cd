"""Depth, not duration: a walk of unit steps dips below one marked key; how far below did it go?

``dip_depth`` is the path-minimum versus sum-of-dips probe that ``dip_duration`` (``ladder.py``) was meant to be. In
``dip_duration`` every dip token names its depth, so a head can answer from the deepest dip token's content without any
minimum (docs/probes.md, "Where we differ", 2), and its whole space is 504 sequences. Here no token names a depth: the
walk moves by unit steps U (up) and D (down), and the depth of a dip exists only as the walk's height; the space is
large (over 100 000 distinct sequences in 200 000 draws at durations 1–2).

The question, read at the end: how many levels below the marked key M did the walk go after M (0 = never below, the
key is alive; 1, 2, 3 or more)? In walk form (M's level is the walk's height at M) that is the depth of the path
minimum, which FPA's bias reads directly: −β × depth, whatever the path did before or after its lowest point.

The *duration* is the number of positions, from M on, at which the walk is at its lowest level. A dip-sum bias
(FPA's ``dipsum`` ablation, β·Σ_u min(0, φ_u − ψ_s)) adds one term per such position, and Selective Attention's
suppression accumulates per step too, so a dip one level deeper and a dip of the same depth that lasts longer look
alike. The probe varies the duration independently of the depth (``durations``), so a group can train on short
dips and test on longer ones (``Group.test_probe``): a path minimum is invariant by construction, a sum must
extrapolate.

How a further step at the bottom is written (``bottom``):
- ``"return"`` (the default): the walk leaves the bottom and comes back, U D or U U D D: every arrival at the bottom
  is a D, the very token whose walk step measures depth. A learned dip-sum head cannot ignore these arrivals without
  ignoring the descent too.
- ``"stay"``: a stay token S, which leaves the walk where it is. This is the literal "time at the bottom", but a
  learned dip-sum head can make S invisible (a field offset g_S far above every level: S's term is then 0 for every
  key), so under ``"stay"`` duration costs a dip-sum head nothing. It is kept as the control of that argument.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from fpa_lightning.probes.base import BOS, IGNORE, Probe, ProbeBatch, sample_each

BOTTOMS = ("return", "stay")


@dataclass(frozen=True)
class DipDepth(Probe):
    """<bos>, padding N, a random walk prefix (2–6 unit steps U/D), the mark M, then a path whose lowest point is
    `depth` levels below M (0 for class 0; 1, 2; 3–5 for class 3+), then Q. The path after M: a climb of 0–3 steps
    and a descent to the bottom that may wiggle (up to 2 detours U D or D U, never touching the bottom early),
    `duration` − 1 further steps at the bottom (a return U^m D^m, m ∈ {1, 2}, or a stay S; see ``bottom``), then 1–6
    steps that stay strictly above the bottom. For class 0 there is no climb or descent: M's own position is the
    first step at the lowest level. The duration is drawn uniformly from `durations`. Label at Q: min(depth, 3);
    classes are drawn uniformly. Every sequence is padded (N after BOS) to `length` tokens, so that probes with
    different `durations` have one length.

    Why the climb and the random rest: neither the number of D after M (climb + depth + detours + returns + the
    rest's) nor the final height (the rest's climb − depth) tells the depth, so a head that counts steps after M
    cannot answer; the depth is where the walk was lowest."""

    durations: tuple[int, ...] = (1, 2)
    """The durations drawn from: positions from M on at the walk's lowest level."""
    bottom: str = "return"
    """How a further step at the bottom is written: "return" (U^m D^m) or "stay" (S); see the module docstring."""
    length: int = 42

    name = "dip_depth"
    family = "walks"
    summary = "a unit-step walk and one marked key: how far below it did the walk go (0, 1, 2, 3+)?"
    N, U, D, S, M, Q = 1, 2, 3, 4, 5, 6
    STEP = {U: 1, D: -1}
    MAX_CLASS = 3
    DEEPEST = 5
    """Class 3+ draws its depth from 3..DEEPEST."""
    PREFIX = (2, 6)
    CLIMB = 3
    WIGGLES = 2
    AFTER = 6
    RETURN = 2
    """A return climbs and comes back 1..RETURN levels."""

    def __post_init__(self):
        if not self.durations or min(self.durations) < 1:
            raise ValueError(f"dip_depth: durations must be a non-empty tuple of positive integers, "
                             f"got {self.durations!r}")
        if self.bottom not in BOTTOMS:
            raise ValueError(f"dip_depth: bottom must be one of {BOTTOMS}, got {self.bottom!r}")
        if self.longest > self.length:
            raise ValueError(f"dip_depth: sequences with durations up to {max(self.durations)} need length "
                             f"{self.longest}, got {self.length}")

    @property
    def longest(self) -> int:
        """The longest unpadded sequence: BOS, prefix, M, climb and descent with its wiggles, the bottom, the rest,
        Q."""
        step = 1 if self.bottom == "stay" else 2 * self.RETURN
        return (1 + self.PREFIX[1] + 1 + 2 * self.CLIMB + self.DEEPEST + 2 * self.WIGGLES
                + (max(self.durations) - 1) * step + self.AFTER + 1)

    def vocab(self) -> list[str]:
        return ["<bos>", "N", "U", "D", "S", "M", "Q"]

    def classes(self) -> list[str]:
        return ["alive", "1 below", "2 below", "3+ below"]

    def sample(self, n: int, gen) -> ProbeBatch:
        return sample_each(n, gen, self._one)

    def _one(self, rng: random.Random):
        U, D = self.U, self.D
        label = rng.randrange(self.MAX_CLASS + 1)
        depth = label if label < self.MAX_CLASS else rng.randint(self.MAX_CLASS, self.DEEPEST)
        duration = rng.choice(self.durations)
        prefix = [rng.choice((U, D)) for _ in range(rng.randint(*self.PREFIX))]
        climb = rng.randint(0, self.CLIMB) if depth else 0
        fall = climb + depth  # D steps from the top of the climb to the bottom
        wiggles = [rng.randrange(fall) for _ in range(rng.randint(0, self.WIGGLES))] if depth else []
        path = [U] * climb
        for i in range(fall):  # i steps down from the top, before the next one
            for _ in range(wiggles.count(i)):  # a detour that stays above the bottom
                path += [U, D] if i == fall - 1 or rng.random() < 0.5 else [D, U]
            path.append(D)
        for _ in range(duration - 1):  # further steps at the bottom
            if self.bottom == "stay":
                path.append(self.S)
            else:
                m = rng.randint(1, self.RETURN)
                path += [U] * m + [D] * m
        height = 1  # above the bottom from here on
        path.append(U)
        for _ in range(rng.randint(0, self.AFTER - 1)):
            step = U if height == 1 else rng.choice((U, D))
            height += self.STEP[step]
            path.append(step)
        body = [*prefix, self.M, *path, self.Q]
        tokens = [BOS] + [self.N] * (self.length - 1 - len(body)) + body
        return tokens, [IGNORE] * (len(tokens) - 1) + [label]

    def label_mask(self, tokens):
        """The walk from M to Q: the depth is measured from M's height, so the prefix before M (and the padding)
        cannot change the label."""
        return (tokens == self.M).cumsum(dim=1) > 0

    def walk(self, tokens: list[int]) -> tuple[list[int], int]:
        """The walk's height at every position (U climbs, D steps down, every other token stays) and M's position."""
        heights, height = [], 0
        for t in tokens:
            height += self.STEP.get(t, 0)
            heights.append(height)
        return heights, tokens.index(self.M)

    def depth(self, tokens: list[int]) -> int:
        """How many levels below M's height the walk went after M."""
        heights, mark = self.walk(tokens)
        return heights[mark] - min(heights[mark:])

    def duration(self, tokens: list[int]) -> int:
        """How many positions, from M on, the walk spends at its lowest level from M on."""
        heights, mark = self.walk(tokens)
        return heights[mark:].count(min(heights[mark:]))

    def reference_labels(self, tokens: list[int]) -> list[int]:
        """Walk form: M's key sits at the walk's height at M; the label is how far the field went below it."""
        return [IGNORE] * (len(tokens) - 1) + [min(self.depth(tokens), self.MAX_CLASS)]
