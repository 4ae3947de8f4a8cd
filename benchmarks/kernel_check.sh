#!/usr/bin/env bash
# The fused FPA kernel's GPU check in one command (about 8 minutes on one H200), a short table last:
#   1. the GPU tests of tests/ops/fpa/test_fpa_fused.py (in five processes by variant, so that Triton's compilation
#      overlaps), the backend wiring test, and each candidate's tests on its patched copy
#      (benchmarks/candidates/*.patch) in the same five groups, all in parallel;
#   2. benchmarks/attention.py: SDPA-flash, FPA dense and with skipping, and each variant (query, dipsum, docs);
#   3. the timing of each candidate whose tests passed, alternating with the base's for AB_ROUNDS rounds (default 2),
#      each in its own process (ratios to its own SDPA-flash; dense, skip and documents, or CANDIDATE_METHODS), each
#      kernel's CUDA time on base and candidate (attention.py --profile), and whether its output and gradients are
#      the base's bit for bit (benchmarks/candidates/same_numbers.py).
#   bash benchmarks/kernel_check.sh [results folder]
#   CANDIDATES="NAME1 NAME2" bash benchmarks/kernel_check.sh           # only these candidates (names
#                                                       of benchmarks/candidates/*.patch; default all, "" for none)
# The closing tables also go to RESULTS/summary.md, and every number to RESULTS/record.json
# (benchmarks/candidates/check_record.py). Every test process stops after TEST_LIMIT_S seconds (default 390):
# one candidate's 71 tests in a single process took 270 to 440+ s on an H100 beside the base's tests, so each group of
# a candidate runs in its own process, as the base's do (16 cores: three candidates at once finish within the limit).
set -uo pipefail
out=${1:-kernel_results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
status=0
pids=()
limit=${TEST_LIMIT_S:-390}  # each test process: a hang must not eat the timing phase
# one pytest process per group of kernels to compile: Triton's compilation is single-threaded per process
groups=("default_shapes:not variant and bf16_random_shapes" "default_rest:not variant and not bf16_random_shapes"
        "query:variant and query" "dipsum:variant and dipsum" "docs:variant and docs and not query and not dipsum")
fused_tests() {  # DIR LOG_PREFIX: every group of the fused kernel's GPU tests in DIR, each its own process
    local group
    for group in "${groups[@]}"; do
        (cd "$1" && timeout "$limit" python3 -m pytest -q -m gpu -p no:cacheprovider \
            tests/ops/fpa/test_fpa_fused.py -k "${group#*:}") > "$2_${group%%:*}.log" 2>&1 &
        pids+=($!)
    done
}
fused_tests . "$out/tests"
timeout "$limit" python3 -m pytest -q -p no:cacheprovider tests/attention/test_backends.py -k "fused_path or impl_resolution" \
    > "$out/tests_backends.log" 2>&1 &
pids+=($!)
declare -A trees
for patch in benchmarks/candidates/*.patch; do
    [ -e "$patch" ] || continue
    name=$(basename "$patch" .patch)
    if [ -n "${CANDIDATES+set}" ] && [[ " $CANDIDATES " != *" $name "* ]]; then continue; fi
    trees[$name]=$(bash benchmarks/candidates/ab.sh tree "$patch")
    # every variant's GPU tests (documents, query level), not ab.sh's default subset: the candidates touch them all
    fused_tests "${trees[$name]}" "$out/tests_candidate_$name"
done
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
# the timing phase takes ~3 minutes at four shapes; past TIME_LEFT_S (default 300) of tests it keeps two shapes, so
# that the whole check stays within ~9 minutes
shapes=8x2048,4x4096,2x8192,1x16384
if (( SECONDS > ${TIME_LEFT_S:-300} )); then shapes=8x2048,1x16384; fi
echo "tests took ${SECONDS} s; timing shapes $shapes"
python3 benchmarks/attention.py --methods sdpa-flash,fpa,fpa-skip10,fpa-query,fpa-dipsum,fpa-docs --shapes "$shapes" \
    > "$out/attention.log" 2>&1 || status=1
all_passed() {  # LOG...: each log's last line is pytest's summary with passes and no failure or error
    local log last
    for log in "$@"; do
        last=$(tail -n 1 "$log")
        [[ "$last" == *" passed"* && "$last" != *failed* && "$last" != *error* ]] || return 1
    done
}
# the paths a candidate may change: dense, skipping and documents (a change to the documents' set-up is invisible on
# the other two, which then measure the run's own variation)
candidate_methods=${CANDIDATE_METHODS:-fpa,fpa-skip10,fpa-docs}
passed=()
for name in "${!trees[@]}"; do
    if all_passed "$out/tests_candidate_${name}_"*.log; then passed+=("$name"); fi
done
# AB_ROUNDS rounds (default 2), each timing the base and then every candidate that passed, each in its own process:
# one process per tree moves the same kernels by up to 4 %, so a gain must exceed the rounds' spread
rm -f "$out"/timing_base_*.log "$out"/timing_candidate_*.log  # a reused results folder: no earlier run's rounds
for ((round = 1; round <= ${AB_ROUNDS:-2} && ${#passed[@]} > 0; round++)); do
    bash benchmarks/candidates/ab.sh time . "$out/timing_base_$round.log" "$shapes" "$candidate_methods" || status=1
    for name in "${passed[@]}"; do
        bash benchmarks/candidates/ab.sh time "${trees[$name]}" "$out/timing_candidate_${name}_$round.log" "$shapes" \
            "$candidate_methods" || status=1
    done
done
# each kernel's own CUDA time on each tree (attention.py --profile, one process a tree): it resolves a change to one
# kernel that the rounds' spread of whole fwd+bwd times hides (KERNEL_LOG, v9.11)
rm -f "$out"/profile_*.log
if ((${#passed[@]} > 0)); then
    bash benchmarks/candidates/ab.sh profile . "$out/profile_base.log" "$shapes" "$candidate_methods" || status=1
fi
for name in "${passed[@]}"; do
    bash benchmarks/candidates/ab.sh profile "${trees[$name]}" "$out/profile_candidate_$name.log" "$shapes" \
        "$candidate_methods" || status=1
    bash benchmarks/candidates/ab.sh same "${trees[$name]}" > "$out/same_candidate_$name.log" 2>&1 || status=1
done
summary() {
    echo "== tests (last lines)"
    for f in "$out"/tests_*.log; do echo "$(basename "$f" .log): $(tail -n 1 "$f")"; done
    for name in "${!trees[@]}"; do
        echo "== candidate $name (timed only if its tests passed)"
        [ -f "$out/timing_candidate_${name}_1.log" ] && bash benchmarks/candidates/ab.sh table "$name" \
            "$(echo "$out"/timing_base_*.log)" "$(echo "$out"/timing_candidate_"${name}"_*.log)"
        [ -f "$out/profile_candidate_$name.log" ] && python3 benchmarks/candidates/check_record.py "$out" \
            --kernel-table "$name"
        [ -f "$out/same_candidate_$name.log" ] && cat "$out/same_candidate_$name.log"
    done
    echo "== benchmarks/attention.py, one run (ratios to SDPA-flash)"
    grep "^|" "$out/attention.log"
}
echo
summary | tee "$out/summary.md"
# every number of the call in one file (a device call may not return every log): the record to commit
settings=""
for var in CANDIDATES TIME_LEFT_S AB_ROUNDS TEST_LIMIT_S CANDIDATE_METHODS; do
    [ -n "${!var+set}" ] && settings+="$var=\"${!var}\" "
done
python3 benchmarks/candidates/check_record.py "$out" --command "${settings}bash benchmarks/kernel_check.sh $out" || status=1
exit $status
