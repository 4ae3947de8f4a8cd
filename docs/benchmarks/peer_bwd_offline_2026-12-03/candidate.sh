#!/usr/bin/env bash
# The candidate benchmarks/candidates/dcp_tf32x2.patch compiled offline at DCP's default builds, for comparison with
# loop_stats.txt (the kernels before it). The patch was adopted as "DCP d4" (benchmarks/KERNEL_LOG.md) and deleted;
# to run this again, check out f54a20a (where it waited). From the repository root:
#   bash docs/benchmarks/peer_bwd_offline_2026-12-03/candidate.sh > docs/benchmarks/peer_bwd_offline_2026-12-03/candidate_tf32x2.txt
set -euo pipefail
export TRITON_DEFAULT_FP_FUSION=1
here=$PWD/docs/benchmarks/peer_bwd_offline_2026-12-03
tree=$(bash benchmarks/candidates/ab.sh tree benchmarks/candidates/dcp_tf32x2.patch)
out=$(mktemp -d)
python -c "import triton, torch; print('# triton', triton.__version__, '| torch', torch.__version__, '| sm_90a, offline')"
(cd "$tree" && PYTHONPATH=. python "$here/candidate_builds.py" "$out")
python "$here/loop_stats.py" "$out"
rm -rf "$tree" "$out"
