"""StepProgressBar: the training progress bar counts optimizer steps up to ``trainer.max_steps``.

Lightning's bar counts the batches of an epoch. The train stream is endless (one epoch, no length), so that bar had no
total, restarted at 0 on a resumed run (``110/9`` beside a checkpoint at step 101) and counted micro-batches under
gradient accumulation. This one shows ``global_step / max_steps``, resumes at the checkpoint's step, and adds the
throughput (``tok/s``, ``train/tokens_per_s``) to the postfix; tqdm's ``<remaining`` is the time left, from the rate
of this run's steps (not of the steps before a resume).
"""
from __future__ import annotations

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import TQDMProgressBar


class StepProgressBar(TQDMProgressBar):
    """A ``TQDMProgressBar`` whose training bar is ``optimizer steps / trainer.max_steps`` (module docstring);
    validation, test and predict bars are Lightning's."""

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._count_steps(trainer)  # a run resumed mid-epoch (from a validation's checkpoint) starts no epoch

    def on_train_epoch_start(self, trainer: Trainer, *_) -> None:
        if self._leave:
            self.train_progress_bar = self.init_train_tqdm()
        self._count_steps(trainer)  # (Lightning's would reset the bar to the epoch's batches)

    def _count_steps(self, trainer: Trainer) -> None:
        bar, step = self.train_progress_bar, trainer.global_step
        bar.reset(total=trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None)
        bar.initial = bar.n = step  # the rate and time left count this run's steps only
        bar.set_description("train")
        bar.unit = "step"  # the rate: optimizer steps per second
        bar.refresh()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        bar, step = self.train_progress_bar, trainer.global_step
        if bar is None or bar.disable or step == bar.n:  # inside gradient accumulation: no step was taken
            return
        if self._should_update(step, bar.total):
            bar.n = step
            bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
            bar.refresh()

    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)  # the run's version is in its folder name
        rate = trainer.callback_metrics.get("train/tokens_per_s")
        if rate is not None:
            metrics["tok/s"] = f"{float(rate):.0f}"
        return metrics
