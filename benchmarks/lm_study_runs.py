"""Run records of the seeded language-model study (benchmarks/lm_study.sh): one compact final.json per training.

    python benchmarks/lm_study_runs.py final RESULTS/runs/NAME --backend fpa --lr 1e-3 --seed 0 [--compare-with OLD]
    python benchmarks/lm_study_runs.py finals RESULTS/runs          # one line per finished run

`final` reads the run's TensorBoard events, config.yaml and hparams.yaml (its newest version_N) and writes
NAME/final.json: the unit (backend, learning rate, initialisation and data seeds), every logged validation loss and the
last training losses as logged (float32, exact, so that a reproduction can be checked bit for bit), the loss curves,
the head and long-context summaries and the implementations that ran. The record replaces the event files in the
study's committed results (docs/lm_study.md, "Reproduce"). With --compare-with (an earlier record of the same unit,
from another lease) it says whether the new training reproduced the old one bit for bit.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

import yaml

from lm_study_report import collect_training

EXACT_KEYS = ("val_losses", "last_train_losses")  # what "bit for bit" compares


def newest_version(run: pathlib.Path) -> pathlib.Path:
    versions = sorted(run.glob("version_*"), key=lambda p: int(p.name.split("_")[-1]))
    if not versions:
        raise SystemExit(f"{run}: no version_N folder (did the training start?)")
    return versions[-1]


def final_record(run: pathlib.Path, backend: str, lr: float, seed: int) -> dict:
    version = newest_version(run)
    config = yaml.safe_load((version / "config.yaml").read_text())
    training = collect_training(version, None)
    recorded_lr = config["model"]["optim"]["lr"]
    if abs(recorded_lr - lr) > 1e-12 * lr or config.get("seed_everything") != seed:
        raise SystemExit(f"{version}: config.yaml has lr {recorded_lr} and seed {config.get('seed_everything')}, "
                         f"the unit says lr {lr} and seed {seed}")
    curves = training.pop("curves")
    return {
        "run": run.name, "backend": backend, "lr": lr, "seed": seed,
        "data_seed": config["data"]["init_args"].get("seed", 0),
        "val_losses": curves["val/loss"], "last_train_losses": curves["train/loss"][-5:],
        "curves": curves, **training,
    }


def compare_records(new: dict, old: dict) -> str:
    same = all(new[key] == old[key] for key in EXACT_KEYS)
    return ("reproduced bit for bit (every validation loss and the last training losses)" if same else
            f"DIFFERS from the earlier training: validation losses {[v for _, v in old['val_losses']]} then "
            f"{[v for _, v in new['val_losses']]}")


def write_final(args) -> int:
    record = final_record(args.run, args.backend, args.lr, args.seed)
    old_path = args.compare_with
    if old_path is not None and old_path.exists():
        record["reproduction"] = compare_records(record, json.loads(old_path.read_text()))
        print(f"{args.run.name}: {record['reproduction']}")
    (args.run / "final.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"{args.run.name}: final validation loss {record['final_val_loss']!r}, wrote {args.run / 'final.json'}")
    return 0


def list_finals(runs: pathlib.Path) -> int:
    records = [json.loads(p.read_text()) for p in sorted(runs.glob("*/final.json"))]
    if not records:
        print(f"{runs}: no finished run")
    for r in records:
        train = r["last_train_losses"][-1][1] if r["last_train_losses"] else None
        print(f"{r['run']:32s} val {r['final_val_loss']!r:>20}  train (last) {train!r:>20}"
              + (f"  {r['reproduction']}" if "reproduction" in r else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    final = commands.add_parser("final", help="write RUN/final.json")
    final.add_argument("run", type=pathlib.Path)
    final.add_argument("--backend", required=True)
    final.add_argument("--lr", type=float, required=True)
    final.add_argument("--seed", type=int, required=True)
    final.add_argument("--compare-with", type=pathlib.Path, help="an earlier final.json of the same unit")
    finals = commands.add_parser("finals", help="list every RUNS/*/final.json")
    finals.add_argument("runs", type=pathlib.Path)
    args = parser.parse_args(argv)
    return write_final(args) if args.command == "final" else list_finals(args.runs)


if __name__ == "__main__":
    sys.exit(main())
