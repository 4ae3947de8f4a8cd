"""The data contract of the evaluation tasks. The core never reads files itself: ``eval.py`` builds an ``EvalData``
(``datamodules.EvalCorpus``: the offline corpus, a local folder, file or glob) and hands it to the tasks."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import torch


class EvalData(Protocol):
    bos_id: int
    """The id that opens every document and prompt."""
    eos_id: int
    """The id that closes every document (generation stops there)."""

    @property
    def tokenizer(self):
        """A ``tokenizers.Tokenizer`` (the one the checkpoint was trained with) for building prompts."""

    def describe(self) -> dict:
        """What the JSON records about the data: at least ``source``, ``split`` and ``tokenizer``."""

    def texts(self, limit: int | None) -> list[str]:
        """The test documents' raw text (book-text haystacks), at most ``limit``. Raises ValueError when none."""

    def long_documents(self, tokens: int, min_tokens: int, limit: int | None) -> list[torch.Tensor]:
        """Test documents as 1-D LongTensors ``[BOS] text [EOS]``, the first ``tokens`` tokens of each, skipping those
        shorter than ``min_tokens``; at most ``limit``. Raises ValueError when none qualifies."""

    def test_sequences(self, seq_len: int, batch_size: int, limit: int | None) -> Iterator[dict]:
        """Packed test batches ``{input_ids, labels, segment_ids}`` (B, seq_len), at most ``limit`` rows in all."""
