"""Results are records, docs are the manual (issue #46).

- Every result file that README.md, BENCHMARKS.md, benchmarks/KERNEL_LOG.md or a docs/*.md page cites
  (``benchmarks/results/NAME.json``, or in BENCHMARKS.md and the kernel log a backticked ``NAME.json`` without its
  folder) exists and is valid JSON; a record in benchmarks/results/ itself holds the record keys (what, command,
  machine, versions, date), and a cited glob matches at least one JSON file.
- Every record's ``source`` of the form ``git show <commit>:<path>`` names a file that commit holds (where the checkout
  has its history).
- Every JSON file in a folder under benchmarks/results/ (a tool's own output, e.g. eval.py's result files or a probe
  run's folder under benchmarks/results/probes/) is valid JSON.
- docs/ holds no result files (JSON other than the few data files ``DOCS_JSON`` allows), logs, TensorBoard event files
  or shell scripts: a run's numbers go into a record, its logs stay in git's history.
- BENCHMARKS.md and the kernel log stay short pages (at most 300 lines each).
"""
import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RECORD_KEYS = ("what", "command", "machine", "versions", "date")
MAX_LINES = {"BENCHMARKS.md": 300, "benchmarks/KERNEL_LOG.md": 300}

CITED = re.compile(r"benchmarks/results/([\w./*-]+?\.json)")
BARE = re.compile(r"`([\w.-]+\.json)`")
SOURCE = re.compile(r"^git show ([0-9a-f]{7,40}):(\S+)$")
DOCS_JSON = {
    # the study corpus's manifest (file hashes, documents and tokens per split): input data that `lm_study.sh verify`
    # checks a built corpus against, not a measurement
    "docs/lm_study/corpus_manifest.json",
}
"""The JSON files docs/ may hold (paths from the repository root), each with why."""


def is_result_log_event_or_script(path: str) -> bool:
    """A file of docs/ that belongs in a record or in git's history: a JSON file ``DOCS_JSON`` does not allow, a log,
    a TensorBoard event file or a shell script."""
    name = path.rsplit("/", 1)[-1]
    if name.endswith(".json"):
        return path not in DOCS_JSON
    return name.endswith((".log", ".out", ".sh")) or "tfevents" in name


def pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", root / "BENCHMARKS.md", root / "benchmarks" / "KERNEL_LOG.md",
            *sorted((root / "docs").glob("*.md"))]


def citations(page: Path) -> set[str]:
    """The result files a page cites, relative to benchmarks/results/ (globs kept as written)."""
    text = page.read_text(encoding="utf-8")
    found = set(CITED.findall(text))
    if page.name in ("BENCHMARKS.md", "KERNEL_LOG.md"):
        found |= {name for name in BARE.findall(text) if "/" not in name}
    return found


def record_problems(path: Path, root: Path = ROOT) -> list[str]:
    """A result file that is not JSON, or a record (a file directly in benchmarks/results/) without the record keys;
    files in its subfolders are a tool's own output (eval.py's result files) and need only be JSON."""
    name = path.relative_to(root).as_posix()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return [f"{name}: not valid JSON ({error})"]
    if path.parent == root / "benchmarks" / "results":
        missing = [key for key in RECORD_KEYS if key not in data] if isinstance(data, dict) else list(RECORD_KEYS)
        if missing:
            return [f"{name}: a record without {', '.join(missing)}"]
    return []


def citation_problems(page: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for cited in sorted(citations(page)):
        where = f"{page.relative_to(root)} cites benchmarks/results/{cited}"
        if "*" in cited:
            matches = sorted((root / "benchmarks" / "results").glob(cited))
            if not matches:
                problems.append(f"{where}: no file matches")
            for match in matches:
                problems += [f"{where}: {p}" for p in record_problems(match, root)]
            continue
        target = root / "benchmarks" / "results" / cited
        if not target.is_file():
            problems.append(f"{where}: no such file")
            continue
        problems += [f"{where}: {p}" for p in record_problems(target, root)]
    return problems


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_cited_result_file_is_a_record(page):
    assert citation_problems(page) == []


def test_the_pages_cite_records():
    assert len(citations(ROOT / "BENCHMARKS.md")) >= 20
    assert len(citations(ROOT / "benchmarks" / "KERNEL_LOG.md")) >= 15


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_every_record_holds_the_record_keys(path):
    assert record_problems(path) == []


def sources(path: Path) -> list[str]:
    source = json.loads(path.read_text(encoding="utf-8")).get("source", [])
    return [source] if isinstance(source, str) else list(source)


def test_every_git_source_names_a_committed_file():
    wanted = sorted({f"{m.group(1)}:{m.group(2)}" for path in RESULTS.glob("*.json") for s in sources(path)
                     if (m := SOURCE.match(s))})
    assert wanted, "no record names a git source"
    try:
        done = subprocess.run(["git", "cat-file", "--batch-check"], cwd=ROOT, input="\n".join(wanted) + "\n",
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        pytest.skip("git is not available")
    if done.returncode != 0:
        pytest.skip("not a git checkout")
    missing = [name for name, line in zip(wanted, done.stdout.splitlines()) if line.endswith(" missing")]
    if missing and all(line.endswith(" missing") for line in done.stdout.splitlines()):
        pytest.skip("the checkout lacks the history the records cite (a shallow clone?)")
    assert missing == []


def docs_files(root: Path = ROOT) -> list[str]:
    """docs/'s files as git tracks them (every file under docs/ where the checkout is not a git repository)."""
    try:
        done = subprocess.run(["git", "ls-files", "docs"], cwd=root, capture_output=True, text=True, timeout=60)
        if done.returncode == 0 and done.stdout.strip():
            return [line for line in done.stdout.splitlines() if (root / line).exists()]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return [p.relative_to(root).as_posix() for p in (root / "docs").rglob("*") if p.is_file()]


def test_docs_hold_no_result_files_logs_event_files_or_scripts():
    found = [path for path in docs_files() if is_result_log_event_or_script(path)]
    assert found == [], "docs/ is the manual: put the numbers in a record under benchmarks/results/"


def test_every_json_file_docs_may_hold_exists():
    """An allowed file that moved or went away leaves ``DOCS_JSON``."""
    assert sorted(path for path in DOCS_JSON if not (ROOT / path).is_file()) == []


def test_every_json_file_in_a_result_folder_is_valid():
    folders = [path for path in sorted(RESULTS.rglob("*.json")) if path.parent != RESULTS]
    assert any(path.is_relative_to(RESULTS / "probes") for path in folders)
    assert [problem for path in folders for problem in record_problems(path)] == []


@pytest.mark.parametrize("name", sorted(MAX_LINES))
def test_the_benchmark_pages_stay_short(name):
    lines = (ROOT / name).read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES[name], f"{name} has {len(lines)} lines, at most {MAX_LINES[name]}"


def test_the_checks_find_a_missing_or_malformed_record(tmp_path):
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    (results / "good_2026-01-01.json").write_text(json.dumps(dict.fromkeys(RECORD_KEYS, "x")), encoding="utf-8")
    (results / "bare_2026-01-01.json").write_text(json.dumps({"what": "no command"}), encoding="utf-8")
    (results / "broken_2026-01-01.json").write_text("{", encoding="utf-8")
    page = tmp_path / "BENCHMARKS.md"
    page.write_text("`good_2026-01-01.json`, [x](benchmarks/results/good_2026-01-01.json), `missing_2026-01-01.json`,\n"
                    "benchmarks/results/bare_2026-01-01.json and benchmarks/results/broken_2026-01-01.json,\n"
                    "benchmarks/results/none_*/x.json\n", encoding="utf-8")
    problems = citation_problems(page, root=tmp_path)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "benchmarks/results/bare_2026-01-01.json: a record without command, machine, versions, date",
        "benchmarks/results/broken_2026-01-01.json: not valid JSON (Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1))",
        "no such file",
        "no file matches",
    ]


def test_the_docs_check_names_results_logs_events_and_scripts():
    assert is_result_log_event_or_script("docs/x/run.log") and is_result_log_event_or_script("docs/x/call.sh")
    assert is_result_log_event_or_script("docs/x/gpu_suite.out")
    assert is_result_log_event_or_script("docs/x/events.out.tfevents.1796299145.vm.9829.0")
    assert is_result_log_event_or_script("docs/probes/h200_2026-12-02/probes.json")
    assert not is_result_log_event_or_script("docs/lm_study/corpus_manifest.json")
    assert not is_result_log_event_or_script("docs/lm_study/loss_curves.png")
    assert not is_result_log_event_or_script("docs/training.md")
