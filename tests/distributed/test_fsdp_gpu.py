"""FSDP on up to two GPUs (one GPU: the same code paths, a single shard) through ``python train.py fit --trainer.strategy=fsdp`` (FSDP needs CUDA: skipped elsewhere).

- Resume is exact with full and with sharded checkpoints: N straight steps vs N/2 + resume + N/2 end with the same
  weights (FPA on its fused kernel, bf16-mixed, gradient clipping through FSDP). Bitwise equality on a GPU needs
  ``--trainer.deterministic=true``: without it CUDA's embedding backward (among others) adds with atomics, and
  the last bits of a run are not reproducible.
- Every other backend trains under FSDP, and the callbacks' probe forwards (head statistics at every validation,
  long-context loss) finish instead of hanging: they gather the model to rank 0.
"""
import pytest
import torch
from _launch import differing, train_py, weights

pytestmark = pytest.mark.gpu
DEVICES = f"--trainer.devices={max(1, min(2, torch.cuda.device_count()))}"
STEPS = 6
SHARDED = ["--trainer.strategy=lightning.pytorch.strategies.FSDPStrategy",
           "--trainer.strategy.state_dict_type=sharded"]


def fsdp_fit(runs, *extra: str) -> None:
    train_py(runs, "--model.model.n_layer=2", "--data.init_args.seq_len=256",
             "--data.init_args.batch_size=4", "--data.init_args.num_workers=0", "--trainer.accelerator=gpu",
             DEVICES, "--trainer.strategy=fsdp", "--trainer.precision=bf16-mixed",
             "--model.model.attention.impl=auto", f"--trainer.max_steps={STEPS}", "--trainer.limit_val_batches=0",
             "--trainer.callbacks=[]", "--checkpoint.monitor=null", "--checkpoint.save_top_k=-1",
             "--checkpoint.filename=step{step}", f"--checkpoint.every_n_train_steps={STEPS // 2}",
             "--trainer.deterministic=true", *extra)


@pytest.mark.parametrize("checkpoints", ["full", "sharded"])
def test_fsdp_resume_is_exact(tmp_path, checkpoints):
    extra = SHARDED if checkpoints == "sharded" else []
    runs = tmp_path / "runs"
    fsdp_fit(runs, *extra)
    straight = runs / "quickstart" / "version_0" / "checkpoints"
    fsdp_fit(runs, *extra, f"--ckpt_path={straight / f'step{STEPS // 2}.ckpt'}")
    resumed = runs / "quickstart" / "version_1" / "checkpoints"
    a, b = weights(straight / f"step{STEPS}.ckpt"), weights(resumed / f"step{STEPS}.ckpt")
    assert not differing(a, b), f"weights differ after an FSDP resume ({checkpoints} checkpoints)"


@pytest.mark.parametrize("backend", ["fox", "sdpa", "selective", "dcp"])
def test_every_backend_and_the_callbacks_run_under_fsdp(tmp_path, backend):
    train_py(tmp_path / "runs", "--model.model.n_layer=2", f"--model.model.attention.backend={backend}",
             "--model.model.attention.impl=auto", "--data.init_args.seq_len=256", "--data.init_args.batch_size=4",
             "--data.init_args.num_workers=0", "--trainer.accelerator=gpu", DEVICES,
             "--trainer.strategy=fsdp", "--trainer.precision=bf16-mixed", "--trainer.max_steps=4",
             "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1", "--checkpoint.monitor=null",
             timeout=240)
