"""The evaluation tasks. Each takes the loaded checkpoint(s) (one, or two for a paired comparison A vs B)
and returns a TaskOutput: JSON-ready results, matplotlib figures and flat scalars for TensorBoard.

Differences are always A − B (A: --ckpt, B: --compare); for losses, negative means A is better.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt
import numpy as np
import torch

from fpa_lightning.evaluation import data as eval_data
from fpa_lightning.evaluation.checkpoint import LoadedModel
from fpa_lightning.evaluation.passkey import PasskeyBuilder, PasskeyTrial, score_trial
from fpa_lightning.evaluation.pruning import PruneRule, pruned_cache, window_for_fraction
from fpa_lightning.evaluation.scoring import Runtime, bucket_means, check_vocab, token_losses
from fpa_lightning.evaluation.stats import Interval, bootstrap_mean, clopper_pearson, mcnemar_exact, non_inferiority


@dataclass
class TaskOutput:
    results: dict
    figures: dict[str, plt.Figure] = field(default_factory=dict)
    scalars: dict[str, float] = field(default_factory=dict)


def label(model: LoadedModel, index: int) -> str:
    return f"{'AB'[index]}: {model.backend}"


def _intervals(values: np.ndarray, rt: Runtime) -> list[Interval]:
    return bootstrap_mean(values, rt.n_boot, rt.confidence, rt.seed)


def _mean_doc_loss(model: LoadedModel, doc, rt: Runtime) -> float:
    return float(token_losses(model.decoder, doc[None], rt).mean())


# --------------------------------------------------------------------------------------------- pg19_long


def pg19_long(models: list[LoadedModel], rt: Runtime, data: str | None, max_len: int, edges: list[int],
              min_tokens: int, max_docs: int | None) -> TaskOutput:
    """Per-token loss by position bucket on whole books (inputs of max_len tokens), books weighted equally,
    percentile bootstrap over books; with two models, the paired per-book difference per bucket."""
    docs = eval_data.long_documents(data, max_len + 1, min_tokens, max_docs)
    for m in models:
        check_vocab(m.decoder, max(int(d.max()) for d in docs))
    per_book = [np.stack([bucket_means(token_losses(m.decoder, d[None], rt)[0], edges) for d in docs])
                for m in models]  # each (N books, K buckets)
    buckets = list(zip(edges, edges[1:]))
    results = {
        "documents": len(docs),
        "document_tokens": [int(d.numel()) for d in docs],
        "buckets": [list(b) for b in buckets],
        "books_per_bucket": (~np.isnan(per_book[0])).sum(axis=0).tolist(),
        "models": [{"label": label(m, i), "loss": [iv.as_dict() for iv in _intervals(v, rt)]}
                   for i, (m, v) in enumerate(zip(models, per_book))],
    }
    scalars = {f"pg19_long/{'AB'[i]}_loss/{a}-{b}": r["loss"][k]["estimate"]
               for i, r in enumerate(results["models"]) for k, (a, b) in enumerate(buckets)}
    if len(models) == 2:
        diff = _intervals(per_book[0] - per_book[1], rt)
        results["difference"] = [iv.as_dict() for iv in diff]
        scalars.update({f"pg19_long/difference/{a}-{b}": iv.estimate for (a, b), iv in zip(buckets, diff)})
    return TaskOutput(results, {"pg19_long": _plot_buckets(results, models[0].decoder.cfg.max_seq_len)}, scalars)


def _errorbar(ax, x, intervals: list[dict], **kw) -> None:
    est = np.array([iv["estimate"] for iv in intervals])
    err = np.array([[iv["estimate"] - iv["lower"], iv["upper"] - iv["estimate"]] for iv in intervals]).T
    ax.errorbar(x, est, yerr=err, marker="o", capsize=3, **kw)


def _plot_buckets(results: dict, train_len: int) -> plt.Figure:
    n = 2 if "difference" in results else 1
    fig, axes = plt.subplots(1, n, figsize=(6 * n, 4), squeeze=False)
    mids = [max(1.0, (a + b) / 2) for a, b in results["buckets"]]
    for r in results["models"]:
        _errorbar(axes[0, 0], mids, r["loss"], label=r["label"])
    axes[0, 0].set(xscale="log", xlabel="position (bucket middle)", ylabel="loss (nats)",
                   title=f"per-token loss by position ({results['documents']} documents)")
    for ax in axes[0]:
        ax.axvline(train_len, color="grey", ls=":", label="training context")
    axes[0, 0].legend()
    if n == 2:
        _errorbar(axes[0, 1], mids, results["difference"], color="k")
        axes[0, 1].axhline(0, color="grey")
        confidence = results["difference"][0]["confidence"]
        axes[0, 1].set(xscale="log", xlabel="position (bucket middle)", ylabel="loss A − B (nats)",
                       title=f"paired difference ({confidence:.0%} bootstrap over documents)")
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------- passkey


def _score_all(model: LoadedModel, trials: list[PasskeyTrial], rt: Runtime) -> list:
    with rt.autocast():
        return [score_trial(model.decoder, t, rt.device) for t in trials]


def passkey(models: list[LoadedModel], rt: Runtime, lengths: list[int], n_trials: int) -> TaskOutput:
    """Greedy pass-key success per length with exact (Clopper–Pearson) intervals; with two models an exact
    McNemar test per length and over all lengths pooled."""
    tokenizer, bos = eval_data.tokenizer_and_bos()
    builder = PasskeyBuilder(tokenizer, bos)
    per_length, scalars, pooled = [], {}, [[] for _ in models]
    for length in lengths:
        trials = builder.trials(length, n_trials, rt.seed)
        for m in models:
            check_vocab(m.decoder, max(int(t.input_ids.max()) for t in trials))
        scores = [_score_all(m, trials, rt) for m in models]
        entry = {
            "length": length,
            "trials": [{"key": t.key, "depth": t.depth, "tokens": t.length} for t in trials],
            "models": [],
        }
        for i, (m, sc) in enumerate(zip(models, scores)):
            wins = [s.success for s in sc]
            pooled[i].extend(wins)
            interval = clopper_pearson(sum(wins), len(wins), rt.confidence)
            entry["models"].append({"label": label(m, i), "successes": sum(wins), "n": len(wins),
                                    "rate": interval.as_dict(), "success": wins,
                                    "mean_answer_nll": float(np.mean([s.answer_nll for s in sc]))})
            scalars[f"passkey/{'AB'[i]}_success_rate/{length}"] = interval.estimate
        if len(models) == 2:
            entry["mcnemar"] = mcnemar_exact(*[[s.success for s in sc] for sc in scores]).as_dict()
        per_length.append(entry)
    results = {"lengths": per_length, "trials_per_length": n_trials}
    if len(models) == 2:
        results["mcnemar_pooled"] = mcnemar_exact(*pooled).as_dict()
    return TaskOutput(results, {"passkey": _plot_passkey(results)}, scalars)


def _plot_passkey(results: dict) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(6, 4))
    lengths = [e["length"] for e in results["lengths"]]
    for i in range(len(results["lengths"][0]["models"])):
        rates = [e["models"][i]["rate"] for e in results["lengths"]]
        _errorbar(ax, lengths, rates, label=results["lengths"][0]["models"][i]["label"])
    ax.set(xscale="log", ylim=(-0.05, 1.05), xlabel="prompt length (tokens)", ylabel="greedy success rate",
           title=f"pass key ({results['trials_per_length']} trials per length, exact intervals)")
    ax.legend()
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------------- test_loss


def test_loss(models: list[LoadedModel], rt: Runtime, data: str | None, seq_len: int, batch_size: int,
              max_docs: int | None, margin: float) -> TaskOutput:
    """Mean loss over packed test sequences with a bootstrap interval over sequences; with two models the
    paired difference A − B and the non-inferiority verdict for ``margin`` (nats)."""
    per_seq = [[] for _ in models]
    for batch in eval_data.test_sequences(data, seq_len, batch_size, max_docs):
        ids = torch.cat([batch["input_ids"], batch["labels"][:, -1:]], dim=1)  # (B, seq_len + 1)
        for i, m in enumerate(models):
            check_vocab(m.decoder, int(ids.max()))
            per_seq[i].extend(token_losses(m.decoder, ids, rt).mean(axis=1))
    values = [np.array(v) for v in per_seq]  # each (N sequences,)
    results = {
        "sequences": len(values[0]),
        "seq_len": seq_len,
        "tokens": len(values[0]) * seq_len,
        "models": [{"label": label(m, i), "loss": _intervals(v, rt)[0].as_dict()}
                   for i, (m, v) in enumerate(zip(models, values))],
    }
    scalars = {f"test_loss/{'AB'[i]}": r["loss"]["estimate"] for i, r in enumerate(results["models"])}
    if len(models) == 2:
        diff = _intervals(values[0] - values[1], rt)[0]
        results["difference"] = diff.as_dict()
        results["margin"] = margin
        results["verdict"] = non_inferiority(diff, margin)
        scalars["test_loss/difference"] = diff.estimate
    return TaskOutput(results, {"test_loss": _plot_test_loss(results, values)}, scalars)


def _plot_test_loss(results: dict, values: list[np.ndarray]) -> plt.Figure:
    n = 2 if "difference" in results else 1
    fig, axes = plt.subplots(1, n, figsize=(6 * n, 4), squeeze=False)
    for r, v in zip(results["models"], values):
        axes[0, 0].hist(v, bins=30, alpha=0.6, label=f"{r['label']}: {r['loss']['estimate']:.4f}")
    axes[0, 0].set(xlabel="mean loss per sequence (nats)", ylabel="sequences",
                   title=f"test loss ({results['sequences']} sequences of {results['seq_len']})")
    axes[0, 0].legend()
    if n == 2:
        d = results["difference"]
        axes[0, 1].hist(values[0] - values[1], bins=30, color="grey")
        for x, style in ((d["lower"], "--"), (d["upper"], "--"), (results["margin"], "-")):
            axes[0, 1].axvline(x, color="r" if style == "-" else "k", ls=style)
        axes[0, 1].set(xlabel="loss A − B per sequence (nats)",
                       title=f"A − B = {d['estimate']:.4f} [{d['lower']:.4f}, {d['upper']:.4f}]: {results['verdict']}")
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------- cache_prune


def has_bias(model: LoadedModel) -> bool:
    return any(block.attn.gates.has_bias for block in model.decoder.blocks)


def _doc_losses(model: LoadedModel, docs: list, rt: Runtime) -> np.ndarray:
    """Mean loss per document, (N,)."""
    return np.array([_mean_doc_loss(model, d, rt) for d in docs])


def _rules(model: LoadedModel, thresholds: list[float], partner_fractions: list[float] | None,
           window: int | None, length: int) -> list[PruneRule]:
    """Threshold rules for a model with a bias; for one without, a sliding window: the given one, or per
    threshold the window whose mean kept fraction matches the partner model's."""
    if has_bias(model):
        return [PruneRule(threshold=t) for t in thresholds]
    if window is not None:
        return [PruneRule(window=window)]
    return [PruneRule(window=window_for_fraction(f, length)) for f in partner_fractions]


def check_prune_setup(models: list[LoadedModel], window: int | None) -> None:
    """Fail before any compute when a model without a bias has no window to compare with."""
    if window is None and not any(has_bias(m) for m in models):
        raise ValueError("cache_prune: a checkpoint without an attention bias (softmax) is pruned with a sliding "
                         "window; give --window, or --compare it with a checkpoint that has a bias (FPA, FoX) "
                         "to match that model's kept fraction")


def cache_prune(models: list[LoadedModel], rt: Runtime, data: str | None, lengths: list[int],
                thresholds: list[float], window: int | None, passkey_lengths: list[int], n_trials: int,
                max_docs: int | None) -> TaskOutput:
    """Loss increase from dropping keys whose bias fell below each threshold (bootstrap over documents, paired
    with the unpruned pass on the same chunked path) and the mean fraction of keys kept; softmax gets a
    sliding window of the same mean kept fraction. Then pass-key success with the first threshold."""
    check_prune_setup(models, window)
    order = sorted(range(len(models)), key=lambda i: not has_bias(models[i]))  # biased models first
    per_length, scalars = [], {}
    for length in lengths:
        docs = eval_data.long_documents(data, length + 1, length + 1, max_docs)
        entry = {"length": length, "documents": len(docs), "models": [None] * len(models)}
        fractions = None
        for i in order:
            m = models[i]
            check_vocab(m.decoder, max(int(d.max()) for d in docs))
            base = _doc_losses(m, docs, rt)  # the same chunked path, unpatched: pairs with each pruned pass
            rows = []
            for rule in _rules(m, thresholds, fractions, window, length):
                with pruned_cache(m.decoder, rule) as stats:
                    losses = _doc_losses(m, docs, rt)
                kept = stats.as_dict()
                rows.append({"rule": rule.describe(), "loss": _intervals(losses, rt)[0].as_dict(),
                             "increase": _intervals(losses - base, rt)[0].as_dict(), **kept})
                scalars[f"cache_prune/{'AB'[i]}_increase/{length}/{_rule_tag(rule)}"] = rows[-1]["increase"]["estimate"]
                scalars[f"cache_prune/{'AB'[i]}_kept/{length}/{_rule_tag(rule)}"] = kept["kept_fraction"]
            if has_bias(m) and fractions is None:
                fractions = [r["kept_fraction"] for r in rows]
            entry["models"][i] = {"label": label(m, i), "unpruned_loss": _intervals(base, rt)[0].as_dict(),
                                  "rules": rows}
        per_length.append(entry)
    results = {"lengths": per_length,
               "passkey": _pruned_passkey(models, order, rt, thresholds[0], window, passkey_lengths, n_trials)}
    for e in results["passkey"]:
        for i, r in enumerate(e["models"]):
            scalars[f"cache_prune/{'AB'[i]}_passkey/{e['length']}"] = r["rate"]["estimate"]
    return TaskOutput(results, {"cache_prune": _plot_prune(results)}, scalars)


def _rule_tag(rule: PruneRule) -> str:
    return f"threshold{rule.threshold:g}" if rule.window is None else f"window{rule.window}"


def _pruned_passkey(models: list[LoadedModel], order: list[int], rt: Runtime, threshold: float,
                    window: int | None, lengths: list[int], n_trials: int) -> list[dict]:
    """Pass-key success with the primary threshold (softmax: the window of the partner's kept fraction)."""
    if not lengths:
        return []
    tokenizer, bos = eval_data.tokenizer_and_bos()
    builder = PasskeyBuilder(tokenizer, bos)
    out = []
    for length in lengths:
        trials = builder.trials(length, n_trials, rt.seed)
        entry, fraction = {"length": length, "models": [None] * len(models)}, None
        for i in order:
            m = models[i]
            check_vocab(m.decoder, max(int(t.input_ids.max()) for t in trials))
            rule = _rules(m, [threshold], [fraction] if fraction is not None else None, window, length)[0]
            with pruned_cache(m.decoder, rule) as stats:
                wins = [s.success for s in _score_all(m, trials, rt)]
            kept = stats.as_dict()
            fraction = kept["kept_fraction"] if fraction is None and has_bias(m) else fraction
            entry["models"][i] = {"label": label(m, i), "rule": rule.describe(), "successes": sum(wins),
                                  "n": len(wins), "rate": clopper_pearson(sum(wins), len(wins), rt.confidence).as_dict(),
                                  "success": wins, **kept}
        out.append(entry)
    return out


def _plot_prune(results: dict) -> plt.Figure:
    n = len(results["lengths"])
    fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 4), squeeze=False)
    for ax, entry in zip(axes[0], results["lengths"]):
        for r in entry["models"]:
            rows = sorted(r["rules"], key=lambda row: row["kept_fraction"])  # a curve, whatever the sweep order
            kept = [row["kept_fraction"] for row in rows]
            _errorbar(ax, kept, [row["increase"] for row in rows], label=r["label"])
            for x, row in zip(kept, rows):
                ax.annotate(f"{next(iter(row['rule'].values())):g}", (x, row["increase"]["estimate"]),
                            fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.axhline(0, color="grey")
        ax.set(xlabel="mean fraction of keys kept", ylabel="loss increase (nats)",
               title=f"cache pruning at {entry['length']} tokens ({entry['documents']} docs)")
        ax.legend()
    fig.tight_layout()
    return fig
