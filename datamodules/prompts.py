"""``PromptDataModule``: prompts to continue with ``python train.py predict`` (docs/generation.md).

A ``TextDataModule`` (same tokenizer and options, so a training config's ``data`` section carries over) whose
predict split is a file of prompts: ``.txt`` (one prompt per non-empty line) or ``.jsonl`` (a ``prompt`` field per
record). Each batch holds data only: the prompts' token ids (BOS first), their texts and indices. The generation
settings (``fpa_lightning.generation.GenerationConfig``, the ``generation`` section) and the EOS id belong to the data
module, set once for the run: ``LanguageModel.predict_step`` reads them from ``trainer.datamodule`` and the
``callbacks.GenerationWriter`` writes the results as JSONL.
"""
from __future__ import annotations

import json
import os

import torch
from torch.utils.data import DataLoader

from fpa_lightning.generation import GenerationConfig

from .text import TextDataModule
from .tokenizer import BOS_ID, EOS_ID


def read_prompts(path: str) -> list[str]:
    """The prompts of a .txt file (one per non-empty line) or a .jsonl file (field ``prompt``); raises with the
    line number for a record without one."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"prompt file {path!r} does not exist")
    with open(path, encoding="utf-8") as f:
        lines = [(n, line.rstrip("\n")) for n, line in enumerate(f, start=1) if line.strip()]
    if not path.endswith(".jsonl"):
        return [line for _, line in lines]
    prompts = []
    for n, line in lines:
        record = json.loads(line)
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
            raise ValueError(f"{path}:{n}: each JSONL record needs a string field 'prompt'")
        prompts.append(record["prompt"])
    return prompts


class PromptDataModule(TextDataModule):
    """Prompts from ``prompts`` (a .txt or .jsonl file) for ``train.py predict``.

    Args:
        prompts: path of the prompt file.
        generation: how to continue them (max_new_tokens, temperature, top_k, top_p, prune_threshold, ...); held
            here for the whole run (``self.generation``), not copied into the batches.
        predict_batch_size: prompts per batch (a batch may mix prompt lengths).
        **kwargs: ``TextDataModule`` options (the tokenizer, ...), e.g. the training config's ``data`` section.
    """

    def __init__(self, prompts: str, generation: GenerationConfig = GenerationConfig(), predict_batch_size: int = 8,
                 **kwargs):
        super().__init__(**kwargs)
        if predict_batch_size < 1:
            raise ValueError(f"predict_batch_size must be >= 1, got {predict_batch_size}")
        self.prompts_path, self.predict_batch_size = prompts, predict_batch_size
        self.generation = GenerationConfig(**generation) if isinstance(generation, dict) else generation
        self.eos_id = EOS_ID

    def predict_dataloader(self) -> DataLoader:
        texts = read_prompts(self.prompts_path)
        if not texts:
            raise ValueError(f"prompt file {self.prompts_path!r} holds no prompt")
        encoded = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        items = [(i, text, [BOS_ID, *e.ids]) for i, (text, e) in enumerate(zip(texts, encoded))]
        return DataLoader(items, batch_size=self.predict_batch_size, shuffle=False, collate_fn=self._collate)

    def _collate(self, items: list) -> dict:
        return {"index": [i for i, _, _ in items], "prompt": [text for _, text, _ in items],
                "input_ids": [torch.tensor(ids) for _, _, ids in items]}
