"""test_loss: mean loss on packed test sequences with a bootstrap interval; --compare: the paired difference. A
verdict (superior, non-inferior) needs several training seeds: ``eval.py seeds`` on the per-row losses kept here."""
from __future__ import annotations

import argparse

import matplotlib.pyplot as plt
import numpy as np
import torch

from fpa_lightning.evaluation.checkpoint import LoadedModel
from fpa_lightning.evaluation.data import EvalData
from fpa_lightning.evaluation.scoring import Runtime, check_vocab, token_losses
from fpa_lightning.evaluation.seeds import LOWER_IS_BETTER, ONE_PAIR_NOTE
from modules.evaluation.progress import Progress
from modules.evaluation.tasks.common import OWN_CLUSTERS, Task, TaskOutput, intervals, label, metric, per_item

DEFAULT_MARGIN = 0.00995  # nats: the paper's non-inferiority margin (1% in perplexity)


DEFAULT_BATCH_SIZE = 4


def run(args: argparse.Namespace, models: list[LoadedModel], runtime: Runtime, data: EvalData) -> TaskOutput:
    seq_len = args.seq_len or models[0].decoder.cfg.max_seq_len
    return heldout_loss(models, runtime, data, seq_len, args.batch_size or DEFAULT_BATCH_SIZE, args.max_docs,
                        args.margin or DEFAULT_MARGIN)


def heldout_loss(models: list[LoadedModel], runtime: Runtime, data: EvalData, seq_len: int, batch_size: int,
                 max_docs: int | None, margin: float) -> TaskOutput:
    """Mean loss over packed test sequences with a bootstrap interval over sequences; with two models the
    paired difference A − B and ``margin`` (nats), the margin a seed-level verdict (``eval.py seeds``) applies. Every
    row's loss is kept (``per_item``, rows ``row<i>`` in data order)."""
    per_seq, rows = [[] for _ in models], []
    # the number of sequences in a split is known only at its end: items, rate and time, no ETA
    bar = Progress("test_loss", None, None, unit="sequences")
    for batch in data.test_sequences(seq_len, batch_size, max_docs):
        ids = torch.cat([batch["input_ids"], batch["labels"][:, -1:]], dim=1)  # (B, seq_len + 1)
        rows.extend(ids)
        for i, m in enumerate(models):
            check_vocab(m.decoder, int(ids.max()))
            per_seq[i].extend(token_losses(m.decoder, ids, runtime).mean(axis=1))
        bar.advance(ids.numel() * len(models), items=ids.shape[0])
    bar.close()
    values = [np.array(v) for v in per_seq]  # each (N sequences,)
    results = {
        "sequences": len(values[0]),
        "seq_len": seq_len,
        "tokens": len(values[0]) * seq_len,
        "models": [{"label": label(m, i), "loss": intervals(v, runtime)[0].as_dict()}
                   for i, (m, v) in enumerate(zip(models, values))],
        "per_item": per_item("row", rows, OWN_CLUSTERS, [
            metric("loss", LOWER_IS_BETTER, [f"row{i}" for i in range(len(rows))], values)]),
    }
    scalars = {f"test_loss/{'AB'[i]}": r["loss"]["estimate"] for i, r in enumerate(results["models"])}
    if len(models) == 2:
        diff = intervals(values[0] - values[1], runtime)[0]
        results["difference"] = diff.as_dict()
        results["margin"] = margin
        results["verdict"] = None  # one pair of trained models: evaluation noise only (ONE_PAIR_NOTE)
        results["note"] = ONE_PAIR_NOTE
        scalars["test_loss/difference"] = diff.estimate
    return TaskOutput(results, {"test_loss": _plot_heldout_loss(results, values)}, scalars)


def _plot_heldout_loss(results: dict, values: list[np.ndarray]) -> plt.Figure:
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
                       title=f"A − B = {d['estimate']:.4f} [{d['lower']:.4f}, {d['upper']:.4f}]: one pair, "
                       "evaluation noise only")
    fig.tight_layout()
    return fig


TASK = Task("mean loss on packed test sequences, bootstrap CI; --compare: paired difference (verdicts: eval.py seeds)",
            frozenset({"seq_len", "batch_size", "margin", "max_docs", "data"}), run, option_help={
                "batch_size": f"test_loss: sequences per forward pass (default {DEFAULT_BATCH_SIZE})",
                "max_docs": "test_loss: at most this many sequences (default: the whole test split)"})
