"""benchmarks/lm_study.sh's retrieval arm at a tiny CPU shape (SMOKE=1). The pilot trains FPA's retrieval config at one
synthetic share (two steps), evaluates pass keys at the training length and writes pilot.json with the share the pick
chooses; a second call skips the finished unit. The retrieval mode's units (named by backend, share, rate and seed)
and their commands are read from dry runs (DRY_RUN=1) instead of trained: their training and evaluation steps are
the run mode's, which tests/test_lm_study_runner.py runs. The pick itself is tested on hand-made results."""
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import yaml

from _benchmark_scripts import load_benchmark
from _corpus import write_slimpajama_layout

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "lm_study.sh"
PILOT = load_benchmark("lm_study_pilot")
pick_share, summarise = PILOT.pick_share, PILOT.summarise

SHARE = "0.3"
PILOT_RUN = f"study_retrieval_fpa_share{SHARE}_lr1e-3_s0"


def run_script(env: dict, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["bash", str(SCRIPT), *args], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=900)
    assert not check or done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def pilot(tmp_path_factory):
    root = tmp_path_factory.mktemp("pilot")
    write_slimpajama_layout(root / "corpus")
    env = {"SMOKE": "1", "SHARES": SHARE, "CORPUS": str(root / "corpus"), "RESULTS": str(root / "results"),
           "PYTHON": sys.executable, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRAIN_ARGS": "--trainer.max_steps=2"}  # (time: two steps train as well as the smoke shape's four)
    return root / "results", env, run_script(env, "pilot")


def test_the_pilot_trains_the_retrieval_config_at_its_share(pilot):
    results, _, _ = pilot
    record = json.loads((results / "runs" / PILOT_RUN / "final.json").read_text())
    assert (record["backend"], record["seed"], record["lr"], record["retrieval_share"]) == ("fpa", 0, 1e-3, float(SHARE))
    config = yaml.safe_load(next((results / "runs" / PILOT_RUN).glob("version_*/config.yaml")).read_text())
    assert config["model"]["model"]["attention"]["backend"] == "fpa"
    assert float(config["data"]["init_args"]["mixture_weights"]["retrieval"]) == float(SHARE)
    assert config["data"]["init_args"]["mixture"]["retrieval"]["synthetic"] == "retrieval"


def test_the_pilot_summary_reads_pass_keys_at_the_training_length(pilot):
    results, _, first = pilot
    passkey = json.loads((results / "eval" / PILOT_RUN / "passkey_1x" / "passkey.json").read_text())
    assert [e["length"] for e in passkey["results"]["lengths"]] == [128]  # SMOKE's training length, alone
    (model,) = passkey["results"]["lengths"][0]["models"]
    summary = json.loads((results / "pilot.json").read_text())
    assert (summary["length"], summary["threshold"]) == (128, 0.9)
    (run,) = summary["runs"]
    assert (run["share"], run["lr"], run["seed"], run["trials"]) == (0.3, 1e-3, 0, 2)
    assert run["successes"] == model["successes"] and run["rate"] == model["successes"] / 2
    assert summary["picked_share"] == pick_share(summary["runs"])
    assert "smallest share reaching 90%: " in first.stdout
    # and the recall of the synthetic documents' own facts at the training length, beside the same without the facts
    recall = json.loads((results / "eval" / PILOT_RUN / "retrieval_recall" / "retrieval_recall.json").read_text())
    assert [e["length"] for e in recall["results"]["lengths"]] == [128, 256, 512]  # 1, 2 and 4 times
    (scored,) = recall["results"]["lengths"][0]["models"]
    assert run["recall"]["items"] == scored["all"]["n"] > 0
    assert (run["recall"]["exact"], run["recall"]["baseline_nll"]) == (scored["all"]["exact"]["estimate"],
                                                                       scored["all"]["baseline_nll"])
    assert "the synthetic documents' facts: " in first.stdout


def test_a_second_pilot_call_skips_the_finished_unit(pilot):
    results, env, _ = pilot
    before = (results / "pilot.json").read_text()
    again = run_script(env, "pilot")
    assert len(re.findall(r"finished before, skipped", again.stdout)) == 1 and "== train_" not in again.stdout
    assert (results / "pilot.json").read_text() == before


def planned(stdout: str) -> dict[str, str]:
    """A dry run's steps: name -> command."""
    return dict(re.findall(r"^== (\S+) \(dry run\): (.*)$", stdout, flags=re.MULTILINE))


def test_the_retrieval_mode_plans_every_unit(tmp_path):
    env = {"SMOKE": "1", "DRY_RUN": "1", "SEEDS": "0 1", "SHARE": "0.1", "RESULTS": str(tmp_path / "results"),
           "PYTHON": sys.executable}
    record = tmp_path / "results" / "runs" / "study_retrieval_fpa_share0.1_lr1e-3_s0" / "final.json"
    record.parent.mkdir(parents=True)
    record.write_text("{}")  # a unit trained in an earlier lease, its checkpoint gone: to be trained again
    steps = planned(run_script(env, "retrieval", "fpa", "sdpa").stdout)
    assert record.read_text() == "{}"  # a dry run removes nothing
    names = {f"study_retrieval_{b}_share0.1_lr1e-3_s{s}" for b in ("fpa", "sdpa") for s in (0, 1)}
    assert {step[len("train_"):] for step in steps if step.startswith("train_")} == names
    for name in names:
        backend, seed = name.split("_")[2], name[-1]
        train = steps[f"train_{name}"]
        config = f"--config configs/study/retrieval_{backend}.yaml --data.init_args.mixture_weights.retrieval=0.1 "
        assert config in train
        assert f"--trainer.logger.init_args.name={name} --seed_everything={seed} --model.optim.lr=1e-3" in train
        evals = {step.removeprefix(f"eval_{name}_"): command for step, command in steps.items()
                 if step.startswith(f"eval_{name}_")}
        bias = ["cache_prune"] if backend == "fpa" else []  # softmax has no bias to prune
        assert sorted(evals) == sorted(["test_loss", "pg19_long", "passkey", "ruler", "babilong", "retrieval_recall",
                                        *bias])
        assert evals["retrieval_recall"].endswith("--lengths 128 256 512 --trials 2")
        assert evals["passkey"].endswith("--lengths 128 192 256 512 1024 --trials 2")  # 1, 1.5, 2, 4 and 8 times
        assert "--lengths 512 1024 2048 " in evals["ruler"]  # SMOKE's RULER lengths (its items need 4x at least)
        if bias:
            assert evals["cache_prune"].endswith("--thresholds -10 -5 --lengths 128 512 --max-docs 2 "
                                                 "--passkey-lengths 128 512 --trials 2")
    # without a share the mode refuses to start
    refused = run_script({**env, "SHARE": ""}, "retrieval", "fpa", check=False)
    assert refused.returncode != 0 and "needs SHARE" in refused.stderr


def test_the_retrieval_mode_reuses_the_pilots_unit(pilot):
    """At the pilot's share, seed 0 of FPA is the pilot's unit: its checkpoint is evaluated, not trained again, and
    with the pilot's evaluation alone (EVALS) it is finished."""
    results, env, _ = pilot
    dry = {**env, "DRY_RUN": "1", "SHARE": SHARE}
    steps = planned(run_script(dry, "retrieval", "fpa").stdout)
    assert not [s for s in steps if s.startswith("train_")]
    assert steps[f"eval_{PILOT_RUN}_passkey"].startswith(
        f"{sys.executable} eval.py --task passkey --ckpt {results}/runs/{PILOT_RUN}/version_0/checkpoints/last.ckpt")
    assert "finished before, skipped" in run_script({**dry, "EVALS": "passkey1x"}, "retrieval", "fpa").stdout


# ------------------------------------------------------------------------------------------------ the pick

def runs(*rows):
    """(share, successes) of 100 trials each (None: missing) as the summary's rows."""
    return [{"share": share, "lr": 1e-3, "seed": 0} | ({"missing": True} if found is None else
                                                      {"successes": found, "trials": 100, "rate": found / 100})
            for share, found in rows]


@pytest.mark.parametrize("rows, picked", [
    (runs((0.05, 42), (0.1, 90), (0.2, 100)), 0.1),  # 90 of 100 reaches 90 %
    (runs((0.2, 97), (0.05, 95), (0.1, 99)), 0.05),  # the smallest share, in any order
    (runs((0.05, 89), (0.1, 12), (0.2, 95)), 0.2),  # not monotone: the smallest that reaches, not the first to fail
    (runs((0.05, 0), (0.1, 89), (0.2, 50)), None),  # no share reaches 90 %: nothing picked
    (runs((0.05, None), (0.1, 91)), 0.1),  # a missing run reaches nothing
    (runs((0.05, None)), None),
])
def test_the_pick_is_the_smallest_share_reaching_the_threshold(rows, picked):
    assert pick_share(rows) == picked


def test_the_summary_reads_each_runs_result_and_marks_missing_ones(tmp_path):
    def result(successes: int) -> pathlib.Path:
        path = tmp_path / f"passkey{successes}.json"
        model = {"successes": successes, "n": 100,
                 "rate": {"estimate": successes / 100, "lower": 0.0, "upper": 1.0, "confidence": 0.95}}
        path.write_text(json.dumps({"results": {"lengths": [{"length": 1024, "models": []},
                                                            {"length": 2048, "models": [model]}]}}))
        return path

    summary = summarise([("0.2", "1e-3", "0", result(93)), ("0.05", "1e-3", "0", result(60)),
                         ("0.1", "1e-3", "0", tmp_path / "absent.json")], length=2048, threshold=0.9)
    assert [(r["share"], r.get("successes"), r.get("missing", False)) for r in summary["runs"]] == [
        (0.05, 60, False), (0.1, None, True), (0.2, 93, False)]
    assert summary["picked_share"] == 0.2 and summary["length"] == 2048
    with pytest.raises(ValueError, match="no pass-key result at length 4096"):
        summarise([("0.1", "1e-3", "0", result(93))], length=4096, threshold=0.9)
