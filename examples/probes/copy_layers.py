"""Investigation behind docs/probes.md, "Where we differ", copy: does FPA copy with more than one layer?

One FPA layer cannot copy in our probe model: without positions, its bias is monotone along the walk, so a head
cannot single out the key n positions back. A second layer can build the offset from the first (a previous-token
step, as in induction). Trains the table's `copy` group shape (2 heads of d = 8, width 32) with 1, 2 and 3 layers,
15 seeds, the table's budget, and prints how many seeds reach the 0.99 criterion.

    OMP_NUM_THREADS=1 python examples/probes/copy_layers.py [--layers 2 3] [--backends fpa] [--device cpu]
"""
import argparse

import torch

from fpa_lightning.probes.model import Shape, variant
from fpa_lightning.probes.sequences import Copy
from fpa_lightning.probes.stats import CRITERION
from fpa_lightning.probes.train import Budget, train_row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, nargs="+", default=[2])
    p.add_argument("--backends", nargs="+", default=["fpa"])
    p.add_argument("--steps", type=int, default=1500, help="the table's copy budget")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    for layers in args.layers:
        for backend in args.backends:
            run = train_row(Copy(), variant(backend), Shape(heads=2, head_dim=8, layers=layers), list(range(15)),
                            Budget(steps=args.steps), torch.device(args.device))
            wins = sum(a >= CRITERION for a in run.accuracies)
            print(f"copy, {layers} layer(s), {backend}: {wins}/15 seeds reach {CRITERION}, mean accuracy "
                  f"{sum(run.accuracies) / 15:.3f}, min {min(run.accuracies):.3f} ({run.seconds:.0f} s)", flush=True)
            print(f"  per seed: {[round(a, 3) for a in run.accuracies]}", flush=True)


if __name__ == "__main__":
    main()
