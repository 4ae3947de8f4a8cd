"""eval.py --task probes end to end on CPU: a tiny run trains through the command line and writes valid JSON, a
Markdown table and a plot; a second run reuses its rows; misuse is a clear error."""
import json
import os

import pytest

from eval import main

TINY = ["--task", "probes", "--probes", "dip_duration", "--backends", "fpa", "fpa_dipsum", "--seeds", "2",
        "--steps", "3", "--train-batch", "4"]


def test_a_tiny_table_trains_writes_json_and_resumes(tmp_path, capsys):
    out = str(tmp_path / "probes")
    path = main([*TINY, "--out", out])
    with open(path) as f:
        record = json.load(f)  # strict JSON
    rows, comparisons = record["results"]["rows"], record["results"]["comparisons"]
    assert [(r["group"], r["backend"]) for r in rows] == [
        ("dip duration, variable", "fpa"), ("dip duration, variable", "fpa_dipsum"),
        ("dip duration, fixed", "fpa"), ("dip duration, fixed", "fpa_dipsum")]
    for row in rows:
        assert row["seeds"] == [0, 1] and len(row["accuracies"]) == 2 and row["budget"]["steps"] == 3
        assert row["successes"] == sum(row["success"]) and row["probe"].startswith("dip_duration(")
    assert [(c["group"], c["a"], c["b"]) for c in comparisons] == [
        ("dip duration, variable", "fpa", "fpa_dipsum"), ("dip duration, fixed", "fpa", "fpa_dipsum")]
    assert 0 <= comparisons[0]["p_value"] <= 1 and record["checkpoint"] is None
    assert record["figures"] == {"probes": "probes.png"} and os.path.getsize(os.path.join(out, "probes.png")) > 1000
    with open(os.path.join(out, "probes.md")) as f:
        assert "| dip duration, variable | fpa_dipsum | 3 steps, lr 0.01 |" in f.read()
    capsys.readouterr()
    main([*TINY, "--out", out])  # same settings: nothing is trained again
    assert "4 reused from earlier results, 0 to train" in capsys.readouterr().out


def test_list_and_misuse(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(["--task", "probes", "--list"])
    assert done.value.code == 0 and "ladder(r=10)" in capsys.readouterr().out
    for argv, message in [
        (["--task", "probes", "--ckpt", "x.ckpt"], "trains its own models"),
        (["--task", "probes", "--probes", "nonsense"], "unknown probe"),
        (["--task", "probes", "--probes", "mqar", "--backends", "alibi"], "no row of the table"),
        (["--task", "probes", "--seeds", "0"], "positive"),
        (["--task", "passkey"], "needs --ckpt"),
        (["--task", "passkey", "--ckpt", "x.ckpt", "--steps", "3"], "does not apply"),
    ]:
        with pytest.raises(SystemExit):
            main([*argv, "--out", str(tmp_path / "x")])
        assert message in capsys.readouterr().err
