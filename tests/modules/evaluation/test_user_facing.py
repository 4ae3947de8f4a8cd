"""What eval.py tells its user: the plan and its estimated time, a progress bar, the data and tokenizer it uses, and
which attention implementation ran; a checkpoint's own tokenizer (no mistral-common needed) and a fused checkpoint
on a CPU."""
import json
import re

import pytest
import torch

from eval import main
from modules.evaluation import progress
from modules.evaluation.progress import CostModel, Progress, Work, calibrate, format_seconds


def run(tmp_path, name, *argv):
    with open(main([*argv, "--out", str(tmp_path / name), "--n-boot", "200"])) as f:
        return json.load(f)


def test_passkey_announces_its_plan_and_shows_progress(tmp_path, ckpts, capsys):
    run(tmp_path, "pk", "--task", "passkey", "--ckpt", ckpts["fpa"], "--compare", ckpts["fox"],
        "--lengths", "128", "--trials", "3")
    err = capsys.readouterr().err
    assert "passkey: 6 prompts" in err and "estimated" in err and "on cpu" in err
    assert "passkey [128 B]: 6/6 prompts" in err and "tok/s" in err and "ETA 0:00" in err  # the closing line
    assert "A: " in err and "attention fpa:chunked on cpu" in err and "B: " in err
    assert "tokenizer: offline Mistral-7B" in err


def test_pg19_long_names_its_corpus(tmp_path, ckpts, capsys):
    r = run(tmp_path, "pg", "--task", "pg19_long", "--ckpt", ckpts["fpa"], "--max-len", "64", "--max-docs", "2")
    err = capsys.readouterr().err
    assert "data: offline corpus: the King James Bible" in err and "not PG-19" in err
    assert "King James Bible" in r["data"]["source"] and "pg19_long: 2 documents" in err
    assert r["tokenizer"].startswith("offline Mistral")


def test_progress_bar_lines_and_estimate(capsys):
    costs = [CostModel(1e-3, 1e-6), CostModel(2e-3, 0.0)]
    bar = Progress("demo", [Work(0, [100, 200]), Work(1, [100])], costs, unit="prompts", log_every=0.0)
    bar.set_stage("x")
    bar.advance(100, 0)
    line = capsys.readouterr().err.strip()
    assert line.startswith("demo [x]: 1/3 prompts") and "tok/s" in line and "ETA" in line
    done, total = costs[0].seconds(100), costs[0].seconds(100) + costs[0].seconds(200) + costs[1].seconds(100)
    assert bar.cost_done == pytest.approx(done) and bar.total_cost == pytest.approx(total)
    bar.advance(200, 0)
    bar.advance(100, 1)
    bar.close()
    err = capsys.readouterr().err
    assert "3/3 prompts" in err
    took = re.search(r"demo: took (\S+), estimated (\S+) \((\d+\.\d+)x the estimate\)", err)
    assert took and took.group(2) == format_seconds(total), err
    unfinished = Progress("cut", [Work(0, [100, 200])], costs, log_every=0.0)
    unfinished.advance(100, 0)
    unfinished.close()
    assert "took" not in capsys.readouterr().err  # the ratio means something only for the whole plan
    fit = CostModel.fit(1000, 2.5, 2000, 6.5, constant=0.5)  # 0.5 + 1e-3·T + 1e-6·T²
    assert fit.linear == pytest.approx(1e-3) and fit.quadratic == pytest.approx(1e-6) and fit.constant == 0.5
    assert fit.seconds(4000) == pytest.approx(0.5 + 4 + 16)


def fake_clock(monkeypatch, cost):
    """progress's clock advanced by cost(T) seconds per scored input of T tokens; returns the lengths scored."""
    now, scored = [0.0], []
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])

    def score(decoder, ids):
        scored.append(ids.shape[1])
        now[0] += cost(ids.shape[1])

    return score, scored


@pytest.mark.parametrize("longest, timed", [(8192, [2048, 8192]), (2048, [1024, 2048]), (None, [1024, 2048])])
def test_calibrate_interpolates_up_to_the_longest_item(monkeypatch, longest, timed):
    """Warm-up passes first (untimed, at every length the fit times: 16 tokens and its two points), then the fit's
    points: with a longer item, the calibration length and that item, so both lengths are predicted exactly,
    whatever the curve between, and a first call's cost at a new length (a kernel compiled for it) stays out; the old
    points (half and all of 2048) extrapolated this curve to 8192 at 1.4x its cost."""
    decoder = torch.nn.Linear(1, 1)
    decoder.cfg = type("Cfg", (), {"vocab_size": 10})()
    seen = set()

    def cost(T, first_call=True):  # neither linear nor quadratic, and 1 s more the first time a length is scored
        extra = 1.0 if first_call and T not in seen else 0.0
        seen.add(T) if first_call else None
        return 0.01 + 1e-5 * T ** 1.5 + extra

    score, scored = fake_clock(monkeypatch, cost)
    fit = calibrate(decoder, 2048, score, longest)
    assert scored == [16, *timed, *timed, 16]
    for T in timed:
        assert fit.seconds(T) == pytest.approx(cost(T, first_call=False), rel=1e-9)
    if longest == 8192:
        old = calibrate(decoder, 2048, score)
        assert old.seconds(8192) / cost(8192) > 1.3


def test_calibrate_costs_one_item_of_a_batched_score(monkeypatch):
    """A score that takes rows(T) items of T tokens per call (cache_prune's real eviction) gets ids (rows(T), T),
    and one item costs the call's time over rows(T): the fixed cost of a call is shared by its rows."""
    decoder = torch.nn.Linear(1, 1)
    decoder.cfg = type("Cfg", (), {"vocab_size": 10})()
    now, shapes = [0.0], []
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])

    def call_cost(rows, T):
        return 0.05 + 1e-6 * rows * T + 1e-10 * rows * T * T

    def score(decoder, ids):
        shapes.append(tuple(ids.shape))
        now[0] += call_cost(*ids.shape)

    def rows(T):
        return max(1, 8192 // (T - 1))

    fit = calibrate(decoder, 2048, score, 8192, rows=rows)
    assert set(shapes) == {(546, 16), (4, 2048), (1, 8192)}
    for T in (2048, 8192):
        assert fit.seconds(T) == pytest.approx(call_cost(rows(T), T) / rows(T), rel=1e-9)


def edited_checkpoint(source, path, model=None, datamodule=None):
    ckpt = torch.load(source, map_location="cpu", weights_only=True)
    if model:
        ckpt["hyper_parameters"]["model"]["attention"].update(model)
    if datamodule is not None:
        ckpt["datamodule_hyper_parameters"] = datamodule
    torch.save(ckpt, path)
    return str(path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fused kernel runs on a GPU")
def test_fused_checkpoint_runs_chunked_on_a_cpu_and_says_so(tmp_path, ckpts, capsys):
    fused = edited_checkpoint(ckpts["fpa"], tmp_path / "fused.ckpt", model={"impl": "fused"})
    r = run(tmp_path, "fused", "--task", "passkey", "--ckpt", fused, "--lengths", "128", "--trials", "1")
    assert r["checkpoint"]["impl_at_training"] == "fused" and r["checkpoint"]["impl_per_layer"] == ["fpa:chunked"] * 2
    assert "trained with impl=fused" in r["checkpoint"]["impl_note"]
    assert "trained with impl=fused" in capsys.readouterr().err


def test_the_checkpoints_tokenizer_is_used_without_mistral_common(tmp_path, ckpts, tokenizer, monkeypatch, capsys):
    import datamodules.tokenizer as tok

    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    ckpt = edited_checkpoint(ckpts["fpa"], tmp_path / "own_tok.ckpt", datamodule={"tokenizer": str(path)})

    def no_mistral_common():
        raise ModuleNotFoundError("mistral-common is not installed (`pip install mistral-common`)")

    monkeypatch.setattr(tok, "_offline_mistral", no_mistral_common)
    r = run(tmp_path, "own", "--task", "passkey", "--ckpt", ckpt, "--lengths", "128", "--trials", "1")
    assert r["tokenizer"] == str(path) and r["checkpoint"]["tokenizer_at_training"] == str(path)
    # the default tokenizer needs mistral-common: the error says what to do
    with pytest.raises(SystemExit):
        main(["--task", "passkey", "--ckpt", ckpts["fpa"], "--lengths", "128", "--trials", "1"])
    assert "mistral-common is not installed" in capsys.readouterr().err
    r = run(tmp_path, "flag", "--task", "passkey", "--ckpt", ckpts["fpa"], "--tokenizer", str(path),
            "--lengths", "128", "--trials", "1")
    assert r["tokenizer"] == str(path)


def test_missing_or_disagreeing_tokenizers_are_clear_errors(tmp_path, ckpts, capsys):
    gone = edited_checkpoint(ckpts["fpa"], tmp_path / "gone.ckpt", datamodule={"tokenizer": "tokenizer.json"})
    with pytest.raises(SystemExit):
        main(["--task", "passkey", "--ckpt", gone, "--lengths", "128", "--trials", "1"])
    err = capsys.readouterr().err
    assert "training tokenizer (tokenizer.json)" in err and "--tokenizer" in err
    with pytest.raises(SystemExit):
        main(["--task", "passkey", "--ckpt", gone, "--compare", ckpts["fox"], "--lengths", "128"])
    assert "different tokenizers" in capsys.readouterr().err
