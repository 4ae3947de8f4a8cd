"""Every YAML in configs/ goes through the real CLI parser and is instantiated; bad configs fail clearly."""
import pathlib

import pytest
import torch
import yaml

from datamodules import SlimPajamaDataModule, TextDataModule
from train import main

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = sorted(REPO.glob("configs/*.yaml"))
QUICKSTART = REPO / "configs" / "quickstart.yaml"
# Decoder.num_parameters() of the 110M configs (tied embeddings counted once); README's table shows them.
PARAMETERS_110M = {"fpa": 109_862_208, "fox": 109_640_592, "sdpa": 109_529_856, "selective": 109_529_856,
                   "dcp": 110_119_692}
PARAMETERS_1B = 1_074_630_144  # configs/fpa_1b.yaml: 24 x 2048, d_mlp 4096, tied embeddings


def instantiate(config: pathlib.Path, *overrides: str):
    """Parse and instantiate (model, data module, trainer) without running; no logger files, no network."""
    return main(["--config", str(config), "--trainer.logger=false", *overrides], run=False)


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_config_instantiates(config):
    if config.stem.endswith("_1b"):  # parameters on the meta device: counted, never allocated (4 GB) nor initialised
        with torch.device("meta"):
            cli = instantiate(config)
        assert cli.model.model.num_parameters() == PARAMETERS_1B
    else:
        cli = instantiate(config)
    model_cfg = cli.model.model.cfg
    assert model_cfg.max_seq_len == cli.datamodule.seq_len  # linked by train.py
    assert isinstance(cli.datamodule, TextDataModule)
    if config.stem.endswith("_110m"):
        backend = config.stem.removesuffix("_110m")
        assert model_cfg.attention.backend == backend
        assert (model_cfg.n_layer, model_cfg.d_model, model_cfg.n_head, model_cfg.vocab_size) == (12, 768, 12, 32000)
        assert cli.model.model.num_parameters() == PARAMETERS_110M[backend]
        assert isinstance(cli.datamodule, SlimPajamaDataModule) and cli.datamodule.seq_len == 2048
        assert cli.trainer.precision == "bf16-mixed"


def without_attention_and_name(config: pathlib.Path) -> dict:
    data = yaml.safe_load(config.read_text())
    del data["model"]["model"]["attention"]
    del data["trainer"]["logger"]["init_args"]["name"]
    return data


def test_110m_configs_differ_only_in_attention_and_run_name():
    first, *others = [without_attention_and_name(p) for p in CONFIGS if p.stem.endswith("_110m")]
    assert len(others) == 4 and all(other == first for other in others)


@pytest.mark.parametrize("override, message", [
    ("--model.model.attention.backend=bogus", "attention.backend must be one of"),
    ("--model.model.n_head=5", "model.n_head=5 must divide model.d_model=192"),
    ("--model.model.attention.bias_layers=[3]", "attention.bias_layers [3] out of range for n_layer=3"),
    ("--model.optim.warmup_steps=-1", "optim.warmup_steps must be non-negative"),
])
def test_bad_config_is_a_clear_parse_error(override, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        instantiate(QUICKSTART, override)
    assert exit_info.value.code == 2
    assert f"invalid configuration: {message}" in capsys.readouterr().err


def test_fused_on_cpu_fails_before_training():
    """LanguageModel.setup resolves the implementation on the run's device, before the first batch."""
    args = ["fit", "--config", str(QUICKSTART), "--model.model.attention.impl=fused", "--trainer.logger=false"]
    with pytest.raises(RuntimeError, match="attention.impl='fused' for backend 'fpa' needs a CUDA GPU"):
        main(args)
