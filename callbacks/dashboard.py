"""The logging side shared by the callbacks: a writer over every attached logger, the custom-scalars layout, figures.

The callbacks log through ``LoggerWriter``, which reaches every logger of the trainer (``trainer.loggers``): scalars
through Lightning's ``log_metrics`` (TensorBoard, W&B, CSV, ...), figures to each logger that takes images
(TensorBoard's ``add_figure``, W&B's ``log_image``), histograms and the custom-scalars layout to TensorBoard only.
TensorBoard's custom-scalars plugin reads one layout per run (the first one written), so both callbacks write
the same combined layout and only the first write per TensorBoard writer happens.
"""
from __future__ import annotations

import weakref

from lightning.pytorch import Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_warn

_LAYOUT_WRITTEN: "weakref.WeakSet" = weakref.WeakSet()


class LoggerWriter:
    """The callbacks' writer: ``add_scalar`` collects scalars, ``flush`` sends them to every logger in one
    ``log_metrics`` call per step; ``add_figure`` draws the figure once and hands it to each logger that takes images
    (a TensorBoardLogger's ``add_figure``, a WandbLogger's ``log_image``; other loggers get none);
    ``add_histogram`` and ``add_custom_scalars`` go to the TensorBoard loggers only."""

    def __init__(self, loggers) -> None:
        self.loggers = list(loggers)
        self._scalars: dict[int, dict[str, float]] = {}

    def _tensorboards(self):
        return [logger.experiment for logger in self.loggers if isinstance(logger, TensorBoardLogger)]

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self._scalars.setdefault(step, {})[tag] = float(value)

    def flush(self) -> None:
        scalars, self._scalars = self._scalars, {}
        for step, metrics in sorted(scalars.items()):
            for logger in self.loggers:  # log_metrics: rank zero only
                logger.log_metrics(metrics, step=step)

    def add_histogram(self, tag: str, values, step: int) -> None:
        for writer in self._tensorboards():
            writer.add_histogram(tag, values, step)

    def add_custom_scalars(self, layout: dict) -> None:
        for writer in self._tensorboards():
            if writer not in _LAYOUT_WRITTEN:
                writer.add_custom_scalars(layout)
                _LAYOUT_WRITTEN.add(writer)

    def add_figure(self, tag: str, figure, step: int) -> None:
        self.flush()  # the scalars of this step first (W&B's history keeps the order of its log calls)
        for logger in self.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_figure(tag, figure, step, close=False)
            elif callable(getattr(logger, "log_image", None)):  # WandbLogger (and any logger with its signature)
                logger.log_image(key=tag, images=[figure_pixels(figure)], step=step)


def logger_writer(trainer: Trainer, who: str) -> LoggerWriter | None:
    """A ``LoggerWriter`` over the trainer's loggers, or None (with a warning) when it has none."""
    if not trainer.loggers:
        rank_zero_warn(f"{who}: the trainer has no logger; nothing is logged")
        return None
    return LoggerWriter(trainer.loggers)


def figure_pixels(figure):
    """An (H, W, 3) uint8 array of a matplotlib figure, drawn on the Agg canvas."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


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


def write_layout_once(writer: LoggerWriter, n_layer: int) -> None:
    writer.add_custom_scalars(dashboard_layout(n_layer))  # once per TensorBoard writer


def new_figure(width: float, height: float):
    """A matplotlib figure on the Agg backend (no display needed; pyplot's global backend is left alone)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100)
