#!/usr/bin/env bash
# session 11, call 1b (call 1a ran without the wheels: no training; carry .whl .snap .snap_old .gpu data/corpus;
# .snap = git archive c87f465, .snap_old = f377d76; .gpu/s11 held timed_eval.py and evict_rows.py):
# 1. the study FPA's training;
# 2. cache_prune --real-eviction on HEAD (documents batched per piece) and on f377d76 (one per call), every timed()
#    logged: speed per length and the estimate against the real time; HEAD again;
# 3. evict_rows.py: per-call cost of 2048-token documents for 1, 2, 4 rows, and of an 8192 one, with profiles;
# 4. the piece kernel's launch A/B (benchmarks/piece_attention.py, one process per setting). One archive back.
set -u
OUT=$1; ROOT=$PWD; export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:.; R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/machine.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $R/machine.txt
S=/tmp/study; cd $ROOT/.snap
CORPUS=$ROOT/data/corpus RESULTS=$S TOKENIZER=$ROOT/.whl/tokenizer.json timeout 330 bash benchmarks/lm_study.sh train fpa > $R/train.log 2>&1
echo "training done at ${SECONDS} s"; tail -qn 1 $R/train.log
ck=$(ls $S/runs/study_fpa/version_*/checkpoints/last.ckpt | tail -n 1); [ -f "$ck" ] || { cd /tmp && tar czf $OUT/call1.tgz r; exit 3; }
ev() {  # TREE NAME [more eval args]
  local tree=$1 name=$2; shift 2
  (cd $tree && timeout 100 python3 $ROOT/.gpu/s11/timed_eval.py --task cache_prune --ckpt "$ck" --data $ROOT/data/corpus/pg19 \
    --real-eviction --thresholds -10 --lengths 2048 8192 --max-docs 4 --passkey-lengths --device cuda --precision bf16 \
    --tokenizer $ROOT/.whl/tokenizer.json --out $R/$name "$@" > $R/$name.log 2>&1); echo "$name rc $? at $SECONDS s"
  grep -h "took\|estimated" $R/$name.log | tail -n 2; rm -f $R/$name/*.png
  python3 -c "
import json; r=json.load(open('$R/$name/cache_prune.json'))
for e in r['results']['lengths']:
  x=e['models'][0]['rules'][0].get('real_eviction', {}); print('$name', e['length'], x.get('kept_fraction'), round(x.get('tokens_per_second')), x.get('max_abs_difference_from_simulation'), x.get('attention_impl'), x.get('piece_tokens'), x.get('documents_per_pass'))"
}
ev $ROOT/.snap head; ev $ROOT/.snap_old old; ev $ROOT/.snap head_8docs --max-docs 8
PIECE_BLOCK_N=128 ev $ROOT/.snap head_bn128
timeout 90 python3 $ROOT/.gpu/s11/evict_rows.py "$ck" 2048 1 2 4 > $R/rows_2048.log 2>&1; echo "rows 2048 rc $? at $SECONDS s"
timeout 60 python3 $ROOT/.gpu/s11/evict_rows.py "$ck" 8192 1 > $R/rows_8192.log 2>&1; echo "rows 8192 rc $? at $SECONDS s"
grep -h "per call\|kernels," $R/rows_*.log
for knobs in "PIECE_BLOCK_M=64" "PIECE_BLOCK_N=128" "PIECE_BLOCK_N=128 PIECE_STAGES=3" "PIECE_BLOCK_N=128 PIECE_BLOCK_M=128 PIECE_WARPS=8" "PIECE_BLOCK_M=64" "PIECE_BLOCK_N=128"; do
  [ $SECONDS -gt 540 ] && break
  echo "== $knobs" >> $R/piece_ab.log
  env $knobs timeout 60 python3 benchmarks/piece_attention.py --pieces 2048,8192 --past 1,8192 >> $R/piece_ab.log 2>&1
done
echo "piece A/B done at $SECONDS s"
cd /tmp && tar czf $OUT/call1.tgz r
