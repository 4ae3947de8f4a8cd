#!/usr/bin/env bash
# session 10, call 3 (carry .whl .snap .gpu data/corpus; .snap = git archive 9264a03): 1. the candidate
# fpa_piece_skip.patch's GPU tests (patched copy) and HEAD's fused-session tests beside the study FPA's training;
# 2. cache_prune --real-eviction on HEAD and on the candidate, default pieces (8192) and 2048, every timed() logged
# (the estimate now times the task's hooked path). One archive back.
set -u
OUT=$1; ROOT=$PWD; export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:.; R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/machine.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $R/machine.txt
CAND=/tmp/cand; cp -r $ROOT/.snap $CAND; (cd $CAND && patch -p1 -s < benchmarks/candidates/fpa_piece_skip.patch) || exit 4
grep -c "a block of free slots adds nothing" $CAND/fpa_lightning/ops/fpa_piece/kernels.py
(cd $CAND && timeout 300 python3 -m pytest -q -p no:cacheprovider tests/ops/test_fpa_piece.py tests/generation/test_decode_fused.py) > $R/cand_tests.log 2>&1 &
(cd $ROOT/.snap && timeout 300 python3 -m pytest -q -p no:cacheprovider tests/generation/test_decode_fused.py tests/generation/test_eviction.py) > $R/head_tests.log 2>&1 &
S=/tmp/study; cd $ROOT/.snap
CORPUS=$ROOT/data/corpus RESULTS=$S TOKENIZER=$ROOT/.whl/tokenizer.json timeout 330 bash benchmarks/lm_study.sh train fpa > $R/train.log 2>&1
wait; echo "tests and training done at ${SECONDS} s"; tail -qn 1 $R/*_tests.log; tail -n 1 $R/train.log
grep -h "FAILED\|Error" $R/*_tests.log | head -20
ck=$(ls $S/runs/study_fpa/version_*/checkpoints/last.ckpt | tail -n 1) || exit 3
ev() {  # TREE NAME [--piece-tokens N]
  local tree=$1 name=$2; shift 2
  (cd $tree && timeout 100 python3 $ROOT/.gpu/timed_eval.py --task cache_prune --ckpt "$ck" --data $ROOT/data/corpus/pg19 \
    --real-eviction --thresholds -10 --lengths 2048 8192 --max-docs 4 --passkey-lengths --device cuda --precision bf16 \
    --tokenizer $ROOT/.whl/tokenizer.json --out $R/$name "$@" > $R/$name.log 2>&1); echo "$name rc $? at $SECONDS s"
  grep -h "took\|estimated" $R/$name.log | tail -n 1; rm -f $R/$name/*.png
  python3 -c "
import json; r=json.load(open('$R/$name/cache_prune.json'))
for e in r['results']['lengths']:
  x=e['models'][0]['rules'][0].get('real_eviction', {}); print('$name', e['length'], x.get('kept_fraction'), round(x.get('tokens_per_second')), x.get('max_abs_difference_from_simulation'), x.get('attention_impl'), x.get('piece_tokens'))"
}
ev $ROOT/.snap head; ev $CAND cand; ev $ROOT/.snap head_2048 --piece-tokens 2048; ev $CAND cand_2048 --piece-tokens 2048
ev $ROOT/.snap head_again
cd /tmp && tar czf $OUT/call3.tgz r
