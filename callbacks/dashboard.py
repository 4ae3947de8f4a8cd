"""The TensorBoard side shared by the callbacks: finding the writer, the custom-scalars layout, figures.

TensorBoard's custom-scalars plugin reads one layout per run (the first one written), so both callbacks write
the same combined layout and only the first write per writer happens.
"""
from __future__ import annotations

import weakref

from lightning.pytorch import Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_warn

_LAYOUT_WRITTEN: "weakref.WeakSet" = weakref.WeakSet()


def tensorboard_writer(trainer: Trainer, who: str):
    """The SummaryWriter of the trainer's TensorBoardLogger, or None (with a warning) when it has none."""
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            return logger.experiment
    rank_zero_warn(f"{who}: the trainer has no TensorBoardLogger; nothing is logged")
    return None


def datamodule_method(trainer: Trainer, name: str, who: str, needs: str, explicit: str):
    """The trainer's datamodule's method ``name``; a callback without its own input raises, saying what it needs."""
    datamodule = getattr(trainer, "datamodule", None)
    if datamodule is None or not hasattr(datamodule, name):
        raise RuntimeError(f"{who} needs {needs}: pass {explicit} or train with a datamodule that has {name}(...)")
    return getattr(datamodule, name)


def layer_tag(kind: str, layer: int, head: int) -> str:
    """The per-head scalar tag, e.g. heads/alive_fraction/layer_03/head_07."""
    return f"heads/{kind}/layer_{layer:02d}/head_{head:02d}"


PER_HEAD_KINDS = {  # tag kind -> chart title prefix, one chart per layer (all its heads on it)
    "alive_fraction": "alive fraction",
    "nonsuffix_fraction": "non-suffix fraction",
    "boundary_ratio": "boundary death ratio",
    "beta": "FPA beta",
}
WALK_KINDS = ("field_step_mean", "field_step_std", "level_step_mean", "level_step_std")


def dashboard_layout(n_layer: int) -> dict:
    """The custom-scalars layout ({category: {chart: ["Multiline", [tag regexes]]}}) for a model of n_layer layers."""
    layout = {
        "heads: summary": {
            "median alive fraction (queries past query_start)": ["Multiline", [r"^heads/summary/median_alive_fraction$"]],
            "heads with >= 10% non-suffix alive keys (of heads_with_bias)": [
                "Multiline", [r"^heads/summary/nonsuffix_heads$", r"^heads/summary/heads_with_bias$"]],
            "key deaths at document boundaries / all tokens": ["Multiline", [r"^heads/summary/boundary_ratio$"]],
        },
        "long context": {
            "loss by position bucket": ["Multiline", [r"^long_context/loss/"]],
            "loss within vs beyond the training context": ["Multiline", [r"^long_context/summary/"]],
        },
    }
    for kind, title in PER_HEAD_KINDS.items():
        layout[f"heads: {title} by layer"] = {
            f"{title}, layer {l}": ["Multiline", [rf"^heads/{kind}/layer_{l:02d}/"]] for l in range(n_layer)
        }
    for kind in WALK_KINDS:
        layout[f"heads: FPA walk {kind} by layer"] = {
            f"{kind}, layer {l}": ["Multiline", [rf"^heads/walk/{kind}/layer_{l:02d}/"]] for l in range(n_layer)
        }
    return layout


def write_layout_once(writer, n_layer: int) -> None:
    if writer not in _LAYOUT_WRITTEN:
        writer.add_custom_scalars(dashboard_layout(n_layer))
        _LAYOUT_WRITTEN.add(writer)


def new_figure(width: float, height: float):
    """A matplotlib figure on the Agg backend (no display needed; pyplot's global backend is left alone)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100)
