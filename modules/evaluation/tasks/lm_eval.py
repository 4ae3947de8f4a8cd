"""lm_eval: downstream tasks through lm-evaluation-harness (``lm_eval.simple_evaluate``) with the checkpoint as an
``lm_eval`` model (evaluation.harness); with --compare, exact McNemar tests on the paired per-document accuracy.

Standard tasks (hellaswag, piqa, arc_easy, arc_challenge, winogrande, lambada_openai, ...) download their data
sets from the Hugging Face hub. Offline, a task defined by a local YAML over local JSON works: put the YAML in a
folder and pass ``--include-path FOLDER --tasks NAME`` (docs/evaluation.md).
"""
from __future__ import annotations

import argparse

import numpy as np

from fpa_lightning.evaluation.checkpoint import LoadedModel
from fpa_lightning.evaluation.data import EvalData
from fpa_lightning.evaluation.scoring import Runtime
from fpa_lightning.evaluation.stats import clopper_pearson, mcnemar_exact
from modules.evaluation.progress import Progress, Work
from modules.evaluation.tasks.common import Task, TaskOutput, label

PAPER_TASKS = ["hellaswag", "piqa", "arc_easy", "arc_challenge", "winogrande", "lambada_openai"]
BINARY_METRICS = ("acc", "acc_norm", "exact_match")  # per-document 0/1 metrics that get exact tests


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--tasks", nargs="+", metavar="NAME", help="lm_eval: harness task names (default: "
                       f"{' '.join(PAPER_TASKS)}, which need the hub or its cache)")
    group.add_argument("--include-path", metavar="DIR", help="lm_eval: folder of local task YAML files; this runs "
                       "Python from it: the harness imports the module a YAML's '!function module.name' names "
                       "(module.py beside the YAML), so give only a folder you trust")
    group.add_argument("--num-fewshot", type=int, help="lm_eval: few-shot examples (default: each task's own)")
    group.add_argument("--limit", type=float, help="lm_eval: documents per task (a fraction if < 1)")


def run(args: argparse.Namespace, models: list[LoadedModel], runtime: Runtime, data: EvalData) -> TaskOutput:
    return lm_eval_tasks(models, runtime, data, args.tasks or PAPER_TASKS, args.include_path, args.num_fewshot,
                         args.limit, args.batch_size or 1, args.max_len)


def lm_eval_tasks(models: list[LoadedModel], runtime: Runtime, data: EvalData, tasks: list[str],
                  include_path: str | None, num_fewshot: int | None, limit: float | None, batch_size: int,
                  max_length: int | None) -> TaskOutput:
    """Each model through ``simple_evaluate`` on the same documents; the harness's metrics per task, and with two
    models paired exact tests on every 0/1 metric."""
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError as err:
        raise ValueError(f"lm_eval needs lm-evaluation-harness: pip install -e \".[eval]\" ({err})") from err
    from fpa_lightning.evaluation.harness import DecoderLM

    manager = _task_manager(TaskManager, tasks, include_path)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise ValueError(f"unknown lm_eval tasks {unknown}" + ("" if include_path else
                         " (a local task needs --include-path FOLDER with its YAML)"))
    runs = []
    for i, m in enumerate(models):
        lm = DecoderLM(m.decoder, data.tokenizer, data.bos_id, data.eos_id, runtime, max_length, batch_size,
                       name="AB"[i], progress=progress_bar)
        try:
            runs.append(lm_eval.simple_evaluate(
                model=lm, tasks=tasks, num_fewshot=num_fewshot, limit=limit, task_manager=manager,
                log_samples=True, bootstrap_iters=min(runtime.n_boot, 1000), random_seed=runtime.seed,
                numpy_random_seed=runtime.seed, torch_random_seed=runtime.seed, fewshot_random_seed=runtime.seed))
        except ConnectionError as err:
            raise ConnectionError(f"{err}; offline, define a local task (--include-path FOLDER with a YAML over "
                                  "local JSON, docs/evaluation.md)") from err
    return _summarize(models, runtime, runs)


def progress_bar(label: str, sizes: list[int], unit: str) -> Progress:
    """The adapter's progress (``harness.ProgressFactory``): a bar over one batch of requests."""
    return Progress(label, [Work(0, sizes)], unit=unit)


def _task_manager(manager_class, tasks: list[str], include_path: str | None):
    """Indexing the harness's ~15,000 built-in task files takes 10-40 s: tasks that are all local skip it."""
    if include_path is not None:
        local = manager_class(include_path=include_path, include_defaults=False)
        if all(t in local.all_tasks for t in tasks):
            return local
    return manager_class(include_path=include_path)


def _per_document(run: dict, task: str, metric: str) -> dict[int, float]:
    return {s["doc_id"]: float(s[metric]) for s in run["samples"].get(task, []) if metric in s}


def _summarize(models: list[LoadedModel], runtime: Runtime, runs: list[dict]) -> TaskOutput:
    rows, scalars = [], {}
    for task in runs[0]["results"]:
        metrics = {k.split(",")[0]: v for k, v in runs[0]["results"][task].items()
                   if "," in k and not k.split(",")[0].endswith("_stderr")}
        for metric in metrics:
            row = {"task": task, "metric": metric, "models": []}
            for i, (m, r) in enumerate(zip(models, runs)):
                value = r["results"][task].get(f"{metric},none")
                entry = {"label": label(m, i), "value": value,
                         "stderr": r["results"][task].get(f"{metric}_stderr,none"),
                         "n": r.get("n-samples", {}).get(task, {}).get("effective")}
                docs = _per_document(r, task, metric) if metric in BINARY_METRICS else {}
                if docs:
                    hits = int(sum(docs.values()))
                    entry["exact_interval"] = clopper_pearson(hits, len(docs), runtime.confidence).as_dict()
                row["models"].append(entry)
                if isinstance(value, (int, float)):
                    scalars[f"lm_eval/{'AB'[i]}/{task}/{metric}"] = float(value)
            if len(runs) == 2 and metric in BINARY_METRICS:
                a, b = (_per_document(r, task, metric) for r in runs)
                shared = sorted(set(a) & set(b))
                if shared:
                    row["mcnemar"] = mcnemar_exact(np.array([a[d] for d in shared]) == 1,
                                                   np.array([b[d] for d in shared]) == 1).as_dict()
            rows.append(row)
    results = {"tasks": rows, "harness": {"versions": runs[0].get("versions"), "n-samples": runs[0].get("n-samples"),
                                          "config": {k: v for k, v in runs[0].get("config", {}).items()
                                                     if isinstance(v, (str, int, float, bool, type(None)))}}}
    return TaskOutput(results, {}, scalars, _table(rows))


def _table(rows: list[dict]) -> str:
    lines = [f"{'task':<24}{'metric':<16}" + "".join(f"{m['label']:>14}" for m in rows[0]["models"])
             + ("   McNemar p (A>B)" if "mcnemar" in rows[0] else "")] if rows else ["no results"]
    for r in rows:
        values = "".join(f"{m['value']:>14.4f}" if isinstance(m["value"], (int, float)) else f"{str(m['value']):>14}"
                         for m in r["models"])
        test = f"   {r['mcnemar']['p_a_better']:.3g}" if "mcnemar" in r else ""
        lines.append(f"{r['task']:<24}{r['metric']:<16}{values}{test}")
    return "\n".join(lines)


TASK = Task("lm-evaluation-harness tasks (simple_evaluate) with the checkpoint as the model; McNemar with --compare",
            frozenset({"tasks", "include_path", "num_fewshot", "limit", "batch_size", "max_len"}), run,
            add_arguments=add_arguments, option_help={
                "batch_size": "lm_eval: requests per forward pass (default 1)",
                "max_len": "lm_eval: the longest input in tokens; a longer one keeps its last tokens (default: the "
                           "model's training context)"})
