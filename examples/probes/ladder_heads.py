"""Investigation behind docs/probes.md, "Where we differ", ladder: what do the heads that solve our ladders attend to?

Two parts:
  threshold  a softmax head of width 2 set by hand to score the survivors of D_k above the dead rungs with a linear
             threshold, q(D_k)·k(P_i) = λ·(r − k + ½ − i), no positions: its accuracy on the held-out set.
  trained    rows trained with the table's budget (15 seeds); at the dip of 512 held-out sequences, per backend: the
             attention mass on dead pushes, on BOS and the dip itself, and how unequal the survivors' weights are
             (max / min weight among the survivors). A head that realises the alive set puts ~0 on the dead pushes
             and equal weights on the survivors. `--probe unnamed_ladder` trains on the ladder whose pushes name
             only their colour (the threshold part needs named rungs and is skipped there).

    OMP_NUM_THREADS=1 python examples/probes/ladder_heads.py [--parts threshold trained] [--r 18] [--head-dim 4]
        [--probe ladder|unnamed_ladder]
"""
from __future__ import annotations

import argparse

import torch

from fpa_lightning.probes.base import IGNORE
from fpa_lightning.probes.ladder import Ladder, UnnamedLadder
from fpa_lightning.probes.model import ProbeModel, Shape, variant
from fpa_lightning.probes.stats import CRITERION
from fpa_lightning.probes.theory import linear_threshold_head
from fpa_lightning.probes.train import Budget, held_out_set, train_row
from modules.probes.table import LADDER_STEPS


def accuracy(model: ProbeModel, probe: Ladder, n: int = 2048) -> float:
    batch = held_out_set(probe, n)  # the table's held-out set (disjoint from the training pool)
    with torch.no_grad():
        predicted = model(batch.tokens).argmax(-1)
    scored = batch.labels != IGNORE
    return float(((predicted == batch.labels) & scored).sum() / scored.sum())


@torch.no_grad()
def dip_attention(model: ProbeModel, tokens: torch.Tensor) -> torch.Tensor:
    """(N, T) -> (N, T): the weights of the last position (the dip) over every key, averaged over heads."""
    layer = model.layers[0]
    x = model.embed(tokens)
    q, k, _ = layer.project(x)
    backend = layer.backend
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * backend.scale
    bias = backend.dense_bias(backend.bias_ingredients(x, q, k))
    if bias is not None:
        scores = scores + bias
    return scores[:, :, -1].softmax(-1).mean(1)  # the last row has no future key to mask


def attention_summary(model: ProbeModel, probe: Ladder, n: int = 512) -> tuple[float, float, float]:
    """Medians over n held-out sequences: mass on dead pushes, mass on BOS and the dip, survivors' max/min weight."""
    batch = held_out_set(probe, n)
    weights = dip_attention(model, batch.tokens)  # (n, r + 2)
    survivors = probe.r - (batch.tokens[:, -1] - probe.dip(0))  # (n,)
    rung = torch.arange(1, probe.r + 1)[None, :]
    pushes = weights[:, 1:-1]
    alive = rung <= survivors[:, None]
    dead_mass = (pushes * ~alive).sum(1)
    other_mass = weights[:, 0] + weights[:, -1]
    spread = pushes.masked_fill(~alive, 0).amax(1) / pushes.masked_fill(~alive, float("inf")).amin(1)
    return float(dead_mass.median()), float(other_mass.median()), float(spread.median())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", nargs="+", choices=["threshold", "trained"], default=["threshold", "trained"])
    p.add_argument("--r", type=int, nargs="+", default=[10, 18])
    p.add_argument("--head-dim", type=int, default=4, help="width of the trained heads (the table: 4)")
    p.add_argument("--backends", nargs="+", default=["fpa", "nope", "sdpa", "alibi", "fox"])
    p.add_argument("--steps", type=int, default=LADDER_STEPS)
    p.add_argument("--probe", choices=["ladder", "unnamed_ladder"], default="ladder")
    args = p.parse_args()
    torch.set_num_threads(1)
    for r in args.r:
        probe = Ladder(r=r) if args.probe == "ladder" else UnnamedLadder(r=r)
        if "threshold" in args.parts and args.probe == "ladder":
            print(f"ladder r={r}: the hand-set linear-threshold head (NoPE, d=2): accuracy "
                  f"{accuracy(linear_threshold_head(probe), probe):.3f}", flush=True)
        if "trained" not in args.parts:
            continue
        for backend in args.backends:
            run = train_row(probe, variant(backend), Shape(heads=1, head_dim=args.head_dim), list(range(15)),
                            Budget(steps=args.steps), torch.device("cpu"))
            summaries = torch.tensor([attention_summary(run.ensemble.member(i), probe) for i in range(15)])
            dead, other, spread = summaries.median(0).values.tolist()
            wins = sum(a >= CRITERION for a in run.accuracies)
            print(f"{args.probe} r={r} d={args.head_dim} {backend}: {wins}/15 seeds reach {CRITERION} (mean accuracy "
                  f"{sum(run.accuracies) / 15:.3f}); at the dip, medians over seeds of the medians over sequences: "
                  f"mass on dead pushes {dead:.3f}, on BOS and the dip {other:.3f}, survivors' max/min weight "
                  f"{spread:.1f} ({run.seconds:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
