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

    Args:
        path: the JSONL file (default: ``predictions.jsonl`` in the run's log folder, or the working directory).
    """

    def __init__(self, path: str | None = None):
        super().__init__(write_interval="batch")
        self.path = path
        self._file = None

    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.path is None:
            self.path = os.path.join(trainer.log_dir or ".", "predictions.jsonl")
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._file = open(self.path, "w", encoding="utf-8")

    def write_on_batch_end(self, trainer, pl_module, prediction: dict, batch_indices, batch, batch_idx: int,
                           dataloader_idx: int) -> None:
        tokenizer, eos_id, stats = trainer.datamodule.tokenizer, prediction["eos_id"], prediction["stats"]
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
        rank_zero_info(f"GenerationWriter: wrote {self.path}")
