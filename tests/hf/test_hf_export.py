"""The export folder: transformers loads it with the registered classes and, in a fresh process that cannot import
fpa_lightning, with trust_remote_code=True alone (identical logits and greedy tokens); AutoTokenizer gives our ids;
the copied source is the installed one; LanguageModel and train.py start from it."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import transformers  # noqa: E402,F401  declared in the dev extra: a broken install fails here rather than skips
from _hf_helpers import left_padded  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.dynamic_module_utils import get_relative_import_files  # noqa: E402

from fpa_lightning import Decoder, ModelConfig  # noqa: E402
from fpa_lightning.generation import generate  # noqa: E402
from fpa_lightning.hf.save_export import save_export  # noqa: E402
from fpa_lightning.hf.remote import (  # noqa: E402
    AUTO_MAP,
    ENTRY_FILES,
    flat_name,
    remote_code_files,
    source_path,
    write_remote_code,
)

REPO = pathlib.Path(__file__).resolve().parents[2]
TEXTS = ["In the beginning God created the heaven and the earth.", "  two  spaces,\ttabs\n\nand newlines  ",
         "a literal <s> and </s> stay text", "ünïcödé 日本語 🙂 bytes", "The LORD is my shepherd; I shall not want.", ""]
# Runs in a fresh interpreter whose PYTHONPATH lacks the repository. The editable install's import finder would still
# find fpa_lightning, so the script first makes importing it, the Lightning layer and the entry points fail.
REMOTE_SCRIPT = """
import sys
BLOCKED = ("fpa_lightning", "datamodules", "modules", "callbacks", "eval", "train")
for name in BLOCKED:
    sys.modules[name] = None
try:
    import fpa_lightning
except ImportError:
    pass
else:
    raise SystemExit("fpa_lightning is importable")
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, inputs, output = sys.argv[1:]
ids, batch, mask, steps, texts = torch.load(inputs)
model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
with torch.no_grad():
    logits = model(ids).logits
torch.save({"module": type(model).__module__, "logits": logits,
            "greedy": model.generate(ids, max_new_tokens=steps, do_sample=False),
            "pruned": model.generate(ids, max_new_tokens=steps, do_sample=False, prune_threshold=-1.0),
            "batch": model.generate(batch, attention_mask=mask, max_new_tokens=steps, do_sample=False),
            "token_ids": [tokenizer(text)["input_ids"] for text in texts],
            "loaded": [k for k, v in sys.modules.items() if k.split(".")[0] in BLOCKED and v is not None]}, output)
"""


def tiny_decoder(seed: int = 0, **cfg) -> Decoder:
    """A float32 FPA Decoder over the real vocabulary (32000), 2 layers of width 32, random gate maps."""
    torch.manual_seed(seed)
    defaults = dict(vocab_size=32000, n_layer=2, d_model=32, n_head=2, d_mlp=64, max_seq_len=64,
                    attention={"backend": "fpa", "impl": "chunked", "block_size": 16})
    decoder = Decoder(ModelConfig(**{**defaults, **cfg}))
    with torch.no_grad():
        for block in decoder.blocks:
            block.attn.backend.gate.weight.normal_(0.0, 2.0)
    return decoder.eval()


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tokenizer):
    decoder = tiny_decoder()
    folder = tmp_path_factory.mktemp("export") / "fpa"
    save_export(decoder, str(folder), "# card\n", tokenizer, 1, 2)
    return decoder, folder


def test_trust_remote_code_in_a_process_without_fpa_lightning(exported, tokenizer, tmp_path):
    decoder, folder = exported
    ids = torch.randint(3, 32000, (1, 12), generator=torch.Generator().manual_seed(0))
    rows = [ids[0, :7], ids[0, 2:7]]
    batch, mask = left_padded(rows)
    torch.save((ids, batch, mask, 8, TEXTS), tmp_path / "inputs.pt")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": "", "HF_MODULES_CACHE": str(tmp_path / "m"),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", REMOTE_SCRIPT, str(folder), str(tmp_path / "inputs.pt"),
                          str(tmp_path / "out.pt")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = torch.load(tmp_path / "out.pt")
    assert out["module"].startswith("transformers_modules.") and out["loaded"] == []
    with torch.no_grad():
        assert torch.equal(out["logits"], decoder(ids))
    assert torch.equal(out["greedy"], generate(decoder, ids, 8))
    assert torch.equal(out["pruned"], generate(decoder, ids, 8, prune_threshold=-1.0))
    ours = generate(decoder, rows, 8)
    assert out["batch"][:, batch.shape[1]:].tolist() == [row[-8:].tolist() for row in ours]
    assert out["token_ids"] == [[1, *tokenizer.encode(text, add_special_tokens=False).ids] for text in TEXTS]


def test_registered_classes_load_the_export_and_save_it_without_a_claim_to_code(exported, tmp_path):
    decoder, folder = exported
    model = AutoModelForCausalLM.from_pretrained(folder).eval()  # no trust_remote_code: fpa_lightning.hf's classes
    assert type(model).__module__ == "fpa_lightning.hf.modeling"
    ids = torch.randint(3, 32000, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, decoder(ids))
    model.save_pretrained(tmp_path)  # no source files written, so config.json must not name them
    assert "auto_map" not in json.loads((tmp_path / "config.json").read_text())
    write_remote_code(str(tmp_path))
    assert json.loads((tmp_path / "config.json").read_text())["auto_map"] == AUTO_MAP
    assert {p.name: p.read_text(encoding="utf-8") for p in tmp_path.glob("*.py")} == remote_code_files()
    with torch.no_grad():
        assert torch.equal(AutoModelForCausalLM.from_pretrained(tmp_path)(ids).logits, decoder(ids))


def test_auto_tokenizer_gives_our_ids(exported, tokenizer):
    _, folder = exported
    auto = AutoTokenizer.from_pretrained(folder)
    assert (auto.bos_token_id, auto.eos_token_id, auto.unk_token_id) == (1, 2, 0)
    for text in TEXTS:
        ours = tokenizer.encode(text, add_special_tokens=False).ids
        assert auto(text, add_special_tokens=False)["input_ids"] == ours
        assert auto(text)["input_ids"] == [1, *ours]  # BOS first, as every training document began
        assert auto.decode(ours) == tokenizer.decode(ours)


def test_the_copied_source_is_the_installed_source(exported):
    _, folder = exported
    written = {p.name: p.read_text(encoding="utf-8") for p in folder.glob("*.py")}
    assert written == remote_code_files()  # regenerated now from the installed package: identical
    # transformers copies an entry module and what it imports as `from .name import`: that must be every file
    entries = [folder / f"{name}.py" for name in ENTRY_FILES.values()]
    reached = {pathlib.Path(p).name for entry in entries for p in get_relative_import_files(entry)}
    assert reached | {e.name for e in entries} == set(written)
    # apart from the two header lines and the package imports, a copy is its source line for line
    naive = written[flat_name("fpa_lightning.ops.fpa.naive") + ".py"].splitlines()[2:]
    source = source_path("fpa_lightning.ops.fpa.naive").read_text(encoding="utf-8").splitlines()
    assert [line for line in naive if "import" not in line] == [line for line in source if "import" not in line]


def test_language_model_and_train_cli_start_from_the_export(exported, tmp_path, monkeypatch):
    from modules import LanguageModel
    from train import main

    decoder, folder = exported
    ids = torch.randint(3, 32000, (2, 16), generator=torch.Generator().manual_seed(2))
    module = LanguageModel(decoder.cfg, init_from=str(folder))
    with torch.no_grad():
        assert torch.equal(module.model.eval()(ids), decoder(ids))
    assert "init_from" not in module.hparams  # a checkpoint restores its own weights
    other = tiny_decoder(n_layer=1, attention={"backend": "fox", "impl": "chunked"})
    with pytest.raises(ValueError, match=r"n_layer: 1 vs 2; attention.backend: 'fox' vs 'fpa'"):
        LanguageModel(other.cfg, init_from=str(folder))

    monkeypatch.chdir(tmp_path)
    shape = ["--model.model.n_layer=2", "--model.model.d_model=32", "--model.model.n_head=2", "--model.model.d_mlp=64",
             "--data.init_args.seq_len=64", "--trainer.logger=false"]
    cli = main(["--config", str(REPO / "configs" / "quickstart.yaml"), *shape, f"--model.init_from={folder}"],
               run=False)
    with torch.no_grad():
        assert torch.equal(cli.model.model.eval()(ids), decoder(ids))
