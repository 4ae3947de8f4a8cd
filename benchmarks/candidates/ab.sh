#!/usr/bin/env bash
# GPU A/B of a kernel candidate: correctness first, then timing. Run from the repository root on the GPU machine.
#   bash benchmarks/candidates/ab.sh PATCH [shapes] [methods]     all steps, one table at the end
#   bash benchmarks/candidates/ab.sh tree PATCH                   only print a patched copy's folder
#   bash benchmarks/candidates/ab.sh test DIR | time DIR LOG [shapes] [methods] | profile DIR LOG [shapes] [methods]
#   | same DIR
# tree: copies the library, the benchmarks and the kernel tests into a temporary folder and applies the patch there.
# test: the GPU tests of the default variant on that copy (-x: a failure stops the A/B before any timing); AB_TESTS
# (test files) replaces them for a candidate of another op, e.g. AB_TESTS="tests/ops/dcp/test_dcp_fused.py
# tests/ops/selective/test_selective_fused.py" bash benchmarks/candidates/ab.sh PATCH "" dcp-fused,selective-fused.
# same: benchmarks/candidates/same_numbers.py, the base's and the copy's output and six gradients compared bit for bit
# (a candidate that only reorders exact operations must read "same" everywhere).
# time: benchmarks/attention.py in that copy, in its own process; every number is a ratio to SDPA-flash measured in
# the same process. The full run times the base the same way, alternating with the candidate for AB_ROUNDS rounds
# (default 2), and prints base and candidate side by side, each cell the range over the rounds.
# profile: benchmarks/attention.py --profile in that copy, its own process: CUDA ms of each kernel in one fwd+bwd. A
# kernel's own time varies far less between processes than a whole fwd+bwd (KERNEL_LOG, v9.11), so a change to one
# kernel shows there when the rounds' spread hides it.
# Adopt only what is faster on the GPU, and log the A/B in benchmarks/KERNEL_LOG.md.
set -euo pipefail
export PYTHONUNBUFFERED=1
SHAPES=8x2048,4x4096,2x8192,1x16384
METHODS=fpa,fpa-skip10

tree() {
    local dir
    dir=$(mktemp -d)
    mkdir -p "$dir/tests"
    cp -r fpa_lightning benchmarks pyproject.toml "$dir"/
    cp -r tests/conftest.py tests/_*.py tests/ops "$dir/tests/"
    local patch
    patch=$(realpath "$1")
    (cd "$dir" && { git apply "$patch" 2>/dev/null || patch -p1 -s < "$patch"; })
    echo "$dir"
}

run_tests() {
    if [ -n "${AB_TESTS:-}" ]; then
        # shellcheck disable=SC2086 (a list of test files)
        (cd "$1" && PYTHONPATH=. python3 -m pytest -q -x -m gpu -p no:cacheprovider $AB_TESTS)
    else
        (cd "$1" && PYTHONPATH=. python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/ops/fpa/test_fpa_fused.py -k "not variant")
    fi
}

run_timing() {  # DIR LOG [shapes] [methods]
    (cd "$1" && PYTHONPATH=. python3 benchmarks/attention.py --shapes "${3:-$SHAPES}" --methods "${4:-$METHODS}") > "$2" 2>&1
}

run_profile() {  # DIR LOG [shapes] [methods]
    (cd "$1" && PYTHONPATH=. python3 benchmarks/attention.py --profile --shapes "${3:-$SHAPES}" \
        --methods "${4:-$METHODS}") > "$2" 2>&1
}

table() {  # NAME "BASE_LOG..." "CANDIDATE_LOG...": forward and fwd+bwd ratios side by side, a range over rounds
    echo "| shape | method | base fwd / flash | $1 fwd / flash | base fwd+bwd / flash | $1 fwd+bwd / flash |"
    echo "|---|---|---|---|---|---|"
    python3 - "$2" "$3" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks/candidates")
from check_record import timing  # attention.py's table, parsed once for both tools
def ratios(paths):  # (shape, method) -> [(fwd ms, fwd ratio, fwd+bwd ms, fwd+bwd ratio) per log]
    out = {}
    for path in paths.split():
        for row in timing(Path(path))["rows"]:
            if row["method"] != "sdpa-flash":
                out.setdefault((row["shape"], row["method"]), []).append(
                    (row["fwd_ms"], row["fwd_vs_flash"], row["fwd_bwd_ms"], row["fwd_bwd_vs_flash"]))
    return out
def cell(runs, i):  # "1.81x (1.533 ms)", or over several rounds "1.81-1.85x (1.533-1.561 ms)"
    if not runs:
        return "-"
    ms, ratio = [r[i] for r in runs], [r[i + 1] for r in runs]
    if len(runs) == 1:
        return f"{ratio[0]:.2f}x ({ms[0]:.3f} ms)"
    return f"{min(ratio):.2f}-{max(ratio):.2f}x ({min(ms):.3f}-{max(ms):.3f} ms)"
base, cand = ratios(sys.argv[1]), ratios(sys.argv[2])
for key, c in cand.items():
    b = base.get(key, [])
    print(f"| {key[0]} | {key[1]} | {cell(b, 0)} | {cell(c, 0)} | {cell(b, 2)} | {cell(c, 2)} |")
PY
}

case "$1" in
    tree) tree "$2" ;;
    test) run_tests "$2" ;;
    time) run_timing "$2" "$3" "${4:-}" "${5:-}" ;;
    profile) run_profile "$2" "$3" "${4:-}" "${5:-}" ;;
    same) python3 benchmarks/candidates/same_numbers.py . "$2" ;;
    table) table "$2" "$3" "$4" ;;
    *)
        name=$(basename "$1" .patch)
        dir=$(tree "$1")
        echo "== $name: GPU tests of the default variant on the patched copy"
        run_tests "$dir" 2>&1 | tail -3
        echo "== $name: the same numbers as the base? (bf16, 2x2048)"
        python3 benchmarks/candidates/same_numbers.py . "$dir"
        # base and candidate alternate, each round in its own processes: one process per tree shifted the same
        # kernels by up to 4 % (KERNEL_LOG's rejected table, 2026-12-06), so a gain must exceed the rounds' spread
        for ((round = 1; round <= ${AB_ROUNDS:-2}; round++)); do
            run_timing . "$dir/base_$round.log" "${2:-}" "${3:-}"
            run_timing "$dir" "$dir/candidate_$round.log" "${2:-}" "${3:-}"
        done
        table "$name" "$(echo "$dir"/base_*.log)" "$(echo "$dir"/candidate_*.log)"
        ;;
esac
