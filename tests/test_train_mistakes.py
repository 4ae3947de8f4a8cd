"""A newcomer's mistakes with train.py (issue #47): each is one line on stderr naming what is wrong and what to do,
exit code 2, and no run folder; the full traceback only with FPA_DEBUG=1. Also: fit needs no test split, local globs
without a source, the progress bar in optimizer steps (resume, accumulation), and the noise that is not ours."""
import json
import logging
import os
import pathlib
import subprocess
import sys
import warnings

import pytest
import torch
from lightning.fabric.utilities.load import _METADATA_FILENAME

from test_train_cli import REPO, tiny_quickstart_args
from train import SetupError, checkpoint_path_problem, command, main, silence_foreign_noise

TEXT = "And God said, Let there be light: and there was light. " * 12  # ~150 tokens a document


def write_docs(path: pathlib.Path, n: int = 40) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": f"{i} {TEXT}"}) + "\n" for i in range(n)))
    return path


def error_line(capsys, args: list[str], code: int = 2) -> str:
    """What ``train.py <args>`` prints for a mistake: exit code 2 (1: damaged data) and exactly one stderr line."""
    assert command(args) == code
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: error: "), lines
    assert lines[0].endswith("(full traceback: FPA_DEBUG=1)")
    return lines[0]


def test_each_mistake_is_one_line_and_leaves_no_run_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    args = tiny_quickstart_args(runs, 2)
    truncated = tmp_path / "cut.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1000)}, "hyper_parameters": {}}, truncated)
    truncated.write_bytes(truncated.read_bytes()[:2000])
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_bytes(b"\xff\xfe\x00 binary\n" * 3 + b"<html>\n" + b'{"body": "no text field"}\n')
    cases = [
        (["--ckpt_path", str(tmp_path / "nope.ckpt")], "nope.ckpt: does not exist; pass a .ckpt file"),
        (["--ckpt_path", str(tmp_path)], "is a folder, not a checkpoint file or a sharded checkpoint"),
        (["--ckpt_path", str(truncated)], "cut.ckpt: not a readable checkpoint, truncated or corrupt"),
        (["--model.model.attention.impl", "fused"], "impl='fused' for backend 'fpa' needs a CUDA GPU; use "
                                                    "impl='chunked'"),
        ([f"--data.init_args.train_files={garbage}"],
         "the train data (" + str(garbage) + ") hold no usable document: 3 records: not UTF-8 text"),
    ]
    for extra, message in cases:
        line = error_line(capsys, args + extra)
        assert message in line, line
        assert not runs.exists(), (extra, sorted(runs.rglob("*")))
    # every cause counted, each with its own explanation
    assert "; 1 record: not a JSON object on one line (is the file JSON Lines?); 1 record: no 'text' field;" in line

    cut = write_docs(tmp_path / "cut.jsonl", 3)  # a copy cut inside its third record (its first ones are good)
    cut.write_bytes(cut.read_bytes()[:-20])
    # found by the run itself, which reads the whole file (one shuffle window of 64) before its first batch
    line = error_line(capsys, [*args, f"--data.init_args.train_files={cut}", "--data.init_args.shuffle_block=64"],
                      code=1)
    assert line.startswith(f"train.py: error: {cut}: line 3 is cut off (the file ends inside a record; lines 1-2 "
                           f"were read); re-download or rebuild the file"), line


def test_a_sharded_fsdp_checkpoint_folder_is_a_checkpoint_and_a_plain_folder_is_not(tmp_path):
    # FSDP with state_dict_type="sharded" saves a folder of shards; refusing folders broke its resume on the GPU
    # (tests/distributed/test_fsdp_gpu.py::test_fsdp_resume_is_exact[sharded])
    sharded = tmp_path / "step3.ckpt"
    sharded.mkdir()
    assert checkpoint_path_problem(str(sharded)) == "is a folder, not a checkpoint file or a sharded checkpoint"
    (sharded / _METADATA_FILENAME).write_bytes(b"")  # Lightning's marker, so a rename there fails here
    assert checkpoint_path_problem(str(sharded)) is None
    (tmp_path / "last.ckpt").write_bytes(b"")
    assert checkpoint_path_problem(str(tmp_path / "last.ckpt")) is None
    assert checkpoint_path_problem(str(tmp_path / "nope.ckpt")) == "does not exist"


def test_a_hub_data_set_offline_fails_fast_saying_how_to_use_local_files(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = error_line(capsys, tiny_quickstart_args(tmp_path / "runs", 2) + ["--data.init_args.source=someone/corpus"])
    assert "cannot load data set 'someone/corpus' from the Hugging Face hub" in line
    assert "Use local files instead: source=<local folder> or train_files" in line
    assert not (tmp_path / "runs").exists()


def test_fpa_debug_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FPA_DEBUG", "1")
    with pytest.raises(SetupError, match="does not exist"):
        command(tiny_quickstart_args(tmp_path / "runs", 2) + ["--ckpt_path", "nope.ckpt"])


def test_as_a_command_a_garbage_training_file_is_one_line(tmp_path):
    """The real process: stderr holds nothing but the error line (no warning, no traceback), exit code 2."""
    garbage = tmp_path / "train.jsonl"
    garbage.write_bytes(os.urandom(4000).replace(b"\n", b" ") + b"\n")
    args = [*tiny_quickstart_args(tmp_path / "runs", 2), "--data.init_args.source=null",
            f"--data.init_args.train_files={garbage}", f"--data.init_args.val_files={garbage}"]
    done = subprocess.run([sys.executable, str(REPO / "train.py"), *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"train.py: error: data (TextDataModule): the train data ({garbage}) hold no usable document: 1 record: not "
        f"UTF-8 text (a binary or otherwise encoded file?); check the files, and text_field (the name of the records' "
        f"text field, now 'text') (full traceback: FPA_DEBUG=1)"]
    assert not (tmp_path / "runs").exists()


def test_fit_needs_train_and_validation_only_and_globs_need_no_source(tmp_path, monkeypatch, capsys):
    """A folder without test files trains; `train.py test` asks for them. With source null, globs are the data and a
    split without its glob names the option to set (it used to look for a hub data set named None)."""
    monkeypatch.chdir(tmp_path)
    write_docs(tmp_path / "data" / "train" / "a.jsonl")
    write_docs(tmp_path / "data" / "validation" / "a.jsonl", 8)
    runs = tmp_path / "runs"
    common = [*tiny_quickstart_args(runs, 1), "--trainer.callbacks=[]", "--data.init_args.num_workers=0"]
    cli = main([*common, f"--data.init_args.source={tmp_path / 'data'}", "--trainer.limit_val_batches=1",
                "--trainer.val_check_interval=1"])
    assert cli.trainer.global_step == 1 and "val/loss" in cli.trainer.callback_metrics
    line = error_line(capsys, ["test", *common[1:], f"--data.init_args.source={tmp_path / 'data'}"])
    assert "no test files under" in line and "pass --data.init_args.test_files=<glob>" in line

    globs = ["--data.init_args.source=null", f"--data.init_args.train_files={tmp_path / 'data/train/*.jsonl'}"]
    line = error_line(capsys, [*common, *globs])
    assert ("no validation data: source is null and val_files is not set; pass --data.init_args.val_files=<glob>"
            in line)
    cli = main([*common, *globs, f"--data.init_args.val_files={tmp_path / 'data/validation/*.jsonl'}"])
    assert cli.trainer.global_step == 1


def test_the_progress_bar_counts_optimizer_steps_across_accumulation_and_resume(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    args = [*tiny_quickstart_args(runs, 3), "--trainer.enable_progress_bar=true", "--trainer.accumulate_grad_batches=2",
            "--trainer.limit_val_batches=1", "--trainer.val_check_interval=6",  # batches: last.ckpt saved by a validation
            "--trainer.callbacks=[]"]
    cli = main(args)
    bar = cli.trainer.progress_bar_callback.train_progress_bar
    assert (bar.n, bar.total) == (3, 3)  # 6 micro-batches: Lightning's bar counted those, with no total
    printed = capsys.readouterr()
    assert "3/3" in printed.out + printed.err and "tok/s=" in printed.out + printed.err
    last = runs / "quickstart" / "version_0" / "checkpoints" / "last.ckpt"
    cli = main([*args, "--trainer.max_steps=5", f"--ckpt_path={last}"])
    bar = cli.trainer.progress_bar_callback.train_progress_bar
    assert (bar.initial, bar.n, bar.total) == (3, 5, 5)  # resumes at the checkpoint's step; the rate counts this run's
    printed = capsys.readouterr()
    assert "5/5" in printed.out + printed.err and "Epoch" not in printed.out + printed.err


def test_lightning_noise_that_is_not_ours_is_silenced_by_its_exact_text(caplog):
    from lightning.pytorch.utilities.rank_zero import rank_zero_info
    from torch.utils._pytree import LeafSpec

    with caplog.at_level(logging.INFO):
        rank_zero_info("💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger](x)")
        rank_zero_info("💡 Tip: something else")
    assert "litlogger" not in caplog.text and "something else" in caplog.text
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        silence_foreign_noise()  # what importing train.py does, over "always"
        LeafSpec()
        warnings.warn("another FutureWarning", FutureWarning)
    assert [str(w.message) for w in caught] == ["another FutureWarning"]


def test_what_runs_write_is_ignored_by_git():
    """export/ (eval.py export) and checkpoints/ (a run without a logger) are outputs, never files to commit."""
    done = subprocess.run(["git", "check-ignore", "--no-index", "export/model.safetensors", "checkpoints/last.ckpt",
                           "runs/quickstart/version_0/config.yaml"], cwd=REPO, capture_output=True, text=True)
    assert done.stdout.split() == ["export/model.safetensors", "checkpoints/last.ckpt",
                                   "runs/quickstart/version_0/config.yaml"]
