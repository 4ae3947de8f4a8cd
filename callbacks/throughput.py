"""ThroughputCallback: the model FLOP rate, MFU, the tokens trained so far and the peak GPU memory, under throughput/.

A thin adapter over ``fpa_lightning.analysis.flops`` (the FLOPs per training token of the model's config and the
batch's length, and the table of peak FLOP/s). Why not Lightning's ``ThroughputMonitor``: its peak table is
Lightning's, not ours (the dense bf16 peaks with their sources and the explicit "unknown device" rule), it would log
a second tokens/s beside ``LanguageModel``'s ``train/tokens_per_s``, and it logs no memory.

**Tokens/s is not logged here**: it is ``LanguageModel``'s ``train/tokens_per_s``. This callback measures the same
window the same way (all ranks' tokens of the training batches, from the first training batch after the previous
window or after validation to the end of the optimizer step that closes the window, CUDA synchronised), so with
``every_n_steps`` left at the trainer's ``log_every_n_steps`` ``throughput/tflops_per_s`` is
``train/tokens_per_s × flops_per_token`` of the same steps.
"""
from __future__ import annotations

import time

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn

from fpa_lightning.analysis.flops import peak_tflops as table_peak_tflops
from fpa_lightning.analysis.flops import training_flops_per_token


class ThroughputCallback(Callback):
    """Logs, every ``every_n_steps`` optimizer steps, through the trainer's loggers:

    - ``throughput/tflops_per_s``: model TFLOP/s achieved by all devices together (analysis/flops.py's count: model
      FLOPs, so activation checkpointing's second forward is not counted);
    - ``throughput/mfu``: that over the peak of all devices (``peak_tflops`` × world size), in [0, 1]; only when the
      peak is known: the device is in the table (``fpa_lightning.analysis.flops.PEAK_BF16_TFLOPS``) or given;
    - ``throughput/tokens``: the training tokens of every rank so far (micro-batches under gradient accumulation all
      count; restored on resume);
    - ``throughput/peak_memory_gib``: ``torch.cuda.max_memory_allocated`` of global rank 0's device since the start
      (CUDA only).

    Args:
        every_n_steps: the window, in optimizer steps; None takes the trainer's ``log_every_n_steps`` (the window of
            ``train/tokens_per_s``).
        peak_tflops: the peak dense bf16 TFLOP/s of one device; None looks ``torch.cuda.get_device_name()`` up in the
            table. An unknown device (or a CPU) without it: one warning, and no MFU.
    """

    def __init__(self, every_n_steps: int | None = None, peak_tflops: float | None = None):
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(f"every_n_steps must be positive, got {every_n_steps}")
        if peak_tflops is not None and not peak_tflops > 0:
            raise ValueError(f"peak_tflops must be positive, got {peak_tflops}")
        self.every_n_steps, self.peak_tflops = every_n_steps, peak_tflops
        self.device_peak_tflops: float | None = None  # resolved at setup: the override, the table's, or None
        self.tokens = 0  # every rank's training tokens so far
        self.last_metrics: dict[str, float] = {}
        self._flops_per_token: dict[int, float] = {}  # by sequence length
        self._warned = False
        self._window_start: float | None = None
        self._window_flops = 0.0  # model FLOPs of the open window's training batches
        self._last_step = 0

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        device = trainer.strategy.root_device
        self.device_peak_tflops = self.peak_tflops
        if self.device_peak_tflops is None:
            name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
            self.device_peak_tflops = table_peak_tflops(name)
            if self.device_peak_tflops is None and not self._warned:  # once per run, never a made-up number
                rank_zero_warn(f"ThroughputCallback: unknown device {name!r} (no peak FLOP/s in "
                               "fpa_lightning.analysis.flops.PEAK_BF16_TFLOPS): MFU not reported, pass peak_tflops "
                               "(callbacks.ThroughputCallback init_args: {peak_tflops: <dense bf16 TFLOP/s>})")
                self._warned = True

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._last_step = trainer.global_step  # a resumed run starts at its checkpoint's step

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        if self._window_start is None:
            self._window_start = self._now(pl_module)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        input_ids = batch["input_ids"]  # (B, T): this rank's micro-batch; every rank takes one of the same shape
        tokens = input_ids.numel() * trainer.world_size
        self.tokens += tokens
        self._window_flops += tokens * self.flops_per_token(pl_module, input_ids.shape[1])
        step = trainer.global_step
        stepped, self._last_step = step != self._last_step, step  # False inside gradient accumulation
        every = self.every_n_steps or trainer.log_every_n_steps
        if not stepped or self._window_start is None or step % every:
            return
        now = self._now(pl_module)
        flops_per_s = self._window_flops / (now - self._window_start)
        metrics = {"throughput/tflops_per_s": flops_per_s / 1e12, "throughput/tokens": float(self.tokens)}
        if self.device_peak_tflops is not None:
            metrics["throughput/mfu"] = flops_per_s / (self.device_peak_tflops * 1e12 * trainer.world_size)
        if pl_module.device.type == "cuda":
            metrics["throughput/peak_memory_gib"] = torch.cuda.max_memory_allocated(pl_module.device) / 2**30
        self.last_metrics = metrics
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)
        self._window_start, self._window_flops = now, 0.0

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # validation is not training time: drop the open window, restart at the next training batch
        self._window_start, self._window_flops = None, 0.0

    def flops_per_token(self, pl_module: LightningModule, seq_len: int) -> float:
        """Training FLOPs per token of the module's Decoder for rows of ``seq_len`` tokens (cached per length)."""
        if seq_len not in self._flops_per_token:
            self._flops_per_token[seq_len] = training_flops_per_token(pl_module.model.cfg, seq_len)
        return self._flops_per_token[seq_len]

    def state_dict(self) -> dict:
        return {"tokens": self.tokens}

    def load_state_dict(self, state_dict: dict) -> None:
        self.tokens = int(state_dict["tokens"])

    @staticmethod
    def _now(pl_module: LightningModule) -> float:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)  # kernels are asynchronous: wait before reading the clock
        return time.perf_counter()
