"""Atomically written files get the permissions a plain open() gives under the user's umask (0644 under 022, 0600
under 077), not the owner-only mode of a temporary file: results, checkpoints (AtomicCheckpointIO) and any
atomic_open. (An export's files: tests/hf/test_hf_export_files.py.)"""
import os

import pytest
import torch

from _file_modes import mode, umask
from fpa_lightning.atomic import atomic_open, plain_file_mode, write_json

UMASKS = [0o022, 0o077, 0o002]


@pytest.mark.parametrize("mask", UMASKS)
def test_atomic_writes_get_the_mode_of_a_plain_open(tmp_path, mask):
    with umask(mask):
        with open(tmp_path / "plain.txt", "w") as f:
            f.write("x")
        with atomic_open(tmp_path / "text.txt") as f:
            f.write("x")
        with atomic_open(tmp_path / "bytes.bin", "wb") as f:
            f.write(b"x")
        write_json(tmp_path / "result.json", {"a": 1})
        assert plain_file_mode() == 0o666 & ~mask
    expected = 0o666 & ~mask
    assert mode(tmp_path / "plain.txt") == expected
    for name in ("text.txt", "bytes.bin", "result.json"):
        assert mode(tmp_path / name) == expected, name


@pytest.mark.parametrize("mask", UMASKS)
def test_a_replaced_file_takes_the_new_mode_too(tmp_path, mask):
    target = tmp_path / "result.json"
    target.write_text("old")
    os.chmod(target, 0o600)
    with umask(mask):
        write_json(target, {"new": True})
    assert mode(target) == 0o666 & ~mask  # as open(path, "w") on a new file; the rename replaces the old inode


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_checkpoints_get_the_mode_of_a_plain_open(tmp_path, mask):
    from modules.checkpoint_io import AtomicCheckpointIO

    with umask(mask):
        AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.zeros(2)}}, tmp_path / "last.ckpt")
    assert mode(tmp_path / "last.ckpt") == 0o666 & ~mask
