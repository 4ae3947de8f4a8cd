"""The evaluation tasks' data (``fpa_lightning.evaluation.data.EvalData``), built from this package's data modules.

``path`` is a local folder (PG-19 / SlimPajama layout), a file, or a glob of .jsonl, .jsonl.gz, .jsonl.zst or
.parquet files with a ``text`` field; None reads the offline corpus's test split (KJV books).
"""
from __future__ import annotations

import os
from collections.abc import Iterator

import torch

from .pg19 import PG19DataModule
from .slimpajama import SlimPajamaDataModule
from .text import TextDataModule
from .tokenizer import BOS_ID, mistral_tokenizer


class EvalCorpus:
    """Test documents and packed test sequences of one local source, and the tokenizer for prompts."""

    bos_id = BOS_ID

    def __init__(self, path: str | None):
        self.path = path
        self._tokenizer = None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = mistral_tokenizer()
        return self._tokenizer

    def describe(self) -> dict:
        source = "offline corpus (KJV), test split" if self.path is None else os.path.abspath(self.path)
        return {"source": source, "split": "test"}

    def _datamodule(self, cls: type[TextDataModule], **kwargs) -> TextDataModule:
        if self.path is None:
            return TextDataModule(source="offline", num_workers=0, **kwargs)
        if os.path.isdir(self.path):
            return cls(source=self.path, num_workers=0, **kwargs)
        # a file or a glob: name it as the test split's files explicitly (source then plays no role)
        return cls(test_files=self.path, num_workers=0, **kwargs)

    def long_documents(self, tokens: int, min_tokens: int, limit: int | None) -> list[torch.Tensor]:
        dm = self._datamodule(PG19DataModule, long_doc_max_tokens=tokens)
        docs = list(dm.long_documents("test", max_tokens=tokens, min_tokens=min_tokens, limit=limit))
        if not docs:
            raise ValueError(f"no test document in {self.describe()['source']} has at least {min_tokens} tokens; "
                             "lower the length (or --min-tokens) or use other data")
        return docs

    def test_sequences(self, seq_len: int, batch_size: int, limit: int | None) -> Iterator[dict]:
        batches = None if limit is None else -(-limit // batch_size)
        dm = self._datamodule(SlimPajamaDataModule, seq_len=seq_len, val_batch_size=batch_size,
                              max_val_batches=batches)
        seen = 0
        for batch in dm.test_dataloader(rank=0, world_size=1):
            keep = batch["input_ids"].shape[0] if limit is None else min(batch["input_ids"].shape[0], limit - seen)
            yield {k: v[:keep] for k, v in batch.items()}
            seen += keep
            if limit is not None and seen >= limit:
                return
