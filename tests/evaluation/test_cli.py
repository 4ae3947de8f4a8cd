"""eval.py end to end on tiny checkpoints: every task writes its JSON and PNG; bad arguments are clear errors."""
import json
import os

import pytest

from eval import main

FAST = ["--n-boot", "200"]


def run(tmp_path, name, *argv):
    out = tmp_path / name
    path = main([*argv, "--out", str(out), *FAST])
    with open(path) as f:
        record = json.load(f)  # strict JSON (no NaN / Infinity literals)
    for png in record["figures"].values():
        assert os.path.getsize(out / png) > 1000  # named beside the JSON
    assert record["versions"]["torch"] and record["versions"]["lightning"]
    return record


def words(n: int, seed: int) -> str:
    import random

    rng = random.Random(seed)
    vocab = "the king said unto them that he would go and see the city of david in the morning".split()
    return " ".join(rng.choice(vocab) for _ in range(n))


def test_pg19_long_on_the_offline_corpus_with_compare(tmp_path, ckpts):
    r = run(tmp_path, "pg", "--task", "pg19_long", "--ckpt", ckpts["fpa"], "--compare", ckpts["fox"],
            "--max-len", "128", "--max-docs", "3")
    res = r["results"]
    assert res["buckets"] == [[0, 2], [2, 4], [4, 8], [8, 16], [16, 32], [32, 64], [64, 128]]
    assert res["documents"] == 3 and res["books_per_bucket"] == [3] * 7
    assert [m["label"] for m in res["models"]] == ["A: fpa", "B: fox"]
    for a, b, d in zip(res["models"][0]["loss"], res["models"][1]["loss"], res["difference"]):
        assert d["estimate"] == pytest.approx(a["estimate"] - b["estimate"])
        assert d["lower"] <= d["estimate"] <= d["upper"]
    assert r["checkpoint"]["backend"] == "fpa" and r["compare"]["backend"] == "fox"
    assert "offline" in r["data"]["source"]


def test_pg19_long_on_local_parquet_with_custom_buckets(tmp_path, ckpts):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "pg19" / "data"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"text": [words(300, i) for i in range(3)] + ["too short"]}), folder / "test-00000.parquet")
    r = run(tmp_path, "pg_local", "--task", "pg19_long", "--ckpt", ckpts["fpa"], "--data", str(tmp_path / "pg19"),
            "--max-len", "96", "--buckets", "0", "64", "96")
    assert r["results"]["documents"] == 3  # the short book is skipped (min tokens = max_len + 1)
    assert r["results"]["buckets"] == [[0, 64], [64, 96]] and "difference" not in r["results"]


def test_passkey_with_compare(tmp_path, ckpts):
    r = run(tmp_path, "pk", "--task", "passkey", "--ckpt", ckpts["fpa"], "--compare", ckpts["sdpa"],
            "--lengths", "128", "160", "--trials", "4", "--seed", "3")
    lengths = r["results"]["lengths"]
    assert [e["length"] for e in lengths] == [128, 160]
    for e in lengths:
        assert len(e["trials"]) == 4 and all(t["tokens"] <= e["length"] for t in e["trials"])
        for m in e["models"]:
            assert m["n"] == 4 and m["successes"] == sum(m["success"])
            assert m["rate"]["lower"] <= m["rate"]["estimate"] <= m["rate"]["upper"]
        assert set(e["mcnemar"]) >= {"p_two_sided", "p_a_better"}
    assert r["results"]["mcnemar_pooled"]["both"] + r["results"]["mcnemar_pooled"]["neither"] \
        + r["results"]["mcnemar_pooled"]["a_only"] + r["results"]["mcnemar_pooled"]["b_only"] == 8


def test_test_loss_on_slimpajama_layout_with_non_inferiority(tmp_path, ckpts):
    import zstandard

    chunk = tmp_path / "slim" / "test" / "chunk1"
    chunk.mkdir(parents=True)
    lines = "".join(json.dumps({"text": words(120, i), "meta": {}}) + "\n" for i in range(6)).encode()
    (chunk / "example_test_0.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
    r = run(tmp_path, "tl", "--task", "test_loss", "--ckpt", ckpts["fpa"], "--compare", ckpts["fox"],
            "--data", str(tmp_path / "slim"), "--seq-len", "32", "--max-docs", "10", "--margin", "0.5")
    res = r["results"]
    assert res["sequences"] == 10 and res["seq_len"] == 32 and res["margin"] == 0.5
    d = res["difference"]
    assert d["estimate"] == pytest.approx(res["models"][0]["loss"]["estimate"] - res["models"][1]["loss"]["estimate"])
    assert res["verdict"] in ("superior", "non-inferior", "not shown non-inferior")


def test_test_loss_offline_default_seq_len(tmp_path, ckpts):
    r = run(tmp_path, "tl_off", "--task", "test_loss", "--ckpt", ckpts["fox"], "--max-docs", "3")
    assert r["results"]["seq_len"] == 64 and r["results"]["sequences"] == 3  # the model's training context


def test_cache_prune_fpa_against_a_matched_window_softmax(tmp_path, ckpts):
    r = run(tmp_path, "cp", "--task", "cache_prune", "--ckpt", ckpts["fpa"], "--compare", ckpts["sdpa"],
            "--lengths", "64", "96", "--thresholds", "-10", "-1", "--passkey-lengths", "128", "--trials", "2",
            "--max-docs", "2")
    assert r["checkpoint"]["impl_per_layer"] == ["fpa:chunked"] * 2
    for e in r["results"]["lengths"]:
        fpa, sdpa = e["models"]
        assert [row["rule"] for row in fpa["rules"]] == [{"threshold": -10.0}, {"threshold": -1.0}]
        assert all("window" in row["rule"] for row in sdpa["rules"])
        for f_row, s_row in zip(fpa["rules"], sdpa["rules"]):
            assert 0 < f_row["kept_fraction"] <= 1 and f_row["revived_pairs"] == 0
            assert s_row["kept_fraction"] == pytest.approx(f_row["kept_fraction"], abs=0.1)  # matched mean size
    (pk,) = r["results"]["passkey"]
    assert pk["length"] == 128 and pk["models"][0]["rule"] == {"threshold": -10.0} and pk["models"][0]["n"] == 2


def test_ruler_with_compare(tmp_path, ckpts, capsys):
    tasks = ["niah_multivalue", "vt"]
    r = run(tmp_path, "ruler", "--task", "ruler", "--ckpt", ckpts["fpa"], "--compare", ckpts["fox"],
            "--lengths", "512", "768", "--trials", "2", "--ruler-tasks", *tasks)
    res = r["results"]
    assert [(row["task"], row["length"]) for row in res["tasks"]] == [(t, n) for n in (512, 768) for t in tasks]
    for row in res["tasks"]:
        assert len(row["items"]) == 2 and all(item["tokens"] <= row["length"] for item in row["items"])
        for m in row["models"]:
            assert m["n"] == 2 and m["complete"] == sum(s == 1.0 for s in m["scores"])
            assert m["score"]["estimate"] == pytest.approx(sum(m["scores"]) / 2)
            assert m["complete_rate"]["lower"] <= m["complete_rate"]["estimate"] <= m["complete_rate"]["upper"]
        assert set(row["mcnemar"]) >= {"p_two_sided", "p_a_better"}
    for avg in res["average"]:
        for i, m in enumerate(avg["models"]):
            rows = [row for row in res["tasks"] if row["length"] == avg["length"]]
            assert m["score"] == pytest.approx(sum(row["models"][i]["score"]["estimate"] for row in rows) / len(tasks))
    assert "greedy generation through the KV cache" in res["scoring"] and "King James" in r["data"]["source"]
    out = capsys.readouterr().out
    assert "string-match score (A: fpa / B: fox)" in out and "average" in out and "McNemar p" in out


def test_babilong_single_model(tmp_path, ckpts):
    r = run(tmp_path, "babi", "--task", "babilong", "--ckpt", ckpts["sdpa"], "--lengths", "512", "--trials", "2",
            "--qa", "qa1", "qa4", "--max-docs", "2")
    res = r["results"]
    assert [row["task"] for row in res["tasks"]] == ["qa1", "qa4"] and res["book_documents"] == 2
    assert all(len(row["items"][0]["facts"]) >= 2 for row in res["tasks"])
    assert "mcnemar" not in res["tasks"][0] and "B_score" not in str(r["results"]["average"])


def test_tensorboard_logging(tmp_path, ckpts):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run(tmp_path, "tb", "--task", "passkey", "--ckpt", ckpts["fpa"], "--lengths", "128", "--trials", "2",
        "--tensorboard", str(tmp_path / "tb"))
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert "passkey/A_success_rate/128" in acc.Tags()["scalars"]
    assert acc.Scalars("passkey/A_success_rate/128")[0].step == 1  # the checkpoint's global step
    assert acc.Tags()["images"] == ["passkey"]


def test_impl_override_is_recorded(tmp_path, ckpts):
    r = run(tmp_path, "naive", "--task", "passkey", "--ckpt", ckpts["fox"], "--impl", "naive",
            "--lengths", "128", "--trials", "1")
    assert r["checkpoint"]["impl_per_layer"] == ["fox:naive"] * 2


def error_of(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_bad_arguments_are_clear_errors(tmp_path, ckpts, capsys):
    fpa, sdpa = ckpts["fpa"], ckpts["sdpa"]
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint")
    import torch

    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"lr": 1.0}}, foreign)
    cases = [
        (["--task", "perplexity", "--ckpt", fpa], "invalid choice: 'perplexity'"),
        (["--task", "passkey", "--ckpt", str(tmp_path / "missing.ckpt")], "does not exist"),
        (["--task", "passkey", "--ckpt", str(garbage)], "cannot read checkpoint"),
        (["--task", "passkey", "--ckpt", str(foreign)], "no 'model' hyper-parameters"),
        (["--task", "passkey", "--ckpt", fpa, "--margin", "0.01"], "--margin does not apply to --task passkey"),
        (["--task", "test_loss", "--ckpt", fpa, "--margin", "0.01"], "--margin needs --compare"),
        (["--task", "passkey", "--ckpt", fpa, "--lengths", "0"], "--lengths has invalid values [0]"),
        (["--task", "passkey", "--ckpt", fpa, "--lengths", "40", "--trials", "1"], "too short"),
        (["--task", "pg19_long", "--ckpt", fpa, "--max-len", "64", "--buckets", "0", "80"], "bucket edges"),
        (["--task", "pg19_long", "--ckpt", fpa, "--data", str(tmp_path / "nowhere")], "does not exist"),
        (["--task", "cache_prune", "--ckpt", sdpa], "sliding window"),
        (["--task", "cache_prune", "--ckpt", fpa, "--impl", "naive"], "--impl must be chunked"),
        (["--task", "passkey", "--ckpt", fpa, "--impl", "fused"], "needs a CUDA GPU"),
        (["--task", "passkey", "--ckpt", fpa, "--device", "cuda"], "no CUDA device"),
    ]
    for argv, message in cases:
        if "CUDA" in message and torch.cuda.is_available():
            continue
        assert message in error_of(capsys, argv), argv


def test_help_lists_the_tasks(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert all(task in out for task in ("pg19_long", "passkey", "test_loss", "cache_prune", "ruler", "babilong",
                                        "lm_eval", "--export"))
