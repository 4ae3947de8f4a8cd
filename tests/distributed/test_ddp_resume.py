"""Exact multi-rank resume: 2 DDP ranks on CPU (gloo), N straight steps vs N/2 + resume + N/2, weights bit-identical.

Each run is a real ``python train.py fit`` (Lightning launches the second rank as a subprocess of the first), on the
quickstart config shrunk to one layer of width 64 (one head), 128-token rows and 8 rows a rank. The width plays no
part in what is checked (any state left unrestored moves some weight) and a narrow layer spends the run's time on
the launch and the resume instead of on matrix products; the rows stay this long: after 3 steps of 8 rows of 128
tokens the two ranks' cursors differ (after 3 steps of 2 rows of 32 they sat at the same offset of their first
documents, so a checkpoint holding one rank's cursors twice would pass). Gloo's all-reduce is deterministic, so two
uninterrupted runs end with identical weights; a resumed run does too only if every rank's data cursors, the
optimizer and the schedule were restored.
"""
import pytest
import torch
from _launch import differing, train_py, weights

STEPS = 6


def ddp_fit(runs, *extra: str) -> None:
    train_py(runs, "--model.model.n_layer=1", "--model.model.d_model=64", "--model.model.n_head=1",
             "--model.model.d_mlp=128", "--data.init_args.seq_len=128", "--data.init_args.batch_size=8",
             "--data.init_args.num_workers=0", "--trainer.accelerator=cpu", "--trainer.devices=2",
             "--trainer.strategy=ddp", f"--trainer.max_steps={STEPS}", "--trainer.limit_val_batches=0",
             "--trainer.callbacks=[]", "--checkpoint.monitor=null", "--checkpoint.save_top_k=-1",
             "--checkpoint.filename=step{step}", f"--checkpoint.every_n_train_steps={STEPS // 2}", *extra)


@pytest.fixture(scope="module")
def straight_and_resumed(tmp_path_factory):
    runs = tmp_path_factory.mktemp("ddp") / "runs"
    ddp_fit(runs)
    straight = runs / "quickstart" / "version_0" / "checkpoints"
    ddp_fit(runs, f"--ckpt_path={straight / f'step{STEPS // 2}.ckpt'}")
    return straight, runs / "quickstart" / "version_1" / "checkpoints"


def test_two_rank_resume_ends_with_bit_identical_weights(straight_and_resumed):
    straight, resumed = straight_and_resumed
    changed = differing(weights(straight / f"step{STEPS}.ckpt"), weights(resumed / f"step{STEPS}.ckpt"))
    assert not changed, f"weights differ after resume: {changed}"


def test_the_checkpoint_holds_every_ranks_cursors(straight_and_resumed):
    straight, _ = straight_and_resumed
    state = torch.load(straight / f"step{STEPS // 2}.ckpt", weights_only=True)["TextDataModule"]
    assert state["world_size"] == 2 and len(state["ranks"]) == 2
    assert state["ranks"][0]["cursors"] != state["ranks"][1]["cursors"]  # disjoint shards, different positions
