#!/usr/bin/env bash
# call 2 (2026-12-03): the MQAR paper regime's 2-layer group at T = 256, rows fpa and sdpa (15 seeds, 3000 steps),
# each backend its own eval.py process and output folder so that a row that finishes is kept; beside them (not a
# timing) the decode_attention candidate's GPU tests on the patched snapshot .snap_dec.
set -u
OUT=$1; ROOT=$PWD
export PYTHONUNBUFFERED=1
R=$OUT/res; mkdir -p $R/decode_check
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/machine.txt; python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $R/machine.txt
G="mqar, paper regime, 2 layers, 32 pairs, T=256"
cd $ROOT/.snap
for b in fpa sdpa; do
  w=2; [ $b = fpa ] && w=1   # fpa trains its 15 seeds as one vmapped model; sdpa loops over seeds (2 processes)
  PYTHONPATH=/tmp/site:. timeout 440 python3 eval.py --task probes --device cuda --workers $w --groups "$G" --backends $b --out $R/mqar_$b > $R/mqar_$b.log 2>&1 &
done
cd $ROOT/.snap_dec
PYTHONPATH=/tmp/site:. timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ops/test_decode_attention.py > $R/decode_check/tests_op.log 2>&1 &
PYTHONPATH=/tmp/site:. timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/generation/test_decode_fused.py tests/generation/test_generation_gpu.py > $R/decode_check/tests_generation.log 2>&1 &
wait
echo "done ${SECONDS} s"; grep -h "seeds succeed" $R/mqar_*.log; tail -qn 2 $R/decode_check/tests_*.log
cd $OUT && tar czf res.tgz res && rm -rf res
