#!/usr/bin/env bash
# GPU check of the fused DCP attention kernel (fpa_lightning/ops/dcp/fused.py) in one command, from the repository
# root (it checked the candidate "DCP d3" before its adoption: benchmarks/KERNEL_LOG.md):
#   bash benchmarks/dcp_kernel_check.sh [results folder] [shapes]
#   1. the kernel's GPU tests (tests/ops/dcp/test_dcp_fused.py -m gpu: bf16 shapes with and without documents, r = 16 ..
#      128, 2x2048 and 1x4096 judged against float64 on the bf16-rounded inputs, clamps active, fp16/fp32, head
#      groups, NaN-poisoned buffers and determinism), in two processes so that Triton's compilation overlaps, and
#      in a third the Selective kernel's GPU tests (the DCP kernels are built from the @triton.jit steps of
#      fpa_lightning/ops/selective/kernels.py: a change there changes both kernels);
#   2. benchmarks/attention.py: dcp (SDPA over the materialised (B, 1, T, T) bias, the path the kernel replaces)
#      against dcp-fused, every time also as a ratio to SDPA-flash from the same process;
#   3. A/B of the kernel's launch choices around the defaults of "DCP d5" (benchmarks/KERNEL_LOG.md, which has the
#      2026-12-04 run that chose them), each in its own process (DCP_* variables are read by
#      fpa_lightning/ops/dcp/fused.py only; SEL_HEAD_GROUPS by the head-group rule it shares with Selective): the
#      triangular-matmul prefix (d4's), 2 stages in the key-major backward, 3 head groups, 64-query tiles in the
#      key-major backward, 3 stages in the query-major one.
# The steps are benchmarks/fused_kernel_check.sh's, which selective_kernel_check.sh runs as well.
set -uo pipefail
source benchmarks/fused_kernel_check.sh
fused_kernel_check "${1:-dcp_fused_results}" "${2:-8x2048,4x4096,2x8192,1x16384}" dcp \
    "tests/ops/dcp/test_dcp_fused.py tests/ops/selective/test_selective_fused.py" \
    "DCP_PREFIX=dot" "DCP_BWD_KV_STAGES=2" "SEL_HEAD_GROUPS=3" "DCP_BWD_BT=64" "DCP_BWD_Q_STAGES=3"
