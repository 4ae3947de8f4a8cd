"""configs/study/ (the language-model study, docs/lm_study.md): each config parses and builds the 110M model, the
three are overlays of configs/base/study.yaml that differ only in attention and run name, their resolved model section
is the paper-scale configs' one, and a 2-step CPU run of each (shape shrunk on the command line) trains on a corpus in
the SlimPajama layout and logs the head and long-context statistics."""
import pathlib

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from datamodules import SlimPajamaDataModule
from _corpus import write_slimpajama_layout
from train import main

REPO = pathlib.Path(__file__).resolve().parents[1]
# the three arms; the retrieval arm's configs (retrieval_*.yaml, issue #43) are tested in tests/test_mixture_configs.py
STUDY = sorted(p for p in (REPO / "configs" / "study").glob("*.yaml") if not p.stem.startswith("retrieval_"))
PARAMETERS_110M = {"fpa": 109_862_208, "fox": 109_640_592, "sdpa": 109_529_856}  # as in tests/test_configs.py


pytestmark = pytest.mark.usefixtures("offline_in_tmp")  # tests/conftest.py


def test_the_study_has_fpa_fox_and_softmax():
    assert [p.stem for p in STUDY] == ["fox", "fpa", "sdpa"]


@pytest.mark.parametrize("config", STUDY, ids=lambda p: p.stem)
def test_study_config_builds_the_110m_model(config):
    # parameters on the meta device: counted, not initialised (2-3 s each on 2 CPU cores; tests/test_configs.py
    # initialises base/110m.yaml's model for real)
    with torch.device("meta"):
        cli = main(["--config", str(config), "--trainer.logger=false"], run=False)
    cfg = cli.model.model.cfg
    assert cfg.attention.backend == config.stem
    assert cli.model.model.num_parameters() == PARAMETERS_110M[config.stem]
    assert isinstance(cli.datamodule, SlimPajamaDataModule)
    assert (cli.datamodule.seq_len, cli.datamodule.batch_size, cli.trainer.max_steps) == (2048, 32, 390)
    assert cli.trainer.precision == "bf16-mixed" and cli.trainer.accumulate_grad_batches == 1


def printed_config(capsys, config: pathlib.Path) -> dict:
    """The resolved config (an overlay merged over its bases) that ``--print_config`` prints."""
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config), "--print_config"])
    assert exit_info.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize("config", STUDY, ids=lambda p: p.stem)
def test_study_config_is_an_overlay_of_attention_and_name(config):
    """Each fact once: a study config holds its attention and run name; the rest is configs/base/study.yaml's."""
    data = yaml.safe_load(config.read_text())
    attention = {"backend": config.stem, "positional": "rope" if config.stem == "sdpa" else "none"}
    assert data == {"base": "../base/study.yaml", "model": {"model": {"attention": attention}},
                    "trainer": {"logger": {"init_args": {"name": f"study_{config.stem}"}}}}


def test_study_configs_share_everything_but_attention_and_name(capsys):
    def rest(path: pathlib.Path) -> dict:
        data = printed_config(capsys, path)
        del data["model"]["model"]["attention"]["backend"], data["model"]["model"]["attention"]["positional"]
        del data["trainer"]["logger"]["init_args"]["name"]
        return data

    first, *others = map(rest, STUDY)
    assert others and all(other == first for other in others)


@pytest.mark.parametrize("config", STUDY, ids=lambda p: p.stem)
def test_study_model_is_the_paper_scale_model(config, capsys):
    """The cluster version of each study run is configs/<backend>_110m.yaml: the same resolved model section."""
    paper = printed_config(capsys, REPO / "configs" / f"{config.stem}_110m.yaml")
    study = printed_config(capsys, config)
    assert study["model"]["model"] == paper["model"]["model"]
    assert study["model"]["model"]["attention"]["backend"] == config.stem


@pytest.fixture(scope="module")
def slimpajama_layout(tmp_path_factory) -> pathlib.Path:
    return write_slimpajama_layout(tmp_path_factory.mktemp("corpus"))


@pytest.mark.parametrize("config", STUDY, ids=lambda p: p.stem)
def test_study_config_two_step_cpu_run(config, slimpajama_layout, tmp_path):
    runs = tmp_path / "runs"
    main(["fit", "--config", str(config), f"--data.init_args.source={slimpajama_layout}",
          "--trainer.accelerator=cpu", "--trainer.precision=32-true", "--trainer.max_steps=2",
          "--trainer.val_check_interval=2", "--trainer.log_every_n_steps=1", "--trainer.enable_progress_bar=false",
          "--model.model.n_layer=2", "--model.model.d_model=64", "--model.model.n_head=1", "--model.model.d_mlp=128",
          "--model.model.attention.impl=chunked", "--data.init_args.seq_len=64", "--data.init_args.batch_size=2",
          "--data.init_args.max_val_batches=1", "--data.init_args.num_workers=0",
          f"--trainer.logger.init_args.save_dir={runs}"])
    version = runs / f"study_{config.stem}" / "version_0"
    events = EventAccumulator(str(version))
    events.Reload()
    tags = events.Tags()["scalars"]
    losses = [e.value for e in events.Scalars("train/loss")]
    assert len(losses) == 2 and all(0 < loss < 11 for loss in losses)  # ln 32000 = 10.37 at initialisation
    assert 0 < events.Scalars("val/loss")[-1].value < 11
    assert any(tag.startswith("long_context/") for tag in tags)  # the study's long-context callback ran
    if config.stem != "sdpa":  # softmax has no bias: its head statistics are off by design
        summary = {tag: events.Scalars(tag)[-1].value for tag in tags if tag.startswith("heads/summary/")}
        assert 0 < summary["heads/summary/median_alive_fraction"] <= 1
        assert summary["heads/summary/heads_with_bias"] == 2  # 2 layers x 1 head
    assert (version / "checkpoints" / "last.ckpt").is_file()
