#!/usr/bin/env bash
# GPU call 4 (.whl carried): step_attention's launch per kind after call 3's A/B (no FPA state: 128-slot blocks on 8
# warps; FPA: 64 on 4), checked at every length: the GPU tests of the step's ops and of graph decoding at real
# sizes; decode.py graph mode at 1k-16k, batch 1 and 8, with the new defaults, then call 2's launch (64 slots, 8 warps).
set -u
OUT=$1; export PYTHONUNBUFFERED=1; R=/tmp/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/machine.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $R/machine.txt
timeout 120 python3 -m pytest -q -p no:cacheprovider -rfEs tests/ops/test_decode_step.py \
  "tests/generation/test_decode_fused.py::test_gpu_graph_decoding_with_the_fused_op" > $R/tests.log 2>&1
echo "tests rc $? at $SECONDS s"; tail -n 2 $R/tests.log
run() { local name=$1; shift
  env "$@" timeout 100 python3 benchmarks/decode.py --variants softmax fpa fpa-prune-10 --modes graph \
    --lengths 1024 4096 8192 16384 --batches 1 8 --json $R/$name.json > $R/$name.log 2>&1; echo "$name rc $? at $SECONDS s"
  grep -A24 "^mode" $R/$name.log | grep "graph" | grep -v "B=" ; }
run tuned DEFAULT=1
run call2_launch STEP_BLOCK_S=64 STEP_WARPS=8
cd /tmp && tar czf $OUT/call4.tgz r
