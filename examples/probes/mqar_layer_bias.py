"""Investigation behind docs/probes.md, "Where we differ from the paper": how does a 2-layer FPA probe model solve
`mqar`, which the paper reports it failing (0/15) because the layer-1 bias stops the induction step from forming?

Trains the table's 2-layer FPA row (2 heads of d = 16, width 64, 15 seeds, the table's budget), then reads each
seed's biases on held-out sequences through the layers' probe path (`CausalSelfAttention.probe`):

- layer 1, at every value token v_i (position 2i + 2): the bias on the key just before it (k_i, the pair's key),
  and the fraction of its keys still alive (bias ≥ −1). A previous-token head, the first step of an induction
  circuit, keeps k_i alive and kills older keys;
- layer 2, at every repeated key (the scored queries): the bias on the answer's value token and the fraction of
  keys alive.

    python examples/probes/mqar_layer_bias.py [--device cuda] [--json out.json]
"""
import argparse
import json
import statistics

import torch

from fpa_lightning.probes.recall import Mqar
from fpa_lightning.probes.train import Budget, held_out_set, train_row
from fpa_lightning.probes.model import variant
from modules.probes.table import GROUPS


def layer_biases(model, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's bias (B, H, T, T) (−inf above the diagonal) on tokens (B, T), through the probe path."""
    x, biases = model.embed(tokens), []
    for layer in model.layers:
        biases.append(layer.probe(x).bias())
        x = x + layer(x)
    return biases


def seed_report(model, probe: Mqar, tokens: torch.Tensor) -> dict:
    first, second = layer_biases(model, tokens)
    values = probe.value_positions().to(tokens.device)
    prev_bias = first[:, :, values, values - 1]  # (B, H, P): layer 1, value token -> its own key
    alive_1 = ((first[:, :, values] >= -1).sum(-1) / (values + 1)).mean((0, 2))  # (H,)
    queries = probe.query_positions().to(tokens.device)
    rows = second[:, :, queries]  # (B, H, P, T): layer 2 at the repeated keys
    answer = probe.answer_positions(tokens)[:, None, :, None].expand(-1, rows.shape[1], -1, 1)
    answer_bias = rows.gather(-1, answer).squeeze(-1)  # (B, H, P)
    alive_2 = ((rows >= -1).sum(-1) / (queries + 1)).mean((0, 2))
    return {"layer1_prev_key_bias": prev_bias.mean((0, 2)).tolist(), "layer1_alive": alive_1.tolist(),
            "layer2_answer_bias": answer_bias.mean((0, 2)).tolist(), "layer2_alive": alive_2.tolist()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--seeds", type=int, default=15)
    p.add_argument("--steps", type=int, default=None, help="default: the table's")
    p.add_argument("--sequences", type=int, default=512, help="held-out sequences read per seed")
    p.add_argument("--json", help="write the per-seed numbers here")
    args = p.parse_args()
    group = next(g for g in GROUPS if g.label == "mqar, 2 layers")
    run = train_row(group.probe, variant("fpa"), group.shape, list(range(args.seeds)),
                    Budget(steps=args.steps or group.steps), torch.device(args.device))
    tokens = held_out_set(group.probe, args.sequences).tokens.to(args.device)  # the row's own held-out part
    reports = []
    for i, accuracy in enumerate(run.accuracies):
        model = run.ensemble.member(i).to(args.device).eval()
        reports.append({"seed": i, "accuracy": accuracy, **seed_report(model, group.probe, tokens)})
        r = reports[-1]
        fmt = lambda xs: "/".join(f"{x:6.2f}" for x in xs)  # noqa: E731 (one value per head)
        print(f"seed {i:2d} acc {accuracy:.3f} | layer 1: bias on own key {fmt(r['layer1_prev_key_bias'])}, alive "
              f"{fmt(r['layer1_alive'])} | layer 2: bias on answer {fmt(r['layer2_answer_bias'])}, alive "
              f"{fmt(r['layer2_alive'])}", flush=True)
    # per seed, the head of layer 1 that kills most (the candidate previous-token head)
    narrowest = [min(r["layer1_alive"]) for r in reports]
    print(f"layer 1, per seed its narrowest head: alive fraction median {statistics.median(narrowest):.3f} "
          f"(min {min(narrowest):.3f}, max {max(narrowest):.3f}); {run.seconds:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(reports, f, indent=1)


if __name__ == "__main__":
    main()
