"""The DataLoader of a packed stream: strips each batch's private metadata and reports it to the DataModule."""

from __future__ import annotations

import os
from typing import Protocol

from torch.utils.data import DataLoader

from .stream import META_KEY, PackedStream


class BatchObserver(Protocol):
    """What the loader reports to (the TextDataModule): counters, yielded batches, the end of a split."""

    def _on_batch_meta(self, split: str, meta: dict) -> None: ...

    def _on_batch_yielded(self, split: str, batch: dict, meta: dict) -> None: ...

    def _on_split_end(self, split: str, produced: int) -> None: ...


class ResumableLoader(DataLoader):
    """A DataLoader over a ``PackedStream`` that strips the private metadata and reports it to the module."""

    def __init__(self, dataset: PackedStream, module: BatchObserver, split: str, max_batches: int | None, **kw):
        super().__init__(dataset, batch_size=None, collate_fn=_as_is, **kw)
        self._module, self._split, self._max_batches = module, split, max_batches

    def __iter__(self):
        produced = 0
        if self._max_batches == 0:
            return
        for item in _iter_without_fork_parallelism(self):
            meta = item.pop(META_KEY)
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
