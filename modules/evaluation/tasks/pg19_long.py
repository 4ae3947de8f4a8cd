"""pg19_long: per-token loss by position bucket on long test books, bootstrap intervals over books."""
from __future__ import annotations

import argparse

import matplotlib.pyplot as plt
import numpy as np
import torch

from fpa_lightning.analysis.positions import bucket_means
from fpa_lightning.evaluation.checkpoint import LoadedModel
from fpa_lightning.evaluation.data import EvalData, long_documents_and_works
from fpa_lightning.evaluation.scoring import Runtime, check_edges, check_vocab, power_of_two_edges, token_losses
from fpa_lightning.evaluation.seeds import LOWER_IS_BETTER
from modules.evaluation.progress import Progress, Work, start
from modules.evaluation.tasks.common import (Task, TaskOutput, document_clusters, errorbar, intervals, label, metric,
                                             per_item)


DEFAULT_MAX_LEN = 16384


def run(args: argparse.Namespace, models: list[LoadedModel], runtime: Runtime, data: EvalData) -> TaskOutput:
    max_len = args.max_len or DEFAULT_MAX_LEN
    edges = check_edges(args.buckets, max_len) if args.buckets else power_of_two_edges(max_len)
    return pg19_long(models, runtime, data, max_len, edges, args.min_tokens or max_len + 1, args.max_docs)


def pg19_long(models: list[LoadedModel], runtime: Runtime, data: EvalData, max_len: int, edges: list[int],
              min_tokens: int, max_docs: int | None) -> TaskOutput:
    """Per-token loss by position bucket on whole books (inputs of max_len tokens), books weighted equally,
    percentile bootstrap over books; with two models, the paired per-book difference per bucket."""
    docs, works = long_documents_and_works(data, max_len + 1, min_tokens, max_docs)
    doc_ids = [f"doc{j}" for j in range(len(docs))]
    cluster_by, clusters = document_clusters(works, doc_ids)
    for m in models:
        check_vocab(m.decoder, max(int(d.max()) for d in docs))
    sizes = [int(d.numel()) for d in docs]
    bar = start("pg19_long", [m.decoder for m in models], [Work(i, sizes) for i in range(len(models))],
                runtime.losses, unit="documents",
                shorten=f"fewer --max-docs (now {len(docs)}) or a shorter --max-len (now {max_len})")
    per_book = []  # per model (N books, K buckets)
    for i, m in enumerate(models):
        bar.set_stage("AB"[i])
        per_book.append(np.stack([_bucket_means(m, d, edges, runtime, bar, i) for d in docs]))
    bar.close()
    buckets = list(zip(edges, edges[1:]))
    results = {
        "documents": len(docs),
        "document_tokens": [int(d.numel()) for d in docs],
        "buckets": [list(b) for b in buckets],
        "books_per_bucket": (~np.isnan(per_book[0])).sum(axis=0).tolist(),
        "models": [{"label": label(m, i), "loss": [iv.as_dict() for iv in intervals(v, runtime)]}
                   for i, (m, v) in enumerate(zip(models, per_book))],
        "per_item": per_item("document", docs, cluster_by, [
            metric(f"loss/{a}-{b}", LOWER_IS_BETTER, doc_ids, [v[:, k] for v in per_book], clusters)
            for k, (a, b) in enumerate(buckets)]),
    }
    scalars = {f"pg19_long/{'AB'[i]}_loss/{a}-{b}": r["loss"][k]["estimate"]
               for i, r in enumerate(results["models"]) for k, (a, b) in enumerate(buckets)}
    if len(models) == 2:
        diff = intervals(per_book[0] - per_book[1], runtime)
        results["difference"] = [iv.as_dict() for iv in diff]
        scalars.update({f"pg19_long/difference/{a}-{b}": iv.estimate for (a, b), iv in zip(buckets, diff)})
    return TaskOutput(results, {"pg19_long": _plot_buckets(results, models[0].decoder.cfg.max_seq_len)}, scalars)


def _bucket_means(model: LoadedModel, doc: torch.Tensor, edges: list[int], runtime: Runtime, bar: Progress,
                  index: int) -> np.ndarray:
    """One book's mean loss per position bucket (K,), NaN where the book does not reach a bucket."""
    means = bucket_means(torch.from_numpy(token_losses(model.decoder, doc[None], runtime)[0]), edges).numpy()
    bar.advance(doc.numel(), index)
    return means


def _plot_buckets(results: dict, train_len: int) -> plt.Figure:
    n = 2 if "difference" in results else 1
    fig, axes = plt.subplots(1, n, figsize=(6 * n, 4), squeeze=False)
    mids = [max(1.0, (a + b) / 2) for a, b in results["buckets"]]
    for r in results["models"]:
        errorbar(axes[0, 0], mids, r["loss"], label=r["label"])
    axes[0, 0].set(xscale="log", xlabel="position (bucket middle)", ylabel="loss (nats)",
                   title=f"per-token loss by position ({results['documents']} documents)")
    for ax in axes[0]:
        ax.axvline(train_len, color="grey", ls=":", label="training context")
    axes[0, 0].legend()
    if n == 2:
        errorbar(axes[0, 1], mids, results["difference"], color="k")
        axes[0, 1].axhline(0, color="grey")
        confidence = results["difference"][0]["confidence"]
        axes[0, 1].set(xscale="log", xlabel="position (bucket middle)", ylabel="loss A − B (nats)",
                       title=f"paired difference ({confidence:.0%} bootstrap over documents)")
    fig.tight_layout()
    return fig


TASK = Task("per-token loss by position bucket on long test books, bootstrap CIs over books",
            frozenset({"max_len", "buckets", "min_tokens", "max_docs", "data"}), run, option_help={
                "max_len": f"pg19_long: tokens scored per book (default {DEFAULT_MAX_LEN})",
                "max_docs": "pg19_long: at most this many books (default: every book long enough)"})
