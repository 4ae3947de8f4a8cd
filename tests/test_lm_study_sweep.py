"""The learning-rate sweep's table in benchmarks/lm_study_runs.py: the lowest loss in bold, no rate is picked
while a swept rate has not been trained, and runs of the retrieval arm (their share in the record) stay out of the
sweep and in their own seed groups; a unit trained again is listed with both trainings' losses; a mixture run's
record carries its per-source counts from the checkpoint."""
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))

from lm_study_runs import (SWEEP_RATES, arm_label, rate, render, retrained_table, retrieval_share,  # noqa: E402
                           seeded_runs, sweep_table, train_sources)


def run(backend: str, lr: float, loss: float, seed: int = 0) -> dict:
    return {"backend": backend, "lr": lr, "seed": seed, "data_seed": 0, "final_val_loss": loss}


def test_rates_are_written_as_the_runner_names_them():
    assert [rate(lr) for lr in SWEEP_RATES] == ["3e-4", "6e-4", "1e-3", "2e-3"]


def test_a_complete_sweep_picks_its_lowest_loss():
    losses = {3e-4: 4.30, 6e-4: 4.21, 1e-3: 4.25, 2e-3: 4.40}
    rows = sweep_table([run("fpa", lr, loss) for lr, loss in losses.items()] + [run("fpa", 1e-3, 3.0, seed=1)])
    assert rows[2] == "| FPA | 4.3000 | **4.2100** | 4.2500 | 4.4000 | 6e-4 | 6e-4 |"  # seed 1 is not the sweep's


def test_an_incomplete_sweep_picks_nothing():
    rows = sweep_table([run("sdpa", 6e-4, 4.49), run("sdpa", 1e-3, 4.59)])
    assert rows[2] == "| softmax | not run | **4.4900** | 4.5900 | not run | 6e-4 | pending (rates not run) |"


def test_runs_of_the_retrieval_arm_stay_out_of_the_sweep_and_apart_in_the_seed_groups():
    plain = [run("fpa", lr, 4.3) for lr in SWEEP_RATES]
    retrieval = {**run("fpa", 6e-4, 1.0), "retrieval_share": 0.1}  # other data: never the sweep's lowest
    rows = sweep_table(plain + [retrieval])
    assert rows[2] == "| FPA | **4.3000** | 4.3000 | 4.3000 | 4.3000 | 3e-4 | 3e-4 |"
    seeds = [run("fpa", 6e-4, 4.2, seed=1), {**run("fpa", 6e-4, 1.1, seed=1), "retrieval_share": 0.1}]
    assert seeded_runs(plain + [retrieval] + seeds) == [plain[1], retrieval, *seeds]  # two seeds in each arm at 6e-4
    assert arm_label(retrieval) == "FPA, retrieval share 0.1" and arm_label(plain[0]) == "FPA"


def test_the_final_record_reads_the_share_from_the_runs_config():
    assert retrieval_share({"data": {"init_args": {"seed": 0}}}) is None
    assert retrieval_share({"data": {"init_args": {"mixture_weights": {"corpus": "rest", "retrieval": "0.05"}}}}) == 0.05


def test_a_unit_trained_again_is_listed_with_both_losses():
    first = {**run("fpa", 6e-4, 4.25), "run": "study_fpa_lr6e-4_s0", "last_train_losses": [[1, 4.1]]}
    again = {**first, "final_val_loss": 4.2375}
    assert retrained_table([first], [again])[2] == "| study_fpa_lr6e-4_s0 | 4.25 | 4.2375 | -0.0125 |"
    assert "## Units trained again" not in render([first], [])
    assert "## Units trained again" in render([first], [], [again])


def test_the_final_record_sums_a_mixtures_source_counts_over_ranks_from_the_checkpoint(tmp_path):
    torch = pytest.importorskip("torch")
    counts = {"corpus": {"documents": 3, "tokens": 300, "skipped": 1}, "retrieval": {"documents": 2, "tokens": 90,
                                                                                     "skipped": 0}}
    data_state = {"world_size": 2, "config": {}, "ranks": [
        {"rank": r, "consumed": 0, "cursors": [], "stats": {"train": {"tokens": 390, "sources": counts}}}
        for r in (0, 1)]}
    (tmp_path / "checkpoints").mkdir()
    torch.save({"state_dict": {}, "TextDataModule": data_state}, tmp_path / "checkpoints" / "last.ckpt")
    assert train_sources(tmp_path) == {"corpus": {"documents": 6, "tokens": 600, "skipped": 2},
                                       "retrieval": {"documents": 4, "tokens": 180, "skipped": 0}}
    plain = {**data_state, "ranks": [{"rank": 0, "stats": {"train": {"tokens": 390}}}]}
    torch.save({"state_dict": {}, "TextDataModule": plain}, tmp_path / "checkpoints" / "last.ckpt")
    assert train_sources(tmp_path) is None  # one source: no per-source counters
    (tmp_path / "checkpoints" / "last.ckpt").unlink()
    assert train_sources(tmp_path) is None  # no checkpoint (a record rebuilt where the lease left none)
