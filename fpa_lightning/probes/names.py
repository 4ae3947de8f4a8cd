"""Name probes: bindings of names to values, read back by a query (docs/probes.md).

``find_name``: scoped bindings. A local binding dies when its block closes, a global one never does; the query
asks for the value of the name's one alive binding (its other bindings are dead). ``find_name_by_place``: the same
question where a binding's token does not say whether it is global: a binding written outside every block is
global, one written inside a block is local, so only its place in the walk tells them apart. ``var_assign``:
re-assignment; the query asks for the value of the name's latest assignment.

``without_content_retrieval`` is the paper's third find_name ablation applied to a trained model: the attention
scores keep the bias and lose q·k, so a query can no longer pick its name's bindings by their content.
"""
from __future__ import annotations

import copy
import random
from dataclasses import dataclass

import torch

from fpa_lightning.probes.base import BOS, IGNORE, Probe, ProbeBatch, sample_each
from fpa_lightning.probes.model import ProbeModel, query_projection_rows


def _scoped_row(probe, rng: random.Random, bind) -> tuple[list[int], list[int]] | None:
    """One sequence of a scoped-binding probe (its length, MAX_DEPTH, OPEN, CLOSE and query): a random nest of
    blocks and bindings after BOS, then the query of a name with exactly one alive binding and at least one dead
    one, labelled with the alive binding's value; None when no name qualifies (the draw is rejected).

    bind(rng, depth) -> (token, name, value, scoped) draws one binding; a scoped binding dies when the block it was
    written in closes (the outermost level never closes), an unscoped one never dies."""
    tokens, depth = [BOS], 0
    open_blocks = [[]]  # per open block, the indices of its scoped bindings (the outermost, never closed, first)
    bindings, alive = [], []  # (name, value) of every binding, and whether it is still alive
    for _ in range(probe.length):
        choice = rng.random()
        if choice < 0.2 and depth < probe.MAX_DEPTH:
            tokens.append(probe.OPEN)
            depth += 1
            open_blocks.append([])
        elif choice < 0.4 and depth > 0:
            tokens.append(probe.CLOSE)
            depth -= 1
            for i in open_blocks.pop():
                alive[i] = False
        else:
            token, name, value, scoped = bind(rng, depth)
            tokens.append(token)
            bindings.append((name, value))
            alive.append(True)
            if scoped:
                open_blocks[-1].append(len(bindings) - 1)
    names = {nm for nm, _ in bindings}
    candidates = [x for x in sorted(names)
                  if sum(a for (nm, _), a in zip(bindings, alive) if nm == x) == 1
                  and any(not a for (nm, _), a in zip(bindings, alive) if nm == x)]
    if not candidates:
        return None
    x = rng.choice(candidates)
    value = next(v for (nm, v), a in zip(bindings, alive) if nm == x and a)
    tokens.append(probe.query(x))
    return tokens, [IGNORE] * (len(tokens) - 1) + [value]



@dataclass(frozen=True)
class _Bindings(Probe):
    names: int = 4
    values: int = 4

    family = "names"

    def __post_init__(self):
        if self.names < 2 or self.values < 2:
            raise ValueError(f"{self.name}: names and values must be at least 2, got {self.names}, {self.values}")

    def classes(self) -> list[str]:
        return [f"v{v}" for v in range(self.values)]

    def _binding_names(self, prefix: str) -> list[str]:
        return [f"{prefix}{chr(97 + name)}={v}" for name in range(self.names) for v in range(self.values)]

    def _query_names(self) -> list[str]:
        return [f"?{chr(97 + name)}" for name in range(self.names)]


@dataclass(frozen=True)
class FindName(_Bindings):
    """`length` tokens of a program: "(" opens a block (depth ≤ 2), ")" closes one, L{x}={v} binds x to v for the
    rest of the enclosing block, G{x}={v} binds x to v for good. Then ?x for a name with exactly one alive binding
    and at least one dead one. Label: the value of x's alive binding."""

    length: int = 14

    name = "find_name"
    summary = "scoped bindings (local die when their block closes, global never); the value of the alive one"
    MAX_DEPTH = 2

    def vocab(self) -> list[str]:
        return ["<bos>", "(", ")", *self._binding_names("L"), *self._binding_names("G"), *self._query_names()]

    OPEN, CLOSE, FIRST_BINDING = 1, 2, 3

    def binding(self, is_global: bool, name: int, value: int) -> int:
        return self.FIRST_BINDING + (self.names * self.values if is_global else 0) + name * self.values + value

    def query(self, name: int) -> int:
        return self.FIRST_BINDING + 2 * self.names * self.values + name

    def _decode(self, t: int) -> tuple[bool, int, int]:
        """binding token -> (is_global, name, value)"""
        i = t - self.FIRST_BINDING
        return i >= self.names * self.values, (i % (self.names * self.values)) // self.values, i % self.values

    def sample(self, n: int, gen) -> ProbeBatch:
        return sample_each(n, gen, self._one)

    def _one(self, rng: random.Random):
        def bind(rng, depth):  # global with probability 0.3, named in its token
            is_global, name, value = rng.random() < 0.3, rng.randrange(self.names), rng.randrange(self.values)
            return self.binding(is_global, name, value), name, value, not is_global

        return _scoped_row(self, rng, bind)

    def reference_labels(self, tokens: list[int]) -> list[int]:
        """Walk form: "(" climbs, ")" steps down; a local binding is alive while the walk never goes below its
        height; a global one is always alive."""
        heights, walk = [], 0
        for t in tokens:
            walk += 1 if t == self.OPEN else (-1 if t == self.CLOSE else 0)
            heights.append(walk)
        x = tokens[-1] - self.query(0)
        values = [self._decode(t)[2] for pos, t in enumerate(tokens[:-1])
                  if t >= self.FIRST_BINDING and self._decode(t)[1] == x
                  and (self._decode(t)[0] or min(heights[pos:]) >= heights[pos])]
        assert len(values) == 1, "the query must have exactly one alive binding"
        return [IGNORE] * (len(tokens) - 1) + values


@dataclass(frozen=True)
class FindNameByPlace(_Bindings):
    """find_name whose globals differ from its locals only by their place in the walk. `length` tokens: "(" opens a
    block (depth ≤ 2), ")" closes one, {x}={v} binds x to v; a binding written outside every block (depth 0) is
    global, one written inside a block is local and dies when that block closes. Then ?x for a name with exactly
    one alive binding and at least one dead one. Label: the value of x's alive binding.

    In ``find_name`` a global binding is its own token (G{x}={v}), so a key's content can mark it and the level
    offset h is not needed to keep it (docs/probes.md, "Where we differ", 3). Here every binding of x to v is the
    same token wherever it is written. In walk form ("(" climbs, ")" steps down, a key's level is its height) the
    rule is the stack's: a binding is alive while the walk never goes below its height, which a top-level binding
    (height 0) never sees. One-layer key maps see only a key's token, so a key level h cannot tell a global from a
    local here either: the walk's height is all that does."""

    length: int = 14

    name = "find_name_by_place"
    family = "names"
    summary = "scoped bindings whose scope is only their place (top level: global); the value of the alive one"
    MAX_DEPTH = 2
    OPEN, CLOSE, FIRST_BINDING = 1, 2, 3

    def vocab(self) -> list[str]:
        return ["<bos>", "(", ")", *self._binding_names(""), *self._query_names()]

    def binding(self, name: int, value: int) -> int:
        return self.FIRST_BINDING + name * self.values + value

    def query(self, name: int) -> int:
        return self.FIRST_BINDING + self.names * self.values + name

    def sample(self, n: int, gen) -> ProbeBatch:
        return sample_each(n, gen, self._one)

    def _one(self, rng: random.Random):
        def bind(rng, depth):  # one token per (name, value): only the block it is written in makes it local
            name, value = rng.randrange(self.names), rng.randrange(self.values)
            return self.binding(name, value), name, value, True

        return _scoped_row(self, rng, bind)

    def reference_labels(self, tokens: list[int]) -> list[int]:
        """Scopes by brackets: a binding is alive unless the block it was written in (if any) has closed."""
        stack, scope_of, closed, block = [], {}, set(), 0
        for pos, t in enumerate(tokens[:-1]):
            if t == self.OPEN:
                block += 1
                stack.append(block)
            elif t == self.CLOSE:
                closed.add(stack.pop())
            elif t >= self.FIRST_BINDING:
                scope_of[pos] = stack[-1] if stack else None  # None: top level, global
        x = tokens[-1] - self.query(0)
        values = [(tokens[pos] - self.FIRST_BINDING) % self.values for pos, scope in scope_of.items()
                  if (tokens[pos] - self.FIRST_BINDING) // self.values == x and scope not in closed]
        assert len(values) == 1, "the query must have exactly one alive binding"
        return [IGNORE] * (len(tokens) - 1) + values


def without_content_retrieval(model: ProbeModel) -> ProbeModel:
    """A copy of a trained `model` whose attention has no content retrieval: every layer's query projection is zero,
    so q·k = 0 and each head's scores are its bias alone (for FPA: uniform attention over the alive keys, weighted
    by how far each dead key is below the field). The paper's find_name ablation "without content retrieval" trains
    such a model (the probe backend ``fpa_noretrieval``); this is the same ablation applied after training, which
    shows whether a trained head finds its name by content."""
    ablated = copy.deepcopy(model)
    weights = dict(ablated.named_parameters())
    with torch.no_grad():
        for name, rows in query_projection_rows(ablated).items():
            weights[name][:rows].zero_()
    return ablated


@dataclass(frozen=True)
class VarAssign(_Bindings):
    """`length` tokens after BOS: the first is an assignment, then each is an assignment {x}={v} (probability 0.7)
    or a query ?x of a name assigned before. Label at every query: the value of x's latest assignment."""

    values: int = 8
    length: int = 16

    name = "var_assign"
    summary = "assignments and re-assignments; at each query, the name's latest value"

    def vocab(self) -> list[str]:
        return ["<bos>", *self._binding_names(""), *self._query_names()]

    def assignment(self, name: int, value: int) -> int:
        return 1 + name * self.values + value

    def query(self, name: int) -> int:
        return 1 + self.names * self.values + name

    def sample(self, n: int, gen) -> ProbeBatch:
        return sample_each(n, gen, self._one)

    def _one(self, rng: random.Random):
        tokens, labels, latest = [BOS], [IGNORE], {}
        for i in range(self.length):
            if i == 0 or rng.random() < 0.7:
                name, value = rng.randrange(self.names), rng.randrange(self.values)
                latest[name] = value
                tokens.append(self.assignment(name, value))
                labels.append(IGNORE)
            else:
                name = rng.choice(sorted(latest))
                tokens.append(self.query(name))
                labels.append(latest[name])
        return (tokens, labels) if any(y != IGNORE for y in labels) else None

    def reference_labels(self, tokens: list[int]) -> list[int]:
        labels = []
        for pos, t in enumerate(tokens):
            if t >= self.query(0):
                name = t - self.query(0)
                last = max(p for p in range(pos) if 1 <= tokens[p] < self.query(0)
                           and (tokens[p] - 1) // self.values == name)
                labels.append((tokens[last] - 1) % self.values)
            else:
                labels.append(IGNORE)
        return labels
