"""The non-finite loss guard under 2 DDP ranks on CPU (gloo): both ranks stop at the same optimizer step (the check is
all-reduced), the error names each rank's batch, and the command ends instead of hanging in a collective."""
import os
import subprocess
import sys

from _launch import REPO


def test_both_ranks_stop_together_on_a_nan_loss(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    command = [sys.executable, str(REPO / "train.py"), "fit", "--config", str(REPO / "configs" / "quickstart.yaml"),
               f"--trainer.logger.init_args.save_dir={runs}", "--trainer.enable_progress_bar=false",
               "--model.model.n_layer=1", "--model.model.d_model=64", "--model.model.n_head=1",
               "--model.model.d_mlp=128", "--data.init_args.seq_len=32", "--data.init_args.batch_size=2",
               "--data.init_args.num_workers=0", "--trainer.accelerator=cpu", "--trainer.devices=2",
               "--trainer.strategy=ddp", "--trainer.max_steps=20", "--trainer.limit_val_batches=0",
               "--trainer.callbacks=[]", "--checkpoint.monitor=null", "--model.optim.lr=1e9"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("train.py: error: ")]
    assert errors, done.stderr[-3000:]
    steps = {line.split("at optimizer step ")[1].split(" ")[0] for line in errors}
    assert len(steps) == 1  # every rank that reports, reports the same step
    assert all("train/loss is not finite at optimizer step" in line for line in errors)
    assert "rank 0: loss " in errors[0] or "rank 1: loss " in errors[0]
    assert not list(runs.rglob("*.ckpt"))  # last.ckpt is written at the end of a run, which never came
