"""PreemptionCheckpoint: on SIGTERM or SIGINT, a checkpoint of the last finished optimizer step, then the run stops.

A scheduler preempts a job with SIGTERM (then SIGKILL after a grace period); Ctrl+C sends SIGINT. The handler only
records the signal. At the end of the batch that completes the current optimizer step (``on_train_batch_end``, the
point where ``ModelCheckpoint(every_n_train_steps=...)`` saves, so the data stream's position and the loop counters in
the file match the weights), the run writes ``last.ckpt`` into the ``ModelCheckpoint``'s folder through the trainer
(the atomic checkpoint IO, ``modules.checkpoint_io``) and raises ``Preempted``: Lightning finalizes the loggers and
tears down, and ``train.py`` exits with 128 + the signal number (143 for SIGTERM, 130 for SIGINT). A preempted job
loses at most the step it was in; ``train.py fit ... --resume auto`` continues it (docs/training.md, "Resuming and
preemption"). Under DDP the ranks agree on stopping at each optimizer step (one boolean all-reduce), so they stop at
the same step. Lightning's own SIGTERM handler (which stops at the end of any micro-batch, without a checkpoint) is
replaced while the training loop runs; the previous handlers come back at teardown.
"""
from __future__ import annotations

import os
import signal

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn


class Preempted(SystemExit):
    """The run stopped on a signal after checkpointing; the exit code is 128 + the signal number."""

    def __init__(self, signum: int, step: int, path: str | None) -> None:
        super().__init__(128 + signum)
        self.signum, self.step, self.path = signum, step, path

    def __str__(self) -> str:
        saved = f"checkpoint {self.path}" if self.path else "no checkpoint (the run has no ModelCheckpoint)"
        return f"stopped by {signal.Signals(self.signum).name} after optimizer step {self.step}; {saved}"


class PreemptionCheckpoint(Callback):
    """Checkpoints the last finished optimizer step on ``signals`` and stops the run (module docstring)."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self.signals = tuple(signals)
        self.received: int | None = None
        self._previous: dict[int, object] = {}
        self._step_at_start: int | None = None

    def _handle(self, signum, frame) -> None:
        self.received = signum

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.received = None
        for signum in self.signals:
            try:
                self._previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread: signals cannot be handled here
                rank_zero_warn("PreemptionCheckpoint: not in the main thread; no checkpoint on signals")
                break

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._restore()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._restore()  # (an interrupted run skips the callbacks' teardown)

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        self._step_at_start = trainer.global_step

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step == self._step_at_start:  # a micro-batch of gradient accumulation: the step goes on
            return
        if not trainer.strategy.reduce_boolean_decision(self.received is not None, all=False):
            return
        # the ModelCheckpoint that keeps last.ckpt (train.py's ``checkpoint.*``), else the first one
        checkpoint = next((c for c in trainer.checkpoint_callbacks if c.save_last), trainer.checkpoint_callback)
        path = None
        if checkpoint is not None and checkpoint.dirpath is not None:
            path = os.path.join(checkpoint.dirpath, f"{checkpoint.CHECKPOINT_NAME_LAST}{checkpoint.FILE_EXTENSION}")
            checkpoint.last_model_path = path  # (its state in the file names the file it is)
            trainer.save_checkpoint(path)
        raise Preempted(self.received or signal.SIGTERM, trainer.global_step, path)
