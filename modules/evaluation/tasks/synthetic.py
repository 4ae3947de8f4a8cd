"""What the generated-prompt tasks (ruler, babilong) share: scoring every item with every model, per-task statistics
and --compare tests, the summary table and the figure.

Per (task, length): RULER's string-match score (mean over items, bootstrap interval over items), the number of
items answered completely (every reference found) with an exact Clopper–Pearson interval, and with --compare an
exact McNemar test on the complete answers. Per length: the average over tasks (RULER's headline number) and a
pooled McNemar test.
"""
from __future__ import annotations

import sys
from collections.abc import Callable

import matplotlib.pyplot as plt
import numpy as np

from fpa_lightning.evaluation.answers import (ANSWER_SLACK, PieceEncoder, Prediction, PromptItem, predict,
                                              string_match_all)
from fpa_lightning.evaluation.checkpoint import LoadedModel
from fpa_lightning.evaluation.scoring import Runtime, check_vocab
from fpa_lightning.evaluation.seeds import HIGHER_IS_BETTER
from fpa_lightning.evaluation.stats import clopper_pearson, mcnemar_exact
from fpa_lightning.generation import generate
from modules.evaluation.progress import Work, start
from modules.evaluation.tasks.common import OWN_CLUSTERS, TaskOutput, intervals, label, metric, per_item

SCORING = (f"greedy generation through the KV cache, up to the canonical answer's length + {ANSWER_SLACK} tokens "
           "or EOS; RULER's string match (the fraction of references found, case-insensitive) on that text")

Group = tuple[str, int, list[PromptItem]]  # (task, length, items)
CALIBRATION_ANSWER_TOKENS = 32  # decoding steps timed per item for the estimate (answers take 1-40 tokens, + slack)


def run_generated(name: str, models: list[LoadedModel], runtime: Runtime, encoder: PieceEncoder, eos_id: int,
                  make_items: Callable[[str, int, int, int], list[PromptItem]], tasks: list[str], lengths: list[int],
                  n_items: int, tasks_option: str) -> TaskOutput:
    """Build ``make_items(task, length, n, seed)`` for every task and length, score them and summarise."""
    print(f"{name}: building {len(tasks) * len(lengths) * n_items} prompts ({len(tasks)} tasks, {len(lengths)} "
          f"lengths, {n_items} each)", file=sys.stderr, flush=True)
    groups = [(task, length, make_items(task, length, n_items, runtime.seed))
              for length in lengths for task in tasks]
    shorten = (f"fewer --trials (now {n_items}), --lengths (now {' '.join(map(str, lengths))}) or {tasks_option} "
               f"(now {len(tasks)})")
    predictions = score_groups(name, models, runtime, encoder, eos_id, groups, shorten)
    output = summarize(name, models, runtime, groups, predictions)
    output.results.update({"tasks_run": tasks, "lengths": lengths, "items_per_task": n_items})
    return output


def score_groups(name: str, models: list[LoadedModel], runtime: Runtime, encoder: PieceEncoder, eos_id: int,
                 groups: list[Group], shorten: str) -> list[list[list[Prediction]]]:
    """predictions[g][i]: model i's predictions on the items of group g, behind one progress bar."""
    for m in models:
        check_vocab(m.decoder, max(max(it.prompt + it.answer) for _, _, items in groups for it in items))
    sizes = [it.tokens for _, _, items in groups for it in items]
    def answer(decoder, ids):  # what one item costs: the prompt's prefill and a typical answer's decoding
        with runtime.autocast():
            return generate(decoder, ids, CALIBRATION_ANSWER_TOKENS)

    bar = start(name, [m.decoder for m in models], [Work(i, sizes) for i in range(len(models))], answer,
                shorten, unit="prompts")
    out = []
    for task, length, items in groups:
        per_model = []
        for i, m in enumerate(models):
            bar.set_stage(f"{task} {length} {'AB'[i]}")
            predictions = []
            with runtime.autocast():
                for it in items:
                    predictions.append(predict(m.decoder, it, encoder, eos_id))
                    bar.advance(it.tokens, i)
            per_model.append(predictions)
        out.append(per_model)
    bar.close()
    return out


def summarize(name: str, models: list[LoadedModel], runtime: Runtime, groups: list[Group],
              predictions: list[list[list[Prediction]]]) -> TaskOutput:
    """Results, scalars, table and figure (see the module doc)."""
    rows, scalars = [], {}
    for (task, length, items), per_model in zip(groups, predictions):
        scores = [np.array([string_match_all(p.text, it.references) for p, it in zip(preds, items)])
                  for preds in per_model]  # per model (N,)
        row = {"task": task, "length": length,
               "items": [{"tokens": it.tokens, "references": list(it.references), **it.meta} for it in items],
               "models": []}
        for i, (m, s, preds) in enumerate(zip(models, scores, per_model)):
            complete = int((s == 1.0).sum())
            row["models"].append({
                "label": label(m, i), "score": intervals(s, runtime)[0].as_dict(),
                "complete": complete, "n": len(s),
                "complete_rate": clopper_pearson(complete, len(s), runtime.confidence).as_dict(),
                "scores": s.tolist(), "predictions": [p.text for p in preds],
            })
            scalars[f"{name}/{'AB'[i]}/{task}/{length}"] = float(s.mean())
        if len(models) == 2:
            row["mcnemar"] = mcnemar_exact(scores[0] == 1.0, scores[1] == 1.0).as_dict()
            row["score_difference"] = intervals(scores[0] - scores[1], runtime)[0].as_dict()
        rows.append(row)
    averages = _averages(name, models, runtime, rows, scalars)
    results = {"scoring": SCORING, "tasks": rows, "average": averages,
               "per_item": per_item("item", [it.prompt + it.answer for _, _, items in groups for it in items],
                                    OWN_CLUSTERS, _item_metrics(rows))}
    return TaskOutput(results, {name: _plot(name, rows, averages)}, scalars, table(rows, averages))


def item_ids(task: str, length: int, n: int) -> list[str]:
    """An item's id: task, length and index, which with --seed rebuild it (the builders' ``items``)."""
    return [f"{task}/{length}/{k}" for k in range(n)]


def _item_metrics(rows: list[dict]) -> list[dict]:
    """Per (task, length) the string-match score of every item; per length the average over tasks, whose items are
    the tasks' items pooled (every task has as many)."""
    metrics = [metric(f"score/{r['task']}/{r['length']}", HIGHER_IS_BETTER, item_ids(r["task"], r["length"],
                      len(r["items"])), [m["scores"] for m in r["models"]]) for r in rows]
    for length in dict.fromkeys(r["length"] for r in rows):
        at = [r for r in rows if r["length"] == length]
        metrics.append(metric(f"score/average/{length}", HIGHER_IS_BETTER,
                              [i for r in at for i in item_ids(r["task"], length, len(r["items"]))],
                              [[s for r in at for s in r["models"][i]["scores"]] for i in range(len(at[0]["models"]))]))
    return metrics


def _averages(name: str, models: list[LoadedModel], runtime: Runtime, rows: list[dict], scalars: dict) -> list[dict]:
    """Per length: the mean score over tasks (every task has the same number of items, so this is also the mean
    over pooled items, whose bootstrap gives the interval) and a McNemar test on all complete answers pooled."""
    out = []
    for length in dict.fromkeys(r["length"] for r in rows):
        at = [r for r in rows if r["length"] == length]
        pooled = [np.concatenate([r["models"][i]["scores"] for r in at]) for i in range(len(models))]
        entry = {"length": length, "tasks": len(at),
                 "models": [{"label": label(m, i), "score": float(np.mean([r["models"][i]["score"]["estimate"]
                                                                          for r in at])),
                             "pooled_interval": intervals(p, runtime)[0].as_dict()}
                            for i, (m, p) in enumerate(zip(models, pooled))]}
        for i in range(len(models)):
            scalars[f"{name}/{'AB'[i]}_score/{length}"] = entry["models"][i]["score"]
        if len(models) == 2:
            entry["mcnemar_pooled"] = mcnemar_exact(pooled[0] == 1.0, pooled[1] == 1.0).as_dict()
        out.append(entry)
    return out


def table(rows: list[dict], averages: list[dict]) -> str:
    """Score per task (rows) and length (columns), "A / B" with two models, then the average."""
    lengths = [a["length"] for a in averages]
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    cell = {(r["task"], r["length"]): " / ".join(f"{m['score']['estimate']:.3f}" for m in r["models"]) for r in rows}
    width = max(len(c) for c in cell.values())
    head = f"{'task':<16}" + "".join(f"{n:>{width + 2}}" for n in lengths)
    lines = [head] + [f"{t:<16}" + "".join(f"{cell.get((t, n), '-'):>{width + 2}}" for n in lengths) for t in tasks]
    average = [" / ".join(f"{m['score']:.3f}" for m in a["models"]) for a in averages]
    lines.append(f"{'average':<16}" + "".join(f"{c:>{width + 2}}" for c in average))
    if "mcnemar_pooled" in averages[0]:
        lines.append(f"{'McNemar p (A>B)':<16}" + "".join(f"{a['mcnemar_pooled']['p_a_better']:>{width + 2}.3g}"
                                                          for a in averages))
    labels = " / ".join(m["label"] for m in averages[0]["models"])
    return f"string-match score ({labels}):\n" + "\n".join(lines)


def _plot(name: str, rows: list[dict], averages: list[dict]) -> plt.Figure:
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    lengths = [a["length"] for a in averages]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4), gridspec_kw={"width_ratios": [1, 2.5]})
    for i, model in enumerate(averages[0]["models"]):
        axes[0].plot(lengths, [a["models"][i]["score"] for a in averages], marker="o", label=model["label"])
    axes[0].set(xscale="log", ylim=(-0.05, 1.05), xlabel="length (tokens)", ylabel="mean string-match score",
                title=f"{name}: average over {len(tasks)} tasks")
    axes[0].legend()
    n_series = len(averages[0]["models"]) * len(lengths)
    for s, (i, length) in enumerate((i, n) for i in range(len(averages[0]["models"])) for n in lengths):
        by_task = {r["task"]: r["models"][i]["score"]["estimate"] for r in rows if r["length"] == length}
        x = np.arange(len(tasks)) + (s - (n_series - 1) / 2) * 0.8 / n_series
        axes[1].bar(x, [by_task.get(t, np.nan) for t in tasks], width=0.8 / n_series,
                    label=f"{averages[0]['models'][i]['label']} @ {length}")
    axes[1].set_xticks(range(len(tasks)), tasks, rotation=30, ha="right")
    axes[1].set(ylim=(0, 1.05), ylabel="string-match score", title="per task")
    axes[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig
