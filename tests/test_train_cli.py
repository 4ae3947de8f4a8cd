"""train.py: config names, --print_config of the 110M configs, and exact resume from a mid-run checkpoint."""
import pathlib

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from train import main

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIGS_110M = sorted(REPO.glob("configs/*_110m.yaml"))


def test_the_promised_command_finds_its_config_from_anywhere(tmp_path, monkeypatch, capsys):
    """`python train.py fit --config fpa_110m.yaml` (README) from a folder without that file: configs/ is used."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", "fpa_110m.yaml", "--print_config"])
    assert exit_info.value.code in (0, None)
    captured = capsys.readouterr()
    assert f"using config {REPO / 'configs' / 'fpa_110m.yaml'}" in captured.err
    assert "backend: fpa" in captured.out
    (tmp_path / "fpa_110m.yaml").write_text((REPO / "configs" / "fox_110m.yaml").read_text())
    with pytest.raises(SystemExit):  # a file of that name in the working directory wins
        main(["fit", "--config=fpa_110m.yaml", "--print_config"])
    assert "backend: fox" in capsys.readouterr().out


def test_an_unknown_config_lists_the_available_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"config 'nope\.yaml' is neither a file nor in .*available: .*fpa_110m\.yaml"):
        main(["fit", "-c", "nope.yaml"])


def test_all_five_110m_configs_exist():
    assert {p.name for p in CONFIGS_110M} == {f"{b}_110m.yaml" for b in ("fpa", "fox", "sdpa", "selective", "dcp")}


@pytest.mark.parametrize("config", CONFIGS_110M, ids=lambda p: p.stem)
def test_print_config(config, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = capsys.readouterr().out
    assert f"backend: {config.stem.removesuffix('_110m')}" in printed
    assert "class_path: datamodules.SlimPajamaDataModule" in printed and "precision: bf16-mixed" in printed


def tiny_quickstart_args(runs: pathlib.Path, max_steps: int) -> list[str]:
    """The quickstart config shrunk to a 1-layer d=64 model on 2 x 32-token rows, no validation."""
    return [
        "fit", "--config", str(REPO / "configs" / "quickstart.yaml"),
        "--model.model.n_layer=1", "--model.model.d_model=64", "--model.model.n_head=1", "--model.model.d_mlp=128",
        "--data.init_args.seq_len=32", "--data.init_args.batch_size=2",
        f"--trainer.max_steps={max_steps}", "--trainer.limit_val_batches=0", "--trainer.log_every_n_steps=1",
        "--trainer.enable_progress_bar=false", f"--trainer.logger.init_args.save_dir={runs}",
        "--checkpoint.monitor=null", "--checkpoint.save_top_k=-1", "--checkpoint.filename=step{step}",
    ]


def logged(version_dir: pathlib.Path, tag: str) -> dict[int, float]:
    events = EventAccumulator(str(version_dir))
    events.Reload()
    return {e.step: e.value for e in events.Scalars(tag)}


def test_resume_continues_the_same_trajectory(tmp_path, monkeypatch):
    """8 straight steps (checkpoint after step 4) vs. a fresh process-like run resumed from that checkpoint.

    The resumed steps 5-8 must give *exactly* the same losses: on CPU the same weights, optimizer and
    LR-scheduler state, and the same batches (the data module restores its stream cursor) go through the
    same deterministic kernels, so any difference, however small, means some state was not restored.
    """
    monkeypatch.chdir(tmp_path)
    steps, runs = 8, tmp_path / "runs"
    main(tiny_quickstart_args(runs, steps) + [f"--checkpoint.every_n_train_steps={steps // 2}"])
    straight_dir = runs / "quickstart" / "version_0"
    mid_checkpoint = straight_dir / "checkpoints" / f"step{steps // 2}.ckpt"
    # A checkpoint holds only tensors and plain containers (evaluation loads with weights_only=True).
    assert torch.load(mid_checkpoint, weights_only=True)["global_step"] == steps // 2

    resumed = main(tiny_quickstart_args(runs, steps) + [f"--ckpt_path={mid_checkpoint}"])
    assert resumed.trainer.global_step == steps
    straight = logged(straight_dir, "train/loss")
    after_resume = logged(runs / "quickstart" / "version_1", "train/loss")
    assert len(straight) == steps and len(after_resume) == steps // 2
    assert after_resume == {step: straight[step] for step in after_resume}
    assert logged(runs / "quickstart" / "version_1", "train/lr") == {
        step: value for step, value in logged(straight_dir, "train/lr").items() if step in after_resume}


def test_the_test_subcommand_logs_test_loss_and_ppl(tmp_path, monkeypatch):
    """`python train.py test --config ...` runs a test loop over the data's test split."""
    monkeypatch.chdir(tmp_path)
    args = ["test", *tiny_quickstart_args(tmp_path / "runs", 1)[1:], "--trainer.limit_test_batches=2"]
    cli = main(args)
    metrics = cli.trainer.callback_metrics
    assert {"test/loss", "test/ppl"} <= set(metrics)
    assert metrics["test/ppl"].item() == pytest.approx(metrics["test/loss"].exp().item())
    assert logged(tmp_path / "runs" / "quickstart" / "version_0", "test/loss")
