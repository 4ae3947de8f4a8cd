#!/usr/bin/env bash
# GPU call 2 of the decoding step's s2, after call 1 (the v load before the scores slowed softmax, which s2 does not
# otherwise change; FPA's attention on 128-slot blocks and 4 warps and the evicting scan in one 4096-slot block on 4
# warps were faster). s2 now keeps s1's order of the k and v loads and moves only FPA's loads ahead of its stores.
# Same carry (.whl, .snap = a9d3f43, s1). One process per row, graph mode, batch 1, 1k-16k:
# s1 default; s1 with FPA on 128/4; s2 default; s2 with 128/4; s2 with 128/4 and the 4096-slot scan on 4 warps;
# softmax on 128/4 (s2); then s1 default and the last s2 setting again; the GPU tests of s2; the profile at 8k.
set -u
OUT=$1; ROOT=$PWD; export PYTHONUNBUFFERED=1; R=/tmp/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:.
bench() {  # TREE NAME VARIANTS [KNOB=VALUE ...]
  local tree=$1 name=$2 variants=$3; shift 3
  (cd $tree && env "$@" PYTHONPATH=/tmp/site:. timeout 100 python3 benchmarks/decode.py --variants $variants \
     --modes graph --lengths ${LENGTHS:-1024 4096 8192 16384} --batches 1 --steps 256 $EXTRA --json $R/$name.json \
     > $R/$name.log 2>&1)
  echo "== $name ($*) rc $? at $SECONDS s"; grep "^graph " $R/$name.log | head -n 12
}
EXTRA=""
ALL3="softmax fpa fpa-prune-10"; FPA2="fpa fpa-prune-10"
bench $ROOT/.snap s1_a "$ALL3" AB=1
bench $ROOT/.snap s1_fpa128w4 "$FPA2" STEP_BLOCK_S=128 STEP_WARPS=4
bench $ROOT s2 "$ALL3" AB=1
bench $ROOT s2_fpa128w4 "$FPA2" STEP_BLOCK_S=128 STEP_WARPS=4
bench $ROOT s2_fpa128w4_scan "$FPA2" STEP_BLOCK_S=128 STEP_WARPS=4 STEP_SCAN_BLOCK=4096 STEP_STORE_WARPS=4
bench $ROOT softmax128w4 softmax STEP_BLOCK_S=128 STEP_WARPS=4
bench $ROOT/.snap s1_b "$ALL3" AB=2
bench $ROOT s2_fpa128w4_scan_b "$FPA2" STEP_BLOCK_S=128 STEP_WARPS=4 STEP_SCAN_BLOCK=4096 STEP_STORE_WARPS=4
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfEs tests/ops/test_decode_step.py \
  "tests/generation/test_decode_fused.py::test_gpu_graph_decoding_with_the_fused_op" > $R/tests.log 2>&1
echo "tests rc $? at $SECONDS s"; tail -n 1 $R/tests.log
EXTRA=--profile LENGTHS=8192 bench $ROOT profile_s2_fpa128w4_scan "$ALL3" STEP_BLOCK_S=128 STEP_WARPS=4 STEP_SCAN_BLOCK=4096 STEP_STORE_WARPS=4
grep -A6 "^profile per step" $R/profile_s2_fpa128w4_scan.log
cd /tmp && tar czf $OUT/call2.tgz r
