"""LongContextLossCallback: next-token loss by position on long held-out documents, logged under long_context/.

Each document (1-D token ids, truncated to window + 1 tokens) gives inputs ids[:-1] and labels ids[1:]; the loss
at position i is the loss of predicting token i + 1 from tokens 0..i. Positions are grouped into buckets
[k·bucket_size, (k+1)·bucket_size); a bucket's loss is the mean over every (document, position) in it, so later
buckets average over the documents long enough to reach them. The window is context_multiple × the training
context (2048 → 16,384 with the default 8), which shows whether the loss stays flat past the training length.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from callbacks.dashboard import datamodule_method, logger_writer, new_figure, write_layout_once
from datamodules import TextDataModule
from fpa_lightning.analysis.positions import loss_by_position, uniform_edges
from modules.scaling import whole_decoder


class LongContextLossCallback(Callback):
    """At each validation end, logs the loss per position bucket up to context_multiple × the training context.

    Args:
        context_multiple: the window is this many training contexts long.
        train_context: the training context length (default: the model's max_seq_len).
        bucket_size: positions per bucket (default: train_context // 2).
        n_documents: how many documents to evaluate (fetched once, then reused at every validation).
        split: the split to read documents from (`long_documents` of `data`, else of the trainer's datamodule).
        min_tokens: skip shorter documents (default: train_context + 1, so every document reaches past training).
        documents: explicit documents (1-D LongTensors) instead of the datamodule's.
        data: a data module of its own for the documents instead of the training data's validation split, e.g.
            PG-19 books from a local folder: ``datamodules.PG19DataModule(source="/data/pg19")`` with split "test"
            (give it the training run's tokenizer).
        chunk: positions per vocabulary-projection chunk in `token_losses`.
        log_image: also log the loss-versus-position plot.
    """

    def __init__(
        self,
        context_multiple: int = 8,
        train_context: int | None = None,
        bucket_size: int | None = None,
        n_documents: int = 8,
        split: str = "validation",
        min_tokens: int | None = None,
        documents: Iterable[torch.Tensor] | None = None,
        data: TextDataModule | None = None,
        chunk: int = 1024,
        log_image: bool = True,
    ):
        if context_multiple < 1:
            raise ValueError(f"context_multiple must be ≥ 1, got {context_multiple}")
        self.context_multiple, self.train_context, self.bucket_size = context_multiple, train_context, bucket_size
        self.n_documents, self.split, self.min_tokens = n_documents, split, min_tokens
        self.chunk, self.log_image = chunk, log_image
        self._documents = None if documents is None else list(documents)
        self.data = data
        self.latest: dict[int, float] | None = None  # bucket start -> mean loss, from the last validation

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking:
            return
        with whole_decoder(trainer, pl_module) as model:  # every rank enters: under FSDP it gathers the model
            writer = logger_writer(trainer, type(self).__name__) if model is not None else None
            if writer is not None:
                self._measure(trainer, model, writer)

    def _measure(self, trainer: Trainer, model, writer) -> None:
        context = self.train_context or model.cfg.max_seq_len
        window, bucket = context * self.context_multiple, self.bucket_size or max(1, context // 2)
        sums, counts = loss_by_position(model, self._load_documents(trainer, context, window),
                                        uniform_edges(window, bucket), chunk=self.chunk)
        self.latest = {k * bucket: float(sums[k] / counts[k]) for k in range(len(sums)) if counts[k] > 0}
        write_layout_once(writer, model.cfg.n_layer)
        step = trainer.global_step
        width = len(str(window))  # zero-padded starts sort the chart legend by position
        for start, loss in self.latest.items():
            writer.add_scalar(f"long_context/loss/pos_{start:0{width}d}", loss, step)
        for name, in_bucket in (("within_context", lambda s: s < context), ("beyond_context", lambda s: s >= context)):
            picked = [k for k in range(len(sums)) if counts[k] > 0 and in_bucket(k * bucket)]
            if picked:
                writer.add_scalar(f"long_context/summary/{name}", float(sums[picked].sum() / counts[picked].sum()), step)
        if self.log_image and self.latest:
            writer.add_figure("long_context/image/loss_vs_position", _plot(self.latest, bucket, context, step), step)
        writer.flush()

    def _load_documents(self, trainer: Trainer, context: int, window: int) -> list[torch.Tensor]:
        """The explicit documents, else the datamodule's (fetched once: the same documents at every validation)."""
        if self._documents is None:
            long_documents = self.data.long_documents if self.data is not None else datamodule_method(
                trainer, "long_documents", type(self).__name__, "documents", "documents=[LongTensor, ...] or data=...")
            min_tokens = self.min_tokens if self.min_tokens is not None else context + 1
            self._documents = list(long_documents(split=self.split, max_tokens=window + 1, min_tokens=min_tokens,
                                                  limit=self.n_documents))
            if not self._documents:
                raise RuntimeError(f"LongContextLossCallback: split {self.split!r} has no document of ≥ {min_tokens} "
                                   "tokens; lower min_tokens")
        return self._documents


def _plot(losses: dict[int, float], bucket: int, context: int, step: int):
    fig = new_figure(6.0, 3.5)
    ax = fig.add_subplot()
    centres = [start + bucket / 2 for start in losses]
    ax.plot(centres, list(losses.values()), marker="o")
    ax.axvline(context, color="gray", linestyle="--", label=f"training context {context}")
    ax.set_xlabel("position in document")
    ax.set_ylabel("loss (nats)")
    ax.set_title(f"loss by position, step {step}")
    ax.legend()
    fig.tight_layout()
    return fig
