#!/usr/bin/env bash
# GPU check of the fused Selective Attention kernel (issue #25, item 1) in one command, from the repository root:
#   bash benchmarks/selective_kernel_check.sh [results folder] [shapes]
#   1. the kernel's GPU tests (tests/ops/test_selective_fused.py -m gpu: bf16 shapes with and without documents,
#      fp16/fp32, head groups, NaN-poisoned buffers and determinism, the scan prefix), in two processes so that
#      Triton's compilation overlaps;
#   2. benchmarks/attention.py: selective (SDPA over the materialised (B, 1, T, T) bias) against selective-fused,
#      every time also as a ratio to SDPA-flash from the same process;
#   3. A/B of the kernel's untuned choices, each in its own process (the SEL_* variables are read by
#      fpa_lightning/ops/selective/fused.py only): the key-major backward on 64-query tiles instead of 32, the
#      in-tile prefix as a scan instead of a triangular matmul, a 128-row forward tile on 8 warps, and all heads in one
#      program group or one head per group (the default picks the fewest groups giving 4 programs per SM).
# SelectiveBackend runs this kernel; step 3 (not yet run on a GPU) is the A/B that would tune its launch choices.
# The steps are benchmarks/fused_kernel_check.sh's, which dcp_kernel_check.sh runs as well.
set -uo pipefail
source benchmarks/fused_kernel_check.sh
fused_kernel_check "${1:-selective_results}" "${2:-8x2048,4x4096,2x8192,1x16384}" selective \
    tests/ops/test_selective_fused.py \
    "SEL_BWD_BT=64" "SEL_PREFIX=scan" "SEL_FWD_BM=128 SEL_FWD_WARPS=8" "SEL_HEAD_GROUPS=1" "SEL_HEAD_GROUPS=12"
