"""``LanguageModel``: next-token training of a ``Decoder``; the training logic only (model: fpa_lightning)."""
from __future__ import annotations

import time
from dataclasses import asdict

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torchmetrics import MeanMetric

from fpa_lightning import Decoder, ModelConfig
from fpa_lightning.export import init_from_export
from fpa_lightning.generation import GenerationConfig
from modules import guards, scaling
from modules.optim import OptimConfig, build_optimizer, fused_adamw_applies


class LanguageModel(L.LightningModule):
    """Trains ``Decoder(model)`` on batches ``{input_ids, labels}`` (B, T) with next-token cross-entropy.

    Logs ``train/loss``, ``train/lr``, ``train/tokens_per_s`` (all ranks' tokens over wall time of
    training steps, validation excluded), ``val/loss`` (mean over all tokens), ``val/ppl``, and ``test/loss``,
    ``test/ppl`` in ``train.py test``. Precision and the strategy (DDP, FSDP) are the Trainer's; ``compile``:
    ``torch.compile`` every block (True, or torch.compile's keyword arguments). Batches may carry ``segment_ids``
    (B, T), used under ``attention.document_mask``. ``init_from``: an export or ``save_pretrained`` folder whose
    weights start the model (``fpa_lightning.export.init_from_export``; not saved as a hyper-parameter).
    """

    def __init__(self, model: ModelConfig, optim: OptimConfig = OptimConfig(), compile: bool | dict = False,
                 init_from: str | None = None):
        super().__init__()
        # A checkpoint stores plain dicts, so ``load_from_checkpoint`` calls us with dicts.
        model = ModelConfig(**model) if isinstance(model, dict) else model
        optim = OptimConfig(**optim) if isinstance(optim, dict) else optim
        self.save_hyperparameters({"model": asdict(model), "optim": asdict(optim), "compile": compile})
        self.optim, self.compile_options = optim, compile
        self.model = Decoder(model)
        if init_from is not None:
            init_from_export(self.model, init_from)
        # nan_strategy="disable": a NaN/inf token loss propagates into the mean (never dropped, which would bias the
        # value that picks the best checkpoint), and the epoch-end check raises on every rank at once.
        self.val_loss, self.test_loss = MeanMetric(nan_strategy="disable"), MeanMetric(nan_strategy="disable")
        self._step_losses: list[tuple[torch.Tensor, object]] = []  # this optimizer step's (loss, batch position)
        self._warned_fallbacks = False
        self._window_start: float | None = None
        self._window_tokens = 0
        self._last_step = 0

    def setup(self, stage: str) -> None:
        """Resolve each layer's attention implementation on the run's device (an impossible request raises
        here, before training) and record it in hparams, which the loggers receive, and in checkpoints."""
        device = self.trainer.strategy.root_device
        impls = self.model.attention_impls(device)
        rank_zero_info(f"attention implementation per layer: {impls}")
        if not self._warned_fallbacks:  # once per run, loudly: a slower path than asked for is not a detail
            for message in self.model.attention_fallbacks(device):
                rank_zero_warn(message)
            self._warned_fallbacks = True
        scaling.shard_by_block(self.trainer)
        # Saving again also refreshes hparams_initial: the loggers get one set, the impls included.
        self.save_hyperparameters({**self.hparams, "attention_impls": impls})

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # LightningCLI's --ckpt_path feeds a checkpoint's hyper-parameters back into the constructor's
        # arguments, and attention_impls is not one: it is kept beside them.
        checkpoint["attention_impls"] = checkpoint["hyper_parameters"].pop("attention_impls", None)
        guards.check_state_finite(self)  # never write NaN/inf weights or optimizer state

    def configure_model(self) -> None:
        if self.compile_options:
            scaling.compile_blocks(self.model, self.compile_options)

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids, segment_ids)

    def token_losses(self, batch: dict) -> torch.Tensor:
        """Per-token losses (B, T) of a batch, its documents masked under ``attention.document_mask``."""
        return self.model.token_losses(batch["input_ids"], batch["labels"], segment_ids=batch.get("segment_ids"))

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self.token_losses(batch).mean()
        # checked in on_before_optimizer_step, once per optimizer step (no host sync here)
        self._step_losses.append((loss.detach(), getattr(self.trainer.datamodule, "last_train_batch", None)))
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/lr", self.lr_schedulers().get_last_lr()[0])
        self._window_tokens += batch["input_ids"].numel() * self.trainer.world_size
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.val_loss.update(self.token_losses(batch))

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self.test_loss.update(self.token_losses(batch))

    def predict_step(self, batch: dict, batch_idx: int) -> dict:
        """Continues a ``datamodules.PromptDataModule`` batch (``fpa_lightning.generation``) with that data module's
        generation settings and EOS id, set once for the run; adds output_ids, stats."""
        prompts = self.trainer.datamodule
        settings = getattr(prompts, "generation", None)
        if not isinstance(settings, GenerationConfig):
            raise TypeError("predict continues prompts: it needs a data module with generation settings "
                            f"(datamodules.PromptDataModule), got {type(prompts).__name__}")
        ids, stats = settings.generate(self.model, batch["input_ids"], prompts.eos_id, batch_idx)
        return {**batch, "output_ids": ids, "stats": stats}

    def on_before_optimizer_step(self, optimizer) -> None:
        # a non-finite loss stops the run here, after backward and before the step would write it into the weights
        checks, self._step_losses = self._step_losses, []
        guards.check_step_losses(self, checks)

    def on_validation_epoch_end(self) -> None:
        self._log_mean_loss("val", self.val_loss, prog_bar=True)

    def on_test_epoch_end(self) -> None:
        self._log_mean_loss("test", self.test_loss)

    def _log_mean_loss(self, split: str, metric: MeanMetric, prog_bar: bool = False) -> None:
        loss = metric.compute()  # mean over every token of every rank
        metric.reset()
        guards.check_mean_loss(self, split, loss)  # before logging: ModelCheckpoint never sees a NaN val/loss
        # For ModelCheckpoint, the progress bar and callback_metrics through self.log; for the loggers at the
        # optimizer steps done (global_step), the x of the callbacks' statistics measured on the same weights and of
        # train/loss (logged at the steps done before its batch). Lightning's own logging would put an evaluation
        # inside fit at global_step - 1 (its count of stepped batches is raised after validation). A logged "step"
        # would also move the x, but it stays in callback_metrics and ModelCheckpoint names later files by it.
        values = {f"{split}/loss": loss, f"{split}/ppl": loss.exp()}
        for name, value in values.items():
            self.log(name, value, prog_bar=prog_bar and name.endswith("/loss"), logger=False)
        for logger in [] if self.trainer.sanity_checking else self.loggers:  # (log_metrics: rank zero only)
            logger.log_metrics({name: float(value) for name, value in values.items()}, step=self.global_step)

    # --- throughput: tokens over the wall time of training steps, measured per logging window -------

    def on_train_batch_start(self, batch: dict, batch_idx: int) -> None:
        if self._window_start is None:
            self._window_start = self._now()

    def on_train_batch_end(self, outputs, batch: dict, batch_idx: int) -> None:
        step = self.trainer.global_step
        stepped, self._last_step = step != self._last_step, step  # False inside gradient accumulation
        if stepped and self._window_start is not None and step % self.trainer.log_every_n_steps == 0:
            now = self._now()
            self.log("train/tokens_per_s", self._window_tokens / (now - self._window_start))
            self._window_start, self._window_tokens = now, 0

    def on_validation_start(self) -> None:
        # Validation is not training time: drop the open window, restart at the next train batch.
        self._window_start, self._window_tokens = None, 0

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # kernels are asynchronous: wait before reading the clock
        return time.perf_counter()

    # --- optimizer ------------------------------------------------------------------------------------

    def use_fused_adamw(self) -> bool:
        return fused_adamw_applies(self.device.type, str(self.trainer.precision))

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        # through the strategy: FSDP clips by the norm of every shard; fused AdamW under bf16 (modules.scaling)
        if not scaling.clip_gradients(self, optimizer, gradient_clip_val, gradient_clip_algorithm):
            super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self):
        return build_optimizer(self.model, self.optim, self.trainer.max_steps, self.use_fused_adamw())
