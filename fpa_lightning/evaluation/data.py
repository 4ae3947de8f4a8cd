"""The data contract of the evaluation tasks. The core never reads files itself: ``eval.py`` builds an ``EvalData``
(``datamodules.EvalCorpus``: the offline corpus, a local folder, file or glob) and hands it to the tasks.

Optional: the work each long document belongs to. Two editions of one play are one work, and a bootstrap over
documents must resample them together. Data that know their works add ``long_document_works(tokens, min_tokens,
limit) -> list[tuple[torch.Tensor, str | None]]`` (each document ``long_documents`` returns with those arguments, and
its work id); ``long_documents_and_works`` reads either kind. Data without it (today's ``EvalCorpus``: the PG-19-layout
parquet rows carry no work id) give one cluster per document, and the result says so.

Optional: held-out synthetic retrieval documents, for ``eval.py --task retrieval_recall``: ``retrieval_documents(length,
count, seed, distance_law)`` -> documents with ``text`` and ``facts`` (``datamodules.retrieval_synth``'s
``RetrievalDocument``: the train mixture's documents, made from seeds and filler prose that training never reads), and
``describe()["filler"]`` says how much prose they draw on (``EvalCorpus``: the validation split's)."""
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


def long_documents_and_works(data: EvalData, tokens: int, min_tokens: int,
                             limit: int | None) -> tuple[list[torch.Tensor], list[str] | None]:
    """``data.long_documents(...)`` and each document's work id, or None when the data carry no work ids (then every
    document is its own work)."""
    with_works = getattr(data, "long_document_works", None)
    if with_works is None:
        return data.long_documents(tokens, min_tokens, limit), None
    pairs = with_works(tokens, min_tokens, limit)
    docs, works = [doc for doc, _ in pairs], [work for _, work in pairs]
    if any(work is None for work in works):
        return docs, None  # a partial labelling would merge every unlabelled document into one cluster
    return docs, [str(work) for work in works]
