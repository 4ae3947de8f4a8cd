"""train.py: config names, --print_config of the 110M configs, and exact resume from a mid-run checkpoint."""
import pathlib

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from train import main

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIGS_110M = sorted(REPO.glob("configs/*_110m.yaml"))
SHUFFLE_BLOCK = 2  # the tiny runs' train shuffle window (tiny_quickstart_args)


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
    """The quickstart config shrunk to a 1-layer d=64 model on 2 x 32-token rows, no validation. Train documents are
    shuffled within windows of 2 (SHUFFLE_BLOCK) instead of 64: a stream tokenises its first window before its first
    batch, and 64 KJV books took ~5 s of CPU per run, for steps that read a few hundred tokens."""
    return [
        "fit", "--config", str(REPO / "configs" / "quickstart.yaml"),
        "--model.model.n_layer=1", "--model.model.d_model=64", "--model.model.n_head=1", "--model.model.d_mlp=128",
        "--data.init_args.seq_len=32", "--data.init_args.batch_size=2",
        f"--data.init_args.shuffle_block={SHUFFLE_BLOCK}",
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


def tiny_overlay(folder: pathlib.Path) -> pathlib.Path:
    """A user's overlay (train.py's docstring, "Bases") of configs/quickstart.yaml, named without a folder (so found in
    configs/): the tiny model of tiny_quickstart_args, its own run name."""
    path = folder / "tiny.yaml"
    path.write_text("base: quickstart.yaml\n"
                    "trainer: {max_steps: 2, limit_val_batches: 0, log_every_n_steps: 1, enable_progress_bar: false,\n"
                    "          logger: {init_args: {name: tiny}}}\n"
                    "model: {model: {n_layer: 1, d_model: 64, n_head: 1, d_mlp: 128}}\n"
                    f"data: {{init_args: {{seq_len: 32, batch_size: 2, shuffle_block: {SHUFFLE_BLOCK}}}}}\n")
    return path


def test_an_overlay_works_with_every_subcommand_and_resume(tmp_path, monkeypatch, capsys):
    """--print_config of fit/validate/test/predict, fit, a --ckpt_path resume, validate, test and predict through an
    overlay: each sees the base's values under the overlay's, and each run's saved config.yaml is the full config."""
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    common = ["--config", str(tiny_overlay(tmp_path)), f"--trainer.logger.init_args.save_dir={runs}",
              "--checkpoint.monitor=null"]
    printed = {}
    for subcommand in ("fit", "validate", "test", "predict"):
        with pytest.raises(SystemExit):
            main([subcommand, *common, "--print_config"])
        printed[subcommand] = yaml.safe_load(capsys.readouterr().out)
        config = printed[subcommand]
        assert "base" not in config
        assert (config["model"]["model"]["n_layer"], config["model"]["model"]["vocab_size"]) == (1, 32000)  # over, base
        assert (config["data"]["init_args"]["seq_len"], config["data"]["init_args"]["source"]) == (32, "offline")
        assert config["trainer"]["logger"]["init_args"]["name"] == "tiny"
        assert config["trainer"]["precision"] == "32-true" and config["seed_everything"] == 0  # configs/quickstart.yaml

    main(["fit", *common])
    first = runs / "tiny" / "version_0"
    assert yaml.safe_load((first / "config.yaml").read_text()) == printed["fit"]  # the full merged config, no base key
    last = first / "checkpoints" / "last.ckpt"
    resumed = main(["fit", *common, "--trainer.max_steps=3", f"--ckpt_path={last}"])
    assert resumed.trainer.global_step == 3
    saved = yaml.safe_load((runs / "tiny" / "version_1" / "config.yaml").read_text())
    assert saved == {**printed["fit"], "trainer": {**printed["fit"]["trainer"], "max_steps": 3}, "ckpt_path": str(last)}

    validated = main(["validate", *common, "--trainer.limit_val_batches=1", f"--ckpt_path={last}"])
    assert "val/loss" in validated.trainer.callback_metrics
    tested = main(["test", *common, "--trainer.limit_test_batches=1", f"--ckpt_path={last}"])
    assert "test/loss" in tested.trainer.callback_metrics
    prompts, out = tmp_path / "prompts.txt", tmp_path / "predictions.jsonl"
    prompts.write_text("And God said\n")
    main(["predict", *common, f"--ckpt_path={last}", "--data.class_path=datamodules.PromptDataModule",
          f"--data.init_args.prompts={prompts}", "--data.init_args.generation.max_new_tokens=2",
          "--data.init_args.generation.temperature=0", f"--predictions.path={out}"])
    assert len(out.read_text().splitlines()) == 1


def test_bases_are_expanded_once_even_when_the_expanded_command_is_run_again():
    """A DDP launch re-runs train.py with the rewritten sys.argv: its bases are not added a second time."""
    from train import with_resolved_configs

    args = ["fit", "--config", "fpa_110m.yaml", "--trainer.devices=2", "-c", str(REPO / "configs" / "study" / "fox.yaml")]
    once = with_resolved_configs(args)
    configs = [pathlib.Path(arg).resolve() for option, arg in zip(once, once[1:]) if option in ("--config", "-c")]
    assert configs == [REPO / "configs" / name for name in
                       ("base/110m.yaml", "fpa_110m.yaml", "base/110m.yaml", "base/study.yaml", "study/fox.yaml")]
    assert with_resolved_configs(once) == once


def test_base_is_a_config_file_key_not_an_option():
    with pytest.raises(SystemExit, match="'base' is a key of a config file; on the command line, give the base as an "
                                         "earlier --config"):
        main(["fit", "--config", "quickstart.yaml", "--base=fpa_110m.yaml", "--print_config"])
