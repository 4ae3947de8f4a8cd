"""Training guards (issue #23): a non-finite loss stops the run naming the step, the batch's place in the data stream
and the last good checkpoint; no checkpoint with NaN/inf is written or becomes the best."""
import functools
import itertools
import pathlib
import re

import lightning as L
import pytest
import torch

from datamodules import TextDataModule
from modules import LanguageModel
from modules.guards import NonFiniteLossError
from test_train_cli import SHUFFLE_BLOCK, tiny_quickstart_args
from train import main


def all_finite(checkpoint: pathlib.Path) -> bool:
    state = torch.load(checkpoint, weights_only=True)
    tensors = list(state["state_dict"].values())
    for optimizer in state.get("optimizer_states", []):
        for per_param in optimizer["state"].values():
            tensors += [v for v in per_param.values() if torch.is_tensor(v)]
    return all(bool(torch.isfinite(t.float()).all()) for t in tensors)


def named_checkpoint(message: str) -> pathlib.Path | None:
    """The "last good checkpoint" an error names (None: it says there is none)."""
    found = re.search(r"last good checkpoint: (none|\S+\.ckpt)", message)
    assert found, message
    return None if found[1] == "none" else pathlib.Path(found[1])


def expected_position(batches: int) -> str:
    """The position the guard must name after `batches` train batches: the same stream as the tiny quickstart (offline
    corpus, 2 x 32 tokens, its shuffle window, one worker, seed 0), read without a trainer."""
    return first_positions()[batches - 1]


@functools.cache
def first_positions(n: int = 4) -> list[str]:
    """The stream's position after each of its first n batches, from one read (a data module starts its worker and
    tokeniser once instead of once per test)."""
    dm = TextDataModule(seq_len=32, batch_size=2, num_workers=1, shuffle_block=SHUFFLE_BLOCK)
    positions = []
    for _ in itertools.islice(iter(dm.train_dataloader()), n):
        positions.append(str(dm.last_train_batch))
    return positions


def poison(monkeypatch, when):
    """Make ``LanguageModel.token_losses`` return NaN for one token when ``when(module)`` holds."""
    original = LanguageModel.token_losses

    def token_losses(self, batch):
        losses = original(self, batch)
        if when(self):
            losses = losses.clone()
            losses[0, 0] = float("nan")
        return losses

    monkeypatch.setattr(LanguageModel, "token_losses", token_losses)


def nth_train_batch(n: int):
    """A `poison` predicate: true for the n-th training batch (micro-batch) of the run, never in validation."""
    calls = {"train": 0}

    def when(module):
        if module.training:
            calls["train"] += 1
            return calls["train"] == n
        return False

    return when


def test_a_nan_train_loss_stops_before_the_step_naming_batch_and_last_good_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    poison(monkeypatch, nth_train_batch(3))
    with pytest.raises(NonFiniteLossError) as info:
        main(tiny_quickstart_args(tmp_path / "runs", 6) + ["--checkpoint.every_n_train_steps=1"])
    folder = tmp_path / "runs" / "quickstart" / "version_0" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt", "step1.ckpt", "step2.ckpt"]
    assert all(all_finite(p) for p in folder.iterdir())
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 2  # step 3 never happened
    message = str(info.value)
    assert message.startswith(f"train/loss is not finite at optimizer step 3 (rank 0: loss nan at "
                              f"{expected_position(3)}). The run stops before that step changes the weights; ")
    good = named_checkpoint(message)
    assert good.resolve().parent == folder.resolve() and torch.load(good, weights_only=True)["global_step"] == 2


def test_with_gradient_accumulation_the_check_is_per_optimizer_step_and_names_the_micro_batch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    poison(monkeypatch, nth_train_batch(4))  # the second micro-batch of optimizer step 2
    with pytest.raises(NonFiniteLossError, match=r"at optimizer step 2 \(rank 0: loss nan at train batch 4 of rank "
                                                 r"0 \(logical worker 0: from \[pass 0, document \d+, token \d+\]") as info:
        main(tiny_quickstart_args(tmp_path / "runs", 4) + ["--checkpoint.every_n_train_steps=1",
                                                          "--trainer.accumulate_grad_batches=2"])
    assert f"loss nan at {expected_position(4)})" in str(info.value)
    assert torch.load(named_checkpoint(str(info.value)), weights_only=True)["global_step"] == 1


def test_a_partly_nan_validation_is_an_error_not_a_biased_mean(tmp_path, monkeypatch):
    """One NaN token among 4 x 2 x 32: MeanMetric used to drop it with a warning and log the mean of the rest."""
    monkeypatch.chdir(tmp_path)
    poison(monkeypatch, lambda module: not module.training and module.trainer.global_step >= 2)
    with pytest.raises(NonFiniteLossError, match=r"^val/loss is nan at step 2: some validation tokens gave a "
                                                 r"non-finite loss") as info:
        main(tiny_quickstart_args(tmp_path / "runs", 4) + [
            "--trainer.limit_val_batches=4", "--trainer.val_check_interval=1", "--checkpoint.monitor=val/loss",
            "--checkpoint.save_top_k=1", "--checkpoint.filename=step{step}-val_loss{val/loss:.4f}"])
    folder = tmp_path / "runs" / "quickstart" / "version_0" / "checkpoints"
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["last.ckpt", names[1]] and names[1].startswith("step1-val_loss")
    assert "nan" not in names[1] and all(all_finite(p) for p in folder.iterdir())
    assert torch.load(named_checkpoint(str(info.value)), weights_only=True)["global_step"] == 1


def test_a_learning_rate_of_1e9_stops_the_run_and_leaves_only_finite_checkpoints(tmp_path, monkeypatch):
    """The audit's run: lr 1e9 trained to the end with exit 0, a val_lossnan checkpoint as best_model_path and
    every tensor of last.ckpt non-finite."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NonFiniteLossError) as info:
        main(tiny_quickstart_args(tmp_path / "runs", 20) + [
            "--model.optim.lr=1e9", "--trainer.limit_val_batches=2", "--trainer.val_check_interval=1",
            "--checkpoint.monitor=val/loss", "--checkpoint.save_top_k=1", "--checkpoint.every_n_train_steps=1",
            "--checkpoint.filename=step{step}-val_loss{val/loss:.4f}"])
    folder = tmp_path / "runs" / "quickstart" / "version_0" / "checkpoints"
    written = list(folder.iterdir()) if folder.is_dir() else []
    assert all("nan" not in p.name and all_finite(p) for p in written)
    good = named_checkpoint(str(info.value))
    assert good is None or all_finite(good)


class _InfAtTrainEnd(L.Callback):
    def on_train_end(self, trainer, pl_module):
        with torch.no_grad():
            next(pl_module.parameters())[0] = float("inf")


def test_a_checkpoint_with_non_finite_weights_is_never_written(tmp_path):
    from test_language_model import fixed_batch_loader, tiny_config

    lm = LanguageModel(tiny_config(), optim={"warmup_steps": 1})
    trainer = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[_InfAtTrainEnd()])
    trainer.fit(lm, train_dataloaders=fixed_batch_loader(2))
    with pytest.raises(NonFiniteLossError, match="refusing to write a checkpoint at step 2: the weights or the "
                                                 "optimizer state hold NaN/inf values"):
        trainer.save_checkpoint(tmp_path / "bad.ckpt")
    assert list(tmp_path.iterdir()) == []
    with torch.no_grad():
        next(lm.parameters())[0] = 0.0
    trainer.save_checkpoint(tmp_path / "good.ckpt")  # finite again: written
    assert all_finite(tmp_path / "good.ckpt") and torch.load(tmp_path / "good.ckpt")["global_step"] == 2
