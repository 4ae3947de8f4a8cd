#!/usr/bin/env bash
# GPU check of the fused DCP attention kernel (fpa_lightning/ops/dcp/fused.py) in one command, from the repository
# root (it checked the candidate "DCP d3" before its adoption: benchmarks/KERNEL_LOG.md):
#   bash benchmarks/dcp_kernel_check.sh [results folder] [shapes]
#   1. the kernel's GPU tests (tests/ops/test_dcp_fused.py -m gpu: bf16 shapes with and without documents, r = 16 ..
#      128, 2x2048 and 1x4096 judged against float64 on the bf16-rounded inputs, clamps active, fp16/fp32, head
#      groups, NaN-poisoned buffers and determinism), in two processes so that Triton's compilation overlaps, and
#      in a third the Selective kernel's GPU tests (the patch moves two of its kernel steps into shared @triton.jit
#      helpers, _online_softmax and _flash_kv_step, that both kernels call);
#   2. benchmarks/attention.py: dcp (SDPA over the materialised (B, 1, T, T) bias, the path the kernel replaces)
#      against dcp-fused, every time also as a ratio to SDPA-flash from the same process;
#   3. A/B of the kernel's untuned choices, each in its own process (DCP_* variables are read by
#      fpa_lightning/ops/dcp/fused.py only; SEL_HEAD_GROUPS by the head-group rule it shares with Selective): the
#      key-major backward on 64-query tiles, the in-tile prefix as a scan, the bias path's in-tile sums in plain
#      tf32 (the default is tf32x3, near fp32; tf32 is faster and failed d2's precision), one head group and one
#      group per head.
set -uo pipefail
out=${1:-dcp_fused_results}
shapes=${2:-8x2048,4x4096,2x8192,1x16384}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
status=0
limit=${TEST_LIMIT_S:-300}
timeout "$limit" python3 -m pytest -q -m gpu -p no:cacheprovider tests/ops/test_dcp_fused.py -k "bf16_shapes" \
    > "$out/tests_shapes.log" 2>&1 &
p1=$!
timeout "$limit" python3 -m pytest -q -m gpu -p no:cacheprovider tests/ops/test_dcp_fused.py -k "not bf16_shapes" \
    > "$out/tests_rest.log" 2>&1 &
p2=$!
timeout "$limit" python3 -m pytest -q -m gpu -p no:cacheprovider tests/ops/test_selective_fused.py \
    > "$out/tests_selective.log" 2>&1 &
p3=$!
wait $p1 || status=1
wait $p2 || status=1
wait $p3 || status=1
tail -n 3 "$out"/tests_*.log
echo "tests took ${SECONDS} s (status $status)"
python3 benchmarks/attention.py --shapes "$shapes" --methods dcp,dcp-fused 2>&1 | tee "$out/timing.log"
for knobs in "DCP_BWD_BT=64" "DCP_PREFIX=scan" "DCP_BIAS_PREC=tf32" "SEL_HEAD_GROUPS=1" "SEL_HEAD_GROUPS=12"; do
    echo "== $knobs" | tee -a "$out/ab.log"
    env $knobs python3 benchmarks/attention.py --shapes "$shapes" --methods dcp-fused 2>&1 \
        | grep -E '^\| [0-9]|FAILED' | tee -a "$out/ab.log"
done
exit $status
