#!/usr/bin/env bash
# GPU check of the fused Selective Attention kernel (issue #25, item 1) in one command, from the repository root:
#   bash benchmarks/selective_kernel_check.sh [results folder] [shapes]
#   1. the kernel's GPU tests (tests/ops/selective/test_selective_fused.py -m gpu: bf16 shapes with and without
#      documents, fp16/fp32, head groups, NaN-poisoned buffers and determinism, the scan prefix), in two processes so
#      that Triton's compilation overlaps;
#   2. benchmarks/attention.py: selective (SDPA over the materialised (B, 1, T, T) bias) against selective-fused,
#      every time also as a ratio to SDPA-flash from the same process;
#   3. A/B of the kernel's launch choices around the defaults of "Selective Attention s2" (benchmarks/KERNEL_LOG.md,
#      which has the 2026-12-04 run that chose them), each in its own process (the SEL_* variables are read by
#      fpa_lightning/ops/selective/fused.py only): s1's 3 head groups and 2 stages in the query-major backward, the
#      key-major backward on 64-query tiles, 3 stages there, 128-key tiles on 8 warps, and the scan prefix.
# The steps are benchmarks/fused_kernel_check.sh's, which dcp_kernel_check.sh runs as well.
set -uo pipefail
source benchmarks/fused_kernel_check.sh
fused_kernel_check "${1:-selective_results}" "${2:-8x2048,4x4096,2x8192,1x16384}" selective \
    tests/ops/selective/test_selective_fused.py \
    "SEL_HEAD_GROUPS=3" "SEL_BWD_Q_STAGES=2" "SEL_BWD_BT=64" "SEL_BWD_KV_STAGES=3" "SEL_BWD_BN=128 SEL_BWD_KV_WARPS=8" \
    "SEL_PREFIX=scan"
