"""Run records of the seeded language-model study (benchmarks/lm_study.sh): one compact final.json per training.

    python benchmarks/lm_study_runs.py final RESULTS/runs/NAME --backend fpa --lr 1e-3 --seed 0 [--compare-with OLD]
    python benchmarks/lm_study_runs.py finals RESULTS/runs          # one line per finished run
    python benchmarks/lm_study_runs.py report RECORDS --out docs/lm_study   # seeds.md and the seed figures
    python benchmarks/lm_study_runs.py report RECORDS --out docs/lm_study --check   # seeds.md == rendered, else exit 1

`final` reads the run's TensorBoard events, config.yaml and hparams.yaml (its newest version_N) and writes
NAME/final.json: the unit (backend, learning rate, initialisation and data seeds, and the retrieval arm's synthetic
share, null for the plain arm; a mixture's documents and tokens per source, from the last checkpoint), every logged validation loss and the last training losses as logged (float32, exact,
so that a reproduction can be checked bit for bit), the loss curves, the head and long-context summaries and the
implementations that ran. The record replaces the event files in the
study's committed results (docs/lm_study.md, "Reproduce"). With --compare-with (an earlier record of the same unit,
from another lease) it says whether the new training reproduced the old one bit for bit.

`report` reads the committed records of the seeded study (RECORDS = benchmarks/results/lm_study_seeds: trainings/*.json,
the final.json of each run; retrained/*.json, units trained again that differ from their first training;
compare/<a>-<b>_lr<lr>/<task>_seeds.json, written by `eval.py seeds`) and writes
OUT/seeds.md (every run's final losses and head summary; the learning-rate sweep; every seed-level comparison),
OUT/seeds_curves.png (the runs trained with several seeds) and OUT/sweep.png (final loss against the peak rate).
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


def retrieval_share(config: dict) -> float | None:
    """The synthetic retrieval share of a run's train mixture (the retrieval arm, configs/study/retrieval_*.yaml), or
    None for the plain arm."""
    share = (config["data"]["init_args"].get("mixture_weights") or {}).get("retrieval")
    return None if share is None else float(share)


def train_sources(version: pathlib.Path) -> dict | None:
    """A mixture run's per-source counters of its train stream (documents, tokens, skipped records; summed over
    ranks) from the data module's state in its last checkpoint, or None where the run has no mixture or no checkpoint.
    The checkpoint is the only place they are saved (docs/training.md, "Data mixtures"), and the record outlives it."""
    checkpoint = version / "checkpoints" / "last.ckpt"
    if not checkpoint.exists():
        return None
    import torch  # here: the other commands of this script run without it

    state = torch.load(checkpoint, map_location="cpu", mmap=True, weights_only=False)
    ranks = [rank for value in state.values() if isinstance(value, dict) and "ranks" in value
             for rank in value["ranks"]]  # the data module's entry (Lightning keys it by the module's class name)
    totals: dict[str, dict[str, int]] = {}
    for rank in ranks:
        for name, counts in rank["stats"].get("train", {}).get("sources", {}).items():
            mine = totals.setdefault(name, {})
            for key, n in counts.items():
                mine[key] = mine.get(key, 0) + n
    return totals or None


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
        "data_seed": config["data"]["init_args"].get("seed", 0), "retrieval_share": retrieval_share(config),
        "train_sources": train_sources(version),
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


NAMES = {"fpa": "FPA", "fox": "FoX", "sdpa": "softmax"}
SWEEP_RATES = (3e-4, 6e-4, 1e-3, 2e-3)  # the learning-rate sweep's peak rates (docs/lm_study.md, "Tuned baselines")
SWEEP_SEED = 0


def read_records(records: pathlib.Path) -> tuple[list[dict], list[dict], list[dict]]:
    """The first training of every unit (trainings/), the comparisons (compare/) and the units trained again whose
    losses differ from their first training (retrained/, written by lm_study.sh record)."""
    def load(pattern: str) -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted(records.glob(pattern))]

    comparisons = [json.loads(p.read_text()) | {"folder": p.parent.name}
                   for p in sorted((records / "compare").glob("*/*_seeds.json"))]
    return load("trainings/*.json"), comparisons, load("retrained/*.json")


def signed(x: float | None, digits: int = 4) -> str:
    return "—" if x is None else f"{x:+.{digits}f}"


def interval(iv: dict | None) -> str:
    return "—" if iv is None else f"[{iv['lower']:+.4f}, {iv['upper']:+.4f}]"


def arm_label(record: dict) -> str:
    """The backend's name, with the synthetic share for a run of the retrieval arm (records before the arm have no
    share: the plain arm)."""
    share = record.get("retrieval_share")
    name = NAMES.get(record["backend"], record["backend"])
    return name if share is None else f"{name}, retrieval share {share:g}"


def training_table(runs: list[dict]) -> list[str]:
    lines = ["| run | backend | lr | seed | data seed | final val loss | last train loss | median alive | "
             "non-suffix heads | boundary ratio |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        heads = (r.get("heads") or {}).get("values", {})
        alive, ratio, nonsuffix, with_bias = (heads.get(k) for k in (
            "median_alive_fraction", "boundary_ratio", "nonsuffix_heads", "heads_with_bias"))
        lines.append(
            f"| {r['run']} | {arm_label(r)} | {r['lr']:g} | {r['seed']} | {r['data_seed']} | "
            f"{r['final_val_loss']!r} | {r['last_train_losses'][-1][1]!r} | "
            f"{'—' if alive is None else f'{100 * alive:.2f} %'} | "
            f"{'—' if nonsuffix is None else f'{int(nonsuffix)} of {int(with_bias)}'} | "
            f"{'—' if ratio is None else f'{ratio:.2f}'} |")
    return lines


def rate(lr: float) -> str:
    """3e-4, as benchmarks/lm_study.sh's LRS and the run names write it."""
    return f"{lr:.0e}".replace("e-0", "e-")


def sweep_losses(runs: list[dict]) -> dict[str, dict[float, float]]:
    """{backend: {lr: final val loss}} of the sweep's seed-0 runs (the plain arm's: a retrieval run trains on other
    data)."""
    sweep: dict[str, dict[float, float]] = {}
    for r in runs:
        if r["seed"] == SWEEP_SEED and r["data_seed"] == 0 and r.get("retrieval_share") is None:
            sweep.setdefault(r["backend"], {})[r["lr"]] = r["final_val_loss"]
    return sweep


def sweep_table(runs: list[dict]) -> list[str]:
    """One row per backend: the final validation loss at each swept rate; the lowest in bold. A backend with a rate
    not yet trained shows its best so far, never a pick."""
    lines = ["| backend | " + " | ".join(f"lr {rate(lr)}" for lr in SWEEP_RATES) + " | lowest | picked |",
             "|---|" + "---|" * len(SWEEP_RATES) + "---|---|"]
    for backend, losses in sorted(sweep_losses(runs).items()):
        best = min(losses, key=losses.get)
        cells = [("not run" if lr not in losses else
                  f"**{losses[lr]:.4f}**" if lr == best else f"{losses[lr]:.4f}") for lr in SWEEP_RATES]
        complete = all(lr in losses for lr in SWEEP_RATES)
        lines.append(f"| {NAMES.get(backend, backend)} | " + " | ".join(cells) + f" | {rate(best)} | "
                     + (rate(best) if complete else "pending (rates not run)") + " |")
    return lines


def retrained_table(runs: list[dict], retrained: list[dict]) -> list[str]:
    """One row per unit trained again: its first training's final validation loss and the retraining's (the model
    that eval/<run> evaluated), and their difference."""
    first = {r["run"]: r for r in runs}
    lines = ["| run | final val loss, first training | final val loss, retrained (evaluated) | retrained − first |",
             "|---|---|---|---|"]
    for r in retrained:
        old = first[r["run"]]["final_val_loss"]
        lines.append(f"| {r['run']} | {old!r} | {r['final_val_loss']!r} | {r['final_val_loss'] - old:+.4f} |")
    return lines


def comparison_table(doc: dict) -> list[str]:
    seeds = doc["seeds"]
    family = doc["metrics_read_together"]
    basis = "" if family == 1 else (f"; verdicts from the t-interval at {doc['verdict_confidence']:.2%}, "
                                    f"Bonferroni over the {family} metrics read together")
    lines = [f"**{doc['task']}**, {doc['folder']} ({len(seeds)} seeds; {doc['confidence']:.0%} intervals; "
             f"{doc['n_boot']} bootstrap resamples{basis})", "",
             "| metric | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | t-interval over seeds | "
             "hierarchical bootstrap | sign test p | verdict |",
             "|---|" + "---|" * len(seeds) + "---|---|---|---|---|"]
    for m in doc["metrics"]:
        per_seed = {p["seed"]: p["estimate"] for p in m["per_seed"]}
        lines.append(f"| {m['name']} ({m['direction']} is better) | "
                     + " | ".join(signed(per_seed.get(s)) for s in seeds)
                     + f" | {signed(m['mean'])} | {interval(m['t_interval'])} | "
                     f"{interval(m['hierarchical_bootstrap'])} | {m['sign_test']['p_two_sided']:.3g} | "
                     f"{m['verdict'] or 'none (one seed)'} |")
    return lines


def render(runs: list[dict], comparisons: list[dict], retrained: list[dict] = ()) -> str:
    lines = ["# The seeded language-model study: tables", "",
             "Rendered by `python benchmarks/lm_study_runs.py report benchmarks/results/lm_study_seeds --out "
             "docs/lm_study` from the committed records (a test re-renders it). Differences are A − B, A the first "
             "backend of the folder name, per training seed on the same evaluation items.", "",
             "## Runs", "", *training_table(runs), "",
             f"## Learning-rate sweep (seed {SWEEP_SEED}, final validation loss)", "",
             "Each backend trained once per peak rate (50 warm-up steps, cosine to a tenth, as every study run); the "
             "lowest final validation loss picks the rate. One seed: differences smaller than the seed spread of the "
             "runs above are not resolved.", "", *sweep_table(runs), ""]
    if retrained:
        lines += ["## Units trained again", "",
                  "Trained again in a later lease (the checkpoint gone, the evaluations incomplete) and not equal to "
                  "the first training bit for bit. The comparisons below use the retrained model (its record: "
                  "retrained/<run>.json); the tables above keep the first training's.", "",
                  *retrained_table(runs, retrained), ""]
    lines += ["## Comparisons across seeds", ""]
    for doc in comparisons:
        lines += [*comparison_table(doc), ""]
    return "\n".join(lines)


COLORS = {"fpa": "C0", "fox": "C1", "sdpa": "C2"}


def seeded_runs(runs: list[dict]) -> list[dict]:
    """The runs of each (backend, arm, lr) trained with more than one seed: the seed comparisons' models."""
    def unit(r: dict) -> tuple:
        return r["backend"], r.get("retrieval_share"), r["lr"]

    count: dict[tuple, int] = {}
    for r in runs:
        count[unit(r)] = count.get(unit(r), 0) + 1
    return [r for r in runs if count[unit(r)] > 1]


def plot_curves(runs: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colors = COLORS
    for ax, tag in zip(axes, ("train/loss", "val/loss")):
        for r in seeded_runs(runs):
            points = r["curves"][tag]
            ax.plot([t / 1e6 for t, _ in points], [v for _, v in points], color=colors.get(r["backend"]),
                    alpha=0.8, marker="o" if tag == "val/loss" else None, markersize=3,
                    linestyle="-" if r.get("retrieval_share") is None else "--",
                    label=f"{arm_label(r)} lr {r['lr']:g} seed {r['seed']}")
        ax.set(xlabel="tokens seen (millions)", ylabel=f"{tag} (nats)", title=f"{tag}, every seed")
    axes[0].set_ylim(top=7.0)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sweep(runs: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for backend, losses in sorted(sweep_losses(runs).items()):
        rates = sorted(losses)
        ax.plot(rates, [losses[lr] for lr in rates], marker="o", color=COLORS.get(backend),
                label=NAMES.get(backend, backend))
    ax.set(xscale="log", xlabel="peak learning rate", ylabel="final validation loss (nats)",
           title=f"learning-rate sweep, seed {SWEEP_SEED}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(args) -> int:
    runs, comparisons, retrained = read_records(args.records)
    text = render(runs, comparisons, retrained) + "\n"
    target = args.out / "seeds.md"
    if args.check:
        if target.read_text() == text:
            print(f"{target} matches the records")
            return 0
        print(f"{target} differs from the tables rendered from {args.records}: run the report again")
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    plot_curves(runs, args.out / "seeds_curves.png")
    plot_sweep(runs, args.out / "sweep.png")
    print(f"wrote {target}, {args.out / 'seeds_curves.png'} and {args.out / 'sweep.png'}")
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
    rendered = commands.add_parser("report", help="OUT/seeds.md and its figures from the committed records")
    rendered.add_argument("records", type=pathlib.Path)
    rendered.add_argument("--out", type=pathlib.Path, required=True)
    rendered.add_argument("--check", action="store_true", help="only compare OUT/seeds.md with the rendering")
    args = parser.parse_args(argv)
    if args.command == "report":
        return report(args)
    return write_final(args) if args.command == "final" else list_finals(args.runs)


if __name__ == "__main__":
    sys.exit(main())
