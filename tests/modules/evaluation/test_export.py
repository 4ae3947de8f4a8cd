"""eval.py export: a transformers folder (safetensors, config.json, the model's source for trust_remote_code, tokenizer,
model card); reloading gives identical logits; an existing folder is refused without --overwrite, and every file is
written under a temp name and renamed into place."""
import json
import os

import pytest
import torch

import safetensors  # noqa: E402, F401  (a declared dependency: a broken install fails, it is not skipped)
import transformers  # noqa: E402, F401  (the hf extra, in dev: a broken install fails, it is not skipped)
from eval import main  # noqa: E402
from fpa_lightning.evaluation.checkpoint import load_decoder  # noqa: E402
from fpa_lightning.export import load_hf  # noqa: E402
from fpa_lightning.hf.remote import remote_code_files  # noqa: E402

FILES = ["README.md", "checkpoint.json", "config.json", "generation_config.json", "model.safetensors",
         "tokenizer.json", "tokenizer_config.json"]


@pytest.mark.parametrize("backend", ["fpa", "sdpa"])
def test_export_round_trip_is_exact(tmp_path, ckpts, backend, capsys):
    out = tmp_path / backend
    assert main(["export", "--ckpt", ckpts[backend], "--out", str(out)]) == str(out)
    names = sorted(os.listdir(out))
    assert [n for n in names if not n.endswith(".py")] == FILES
    assert [n for n in names if n.endswith(".py")] == sorted(remote_code_files())
    printed = capsys.readouterr().out
    assert "with transformers (FPAForCausalLM): identical logits" in printed and f"{len(remote_code_files())} source files" in printed
    original = load_decoder(ckpts[backend], torch.device("cpu")).decoder
    reloaded = load_hf(str(out))
    ids = torch.randint(3, 32000, (2, 50))
    with torch.no_grad():
        assert torch.equal(original(ids), reloaded(ids))
    assert reloaded.lm_head.weight is reloaded.embed.weight  # tied embeddings stay tied
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "fpa_lightning" and config["attention"]["backend"] == backend
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_fpa_lightning.FPAForCausalLM"
    assert config["bos_token_id"] == 1 and config["d_model"] == 32
    card = (out / "README.md").read_text()
    for expected in (f"`{backend}`", "requested at training", "Training configuration", '"lr"', "load_hf",
                     "trust_remote_code=True"):
        assert expected in card
    assert ("prune_threshold=-10" in card) == (backend == "fpa")  # eviction needs a bias


def test_export_keeps_the_trained_implementation_and_rejects_misuse(tmp_path, ckpts, capsys):
    out = tmp_path / "naive"
    main(["export", "--ckpt", ckpts["fox"], "--out", str(out), "--impl", "naive"])
    assert json.loads((out / "config.json").read_text())["attention"]["impl"] == "naive"
    assert load_hf(str(out), impl="chunked").cfg.attention.impl == "chunked"
    moved = "eval.py: error: --export is now a verb of its own: python eval.py export --ckpt CKPT --out DIR"
    for argv, message in ((["export", "--ckpt", ckpts["fox"]], "eval.py export: error: the following arguments are "
                           "required: --out"),
                          (["export", "--ckpt", ckpts["fox"], "--out", str(out), "--compare", ckpts["fpa"]],
                           "eval.py export: error: unrecognized arguments: --compare"),
                          (["--export", "hf", "--ckpt", ckpts["fox"], "--out", str(out)], moved),
                          (["--task", "passkey", "--export", "hf", "--ckpt", ckpts["fox"]], moved)):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
        assert len(errors) == 1 and errors[0].startswith(message), argv
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match="not an fpa-lightning export"):
        load_hf(str(tmp_path / "other"))


def test_an_existing_folder_needs_overwrite_and_files_are_renamed_into_place(tmp_path, ckpts, capsys, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        main(["export", "--ckpt", ckpts["fpa"], "--out", str(out)])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error == (f"eval.py export: error: {out} already holds files (notes.txt), none of which the export would "
                     "replace; pass --overwrite to write the export beside them")
    assert os.listdir(out) == ["notes.txt"]  # nothing written

    renames = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (renames.append((src, dst)), real_replace(src, dst))[1])
    main(["export", "--ckpt", ckpts["fpa"], "--out", str(out), "--overwrite"])
    names = sorted(os.listdir(out))
    assert "notes.txt" in names and not [n for n in names if n.startswith(".tmp")]  # no temp file or folder left
    final = {dst for _, dst in renames if os.path.dirname(dst) == str(out)}
    assert final == {str(out / n) for n in names if n != "notes.txt"}  # every exported file arrived by a rename
    assert all(os.path.dirname(src).startswith(str(out)) for src, _ in renames)  # from inside the same folder
    first = (out / "model.safetensors").read_bytes()
    main(["export", "--ckpt", ckpts["fox"], "--out", str(out), "--overwrite"])
    assert (out / "model.safetensors").read_bytes() != first  # replaced by the fox model
    assert json.loads((out / "config.json").read_text())["attention"]["backend"] == "fox"
