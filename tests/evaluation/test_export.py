"""--export hf: safetensors + config.json + model card + tokenizer.json; reloading gives identical logits."""
import json
import os

import pytest
import torch

pytest.importorskip("safetensors", reason="a project dependency; absent on a bare GPU machine")
from eval import main  # noqa: E402
from fpa_lightning.evaluation.checkpoint import load_decoder  # noqa: E402
from fpa_lightning.export import load_hf  # noqa: E402


@pytest.mark.parametrize("backend", ["fpa", "sdpa"])
def test_export_round_trip_is_exact(tmp_path, ckpts, backend, capsys):
    out = tmp_path / backend
    assert main(["--export", "hf", "--ckpt", ckpts[backend], "--out", str(out)]) == str(out)
    assert sorted(os.listdir(out)) == ["README.md", "config.json", "model.safetensors", "tokenizer.json"]
    assert "identical logits" in capsys.readouterr().out
    original = load_decoder(ckpts[backend], torch.device("cpu")).decoder
    reloaded = load_hf(str(out))
    ids = torch.randint(3, 32000, (2, 50))
    with torch.no_grad():
        assert torch.equal(original(ids), reloaded(ids))
    assert reloaded.lm_head.weight is reloaded.embed.weight  # tied embeddings stay tied
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "fpa_lightning" and config["fpa_lightning"]["attention"]["backend"] == backend
    assert config["bos_token_id"] == 1 and config["hidden_size"] == 32
    card = (out / "README.md").read_text()
    for expected in (f"`{backend}`", "requested at training", "Training configuration", '"lr"', "load_hf"):
        assert expected in card


def test_export_keeps_the_trained_implementation_and_rejects_misuse(tmp_path, ckpts, capsys):
    out = tmp_path / "naive"
    main(["--export", "hf", "--ckpt", ckpts["fox"], "--out", str(out), "--impl", "naive"])
    assert json.loads((out / "config.json").read_text())["fpa_lightning"]["attention"]["impl"] == "naive"
    assert load_hf(str(out), impl="chunked").cfg.attention.impl == "chunked"
    for argv, message in ((["--export", "hf", "--ckpt", ckpts["fox"]], "--out is required"),
                          (["--task", "passkey", "--export", "hf", "--ckpt", ckpts["fox"]], "one of --task")):
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match="not an fpa-lightning export"):
        load_hf(str(tmp_path / "other"))
