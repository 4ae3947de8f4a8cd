"""train.py predict: a file of prompts through PromptDataModule, predict_step and GenerationWriter, as JSONL."""
import json
import pathlib

import pytest

from datamodules.prompts import read_prompts
from fpa_lightning.generation import GenerationConfig
from train import main

QUICKSTART = pathlib.Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"
TINY_MODEL = ["--model.model.n_layer=2", "--model.model.d_model=32", "--model.model.n_head=2",
              "--model.model.d_mlp=64", "--data.init_args.seq_len=64"]  # the shapes of the ckpts fixture


def test_predict_writes_one_jsonl_line_per_prompt(tmp_path, monkeypatch, ckpts):
    monkeypatch.chdir(tmp_path)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "And God said"}\n\n{"prompt": "In the beginning God created the heaven"}\n'
                       '{"prompt": "Amen"}\n')
    out = tmp_path / "out" / "predictions.jsonl"
    main(["predict", "--config", str(QUICKSTART), *TINY_MODEL, "--trainer.logger=false", "--ckpt_path", ckpts["fpa"],
          "--data.class_path=datamodules.PromptDataModule", f"--data.init_args.prompts={prompts}",
          "--data.init_args.predict_batch_size=2", "--data.init_args.generation.max_new_tokens=4",
          "--data.init_args.generation.temperature=0.8", "--data.init_args.generation.prune_threshold=-5",
          f"--predictions.path={out}"])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in records] == [0, 1, 2]
    assert [r["prompt"] for r in records] == ["And God said", "In the beginning God created the heaven", "Amen"]
    assert all(r["new_tokens"] == 4 or r["ended"] for r in records)
    assert all(isinstance(r["completion"], str) and 0 < r["kept_fraction"] <= 1 for r in records)


def test_prompt_files_and_settings_are_checked(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: each JSONL record needs a string field 'prompt'"):
        read_prompts(str(bad))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_prompts(str(tmp_path / "missing.txt"))
    (tmp_path / "p.txt").write_text("first\n\n  second  \n")
    assert read_prompts(str(tmp_path / "p.txt")) == ["first", "  second  "]
    with pytest.raises(ValueError, match="prune_threshold must be <= 0"):
        GenerationConfig(prune_threshold=1.0)
    with pytest.raises(ValueError, match="they would be ignored"):
        GenerationConfig(top_p=0.9)
