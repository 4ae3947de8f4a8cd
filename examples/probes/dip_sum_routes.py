"""Investigation behind docs/probes.md, "Where we differ", dip duration: how does FPA's dip-sum ablation solve a
probe built to defeat it?

Three parts, each printed as it finishes (15 seeds, the table's budget unless --steps says otherwise):
  cases   the table's `dip_duration` (variable) for FPA and dip-sum: held-out accuracy by case (the second dip step is
          the same depth, a shallower one or the filler N; which comes first; the label);
  weights the learned per-token maps of the best dip-sum seed: walk step δ, field offset g, level offset h, the
          query's score of each key and each key's value as the readout sees it;
  walk    a variant (defined here, not part of the table) whose dip is made of unit steps, so that no token names a
          depth: k down-steps D, then the bottom revisited 1..4 times through (U D) pairs, then 0..k up-steps U, then
          the query; the label is again how far the walk went below the marked push M (0, 1, 2, 3+).

    OMP_NUM_THREADS=1 python examples/probes/dip_sum_routes.py [--parts cases weights walk] [--steps N]
"""
from __future__ import annotations

import argparse
import collections
import functools
import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fpa_lightning.probes.base import BOS, IGNORE, Probe, sample_each
from fpa_lightning.probes.ladder import DipDuration
from fpa_lightning.probes.model import Shape, variant
from fpa_lightning.probes.stats import CRITERION, sign_test, successes
from fpa_lightning.probes.train import Budget, RowRun, held_out_set, seeded, train_row

SEEDS = list(range(15))


@dataclass(frozen=True)
class WalkDip(Probe):
    """<bos> N… then r pushes U (one of them the marked M at rung j), k down-steps D, (U D) × (visits − 1), U × a, Q.
    Padding N (before the pushes) keeps every sequence at one length. Label at Q: min(max(0, j − (r − k)), 3)."""

    r: int = 8
    visits: int = 4
    """The bottom of the dip is visited 1..visits times."""

    name = "walk_dip"
    family = "ladder"
    U, M, D, N, Q = 1, 2, 3, 4, 5
    MAX_CLASS = 3

    def vocab(self) -> list[str]:
        return ["<bos>", "U", "M", "D", "N", "Q"]

    def classes(self) -> list[str]:
        return ["alive", "1 below", "2 below", "3+ below"]

    @property
    def length(self) -> int:  # the longest sequence: BOS, r pushes, r − 1 downs, the revisits, r − 1 ups, Q
        return 1 + self.r + (self.r - 1) + 2 * (self.visits - 1) + (self.r - 1) + 1

    def sample(self, n: int, gen: torch.Generator):
        return sample_each(n, gen, self._one)

    def _one(self, rng: random.Random):
        r, label = self.r, rng.randrange(self.MAX_CLASS + 1)
        depth = rng.randint(max(1, label), r - 1)
        rung = rng.choice([j for j in range(1, r + 1) if min(max(0, j - (r - depth)), self.MAX_CLASS) == label])
        body = ([self.M if i == rung else self.U for i in range(1, r + 1)] + [self.D] * depth
                + [self.U, self.D] * (rng.randint(1, self.visits) - 1) + [self.U] * rng.randint(0, depth) + [self.Q])
        tokens = [BOS] + [self.N] * (self.length - 1 - len(body)) + body
        return tokens, [IGNORE] * (len(tokens) - 1) + [label]

    def reference_labels(self, tokens: list[int]) -> list[int]:
        walk, heights, mark = 0, [], None
        for pos, t in enumerate(tokens):
            walk += {self.U: 1, self.M: 1, self.D: -1}.get(t, 0)
            heights.append(walk)
            mark = (pos, walk) if t == self.M else mark
        pos, level = mark
        return [IGNORE] * (len(tokens) - 1) + [min(max(0, level - min(heights[pos + 1:])), self.MAX_CLASS)]


@functools.cache  # `cases` and `weights` both need the dip-sum row: train it once
def train(probe: Probe, backend: str, steps: int) -> RowRun:
    run = train_row(probe, variant(backend), Shape(heads=1, head_dim=4), SEEDS, Budget(steps=steps), torch.device("cpu"))
    wins = sum(a >= CRITERION for a in run.accuracies)
    print(f"{probe.key} · {backend} · {steps} steps: {wins}/15 seeds reach {CRITERION}, mean accuracy "
          f"{sum(run.accuracies) / 15:.3f}, min {min(run.accuracies):.3f} ({run.seconds:.0f} s)", flush=True)
    return run


def case_of(probe: DipDuration, first: int, second: int) -> str:
    if first == second:
        return "same depth twice"
    if probe.FILLER in (first, second):
        return "N first" if first == probe.FILLER else "N second"
    return "shallower first" if first < second else "shallower second"


def cases(steps: int) -> None:
    probe = DipDuration(duration="variable")
    test = held_out_set(probe, 4096)  # the row's held-out part: never in the training pool
    labels = test.labels[:, -1]
    groups = collections.defaultdict(list)
    for i, (a, b) in enumerate(zip(test.tokens[:, -3].tolist(), test.tokens[:, -2].tolist())):
        groups[(case_of(probe, a, b), int(labels[i]))].append(i)
    for backend in ("fpa", "fpa_dipsum"):
        run = train(probe, backend, steps)
        with torch.no_grad():
            predicted = run.ensemble(test.tokens.expand(len(SEEDS), -1, -1))[:, :, -1].argmax(-1)  # (E, N)
        print(f"  {'case':18s} label  sequences  mean accuracy over seeds (min)")
        for (case, label), rows in sorted(groups.items()):
            rows = torch.tensor(rows)
            accuracy = (predicted[:, rows] == labels[rows]).float().mean(1)
            print(f"  {case:18s} {label:5d}  {len(rows):9d}  {accuracy.mean():.3f} ({accuracy.min():.3f})")


def weights(steps: int) -> None:
    probe = DipDuration(duration="variable")
    run = train(probe, "fpa_dipsum", steps)
    best = max(range(len(SEEDS)), key=lambda i: run.accuracies[i])
    model = run.ensemble.member(best)
    layer = model.layers[0]
    with torch.no_grad():
        embedded = model.embed.weight  # (V, C)
        delta, g, h = layer.backend.gate(embedded).unbind(-1)  # one head: (V,) each
        q, k, v = layer.qkv(embedded).unflatten(-1, (3, layer.head_dim)).unbind(1)  # (V, d) each
        scores = k @ q[probe.QUERY] * layer.backend.scale  # the query's score of every key
        seen = model.readout.weight @ layer.out.weight @ v.T  # (classes, V): each key's value through the readout
    print(f"seed {SEEDS[best]} (held-out accuracy {run.accuracies[best]:.3f}), "
          f"β = {float(F.softplus(layer.backend.beta_raw)):.2f}")
    print(f"  {'token':6s} {'δ':>7s} {'g':>7s} {'h':>7s} {'score':>7s}  value seen by the readout (per class)")
    for t, name in enumerate(probe.vocab()):
        print(f"  {name:6s} {delta[t]:7.2f} {g[t]:7.2f} {h[t]:7.2f} {scores[t]:7.2f}  "
              f"{[round(x, 1) for x in seen[:, t].tolist()]}")


def walk(steps: int) -> None:
    probe = WalkDip()
    check = probe.sample(500, seeded(0))
    for tokens, labels in zip(check.tokens.tolist(), check.labels.tolist()):
        assert labels == probe.reference_labels(tokens), tokens
    runs = [train(probe, backend, steps) for backend in ("fpa", "fpa_dipsum")]
    for backend, run in zip(("fpa", "fpa_dipsum"), runs):
        print(f"  {backend} per seed: {[round(a, 3) for a in run.accuracies]}")
    test = sign_test(*(successes(run.accuracies, CRITERION) for run in runs))
    print(f"  FPA better than dip-sum: p = {test.p_value:.3g} ({test.a_only} : {test.b_only} discordant seeds)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", nargs="+", choices=["cases", "weights", "walk"], default=["cases", "weights", "walk"])
    p.add_argument("--steps", type=int, default=1000, help="training steps per row (the table's dip_duration: 1000)")
    args = p.parse_args()
    torch.set_num_threads(1)
    for part in args.parts:
        {"cases": cases, "weights": weights, "walk": walk}[part](args.steps)


if __name__ == "__main__":
    main()
