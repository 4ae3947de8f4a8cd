#!/usr/bin/env bash
# GPU call 1 of the decoding step's s2 (ops/decode_step: every load before the stores in store_token and in the
# attention's block loop; path minima written back only where they fall), from the repository root with .whl and
# .snap carried (.snap = `git archive a9d3f43`, s1):
# 1. the GPU tests of the step's ops and of graph decoding (bf16, real sizes) on s2;
# 2. benchmarks/decode.py graph mode, batch 1, 1k-16k: s2, s1, s2 again (consecutive processes);
# 3. launch settings on s2, one process each (A/B-only knobs): FPA's attention blocks and warps, the split size,
#    and the evicting scan in one 4096-slot block (benchmarks/candidates/decode_step_launch.sh's settings).
set -u
OUT=$1; ROOT=$PWD; export PYTHONUNBUFFERED=1; R=/tmp/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/machine.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $R/machine.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfEs tests/ops/test_decode_step.py \
  "tests/generation/test_decode_fused.py::test_gpu_graph_decoding_with_the_fused_op" > $R/tests.log 2>&1
echo "tests rc $? at $SECONDS s"; tail -n 2 $R/tests.log
bench() {  # TREE NAME VARIANTS LENGTHS [KNOB=VALUE ...]
  local tree=$1 name=$2 variants=$3 lengths=$4; shift 4
  (cd $tree && env "$@" PYTHONPATH=/tmp/site:. timeout 100 python3 benchmarks/decode.py --variants $variants \
     --modes graph --lengths $lengths --batches 1 --steps 256 --json $R/$name.json > $R/$name.log 2>&1)
  echo "== $name ($*) rc $? at $SECONDS s"; grep "^graph " $R/$name.log | head -n 12
}
ALL="1024 4096 8192 16384"
bench $ROOT s2_a "softmax fpa fpa-prune-10" "$ALL" AB=1
bench $ROOT/.snap s1 "softmax fpa fpa-prune-10" "$ALL" AB=1
bench $ROOT s2_b "softmax fpa fpa-prune-10" "$ALL" AB=1
bench $ROOT fpa_b128_w4 fpa "8192 16384" STEP_BLOCK_S=128 STEP_WARPS=4
bench $ROOT fpa_b128_w8 fpa "8192 16384" STEP_BLOCK_S=128 STEP_WARPS=8
bench $ROOT fpa_chunk128 "softmax fpa" "8192 16384" STEP_CHUNK=128
bench $ROOT fpa_chunk512 "softmax fpa" "8192 16384" STEP_CHUNK=512
bench $ROOT evict_scan4096 fpa-prune-10 "4096 16384" STEP_SCAN_BLOCK=4096
bench $ROOT evict_scan4096_w4 fpa-prune-10 "4096 16384" STEP_SCAN_BLOCK=4096 STEP_STORE_WARPS=4
cd /tmp && tar czf $OUT/call1.tgz r
