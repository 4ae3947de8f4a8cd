#!/usr/bin/env bash
# call 4 (2026-12-03): what the device budget left for the decode_attention candidate after refused starts:
# the fixed generation GPU test again, then decode.py in graph mode (no compile) at 8k for softmax and fpa,
# --decode-attention naive (base) then auto (candidate), consecutive processes.
set -u
OUT=$1; ROOT=$PWD
export PYTHONUNBUFFERED=1
R=$OUT/res/decode_check; mkdir -p $R
cd $ROOT/.snap_dec && export PYTHONPATH=/tmp/site:.
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/generation/test_decode_fused.py > $R/tests_generation_rerun.log 2>&1; echo "rerun rc $? at ${SECONDS} s"; tail -n 2 $R/tests_generation_rerun.log
for impl in naive auto; do
  timeout 80 python3 benchmarks/decode.py --variants softmax fpa --lengths 8192 --batches 1 --modes graph \
      --decode-attention $impl --json $R/decode_$impl.json > $R/decode_$impl.log 2>&1
  echo "decode.py --decode-attention $impl rc $? at ${SECONDS} s"
done
grep -h '^{' $R/decode_naive.log $R/decode_auto.log | python3 -c "
import json, sys
rows = [json.loads(l) for l in sys.stdin]
for r in rows: print(r.get('decode_attention'), r['variant'], r['length'], r.get('mode'), r.get('ms_per_step'))
" | tee $R/summary.txt
cd $OUT && tar czf res.tgz res && rm -rf res
