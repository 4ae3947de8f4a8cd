"""Packed batches of one split, built in DataLoader workers: documents -> tokens -> rows, with resume cursors.

Order and sharding
------------------
The data of one split is cut into ``world_size * max(num_workers, 1)`` disjoint shards (whole files
when they divide evenly, otherwise every n-th record; see ``datamodules.sources``). Logical worker
``w`` of rank ``r`` reads shard ``r * W + w`` (W = max(num_workers, 1) logical workers) and builds whole batches; the DataLoader hands out
batches round-robin (batch ``i`` of a rank comes from logical worker ``i % W``). The order is therefore
a pure function of (data, seed, world size, W): ``num_workers`` 0 and 1 give the same batches.
The train split is an endless sequence of passes; pass ``e`` reorders files and blocks of
``shuffle_block`` documents with ``seed`` and ``e``. Validation/test are single passes in file order.
A train mixture (``datamodules.mixture``) is one endless pass whose records name their source; it orders each of its
sources itself, so its records are not shuffled again here, and the counters are also kept per source.

Resuming
--------
Each batch carries (privately, stripped before it reaches the model) its worker's cursor after it:
``(pass, document index in the shard's stream, token offset in that document)``. The module records the
cursor of every batch the training loop actually *consumes* (``on_before_batch_transfer``: Lightning
prefetches one batch ahead, so counting yielded batches would skip one on resume; without a trainer,
yielded = consumed). ``state_dict()`` holds these cursors for every rank (gathered from the ranks while
Lightning writes a checkpoint); after ``load_state_dict()`` each rank takes its own, each worker skips to its
cursor (reading, not tokenising, the records before it) and the physical workers are rotated so that the next
batch comes from the right logical worker. Resuming requires the same world size, ``num_workers``, ``seq_len``,
``batch_size`` and ``seed`` (checked; another world size is refused: shards are cut per world size, so cursors
of one sharding mean nothing in another).
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from . import sources
from .packing import DocumentEncoder, Packer, with_bos_eos

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")
META_KEY = "_fpa_meta"  # private batch key: worker cursor + counter deltas, removed in the main process
SOURCE_COUNTERS = ("documents", "tokens", "skipped")  # per source of a mixture (PipelineStats.sources)
_ENCODE_CHARS = 1 << 20  # tokenise up to ~1 M characters per encode_batch call


@dataclass
class PipelineStats:
    """Counters of one split: documents and tokens (BOS/EOS included) read, records skipped by reason; for a train
    mixture (``datamodules.mixture``) also per source: ``sources[name] = {documents, tokens, skipped}``."""

    documents: int = 0
    tokens: int = 0
    rows: int = 0
    tail_tokens: int = 0  # tokens of a finite split's last, incomplete row (not emitted)
    skipped: Counter = field(default_factory=Counter)
    sources: dict = field(default_factory=dict)

    def add(self, delta: dict) -> None:
        self.documents += delta.get("documents", 0)
        self.tokens += delta.get("tokens", 0)
        self.rows += delta.get("rows", 0)
        self.tail_tokens += delta.get("tail_tokens", 0)
        self.skipped.update(delta.get("skipped", {}))
        for name, counts in delta.get("sources", {}).items():
            mine = self.sources.setdefault(name, dict.fromkeys(SOURCE_COUNTERS, 0))
            for key in SOURCE_COUNTERS:
                mine[key] += counts.get(key, 0)

    def as_dict(self) -> dict:
        out = {"documents": self.documents, "tokens": self.tokens, "rows": self.rows,
               "tail_tokens": self.tail_tokens, "skipped": dict(self.skipped)}
        if self.sources:  # (a mixture's only: single-source counters keep their form)
            out["sources"] = {name: dict(counts) for name, counts in self.sources.items()}
        return out


@dataclass(frozen=True)
class SplitSource:
    """Where one split's records come from: local ``files`` or a hub data set ``hub_id``/``hub_split``."""

    files: tuple[str, ...] = ()
    hub_id: str | None = None
    hub_split: str | None = None
    hub_data_files: tuple[str, ...] | None = None  # hub builder on local files (tests / pre-downloaded)
    text_field: str = "text"

    def records(self, num_shards: int, shard: int, seed: int, epoch: int) -> Iterator[sources.Record]:
        if self.hub_id is not None:
            return sources.hub_records(
                self.hub_id, self.hub_split or "train", self.text_field, num_shards, shard, seed, epoch,
                data_files=list(self.hub_data_files) if self.hub_data_files else None,
            )
        return sources.local_records(list(self.files), self.text_field, num_shards, shard, seed, epoch)


class PackedStream(IterableDataset):
    """Batches ``{input_ids, labels, segment_ids}`` of shape (B, T) from one split (see module doc)."""

    def __init__(self, source: SplitSource, tokenizer, seq_len: int, batch_size: int, seed: int,
                 rank: int, world_size: int, num_workers: int, infinite: bool, shuffle_block: int,
                 cursors: list | None = None, rotation: int = 0):
        self.source, self.tokenizer = source, tokenizer
        self.T, self.B, self.seed = seq_len, batch_size, seed
        self.rank, self.world = rank, world_size
        self.n_workers = max(1, num_workers)
        self.infinite, self.shuffle_block = infinite, shuffle_block
        self.cursors = cursors or [None] * self.n_workers
        self.rotation = rotation

    def __iter__(self) -> Iterator[dict]:
        info = get_worker_info()
        logical = ((info.id if info else 0) + self.rotation) % self.n_workers
        shard, n_shards = self.rank * self.n_workers + logical, self.world * self.n_workers
        epoch, doc, offset = self.cursors[logical] or (0, 0, 0)
        encoder = DocumentEncoder(self.tokenizer)
        while True:
            yield from self._one_pass(encoder, logical, shard, n_shards, epoch, doc, offset)
            if not self.infinite:
                return
            epoch, doc, offset = epoch + 1, 0, 0

    def _one_pass(self, encoder, logical, shard, n_shards, epoch, start_doc, start_offset) -> Iterator[dict]:
        packer = Packer(self.T)
        delta = _new_delta()
        rows: list[tuple[np.ndarray, np.ndarray]] = []
        docs_seen, batches = start_doc, 0
        for index, tokens in self._documents(encoder, shard, n_shards, epoch, start_doc, delta):
            packer.add(index, tokens, start_offset if index == start_doc else 0)
            docs_seen = index + 1
            while packer.ready():
                rows.append(packer.pop_row())
                if len(rows) == self.B:
                    yield self._batch(rows, logical, (epoch,) + packer.cursor(), _drain(delta))
                    rows, batches = [], batches + 1
        if self.infinite and docs_seen == 0:
            raise ValueError(f"shard {shard}/{n_shards} of the train split has no usable documents "
                             f"(skipped: {dict(delta['skipped']) or 'none'}); check the files and text_field")
        if self.infinite and batches == 0 and (start_doc, start_offset) == (0, 0):
            raise ValueError(f"shard {shard}/{n_shards} of the train split holds {packer.size} tokens per pass, "
                             f"less than one batch of {self.B} rows x {self.T + 1} tokens; lower seq_len/batch_size, "
                             f"num_workers or add data")
        # Tokens never emitted as inputs: the incomplete last row and, for train, the incomplete last
        # batch of the pass (each pass restarts packing, which keeps the resume cursor simple).
        delta["tail_tokens"] += packer.size
        if rows and not self.infinite:
            yield self._batch(rows, logical, None, _drain(delta))
        else:
            delta["tail_tokens"] += len(rows) * self.T
            yield {META_KEY: {"worker": logical, "cursor": None, "delta": _drain(delta)}}  # counters only

    def _documents(self, encoder, shard, n_shards, epoch, start_doc, delta) -> Iterator[tuple[int, np.ndarray]]:
        """``(index in this shard's stream, [BOS] ids [EOS])`` from ``start_doc`` on; bad records counted."""
        records = self.source.records(n_shards, shard, self.seed, epoch)
        # a mixture orders each of its sources itself (datamodules.mixture): its draws are not shuffled again
        block = self.shuffle_block if self.infinite and not getattr(self.source, "shuffles_itself", False) else 0
        for indexed in record_blocks(records, block, random.Random(f"{self.seed}/{epoch}/{shard}"), start_doc):
            good = []
            for index, record in indexed:
                text, reason = record[0], record[1]
                name = record[2] if len(record) > 2 else None  # a mixture's record names its source
                if reason is not None:
                    delta["skipped"][reason] += 1
                    _count_source(delta, name, "skipped", 1)
                    log.debug("skipped record %d of shard %d: %s", index, shard, reason)
                else:
                    good.append((index, text, name))
            for (index, _, name), ids in zip(good, encoder.encode([t for _, t, _ in good])):
                tokens = with_bos_eos(ids)
                delta["documents"] += 1
                delta["tokens"] += len(tokens)
                _count_source(delta, name, "documents", 1)
                _count_source(delta, name, "tokens", len(tokens))
                yield index, tokens

    def _batch(self, rows, logical, cursor, delta) -> dict:
        tokens = torch.from_numpy(np.stack([r[0] for r in rows]))  # (B, T+1)
        delta["rows"] += len(rows)
        return {
            "input_ids": tokens[:, :-1].contiguous(),  # (B, T)
            "labels": tokens[:, 1:].clone(),  # (B, T): next token of each input position
            "segment_ids": torch.from_numpy(np.stack([r[1] for r in rows])),  # (B, T)
            META_KEY: {"worker": logical, "cursor": cursor, "delta": delta},
        }


def _new_delta() -> dict:
    return {"documents": 0, "tokens": 0, "rows": 0, "tail_tokens": 0, "skipped": Counter(), "sources": {}}


def _count_source(delta: dict, name: str | None, counter: str, n: int) -> None:
    """Add ``n`` to a mixture source's counter (looked up each time: ``_drain`` empties the mapping between batches);
    nothing for a plain record (``name`` None)."""
    if name is not None:
        delta["sources"].setdefault(name, dict.fromkeys(SOURCE_COUNTERS, 0))[counter] += n


def _drain(delta: dict) -> dict:
    """A copy of the counters gathered since the last batch; zeroes ``delta`` in place (shared with readers)."""
    # plain dicts: torch's default_convert would "copy" a Counter with update(), doubling it
    out = {k: (dict(v) if isinstance(v, Counter) else v) for k, v in delta.items()}
    out["sources"] = {name: dict(counts) for name, counts in delta["sources"].items()}
    for k, v in delta.items():
        if isinstance(v, (Counter, dict)):
            v.clear()
        else:
            delta[k] = 0
    return out


def record_blocks(records, block: int, rng: random.Random, start: int) -> Iterator[list[tuple[int, sources.Record]]]:
    """Group records into tokenisation blocks, optionally shuffled within ``block``-sized windows.

    Yields lists of ``(stream index, record)`` with stream index >= ``start``. Records before the
    block containing ``start`` are read but not returned (that is how a resumed worker skips ahead).
    With ``block > 0`` the stream index is the position *after* shuffling, so it is stable.
    """
    if block > 0:
        window: list = []
        base = 0
        for record in records:
            window.append(record)
            if len(window) == block:
                yield from _emit_window(window, base, rng, start)
                base, window = base + block, []
        if window:
            yield from _emit_window(window, base, rng, start)
        return
    group, chars = [], 0
    for index, record in enumerate(records):
        if index < start:
            continue
        group.append((index, record))
        chars += len(record[0] or "")
        if chars >= _ENCODE_CHARS or len(group) >= 256:
            yield group
            group, chars = [], 0
    if group:
        yield group


def _emit_window(window, base, rng: random.Random, start) -> Iterator[list]:
    order = list(range(len(window)))
    rng.shuffle(order)  # always drawn, so the rng state does not depend on where we resumed
    if base + len(window) <= start:
        return
    items = [(base + i, window[j]) for i, j in enumerate(order) if base + i >= start]
    for k in range(0, len(items), 64):
        yield items[k : k + 64]
