#!/usr/bin/env bash
# GPU A/B of launch settings of the decoding step's kernels (ops/decode_step) that wait for one, set through their
# A/B-only environment knobs (no patch): run from the repository root on the GPU machine,
#   bash benchmarks/candidates/decode_step_launch.sh [OUT_DIR]
# Each setting runs benchmarks/decode.py in its own process, graph mode, batch 1 (the default first and last, to see
# the noise). What each tries (benchmarks/KERNEL_LOG.md, "Decode step s1", what next):
# - the evicting store_token's slot scan in one block of 4096 slots, on 1 and on 4 warps (0.022 ms a step of the
#   pruned step's 0.545 at 16k; the goals: ≤ 0.8x softmax at 16k, ≤ 1.0x unpruned FPA at 4k);
# - FPA's step attention on 128-slot blocks with 4 warps (64 on 4 and 128 on 8 were measured, not this).
# Adopt a setting (as the default in ops/decode_step/fused.py) only where it is faster at every length, and log it.
set -u
out=${1:-decode_step_launch}; mkdir -p "$out"
export PYTHONUNBUFFERED=1
bench() {  # NAME VARIANTS LENGTHS [KNOB=VALUE ...]
    local name=$1 variants=$2 lengths=$3; shift 3
    env "$@" timeout 120 python3 benchmarks/decode.py --variants $variants --modes graph --lengths $lengths \
        --batches 1 --steps 256 --json "$out/$name.json" > "$out/$name.log" 2>&1
    echo "== $name ($*)"; grep "^graph " "$out/$name.log"
}
bench evict_default "softmax fpa fpa-prune-10" "4096 16384" DEFAULT=1
bench evict_scan4096 "fpa-prune-10" "4096 16384" STEP_SCAN_BLOCK=4096
bench evict_scan4096_w4 "fpa-prune-10" "4096 16384" STEP_SCAN_BLOCK=4096 STEP_STORE_WARPS=4
bench fpa_default "fpa" "1024 8192 16384" DEFAULT=1
bench fpa_b128_w4 "fpa" "1024 8192 16384" STEP_BLOCK_S=128 STEP_WARPS=4
bench evict_default_again "softmax fpa fpa-prune-10" "4096 16384" DEFAULT=2
