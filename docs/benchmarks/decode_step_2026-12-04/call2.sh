#!/usr/bin/env bash
# GPU call 2 of the fused decoding step (ops/decode_step), from the repository root with .whl and .snap carried
# (.snap = `git archive f8f9ee6`, the code before the change). Call 1 stopped at the kernels' first GPU compile
# (module globals FREE and FAR not constexpr: the interpreter had accepted them; call1_tests.log has the error and
# the failures it caused); call 2 is this script after the fix:
# 1. the GPU tests of the step's ops, the decode op, the fused sessions and generation (bf16 at real sizes);
# 2. benchmarks/decode.py graph mode, batch 1 and 8, 1k-16k: after (working tree), before (.snap), after again;
# 3. the per-kernel-group profile at 8k, batch 1, after and before;
# 4. the compiled step (then captured) at 8k, batch 1, softmax and FPA, after. One archive back.
set -u
OUT=$1; ROOT=$PWD; export PYTHONUNBUFFERED=1; R=/tmp/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/machine.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $R/machine.txt
timeout 300 python3 -m pytest -q -p no:cacheprovider -rfEs tests/ops/test_decode_step.py tests/ops/test_decode_attention.py \
  tests/generation/test_decode_fused.py tests/generation/test_generation_gpu.py tests/generation/test_decode.py \
  > $R/tests.log 2>&1; echo "tests rc $? at $SECONDS s"; tail -n 3 $R/tests.log
bench() {  # TREE NAME [args]
  local tree=$1 name=$2; shift 2
  (cd $tree && PYTHONPATH=/tmp/site:. timeout ${LIMIT:-150} python3 benchmarks/decode.py --variants softmax fpa fpa-prune-10 \
     --modes graph "$@" --json $R/$name.json > $R/$name.log 2>&1); echo "$name rc $? at $SECONDS s"
}
bench $ROOT after1 --lengths 1024 4096 8192 16384 --batches 1 8
bench $ROOT/.snap before --lengths 1024 4096 8192 16384 --batches 1 8
bench $ROOT after2 --lengths 1024 4096 8192 16384 --batches 1 8
bench $ROOT profile_after --profile --lengths 8192 --batches 1
bench $ROOT/.snap profile_before --profile --lengths 8192 --batches 1
[ $SECONDS -lt 380 ] && LIMIT=200 bench $ROOT compiled_after --variants softmax fpa --lengths 8192 --batches 1 --compile-lengths 8192
for f in after1 before after2; do echo "== $f"; grep -A14 "^mode" $R/$f.log | head -n 26; done
cd /tmp && tar czf $OUT/call2.tgz r
