"""The numbers, tables and figures of docs/lm_study.md, from the RESULTS folder of benchmarks/lm_study.sh.

Reads RESULTS/runs/study_<backend>/version_*/ (TensorBoard events, hparams.yaml, config.yaml),
RESULTS/eval/<name>/<task>.json and RESULTS/status.tsv. Writes the record RECORD (every number the document quotes,
copied from those files; default OUT/results.json), OUT/tables.md (rendered from the record alone) and four figures:
loss_curves.png, loss_by_position.png, passkey.png, keys_kept_vs_loss.png. The record is a result, so it lives under
benchmarks/results/ (docs/ holds the manual and its figures); the tables and figures stay with the page.

    python benchmarks/lm_study_report.py RESULTS --out docs/lm_study --record benchmarks/results/lm_study_first/results.json
    python benchmarks/lm_study_report.py RESULTS --second RESULTS2 --out docs/lm_study --record RECORD
    python benchmarks/lm_study_report.py --check docs/lm_study --record RECORD   # tables.md == render(RECORD), else exit 1

--second: a later run of the same script (the same configs trained again, on another machine lease): each
evaluation that RESULTS lacks is taken from it and marked as measured on the second training, and the second
training's final losses are listed beside the first's (how far two trainings of one config land apart).
"""
from __future__ import annotations

import argparse
import difflib
import json
import pathlib
import re
import statistics
import sys
from collections import Counter
from collections.abc import Callable

import matplotlib

matplotlib.use("Agg")  # files only; the GPU machines have no display
import matplotlib.pyplot as plt
import yaml

BACKENDS = ("fpa", "fox", "sdpa")
PEERS = ("fox", "sdpa")
NAME = {"fpa": "FPA", "fox": "FoX", "sdpa": "softmax"}
PAIRED = ("test_loss", "pg19_long", "passkey", "ruler", "babilong", "cache_prune")
EVALS = {**{f"{task}-fpa-{peer}": task for task in PAIRED for peer in PEERS},  # eval folder -> task (its JSON's name)
         "cache_prune_real-fpa-fox": "cache_prune", **{f"generate-{b}": "generate" for b in BACKENDS},
         "lm_eval-fpa-fox": "lm_eval"}
LIGHTNING_TAGS = ("train/", "epoch")  # logged at the steps done before the batch (val/ and test/: at the steps done)
MISSING = "not run / failed (see status.tsv)"
DASH = "—"
COLOR = {"FPA": "C0", "FoX": "C1", "softmax": "C2"}  # one colour per model in every figure
DPI = 110


# --- collect ------------------------------------------------------------------------------------------------------

def read_scalars(run: pathlib.Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of a run as (optimizer steps done, value) points."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})  # 0: every point, not a 10,000-point sample
    events.Reload()
    out = {}
    for tag in events.Tags()["scalars"]:
        # Lightning logs train/ at the count of steps done before the current one; LanguageModel logs val/ and the
        # callbacks log their statistics at trainer.global_step, after it: +1 puts all on "optimizer steps done"
        shift = 1 if tag.startswith(LIGHTNING_TAGS) else 0
        out[tag] = [(e.step + shift, e.value) for e in events.Scalars(tag)]
    return out


def final_values(scalars: dict[str, list[tuple[int, float]]], prefix: str) -> dict | None:
    """Every tag under prefix at its last point (a callback writes them all at once), or None if there is none."""
    last = {tag[len(prefix):]: points[-1] for tag, points in scalars.items() if tag.startswith(prefix)}
    if not last:
        return None
    return {"step": max(s for s, _ in last.values()), "values": {tag: v for tag, (_, v) in last.items()}}


def collect_training(run: pathlib.Path, seconds: int | None) -> dict:
    config = yaml.safe_load((run / "config.yaml").read_text())
    hparams = yaml.safe_load((run / "hparams.yaml").read_text())
    trainer, data = config["trainer"], config["data"]["init_args"]
    devices = trainer.get("devices")
    # tokens per optimizer step: every micro-batch of every rank ("auto" devices: the study runs on one GPU)
    per_step = (data["batch_size"] * data["seq_len"] * (trainer.get("accumulate_grad_batches") or 1)
                * (devices if isinstance(devices, int) else 1) * (trainer.get("num_nodes") or 1))
    scalars = read_scalars(run)
    # the tags, per-head and per-position ones folded: a renamed callback tag shows up here
    kinds = sorted({re.sub(r"(layer_\d+/head_\d+|pos_\d+)$", "*", t) for t in scalars})
    print(f"{run}: {len(scalars)} scalar tags: {', '.join(kinds)}", file=sys.stderr)
    steps = max((s for points in scalars.values() for s, _ in points), default=0)
    train, val, speed = ([v for _, v in scalars.get(tag, [])]
                         for tag in ("train/loss", "val/loss", "train/tokens_per_s"))
    return {
        "steps": steps, "tokens_per_step": per_step, "tokens_seen": steps * per_step, "seq_len": data["seq_len"],
        "final_train_loss": statistics.fmean(train[-5:]) if train else None,
        "final_val_loss": val[-1] if val else None, "best_val_loss": min(val) if val else None,
        "median_tokens_per_s": statistics.median(speed) if speed else None, "train_seconds": seconds,
        "attention_impls": hparams.get("attention_impls"),
        "heads": final_values(scalars, "heads/summary/"), "long_context": final_values(scalars, "long_context/"),
        "curves": {tag: [[s * per_step, v] for s, v in scalars.get(tag, [])] for tag in ("train/loss", "val/loss")},
    }


def read_status(path: pathlib.Path) -> list[dict]:
    rows = [line.split("\t", 3) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return [{"step": r[0], "exit_code": int(r[1]), "seconds": int(r[2]), "command": r[3] if len(r) > 3 else ""}
            for r in rows]


def latest_run(runs: pathlib.Path, backend: str) -> pathlib.Path | None:
    """The newest version_N of a model (lm_study.sh evaluates the newest checkpoint, too)."""
    versions = sorted((runs / f"study_{backend}").glob("version_*"), key=lambda p: int(p.name.split("_")[-1]))
    return versions[-1] if versions else None


def header(doc: dict) -> dict:
    models = [doc["checkpoint"]] + ([doc["compare"]] if doc.get("compare") else [])
    return {"command": doc["command"], "seconds": doc["seconds"], "device": doc["device"],
            "precision": doc["settings"]["precision"], "confidence": doc["settings"]["confidence"],
            "models": [{"backend": m["backend"], "global_step": m["global_step"]} for m in models]}


def subset(d: dict | None, *keys: str) -> dict | None:
    return None if d is None else {k: d[k] for k in keys if k in d}


def sides(models: list[dict], *keys: str) -> dict:
    """{"a": model A's keys, "b": model B's}: A is always FPA (--ckpt), B the peer (--compare)."""
    return {side: subset(m, *keys) for side, m in zip("ab", models)}


def mcnemar(test: dict | None) -> dict | None:
    return subset(test, "p_two_sided", "p_a_better")


def extract_losses(r: dict) -> dict:
    """test_loss (the non-inferiority verdict) and pg19_long (a loss and a difference per position bucket)."""
    return {**sides(r["models"], "loss"), **subset(r, "difference", "margin", "verdict", "sequences", "seq_len",
                                                   "buckets", "books_per_bucket", "documents")}


def extract_passkey(r: dict) -> dict:
    return {**subset(r, "scorer", "trials_per_length"), "mcnemar_pooled": mcnemar(r.get("mcnemar_pooled")),
            "lengths": [{"length": e["length"], **sides(e["models"], "successes", "n", "rate"),
                         "mcnemar": mcnemar(e.get("mcnemar"))} for e in r["lengths"]]}


def extract_generated(r: dict) -> dict:
    """ruler, babilong: per length the average over tasks (RULER's headline) and its pooled interval; each task."""
    return {"items_per_task": r["items_per_task"],
            "average": [{"length": e["length"], "tasks": e["tasks"], **sides(e["models"], "score", "pooled_interval"),
                         "mcnemar": mcnemar(e.get("mcnemar_pooled"))} for e in r["average"]],
            "tasks": [{"task": t["task"], "length": t["length"], **sides(t["models"], "score"),
                       "mcnemar": mcnemar(t.get("mcnemar"))} for t in r["tasks"]]}


def extract_cache_prune(r: dict) -> dict:
    keys = ("rule", "kept_fraction", "kept_pair_fraction", "loss", "increase", "real_eviction")
    lengths = [{"length": e["length"], "documents": e["documents"],
                **{side: {"unpruned_loss": m["unpruned_loss"], "rules": [subset(x, *keys) for x in m["rules"]]}
                   for side, m in zip("ab", e["models"])}} for e in r["lengths"]]
    passkey = [{"length": e["length"], **sides(e["models"], "rule", "successes", "n", "rate", "kept_fraction")}
               for e in r["passkey"]]
    return {"lengths": lengths, "passkey": passkey}


def extract_generate(r: dict) -> dict:
    model = r["models"][0]
    return {"prompts": r["prompts"], "continuations": model["continuations"],
            "max_new_tokens": r["settings"]["max_new_tokens"], **subset(model["stats"], "ms_per_step", "kept_fraction")}


def extract_lm_eval(r: dict) -> dict:
    return {"tasks": [{"task": t["task"], "metric": t["metric"], **sides(t["models"], "value", "stderr", "n"),
                       "mcnemar": mcnemar(t.get("mcnemar"))} for t in r["tasks"]]}


EXTRACT = {"test_loss": extract_losses, "pg19_long": extract_losses, "passkey": extract_passkey,
           "ruler": extract_generated, "babilong": extract_generated, "cache_prune": extract_cache_prune,
           "generate": extract_generate, "lm_eval": extract_lm_eval}


def collect(results_dir: str | pathlib.Path, second: str | pathlib.Path | None = None) -> dict:
    """Every number of the study from RESULTS (and the evals it lacks from `second`, marked ``"training":
    "second"``); a model or an eval that did not run is None."""
    results = collect_one(results_dir)
    for e in results["evals"].values():
        if e is not None:
            e["training"] = "first"
    results["second"] = None
    if second is not None:
        later = collect_one(second)
        taken = [n for n, e in later["evals"].items() if e is not None and results["evals"][n] is None]
        for name in taken:
            results["evals"][name] = {**later["evals"][name], "training": "second"}
        results["second"] = {
            "evals": taken, "status": later["status"],
            "training": {b: subset(t, "steps", "tokens_seen", "final_train_loss", "final_val_loss", "train_seconds")
                         if t else None for b, t in later["training"].items()}}
    return results


def collect_one(results_dir: str | pathlib.Path) -> dict:
    """One RESULTS folder: every number in it; a model or an eval that did not run is None."""
    root = pathlib.Path(results_dir)
    if not (root / "runs").is_dir():
        raise SystemExit(f"{root}: no runs/ folder; give the RESULTS folder of benchmarks/lm_study.sh "
                         "(it holds runs/, eval/, logs/ and status.tsv)")
    status = read_status(root / "status.tsv")
    seconds = {e["step"]: e["seconds"] for e in status}  # a step run twice: its last run
    training = {}
    for backend in BACKENDS:
        run = latest_run(root / "runs", backend)
        training[backend] = collect_training(run, seconds.get(f"train_{backend}")) if run else None
    evals = {}
    for name, task in EVALS.items():
        path = root / "eval" / name / f"{task}.json"
        doc = json.loads(path.read_text()) if path.exists() else None
        evals[name] = {"header": header(doc), **EXTRACT[task](doc["results"])} if doc else None
    context = next((t["seq_len"] for t in training.values() if t), None)
    return {"training_context": context, "training": training, "evals": evals, "status": status}


# --- render -------------------------------------------------------------------------------------------------------

def number(spec: str) -> Callable[[float | None], str]:
    return lambda x: DASH if x is None else format(x, spec)


f4, d4, f3, pv = number(".4f"), number("+.4f"), number(".3f"), number(".2g")  # losses, differences, fractions, p


def ci(interval: dict | None, fmt: Callable[[float], str]) -> str:
    if interval is None:
        return DASH
    return f"{fmt(interval['estimate'])} [{fmt(interval['lower'])}, {fmt(interval['upper'])}]"


def p_of(test: dict | None) -> str:
    return pv(test["p_two_sided"]) if test else DASH


def rule_text(rule: dict) -> str:
    return f"window {rule['window']}" if "window" in rule else f"threshold {rule['threshold']:g}"


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def section(results: dict, title: str, names: list[str], body: Callable[[dict], list[str]]) -> list[str]:
    """A titled part: body's lines if any of its evals ran, then a line per eval that did not."""
    codes = {e["step"]: e["exit_code"] for e in results["status"]}
    gone = [f"- `{n}`: {MISSING}" + (f" — `eval_{n}` exit {codes[f'eval_{n}']}" if f"eval_{n}" in codes else "")
            for n in names if results["evals"][n] is None]
    lines = body(results["evals"]) if len(gone) < len(names) else []
    second = [n for n in names if (results["evals"][n] or {}).get("training") == "second"]
    note = [f"Measured on the second training of the same configs (see \"Second training\"): "
            f"{', '.join(f'`{n}`' for n in second)}.", ""] if second else []
    return ["", f"## {title}", "", *note, *lines, *([""] if lines and gone else []), *gone]


def second_training_lines(results: dict) -> list[str]:
    """The second training's final losses beside the first's, and its steps."""
    second = results["second"]
    rows = []
    for b in BACKENDS:
        first, again = results["training"][b], second["training"][b]
        rows.append([NAME[b], f4(first and first["final_val_loss"]), f4(again and again["final_val_loss"]),
                     d4(again["final_val_loss"] - first["final_val_loss"]) if first and again else DASH,
                     f4(first and first["final_train_loss"]), f4(again and again["final_train_loss"])])
    status = [[e["step"], str(e["exit_code"]), str(e["seconds"])] for e in second["status"]]
    return table(["model", "final val loss (first)", "final val loss (second)", "second − first",
                  "train loss, last 5 (first)", "train loss, last 5 (second)"], rows) + [
        "", f"Evaluations taken from the second training: {', '.join(f'`{n}`' for n in second['evals']) or DASH}.",
        "", "Its steps (status.tsv of the second run):", "", *table(["step", "exit code", "seconds"], status)]


def fpa_side(evals: dict, task: str) -> dict | None:
    """FPA's numbers from its pairing with FoX, else with softmax (the same checkpoint, items and seed)."""
    return next((evals[f"{task}-fpa-{p}"] for p in PEERS if evals[f"{task}-fpa-{p}"]), None)


def three_way(evals: dict, task: str, rows: Callable[[dict], list[tuple]], key_head: str,
              cell: Callable[[object], str]) -> list[str]:
    """Rows (key, A, B, McNemar) of each pairing merged by key: FPA, FoX, softmax, then p of each pairing."""
    merged: dict = {}
    for peer in PEERS:
        for key, a, b, test in rows(evals[f"{task}-fpa-{peer}"]) if evals[f"{task}-fpa-{peer}"] else []:
            merged.setdefault(key, {"fpa": a})[peer] = (b, test)
    body = [[" ".join(map(str, k)) if isinstance(k, tuple) else str(k), cell(v["fpa"]),
             *(cell(v[p][0]) if p in v else DASH for p in PEERS), *(p_of(v[p][1]) if p in v else DASH for p in PEERS)]
            for k, v in merged.items()]
    return table([key_head, "FPA", "FoX", "softmax", "p FPA vs FoX", "p FPA vs softmax"], body)


def training_lines(results: dict) -> list[str]:
    runs = results["training"]
    long_tags = sorted({t for r in runs.values() if r and r["long_context"] for t in r["long_context"]["values"]
                        if t.startswith("summary/")})
    head = ["model", "steps", "tokens", "train loss (last 5)", "final val loss", "best val loss", "median tokens/s",
            "train seconds", "attention", *(f"long-context {t[len('summary/'):]}" for t in long_tags)]
    rows = []
    for b in BACKENDS:
        if (r := runs[b]) is None:
            rows.append([NAME[b], MISSING, *[DASH] * (len(head) - 2)])
            continue
        impls = ", ".join(f"{k} ×{n}" for k, n in Counter(r["attention_impls"] or []).items()) or DASH
        long_context = r["long_context"]["values"] if r["long_context"] else {}
        rows.append([NAME[b], str(r["steps"]), f"{r['tokens_seen']:,}", f4(r["final_train_loss"]),
                     f4(r["final_val_loss"]), f4(r["best_val_loss"]), number(",.0f")(r["median_tokens_per_s"]),
                     number("d")(r["train_seconds"]), impls, *(f4(long_context.get(t)) for t in long_tags)])
    return table(head, rows)


def heads_lines(results: dict) -> list[str]:
    heads = {b: results["training"][b]["heads"] if results["training"][b] else None for b in BACKENDS}
    names = sorted({n for h in heads.values() if h for n in h["values"]})
    if not names:
        return ["No `heads/summary/*` scalars in any run."]
    rows = [["step", *(str(heads[b]["step"]) if heads[b] else DASH for b in BACKENDS)]]
    for n in names:  # fractions get three decimals, head counts none
        fmt = f3 if "fraction" in n else number("g")
        rows.append([n, *(fmt(heads[b]["values"].get(n)) if heads[b] else DASH for b in BACKENDS)])
    return table(["statistic", *(NAME[b] for b in BACKENDS)], rows) + [
        "", "A model without an attention bias (softmax) has no head statistics."]


def test_loss_lines(evals: dict) -> list[str]:
    rows = [[f"FPA vs {NAME[p]}", ci(e["a"]["loss"], f4), ci(e["b"]["loss"], f4), ci(e.get("difference"), d4),
             number("g")(e.get("margin")), e.get("verdict", DASH), f"{e['sequences']} × {e['seq_len']}"]
            for p in PEERS if (e := evals[f"test_loss-fpa-{p}"])]
    return table(["comparison", "FPA loss", "peer loss", "FPA − peer", "margin", "verdict", "sequences"], rows)


def position_lines(evals: dict, context: int | None) -> list[str]:
    first, peers = fpa_side(evals, "pg19_long"), [evals[f"pg19_long-fpa-{p}"] for p in PEERS]
    rows = [[f"{lo}–{hi}", str(first["books_per_bucket"][k]), f4(first["a"]["loss"][k]["estimate"]),
             *(f4(e["b"]["loss"][k]["estimate"]) if e else DASH for e in peers),
             *(ci(e["difference"][k], d4) if e and e.get("difference") else DASH for e in peers)]
            for k, (lo, hi) in enumerate(first["buckets"])]
    return table(["positions", "books", "FPA", "FoX", "softmax", "FPA − FoX", "FPA − softmax"], rows) + [
        "", f"Training context: {context} tokens; the buckets past it measure extrapolation."]


def passkey_lines(evals: dict) -> list[str]:
    def rows(e: dict) -> list[tuple]:
        return [(x["length"], x["a"]["rate"], x["b"]["rate"], x["mcnemar"]) for x in e["lengths"]] + [
            ("all (pooled)", None, None, e["mcnemar_pooled"])]
    return three_way(evals, "passkey", rows, "length", lambda x: ci(x, f3))


def generated_lines(evals: dict, task: str) -> list[str]:
    """ruler, babilong: the average over tasks per length with its pooled interval, then each task."""
    def average(e: dict) -> list[tuple]:
        return [(a["length"], a["a"]["pooled_interval"], a["b"]["pooled_interval"], a["mcnemar"])
                for a in e["average"]]

    def per_task(e: dict) -> list[tuple]:
        return [((t["task"], t["length"]), t["a"]["score"], t["b"]["score"], t["mcnemar"]) for t in e["tasks"]]
    return (three_way(evals, task, average, "length", lambda x: ci(x, f3))
            + ["", "Per task (mean string-match score [CI]):", ""]
            + three_way(evals, task, per_task, "task length", lambda x: ci(x, f3)))


def prune_lines(evals: dict) -> list[str]:
    """FoX's rules are FPA's thresholds and softmax's the windows matched to FPA's kept fraction, in the same
    order (cache_prune builds them per threshold), so the i-th rule of each model shares a row."""
    first, peers = fpa_side(evals, "cache_prune"), [evals[f"cache_prune-fpa-{p}"] for p in PEERS]
    rows = []
    for k, entry in enumerate(first["lengths"]):
        for i, fpa in enumerate(entry["a"]["rules"]):
            fox, soft = (e["lengths"][k]["b"]["rules"][i] if e else None for e in peers)
            rows.append([str(entry["length"]), f"{fpa['rule']['threshold']:g}", f3(fpa["kept_fraction"]),
                         ci(fpa["increase"], d4), f3(fox and fox["kept_fraction"]), ci(fox and fox["increase"], d4),
                         str(soft["rule"]["window"]) if soft else DASH, f3(soft and soft["kept_fraction"]),
                         ci(soft and soft["increase"], d4)])
    lines = table(["length", "threshold", "FPA kept", "FPA Δloss", "FoX kept", "FoX Δloss", "softmax window",
                   "softmax kept", "softmax Δloss"], rows)

    def success(m: dict) -> str:
        return f"{ci(m['rate'], f3)}, kept {f3(m['kept_fraction'])} ({rule_text(m['rule'])})"
    if not first["passkey"]:
        return lines + ["", "Pass key under pruning: not run (`--passkey-lengths` given no lengths)."]
    rows = [[str(e["length"]), success(e["a"]), *(success(p["passkey"][k]["b"]) if p else DASH for p in peers)]
            for k, e in enumerate(first["passkey"])]
    return lines + ["", "Pass key under pruning (the first threshold; success rate [CI], kept fraction):", "",
                    *table(["length", "FPA", "FoX", "softmax"], rows)]


def eviction_lines(evals: dict) -> list[str]:
    rows = [[NAME[backend], str(entry["length"]), str(entry["documents"]), rule_text(r["rule"]),
             f4(entry[side]["unpruned_loss"]["estimate"]), f3(r["kept_fraction"]), f3(r["real_eviction"]["kept_fraction"]),
             ci(r["increase"], d4), ci(r["real_eviction"]["increase"], d4),
             f"{r['real_eviction']['max_abs_difference_from_simulation']:.1e}",
             f"{r['real_eviction']['cache_bytes']:,.0f}"]
            for entry in evals["cache_prune_real-fpa-fox"]["lengths"]
            for side, backend in (("a", "fpa"), ("b", "fox")) for r in entry[side]["rules"]]
    return table(["model", "length", "documents", "rule", "unpruned loss", "kept (simulated)", "kept (real)",
                  "Δloss (simulated)", "Δloss (real)", "max abs loss difference", "cache bytes"], rows)


def lm_eval_lines(evals: dict) -> list[str]:
    def value(m: dict) -> str:
        return f3(m["value"]) + (f" ± {f3(m['stderr'])}" if m.get("stderr") is not None else "")
    rows = [[t["task"], t["metric"], str(t["a"]["n"]), value(t["a"]), value(t["b"]), p_of(t["mcnemar"])]
            for t in evals["lm_eval-fpa-fox"]["tasks"]]
    return table(["task", "metric", "n", "FPA", "FoX", "McNemar p"], rows)


def generation_lines(evals: dict, width: int = 160) -> list[str]:
    ran = {b: evals[f"generate-{b}"] for b in BACKENDS if evals[f"generate-{b}"]}
    block = []
    for i, prompt in enumerate(next(iter(ran.values()))["prompts"]):
        block.append(f"prompt: {prompt}")
        for b, g in ran.items():
            text = g["continuations"][i].replace("\n", "⏎")  # one line per sample
            block.append(f"  {NAME[b]:<8} {text[:width]}{'…' if len(text) > width else ''}")
    rows = [[NAME[b], f"{g['ms_per_step']:.2f}", str(g["max_new_tokens"])] for b, g in ran.items()]
    return table(["model", "ms/step", "new tokens"], rows) + ["", "```text", *block, "```"]


def render(results: dict) -> str:
    """tables.md: every table of the study document, from results.json alone."""
    levels = sorted({e["header"]["confidence"] for e in results["evals"].values() if e})
    status = [[e["step"], str(e["exit_code"]), str(e["seconds"])] for e in results["status"]]

    def pairs(task: str) -> list[str]:
        return [f"{task}-fpa-{p}" for p in PEERS]
    return "\n".join([
        "<!-- Generated by benchmarks/lm_study_report.py from results.json: edit neither by hand (--check). -->", "",
        f"Intervals: the evals' own, at {', '.join(f'{c:.0%}' for c in levels) or DASH} (bootstrap for losses and "
        "scores, exact Clopper–Pearson for success rates); p: exact McNemar, two-sided. Differences are "
        "FPA − peer: negative favours FPA.",
        "", "## Training", "", *training_lines(results),
        *section(results, "Test loss", pairs("test_loss"), test_loss_lines),
        *section(results, "Loss by position (PG-19 books)", pairs("pg19_long"),
                 lambda ev: position_lines(ev, results["training_context"])),
        *section(results, "Pass key by length", pairs("passkey"), passkey_lines),
        *section(results, "RULER (average over tasks)", pairs("ruler"), lambda ev: generated_lines(ev, "ruler")),
        *section(results, "BABILong (average over tasks)", pairs("babilong"),
                 lambda ev: generated_lines(ev, "babilong")),
        *section(results, "Cache pruning (keys kept, loss change)", pairs("cache_prune"), prune_lines),
        *section(results, "Real eviction vs simulation", ["cache_prune_real-fpa-fox"], eviction_lines),
        "", "## Head observations (HeadSurvivalCallback, last step)", "", *heads_lines(results),
        *section(results, "lm-evaluation-harness", ["lm_eval-fpa-fox"], lm_eval_lines),
        *section(results, "Generation samples (greedy)", [f"generate-{b}" for b in BACKENDS], generation_lines),
        "", "## Status (status.tsv)", "", *table(["step", "exit code", "seconds"], status),
        *(["", "## Second training", "", *second_training_lines(results)] if results.get("second") else [])]) + "\n"


# --- figures ------------------------------------------------------------------------------------------------------

def series(evals: dict, task: str) -> list[tuple[str, dict, str]]:
    """(model, eval, side) for FPA (from its first pairing) and for each peer whose pairing ran."""
    first = fpa_side(evals, task)
    return ([("FPA", first, "a")] if first else []) + [
        (NAME[p], evals[f"{task}-fpa-{p}"], "b") for p in PEERS if evals[f"{task}-fpa-{p}"]]


def errorbars(ax: plt.Axes, x: list[float], intervals: list[dict], **kw) -> None:
    est = [iv["estimate"] for iv in intervals]
    err = [[iv["estimate"] - iv["lower"] for iv in intervals], [iv["upper"] - iv["estimate"] for iv in intervals]]
    ax.errorbar(x, est, yerr=err, capsize=3, **{"marker": "o", **kw})


def finish(fig: plt.Figure, axes: list[plt.Axes], empty: list[str], path: pathlib.Path) -> None:
    """A legend where something was drawn, else the reason nothing was; then the file."""
    for ax, why in zip(axes, empty):
        if ax.has_data():
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def plot_curves(results: dict, path: pathlib.Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, tag in zip(axes, ("train/loss", "val/loss")):
        for b in BACKENDS:
            if points := (results["training"][b]["curves"][tag] if results["training"][b] else []):
                ax.plot([t / 1e6 for t, _ in points], [v for _, v in points], color=COLOR[NAME[b]], label=NAME[b],
                        marker="o" if tag == "val/loss" else None)
        ax.set(xlabel="tokens seen (millions)", ylabel=f"{tag} (nats)", title=f"{tag} vs tokens")
    finish(fig, axes, ["no train/loss logged", "no val/loss logged"], path)


def plot_positions(results: dict, path: pathlib.Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, e, side in series(results["evals"], "pg19_long"):
        mids = [max(1.0, (lo + hi) / 2) for lo, hi in e["buckets"]]
        errorbars(ax, mids, e[side]["loss"], color=COLOR[name], label=name)
    if (ctx := results["training_context"]) and ax.has_data():
        ax.axvline(ctx, color="grey", ls=":", label=f"training context ({ctx})")
    ax.set(xscale="log", xlabel="position in the book (bucket middle, tokens)", ylabel="per-token loss (nats)",
           title="PG-19 loss by position (bootstrap CIs over books)")
    finish(fig, [ax], [f"pg19_long: {MISSING}"], path)


def plot_passkey(results: dict, path: pathlib.Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.set_xscale("log")  # first: setting the scale resets the ticks set below
    for name, e, side in series(results["evals"], "passkey"):
        lengths = [x["length"] for x in e["lengths"]]
        shift = 1.04 ** (list(COLOR).index(name) - 1)  # side by side, not on top of each other
        errorbars(ax, [n * shift for n in lengths], [x[side]["rate"] for x in e["lengths"]], color=COLOR[name],
                  label=name)
        ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.minorticks_off()
    ax.set(ylim=(-0.05, 1.05), xlabel="prompt length (tokens)", ylabel="greedy success rate",
           title="Pass-key retrieval (exact CIs)")
    finish(fig, [ax], [f"passkey: {MISSING}"], path)


def plot_pruning(results: dict, path: pathlib.Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, e, side in series(results["evals"], "cache_prune"):
        for k, entry in enumerate(e["lengths"]):
            rules = entry[side]["rules"]
            errorbars(ax, [r["kept_fraction"] for r in rules], [r["increase"] for r in rules], color=COLOR[name],
                      ls="none", marker="osD^v"[k % 5], label=f"{name} @ {entry['length']} tokens")
            for r in rules:
                tag = f"w{r['rule']['window']}" if "window" in r["rule"] else f"{r['rule']['threshold']:g}"
                ax.annotate(tag, (r["kept_fraction"], r["increase"]["estimate"]), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")
    if ax.has_data():
        ax.axhline(0, color="grey", lw=0.8)
    ax.set(xlabel="mean fraction of keys kept", ylabel="loss increase (nats)",
           title="Cache pruning: FPA/FoX thresholds, softmax windows")
    finish(fig, [ax], [f"cache_prune: {MISSING}"], path)


FIGURES = {"loss_curves.png": plot_curves, "loss_by_position.png": plot_positions, "passkey.png": plot_passkey,
           "keys_kept_vs_loss.png": plot_pruning}


# --- command line -------------------------------------------------------------------------------------------------

def check(folder: pathlib.Path, record: pathlib.Path) -> int:
    """0 when FOLDER/tables.md is exactly the tables rendered from RECORD, else print the difference and return 1."""
    want, have = render(json.loads(record.read_text())), (folder / "tables.md").read_text()
    if want == have:
        print(f"{folder}/tables.md matches {record}")
        return 0
    sys.stdout.writelines(difflib.unified_diff(have.splitlines(True), want.splitlines(True), "tables.md (committed)",
                                               f"tables.md (rendered from {record})"))
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="?", type=pathlib.Path, help="the RESULTS folder of lm_study.sh")
    parser.add_argument("--second", type=pathlib.Path, metavar="RESULTS2", help="a later RESULTS folder of the same "
                        "configs trained again: evaluations missing from RESULTS are taken from it, marked")
    parser.add_argument("--out", type=pathlib.Path, help="where tables.md and the figures go")
    parser.add_argument("--record", type=pathlib.Path, metavar="RECORD",
                        help="the JSON record of every quoted number (default: OUT/results.json)")
    parser.add_argument("--check", type=pathlib.Path, metavar="OUT",
                        help="only compare OUT/tables.md with the tables rendered from RECORD")
    args = parser.parse_args(argv)
    out = args.check or args.out
    record = args.record or (out / "results.json" if out else None)
    if args.check:
        return check(args.check, record)
    if args.results is None or args.out is None:
        parser.error("give RESULTS and --out OUT, or --check OUT")
    text = json.dumps(collect(args.results, args.second), sort_keys=True, indent=1) + "\n"
    results = json.loads(text)  # render what the file holds, exactly as --check will
    for folder in (args.out, record.parent):
        folder.mkdir(parents=True, exist_ok=True)
    record.write_text(text)
    (args.out / "tables.md").write_text(render(results))
    for name, draw in FIGURES.items():
        draw(results, args.out / name)
    print(f"wrote {record}, and in {args.out}: tables.md, {', '.join(FIGURES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
