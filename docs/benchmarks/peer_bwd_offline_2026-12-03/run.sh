#!/usr/bin/env bash
# The default builds (1 x 16384, H = 12, D = 64, r = 32, bf16 q/k/v, fp32 interaction inputs for DCP, dot prefix, no
# documents; the GPU's tiles) of both peers' forward and backward kernels, compiled offline for sm_90a with this
# machine's Triton, then their registers, spills and loop counts; and DCP's backward with its bias sums in plain tf32
# (the check script's A/B knob DCP_BIAS_PREC=tf32, "ab_tf32") and with the in-tile prefix as a scan (DCP_PREFIX=scan,
# "dot0"), or on 8 warps ("warps8"). From the repository root:
#   bash docs/benchmarks/peer_bwd_offline_2026-12-03/run.sh > docs/benchmarks/peer_bwd_offline_2026-12-03/loop_stats.txt
set -euo pipefail
export TRITON_DEFAULT_FP_FUSION=1  # the default of Triton <= 3.9, set so that 3.9 does not warn
here=docs/benchmarks/peer_bwd_offline_2026-12-03
out=$(mktemp -d)
python -c "import triton, torch; print('# triton', triton.__version__, '| torch', torch.__version__, '| sm_90a, offline')"
for build in dcp/fwd/gpu/bf16/fp32/tf32x3/seg0/dot1/D64/R32 dcp/bwd_q/gpu/bf16/fp32/tf32x3/seg0/dot1/D64/R32 \
             dcp/bwd_kv/gpu/bf16/fp32/tf32x3/seg0/dot1/D64/R32 sel/fwd/gpu/bf16/seg0/dot1/D64 \
             sel/bwd_q/gpu/bf16/seg0/dot1/D64 sel/bwd_kv/gpu/bf16/seg0/dot1/D64 \
             dcp/bwd_q/ab_tf32/bf16/fp32/tf32/seg0/dot1/D64/R32 dcp/bwd_kv/ab_tf32/bf16/fp32/tf32/seg0/dot1/D64/R32 \
             dcp/bwd_q/gpu/bf16/fp32/tf32x3/seg0/dot0/D64/R32 dcp/bwd_kv/gpu/bf16/fp32/tf32x3/seg0/dot0/D64/R32; do
    PYTHONPATH=. python docs/benchmarks/dcp_d3_1_offline_2026-12-03/offline_builds.py "$out" "$build" > /dev/null
done
PYTHONPATH=. python $here/warps_builds.py "$out"  # DCP's backward on 8 warps instead of 4 ("warps8")
python $here/loop_stats.py "$out"
rm -rf "$out"
