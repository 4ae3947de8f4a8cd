"""An export folder (eval.py export) is accepted wherever a checkpoint is: load_decoder gives the checkpoint's logits
exactly and reports its step and hyper-parameters (from the folder's checkpoint.json); eval.py --ckpt and --compare
take it; a folder that is not an export is a one-line error that says what is expected."""
import dataclasses
import json
import os
import shutil

import pytest
import torch

import transformers  # noqa: E402, F401  (the hf extra, in dev: a broken install fails, it is not skipped)
from eval import main  # noqa: E402
from fpa_lightning.evaluation.checkpoint import CheckpointError, load_decoder  # noqa: E402
from fpa_lightning.export import PROVENANCE  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def exports(ckpts, tmp_path_factory):
    """{backend: export folder of ckpts[backend]} for fpa and sdpa."""
    root = tmp_path_factory.mktemp("exports")
    return {b: main(["export", "--ckpt", ckpts[b], "--out", str(root / b)]) for b in ("fpa", "sdpa")}


@pytest.mark.parametrize("backend", ["fpa", "sdpa"])
def test_an_export_folder_loads_as_its_checkpoint(ckpts, exports, backend):
    original, folder = load_decoder(ckpts[backend], CPU), load_decoder(exports[backend], CPU)
    ids = torch.randint(3, 32000, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(folder.decoder(ids), original.decoder(ids))
    assert dataclasses.asdict(folder.decoder.cfg) == dataclasses.asdict(original.decoder.cfg)
    # what eval.py's JSON header says about the model: the same but for where it was read from
    described = original.describe(CPU)
    assert folder.describe(CPU) == {**described, "path": os.path.abspath(exports[backend]),
                                    "exported_from": described["path"]}
    assert folder.global_step == original.global_step is not None
    assert folder.tokenizer == original.tokenizer  # so --compare with the checkpoint reads the same items
    assert folder.training == json.loads(json.dumps(original.training, default=str))
    assert folder.impl_at_training == original.impl_at_training


def test_an_export_without_checkpoint_json_loads_with_what_the_folder_has(ckpts, exports, tmp_path):
    older = shutil.copytree(exports["fpa"], tmp_path / "older")
    os.remove(older / PROVENANCE)  # an export written before the file, or a save_pretrained folder
    model, original = load_decoder(str(older), CPU), load_decoder(ckpts["fpa"], CPU)
    ids = torch.randint(3, 32000, (1, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model.decoder(ids), original.decoder(ids))
    assert model.global_step is None and model.source is None
    assert model.tokenizer == str(older / "tokenizer.json")
    assert model.impl_at_training == original.decoder.cfg.attention.impl
    assert "exported_from" not in model.describe(CPU)


def test_eval_takes_an_export_folder_as_ckpt_and_compare(ckpts, exports, tmp_path):
    args = ["--task", "test_loss", "--max-docs", "3", "--n-boot", "200"]
    alone = json.loads(open(main([*args, "--ckpt", exports["fpa"], "--out", str(tmp_path / "a")])).read())
    direct = json.loads(open(main([*args, "--ckpt", ckpts["fpa"], "--out", str(tmp_path / "b")])).read())
    assert alone["results"] == direct["results"]  # the same items, the same losses
    assert alone["checkpoint"]["exported_from"] == os.path.abspath(ckpts["fpa"])
    assert alone["checkpoint"]["global_step"] == direct["checkpoint"]["global_step"]
    paired = json.loads(open(main([*args, "--ckpt", exports["fpa"], "--compare", ckpts["fpa"],
                                   "--out", str(tmp_path / "c")])).read())
    losses = [model["loss"]["estimate"] for model in paired["results"]["models"]]
    assert losses[0] == losses[1] == direct["results"]["models"][0]["loss"]["estimate"]
    assert paired["results"]["difference"]["estimate"] == 0.0
    again = main(["export", "--ckpt", exports["fpa"], "--out", str(tmp_path / "again")])  # an export of the export
    assert load_decoder(again, CPU).describe(CPU) == {**load_decoder(exports["fpa"], CPU).describe(CPU),
                                                      "path": os.path.abspath(again)}


def test_a_folder_that_is_not_an_export_says_what_is_expected(exports, tmp_path, capsys):
    cut = shutil.copytree(exports["sdpa"], tmp_path / "cut")
    (cut / PROVENANCE).write_text('{"path": ')  # cut short
    with pytest.raises(CheckpointError, match="unreadable checkpoint.json"):
        load_decoder(str(cut), CPU)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"is a folder without config.json, not an export folder: give a "
                       r"checkpoint written by train.py .* or a folder written by eval.py export"):
        load_decoder(str(tmp_path / "empty"), CPU)
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(CheckpointError, match="not an fpa-lightning export"):
        load_decoder(str(tmp_path / "llama"), CPU)
    with pytest.raises(SystemExit):
        main(["--task", "test_loss", "--ckpt", str(tmp_path / "missing")])
    assert "or a folder written by eval.py export" in capsys.readouterr().err
