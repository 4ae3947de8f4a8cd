"""benchmarks/lm_study.sh, the study's seed runner, at a tiny CPU shape (SMOKE=1): two seeds trained and evaluated
(in two lanes, PARALLEL=2: quicker than one lane, and every check below then reads the lanes' results),
runs named by backend, rate and seed, the seed recorded in every result file, a second call skips what finished, and
`compare` turns the per-seed files of two backends into seed-level statistics.

One backend (FPA) is trained through the script: another backend's units are the same steps with another config (each
study config trains in tests/test_study_configs.py), at the cost of two more trainings and evaluations. The compare's
B side (FoX) is FPA's own per-seed result files under FoX's run names: A against itself, a known answer (every
difference exactly 0) for the script's pairing of the two sides' files by seed."""
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from _corpus import write_slimpajama_layout
from _processes import processes_naming

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
from lm_study_runs import compare_records  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "lm_study.sh"


def run_script(env: dict, *args: str, succeeds: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["bash", str(SCRIPT), *args], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=900)
    assert (done.returncode == 0) == succeeds, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    write_slimpajama_layout(root / "corpus")
    env = {"SMOKE": "1", "SEEDS": "0 1", "EVALS": "loss", "PARALLEL": "2", "CORPUS": str(root / "corpus"),
           "RESULTS": str(root / "results"), "PYTHON": sys.executable, "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1"}
    first = run_script(env, "run", "fpa")
    results = root / "results"
    for seed in (0, 1):  # the compare's B side (module docstring)
        shutil.copytree(results / "eval" / f"study_fpa_lr1e-3_s{seed}", results / "eval" / f"study_fox_lr1e-3_s{seed}")
    return results, env, first


def test_each_unit_is_trained_with_its_seed_and_named_by_it(study):
    results, _, _ = study
    finals = {p.parent.name: json.loads(p.read_text()) for p in (results / "runs").glob("*/final.json")}
    assert sorted(finals) == [f"study_fpa_lr1e-3_s{s}" for s in (0, 1)]
    for name, record in finals.items():
        assert (record["backend"], record["seed"], record["lr"], record["data_seed"]) == (
            name.split("_")[1], int(name[-1]), 1e-3, 0)  # the data order stays fixed unless VARY_DATA=1
        config = yaml.safe_load(next((results / "runs" / name).glob("version_*/config.yaml")).read_text())
        assert config["seed_everything"] == record["seed"]
        assert record["val_losses"] and record["last_train_losses"]
    # another initialisation gives another model
    assert finals["study_fpa_lr1e-3_s0"]["val_losses"] != finals["study_fpa_lr1e-3_s1"]["val_losses"]


def test_every_eval_result_records_its_training_seed(study):
    results, _, _ = study
    for seed in (0, 1):
        doc = json.loads((results / "eval" / f"study_fpa_lr1e-3_s{seed}" / "test_loss" / "test_loss.json").read_text())
        assert doc["checkpoint"]["seed_everything"] == seed
        (loss,) = doc["results"]["per_item"]["metrics"]  # every item's result kept, for the seed compare
        assert loss["ids"] == [f"row{i}" for i in range(8)] and [len(v) for v in loss["values"]] == [8]  # one model


def test_a_second_call_skips_finished_units(study):
    results, env, _ = study
    again = run_script(env, "run", "fpa")
    assert len(re.findall(r"finished before, skipped", again.stdout)) == 2
    assert "== train_" not in again.stdout


def test_compare_gives_seed_level_statistics(study):
    results, env, _ = study
    run_script(env, "compare", "fpa", "fox")
    merged = json.loads((results / "compare" / "fpa-fox_lr1e-3" / "test_loss_seeds.json").read_text())
    assert sorted(merged["seeds"]) == [0, 1]
    for pair in merged["pairs"]:  # each seed's A file against the B file of the same seed
        for side, backend in (("a", "fpa"), ("b", "fox")):
            assert pair[side] == str(results / "eval" / f"study_{backend}_lr1e-3_s{pair['seed']}" / "test_loss" /
                                     "test_loss.json")
    (loss,) = merged["metrics"]
    assert loss["name"] == "loss" and loss["items"] == 8  # the per-item results of --max-docs 8
    assert [s["estimate"] for s in loss["per_seed"]] == [0.0, 0.0] and loss["mean"] == 0.0  # A against itself


def test_compare_at_each_sides_rate_pairs_the_seeds_both_sides_have(study):
    """Each backend at its own tuned rate, with fewer seeds on one side (softmax's three against FPA's five): the
    seeds both sides have are paired, the others left out; a rate on one side only is an error."""
    results, env, _ = study
    shutil.copytree(results / "eval" / "study_fpa_lr1e-3_s1", results / "eval" / "study_sdpa_lr3e-4_s1")
    run_script(env, "compare", "fpa@1e-3", "sdpa@3e-4")
    merged = json.loads((results / "compare" / "fpa_lr1e-3-sdpa_lr3e-4" / "test_loss_seeds.json").read_text())
    assert merged["seeds"] == [1]
    (pair,) = merged["pairs"]
    assert pair["a"] == str(results / "eval" / "study_fpa_lr1e-3_s1" / "test_loss" / "test_loss.json")
    assert pair["b"] == str(results / "eval" / "study_sdpa_lr3e-4_s1" / "test_loss" / "test_loss.json")
    one_sided = run_script(env, "compare", "fpa@1e-3", "sdpa", succeeds=False)
    assert "give both sides a rate" in one_sided.stderr


def test_recorded_units_restored_into_a_fresh_folder_are_skipped(study, tmp_path):
    """A lease that keeps nothing but the repository: `record` the finished units into a folder to commit, then in a
    fresh results folder `restore` them; the next run trains nothing, and the records hold no checkpoint or log."""
    results, env, _ = study
    records = tmp_path / "records"
    run_script(env, "record", str(records))
    for seed in (0, 1):
        name = f"study_fpa_lr1e-3_s{seed}"
        assert json.loads((records / "trainings" / f"{name}.json").read_text()) == json.loads(
            (results / "runs" / name / "final.json").read_text())
        assert (records / "eval" / name / "test_loss" / "test_loss.json").is_file()
    kept = [p for p in records.rglob("*") if p.is_file()]
    assert not [p for p in kept if p.suffix in (".ckpt", ".log") or "tfevents" in p.name]
    status = (records / "status.tsv").read_text().splitlines()
    run_script(env, "record", str(records))  # recording again adds no status line twice
    assert (records / "status.tsv").read_text().splitlines() == status
    fresh = {**env, "RESULTS": str(tmp_path / "fresh")}
    run_script(fresh, "restore", str(records))
    again = run_script(fresh, "run", "fpa")
    assert len(re.findall(r"finished before, skipped", again.stdout)) == 2 and "== train_" not in again.stdout


def test_a_retraining_that_differs_is_recorded_beside_the_first(tmp_path):
    """A unit trained again in a later lease: where its losses differ from the committed record, `record` keeps the
    first training's record (the sweep reads it) and writes the retrained model's to retrained/; one that reproduced
    bit for bit replaces its record."""
    results, records = tmp_path / "results", tmp_path / "records"
    for folder in (results / "eval", results / "compare", records / "trainings"):
        folder.mkdir(parents=True)
    (results / "status.tsv").write_text("")
    def unit(run: str, loss: float) -> dict:
        return {"run": run, "final_val_loss": loss, "val_losses": [[1, loss]], "last_train_losses": [[1, loss]]}

    # the reproduction texts as lm_study_runs.py writes them, which `record` reads
    first, again = unit("study_fpa_lr6e-4_s0", 4.25), unit("study_fpa_lr6e-4_s0", 4.26)
    retrained = {**again, "reproduction": compare_records(again, first)}
    same = {**unit("study_fox_lr6e-4_s0", 4.3), "reproduction": compare_records(unit("study_fox_lr6e-4_s0", 4.3),
                                                                                unit("study_fox_lr6e-4_s0", 4.3))}
    for record in (first, unit("study_fox_lr6e-4_s0", 4.3)):
        (records / "trainings" / f"{record['run']}.json").write_text(json.dumps(record))
    for record in (retrained, same):
        (results / "runs" / record["run"]).mkdir(parents=True)
        (results / "runs" / record["run"] / "final.json").write_text(json.dumps(record, indent=1))
    run_script({"RESULTS": str(results), "PYTHON": sys.executable}, "record", str(records))
    assert json.loads((records / "trainings" / "study_fpa_lr6e-4_s0.json").read_text()) == first
    assert json.loads((records / "retrained" / "study_fpa_lr6e-4_s0.json").read_text()) == retrained
    assert json.loads((records / "trainings" / "study_fox_lr6e-4_s0.json").read_text()) == same
    assert not (records / "retrained" / "study_fox_lr6e-4_s0.json").exists()


def test_restore_takes_the_retrained_record_of_a_unit_trained_again(tmp_path):
    """The evaluations of a unit trained again are of the retrained model, so `restore` gives the next lease that
    model's final losses to check a further retraining against, not the first training's."""
    records = tmp_path / "records"
    for folder, loss in (("trainings", 4.25), ("retrained", 4.26)):
        (records / folder).mkdir(parents=True)
        (records / folder / "study_fpa_lr6e-4_s0.json").write_text(json.dumps({"final_val_loss": loss}))
    (records / "trainings" / "study_fox_lr6e-4_s0.json").write_text(json.dumps({"final_val_loss": 4.3}))
    results = tmp_path / "results"
    run_script({"RESULTS": str(results), "PYTHON": sys.executable}, "restore", str(records))
    final = {name: json.loads((results / "runs" / name / "final.json").read_text())["final_val_loss"]
             for name in ("study_fpa_lr6e-4_s0", "study_fox_lr6e-4_s0")}
    assert final == {"study_fpa_lr6e-4_s0": 4.26, "study_fox_lr6e-4_s0": 4.3}


def test_restore_names_what_it_needs(tmp_path):
    done = run_script({"RESULTS": str(tmp_path / "results"), "PYTHON": sys.executable}, "restore", str(tmp_path),
                      succeeds=False)
    assert "has no trainings/ folder (made by: lm_study.sh record)" in done.stderr


def test_the_runner_default_rate_is_the_configs():
    configured = yaml.safe_load((REPO / "configs" / "base" / "110m.yaml").read_text())["model"]["optim"]["lr"]
    default = re.search(r"lrs=\(\$\{LRS:-(\S+)\}\)", SCRIPT.read_text()).group(1)
    assert float(default) == configured


def test_the_committed_seed_tables_are_rendered_from_the_records():
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "lm_study_runs.py"), "report",
                           str(REPO / "benchmarks" / "results" / "lm_study_seeds"), "--out",
                           str(REPO / "docs" / "lm_study"), "--check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(not pathlib.Path("/proc/self/stat").exists(), reason="finds the steps through /proc (Linux)")
def test_a_term_sent_to_the_script_alone_stops_every_lane(tmp_path):
    """A scheduler kills the script's pid, not its group: with two lanes, their running steps must stop too (before
    the trap in `units`, the lanes went on training and evaluating for nobody)."""
    write_slimpajama_layout(tmp_path / "corpus")
    results = tmp_path / "results"
    env = {**os.environ, "SMOKE": "1", "SEEDS": "0 1", "EVALS": "loss", "PARALLEL": "2",
           "CORPUS": str(tmp_path / "corpus"), "RESULTS": str(results), "PYTHON": sys.executable,
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    script = subprocess.Popen(["bash", str(SCRIPT), "run", "fpa"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(processes_naming(f"save_dir={results}/runs")) < 2:  # both lanes' trainings (this test's own)
            assert time.monotonic() < deadline and script.poll() is None, "the two trainings never ran side by side"
            time.sleep(0.2)
        script.send_signal(signal.SIGTERM)
        code = script.wait(timeout=90)
        time.sleep(3)  # a lane left alive would have started its next step by now
        assert processes_naming(str(results)) == [], "a lane's step outlived the script"
        assert code == 143, script.stdout.read()[-2000:]  # the trap's exit: stopped by a signal, nothing finished
    finally:
        for pid in processes_naming(str(results)):
            os.kill(pid, signal.SIGKILL)
        script.kill()
