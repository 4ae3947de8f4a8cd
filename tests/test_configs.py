"""Every YAML in configs/ goes through the real CLI parser and is instantiated (an overlay through its base); the
110M overlays hold only their attention and run name; a missing base or a cycle of bases is a clear error; bad configs
fail clearly."""
import os
import pathlib

import pytest
import torch
import yaml

from datamodules import SlimPajamaDataModule, TextDataModule
from train import SetupError, main

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = sorted(REPO.glob("configs/*.yaml"))
BASES = sorted(REPO.glob("configs/base/*.yaml"))  # the shared part of overlays (train.py's docstring, "Bases")
OVERLAYS_110M = [p for p in CONFIGS if p.stem.endswith("_110m")]
BASE_110M = REPO / "configs" / "base" / "110m.yaml"
QUICKSTART = REPO / "configs" / "quickstart.yaml"
# Decoder.num_parameters() of the 110M configs (tied embeddings counted once); docs/training.md's table shows them.
PARAMETERS_110M = {"fpa": 109_862_208, "fox": 109_640_592, "sdpa": 109_529_856, "selective": 109_529_856,
                   "dcp": 110_119_692}
PARAMETERS_1B = 1_074_630_144  # configs/fpa_1b.yaml: 24 x 2048, d_mlp 4096, tied embeddings
LADDER = sorted(REPO.glob("configs/ladder/*.yaml"))  # the size ladder's overlays, over configs/base/ladder_*.yaml


def instantiate(config: pathlib.Path, *overrides: str):
    """Parse and instantiate (model, data module, trainer) without running; no logger files, no network."""
    return main(["--config", str(config), "--trainer.logger=false", *overrides], run=False)


pytestmark = pytest.mark.usefixtures("offline_in_tmp")  # tests/conftest.py


def printed_config(capsys, *args: str) -> dict:
    """The resolved config that ``train.py fit <args> --print_config`` prints (the full merged one for an overlay)."""
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args, "--print_config"])
    assert exit_info.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


def test_every_config_file_is_instantiated_by_a_test():
    """configs/*.yaml, configs/base/*.yaml and configs/ladder/*.yaml here, configs/study/*.yaml in
    tests/test_study_configs.py."""
    every = set(REPO.glob("configs/**/*.yaml"))
    assert every == set(CONFIGS) | set(BASES) | set(LADDER) | set(REPO.glob("configs/study/*.yaml"))


# Instantiated with the parameters on the meta device: counted, never allocated nor initialised. The 1B config needs it
# (4 GB); the 110M overlays and base/study.yaml take it for time (2-3 s of random initialisation each on 2 CPU cores),
# while base/110m.yaml, the model they all build, and quickstart.yaml are initialised for real, and so is every backend
# in the small models of tests/attention.
ON_META = ({p for p in CONFIGS if p.stem.endswith(("_1b", "_110m"))} | {REPO / "configs" / "base" / "study.yaml"}
           | {p for p in BASES if p.stem.startswith("ladder_")})


@pytest.mark.parametrize("config", CONFIGS + BASES, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_config_instantiates(config):
    if config in ON_META:
        with torch.device("meta"):
            cli = instantiate(config)
        assert all(p.is_meta for p in cli.model.parameters())
    else:
        cli = instantiate(config)
    if config.stem.endswith("_1b"):
        assert cli.model.model.num_parameters() == PARAMETERS_1B
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


def without_attention_and_name(config: dict) -> dict:
    del config["model"]["model"]["attention"]["backend"], config["model"]["model"]["attention"]["positional"]
    del config["trainer"]["logger"]["init_args"]["name"]
    return config


def flat(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


@pytest.mark.parametrize("config", OVERLAYS_110M, ids=lambda p: p.stem)
def test_110m_overlay_is_its_base_plus_attention_and_run_name(config, capsys):
    """The file holds only what differs (each fact once); resolved, it is base/110m.yaml with its attention and name."""
    backend = config.stem.removesuffix("_110m")
    positional = "none" if backend in ("fpa", "fox") else "rope"
    assert flat(yaml.safe_load(config.read_text())) == {
        "base": "base/110m.yaml", "trainer.logger.init_args.name": config.stem,
        "model.model.attention.backend": backend, "model.model.attention.positional": positional}
    resolved = printed_config(capsys, "--config", str(config))
    assert resolved["trainer"]["logger"]["init_args"]["name"] == config.stem
    assert {k: resolved["model"]["model"]["attention"][k] for k in ("backend", "positional")} == {
        "backend": backend, "positional": positional}
    assert without_attention_and_name(resolved) == without_attention_and_name(
        printed_config(capsys, "--config", str(BASE_110M)))
    assert "base" not in resolved  # the key is the CLI's, never part of a config


def test_110m_configs_differ_only_in_attention_and_run_name(capsys):
    first, *others = [without_attention_and_name(printed_config(capsys, "--config", str(p))) for p in OVERLAYS_110M]
    assert len(others) == 4 and all(other == first for other in others)


CARD_110M = {  # docs/training.md "Configs": 12 layers, width 768, 12 heads, SwiGLU 2048, context 2048, 16 x 2048 x 16 tokens
    "seed_everything": 0, "trainer.accelerator": "auto", "trainer.devices": 1, "trainer.precision": "bf16-mixed",
    "trainer.max_steps": 5150, "trainer.accumulate_grad_batches": 16, "trainer.gradient_clip_val": 1.0,
    "trainer.val_check_interval": 8000, "trainer.check_val_every_n_epoch": None, "trainer.log_every_n_steps": 10,
    "trainer.logger.init_args.save_dir": "runs",
    "model.model.vocab_size": 32000, "model.model.n_layer": 12, "model.model.d_model": 768, "model.model.n_head": 12,
    "model.model.d_mlp": 2048, "model.model.tie_embeddings": True,
    "model.model.attention.impl": "auto", "model.model.attention.document_mask": False,
    "model.optim.lr": 1.0e-3, "model.optim.betas": [0.9, 0.95], "model.optim.weight_decay": 0.1,
    "model.optim.warmup_steps": 250, "model.optim.min_lr_ratio": 0.1,
    "data.class_path": "datamodules.SlimPajamaDataModule", "data.init_args.source": "cerebras/SlimPajama-627B",
    "data.init_args.seq_len": 2048, "data.init_args.batch_size": 16, "data.init_args.max_val_batches": 64,
    "data.init_args.num_workers": 4,
    "checkpoint.monitor": "val/loss", "checkpoint.save_last": True,
}


def test_fpa_110m_print_config_has_the_values_of_the_readme_card(capsys, monkeypatch):
    """`python train.py fit --config fpa_110m.yaml --print_config` (docs/training.md, "Configs"): the paper's setup as the card
    states it, from the overlay and its base together (the same output as before the configs became overlays)."""
    monkeypatch.chdir(REPO)
    resolved = flat(printed_config(capsys, "--config", "fpa_110m.yaml"))
    assert {key: resolved[key] for key in CARD_110M} == CARD_110M
    assert resolved["model.model.attention.backend"] == "fpa" and resolved["model.model.attention.positional"] == "none"
    assert resolved["trainer.logger.init_args.name"] == "fpa_110m"
    assert resolved["trainer.logger.class_path"] == "lightning.pytorch.loggers.TensorBoardLogger"
    assert [c["class_path"] for c in resolved["trainer.callbacks"]] == [
        "callbacks.HeadSurvivalCallback", "callbacks.LongContextLossCallback", "callbacks.ThroughputCallback"]
    assert resolved["trainer.callbacks"][0]["init_args"]["every_n_steps"] == 250
    assert resolved["trainer.callbacks"][1]["init_args"]["n_documents"] == 8


# The size ladder (docs/training.md, "The size ladder"): per rung (layers, width, heads, SwiGLU width, max_steps, lr,
# rows per micro-batch, accumulation, activation checkpointing). The 125M rung is the 110M configs above.
LADDER_RUNGS = {
    "350m": (24, 1024, 16, 2816, 13050, 5.0e-4, 16, 16, False),
    "760m": (24, 1536, 24, 4096, 27900, 4.0e-4, 8, 32, False),
    "1b": (24, 2048, 16, 4096, 41000, 3.0e-4, 8, 32, True),
}
BACKENDS = ("fpa", "fox", "sdpa", "selective", "dcp")


def parameters_by_formula(backend: str, n_layer: int, d_model: int, n_head: int, d_mlp: int, vocab: int = 32000,
                          dcp_dim: int = 32) -> int:
    """A Decoder's parameter count from its shape (fpa_lightning/model.py, attention/backends.py), tied embedding once:
    the embedding V·C; per block qkv 3C·C, out C·C, SwiGLU gate/up 2F·C and down C·F, two RMSNorm gains 2C; the final
    norm C; per bias layer the backend's gates: FPA's map to δ, g, h (3H·C weights + 3H biases) and β (H), FoX's forget
    gate (H·C + H), DCP's interaction map (2r·C, no bias) and offset (1); none for softmax and Selective."""
    C, H = d_model, n_head
    block = 3 * C * C + C * C + 2 * d_mlp * C + C * d_mlp + 2 * C
    gates = {"fpa": 3 * H * C + 3 * H + H, "fox": H * C + H, "dcp": 2 * dcp_dim * C + 1}.get(backend, 0)
    return vocab * C + n_layer * (block + gates) + C


def test_the_formula_gives_the_known_counts():
    for backend, count in PARAMETERS_110M.items():
        assert parameters_by_formula(backend, 12, 768, 12, 2048) == count
    assert parameters_by_formula("fpa", 24, 2048, 16, 4096) == PARAMETERS_1B


def test_the_ladder_has_every_backend_at_every_rung():
    assert sorted(p.stem for p in LADDER) == sorted(f"{b}_{rung}" for b in BACKENDS for rung in LADDER_RUNGS)
    assert sorted(p.stem for p in BASES if p.stem.startswith("ladder_")) == sorted(f"ladder_{r}" for r in LADDER_RUNGS)


@pytest.mark.parametrize("config", LADDER, ids=lambda p: p.stem)
def test_ladder_config(config):
    """Instantiated on the meta device: the backend, the shape (head dim 64 or 128, which every fused kernel
    supports), the parameter count against the formula, 524,288 tokens a step and ~20 tokens a parameter."""
    backend, rung = config.stem.split("_")
    positional = "none" if backend in ("fpa", "fox") else "rope"
    # the file holds only its base, attention and run name
    assert flat(yaml.safe_load(config.read_text())) == {
        "base": f"../base/ladder_{rung}.yaml", "trainer.logger.init_args.name": config.stem,
        "model.model.attention.backend": backend, "model.model.attention.positional": positional}
    n_layer, d_model, n_head, d_mlp, max_steps, lr, rows, accumulate, checkpointing = LADDER_RUNGS[rung]
    with torch.device("meta"):
        cli = instantiate(config)
    cfg = cli.model.model.cfg
    assert (cfg.attention.backend, cfg.attention.positional) == (backend, positional)
    assert (cfg.n_layer, cfg.d_model, cfg.n_head, cfg.d_mlp, cfg.vocab_size) == (n_layer, d_model, n_head, d_mlp, 32000)
    assert cfg.head_dim in (64, 128) and cfg.activation_checkpointing is checkpointing
    parameters = cli.model.model.num_parameters()
    assert parameters == parameters_by_formula(backend, n_layer, d_model, n_head, d_mlp)
    tokens_per_step = cli.datamodule.batch_size * cli.datamodule.seq_len * cli.trainer.accumulate_grad_batches
    assert (cli.datamodule.batch_size, cli.trainer.accumulate_grad_batches, tokens_per_step) == (rows, accumulate, 2**19)
    assert cli.trainer.max_steps == max_steps and 19.5 < max_steps * tokens_per_step / parameters < 20.5
    assert cli.model.optim.lr == lr < 1e-3  # below the 110M's, falling with width
    assert cli.trainer.precision == "bf16-mixed" and isinstance(cli.datamodule, SlimPajamaDataModule)
    listed = ("HeadSurvivalCallback", "LongContextLossCallback", "ThroughputCallback")  # (train.py adds its own)
    assert [type(c).__name__ for c in cli.trainer.callbacks if type(c).__name__ in listed] == list(listed)


def test_a_base_is_found_next_to_its_overlay_then_in_configs(tmp_path, capsys):
    """`base: <file>` is relative to the overlay's folder, else a name in configs/; bases chain, the farthest first."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "mid.yaml").write_text("base: fox_110m.yaml\nmodel: {optim: {lr: 0.002}}\n")  # configs/
    (tmp_path / "mine.yaml").write_text("base: sub/mid.yaml\ntrainer: {max_steps: 7}\n")  # next to mine.yaml
    resolved = printed_config(capsys, "--config", str(tmp_path / "mine.yaml"))
    assert (resolved["trainer"]["max_steps"], resolved["model"]["optim"]["lr"]) == (7, 0.002)
    assert resolved["model"]["model"]["attention"]["backend"] == "fox"  # configs/fox_110m.yaml
    assert resolved["trainer"]["accumulate_grad_batches"] == 16  # configs/base/110m.yaml, fox_110m's base


def test_a_missing_base_is_a_clear_error(tmp_path):
    (tmp_path / "mine.yaml").write_text("base: nowhere.yaml\ntrainer: {max_steps: 7}\n")
    with pytest.raises(SystemExit, match=r"config '.*mine\.yaml': its base 'nowhere\.yaml' is neither "
                                         r"'.*nowhere\.yaml' nor '.*configs/nowhere\.yaml'"):
        main(["fit", "--config", str(tmp_path / "mine.yaml")])
    (tmp_path / "list.yaml").write_text("base: [a.yaml, b.yaml]\n")
    with pytest.raises(SystemExit, match=r"'base' must be a file name, got \['a.yaml', 'b.yaml'\]"):
        main(["fit", "--config", str(tmp_path / "list.yaml")])


@pytest.mark.parametrize("files", [
    {"a.yaml": "base: a.yaml\n"},                                                   # itself
    {"a.yaml": "base: b.yaml\n", "b.yaml": "base: c.yaml\n", "c.yaml": "base: a.yaml\n"},  # a -> b -> c -> a
], ids=["self", "three"])
def test_a_cycle_of_bases_is_a_clear_error(tmp_path, files):
    for name, text in files.items():
        (tmp_path / name).write_text(text + "trainer: {max_steps: 7}\n")
    expected = " -> ".join(os.path.realpath(tmp_path / name) for name in [*files, "a.yaml"])
    with pytest.raises(SystemExit, match=r"the 'base' chain is a cycle: ") as exit_info:
        main(["fit", "--config", str(tmp_path / "a.yaml"), "--print_config"])
    assert str(exit_info.value).endswith(expected)


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
    with pytest.raises(SetupError, match="attention.impl='fused' for backend 'fpa' needs a CUDA GPU"):
        main(args)
