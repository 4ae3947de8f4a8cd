"""GenerationWriter (issue #23): one file per DDP rank, and an existing file is never truncated without overwrite."""
import json
import pathlib
from types import SimpleNamespace

import pytest

from callbacks import GenerationWriter
from train import main

QUICKSTART = pathlib.Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
TINY_MODEL = ["--model.model.n_layer=2", "--model.model.d_model=32", "--model.model.n_head=2",
              "--model.model.d_mlp=64", "--data.init_args.seq_len=64"]  # the shapes of the ckpts fixture


def fake_trainer(rank: int, world: int, log_dir: str) -> SimpleNamespace:
    return SimpleNamespace(global_rank=rank, world_size=world, log_dir=log_dir)


def test_each_ddp_rank_writes_its_own_file(tmp_path):
    writers = [GenerationWriter(str(tmp_path / "out" / "predictions.jsonl")) for _ in range(2)]
    for rank, writer in enumerate(writers):  # as two ranks of one run, each with its own callback instance
        writer.on_predict_start(fake_trainer(rank, 2, str(tmp_path)), None)
        writer._file.write(f'{{"rank": {rank}}}\n')
    for writer in writers:
        writer.on_predict_end(fake_trainer(0, 2, str(tmp_path)), None)
    assert [w.output_path for w in writers] == [str(tmp_path / "out" / f"predictions.rank{r}.jsonl") for r in (0, 1)]
    assert [json.loads((tmp_path / "out" / f"predictions.rank{r}.jsonl").read_text()) for r in (0, 1)] == [
        {"rank": 0}, {"rank": 1}]
    assert not (tmp_path / "out" / "predictions.jsonl").exists()
    single = GenerationWriter()  # one process: the plain name, by default in the log folder
    single.on_predict_start(fake_trainer(0, 1, str(tmp_path / "logs")), None)
    single.on_predict_end(fake_trainer(0, 1, str(tmp_path / "logs")), None)
    assert single.output_path == str(tmp_path / "logs" / "predictions.jsonl")


def test_an_existing_file_is_kept_unless_overwrite(tmp_path):
    out = tmp_path / "predictions.jsonl"
    out.write_text('{"earlier": "results"}\n')
    with pytest.raises(FileExistsError, match=r"predictions\.jsonl exists; pass another --predictions\.path, or "
                                              r"--predictions\.overwrite=true to replace it"):
        GenerationWriter(str(out)).on_predict_start(fake_trainer(0, 1, str(tmp_path)), None)
    assert out.read_text() == '{"earlier": "results"}\n'
    writer = GenerationWriter(str(out), overwrite=True)
    writer.on_predict_start(fake_trainer(0, 1, str(tmp_path)), None)
    writer.on_predict_end(fake_trainer(0, 1, str(tmp_path)), None)
    assert out.read_text() == ""


def test_train_py_predict_twice_refuses_to_truncate_the_first_results(tmp_path, monkeypatch, ckpts):
    monkeypatch.chdir(tmp_path)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("And God said\nAmen\n")
    out = tmp_path / "predictions.jsonl"
    args = ["predict", "--config", str(QUICKSTART), *TINY_MODEL, "--trainer.logger=false", "--ckpt_path", ckpts["fpa"],
            "--data.class_path=datamodules.PromptDataModule", f"--data.init_args.prompts={prompts}",
            "--data.init_args.generation.max_new_tokens=2", f"--predictions.path={out}"]
    main(args)
    first = out.read_text()
    assert [json.loads(line)["prompt"] for line in first.splitlines()] == ["And God said", "Amen"]
    with pytest.raises(FileExistsError, match="predictions.jsonl exists"):
        main(args)
    assert out.read_text() == first
    main(args + ["--predictions.overwrite=true"])
    assert [json.loads(line)["prompt"] for line in out.read_text().splitlines()] == ["And God said", "Amen"]
