"""What every task shares: its output record, model labels, bootstrap intervals and error-bar plots.

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
from fpa_lightning.evaluation.stats import Interval, bootstrap_mean


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
