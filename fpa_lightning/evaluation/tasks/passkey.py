"""passkey: greedy pass-key retrieval per prompt length, exact intervals, McNemar tests with --compare."""
from __future__ import annotations

import argparse

import matplotlib.pyplot as plt
import numpy as np

from fpa_lightning.evaluation.checkpoint import LoadedModel
from fpa_lightning.evaluation.data import EvalData
from fpa_lightning.evaluation.passkey import PasskeyBuilder, PasskeyTrial, score_trial
from fpa_lightning.evaluation.progress import Progress, Work, start
from fpa_lightning.evaluation.scoring import Runtime, check_vocab
from fpa_lightning.evaluation.stats import clopper_pearson, mcnemar_exact
from fpa_lightning.evaluation.tasks.common import Task, TaskOutput, errorbar, label

DEFAULT_LENGTHS = [3072, 4096, 8192, 16384]


def run(args: argparse.Namespace, models: list[LoadedModel], runtime: Runtime, data: EvalData) -> TaskOutput:
    return passkey(models, runtime, data, args.lengths or DEFAULT_LENGTHS, args.trials or 100)


def score_all(model: LoadedModel, trials: list[PasskeyTrial], runtime: Runtime, bar: Progress | None = None,
              index: int = 0) -> list:
    scores = []
    with runtime.autocast():
        for t in trials:
            scores.append(score_trial(model.decoder, t, runtime.device))
            if bar is not None:
                bar.advance(t.length, index)
    return scores


def passkey(models: list[LoadedModel], runtime: Runtime, data: EvalData, lengths: list[int],
            n_trials: int) -> TaskOutput:
    """Greedy pass-key success per length with exact (Clopper–Pearson) intervals; with two models an exact
    McNemar test per length and over all lengths pooled."""
    builder = PasskeyBuilder(data.tokenizer, data.bos_id)
    per_length, scalars, pooled = [], {}, [[] for _ in models]
    trials_at = {length: builder.trials(length, n_trials, runtime.seed) for length in lengths}
    sizes = [t.length for trials in trials_at.values() for t in trials]  # every model scores every trial
    bar = start("passkey", [m.decoder for m in models], [Work(i, sizes) for i in range(len(models))],
                runtime.features, unit="prompts",
                shorten=f"fewer --trials (now {n_trials}) or shorter --lengths (now {' '.join(map(str, lengths))})")
    for length, trials in trials_at.items():
        for m in models:
            check_vocab(m.decoder, max(int(t.input_ids.max()) for t in trials))
        scores = []
        for i, m in enumerate(models):
            bar.set_stage(f"{length} {'AB'[i]}")
            scores.append(score_all(m, trials, runtime, bar, i))
        entry = {
            "length": length,
            "trials": [{"key": t.key, "depth": t.depth, "tokens": t.length} for t in trials],
            "models": [],
        }
        for i, (m, sc) in enumerate(zip(models, scores)):
            wins = [s.success for s in sc]
            pooled[i].extend(wins)
            interval = clopper_pearson(sum(wins), len(wins), runtime.confidence)
            entry["models"].append({"label": label(m, i), "successes": sum(wins), "n": len(wins),
                                    "rate": interval.as_dict(), "success": wins,
                                    "mean_answer_nll": float(np.mean([s.answer_nll for s in sc]))})
            scalars[f"passkey/{'AB'[i]}_success_rate/{length}"] = interval.estimate
        if len(models) == 2:
            entry["mcnemar"] = mcnemar_exact(*[[s.success for s in sc] for sc in scores]).as_dict()
        per_length.append(entry)
    bar.close()
    results = {"lengths": per_length, "trials_per_length": n_trials}
    if len(models) == 2:
        results["mcnemar_pooled"] = mcnemar_exact(*pooled).as_dict()
    return TaskOutput(results, {"passkey": _plot_passkey(results)}, scalars)


def _plot_passkey(results: dict) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(6, 4))
    lengths = [e["length"] for e in results["lengths"]]
    for i in range(len(results["lengths"][0]["models"])):
        rates = [e["models"][i]["rate"] for e in results["lengths"]]
        errorbar(ax, lengths, rates, label=results["lengths"][0]["models"][i]["label"])
    ax.set(xscale="log", ylim=(-0.05, 1.05), xlabel="prompt length (tokens)", ylabel="greedy success rate",
           title=f"pass key ({results['trials_per_length']} trials per length, exact intervals)")
    ax.legend()
    fig.tight_layout()
    return fig


TASK = Task("greedy pass-key retrieval per prompt length, exact binomial CIs, McNemar test with --compare",
            frozenset({"lengths", "trials"}), run)
