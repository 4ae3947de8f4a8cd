#!/usr/bin/env bash
# GPU call for the Selective s3 candidate (the backward kernels take a group's heads two at a time: F's tile and the
# selection's suffix and share made once per pair), from the repository root with .whl and .snap carried (.snap =
# `git archive a9d3f43`: Selective s2, the adopted kernels):
# 1. the GPU tests of the Selective op on the candidate's default (pairs, 4 warps);
# 2. benchmarks/attention.py --methods selective-fused at the four shapes, one process each: s2 (.snap), the
#    candidate, its RELOAD variant, the candidate on 8 warps in both backward kernels, the candidate's tree with
#    pairs off (s2's kernels as refactored), s2 again. Every ratio is to SDPA-flash in the same process.
set -u
OUT=$1; ROOT=$PWD; export PYTHONUNBUFFERED=1; R=/tmp/r; rm -rf $R; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/machine.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $R/machine.txt
timeout 170 python3 -m pytest -q -p no:cacheprovider -rfEs -m gpu tests/ops/test_selective_fused.py > $R/tests.log 2>&1
echo "tests rc $? at $SECONDS s"; tail -n 2 $R/tests.log
t() {  # TREE NAME [KNOB=VALUE ...]
  local tree=$1 name=$2; shift 2
  (cd $tree && env "$@" PYTHONPATH=/tmp/site:. timeout 60 python3 benchmarks/attention.py --methods selective-fused \
     > $R/$name.log 2>&1); echo "== $name ($*) rc $? at $SECONDS s"; grep "^| [0-9]" $R/$name.log
}
t $ROOT/.snap s2_a AB=1
t $ROOT pairs AB=1
t $ROOT pairs_reload SEL_RELOAD=1
t $ROOT pairs_w8 SEL_BWD_KV_WARPS=8 SEL_BWD_Q_WARPS=8
t $ROOT singles SEL_PAIRS=0
t $ROOT/.snap s2_b AB=2
cd /tmp && tar czf $OUT/call.tgz r
