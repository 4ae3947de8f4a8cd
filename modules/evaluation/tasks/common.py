"""What every task shares: its output record, model labels, bootstrap intervals, error-bar plots and the per-item
record (``per_item``) from which ``eval.py seeds`` recomputes clustered statistics across training seeds.

Differences are always A − B (A: --ckpt, B: --compare); for losses, negative means A is better.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt
import numpy as np

from fpa_lightning.evaluation.checkpoint import LoadedModel
from fpa_lightning.evaluation.data import EvalData
from fpa_lightning.evaluation.scoring import Runtime
from fpa_lightning.evaluation.seeds import fingerprint, token_digest
from fpa_lightning.evaluation.stats import Interval, bootstrap_mean

# how the item clusters of a document task are formed: by work where the data name each document's work
# (EvalData.long_document_works), else one per document, which every such JSON says
DOCUMENT_CLUSTERS = "document (the data carry no work id: each document is its own cluster)"
WORK_CLUSTERS = "work (the data's work id of each document: editions of one work are resampled together)"
OWN_CLUSTERS = "item (each item its own cluster)"


def document_clusters(works: list[str] | None, ids: list[str]) -> tuple[str, list[str]]:
    """How a document task's items are clustered (``cluster_by``) and each document's cluster: its work, or itself
    when the data carry no work ids."""
    return (DOCUMENT_CLUSTERS, list(ids)) if works is None else (WORK_CLUSTERS, list(works))


@dataclass
class TaskOutput:
    results: dict
    figures: dict[str, plt.Figure] = field(default_factory=dict)
    scalars: dict[str, float] = field(default_factory=dict)
    table: str | None = None
    """What the command line prints at the end (None: the scalars, one per line)."""


@dataclass(frozen=True)
class Task:
    """One evaluation task as the command line sees it."""

    description: str
    """One line for ``eval.py --help``."""
    options: frozenset[str]
    """The optional command-line options (argparse dests) this task reads, its own ones included; giving any other
    task-specific option is an error."""
    run: Callable[[argparse.Namespace, list[LoadedModel], Runtime, EvalData], TaskOutput]
    """Resolves the task's defaults from the parsed arguments and runs it."""
    check: Callable[[argparse.Namespace, list[LoadedModel]], None] | None = None
    """Raises ValueError before any compute when the arguments and checkpoints cannot work together."""
    impl: str | None = None
    """The attention implementation the task needs (None: the checkpoint's own, or --impl)."""
    add_arguments: Callable[[argparse._ArgumentGroup], None] | None = None
    """Adds the options only this task reads (each with default None, so that misuse can be detected)."""
    option_help: dict[str, str] = field(default_factory=dict)
    """What an option that other tasks read too means for this one (argparse dest -> help text), for ``eval.py --task
    NAME --help``."""
    needs_checkpoint: bool = True
    """False for a task that trains its own models (probes): then --ckpt and --compare do not apply."""
    resumes: bool = False
    """True for a task that reads its earlier result in --out back and keeps all of it in the new one (probes): its
    output folder is rewritten without --overwrite, since nothing in it is lost."""


def label(model: LoadedModel, index: int) -> str:
    return f"{'AB'[index]}: {model.backend}"


def intervals(values: np.ndarray, runtime: Runtime) -> list[Interval]:
    return bootstrap_mean(values, runtime.n_boot, runtime.confidence, runtime.seed)


def errorbar(ax, x, intervals: list[dict], **kw) -> None:
    est = np.array([iv["estimate"] for iv in intervals])
    err = np.array([[iv["estimate"] - iv["lower"], iv["upper"] - iv["estimate"]] for iv in intervals]).T
    ax.errorbar(x, est, yerr=err, marker="o", capsize=3, **kw)


def metric(name: str, direction: str, ids: list[str], values: list, clusters: list[str] | None = None) -> dict:
    """One comparable number of a task, item by item: ``values[i]`` is model i's value per item (NaN where an item
    does not reach it), ``clusters`` the item's cluster for resampling (None: the item ids). The task's number is
    the mean over items (NaN left out); ``direction``: which of "lower" or "higher" is better."""
    return {"name": name, "direction": direction, "ids": list(ids),
            "clusters": list(ids if clusters is None else clusters),
            "values": [[float(v) for v in np.asarray(per_model, dtype=np.float64).reshape(-1)] for per_model in values]}


def per_item(unit: str, items: list, cluster_by: str, metrics: list[dict]) -> dict:
    """The ``per_item`` record of a result: the unit, a fingerprint of the items (token ids in order; files with
    equal fingerprints were scored on the same items), how clusters are formed, and the metrics (``metric``)."""
    return {"unit": unit, "fingerprint": fingerprint([token_digest(it) for it in items]), "cluster_by": cluster_by,
            "metrics": metrics}
