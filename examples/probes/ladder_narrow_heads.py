"""Investigation behind docs/probes.md, "Where we differ from the paper": does our `ladder` need head width at all?

Trains ladder rows with heads of width d = 2 (the table uses d = 4) for the positional baselines, FoX and FPA, 15 seeds
each, with the table's budget, and prints how many seeds reach the 0.99 criterion. If softmax heads of width 2 solve
the probe, it does not test a bound that asks for d ≥ r − 2 (what those heads compute: examples/probes/ladder_heads.py).

    OMP_NUM_THREADS=1 python examples/probes/ladder_narrow_heads.py [--r 10 18] [--device cpu]
"""
import argparse
import json

import torch

from fpa_lightning.probes.ladder import Ladder
from fpa_lightning.probes.model import Shape, variant
from fpa_lightning.probes.train import Budget, train_row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--r", type=int, nargs="+", default=[10, 18])
    p.add_argument("--backends", nargs="+", default=["nope", "fox", "alibi", "sdpa", "fpa"])
    p.add_argument("--head-dim", type=int, default=2)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", help="write the per-seed accuracies here")
    args = p.parse_args()
    results = {}
    for r in args.r:
        for backend in args.backends:
            run = train_row(Ladder(r=r), variant(backend), Shape(heads=1, head_dim=args.head_dim), list(range(15)),
                            Budget(steps=args.steps), torch.device(args.device))
            results[f"ladder(r={r}) d={args.head_dim} {backend}"] = run.accuracies
            wins = sum(a >= 0.99 for a in run.accuracies)
            print(f"ladder r={r} d={args.head_dim} {backend}: {wins}/15 seeds reach 0.99, mean accuracy "
                  f"{sum(run.accuracies) / len(run.accuracies):.3f} ({run.seconds:.0f} s)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
