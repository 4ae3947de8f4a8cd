#!/usr/bin/env bash
# The GPU run behind BENCHMARKS.md, in one go: every GPU test, the attention benchmark and whole-model training
# throughput, then a summary table. Run from the repository root on a CUDA machine with the project importable
# (PYTHONPATH=. works).
#   bash benchmarks/gpu_suite.sh [results folder]
# Tests: every test file holding a `gpu`-marked test (what `pytest --collect-only -m gpu` finds, plus every test file
# that names the marker, so a file that fails to import still shows up) runs on its own, `pytest -m gpu FILE`, under a
# time limit per file (FILE_TIMEOUT seconds, default 1200; a file past it is killed and reported as TIMEOUT). JOBS
# files (default 3) run at once: the GPU tests are small kernels and short trainings that leave most of an H200 idle,
# and one file at a time took over 6 minutes (docs/benchmarks/gpu_suite_2026-12-02_run2: five files in 367 s, the
# FSDP file killed at its 150 s limit, the fused-kernel file cut off after 28 of its 69 tests). A file that names the
# marker but collects no GPU test (pytest's exit 5) is reported and is not a failure. The end of the output is a table
# per file: passed, failed, errors, skipped, seconds and status (also in RESULTS/gpu_tests_summary.md, with each
# file's log and JUnit XML in RESULTS/tests/).
# Run time with JOBS=3: not measured yet. The test part is bounded by FILE_TIMEOUT per file; the benchmarks are not.
# Environment: TOKENIZER=path/to/tokenizer.json where mistral-common is absent (the tests get it as
# FPA_TEST_TOKENIZER, the throughput benchmark as --tokenizer); TESTS (test folders or files,
# space-separated; default: tests); FILE_TIMEOUT;
# JOBS; SKIP_BENCHMARKS=1 runs the tests only; STEPS (default 200) for the fpa/fox/sdpa models, PEER_STEPS (default 60) for
# selective and dcp; PYTHON (default python3). The exit code is non-zero when any file or benchmark failed.
set -uo pipefail
results=${1:-gpu_results}
python=${PYTHON:-python3}
limit=${FILE_TIMEOUT:-1200}
mkdir -p "$results/tests"
export PYTHONUNBUFFERED=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
# the tests that train through train.py (tests/distributed) read FPA_TEST_TOKENIZER: without it, and without
# mistral-common, they fail (six FSDP tests did on the H200 image, 2026-12-02)
[ -n "${TOKENIZER:-}" ] && export FPA_TEST_TOKENIZER=${FPA_TEST_TOKENIZER:-$TOKENIZER}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$results/machine.txt"
"$python" -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__, '| cuda', torch.cuda.is_available())" | tee -a "$results/machine.txt"
status=0

# --- the GPU tests, one file at a time ------------------------------------------------------------------------------
read -ra roots <<<"${TESTS:-tests}"
mapfile -t files < <({
    "$python" -m pytest --collect-only -q -m gpu -p no:cacheprovider "${roots[@]}" 2>/dev/null \
        | grep -oE '^[^ :]+\.py::' | sed 's/::$//'
    grep -rlE --include='test_*.py' 'mark\.gpu' "${roots[@]}"
} | sort -u | while read -r f; do [ -f "$f" ] && echo "$f"; done)  # collect-only names are rootdir-relative
printf '%s\n' "${files[@]}" >"$results/tests/files.txt"
jobs_at_once=${JOBS:-3}
echo "GPU tests: ${#files[@]} files, at most $limit s each, $jobs_at_once at once"
: >"$results/tests/runs.tsv"
run_file() {  # FILE: one file's GPU tests, its line appended to runs.tsv (one short write: no interleaving)
    local file=$1 name start code
    name=$(echo "${1%.py}" | tr '/' '_')
    start=$SECONDS
    timeout -k 30 "$limit" "$python" -m pytest -q -m gpu -p no:cacheprovider -rfEs --junitxml="$results/tests/$name.xml" \
        "$file" >"$results/tests/$name.log" 2>&1
    code=$?
    printf '%s\t%s\t%s\t%s\n' "$file" "$code" "$((SECONDS - start))" "$name" >>"$results/tests/runs.tsv"
    echo "== $file: exit $code after $((SECONDS - start)) s: $(tail -n 1 "$results/tests/$name.log")"
}
tests_start=$SECONDS
for file in "${files[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_at_once" ]; do wait -n; done
    run_file "$file" &
done
wait
echo "$((SECONDS - tests_start))" >"$results/tests/wall_seconds.txt"
echo "GPU tests: ${#files[@]} files in $((SECONDS - tests_start)) s"
# exit 5: the file names the marker but collects no GPU test (a test of this script, say): not a failure
cut -f2 "$results/tests/runs.tsv" | grep -qvxE '0|5' && status=1

# --- benchmarks -----------------------------------------------------------------------------------------------------
: >"$results/benchmarks.tsv"
bench() {  # bench NAME COMMAND...: run, log to RESULTS/NAME.log, record the exit code
    local name=$1 start=$SECONDS; shift
    "$@" 2>&1 | tee "$results/$name.log"
    local code=${PIPESTATUS[0]}
    printf '%s\t%s\t%s\n' "$name" "$code" "$((SECONDS - start))" >>"$results/benchmarks.tsv"
    [ "$code" -eq 0 ] || status=1
}
if [ "${SKIP_BENCHMARKS:-0}" != 1 ]; then
    bench attention "$python" benchmarks/attention.py
    bench throughput "$python" benchmarks/train_throughput.py --configs fpa fox sdpa --steps "${STEPS:-200}" \
        --profile-steps 5 ${TOKENIZER:+--tokenizer "$TOKENIZER"} --json "$results/throughput.json"
    bench throughput_peers "$python" benchmarks/train_throughput.py --configs selective dcp --steps "${PEER_STEPS:-60}" \
        --warmup 20 ${TOKENIZER:+--tokenizer "$TOKENIZER"} --json "$results/throughput_peers.json"
fi

# --- the summary table (the last thing printed) ---------------------------------------------------------------------
"$python" - "$results" "$limit" <<'EOF' | tee "$results/gpu_tests_summary.md"
import os, sys
import xml.etree.ElementTree as ET

results, limit = sys.argv[1], sys.argv[2]
EXIT = {0: "ok", 1: "FAILED", 2: "ERROR (interrupted or collection error)", 3: "ERROR (internal)", 4: "ERROR (usage)",
        5: "no GPU test collected (not a failure)", 124: f"TIMEOUT ({limit} s)", 137: f"TIMEOUT ({limit} s, killed)"}
rows, total = [], [0, 0, 0, 0, 0]
for line in sorted(open(os.path.join(results, "tests", "runs.tsv"))):
    file, code, seconds, name = line.rstrip("\n").split("\t")
    counts = ["-"] * 4
    try:
        suites = ET.parse(os.path.join(results, "tests", f"{name}.xml")).getroot()
        suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
        n, failed, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
        counts = [n - failed - errors - skipped, failed, errors, skipped]
        total = [t + c for t, c in zip(total, counts + [int(seconds)])]
    except (OSError, ET.ParseError, AttributeError):  # killed before the XML was written
        total[4] += int(seconds)
    rows.append([file, *map(str, counts), seconds, EXIT.get(int(code), f"ERROR (exit {code})")])
wall = open(os.path.join(results, "tests", "wall_seconds.txt")).read().strip()
rows.append(["all files (seconds: summed over files)", *map(str, total), f"wall time {wall} s"])
header = ["file", "passed", "failed", "errors", "skipped", "seconds", "status"]
width = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
print("GPU tests (pytest -m gpu, one process per file):")
for r in [header, ["-" * w for w in width], *rows]:
    print("| " + " | ".join(c.ljust(w) for c, w in zip(r, width)) + " |")
bench = os.path.join(results, "benchmarks.tsv")
if os.path.exists(bench) and os.path.getsize(bench):
    print("\nbenchmarks:")
    for line in open(bench):
        name, code, seconds = line.split()
        print(f"  {name:18s} {'ok' if code == '0' else 'FAILED (exit ' + code + ')':18s} {seconds} s")
EOF
exit $status
