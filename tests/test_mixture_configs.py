"""configs/study/retrieval_*.yaml (the study's retrieval arm): each arm is retrieval_base.yaml plus the
attention of the plain arm of the same name and its own run name; retrieval_base.yaml is the study's base plus the
train mixture (the corpus and synthetic retrieval documents, the synthetic share one option) and builds the study's
model and data at context 2048; each arm parses, instantiates and trains 2 CPU steps at a tiny shape (shape
overridden on the command line, the config's mixture as it is), its checkpoint holding the per-source counts. The study's callbacks and the
validation are left out of the run (time): tests/test_study_configs.py runs them on the same base, and validation
reads the corpus alone, as in the plain arms."""
import pathlib

import pytest
import torch
import yaml

from _corpus import write_slimpajama_layout
from datamodules import SlimPajamaDataModule
from train import main

REPO = pathlib.Path(__file__).resolve().parents[1]
STUDY = REPO / "configs" / "study"
ARMS = ("fpa", "fox", "sdpa")


pytestmark = pytest.mark.usefixtures("offline_in_tmp")  # tests/conftest.py


def test_the_retrieval_arms_are_the_plain_arms_plus_the_mixture():
    assert sorted(p.name for p in STUDY.glob("retrieval_*.yaml")) == [
        "retrieval_base.yaml", *(f"retrieval_{arm}.yaml" for arm in sorted(ARMS))]
    for arm in ARMS:
        plain, retrieval = (yaml.safe_load((STUDY / f"{name}.yaml").read_text()) for name in (arm, f"retrieval_{arm}"))
        assert retrieval == {"base": "retrieval_base.yaml", "model": plain["model"],
                             "trainer": {"logger": {"init_args": {"name": f"study_retrieval_{arm}"}}}}
        assert plain["base"] == "../base/study.yaml"
    base = yaml.safe_load((STUDY / "retrieval_base.yaml").read_text())
    assert base["base"] == "../base/study.yaml" and list(base) == ["base", "data"]
    init = base["data"]["init_args"]
    assert list(init) == ["mixture", "mixture_weights"]  # the study's data otherwise, unchanged
    assert init["mixture"]["corpus"] == {} and init["mixture"]["retrieval"]["synthetic"] == "retrieval"
    assert init["mixture_weights"] == {"corpus": "rest", "retrieval": 0.1}  # the synthetic share, one option


def test_retrieval_base_builds_the_study_model_and_mixture():
    """retrieval_base.yaml parses and instantiates at the study's shape (each arm does in its run below, and differs
    from it only in attention and run name: the test above)."""
    with torch.device("meta"):  # parameters counted, not initialised (tests/test_study_configs.py does the same)
        cli = main(["--config", str(STUDY / "retrieval_base.yaml"), "--trainer.logger=false"], run=False)
    assert cli.model.model.num_parameters() == 109_862_208  # the study's FPA (the base names no attention: FPA)
    dm = cli.datamodule
    assert isinstance(dm, SlimPajamaDataModule)
    assert (dm.seq_len, dm.batch_size, cli.trainer.max_steps) == (2048, 32, 390)
    assert {e.name: e.probability for e in dm.mixture} == pytest.approx({"corpus": 0.9, "retrieval": 0.1})
    options = dict(dm.mixture[1].options)
    assert options["filler"] == "corpus" and options["distance_law"] == "uniform"  # distances up to 2048, uniform
    assert (options["max_distance"], options["max_tokens"]) == (None, None)  # both the training length, seq_len


@pytest.fixture(scope="module")
def slimpajama_layout(tmp_path_factory) -> pathlib.Path:
    return write_slimpajama_layout(tmp_path_factory.mktemp("corpus"))


@pytest.mark.parametrize("arm", ARMS)
def test_retrieval_arm_two_step_cpu_run(arm, slimpajama_layout, tmp_path):
    runs = tmp_path / "runs"
    main(["fit", "--config", str(STUDY / f"retrieval_{arm}.yaml"), f"--data.init_args.source={slimpajama_layout}",
          "--trainer.accelerator=cpu", "--trainer.precision=32-true", "--trainer.max_steps=2",
          "--trainer.limit_val_batches=0", "--trainer.log_every_n_steps=1", "--trainer.enable_progress_bar=false",
          "--trainer.callbacks=[]", "--model.model.n_layer=2", "--model.model.d_model=64", "--model.model.n_head=1",
          "--model.model.d_mlp=128", "--model.model.attention.impl=chunked", "--data.init_args.seq_len=64",
          "--data.init_args.batch_size=2", "--data.init_args.max_val_batches=1", "--data.init_args.num_workers=0",
          "--data.init_args.mixture_weights.retrieval=0.5",  # the share, overridden as the pilot will
          f"--trainer.logger.init_args.save_dir={runs}"])
    checkpoint = torch.load(runs / f"study_retrieval_{arm}" / "version_0" / "checkpoints" / "last.ckpt",
                            weights_only=False)
    assert checkpoint["global_step"] == 2
    assert checkpoint["datamodule_hyper_parameters"]["mixture_weights"] == {"corpus": "rest", "retrieval": "0.5"}
    counts = checkpoint["SlimPajamaDataModule"]["ranks"][0]["stats"]["train"]["sources"]
    assert counts["corpus"]["tokens"] > 0 and counts["retrieval"]["documents"] > 0
