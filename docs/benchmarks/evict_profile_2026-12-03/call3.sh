#!/usr/bin/env bash
# #25 in one call (from the repo root; carry .whl .snap .gpu data/corpus; .snap = git archive HEAD):
#   1. GPU tests (DCP, Selective, generation + decode op) beside the training of the study's FPA (configs/study/fpa.yaml);
#   2. cache_prune --real-eviction on that checkpoint, alone on the GPU (its JSON has the real path's tokens/s);
#   3. per-kernel profile of SDPA-flash, DCP and Selective fused forward+backward.
set -u
OUT=$1; ROOT=$PWD; export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:.
cd $ROOT/.snap
pt=(timeout 290 python3 -m pytest -q -m gpu -p no:cacheprovider)
"${pt[@]}" tests/ops/test_dcp_fused.py > $OUT/tests_dcp.log 2>&1 &
"${pt[@]}" tests/ops/test_selective_fused.py > $OUT/tests_selective.log 2>&1 &
"${pt[@]}" tests/generation tests/ops/test_decode_attention.py > $OUT/tests_decode.log 2>&1 &
S=/tmp/study
CORPUS=$ROOT/data/corpus RESULTS=$S TOKENIZER=$ROOT/.whl/tokenizer.json timeout 400 bash benchmarks/lm_study.sh train fpa
cp -r $S/logs $S/status.tsv $OUT/ 2>/dev/null
wait; echo "tests and training done at ${SECONDS} s"; tail -n 2 $OUT/tests_*.log
ck=$(ls $S/runs/study_fpa/version_*/checkpoints/last.ckpt | tail -n 1)
cp $S/runs/study_fpa/version_*/hparams.yaml $OUT/ 2>/dev/null
timeout 150 python3 eval.py --task cache_prune --ckpt "$ck" --data $ROOT/data/corpus/pg19 --real-eviction \
  --thresholds -10 --lengths 2048 8192 --max-docs 4 --passkey-lengths --device cuda --precision bf16 \
  --tokenizer $ROOT/.whl/tokenizer.json --out $OUT/evict > $OUT/evict.log 2>&1; echo "eval rc $? at ${SECONDS} s"
tail -n 6 $OUT/evict.log
python3 -c "
import json,glob
r=json.load(open(glob.glob('$OUT/evict/*.json')[0]))
for e in r['results']['lengths']:
  for row in e['models'][0]['rules']:
    x=row['real_eviction']; print(e['length'], e['documents'], row['kept_fraction'], x['kept_fraction'], x['tokens'], round(x['seconds'],2), round(x['tokens_per_second']), x['attention_impl'], x['max_abs_difference_from_simulation'])
" 2>&1 | tee $OUT/evict_speed.txt
timeout 120 python3 benchmarks/attention.py --profile --shapes 8x2048,1x16384 --methods sdpa-flash,dcp-fused,selective-fused \
  > $OUT/profile.log 2>&1; echo "profile rc $? at ${SECONDS} s"; cat $OUT/profile.log | cut -c1-600
