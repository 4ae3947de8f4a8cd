"""The ladder family: r pushes climb a walk one rung each, then one dip kills the keys above its floor.

``ladder``: read at the dip itself, do most of the keys that survive it carry colour 1? The answer needs the whole
alive set (docs/probes.md, `ladder(r)`, "Why this question"; and "Where we differ from the paper"). Each push names
its rung. ``unnamed_ladder``: the same question with pushes that name only their colour, so a key's rung is its
position and nothing in its token.
``multi_dip_ladder``: the unnamed ladder with several dips, pushes between them, read at the last dip; the alive set
is then whatever the path minimum leaves, neither a prefix nor a suffix of the pushes in general.
``dip_duration``: how many levels below the one marked key did the dip go (0 = alive, 1, 2, 3 or more)? The dip's
deepest step lasts 1 or 2 steps (``variable``) or always 1 (``fixed``): a path minimum ignores the duration, a sum
of dips (Selective Attention, FPA's dip-sum ablation) counts every step.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations, product
from math import comb

import torch

from fpa_lightning.probes.base import (BOS, IGNORE, Probe, ProbeBatch, pick_where, random_permutations, scored_at_end,
                                      uniform_int)


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

    def label_mask(self, tokens: torch.Tensor) -> torch.Tensor:
        """The dip and the surviving pushes (rungs 1..r−k at positions 1..r−k): the dead rungs' colours cannot change
        the label."""
        depth = tokens[:, -1:] - self.dip(0)  # (N, 1): k, from the dip token (dip(k) = dip(0) + k)
        position = torch.arange(tokens.shape[1])[None, :]
        return ((position >= 1) & (position <= self.r - depth)) | (position == tokens.shape[1] - 1)

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


@dataclass(frozen=True)
class MultiDipLadder(UnnamedLadder):
    """<bos>, r pushes ``Pa``/``Pb`` (colour only, no rung) in `dips` runs, each run followed by a dip D_k; the last
    token is the last dip, and the answer is read there. Walk form (``ladder``'s, docs/probes.md): a push
    climbs the walk one rung and writes its key at the new height; D_k puts the field k below the walk at that token
    only (the walk stays, so the next pushes climb on above it); key s is alive at the last token t iff
    min_{s<u≤t} φ_u ≥ ψ_s, i.e. iff no later dip's field went below its height. Label: 1 if strictly more
    surviving pushes have colour b than colour a. Classes are balanced.

    Layout: the runs' ends are r and `dips` − 1 distinct rungs drawn uniformly from 2..r−1 (so at least two pushes
    come before the first dip and at least one before every other). The dip after a run of n pushes, with the walk
    at W, has depth k uniform in 1..min(W − 1, n + 2): it kills at least the run's newest push, sometimes reaches
    into earlier runs, and never kills rung 1 (at least one survivor). With 3 dips the alive set (``alive``) is
    never a suffix of the pushes and is not a prefix in 57 %, 69 % and 78 % of the draws at r = 10, 14, 18 (mean
    size 3.3, 5.1, 7.0). Sequence space (``support_size``): 1.63e6, 1.32e8 and 6.93e9 sequences at r = 10, 14, 18.

    What it tests. One FPA head of width 4 realises every such alive set (``theory.hand_built_fpa_head``). So does
    the same head with the sum of dips: Σ min(0, φ_u − ψ_s) is 0 exactly when min φ_u ≥ ψ_s, so the two reductions
    keep the same alive set for any weights, and no alive-set question separates them. And no one-layer model with
    one softmax head (RoPE, ALiBi, NoPE or a learned position embedding, or FoX) answers it at any width
    (``theory.one_head_obstruction``): its keys cannot see the dips after them. So it separates FPA from the peers
    by what they can express, not by capacity; a capacity test needs alive sets that the query token alone
    determines, as in ``unnamed_ladder``."""

    dips: int = 3

    name = "multi_dip_ladder"
    summary = ("colour-only pushes in runs, a dip after each run; read at the last dip: colour 1 in the majority of "
               "the pushes the path minimum left alive?")
    REACH = 2
    """A dip may reach this many rungs below the run it follows."""

    def __post_init__(self):
        super().__post_init__()
        if not 2 <= self.dips <= self.r - 1:
            raise ValueError(f"multi_dip_ladder: dips must be in 2..r−1 = 2..{self.r - 1}, got {self.dips}")

    @property
    def length(self) -> int:
        return 1 + self.r + self.dips

    def sample(self, n: int, gen: torch.Generator) -> ProbeBatch:
        r, m = self.r, self.dips
        wanted = _balanced_bits(n, gen)
        inner = (random_permutations(n, r - 2, gen)[:, : m - 1] + 2).sort(dim=1).values  # run ends in 2..r−1
        ends = torch.cat([inner, torch.full((n, 1), r)], dim=1)  # (n, m): the walk W at each dip
        runs = ends - torch.cat([torch.zeros(n, 1, dtype=torch.long), ends[:, :-1]], dim=1)
        depth = uniform_int(1, torch.minimum(ends - 1, runs + self.REACH).flatten(), n * m, gen).view(n, m)
        floors = ends - depth  # the field at each dip
        rung = torch.arange(1, r + 1)[None, :, None]  # (1, r, 1)
        later = rung <= ends[:, None, :]  # (n, r, m): the dip comes after the push of that rung
        lowest = torch.where(later, floors[:, None, :], r + 1).min(dim=2).values  # (n, r): min field after the push
        survivors = torch.arange(1, r + 1)[None, :] <= lowest
        colours = torch.zeros(n, r, dtype=torch.long)
        todo = torch.ones(n, dtype=torch.bool)
        while todo.any():  # redraw the colours of rows whose majority is not the wanted one
            colours[todo] = (torch.rand(int(todo.sum()), r, generator=gen) < 0.5).long()
            ones = (colours * survivors).sum(1)
            todo = (2 * ones > survivors.sum(1)) != wanted
        # positions: the push of rung i follows the dips of the runs before it; dip j follows its run's last push
        push_at = torch.arange(1, r + 1)[None, :] + (ends[:, None, :] < torch.arange(1, r + 1)[None, :, None]).sum(2)
        dip_at = ends + torch.arange(1, m + 1)[None, :]
        tokens = torch.full((n, self.length), BOS)
        tokens.scatter_(1, push_at, self.push(None, colours))
        tokens.scatter_(1, dip_at, self.dip(depth))
        return ProbeBatch(tokens, scored_at_end(tokens, wanted.long()))

    def alive(self, tokens: list[int]) -> list[bool]:
        """Per push, in order: is its key alive at the last token? A plain loop over the path-minimum definition."""
        walk, fields, keys = 0, [], []
        for pos, t in enumerate(tokens):
            kind, value = self.read(t) or ("bos", 0)
            if kind == "push":
                walk += 1
                keys.append((pos, walk))
            fields.append(walk - value if kind == "dip" else walk)
        return [min(fields[pos + 1:]) >= level for pos, level in keys]

    def label_mask(self, tokens: torch.Tensor) -> torch.Tensor:
        """Every dip and the pushes alive at the last token: the dead pushes' colours cannot change the label (the
        dips fix which positions hold pushes, and so which pushes are alive)."""
        mask = torch.zeros(tokens.shape, dtype=torch.bool)
        for i, row in enumerate(tokens.tolist()):
            pushes = [pos for pos, t in enumerate(row) if (self.read(t) or ("",))[0] == "push"]
            alive = set(pos for pos, keep in zip(pushes, self.alive(row)) if keep)
            mask[i] = torch.tensor([(self.read(t) or ("",))[0] == "dip" or pos in alive for pos, t in enumerate(row)])
        return mask

    def support_size(self) -> tuple[int, int]:
        """How many distinct sequences the generator can produce, per class (label 0, label 1): every layout and
        depth it can draw, times the colourings (counted, not listed) that give each label."""
        r, sizes = self.r, [0, 0]
        for inner in combinations(range(2, r), self.dips - 1):
            ends = [*inner, r]
            ranges = [range(1, min(end - 1, end - start + self.REACH) + 1) for start, end in zip([0, *ends], ends)]
            for depths in product(*ranges):
                survivors = sum(all(rung > end or rung <= end - k for end, k in zip(ends, depths))
                                for rung in range(1, r + 1))
                ones = sum(comb(survivors, j) for j in range(survivors // 2 + 1, survivors + 1)) * 2 ** (r - survivors)
                sizes[1] += ones
                sizes[0] += 2 ** r - ones
        return sizes[0], sizes[1]

    def reference_labels(self, tokens: list[int]) -> list[int]:
        colours = [self.read(t)[1] for t in tokens if (self.read(t) or ("",))[0] == "push"]
        survivors = [c for c, alive in zip(colours, self.alive(tokens)) if alive]
        return [IGNORE] * (len(tokens) - 1) + [int(2 * sum(survivors) > len(survivors))]


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
    "The probes": our reading, not inspected)."""

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

    def label_mask(self, tokens: torch.Tensor) -> torch.Tensor:
        """The marked push and the dip's deepest step (both steps where they are equally deep): the label is a
        function of the marked rung j and the deepest depth k alone, so the other pushes (all P) and a shallower
        step cannot change it."""
        steps = tokens[:, self.r + 1:self.r + 3]  # (N, 2): the two steps of the dip
        depth = torch.where(steps >= self.FIRST_DIP, steps - self.FIRST_DIP + 1, 0)
        deepest = depth == depth.max(dim=1, keepdim=True).values
        mask = tokens == self.MARK
        mask[:, self.r + 1:self.r + 3] = deepest
        return mask

    def reference_labels(self, tokens: list[int]) -> list[int]:
        walk, fields, mark = 0, [], None
        for pos, t in enumerate(tokens):
            if t in (self.PUSH, self.MARK):
                walk += 1
                mark = (pos, walk) if t == self.MARK else mark
            fields.append(walk - (t - self.FIRST_DIP + 1) if t >= self.FIRST_DIP else walk)
        pos, level = mark
        return [IGNORE] * (len(tokens) - 1) + [min(max(0, level - min(fields[pos + 1:])), self.MAX_CLASS)]
