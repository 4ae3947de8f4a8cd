"""PreemptionCheckpoint (callbacks/preemption.py) on a small Lightning model: SIGINT (Ctrl+C) checkpoints the last
finished optimizer step and stops with 130, under gradient accumulation too, and gives the previous handler back; under
DDP a signal that reaches one rank only stops every rank at the same optimizer step. The SIGTERM path through a real
``train.py`` process and ``--resume auto`` is tests/test_preemption_resume.py."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from callbacks import Preempted, PreemptionCheckpoint

REPO = pathlib.Path(__file__).resolve().parents[2]


class SignalAtBatch(Callback):
    """Sends ``signum`` to this process at the start of micro-batch ``batch`` (on ``rank`` only)."""

    def __init__(self, signum: int, batch: int, rank: int = 0) -> None:
        self.signum, self.batch, self.rank = signum, batch, rank

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == self.batch and trainer.global_rank == self.rank:
            os.kill(os.getpid(), self.signum)


def fit(tmp_path: pathlib.Path, signal_at: int, accumulate: int) -> tuple[Preempted, ModelCheckpoint]:
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True, save_top_k=0)
    trainer = Trainer(default_root_dir=tmp_path, max_steps=20, accumulate_grad_batches=accumulate, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                      callbacks=[checkpoint, PreemptionCheckpoint(), SignalAtBatch(signal.SIGINT, signal_at)])
    with pytest.raises(Preempted) as stopped:
        trainer.fit(BoringModel())
    return stopped.value, checkpoint


@pytest.mark.parametrize("accumulate, signal_at, stops_after", [(1, 3, 4), (2, 4, 3), (2, 5, 3)])
def test_sigint_checkpoints_the_step_it_was_in_and_exits_130(tmp_path, accumulate, signal_at, stops_after):
    """Micro-batch ``signal_at`` (0-based) belongs to optimizer step signal_at // accumulate; the run finishes that
    step and stops: with 2 micro-batches per step, a signal at micro-batch 4 or 5 (step 2, 0-based) stops after 3."""
    before = signal.getsignal(signal.SIGINT)
    stopped, checkpoint = fit(tmp_path, signal_at, accumulate)
    assert stopped.code == 130 and stopped.signum == signal.SIGINT and stopped.step == stops_after
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert saved["global_step"] == stops_after
    assert str(stopped) == (f"stopped by SIGINT after optimizer step {stops_after}; "
                            f"checkpoint {tmp_path / 'checkpoints' / 'last.ckpt'}")
    assert signal.getsignal(signal.SIGINT) is before  # Ctrl+C works as before once the run is over


DDP_SCRIPT = textwrap.dedent("""
    import json, os, signal, sys
    sys.path[:0] = [{repo!r}, {tests!r}]
    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.demos.boring_classes import BoringModel
    from callbacks import Preempted, PreemptionCheckpoint
    from test_preemption import SignalAtBatch

    trainer = Trainer(default_root_dir={out!r}, max_steps=50, accelerator="cpu", devices=2, strategy="ddp",
                      logger=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[ModelCheckpoint(dirpath={out!r} + "/checkpoints", save_last=True, save_top_k=0),
                                 PreemptionCheckpoint(), SignalAtBatch(signal.SIGTERM, batch=2, rank=0)])
    try:
        trainer.fit(BoringModel())
        result = {{"stopped": None}}
    except Preempted as stop:
        result = {{"stopped": stop.step, "code": stop.code}}
    with open(os.path.join({out!r}, f"rank{{trainer.global_rank}}.json"), "w") as f:
        json.dump(result | {{"global_step": trainer.global_step}}, f)
""")


def test_under_ddp_a_signal_to_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    script = tmp_path / "ddp_preempt.py"
    script.write_text(DDP_SCRIPT.format(repo=str(REPO), tests=str(pathlib.Path(__file__).parent), out=str(tmp_path)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PL_DISABLE_FORK": "1"}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1] == {"stopped": 3, "code": 143, "global_step": 3}, done.stderr[-3000:]
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 3
