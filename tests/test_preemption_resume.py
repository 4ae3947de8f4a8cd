"""Preemption and auto-resume (docs/training.md, "Resuming and preemption"): a real ``train.py fit`` process gets
SIGTERM after a few steps, exits 143 with a checkpoint of its last finished optimizer step, and ``--resume auto``
continues it in the same run folder to max_steps; the final weights equal those of an uninterrupted run, bit for bit.
The uninterrupted run goes beside the interrupted one (two processes, two cores)."""
import os
import pathlib
import signal
import subprocess
import sys
import time

import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
STEPS, EVERY = 20, 5


def command(runs: pathlib.Path, *extra: str) -> list[str]:
    """The quickstart shrunk (as in test_train_cli.py) to a 1-layer d=64 model on 2 x 32-token rows, train documents
    shuffled within windows of 2 (its first batch tokenises 2 books, not 64), no validation and no statistics
    callbacks; a checkpoint every EVERY steps (the latest kept, plus last.ckpt)."""
    return [sys.executable, str(REPO / "train.py"), "fit", "--config", str(REPO / "configs" / "quickstart.yaml"),
            "--model.model.n_layer=1", "--model.model.d_model=64", "--model.model.n_head=1", "--model.model.d_mlp=128",
            "--data.init_args.seq_len=32", "--data.init_args.batch_size=2", "--data.init_args.shuffle_block=2",
            f"--trainer.max_steps={STEPS}",
            "--trainer.limit_val_batches=0", "--trainer.callbacks=[]", "--trainer.enable_progress_bar=false",
            f"--trainer.logger.init_args.save_dir={runs}", "--checkpoint.monitor=null", "--checkpoint.save_top_k=1",
            "--checkpoint.filename=step{step}", f"--checkpoint.every_n_train_steps={EVERY}", *extra]


def start(runs: pathlib.Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(command(runs, *extra), cwd=runs.parent, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def weights(path: pathlib.Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["state_dict"]


def test_sigterm_checkpoints_and_resume_auto_continues_to_the_same_weights(tmp_path):
    straight_runs, runs = tmp_path / "straight", tmp_path / "preempted"
    straight, preempted = start(straight_runs), start(runs)
    folder = runs / "quickstart" / "version_0"
    deadline = time.monotonic() + 120
    while not list((folder / "checkpoints").glob("step*.ckpt")):  # at least EVERY steps done
        assert preempted.poll() is None and time.monotonic() < deadline, preempted.stderr.read()[-3000:]
        time.sleep(0.05)
    preempted.send_signal(signal.SIGTERM)
    _, stderr = preempted.communicate(timeout=120)
    assert preempted.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    last = folder / "checkpoints" / "last.ckpt"
    stopped_at = torch.load(last, weights_only=True)["global_step"]
    assert EVERY <= stopped_at < STEPS
    assert f"stopped by SIGTERM after optimizer step {stopped_at}; checkpoint {last}" in stderr

    resumed = start(runs, "--resume=auto")
    _, stderr = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, stderr[-3000:]
    assert f"--resume auto: continuing {folder} from {last}" in stderr
    assert sorted(p.name for p in (runs / "quickstart").iterdir()) == ["version_0"]  # the same folder, no version_1
    assert straight.wait(timeout=120) == 0, straight.stderr.read()[-3000:]

    final = folder / "checkpoints" / f"step{STEPS}.ckpt"
    reference = straight_runs / "quickstart" / "version_0" / "checkpoints" / f"step{STEPS}.ckpt"
    assert torch.load(final, weights_only=True)["global_step"] == STEPS
    a, b = weights(final), weights(reference)
    assert a.keys() == b.keys()
    assert [name for name in a if not torch.equal(a[name], b[name])] == []


def test_resume_auto_refuses_a_ckpt_path_beside_it_and_other_subcommands(tmp_path, monkeypatch, capsys):
    from train import command as train_py

    monkeypatch.chdir(tmp_path)
    args = command(tmp_path / "runs")[3:]  # (without python, train.py and the subcommand)
    assert train_py(["fit", *args, "--resume=auto", "--ckpt_path=x.ckpt"]) == 2
    assert "train.py: error: --resume auto and --ckpt_path x.ckpt: pass one of them" in capsys.readouterr().err
    assert train_py(["validate", *[a for a in args if "every_n_train_steps" not in a], "--resume=auto"]) == 2
    assert "--resume auto continues a training run; validate takes --ckpt_path" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # refused before any run folder
