"""passkey: greedy pass-key retrieval per prompt length, exact intervals, McNemar tests with --compare.

Default: the one-pass scorer (teacher forcing, ``fpa_lightning.evaluation.passkey``). With --prune-threshold (and
--window for a checkpoint without a bias) the answer is decoded greedily through the KV cache with real eviction
(``passkey.decode_trial``), and the mean kept fraction is reported."""
from __future__ import annotations

import argparse

import matplotlib.pyplot as plt
import numpy as np

from fpa_lightning.evaluation.checkpoint import LoadedModel
from fpa_lightning.evaluation.data import EvalData
from fpa_lightning.evaluation.passkey import PasskeyBuilder, PasskeyScore, PasskeyTrial, decode_trial, score_trial
from fpa_lightning.evaluation.scoring import Runtime, check_vocab
from fpa_lightning.evaluation.seeds import HIGHER_IS_BETTER
from fpa_lightning.evaluation.stats import clopper_pearson, mcnemar_exact
from fpa_lightning.generation.rule import PruneRule, check_rule, check_threshold
from modules.evaluation.progress import Progress, Work, start
from modules.evaluation.tasks.common import OWN_CLUSTERS, Task, TaskOutput, errorbar, label, metric, per_item

DEFAULT_LENGTHS = [3072, 4096, 8192, 16384]
DEFAULT_TRIALS = 100


def run(args: argparse.Namespace, models: list[LoadedModel], runtime: Runtime, data: EvalData) -> TaskOutput:
    rules = pruning_rules(models, args.prune_threshold, args.window)
    return passkey(models, runtime, data, args.lengths or DEFAULT_LENGTHS, args.trials or DEFAULT_TRIALS, rules)


def check(args: argparse.Namespace, models: list[LoadedModel]) -> None:
    pruning_rules(models, args.prune_threshold, args.window)


def pruning_rules(models: list[LoadedModel], threshold: float | None, window: int | None) -> list | None:
    """Per model, the rule of the pruned-cache mode (a threshold with a bias, a window without), or None for the
    default one-pass scorer; raises when a model is left without a rule, or when the cache cannot apply it
    (``generation.rule``: the threshold's check, then the model's)."""
    if threshold is None and window is None:
        return None
    check_threshold(threshold)
    rules = []
    for m in models:
        if m.decoder.has_bias() and threshold is not None:
            rules.append(PruneRule(threshold=threshold))
        elif window is not None:
            rules.append(PruneRule(window=window))
        else:
            raise ValueError(f"passkey: {m.path} has no attention bias; its pruned cache needs --window")
        check_rule(m.decoder, rules[-1])
    return rules


def score_all(model: LoadedModel, trials: list[PasskeyTrial], runtime: Runtime, bar: Progress | None = None,
              index: int = 0) -> list:
    scores = []
    with runtime.autocast():
        for t in trials:
            scores.append(score_trial(model.decoder, t, runtime.device))
            if bar is not None:
                bar.advance(t.length, index)
    return scores


def decode_all(model: LoadedModel, trials: list[PasskeyTrial], runtime: Runtime, rule: PruneRule, bar: Progress,
               index: int) -> list[dict]:
    """Each answer decoded through the KV cache under `rule` (``decode_trial``): success, and the cache's kept
    fraction and size at the end."""
    out = []
    for t in trials:
        with runtime.autocast():
            success, stats = decode_trial(model.decoder, t, rule)
        out.append({"success": success, "kept_fraction": stats["kept_fraction"], "cache_bytes": stats["cache_bytes"]})
        bar.advance(t.length, index)
    return out


def passkey(models: list[LoadedModel], runtime: Runtime, data: EvalData, lengths: list[int],
            n_trials: int, rules: list[PruneRule] | None = None) -> TaskOutput:
    """Greedy pass-key success per length with exact (Clopper–Pearson) intervals; with two models an exact
    McNemar test per length and over all lengths pooled. rules: per model, decode through the KV cache pruned by
    that rule instead of the one-pass scorer."""
    builder = PasskeyBuilder(data.tokenizer, data.bos_id)
    per_length, scalars, pooled, metrics = [], {}, [[] for _ in models], []
    trials_at = {length: builder.trials(length, n_trials, runtime.seed) for length in lengths}
    sizes = [t.length for trials in trials_at.values() for t in trials]  # every model scores every trial
    bar = start("passkey", [m.decoder for m in models], [Work(i, sizes) for i in range(len(models))],
                runtime.features, unit="prompts",
                shorten=f"fewer --trials (now {n_trials}) or shorter --lengths (now {' '.join(map(str, lengths))})")
    for length, trials in trials_at.items():
        for m in models:
            check_vocab(m.decoder, max(int(t.input_ids.max()) for t in trials))
        if rules is None:
            scores = []
            for i, m in enumerate(models):
                bar.set_stage(f"{length} {'AB'[i]}")
                scores.append(score_all(m, trials, runtime, bar, i))
        else:
            decoded = [decode_all(m, trials, runtime, rule, bar, i) for i, (m, rule) in enumerate(zip(models, rules))]
            scores = [[PasskeyScore(d["success"], float("nan")) for d in dec] for dec in decoded]
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
            if rules is not None:  # decoded: no teacher-forced likelihood, but the cache's kept fraction and size
                entry["models"][-1].update(rule=rules[i].describe(), mean_answer_nll=None,
                                           kept_fraction=float(np.mean([d["kept_fraction"] for d in decoded[i]])),
                                           cache_bytes=float(np.mean([d["cache_bytes"] for d in decoded[i]])))
                scalars[f"passkey/{'AB'[i]}_kept_fraction/{length}"] = entry["models"][-1]["kept_fraction"]
            scalars[f"passkey/{'AB'[i]}_success_rate/{length}"] = interval.estimate
        if len(models) == 2:
            entry["mcnemar"] = mcnemar_exact(*[[s.success for s in sc] for sc in scores]).as_dict()
        per_length.append(entry)
        metrics.append(metric(f"success/{length}", HIGHER_IS_BETTER, trial_ids(length, len(trials)),
                              [[s.success for s in sc] for sc in scores]))
    bar.close()
    results = {"lengths": per_length, "trials_per_length": n_trials,
               "scorer": "one pass (teacher forcing)" if rules is None else "greedy decoding, pruned KV cache"}
    results["per_item"] = per_item("trial", [t.input_ids for trials in trials_at.values() for t in trials],
                                   OWN_CLUSTERS, metrics)
    if len(models) == 2:
        results["mcnemar_pooled"] = mcnemar_exact(*pooled).as_dict()
    return TaskOutput(results, {"passkey": _plot_passkey(results)}, scalars)


def trial_ids(length: int, n: int) -> list[str]:
    """A trial's id: its length and index, which with --seed rebuild it (``PasskeyBuilder.trials``)."""
    return [f"{length}/{k}" for k in range(n)]


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
            frozenset({"lengths", "trials", "prune_threshold", "window"}), run, check=check, option_help={
                "lengths": f"passkey: prompt lengths (default {' '.join(map(str, DEFAULT_LENGTHS))})",
                "trials": f"passkey: trials per length (default {DEFAULT_TRIALS})",
                "prune_threshold": "passkey: decode each answer through the KV cache, evicting a cached key once its "
                                   "bias is below this (e.g. -10)",
                "window": "passkey: decode through a KV cache that keeps this sliding window: for a checkpoint "
                          "without a bias, or for every checkpoint without --prune-threshold"})
