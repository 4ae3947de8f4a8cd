"""GenerationWriter: writes the continuations of ``train.py predict`` as JSONL, one line per prompt."""
from __future__ import annotations

import json
import math
import os

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities import rank_zero_info

from fpa_lightning.generation import continuation_text


class GenerationWriter(BasePredictionWriter):
    """After each predict batch (``LanguageModel.predict_step`` on a ``datamodules.PromptDataModule``), one JSON line
    per prompt: index, prompt, completion (the decoded new tokens, up to and with EOS), token counts, whether it
    ended with EOS, and the cache's kept fraction and decode speed for its batch.

    Under DDP each rank continues its own share of the prompts and writes its own file, ``<stem>.rank<r><suffix>``
    (``predictions.rank1.jsonl``); the ``index`` field puts the lines back in prompt order.

    Args:
        path: the JSONL file (default: ``predictions.jsonl`` in the run's log folder, or the working directory).
        overwrite: replace an existing file; without it an existing file is an error, never truncated.
    """

    def __init__(self, path: str | None = None, overwrite: bool = False):
        super().__init__(write_interval="batch")
        self.path, self.overwrite = path, overwrite
        self.output_path: str | None = None  # the file this rank writes (set when predict starts)
        self._file = None

    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        path = self.path if self.path is not None else os.path.join(trainer.log_dir or ".", "predictions.jsonl")
        if trainer.world_size > 1:
            stem, suffix = os.path.splitext(path)
            path = f"{stem}.rank{trainer.global_rank}{suffix}"
        self.output_path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        try:
            self._file = open(path, "w" if self.overwrite else "x", encoding="utf-8")
        except FileExistsError:
            raise FileExistsError(f"GenerationWriter: {path} exists; pass another --predictions.path, or "
                                  f"--predictions.overwrite=true to replace it") from None

    def write_on_batch_end(self, trainer, pl_module, prediction: dict, batch_indices, batch, batch_idx: int,
                           dataloader_idx: int) -> None:
        prompts, stats = trainer.datamodule, prediction["stats"]  # the data module holds the tokenizer and EOS id
        tokenizer, eos_id = prompts.tokenizer, prompts.eos_id
        for index, prompt, prompt_ids, output in zip(prediction["index"], prediction["prompt"],
                                                     prediction["input_ids"], prediction["output_ids"]):
            new = output[len(prompt_ids):].tolist()
            text = continuation_text(tokenizer, prompt_ids.tolist(), output.tolist(), (prompt_ids[0].item(), eos_id))
            speed = None if math.isnan(stats["ms_per_step"]) else stats["ms_per_step"]  # NaN: no step was needed
            record = {"index": index, "prompt": prompt, "completion": text, "prompt_tokens": len(prompt_ids),
                      "new_tokens": len(new), "ended": bool(new) and new[-1] == eos_id,
                      "kept_fraction": stats["kept_fraction"], "ms_per_step": speed}
            self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()

    def on_predict_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._file.close()
        rank_zero_info(f"GenerationWriter: wrote {self.output_path}" + (" (and the other ranks' files beside it)"
                                                                        if trainer.world_size > 1 else ""))
