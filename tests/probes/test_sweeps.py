"""Sweeps and spreads of the runner (issue #45): several step counts and learning rates in one run, the seed chunks of
a row spread over several devices, the held-out split's knobs on the command line, and the loss curves that say
whether a budget is long enough. Tiny rows on the CPU."""
import json

import pytest

from _inprocess_pool import InProcess
from eval import main
from fpa_lightning.probes.train import Budget, curve_windows
from modules.probes import runner
from modules.probes.report import curve_table, training
from modules.probes.table import GROUPS, select

FLIP_FLOP = next(g for g in GROUPS if g.label == "flip-flop")


def test_a_sweep_is_every_row_at_every_step_count_and_learning_rate():
    plan = select(["dip_duration"], ["fpa"])
    out = runner.sweep(plan, Budget(batch=4), [2000, 6000], [0.01, 0.003])
    assert [(g.label, b.steps, b.lr) for g, _, b in out] == [
        (g.label, steps, lr) for steps in (2000, 6000) for lr in (0.01, 0.003) for g, _ in plan]
    assert all(b.batch == 4 for _, _, b in out)
    default = runner.sweep(plan, Budget())  # no sweep: each group's own steps, the budget's learning rate
    assert [(b.steps, b.lr) for _, _, b in default] == [(g.steps, Budget.lr) for g, _ in plan]


def test_loss_curves_are_recorded_and_summarised():
    assert curve_windows(100) == [(i * 5, i * 5 + 5) for i in range(20)]
    assert curve_windows(3) == [(0, 1), (1, 2), (2, 3)]
    rows = runner.run_rows([(FLIP_FLOP, "fpa", Budget(steps=40, batch=8, test=16))], [0, 1], Budget(), None, "cpu",
                           [], log=lambda *a: None)
    [row] = rows
    assert len(row["loss_curve"]) == 2 and all(len(c) == 20 for c in row["loss_curve"])
    assert row["loss_curve"][0][-1] < row["loss_curve"][0][0]  # it learned something in 40 steps
    table = curve_table(rows).splitlines()
    assert len(table) == 3 and table[2].startswith("| flip-flop | fpa | 40 steps, lr 0.01 |")
    assert curve_table([{k: v for k, v in row.items() if k != "loss_curve"}]) == ""  # rows recorded before curves


def test_the_seed_chunks_of_a_row_go_to_the_devices_in_turn(monkeypatch):
    from dataclasses import replace

    group = replace(FLIP_FLOP, impl="auto")  # a fast-path row: split into seed chunks
    given = []

    def job(group, backend, chunk, budget, device, label):
        given.append((chunk, device))
        return {"seeds": chunk, "accuracies": [1.0] * len(chunk), "final_loss": [0.0] * len(chunk),
                "held_out_distinct": 1, "seconds": 1.0, "device": device}

    monkeypatch.setattr(runner, "ProcessPoolExecutor", InProcess)
    monkeypatch.setattr(runner, "_pool_job", job)
    [row] = runner.run_rows([(group, "fpa")], [0, 1, 2, 3], Budget(steps=2), None, ["cuda:0", "cuda:1"], [],
                            log=lambda *a: None)
    assert [device for _, device in given] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    assert sorted(s for chunk, _ in given for s in chunk) == [0, 1, 2, 3]
    assert row["seeds"] == [0, 1, 2, 3] and sorted(row["device"].split(", ")) == ["cuda:0", "cuda:1"]


def test_the_command_line_sweeps_and_sets_the_split(tmp_path, capsys):
    out = str(tmp_path / "sweep")
    path = main(["--task", "probes", "--probes", "flip_flop", "--seeds", "1", "--steps", "2", "3", "--lr", "0.01",
                 "0.02", "--train-batch", "4", "--out", out, "--merge", str(tmp_path / "none")])
    with open(path) as f:
        record = json.load(f)
    rows = record["results"]["rows"]
    assert sorted((r["budget"]["steps"], r["budget"]["lr"]) for r in rows) == [(2, 0.01), (2, 0.02), (3, 0.01),
                                                                               (3, 0.02)]
    assert len(record["results"]["comparisons"]) == 0 and all(len(r["loss_curve"][0]) in (2, 3) for r in rows)
    assert all("split" not in r["budget"] for r in rows)  # the defaults stay out of the record
    with open(f"{out}/probes.md") as f:
        assert "| mean loss at 25 % |" in f.read()
    capsys.readouterr()
    labelled = str(tmp_path / "label")
    path = main(["--task", "probes", "--groups", "dip duration, fixed", "flip-flop", "--backends", "fpa", "--seeds",
                 "1", "--steps", "2", "--train-batch", "4", "--split", "label", "--salt", "s", "--data-seed", "1",
                 "--out", labelled])
    assert "leaves out 1 group(s) whose probe defines no label-determining part: flip-flop" in capsys.readouterr().out
    with open(path) as f:
        rows = json.load(f)["results"]["rows"]
    assert [r["group"] for r in rows] == ["dip duration, fixed"]
    for r in rows:
        assert (r["budget"]["split"], r["budget"]["salt"], r["budget"]["data_seed"]) == ("label", "s", 1)
        assert r["part_overlap"] == 0.0 and r["held_out_parts"] > 0
        assert training(r["budget"]) == "2 steps, lr 0.01, label split, data seed 1, salt 's'"
    for argv, message in [(["--probes", "flip_flop", "--split", "label"], "defines a label-determining part"),
                          (["--data-seed", "-1"], "non-negative"), (["--lr", "0.01", "0"], "positive"),
                          (["--steps", "5", "0"], "positive")]:
        with pytest.raises(SystemExit):
            main(["--task", "probes", *argv, "--out", str(tmp_path / "x")])
        assert message in capsys.readouterr().err
