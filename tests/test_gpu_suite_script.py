"""benchmarks/gpu_suite.sh on a CPU with a stand-in test folder: it hands TOKENIZER to the tests as
FPA_TEST_TOKENIZER (the FSDP tests failed on the H200 without it), runs each gpu-marked file in shards (several at
once) and writes one summary row per file; a file with no GPU test is not a failure; MARKS widens the tests run."""
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

STAND_IN = '''
import os
import pytest


@pytest.mark.gpu
def test_sees_the_tokenizer():
    assert os.environ["FPA_TEST_TOKENIZER"] == "{tokenizer}"


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 2])
def test_one_of_several(n):
    assert n in (1, 2)


@pytest.mark.gpu
def test_skipped_here():
    pytest.skip("stands for a test that skips itself")


def test_not_a_gpu_test():
    assert False, "the suite runs only gpu-marked tests"
'''


# names the marker (so the suite lists it) but holds no GPU test: pytest -m gpu exits 5 on it
NO_GPU_TEST = '''
def test_on_any_machine():
    assert "pytest.mark.gpu"
'''


def run_suite(tmp_path: pathlib.Path, env_extra: dict) -> subprocess.CompletedProcess:
    tests = tmp_path / "stand_in"
    tests.mkdir(exist_ok=True)
    (tests / "test_stand_in.py").write_text(STAND_IN.format(tokenizer=tmp_path / "tok.json"))
    (tests / "test_names_the_marker.py").write_text(NO_GPU_TEST)
    env = {**os.environ, "SKIP_BENCHMARKS": "1", "TESTS": str(tests), "PYTHON": sys.executable, **env_extra}
    env.pop("FPA_TEST_TOKENIZER", None)
    return subprocess.run(["bash", "benchmarks/gpu_suite.sh", str(tmp_path / "results")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_tokenizer_reaches_the_tests(tmp_path):
    done = run_suite(tmp_path, {"TOKENIZER": str(tmp_path / "tok.json")})
    assert done.returncode == 0, done.stdout + done.stderr
    runs = [line.split("\t") for line in (tmp_path / "results" / "tests" / "runs.tsv").read_text().splitlines()]
    shards = sorted((pathlib.Path(f).name, code, name.rsplit(".", 1)[-1][-21:]) for f, code, _, name in runs)
    assert shards == [("test_names_the_marker.py", "5", "test_names_the_marker"),  # runs whole
                      ("test_stand_in.py", "0", "part1"), ("test_stand_in.py", "0", "part2")]  # 4 GPU tests, SHARD=2
    summary = (tmp_path / "results" / "gpu_tests_summary.md").read_text()
    stand_in = next(line for line in summary.splitlines() if "test_stand_in.py" in line)
    # passed, failed, errors, skipped summed over the two shards
    assert [c.strip() for c in stand_in.split("|")[2:6]] == ["3", "0", "0", "1"] and "ok (2 shards)" in stand_in
    assert "no GPU test collected (not a failure)" in done.stdout


def test_without_a_tokenizer_the_test_fails_and_the_suite_says_so(tmp_path):
    done = run_suite(tmp_path, {"TOKENIZER": ""})
    assert done.returncode != 0
    assert "test_stand_in.part1: exit 1" in done.stdout
    stand_in = next(line for line in (tmp_path / "results" / "gpu_tests_summary.md").read_text().splitlines()
                    if "test_stand_in.py" in line)
    assert "FAILED (2 shards, 1 not ok)" in stand_in


def test_marks_run_the_unmarked_tests_too(tmp_path):
    """MARKS="gpu or not gpu": every collected test runs (the tiny-shape kernel tests on a GPU), the unmarked one
    among them, whose failure fails the suite."""
    done = run_suite(tmp_path, {"TOKENIZER": str(tmp_path / "tok.json"), "MARKS": "gpu or not gpu"})
    assert done.returncode != 0
    summary = (tmp_path / "results" / "gpu_tests_summary.md").read_text()
    stand_in = next(line for line in summary.splitlines() if "test_stand_in.py" in line)
    assert [c.strip() for c in stand_in.split("|")[2:6]] == ["3", "1", "0", "1"]  # test_not_a_gpu_test failed
    marker_file = next(line for line in summary.splitlines() if "test_names_the_marker.py" in line)
    assert [c.strip() for c in marker_file.split("|")[2:6]] == ["1", "0", "0", "0"]  # collected now, and passes
    assert "pytest -m 'gpu or not gpu'" in done.stdout
