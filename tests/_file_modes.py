"""Helpers for tests of the permissions written files get: a temporary umask and a file's permission bits."""
from __future__ import annotations

import contextlib
import os
import stat


@contextlib.contextmanager
def umask(mask: int):
    """Run the block under the process umask `mask`, then restore the old one."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path) -> int:
    """The permission bits of `path` (e.g. 0o644)."""
    return stat.S_IMODE(os.stat(path).st_mode)
