"""train.py predict: a file of prompts through PromptDataModule, predict_step and GenerationWriter, as JSONL."""
import json
import pathlib

import pytest
import torch

from datamodules.prompts import read_prompts
from fpa_lightning.generation import GenerationConfig
from fpa_lightning.generation.naive import greedy_without_cache
from train import main

QUICKSTART = pathlib.Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"
TINY_MODEL = ["--model.model.n_layer=2", "--model.model.d_model=32", "--model.model.n_head=2",
              "--model.model.d_mlp=64", "--data.init_args.seq_len=64"]  # the shapes of the ckpts fixture


def test_predict_writes_one_jsonl_line_per_prompt(tmp_path, monkeypatch, ckpts, tokenizer):
    """Greedy predictions (batches of unequal prompt lengths through the KV cache) equal greedy decoding by full
    forward passes of the checkpoint's model: the completion is the text of those tokens, with their count."""
    from datamodules import BOS_ID, EOS_ID
    from fpa_lightning.evaluation.checkpoint import load_decoder
    from fpa_lightning.generation import continuation_text

    monkeypatch.chdir(tmp_path)
    texts = ["And God said", "In the beginning God created the heaven", "Amen"]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(f'{{"prompt": "{texts[0]}"}}\n\n{{"prompt": "{texts[1]}"}}\n{{"prompt": "{texts[2]}"}}\n')
    out = tmp_path / "out" / "predictions.jsonl"
    main(["predict", "--config", str(QUICKSTART), *TINY_MODEL, "--trainer.logger=false", "--ckpt_path", ckpts["fpa"],
          "--data.class_path=datamodules.PromptDataModule", f"--data.init_args.prompts={prompts}",
          "--data.init_args.predict_batch_size=2", "--data.init_args.generation.max_new_tokens=4",
          "--data.init_args.generation.temperature=0", f"--predictions.path={out}"])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in records] == [0, 1, 2]
    assert [r["prompt"] for r in records] == texts
    decoder = load_decoder(ckpts["fpa"], torch.device("cpu")).decoder
    for record, text in zip(records, texts):
        prompt = [BOS_ID, *tokenizer.encode(text, add_special_tokens=False).ids]
        expected = greedy_without_cache(decoder, prompt, 4, EOS_ID)
        assert record["completion"] == continuation_text(tokenizer, prompt, prompt + expected, (BOS_ID, EOS_ID))
        assert record["prompt_tokens"] == len(prompt) and record["new_tokens"] == len(expected)
        assert record["ended"] == (expected[-1] == EOS_ID) and record["kept_fraction"] == 1.0
    assert len({r["completion"] for r in records}) > 1  # the prompts are continued differently


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


def test_the_generation_settings_stay_with_the_data_module(tmp_path, tokenizer):
    """The settings (``data.init_args.generation``) and the EOS id are set once on the PromptDataModule, which
    predict_step reads; a batch holds data only."""
    from datamodules import EOS_ID, PromptDataModule

    (tmp_path / "p.txt").write_text("first\nsecond\nthird\n")
    data = PromptDataModule(str(tmp_path / "p.txt"), generation={"max_new_tokens": 3, "prune_threshold": -10},
                            predict_batch_size=2)
    assert data.generation == GenerationConfig(max_new_tokens=3, prune_threshold=-10.0) and data.eos_id == EOS_ID
    batches = list(data.predict_dataloader())
    assert [set(batch) for batch in batches] == [{"index", "prompt", "input_ids"}] * 2
    assert [batch["index"] for batch in batches] == [[0, 1], [2]]
