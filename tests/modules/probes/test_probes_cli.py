"""eval.py --task probes end to end on CPU: a tiny run trains through the command line and writes valid JSON, a
Markdown table and a plot; a second run reuses its rows; misuse is a clear error."""
import json
import os

import pytest

from eval import main
from _inprocess_pool import InProcess
from _probe_reference import held_out_accuracy

TINY = ["--task", "probes", "--probes", "dip_duration", "--backends", "fpa", "fpa_dipsum", "--seeds", "2",
        "--steps", "3", "--train-batch", "4"]


def test_a_tiny_table_trains_writes_json_and_resumes(tmp_path, capsys, monkeypatch):
    from modules.probes import runner

    trained = {}  # (probe key, variant description) -> (probe, the trained seeds, held-out size)
    real_train_row = runner.train_row

    def keep_models(probe, variant, shape, seeds, budget, device, progress=None, test_probe=None, impl="naive"):
        run = real_train_row(probe, variant, shape, seeds, budget, device, progress, test_probe=test_probe, impl=impl)
        trained[(probe.key, variant.description)] = (probe, run.ensemble, budget.test)
        return run

    monkeypatch.setattr(runner, "train_row", keep_models)
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
        # each seed's accuracy in the JSON, recomputed from that seed's trained model alone on the held-out set
        probe, ensemble, n_test = trained[(row["probe"], row["variant"])]
        for i, accuracy in enumerate(row["accuracies"]):
            assert accuracy == pytest.approx(held_out_accuracy(ensemble.member(i), probe, n_test), abs=1e-9), row
    accuracies = [a for row in rows for a in row["accuracies"]]
    assert len(set(accuracies)) > 1 and 0 < min(accuracies) and max(accuracies) < 1  # 3 steps: not trivial values
    assert [(c["group"], c["a"], c["b"]) for c in comparisons] == [
        ("dip duration, variable", "fpa", "fpa_dipsum"), ("dip duration, fixed", "fpa", "fpa_dipsum")]
    assert 0 <= comparisons[0]["p_value"] <= 1 and record["checkpoint"] is None
    assert record["figures"] == {"probes": "probes.png"} and os.path.getsize(os.path.join(out, "probes.png")) > 1000
    with open(os.path.join(out, "probes.md")) as f:
        assert "| dip duration, variable | fpa_dipsum | 3 steps, lr 0.01 |" in f.read()
    capsys.readouterr()
    main([*TINY, "--out", out])  # same settings: nothing is trained again
    assert "4 reused from earlier results, 0 to train" in capsys.readouterr().out
    # another implementation is another experiment: trained anew, recorded in the row, kept beside the naive rows
    main([*TINY, "--probes", "dip_duration(r=8, duration=variable, order=any)", "--impl", "auto", "--out", out])
    assert "0 reused from earlier results, 2 to train" in capsys.readouterr().out
    with open(path) as f:
        rows = json.load(f)["results"]["rows"]
    assert sorted(r.get("impl", "naive") for r in rows) == ["auto", "auto", "naive", "naive", "naive", "naive"]


def test_list_and_misuse(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(["--task", "probes", "--list"])
    assert done.value.code == 0 and "ladder(r=10)" in capsys.readouterr().out
    for argv, message in [
        (["--task", "probes", "--ckpt", "x.ckpt"], "trains its own models"),
        (["--task", "probes", "--probes", "nonsense"], "unknown probe"),
        (["--task", "probes", "--probes", "mqar", "--backends", "alibi"], "no row of the table"),
        (["--task", "probes", "--seeds", "0"], "positive"),
        (["--task", "probes", "--impl", "vmapped"], "invalid choice"),
        (["--task", "passkey"], "needs --ckpt"),
        (["--task", "passkey", "--ckpt", "x.ckpt", "--steps", "3"], "does not apply"),
    ]:
        with pytest.raises(SystemExit):
            main([*argv, "--out", str(tmp_path / "x")])
        assert message in capsys.readouterr().err


def test_the_partial_file_is_replaced_whole(tmp_path, monkeypatch):
    """probes.partial.json is written through a temporary file and renamed: a write that breaks off (a full disk, a
    kill) leaves the previous version whole, which the next run reads back."""
    from modules.probes import runner
    from modules.probes.table import select
    from fpa_lightning.probes.train import Budget

    plan = select(["dip_duration"], ["fpa", "fpa_dipsum"])
    assert len(plan) == 4

    def record(group, backend, seeds, budget, device, progress=None, parts=()):  # no training: a finished row at once
        return {**runner.row_identity(group, backend, seeds, budget), "accuracies": [0.5], "success": [False],
                "successes": 0, "seconds": 0.0}

    real_dump, calls = json.dump, []

    def dump_that_breaks_off(obj, f, **kwargs):
        calls.append(len(obj["rows"]))
        if len(calls) == 3:  # the third save writes part of its text, then fails
            f.write('{"rows": [')
            raise OSError("No space left on device")
        real_dump(obj, f, **kwargs)

    monkeypatch.setattr(runner, "row_record", record)
    monkeypatch.setattr(runner.json, "dump", dump_that_breaks_off)
    partial = tmp_path / runner.PARTIAL
    with pytest.raises(OSError, match="No space"):
        runner.run_rows(plan, [0], Budget(steps=3), None, "cpu", [], log=lambda *a: None, partial=str(partial))
    monkeypatch.setattr(runner.json, "dump", real_dump)
    assert calls == [1, 2, 3]
    assert len(runner.load_rows([str(tmp_path)])) == 2  # the rows saved before the failed write, readable
    assert os.listdir(tmp_path) == [runner.PARTIAL]  # no temporary file left behind


def test_a_rows_identity_names_its_implementation_only_off_the_naive_path():
    """Rows of the committed runs (naive groups, recorded before Group.impl existed) stay reusable; a group on the fast
    path is a different experiment from the same group on the naive one."""
    from dataclasses import replace

    from fpa_lightning.probes.train import Budget
    from modules.probes.runner import _find, row_identity
    from modules.probes.table import GROUPS
    naive = next(g for g in GROUPS if g.label == "flip-flop")
    fast = next(g for g in GROUPS if g.impl == "auto")
    assert "impl" not in row_identity(naive, "fpa", [0], Budget())
    assert row_identity(fast, "fpa", [0], Budget())["impl"] == "auto"
    recorded = row_identity(replace(fast, impl="naive"), "fpa", [0], Budget())  # the same group, run naive
    assert _find([recorded], row_identity(fast, "fpa", [0], Budget())) is None
    assert _find([recorded], recorded) is recorded


def test_a_fast_path_row_split_into_seed_chunks_is_the_row_trained_whole(monkeypatch):
    """A fast-path row (Group.impl) runs its seeds one after another and each seed trains as it would alone, so the
    worker pool splits it into seed chunks: the merged record must equal the row trained in one piece, seed for seed,
    in the row's seed order whatever order the chunks finish in."""
    from dataclasses import replace

    from fpa_lightning.probes.train import Budget
    from modules.probes import runner
    from modules.probes.table import GROUPS

    group = replace(next(g for g in GROUPS if g.label == "flip-flop"), impl="auto")
    seeds, budget = [0, 1, 2], Budget(steps=4, batch=4)
    assert runner.seed_chunks(group, seeds, 2) == [[0, 1], [2]]
    assert runner.seed_chunks(group, seeds, 9) == [[0], [1], [2]]
    assert runner.seed_chunks(replace(group, impl="naive"), seeds, 9) == [seeds]  # one vmapped model: not split
    whole = runner.row_record(group, "fpa", seeds, budget, "cpu")

    monkeypatch.setattr(runner, "ProcessPoolExecutor", InProcess)
    monkeypatch.setattr(runner, "as_completed", lambda futures: reversed(list(futures)))  # the last chunk first
    rows, lines = [], []
    runner._run_in_pool([0], [(group, "fpa", seeds, budget, "cpu", [])], 2, lambda n, i, r: rows.append(r),
                        lines.append)
    assert len(rows) == 1 and sum("chunk" in line for line in lines) == 3  # 2·workers / 1 row = 4 ≥ 3 seeds
    split = rows[0]
    for key in ("seeds", "accuracies", "success", "successes", "final_loss", "held_out_distinct", "impl"):
        assert split[key] == whole[key], key
    with pytest.raises(ValueError, match="not \\[0, 1, 2\\]"):
        runner.merge_chunks(group, "fpa", seeds, budget, "cpu", [{"seeds": [0, 2], "accuracies": [1.0, 1.0],
                                                                   "final_loss": [0.0, 0.0], "held_out_distinct": 1,
                                                                   "seconds": 0.0}])


def test_a_row_trained_in_seed_ranges_is_joined_into_the_whole_row(tmp_path, capsys):
    """A row split over separate runs (--seed A --seeds N) and merged is the row trained whole, seed for seed; the
    parts are not listed again beside it, and ranges that overlap or leave a seed out are not joined."""
    one = ["--task", "probes", "--probes", "dip_duration(r=8, duration=variable, order=any)", "--backends", "fpa",
           "--steps", "3", "--train-batch", "4"]
    whole, first, rest = (str(tmp_path / name) for name in ("whole", "first", "rest"))
    main([*one, "--seeds", "3", "--out", whole])
    main([*one, "--seed", "0", "--seeds", "1", "--out", first])
    main([*one, "--seed", "1", "--seeds", "2", "--out", rest])
    capsys.readouterr()
    joined = str(tmp_path / "joined")
    path = main([*one, "--seeds", "3", "--merge", first, rest, "--out", joined])
    assert "1 reused from earlier results, 0 to train" in capsys.readouterr().out
    with open(path) as f:
        rows = json.load(f)["results"]["rows"]
    with open(os.path.join(whole, "probes.json")) as f:
        reference = json.load(f)["results"]["rows"]
    assert len(rows) == 1 and rows[0]["seeds"] == [0, 1, 2]
    for key in ("accuracies", "success", "successes", "final_loss", "held_out_distinct"):
        assert rows[0][key] == reference[0][key], key
    # seeds 1..3 are not covered by {0}, {1, 2}: a seed would be missing, so the row is trained
    main([*one, "--seed", "1", "--seeds", "3", "--merge", first, rest, "--out", str(tmp_path / "uncovered")])
    assert "0 reused from earlier results, 1 to train" in capsys.readouterr().out


def test_each_row_names_the_machines_that_trained_its_seeds(tmp_path, capsys):
    """A row records the machine of each chunk of its seeds, so a row joined from runs on two machines names both
    (a chunk from before rows recorded one reads "not recorded"); the file counts its rows per machine beside the
    machine the command ran on."""
    one = ["--task", "probes", "--probes", "dip_duration(r=8, duration=variable, order=any)", "--backends", "fpa",
           "--steps", "3", "--train-batch", "4"]
    first, rest, joined = (str(tmp_path / name) for name in ("first", "rest", "joined"))
    main([*one, "--seed", "0", "--seeds", "1", "--out", first])
    main([*one, "--seed", "1", "--seeds", "1", "--out", rest])
    with open(os.path.join(first, "probes.json")) as f:
        record = json.load(f)
    assert record["results"]["rows"][0]["machine"] == "CPU" and record["results"]["row_machines"] == {"CPU": 1}
    record["results"]["rows"][0]["machine"] = "NVIDIA H100 80GB HBM3"  # as if seed 0 had trained on a GPU
    with open(os.path.join(first, "probes.json"), "w") as f:
        json.dump(record, f)
    with open(os.path.join(rest, "probes.json")) as f:
        old = json.load(f)
    del old["results"]["rows"][0]["machine"]  # a row recorded before rows named their machine
    with open(os.path.join(rest, "probes.json"), "w") as f:
        json.dump(old, f)
    capsys.readouterr()
    with open(main([*one, "--seeds", "2", "--merge", first, rest, "--out", joined])) as f:
        results = json.load(f)["results"]
    assert results["rows"][0]["machine"] == "NVIDIA H100 80GB HBM3, not recorded"
    assert results["row_machines"] == {"NVIDIA H100 80GB HBM3, not recorded": 1}
    assert results["machine"].startswith("CPU")  # where this command ran, which trained nothing


def test_seed_cover_is_exact():
    from modules.probes.runner import seed_cover
    parts = [{"seeds": [0, 1]}, {"seeds": [1, 2]}, {"seeds": [2, 3]}, {"seeds": [0]}, {"seeds": [1]}]
    assert [p["seeds"] for p in seed_cover(parts, [0, 1, 2, 3])] == [[0, 1], [2, 3]]
    assert [p["seeds"] for p in seed_cover(parts, [0, 1, 2])] == [[0], [1, 2]]  # [0, 1] leads nowhere: backtracked
    assert seed_cover(parts, [0, 1, 2, 3, 4]) is None
    assert seed_cover([{"seeds": [0, 0]}], [0]) is None  # a malformed part with a repeated seed never counts


def test_an_interrupted_split_row_keeps_its_finished_chunks_and_resumes_with_the_rest(monkeypatch, tmp_path):
    """A split row whose last chunk dies (a call's time limit): the chunks that finished are in the partial file as
    rows of their seeds, and the next run trains only the missing seed; the joined row is the row trained whole."""
    from dataclasses import replace

    from fpa_lightning.probes.train import Budget
    from modules.probes import runner
    from modules.probes.table import GROUPS

    group = replace(next(g for g in GROUPS if g.label == "flip-flop"), impl="auto")
    seeds, budget = [0, 1, 2], Budget(steps=4, batch=4)
    whole = runner.row_record(group, "fpa", seeds, budget, "cpu")

    real_job = runner._pool_job

    def killed_on_seed_2(group, backend, chunk, budget, device, label):
        if 2 in chunk:
            raise RuntimeError("killed at the time limit")
        return real_job(group, backend, chunk, budget, device, label)

    monkeypatch.setattr(runner, "ProcessPoolExecutor", InProcess)
    monkeypatch.setattr(runner, "as_completed", lambda futures: list(futures))
    monkeypatch.setattr(runner, "_pool_job", killed_on_seed_2)
    partial = str(tmp_path / runner.PARTIAL)
    with pytest.raises(RuntimeError, match="time limit"):
        runner.run_rows([(group, "fpa")], seeds, budget, 4, "cpu", [], workers=2, log=lambda *a: None,
                        partial=partial)
    kept = runner.load_rows([str(tmp_path)])
    assert sorted(r["seeds"] for r in kept) == [[0], [1]]

    trained, lines = [], []
    real_chunk = runner.train_chunk
    monkeypatch.setattr(runner, "train_chunk", lambda g, b, s, *a, **k: trained.append(s) or real_chunk(g, b, s, *a,
                                                                                                          **k))
    [row] = runner.run_rows([(group, "fpa")], seeds, budget, 4, "cpu", kept, log=lines.append)
    assert trained == [[2]] and "1 of them only the seeds earlier seed ranges lack" in lines[0]
    for key in ("seeds", "accuracies", "success", "successes", "final_loss", "held_out_distinct", "impl", "device"):
        assert row[key] == whole[key], key
    assert runner.is_seed_part(kept[0], [row]) and not runner.is_seed_part(row, kept)


def test_groups_select_rows_by_label():
    """--groups picks whole table groups by label: the 2-layer MQAR regime group without the 3- and 4-layer groups
    that share its probe; an unknown label raises, naming where the labels are listed."""
    from modules.probes.table import select

    label = "mqar, paper regime, 2 layers, 32 pairs, T=256"
    plan = select(None, None, [label])
    assert [(g.label, b) for g, b in plan] == [(label, b) for b in ("fpa", "sdpa", "fpa_nobias1", "fpa_nobias1_rope",
                                                                     "sdpa_rope1")]
    # a pattern: every positioned unnamed-ladder group at r = 18, controls included
    pattern = select(None, ["nope"], ["unnamed ladder*positions, d=*, r=18"])
    assert sorted(g.shape.head_dim for g, _ in pattern) == list(range(2, 21))
    probe = plan[0][0].probe.key
    assert len(select([probe], ["fpa"])) == 3  # the same probe in the 2-, 3- and 4-layer groups
    assert [(g.label, b) for g, b in select([probe], ["fpa"], [label])] == [(label, "fpa")]
    with pytest.raises(ValueError, match="unknown table group 'mqar'.*--list"):
        select(None, None, ["mqar"])
    with pytest.raises(ValueError, match="no row of the table matches"):
        select(["ladder"], None, [label])
