#!/usr/bin/env bash
# The GPU check of a fused kernel with carry tables (Selective, DCP), as one shell function that
# selective_kernel_check.sh and dcp_kernel_check.sh source and call with their kernel, tests and A/B knobs; from the
# repository root:
#   fused_kernel_check OUT SHAPES METHOD "TEST_FILE [OTHER_TEST_FILE ...]" [KNOBS ...]
#   1. the GPU tests (-m gpu): TEST_FILE in two processes so that Triton's compilation overlaps, its bf16 shapes
#      (OUT/tests_shapes.log) and the rest (OUT/tests_rest.log), and each other file in one more
#      (OUT/tests_NAME.log for tests/ops/NAME/test_NAME_fused.py), each process cut at TEST_LIMIT_S (default 300) s;
#   2. benchmarks/attention.py at SHAPES: METHOD (SDPA over the materialised (B, 1, T, T) bias) against
#      METHOD-fused, every time also as a ratio to SDPA-flash from the same process (OUT/timing.log);
#   3. the A/B: METHOD-fused once per KNOBS (environment assignments such as "SEL_PREFIX=scan"), each in its own
#      process (OUT/ab.log).
# Returns 1 when a test process failed.
fused_kernel_check() {
    local out=$1 shapes=$2 method=$3 status=0 name file pid knobs
    local -a tests=($4) pids=()
    shift 4
    mkdir -p "$out"
    export PYTHONUNBUFFERED=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
    local -a pytest=(timeout "${TEST_LIMIT_S:-300}" python3 -m pytest -q -m gpu -p no:cacheprovider)
    "${pytest[@]}" "${tests[0]}" -k "bf16_shapes" > "$out/tests_shapes.log" 2>&1 &
    pids+=($!)
    "${pytest[@]}" "${tests[0]}" -k "not bf16_shapes" > "$out/tests_rest.log" 2>&1 &
    pids+=($!)
    for file in "${tests[@]:1}"; do
        name=$(basename "$file" .py)
        name=${name#test_}
        "${pytest[@]}" "$file" > "$out/tests_${name%_fused}.log" 2>&1 &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || status=1; done
    tail -n 3 "$out"/tests_*.log
    echo "tests took ${SECONDS} s (status $status)"
    python3 benchmarks/attention.py --shapes "$shapes" --methods "$method,$method-fused" 2>&1 | tee "$out/timing.log"
    for knobs in "$@"; do
        echo "== $knobs" | tee -a "$out/ab.log"
        env $knobs python3 benchmarks/attention.py --shapes "$shapes" --methods "$method-fused" 2>&1 \
            | grep -E '^\| [0-9]|FAILED' | tee -a "$out/ab.log"
    done
    return $status
}
