"""The files of an export folder: every one gets the mode a plain open() gives under the user's umask (safetensors
writes its own file 0600); an existing folder is refused naming the files the export would replace; --overwrite
replaces only the export's own files, and never a README.md that no export wrote."""
import os

import pytest
import torch

from _file_modes import mode, umask
import transformers  # noqa: E402,F401  declared in the dev extra: a broken install fails here rather than skips
from fpa_lightning import Decoder, ModelConfig  # noqa: E402
from fpa_lightning.export import CARD_MARKER, load_hf  # noqa: E402
from fpa_lightning.hf.save_export import ExportExistsError, save_export  # noqa: E402


def tiny_decoder(seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    return Decoder(ModelConfig(vocab_size=32000, n_layer=1, d_model=32, n_head=2, d_mlp=64, max_seq_len=64,
                               attention={"backend": "fpa", "impl": "chunked", "block_size": 16})).eval()


def export(folder, tokenizer, seed: int = 0, overwrite: bool = False) -> dict:
    return save_export(tiny_decoder(seed), str(folder), "# card\n", tokenizer, 1, 2, overwrite=overwrite,
                       provenance={"path": "/x.ckpt", "global_step": seed})


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_every_exported_file_gets_the_mode_of_a_plain_open(tmp_path, tokenizer, mask):
    with umask(mask):
        paths = export(tmp_path / "out", tokenizer)
    assert "model.safetensors" in paths and "checkpoint.json" in paths
    modes = {name: mode(path) for name, path in paths.items()}
    assert modes == {name: 0o666 & ~mask for name in paths}


def test_a_folder_with_files_is_refused_naming_what_would_be_replaced(tmp_path, tokenizer):
    out = tmp_path / "out"
    export(out, tokenizer)
    (out / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ExportExistsError) as refused:
        export(out, tokenizer, seed=1)
    message = str(refused.value)
    for name in ("README.md", "config.json", "model.safetensors", "tokenizer.json", "checkpoint.json",
                 "modeling_fpa_lightning.py"):
        assert name in message
    assert "the other files, notes.txt, would stay as they are" in message and "--overwrite" in message
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing written, no staging folder left

    only_mine = tmp_path / "mine"
    only_mine.mkdir()
    (only_mine / "notes.txt").write_text("mine")
    with pytest.raises(ExportExistsError, match=r"already holds files \(notes.txt\), none of which the export would "
                                                r"replace; pass --overwrite to write the export beside them"):
        export(only_mine, tokenizer)
    assert os.listdir(only_mine) == ["notes.txt"]


def test_overwrite_replaces_the_exports_files_and_keeps_the_users(tmp_path, tokenizer):
    out = tmp_path / "out"
    export(out, tokenizer)
    assert (out / "README.md").read_text().rstrip().endswith(CARD_MARKER)  # how a later export knows it as its own
    (out / "notes.txt").write_text("mine")
    export(out, tokenizer, seed=1, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine"
    ids = torch.randint(3, 32000, (1, 20))
    with torch.no_grad():
        assert torch.equal(load_hf(str(out))(ids), tiny_decoder(1)(ids))  # the new model replaced the old one


def test_overwrite_refuses_the_users_own_readme(tmp_path, tokenizer):
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("# my project\n")
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ExportExistsError, match=r"README.md is not a model card that eval.py export wrote.*move it "
                                                r"away"):
        export(out, tokenizer, overwrite=True)
    assert sorted(os.listdir(out)) == ["README.md", "notes.txt"]  # nothing replaced, nothing added
    assert (out / "README.md").read_text() == "# my project\n"
