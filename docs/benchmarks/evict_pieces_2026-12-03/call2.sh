#!/usr/bin/env bash
# session 10, call 2 (carry .whl .snap .snap_old .gpu data/corpus; .snap = HEAD with the FPA piece kernel, .snap_old =
# 80cacc6, the einsum piece path): 1. GPU tests of the piece kernel and of generation (all of tests/generation on
# CUDA) beside the study FPA's training; 2. cache_prune --real-eviction new vs old, every timed() logged;
# 3. profile of the new path. Everything goes back in one archive.
set -u
OUT=$1; ROOT=$PWD; export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:.; R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/machine.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $R/machine.txt
cd $ROOT/.snap
pt=(timeout 320 python3 -m pytest -q -p no:cacheprovider)
"${pt[@]}" tests/ops/test_fpa_piece.py tests/ops/test_decode_attention.py > $R/tests_ops.log 2>&1 &
"${pt[@]}" tests/generation > $R/tests_generation.log 2>&1 &
S=/tmp/study
CORPUS=$ROOT/data/corpus RESULTS=$S TOKENIZER=$ROOT/.whl/tokenizer.json timeout 330 bash benchmarks/lm_study.sh train fpa > $R/train.log 2>&1
wait; echo "tests and training done at ${SECONDS} s"; tail -qn 1 $R/tests_*.log; tail -n 1 $R/train.log
grep -h "FAILED\|Error" $R/tests_*.log | head -20
ck=$(ls $S/runs/study_fpa/version_*/checkpoints/last.ckpt | tail -n 1) || exit 3
ev() {  # TREE NAME BLOCK_ROWS
  (cd $ROOT/$1 && timeout 100 python3 $ROOT/.gpu/timed_eval.py --task cache_prune --ckpt "$ck" --data $ROOT/data/corpus/pg19 \
    --real-eviction --thresholds -10 --lengths 2048 8192 --max-docs 4 --passkey-lengths --device cuda --precision bf16 \
    --block-rows $3 --tokenizer $ROOT/.whl/tokenizer.json --out $R/$2 > $R/$2.log 2>&1); echo "$2 rc $? at $SECONDS s"
  grep -h "took\|estimated" $R/$2.log | tail -n 1; rm -f $R/$2/*.png
  python3 -c "
import json; r=json.load(open('$R/$2/cache_prune.json'))
for e in r['results']['lengths']:
  x=e['models'][0]['rules'][0].get('real_eviction', {}); print('$2', e['length'], x.get('kept_fraction'), round(x.get('tokens_per_second')), x.get('max_abs_difference_from_simulation'), x.get('attention_impl'))"
}
ev .snap new_512 512; ev .snap new_2048 2048; ev .snap_old old_2048 2048; ev .snap new_8192 8192
# .gpu/evict_profile.py then = docs/benchmarks/evict_profile_2026-12-03/evict_profile.py with the pieces 512 2048 8192
timeout 80 python3 $ROOT/.gpu/evict_profile.py "$ck" > $R/evict_profile.log 2>&1; echo "profile rc $? at $SECONDS s"
head -c 2500 $R/evict_profile.log
cd /tmp && tar czf $OUT/call2.tgz r
