#!/usr/bin/env bash
# The GPU run behind BENCHMARKS.md, in one go: every GPU test, the attention benchmark and whole-model training
# throughput, then a summary table. Run from the repository root on a CUDA machine with the project importable
# (PYTHONPATH=. works).
#   bash benchmarks/gpu_suite.sh [results folder]
# Tests: every test file holding a `gpu`-marked test (what `pytest --collect-only -m gpu` finds, plus every test file
# that names the marker, so a file that fails to import still shows up) is cut into shards of at most SHARD tests
# (default 2; a file whose GPU tests cannot be collected runs whole), each shard its own process, `pytest -m gpu
# NODE...`, under a time limit (FILE_TIMEOUT seconds per shard, default 1200; past it the shard is killed and reported
# as TIMEOUT). JOBS shards (default 8) run at once. The GPU tests are small kernels and short trainings whose time
# goes to Triton's compiler and to process start-up on the CPU, one core per process, and leave most of an H200 idle:
# one file at a time took over 6 minutes, and three whole files at a time still did not finish the fused-kernel file
# (69 tests, about 8 s each) within 400 s (runs 2 and 3 in benchmarks/results/gpu_suite_2026-12-02.json). A file
# that names the marker but collects no GPU test (pytest's exit 5) is reported and is not a failure.
# The end of the output is a table per file: passed, failed, errors, skipped, seconds summed over its shards, status
# (also in RESULTS/gpu_tests_summary.md, with each shard's log and JUnit XML in RESULTS/tests/).
# Environment: TOKENIZER=path/to/tokenizer.json where mistral-common is absent (the tests get it as
# FPA_TEST_TOKENIZER, the throughput benchmark as --tokenizer); TESTS (test folders or files,
# space-separated; default: tests); FILE_TIMEOUT;
# JOBS; SHARD; MARKS (the tests' marker expression, default "gpu"; MARKS="gpu or not gpu" runs every collected test on
# the GPU, the tiny-shape kernel tests too, which CI runs only in the interpreter: two of them failed on an H100 for
# faults the interpreter could not show, 2026-12-07); SKIP_BENCHMARKS=1 runs the tests only; STEPS (default 200) for the fpa/fox/sdpa models, PEER_STEPS (default 60) for
# selective and dcp; PYTHON (default python3). The exit code is non-zero when any file or benchmark failed.
set -uo pipefail
results=${1:-gpu_results}
python=${PYTHON:-python3}
limit=${FILE_TIMEOUT:-1200}
export MARKS=${MARKS:-gpu}  # the summary below prints it
mkdir -p "$results/tests"
export PYTHONUNBUFFERED=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
# the tests that train through train.py (tests/distributed) read FPA_TEST_TOKENIZER: without it, and without
# mistral-common, they fail (six FSDP tests did on the H200 image, 2026-12-02)
[ -n "${TOKENIZER:-}" ] && export FPA_TEST_TOKENIZER=${FPA_TEST_TOKENIZER:-$TOKENIZER}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$results/machine.txt"
"$python" -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__, '| cuda', torch.cuda.is_available())" | tee -a "$results/machine.txt"
status=0

# --- the GPU tests, each file in shards ---------------------------------------------------------------------------
read -ra roots <<<"${TESTS:-tests}"
jobs_at_once=${JOBS:-8}
shard_size=${SHARD:-2}
# shards.tsv: file, shard name, node ids (space-separated; empty: the whole file). Node ids are rewritten onto the
# file's path as grep finds it, since collect-only names them relative to pytest's rootdir.
{
    "$python" -m pytest --collect-only -q -m "$MARKS" -p no:cacheprovider "${roots[@]}" 2>/dev/null | grep -E '^[^ ]+\.py::'
    echo "--- files"
    grep -rlE --include='test_*.py' 'mark\.gpu' "${roots[@]}"
} | "$python" -c '
import os, sys
shard, roots = int(sys.argv[1]), sys.argv[2:]
lines = sys.stdin.read().splitlines()
cut = lines.index("--- files")
def ancestors(path):
    path = os.path.abspath(path)
    while True:
        yield path
        if path == os.path.dirname(path):
            return
        path = os.path.dirname(path)
# node ids are relative to the rootdir of pytest: the directory of its ini-file or a common ancestor of the working
# directory and the test roots (the folder above both when the roots lie outside the repository)
bases = list(dict.fromkeys(b for start in [".", *roots] for b in ancestors(start)))
def real(path):  # a collected file
    for base in bases:
        if os.path.isfile(os.path.join(base, path)):
            return os.path.realpath(os.path.join(base, path))
    return None
files = {os.path.realpath(f): f for f in lines[cut + 1:]}
nodes = {}
for node in lines[:cut]:
    path, _, rest = node.partition("::")
    key = real(path)
    if key is not None:
        files.setdefault(key, os.path.relpath(key))
        nodes.setdefault(key, []).append(files[key] + "::" + rest)
for key, file in sorted(files.items(), key=lambda kv: kv[1]):
    name = os.path.splitext(file)[0].strip("/").replace("/", "_")
    own = nodes.get(key, [])
    if not own:
        print(f"{file}\t{name}\t")
    for i in range(0, len(own), shard):
        print(f"{file}\t{name}.part{i // shard + 1}\t{chr(32).join(own[i:i + shard])}")
' "$shard_size" "${roots[@]}" >"$results/tests/shards.tsv"
cut -f1 "$results/tests/shards.tsv" | uniq >"$results/tests/files.txt"
mapfile -t files <"$results/tests/files.txt"
echo "GPU tests: ${#files[@]} files in $(wc -l <"$results/tests/shards.tsv") shards of at most $shard_size tests," \
     "at most $limit s each, $jobs_at_once at once"
: >"$results/tests/runs.tsv"
run_shard() {  # FILE NAME [NODE...]: one shard's GPU tests, its line appended to runs.tsv (one short write)
    local file=$1 name=$2 start=$SECONDS code
    shift 2
    [ $# -gt 0 ] || set -- "$file"
    timeout -k 30 "$limit" "$python" -m pytest -q -m "$MARKS" -p no:cacheprovider -rfEs --junitxml="$results/tests/$name.xml" \
        "$@" >"$results/tests/$name.log" 2>&1
    code=$?
    printf '%s\t%s\t%s\t%s\n' "$file" "$code" "$((SECONDS - start))" "$name" >>"$results/tests/runs.tsv"
    echo "== $name: exit $code after $((SECONDS - start)) s: $(tail -n 1 "$results/tests/$name.log")"
}
tests_start=$SECONDS
while IFS=$'\t' read -r file name nodes; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_at_once" ]; do wait -n; done
    read -ra node_list <<<"$nodes"
    run_shard "$file" "$name" "${node_list[@]}" &
done <"$results/tests/shards.tsv"
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
shards = {}  # file -> [(exit code, seconds, shard name)]
for line in open(os.path.join(results, "tests", "runs.tsv")):
    file, code, seconds, name = line.rstrip("\n").split("\t")
    shards.setdefault(file, []).append((int(code), int(seconds), name))


def counts_of(name):
    """passed, failed, errors, skipped of one shard from its JUnit XML (None: killed before it was written)."""
    try:
        suites = ET.parse(os.path.join(results, "tests", f"{name}.xml")).getroot()
    except (OSError, ET.ParseError):
        return None
    suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
    n, failed, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    return [n - failed - errors - skipped, failed, errors, skipped]


rows, total = [], [0, 0, 0, 0, 0]
for file in sorted(shards):
    counts, seconds, codes = [0, 0, 0, 0], 0, []
    for code, secs, name in shards[file]:
        found = counts_of(name)
        counts = [c + f for c, f in zip(counts, found)] if found and counts is not None else None
        seconds, codes = seconds + secs, codes + [code]
    total = [t + c for t, c in zip(total, (counts or [0, 0, 0, 0]) + [seconds])]
    worst = max(codes, key=lambda c: (c not in (0, 5), c != 0, c))  # any failure, else 5, else 0
    status = EXIT.get(worst, f"ERROR (exit {worst})")
    if len(codes) > 1:
        status += f" ({len(codes)} shards{'' if worst in (0, 5) else f', {sum(c not in (0, 5) for c in codes)} not ok'})"
    rows.append([file, *(map(str, counts) if counts else ["-"] * 4), str(seconds), status])
wall = open(os.path.join(results, "tests", "wall_seconds.txt")).read().strip()
rows.append(["all files (seconds: summed over shards)", *map(str, total), f"wall time {wall} s"])
header = ["file", "passed", "failed", "errors", "skipped", "seconds", "status"]
width = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
print(f"GPU tests (pytest -m {os.environ['MARKS']!r}, one process per shard):")
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
