#!/usr/bin/env bash
# GPU call 3 of the decoding step's s2: the chosen defaults (step_attention on 128-slot blocks and 4 warps for every
# backend; the evicting store_token's scan in 4096-slot blocks on 4 warps) checked: the GPU tests of the step's ops and
# of graph decoding; benchmarks/decode.py graph mode at 1k-16k, batch 1 and 8, twice (every goal is a ratio within one
# run); at batch 8, s1's launch through the knobs (softmax on 8 warps, FPA on 64 slots) for comparison.
set -u
OUT=$1; export PYTHONUNBUFFERED=1; R=/tmp/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/machine.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $R/machine.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfEs tests/ops/test_decode_step.py \
  "tests/generation/test_decode_fused.py::test_gpu_graph_decoding_with_the_fused_op" > $R/tests.log 2>&1
echo "tests rc $? at $SECONDS s"; tail -n 1 $R/tests.log
bench() {  # NAME VARIANTS BATCHES [KNOB=VALUE ...]
  local name=$1 variants=$2 batches=$3; shift 3
  env "$@" timeout 120 python3 benchmarks/decode.py --variants $variants --modes graph --lengths 1024 4096 8192 16384 \
     --batches $batches --steps 256 --json $R/$name.json > $R/$name.log 2>&1
  echo "== $name ($*) rc $? at $SECONDS s"; grep "^graph " $R/$name.log | head -n 24
}
bench final_a "softmax fpa fpa-prune-10" "1 8" AB=1
bench final_b "softmax fpa fpa-prune-10" "1 8" AB=2
bench s1launch_softmax_b8 softmax 8 STEP_WARPS=8
bench s1launch_fpa_b8 "fpa fpa-prune-10" 8 STEP_BLOCK_S=64 STEP_SCAN_BLOCK=1024 STEP_STORE_WARPS=1
cd /tmp && tar czf $OUT/call3.tgz r
