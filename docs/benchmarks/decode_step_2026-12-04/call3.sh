#!/usr/bin/env bash
# GPU call 3 of the fused decoding step (.whl carried): call 2's profile had no column for store_token's kernels (the
# "cache write" group was missing from the table's GROUPS, so they fell out of the totals); here
# 1. the per-kernel-group profile at 8k, batch 1, again;
# 2. launch knobs of the step's kernels, softmax and FPA at 8k, batch 1 (one process per setting, default twice);
# 3. the compiled step (then captured) at 8k, batch 1, softmax and FPA. One archive back.
set -u
OUT=$1; export PYTHONUNBUFFERED=1; R=/tmp/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/machine.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $R/machine.txt
timeout 90 python3 benchmarks/decode.py --variants softmax fpa fpa-prune-10 --modes graph --profile --lengths 8192 \
  --batches 1 --json $R/profile_after.json > $R/profile_after.log 2>&1; echo "profile rc $? at $SECONDS s"
for knobs in "DEFAULT=1" "STEP_STORE_WARPS=4" "STEP_WARPS=4" "STEP_BLOCK_S=32" "STEP_BLOCK_S=128" "DEFAULT=2"; do
  echo "== $knobs" >> $R/knobs.log
  env $knobs timeout 60 python3 benchmarks/decode.py --variants softmax fpa --modes graph --lengths 8192 --batches 1 \
    --steps 256 >> $R/knobs.log 2>&1
done
echo "knobs done at $SECONDS s"; grep -E "^==|^graph " $R/knobs.log
timeout 240 python3 benchmarks/decode.py --variants softmax fpa --modes graph --lengths 8192 --batches 1 \
  --compile-lengths 8192 --json $R/compiled.json > $R/compiled.log 2>&1; echo "compiled rc $? at $SECONDS s"
grep -A6 "^mode" $R/compiled.log
cd /tmp && tar czf $OUT/call3.tgz r
