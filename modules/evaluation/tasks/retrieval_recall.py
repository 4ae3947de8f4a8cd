"""retrieval_recall: do the models recall the facts of the train mixture's synthetic retrieval documents, in
distribution, and how does recall fall with distance, also past the training length?

Per length L of --lengths (default: the checkpoint's training length), --trials held-out documents made as the train
mixture makes them for a training length L (``EvalData.retrieval_documents``: at most L tokens, recalls up to L tokens
after their facts, filler prose from the *validation* split, seeds no train stream uses). Every asked fact is an item,
scored teacher-forced in one forward pass per document (``fpa_lightning.evaluation.recall``): exact (greedy decoding
would return the value) and the value's summed NLL, and both again in the baseline, the document without its fact
sentences, where the value cannot be retrieved: the model's prior for it (a colour is one of 14). Items are bucketed
by distance (tokens from the fact's first token to its recall's end) in powers of two and by fact kind; per length and
bucket: n, the exact rate with a Clopper–Pearson interval, the mean value NLL, and the baseline's. --compare: the same
documents through B, an exact McNemar test on exact recall per length and pooled.

Distances follow --distance-law: log_uniform by default (as many per factor of two, so every bucket is filled); the
training documents' law is uniform (configs/study/retrieval_base.yaml), which leaves the short buckets nearly empty
at long lengths. The documents' format, facts and length range are the training documents'.
"""
from __future__ import annotations

import argparse
import sys

import matplotlib.pyplot as plt
import numpy as np

from fpa_lightning.evaluation.checkpoint import LoadedModel
from fpa_lightning.evaluation.data import EvalData
from fpa_lightning.evaluation.recall import RecallDocument, recall_document, score_values
from fpa_lightning.evaluation.scoring import Runtime, check_vocab
from fpa_lightning.evaluation.seeds import HIGHER_IS_BETTER, LOWER_IS_BETTER
from fpa_lightning.evaluation.stats import clopper_pearson, mcnemar_exact
from modules.evaluation.progress import Progress, Work, start
from modules.evaluation.tasks.common import Task, TaskOutput, errorbar, label, metric, per_item

DEFAULT_TRIALS = 100
DEFAULT_LAW = "log_uniform"
DISTANCE_LAWS = ("uniform", "log_uniform")  # datamodules.retrieval_synth.DISTANCE_LAWS (a test checks they agree)
CLUSTERS = "document (the facts of one document are resampled together)"
SCORING = ("teacher forcing, one pass per document: exact = every value token is the argmax (greedy decoding returns "
           "the value); nll = the value tokens' summed NLL in nats")
BASELINE = "the same document without its fact sentences: the value cannot be retrieved (the model's prior for it)"


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--distance-law", choices=DISTANCE_LAWS,
                       help=f"retrieval_recall: how distances are drawn (default {DEFAULT_LAW}: as many per factor of "
                            "two; uniform: the training documents' law)")


def run(args: argparse.Namespace, models: list[LoadedModel], runtime: Runtime, data: EvalData) -> TaskOutput:
    trained_on = (models[0].training.get("datamodule_hyper_parameters") or {}).get("source")
    if args.data is None and trained_on not in (None, "offline"):
        print(f"retrieval_recall: the filler is the offline corpus's prose; {models[0].path} was trained on "
              f"{trained_on}: --data {trained_on} fills the documents with its validation prose (in distribution)",
              file=sys.stderr, flush=True)
    return retrieval_recall(models, runtime, data, args.lengths or [models[0].decoder.cfg.max_seq_len],
                            args.trials or DEFAULT_TRIALS, args.distance_law or DEFAULT_LAW)


def retrieval_recall(models: list[LoadedModel], runtime: Runtime, data: EvalData, lengths: list[int], n_docs: int,
                     law: str) -> TaskOutput:
    """Every model on n_docs documents per length (module doc): per-item records, summaries, table and figure."""
    docs = {length: [recall_document(data.tokenizer, data.bos_id, data.eos_id, d.text, d.facts)
                     for d in data.retrieval_documents(length, n_docs, runtime.seed, law)] for length in lengths}
    every = [d for ds in docs.values() for d in ds]
    described = data.describe()
    print(f"retrieval_recall: {len(every)} documents, {sum(len(d.items) for d in every)} asked facts; filler: "
          f"{described['filler']['sentences']} prose sentences of the {described['split']} split",
          file=sys.stderr, flush=True)
    for m in models:
        check_vocab(m.decoder, max(int(d.input_ids.max()) for d in every))
    sizes = [n for d in every for n in (d.input_ids.numel(), d.baseline_ids.numel())]  # two passes per document
    bar = start("retrieval_recall", [m.decoder for m in models], [Work(i, sizes) for i in range(len(models))],
                runtime.features, unit="passes",
                shorten=f"fewer --trials (now {n_docs}) or shorter --lengths (now {' '.join(map(str, lengths))})")
    records = []
    for length, ds in docs.items():
        scores = []  # per model, per document, per item: (exact, nll, baseline exact, baseline nll)
        for i, m in enumerate(models):
            bar.set_stage(f"{length} {'AB'[i]}")
            scores.append([_score(m, d, runtime, bar, i) for d in ds])
        records += _records(length, ds, scores)
    bar.close()
    train_len = models[0].decoder.cfg.max_seq_len
    results = {"scoring": SCORING, "baseline": BASELINE, "distance_law": law, "documents_per_length": n_docs,
               "training_length": train_len, "lengths": [], "items": records}
    scalars = {}
    for length in lengths:
        at = [r for r in records if r["length"] == length]
        entry = {"length": length, "beyond_training": length > train_len, "documents": len(docs[length]),
                 "items": len(at), "models": [_model_summary(m, i, at, runtime.confidence, scalars)
                                              for i, m in enumerate(models)]}
        if len(models) == 2:
            entry["mcnemar"] = mcnemar_exact(*_column(at, "exact")).as_dict()
        results["lengths"].append(entry)
    if len(models) == 2:
        results["mcnemar_pooled"] = mcnemar_exact(*_column(records, "exact")).as_dict()
    results["per_item"] = per_item("fact", [d.input_ids for d in every], CLUSTERS, _item_metrics(lengths, records))
    return TaskOutput(results, {"retrieval_recall": _plot(results)}, scalars, table(results))


def _score(model: LoadedModel, doc: RecallDocument, runtime: Runtime, bar: Progress,
           index: int) -> list[tuple[bool, float, bool, float]]:
    """Each item's (exact, nll) in the document and in its baseline: two forward passes."""
    with runtime.autocast():
        found = score_values(model.decoder, doc.input_ids, [it.span for it in doc.items], runtime.device)
        bar.advance(doc.input_ids.numel(), index)
        prior = score_values(model.decoder, doc.baseline_ids, [it.baseline_span for it in doc.items], runtime.device)
        bar.advance(doc.baseline_ids.numel(), index)
    return [(*f, *p) for f, p in zip(found, prior)]


def _records(length: int, docs: list[RecallDocument], scores: list) -> list[dict]:
    """One record per item: what it asks, where, and each model's numbers (lists over models)."""
    out = []
    for k, doc in enumerate(docs):
        for j, it in enumerate(doc.items):
            exact, nll, base_exact, base_nll = (list(v) for v in zip(*(s[k][j] for s in scores)))
            out.append({"id": f"{length}/{k}/{j}", "length": length, "document": k, "kind": it.kind, "key": it.key,
                        "value": it.value, "distance": it.distance, "bucket": bucket(it.distance),
                        "value_tokens": it.span[1] - it.span[0], "exact": exact, "nll": nll,
                        "baseline_exact": base_exact, "baseline_nll": base_nll})
    return out


def bucket(distance: int) -> list[int]:
    """The power-of-two bucket [2^k, 2^(k+1)) of a distance in tokens."""
    low = 1 << (distance.bit_length() - 1)
    return [low, 2 * low]


def _column(records: list[dict], name: str) -> list[list]:
    """records' values of `name`, per model: (models, items)."""
    return [list(v) for v in zip(*(r[name] for r in records))]


def _summary(records: list[dict], i: int, confidence: float) -> dict:
    """Model i on `records`: n, exact rate (Clopper–Pearson), mean value NLL, and the baseline's."""
    n = len(records)
    return {"n": n,
            "exact": clopper_pearson(sum(r["exact"][i] for r in records), n, confidence).as_dict(),
            "nll": float(np.mean([r["nll"][i] for r in records])),
            "baseline_exact": clopper_pearson(sum(r["baseline_exact"][i] for r in records), n, confidence).as_dict(),
            "baseline_nll": float(np.mean([r["baseline_nll"][i] for r in records]))}


def _model_summary(model: LoadedModel, i: int, at: list[dict], confidence: float, scalars: dict) -> dict:
    """Model i at one length: all items, per distance bucket and per fact kind; its scalars go into `scalars`."""
    buckets = sorted({tuple(r["bucket"]) for r in at})
    out = {"label": label(model, i), "all": _summary(at, i, confidence),
           "buckets": [{"distance": list(b), **_summary([r for r in at if tuple(r["bucket"]) == b], i, confidence)}
                       for b in buckets],
           "kinds": [{"kind": k, **_summary([r for r in at if r["kind"] == k], i, confidence)}
                     for k in sorted({r["kind"] for r in at})]}
    tag = f"retrieval_recall/{'AB'[i]}"
    length = at[0]["length"]
    scalars[f"{tag}_exact/{length}"] = out["all"]["exact"]["estimate"]
    scalars[f"{tag}_nll/{length}"] = out["all"]["nll"]
    scalars[f"{tag}_baseline_nll/{length}"] = out["all"]["baseline_nll"]
    for b in out["buckets"]:
        scalars[f"{tag}_exact/{length}/{b['distance'][0]}-{b['distance'][1]}"] = b["exact"]["estimate"]
    return out


def _item_metrics(lengths: list[int], records: list[dict]) -> list[dict]:
    """Per length, each item's exact recall and value NLL, clustered by document."""
    metrics = []
    for length in lengths:
        at = [r for r in records if r["length"] == length]
        ids, clusters = [r["id"] for r in at], [f"{length}/{r['document']}" for r in at]
        metrics.append(metric(f"exact/{length}", HIGHER_IS_BETTER, ids, _column(at, "exact"), clusters))
        metrics.append(metric(f"nll/{length}", LOWER_IS_BETTER, ids, _column(at, "nll"), clusters))
    return metrics


def table(results: dict) -> str:
    """Per model, length and distance bucket (then all): n, exact rate and interval, value NLL, the baseline's."""
    lines = [f"retrieval recall: {results['scoring']}; base: {results['baseline']}"]
    head = (f"{'length':>7}  {'distance':<12}{'n':>5}  {'exact':>6}  {'interval':<17}{'nll':>7}  {'base exact':>10}"
            f"  {'base nll':>8}")
    for i, model in enumerate(results["lengths"][0]["models"]):
        lines += [f"{model['label']}:", head]
        for e in results["lengths"]:
            m = e["models"][i]
            name = f"{e['length']}{'*' if e['beyond_training'] else ''}"
            for row in [*m["buckets"], {"distance": None, **m["all"]}]:
                where = "all" if row["distance"] is None else "{}-{}".format(*row["distance"])
                ex = row["exact"]
                interval = f"[{ex['lower']:.3f}, {ex['upper']:.3f}]"
                lines.append(f"{name:>7}  {where:<12}{row['n']:>5}  {ex['estimate']:>6.3f}  {interval:<17}"
                             f"{row['nll']:>7.2f}  {row['baseline_exact']['estimate']:>10.3f}  "
                             f"{row['baseline_nll']:>8.2f}")
            kinds = ", ".join(f"{k['kind']} {k['exact']['estimate']:.3f} ({k['n']})" for k in m["kinds"])
            lines.append(f"{'':>7}  exact by kind: {kinds}")
    if any(e["beyond_training"] for e in results["lengths"]):
        lines.append(f"* beyond the training length ({results['training_length']} tokens)")
    if "mcnemar_pooled" in results:
        per = ", ".join(f"{e['length']} {e['mcnemar']['p_a_better']:.3g}" for e in results["lengths"])
        lines.append(f"McNemar p (A recalls more often): {per}; pooled {results['mcnemar_pooled']['p_a_better']:.3g}")
    return "\n".join(lines)


def _plot(results: dict) -> plt.Figure:
    """Exact rate (left) and value NLL (right) by distance bucket, one colour per model and length; dashed: the
    baseline (fact sentences removed)."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    series = [(e, m) for e in results["lengths"] for m in e["models"]]
    for s, (e, m) in enumerate(series):
        x = [b["distance"][0] for b in m["buckets"]]
        colour = f"C{s % 10}"
        errorbar(axes[0], x, [b["exact"] for b in m["buckets"]], color=colour, label=f"{m['label']} @ {e['length']}")
        axes[0].plot(x, [b["baseline_exact"]["estimate"] for b in m["buckets"]], ls="--", color=colour)
        axes[1].plot(x, [b["nll"] for b in m["buckets"]], marker="o", color=colour)
        axes[1].plot(x, [b["baseline_nll"] for b in m["buckets"]], ls="--", color=colour)
    for ax in axes:
        ax.axvline(results["training_length"], color="grey", ls=":", label="training length")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("distance from fact to recall end (tokens, bucket start)")
    axes[0].set(ylim=(-0.05, 1.05), ylabel="exact recall (greedy value)",
                title=f"retrieval recall ({results['documents_per_length']} documents per length)")
    axes[1].set(ylabel="value NLL (nats, summed)", title="dashed: baseline without the fact sentences")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


TASK = Task("recall of the train mixture's synthetic retrieval facts (held out) by distance bucket and kind, against a "
            "no-fact baseline; exact CIs, McNemar with --compare",
            frozenset({"lengths", "trials", "data", "distance_law"}), run, add_arguments=add_arguments, option_help={
                "lengths": "retrieval_recall: document lengths, each also the longest distance (default: the "
                           "checkpoint's training length; longer ones measure recall past it)",
                "trials": f"retrieval_recall: documents per length (default {DEFAULT_TRIALS}); each asks 1-4 facts",
                "data": "retrieval_recall: where the filler prose comes from: the validation split of this folder, "
                        "or these validation files (default: the offline corpus's validation split)"})
