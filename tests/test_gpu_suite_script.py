"""benchmarks/gpu_suite.sh on a CPU with a stand-in test folder: it hands TOKENIZER to the tests as
FPA_TEST_TOKENIZER (the FSDP tests failed on the H200 without it), runs each gpu-marked file (several at once) and writes its summary; a file with no GPU test is not a failure."""
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
    runs = dict(line.split("\t")[:2] for line in (tmp_path / "results" / "tests" / "runs.tsv").read_text().splitlines())
    assert {pathlib.Path(f).name: code for f, code in runs.items()} == {"test_stand_in.py": "0",
                                                                         "test_names_the_marker.py": "5"}
    assert "no GPU test collected (not a failure)" in done.stdout


def test_without_a_tokenizer_the_test_fails_and_the_suite_says_so(tmp_path):
    done = run_suite(tmp_path, {"TOKENIZER": ""})
    assert done.returncode != 0
    assert "test_stand_in.py: exit 1" in done.stdout
