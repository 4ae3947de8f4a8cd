"""The verb ``eval.py seeds``: comparisons across training seeds from per-seed result files.

``eval.py seeds --task TASK --a A0.json A1.json ... --b B0.json B1.json ...`` reads result files of one task written
by ``eval.py --task TASK`` (single-model files, or paired ``--compare`` files: their model A), pairs A's and B's by the
training seed recorded in them (``checkpoint.seed_everything``), checks that every file was scored on the same items
(``results.per_item.fingerprint``), and for each of the task's metrics reports every seed's difference A − B with its
evaluation-noise interval, the mean over seeds, the seed-level t-interval (the verdict's only basis, ≥ 2 seeds; with
several metrics, at the Bonferroni level over them: ``family_confidence``), a
hierarchical bootstrap (seeds, then item clusters) and an exact sign test (``fpa_lightning.evaluation.seeds``). With
``--a`` alone, the files are paired ``--compare`` results (A and B of one seed in each). Writes
``OUT/TASK_seeds.json`` and ``OUT/TASK_seeds.png``. ``eval.py --task TASK --ckpt A0 A1 --compare B0 B1`` evaluates
each pair and then runs the same comparison (``compare_files``).

Also here: what a result records about a checkpoint's training (``training_record``: the seeds and the rate).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt
import numpy as np
import yaml

from fpa_lightning.atomic import write_json
from fpa_lightning.evaluation.checkpoint import LoadedModel
from fpa_lightning.evaluation.seeds import ONE_PAIR_NOTE, compare_seeds, family_confidence
from modules.evaluation.report import json_safe, library_versions

COMPARING_TASKS = ("test_loss", "pg19_long", "passkey", "ruler", "babilong", "cache_prune", "retrieval_recall")
DEFAULT_MARGINS = {"test_loss": 0.00995}  # the paper's non-inferiority margin (nats); other tasks: none unless given


class SeedError(ValueError):
    """The files cannot be compared across seeds (task, items, seeds); the message names the files."""


# ----------------------------------------------------------------------------------- what a result records


def _run_config(path: str) -> tuple[dict, str | None]:
    """The resolved ``config.yaml`` LightningCLI saved for the checkpoint's run (``<run>/config.yaml`` beside
    ``<run>/checkpoints/``, or beside the file), and its path; ({}, None) when there is none. A folder above is
    read only when it is the run's (the checkpoint sits in ``checkpoints/``), never an unrelated ./config.yaml."""
    folder = os.path.dirname(os.path.abspath(path)) if os.path.isfile(path) else os.path.abspath(path)
    candidates = [os.path.join(folder, "config.yaml")]
    if os.path.basename(folder) == "checkpoints":
        candidates.append(os.path.join(os.path.dirname(folder), "config.yaml"))
    for candidate in candidates:
        if os.path.isfile(candidate):
            try:
                with open(candidate) as f:
                    config = yaml.safe_load(f)
            except (OSError, yaml.YAMLError):
                continue
            if isinstance(config, dict):
                return config, candidate
    return {}, None


def _integer(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def training_record(model: LoadedModel) -> dict:
    """The training seeds and learning rate of a checkpoint (or of the checkpoint an export folder came from), for the
    result's ``checkpoint``/``compare`` record:
    ``seed_everything`` (LightningCLI's, from the run's config.yaml: Lightning does not save it in the checkpoint),
    ``data_seed`` (the data module's ``seed``), ``lr`` (``optim.lr``), and where they were read; None where unknown."""
    training = getattr(model, "training", None) or {}
    hparams = training.get("hyper_parameters") or {}
    datamodule = training.get("datamodule_hyper_parameters") or {}
    # an export folder names the checkpoint it came from (LoadedModel.source): its run holds the config
    config, config_path = _run_config(getattr(model, "source", None) or model.path)
    data_args = ((config.get("data") or {}).get("init_args") or {}) if isinstance(config.get("data"), dict) else {}
    lr = (hparams.get("optim") or {}).get("lr") if isinstance(hparams.get("optim"), dict) else None
    if lr is None:
        lr = (((config.get("model") or {}).get("optim") or {}).get("lr")) if isinstance(config.get("model"), dict) \
            else None
    return {"seed_everything": _integer(config.get("seed_everything")),
            "data_seed": _integer(datamodule.get("seed", data_args.get("seed"))),
            "lr": float(lr) if isinstance(lr, (int, float)) and not isinstance(lr, bool) else None,
            "training_config": config_path}


# ------------------------------------------------------------------------------------------ reading files


def load_result(path: str, task: str) -> dict:
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise SeedError(f"{path}: cannot read a result JSON ({err})") from err
    if record.get("task") != task:
        raise SeedError(f"{path}: a result of task {record.get('task')!r}, not {task!r}")
    if not isinstance((record.get("results") or {}).get("per_item"), dict):
        raise SeedError(f"{path}: no per-item results (written by an older eval.py): evaluate it again")
    return record


def _seed_of(record: dict, side: str, path: str) -> int:
    seed = (record.get(side) or {}).get("seed_everything")
    if seed is None:
        raise SeedError(f"{path}: the {side} checkpoint records no training seed (seed_everything; the run's "
                        "config.yaml was not found beside it)")
    return seed


def _metrics(record: dict, model: int) -> dict[str, dict]:
    """name -> {direction, ids, clusters, values (float array of model `model`)}: NaN strings read back as NaN."""
    return {m["name"]: {**m, "values": np.array([float(v) for v in m["values"][model]])}
            for m in record["results"]["per_item"]["metrics"]}


def pair_files(task: str, a_files: list[str], b_files: list[str] | None) -> list[dict]:
    """Per seed (sorted): {seed, a, b (paths), a_metrics, b_metrics, a_record, b_record}. With b_files None every A
    file is a paired result (its model B is B). Raises SeedError when the task, the items or the seeds disagree."""
    records = {path: load_result(path, task) for path in a_files + list(b_files or [])}
    prints = {path: r["results"]["per_item"]["fingerprint"] for path, r in records.items()}
    if len(set(prints.values())) > 1:
        listed = ", ".join(f"{p}: {fp}" for p, fp in prints.items())
        raise SeedError(f"the files were scored on different items (per_item fingerprints {listed}): evaluate every "
                        "checkpoint with the same --data, --seed and task options")
    if b_files is None:
        sides = [{"seed": _seed_of(records[p], "checkpoint", p), "a": p, "b": p, "b_model": 1,
                  "b_seed": _seed_of(records[p], "compare", p) if records[p].get("compare") else None}
                 for p in a_files]
        for s in sides:
            if s["b_seed"] is None:
                raise SeedError(f"{s['a']}: a single-model result; give the other side's files with --b")
            if s["b_seed"] != s["seed"]:
                raise SeedError(f"{s['a']}: A was trained with seed {s['seed']}, B with {s['b_seed']}: a pair must "
                                "share its seed")
    else:
        a_seeds = _seeds(records, a_files, "--a")
        b_seeds = _seeds(records, b_files, "--b")
        if set(a_seeds) != set(b_seeds):
            raise SeedError(f"the seeds do not pair up: --a has {sorted(a_seeds)}, --b has {sorted(b_seeds)}")
        sides = [{"seed": seed, "a": a_seeds[seed], "b": b_seeds[seed], "b_model": 0} for seed in a_seeds]
    pairs = []
    for s in sorted(sides, key=lambda s: s["seed"]):
        a, b = records[s["a"]], records[s["b"]]
        b_side = "compare" if s["b_model"] == 1 else "checkpoint"
        a_data, b_data = a["checkpoint"].get("data_seed"), b[b_side].get("data_seed")
        if a_data != b_data:
            raise SeedError(f"seed {s['seed']}: A ({s['a']}) was trained on data order {a_data}, B ({s['b']}) on "
                            f"{b_data}: a pair must share its data seed")
        pairs.append({"seed": s["seed"], "a": s["a"], "b": s["b"], "a_training": _training(a["checkpoint"]),
                      "b_training": _training(b[b_side]), "a_metrics": _metrics(a, 0),
                      "b_metrics": _metrics(b, s["b_model"]), "fingerprint": prints[s["a"]]})
    return pairs


def _seeds(records: dict, files: list[str], option: str) -> dict[int, str]:
    out = {}
    for path in files:
        seed = _seed_of(records[path], "checkpoint", path)
        if seed in out:
            raise SeedError(f"{option}: seed {seed} appears twice ({out[seed]} and {path})")
        out[seed] = path
    return out


def _training(described: dict) -> dict:
    return {k: described.get(k) for k in ("path", "backend", "seed_everything", "data_seed", "lr", "global_step")}


# ------------------------------------------------------------------------------------------------ compare


def seed_comparison(task: str, pairs: list[dict], margin: float | None, confidence: float, n_boot: int,
                    seed: int) -> dict:
    """The seed-level statistics of every metric the A and B files share (``compare_seeds``), per seed labelled;
    the metrics are read together, so each verdict rests on the t-interval at the Bonferroni level over them."""
    names = [n for n in pairs[0]["a_metrics"] if all(n in p["a_metrics"] and n in p["b_metrics"] for p in pairs)]
    if not names:
        raise SeedError(f"the A and B files of {task} share no metric")
    verdict_confidence = family_confidence(confidence, len(names))
    metrics = []
    for name in names:
        differences, clusters = [], []
        for p in pairs:
            a, b = p["a_metrics"][name], p["b_metrics"][name]
            if a["ids"] != b["ids"]:
                raise SeedError(f"seed {p['seed']}: {name} has other items in {p['a']} than in {p['b']}")
            differences.append(a["values"] - b["values"])
            clusters.append(a["clusters"])
        result = compare_seeds(differences, clusters, pairs[0]["a_metrics"][name]["direction"], margin, confidence,
                               n_boot, seed, verdict_confidence)
        result["per_seed"] = [{"seed": p["seed"], **iv} for p, iv in zip(pairs, result["per_seed"])]
        metrics.append({"name": name, "items": len(differences[0]), **result})
    return {"task": task, "seeds": [p["seed"] for p in pairs],
            "pairs": [{"seed": p["seed"], "a": os.path.abspath(p["a"]), "b": os.path.abspath(p["b"]),
                       "a_training": p["a_training"], "b_training": p["b_training"]} for p in pairs],
            "fingerprint": pairs[0]["fingerprint"], "confidence": confidence, "n_boot": n_boot,
            "verdict_confidence": verdict_confidence, "metrics_read_together": len(names),
            "bootstrap_seed": seed, "margin": margin, "note": ONE_PAIR_NOTE if len(pairs) < 2 else None,
            "metrics": metrics}


def verdict_basis(result: dict) -> str:
    """What the verdicts rest on where several metrics are read together (nothing to add for one)."""
    n = result["metrics_read_together"]
    return "" if n == 1 else (f"; verdicts from the t-interval at {result['verdict_confidence']:.2%}, Bonferroni over "
                              f"the {n} metrics read together")


def table(result: dict) -> str:
    """One line per metric: each seed's A − B, the mean, the t-interval and the hierarchical one, the sign test's p
    and the verdict (none with one seed: the note says why)."""
    level = f"{result['confidence']:.0%}"
    lines = [f"{result['task']}: A − B per training seed {result['seeds']} ({level} intervals; "
             f"t: Student t over seeds, hier.: seeds then item clusters resampled)" + verdict_basis(result)]
    width = max(len(m["name"]) for m in result["metrics"])
    for m in result["metrics"]:
        seeds = " ".join(f"{s['estimate']:+.4f}" for s in m["per_seed"])
        t = m["t_interval"]
        h = m["hierarchical_bootstrap"]
        t_text = "t: -" if t is None else f"t [{t['lower']:+.4f}, {t['upper']:+.4f}]"
        lines.append(f"  {m['name']:<{width}}  seeds {seeds}  mean {m['mean']:+.4f}  {t_text}  hier. "
                     f"[{h['lower']:+.4f}, {h['upper']:+.4f}]  sign p {m['sign_test']['p_two_sided']:.3g}  "
                     f"({m['direction']} is better)" + (f"  {m['verdict']}" if m["verdict"] else ""))
    if result["note"]:
        lines.append(f"no verdict: {result['note']}")
    return "\n".join(lines)


def plot(result: dict) -> plt.Figure:
    """One panel per metric (each in its own units): every seed's difference A − B with its evaluation-noise
    interval, then the mean over seeds with the seed-level t-interval (with one seed: the hierarchical bootstrap,
    which is that pair's evaluation noise, and no verdict)."""
    metrics = result["metrics"]
    cols = min(4, len(metrics))
    rows = -(-len(metrics) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.0 * rows), squeeze=False)
    seeds = result["seeds"]
    for ax, m in zip(axes.flat, metrics):
        for s, iv in enumerate(m["per_seed"]):
            ax.errorbar([s], [iv["estimate"]], yerr=[[iv["estimate"] - iv["lower"]], [iv["upper"] - iv["estimate"]]],
                        fmt="o", ms=4, capsize=3, color="tab:blue")
        level = m["t_interval"] or m["hierarchical_bootstrap"]
        ax.errorbar([len(seeds)], [m["mean"]], yerr=[[m["mean"] - level["lower"]], [level["upper"] - m["mean"]]],
                    fmt="s", color="k", capsize=4, lw=2)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xticks(range(len(seeds) + 1), [f"s{seed}" for seed in seeds] + ["mean (t)" if m["t_interval"] else
                                                                                "one pair"], fontsize=7)
        verdict = m["verdict"] or "no verdict"
        ax.set_title(f"{m['name']} ({m['direction']} better): {verdict}", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    fig.suptitle(f"{result['task']}: A − B per training seed (blue: evaluation noise of that pair; black: "
                 f"{'seed-level t-interval' if len(seeds) > 1 else 'one pair, evaluation noise only'}; "
                 f"{result['confidence']:.0%})", fontsize=9)
    fig.tight_layout()
    return fig


def compare_files(task: str, a_files: list[str], b_files: list[str] | None, out: str, overwrite: bool,
                  margin: float | None, confidence: float, n_boot: int, seed: int, command: str) -> str:
    """Pair the files, compute, print the table and write OUT/TASK_seeds.json and .png; returns the JSON path."""
    json_path, png_path = (os.path.join(out, f"{task}_seeds.{ext}") for ext in ("json", "png"))
    if not overwrite:
        for target in (png_path, json_path):
            if os.path.exists(target):
                raise FileExistsError(f"{target} exists")
    print(f"seeds: {task}: reading {len(a_files) + len(b_files or [])} result files", file=sys.stderr, flush=True)
    pairs = pair_files(task, a_files, b_files)
    for p in pairs:
        print(f"seed {p['seed']}: A {p['a']} ({p['a_training']['backend']}), B {p['b']} ({p['b_training']['backend']})",
              file=sys.stderr, flush=True)
    margin = DEFAULT_MARGINS.get(task) if margin is None else margin
    print(f"seeds: {task}: {len(pairs)} seed(s), {len(pairs[0]['a_metrics'])} metric(s), {n_boot} bootstrap "
          "resamples per interval", file=sys.stderr, flush=True)
    result = seed_comparison(task, pairs, margin, confidence, n_boot, seed)
    os.makedirs(out, exist_ok=True)
    fig = plot(result)
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    record = {**result, "figure": os.path.basename(png_path), "command": command, "versions": library_versions()}
    write_json(json_path, json_safe(record), indent=1, allow_nan=False)
    print(table(result))
    print(f"seeds: wrote {json_path}")
    return json_path


def default_out(task: str, files: list[str]) -> str:
    digest = hashlib.sha1("\n".join(os.path.abspath(f) for f in files).encode()).hexdigest()[:8]
    return os.path.join("eval_results", f"{task}-seeds-{digest}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eval.py seeds", description="Compare two models across training seeds from per-seed result files of "
        "one task (eval.py --task TASK ...). Files are paired by the training seed they record (seed_everything); "
        "every file must have been scored on the same items. A verdict comes only from the seed-level t-interval "
        "(with several metrics, at the Bonferroni level over them) and needs >= 2 seeds per side.")
    p.add_argument("--task", required=True, choices=COMPARING_TASKS, help="the task of every file")
    p.add_argument("--a", nargs="+", required=True, metavar="A.json", help="model A's results, one per seed (or "
                   "paired --compare results, without --b)")
    p.add_argument("--b", nargs="+", metavar="B.json", help="model B's results, one per seed")
    p.add_argument("--out", help="output folder (default: eval_results/<task>-seeds-<hash of the inputs>)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier <task>_seeds.json and .png in --out")
    p.add_argument("--margin", type=float, help="non-inferiority margin in the metric's units, on A's worse side "
                   f"(default: {DEFAULT_MARGINS['test_loss']} nats for test_loss, none for the other tasks)")
    p.add_argument("--confidence", type=float, default=0.95, help="interval confidence level")
    p.add_argument("--n-boot", type=int, default=10_000, help="bootstrap resamples")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap resampling")
    return p


def main(argv: list[str]) -> str:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0 < args.confidence < 1:
        parser.error(f"--confidence must be in (0, 1), got {args.confidence}")
    if args.n_boot < 1:
        parser.error(f"--n-boot must be a positive integer, got {args.n_boot}")
    if args.margin is not None and args.margin <= 0:
        parser.error(f"--margin must be positive, got {args.margin}")
    out = args.out or default_out(args.task, args.a + (args.b or []))
    try:
        return compare_files(args.task, args.a, args.b, out, args.overwrite, args.margin, args.confidence,
                             args.n_boot, args.seed, " ".join(["eval.py", "seeds", *argv]))
    except FileExistsError as err:
        parser.error(f"{err}: pass --overwrite to replace it, or choose another --out")
    except SeedError as err:
        parser.error(str(err))
