"""Data access for evaluation, kept behind three small functions so the tasks do not depend on the data layer.

``data`` is a local path (a folder in the PG-19 / SlimPajama layout, a file, or a glob of .jsonl, .jsonl.gz,
.jsonl.zst or .parquet files with a ``text`` field) or None for the offline corpus's test split (KJV books).
"""
from __future__ import annotations

import os
from typing import Iterator

import torch

from datamodules import BOS_ID, PG19DataModule, SlimPajamaDataModule, TextDataModule, mistral_tokenizer


def describe(data: str | None) -> dict:
    return {"source": "offline corpus (KJV), test split" if data is None else os.path.abspath(data), "split": "test"}


def _datamodule(cls: type[TextDataModule], data: str | None, **kwargs) -> TextDataModule:
    if data is None:
        return TextDataModule(source="offline", num_workers=0, **kwargs)
    if os.path.isdir(data):
        return cls(source=data, num_workers=0, **kwargs)
    # a file or a glob: name it as the test split's files explicitly (source then plays no role)
    return cls(test_files=data, num_workers=0, **kwargs)


def long_documents(data: str | None, tokens: int, min_tokens: int, limit: int | None) -> list[torch.Tensor]:
    """Test documents (books) as 1-D LongTensors [BOS] text..., the first ``tokens`` tokens of each, skipping
    documents shorter than ``min_tokens``; at most ``limit``. Raises when none qualifies."""
    dm = _datamodule(PG19DataModule, data, long_doc_max_tokens=tokens)
    docs = list(dm.long_documents("test", max_tokens=tokens, min_tokens=min_tokens, limit=limit))
    if not docs:
        raise ValueError(f"no test document in {describe(data)['source']} has at least {min_tokens} tokens; "
                         "lower the length (or --min-tokens) or use other data")
    return docs


def test_sequences(data: str | None, seq_len: int, batch_size: int, limit: int | None) -> Iterator[dict]:
    """Packed test batches {input_ids, labels, segment_ids} (B, seq_len), at most ``limit`` rows in all."""
    batches = None if limit is None else -(-limit // batch_size)
    dm = _datamodule(SlimPajamaDataModule, data, seq_len=seq_len, val_batch_size=batch_size, max_val_batches=batches)
    seen = 0
    for batch in dm.test_dataloader(rank=0, world_size=1):
        keep = batch["input_ids"].shape[0] if limit is None else min(batch["input_ids"].shape[0], limit - seen)
        yield {k: v[:keep] for k, v in batch.items()}
        seen += keep
        if limit is not None and seen >= limit:
            return


def tokenizer_and_bos():
    """The project's tokenizer (Mistral-7B v0.1, offline) and its BOS id, for building prompts."""
    return mistral_tokenizer(), BOS_ID
