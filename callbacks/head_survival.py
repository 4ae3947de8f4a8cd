"""HeadSurvivalCallback: which keys each attention head keeps alive, logged under heads/ to every logger
(callbacks.dashboard.LoggerWriter: scalars and images to TensorBoard and W&B, histograms to TensorBoard).

Statistics (definitions and the measurement in fpa_lightning/analysis/survival.py) come from `Decoder.probe` on a fixed held-out batch: no grad,
float32, autocast off, never from the training forward. Every backend with a bias is measured from its own bias
(FPA, FoX, ALiBi per head; Selective Attention and DCP are layer-shared, so every head of such a layer gets the
layer's value). Layers without a bias are skipped.
"""
from __future__ import annotations

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from callbacks.dashboard import (
    WALK_KINDS,
    datamodule_method,
    layer_tag,
    logger_writer,
    new_figure,
    write_layout_once,
)
from fpa_lightning.analysis.survival import HeadReport, effective_query_start, measure_heads
from modules.scaling import whole_decoder


class HeadSurvivalCallback(Callback):
    """Logs alive fractions, non-suffix fractions, boundary death ratios, β and FPA walk steps under heads/.

    Args:
        every_n_steps: measure every this many optimizer steps (and at every validation end).
        probe_rows, probe_seq_len: shape of the held-out batch taken from `trainer.datamodule.probe_batch`
            (seq_len defaults to the model's max_seq_len).
        batch: an explicit probe batch (dict with input_ids and segment_ids, (B, T)) instead of the datamodule's.
        query_start: statistics over queries t ≥ query_start (the paper: past 1024); clamped to T // 2 when the
            probe is not longer than that (logged once).
        alive_threshold: a key is alive for a query when its bias is ≥ this value (≤ 0).
        nonsuffix_at_least: a head counts as non-suffix when at least this fraction of its alive set is not a suffix.
        block_size: query rows per bias block (memory is O(B·H·block_size·T) per layer).
        example_window: side of the example bias/alive matrix image (first positions of probe row 0).
        log_images: also log the layer × head heat map and the example matrix.
    """

    def __init__(
        self,
        every_n_steps: int = 250,
        probe_rows: int = 2,
        probe_seq_len: int | None = None,
        batch: dict | None = None,
        query_start: int = 1024,
        alive_threshold: float = -1.0,
        nonsuffix_at_least: float = 0.10,
        block_size: int = 256,
        example_window: int = 256,
        log_images: bool = True,
    ):
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be positive, got {every_n_steps}")
        if alive_threshold > 0:
            raise ValueError(f"alive_threshold must be ≤ 0 (a query's own key, bias 0, is alive), got {alive_threshold}")
        self.every_n_steps = every_n_steps
        self.probe_rows, self.probe_seq_len = probe_rows, probe_seq_len
        self.query_start, self.alive_threshold = query_start, alive_threshold
        self.nonsuffix_at_least, self.block_size = nonsuffix_at_least, block_size
        self.example_window, self.log_images = example_window, log_images
        self._batch = batch
        self._last_step: int | None = None
        self._enabled = True
        self.latest: HeadReport | None = None  # the last measurement, for programmatic use

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # a softmax model (sdpa, or every layer excluded by bias_layers) has nothing to measure: say so once, up
        # front, rather than fail at the first validation of a run that compares it with FPA under one config
        self._enabled = pl_module.model.has_bias()
        if not self._enabled:
            rank_zero_warn(f"HeadSurvivalCallback: no attention layer of this model "
                           f"({pl_module.model.cfg.attention.backend}) has a bias; head statistics are off for this run")

    # --- Lightning hooks ----------------------------------------------------------------------------
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step > 0 and trainer.global_step % self.every_n_steps == 0:
            self._measure_and_log(trainer, pl_module)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._measure_and_log(trainer, pl_module)

    # --- work ---------------------------------------------------------------------------------------
    def _measure_and_log(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # once per optimizer step: gradient accumulation repeats the step, validation may land on a measured step
        if not self._enabled or self._last_step == trainer.global_step:
            return
        self._last_step = trainer.global_step
        with whole_decoder(trainer, pl_module) as model:  # every rank enters: under FSDP it gathers the model
            writer = logger_writer(trainer, type(self).__name__) if model is not None else None
            if writer is not None:
                self._measure(trainer, pl_module, model, writer)

    def _measure(self, trainer: Trainer, pl_module: LightningModule, model, writer) -> None:
        batch = self._probe_batch(trainer, model)
        input_ids = batch["input_ids"].to(pl_module.device)
        seq_len = input_ids.shape[1]
        query_start = effective_query_start(self.query_start, seq_len)
        if query_start != self.query_start and self.latest is None:
            rank_zero_info(f"HeadSurvivalCallback: probe length {seq_len} ≤ query_start={self.query_start}; "
                           f"statistics use queries past {query_start} instead")
        self.latest = measure_heads(model, input_ids, batch["segment_ids"].to(pl_module.device), query_start,
                                    self.alive_threshold, self.nonsuffix_at_least, self.block_size)
        write_layout_once(writer, model.cfg.n_layer)
        self._log(writer, self.latest, trainer.global_step)
        if self.log_images:
            self._log_images(writer, model, input_ids, self.latest, trainer.global_step)
        writer.flush()

    def _probe_batch(self, trainer: Trainer, model) -> dict:
        """The explicit batch, else the datamodule's fixed probe batch (fetched once: it is deterministic)."""
        if self._batch is None:
            probe_batch = datamodule_method(trainer, "probe_batch", type(self).__name__, "a probe batch",
                                            "batch={'input_ids': ..., 'segment_ids': ...}")
            self._batch = probe_batch(self.probe_rows, self.probe_seq_len or model.cfg.max_seq_len)
        return self._batch

    @staticmethod
    def _log(writer, report: HeadReport, step: int) -> None:
        for layer, stats in report.layers.items():
            per_head = {"alive_fraction": stats.alive_fraction, "nonsuffix_fraction": stats.nonsuffix_fraction,
                        "boundary_ratio": stats.boundary_ratio}
            if layer in report.beta:
                per_head["beta"] = report.beta[layer]
            per_head.update({f"walk/{k}": report.walk[layer][k] for k in WALK_KINDS if layer in report.walk})
            for kind, values in per_head.items():
                for head, value in enumerate(values.tolist()):
                    if value == value:  # NaN (an undefined ratio) is left out rather than plotted
                        writer.add_scalar(layer_tag(kind, layer, head), value, step)
        for name, value in report.summary().items():
            if value == value:
                writer.add_scalar(f"heads/summary/{name}", value, step)
        writer.add_histogram("heads/hist/alive_fraction", report.alive_fractions().flatten(), step)
        writer.add_histogram("heads/hist/nonsuffix_fraction", report.nonsuffix_fractions().flatten(), step)

    def _log_images(self, writer, model, input_ids: torch.Tensor, report: HeadReport, step: int) -> None:
        writer.add_figure("heads/image/alive_fraction_map", _heat_map(report), step)
        layer, head = _median_head(report)
        window = min(self.example_window, input_ids.shape[1])
        with torch.no_grad(), torch.autocast(input_ids.device.type, enabled=False):
            full = model.probe(input_ids[:1, :window])[layer].bias()  # (1, H or 1, window, window)
        bias = full[0, min(head, full.shape[1] - 1)].float().cpu()  # a layer-shared bias has one head
        writer.add_figure("heads/image/example_bias", _example_figure(bias, layer, head, self.alive_threshold), step)


def _median_head(report: HeadReport) -> tuple[int, int]:
    """(layer, head) of the head whose alive fraction is closest to the median: the "typical" head."""
    alive = report.alive_fractions()  # (n_layers_with_bias, H)
    flat = (alive.flatten() - alive.flatten().quantile(0.5)).abs().argmin().item()
    return list(report.layers)[flat // alive.shape[1]], flat % alive.shape[1]


def _heat_map(report: HeadReport):
    alive = report.alive_fractions().numpy()
    fig = new_figure(max(4.0, 1.5 + 0.35 * alive.shape[1]), max(3.0, 1.2 + 0.3 * alive.shape[0]))
    ax = fig.add_subplot()
    im = ax.imshow(alive, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    ax.set(xlabel="head", ylabel="layer", xticks=range(alive.shape[1]))
    ax.set_yticks(range(alive.shape[0]), [str(l) for l in report.layers])  # only layers with a bias have a row
    ax.set_title(f"alive fraction, queries ≥ {report.query_start}", fontsize=9)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    return fig


def _example_figure(bias: torch.Tensor, layer: int, head: int, threshold: float):
    """Bias (clipped to [−10, 0]) and alive mask of one head, queries down, keys across; future keys (s > t) grey."""
    import matplotlib

    future = torch.isneginf(bias)  # the causal mask, not a dead key: drawn as "bad" (grey), not as −10 or dead
    fig = new_figure(9.0, 4.2)
    left, right = fig.subplots(1, 2)
    for ax, values, cmap, limits, title in (
        (left, bias.clamp(min=-10.0), "magma", (-10.0, 0.0), f"bias, layer {layer} head {head}"),
        (right, (bias >= threshold).float(), "gray", (0.0, 1.0), f"alive (white: bias ≥ {threshold:g})"),
    ):
        colours = matplotlib.colormaps[cmap].with_extremes(bad="lightgrey")
        ax.imshow(values.masked_fill(future, float("nan")).numpy(), vmin=limits[0], vmax=limits[1], cmap=colours,
                  interpolation="nearest")
        ax.set(title=title, xlabel="key s", ylabel="query t")
    fig.colorbar(left.images[0], ax=left)
    fig.tight_layout()
    return fig
