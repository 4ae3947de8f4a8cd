"""Atomic file writes: every file the project writes for a user (results, checkpoints, exports, corpus parts) goes
through ``atomic_open``, so a reader, or a crash, sees the old file or the whole new one, never a part of it.

A file written atomically gets the permissions a plain ``open(path, "w")`` would give it under the user's umask
(0644 under the usual 022), not the owner-only 0600 of ``tempfile.mkstemp``: the temporary file is created by
``open`` itself, and files that a library wrote into a temporary place (safetensors creates its files 0600) are
given them by ``plain_file_mode`` before they are renamed into place."""
from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator
from typing import IO


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", durable: bool = True) -> Iterator[IO]:
    """Open a temporary file beside ``path`` (the same folder, so the final rename is atomic) for writing; on a clean
    exit flush it, fsync it when ``durable``, and rename it over ``path`` (then fsync the folder, so the rename itself
    survives a power cut). On an exception the temporary file is removed and ``path`` is untouched."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes whole files: mode 'w' or 'wb', not {mode!r}")
    path = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        # "x": create, never truncate (the name is fresh), with open's 0666 & ~umask (mkstemp would make it 0600);
        # text files are UTF-8 whatever the locale
        with open(tmp, "x", encoding="utf-8") if mode == "w" else open(tmp, "xb") as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    if durable:
        _fsync_folder(folder)


def plain_file_mode() -> int:
    """The permission bits ``open(path, "w")`` gives a new file in this process: 0o666 less the umask."""
    return 0o666 & ~_umask()


def _umask() -> int:
    """The process's umask: from /proc/self/status where Linux reports it; elsewhere Python can only read it by
    setting it, so it is set to 0o077 for that instant and restored (a file another thread creates meanwhile is
    more private, not less, under any usual umask)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def write_json(path: str | os.PathLike, record, **dump_kwargs) -> None:
    """``record`` as JSON in ``path``, through ``atomic_open``: an interrupted write leaves the previous file or the
    new one whole, never a truncated one that a later run could not read back."""
    with atomic_open(path) as f:
        json.dump(record, f, **dump_kwargs)


def _fsync_folder(folder: str) -> None:
    """Make a rename durable (a no-op where folders cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
