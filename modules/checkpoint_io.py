"""``AtomicCheckpointIO``: a checkpoint file is either the complete old one or the complete new one, never a part.

Lightning's ``TorchCheckpointIO`` writes local files through an fsspec transaction: a temporary file in the system
TMPDIR that is moved into place, which is a copy (not an atomic rename) when TMPDIR is another filesystem, and is
not fsynced. Here the temporary file lies in the checkpoint's own folder, is flushed and fsynced, renamed over the
target (``os.replace``, atomic on POSIX) and the folder's entry is fsynced too. ``train.py`` puts it on every run.
"""
from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from fpa_lightning.atomic import atomic_open


def is_remote(path) -> bool:
    """A URL other than file://, e.g. http(s)://, s3://, gs://."""
    return "://" in str(path) and not str(path).startswith("file://")


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` with atomic, durable local writes (remote URLs keep Lightning's own path)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if is_remote(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        with atomic_open(str(path).removeprefix("file://"), "wb") as f:
            torch.save(checkpoint, f)

    def load_checkpoint(self, path, map_location: Any = lambda storage, loc: storage, weights_only: bool | None = None):
        """Local files only: Lightning loads an http(s) URL with ``weights_only=False`` (unpickling can run code)."""
        if is_remote(path):
            raise ValueError(f"refusing to load the remote checkpoint {str(path)!r}: download it, check where it comes "
                             f"from, and pass the local file")
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
