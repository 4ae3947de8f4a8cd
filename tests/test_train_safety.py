"""train.py safety (issue #23): a resume lists the command-line values the checkpoint replaces, remote checkpoints are
refused, checkpoints are written atomically, ``--trainer.logger=false`` keeps an existing ./config.yaml, and data
errors end the command with one clear line."""
import itertools
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
import zstandard

from modules.checkpoint_io import AtomicCheckpointIO
from test_train_cli import REPO, tiny_quickstart_args
from train import main


def resume_report(stderr: str) -> list[str]:
    lines = stderr.splitlines()
    starts = [i for i, line in enumerate(lines) if "the checkpoint's hyper-parameters win" in line]
    if not starts:
        return []
    return [lines[starts[0]], *itertools.takewhile(lambda line: line.startswith("  model."), lines[starts[0] + 1:])]


def test_a_resume_lists_the_values_the_checkpoint_replaces_and_uses_the_checkpoints(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    main(tiny_quickstart_args(runs, 2))
    checkpoint = runs / "quickstart" / "version_0" / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    main(tiny_quickstart_args(runs, 3) + [f"--ckpt_path={checkpoint}"])
    assert resume_report(capsys.readouterr().err) == []  # nothing changed: nothing to say
    cli = main(tiny_quickstart_args(runs, 4) + [f"--ckpt_path={checkpoint}", "--model.optim.lr=0.5",
                                               "--model.optim.warmup_steps=7"])
    report = resume_report(capsys.readouterr().err)
    assert report == [
        f"train.py: --ckpt_path {checkpoint}: the checkpoint's hyper-parameters win over these command-line/config "
        "values (the run uses the checkpoint's; to change them, start a new run from the weights):",
        "  model.optim.lr: 0.5 (command line/config) -> 0.003 (checkpoint)",
        "  model.optim.warmup_steps: 7 (command line/config) -> 20 (checkpoint)",
    ]
    assert (cli.model.optim.lr, cli.model.optim.warmup_steps) == (0.003, 20)  # what the report says is what ran
    assert cli.trainer.optimizers[0].param_groups[0]["initial_lr"] == 0.003


@pytest.mark.parametrize("url", ["https://models.example.invalid/last.ckpt", "s3://bucket/run/last.ckpt"])
def test_a_remote_checkpoint_is_refused(tmp_path, monkeypatch, capsys, url):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(tiny_quickstart_args(tmp_path / "runs", 1) + [f"--ckpt_path={url}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"--ckpt_path '{url}': remote checkpoints are refused (Lightning would unpickle them with " \
           "weights_only=False" in err
    assert not (tmp_path / "runs").exists()  # refused before anything ran
    with pytest.raises(ValueError, match="refusing to load the remote checkpoint"):  # also below the CLI
        AtomicCheckpointIO().load_checkpoint(url)


def test_logger_false_keeps_an_existing_config_yaml(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    mine = "# my own config, not a run's\ntrainer: {max_steps: 7}\n"
    (tmp_path / "config.yaml").write_text(mine)
    main(tiny_quickstart_args(tmp_path / "runs", 1) + ["--trainer.logger=false"])
    assert (tmp_path / "config.yaml").read_text() == mine
    assert f"train.py: {tmp_path / 'config.yaml'} exists and is not overwritten" in capsys.readouterr().err
    # with none there, the run's resolved config is saved as before
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(other)
    main(tiny_quickstart_args(tmp_path / "runs", 1) + ["--trainer.logger=false"])
    assert "seq_len: 32" in (other / "config.yaml").read_text()


def test_every_run_writes_checkpoints_through_the_atomic_io(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = main(tiny_quickstart_args(tmp_path / "runs", 2) + ["--checkpoint.every_n_train_steps=1"])
    assert type(cli.trainer.strategy.checkpoint_io) is AtomicCheckpointIO
    folder = tmp_path / "runs" / "quickstart" / "version_0" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt", "step1.ckpt", "step2.ckpt"]  # no temp left
    assert torch.load(folder / "step2.ckpt", weights_only=True)["global_step"] == 2


def test_a_checkpoint_write_is_atomic_in_its_own_folder_and_fsynced(tmp_path, monkeypatch):
    target = tmp_path / "ckpts" / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"step": torch.tensor(1)}, target)
    replaced, synced = [], []
    real_replace, real_fsync = os.replace, os.fsync
    monkeypatch.setattr(os, "replace", lambda src, dst: (replaced.append((src, dst)), real_replace(src, dst)))
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    io.save_checkpoint({"step": torch.tensor(2)}, target)
    assert [pathlib.Path(src).parent for src, _ in replaced] == [target.parent]  # same folder: a rename, not a copy
    assert [dst for _, dst in replaced] == [str(target)] and len(synced) == 2  # the file, then the folder
    assert torch.load(target, weights_only=True)["step"] == 2

    def torch_save_that_dies(obj, f):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", torch_save_that_dies)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"step": torch.tensor(3)}, target)
    monkeypatch.undo()
    assert torch.load(target, weights_only=True)["step"] == 2  # the old checkpoint, whole
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.ckpt"]  # the partial temp file is gone


def test_a_truncated_data_file_ends_train_py_with_one_clear_line(tmp_path):
    """As a command: exit 1 and `train.py: error: <file>: truncated ... after line N`, not a traceback."""
    docs = [json.dumps({"text": f"document {i} " + "and the lord said " * 40}) for i in range(60)]
    compressed = zstandard.ZstdCompressor().compress(("\n".join(docs) + "\n").encode())
    for split in ("train", "validation", "test"):
        (tmp_path / "data" / split).mkdir(parents=True)
        (tmp_path / "data" / split / "part.jsonl.zst").write_bytes(compressed)
    cut = tmp_path / "data" / "train" / "part.jsonl.zst"
    cut.write_bytes(compressed[: len(compressed) // 2])
    args = [*tiny_quickstart_args(tmp_path / "runs", 2), f"--data.init_args.source={tmp_path / 'data'}",
            "--data.init_args.shuffle_block=64",  # the first batch reads the file to its cut (60 records, one window)
            "--trainer.callbacks=[]"]  # one DataLoader worker (the quickstart's): the error crosses a process
    done = subprocess.run([sys.executable, str(REPO / "train.py"), *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"train.py: error: {cut}: truncated or corrupt zstd data after line ")
    assert "Traceback" not in done.stderr
