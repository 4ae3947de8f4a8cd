#!/usr/bin/env bash
# session 10, call 1 (carry .whl .snap .snap_old .gpu data/corpus): 1. the DCP tf32x2 candidate's GPU tests (patched
# copy) beside the study FPA's training; 2. cache_prune --real-eviction, old tree (839e132) vs HEAD, alone;
# 3. per-op profile of HEAD's piece path; 4. the candidate's timing A/B (dcp-fused, base vs patched).
set -u
OUT=$1; ROOT=$PWD; export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/machine.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $OUT/machine.txt
cd $ROOT/.snap
CAND=$(bash benchmarks/candidates/ab.sh tree benchmarks/candidates/dcp_tf32x2.patch)
grep -c tf32x2 $CAND/fpa_lightning/ops/selective/kernels.py > $OUT/patched_count.txt
pt() { (cd $CAND && PYTHONPATH=/tmp/site:. timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider "$@"); }
pt tests/ops/test_dcp_fused.py -k bf16_shapes > $OUT/cand_dcp_shapes.log 2>&1 &
pt tests/ops/test_dcp_fused.py -k "not bf16_shapes" > $OUT/cand_dcp_rest.log 2>&1 &
pt tests/ops/test_selective_fused.py > $OUT/cand_selective.log 2>&1 &
S=/tmp/study
CORPUS=$ROOT/data/corpus RESULTS=$S TOKENIZER=$ROOT/.whl/tokenizer.json timeout 330 bash benchmarks/lm_study.sh train fpa > $OUT/train.log 2>&1
wait; echo "tests and training done at ${SECONDS} s"; tail -qn 1 $OUT/cand_*.log; tail -n 2 $OUT/train.log
ck=$(ls $S/runs/study_fpa/version_*/checkpoints/last.ckpt | tail -n 1) || exit 3
ev() {  # TREE NAME BLOCK_ROWS
  (cd $ROOT/$1 && timeout 100 python3 eval.py --task cache_prune --ckpt "$ck" --data $ROOT/data/corpus/pg19 --real-eviction \
    --thresholds -10 --lengths 2048 8192 --max-docs 4 --passkey-lengths --device cuda --precision bf16 --block-rows $3 \
    --tokenizer $ROOT/.whl/tokenizer.json --out $OUT/$2 > $OUT/$2.log 2>&1); echo "$2 rc $? at $SECONDS s"
  grep -h "took\|estimated" $OUT/$2.log | tail -n 2; rm -f $OUT/$2/*.png
  python3 -c "
import json; r=json.load(open('$OUT/$2/cache_prune.json'))
for e in r['results']['lengths']:
  x=e['models'][0]['rules'][0].get('real_eviction', {}); print('$2', e['length'], x.get('kept_fraction'), x.get('tokens_per_second'), x.get('max_abs_difference_from_simulation'))"
}
ev .snap new_512 512; ev .snap_old old_512 512; ev .snap new_2048 2048
timeout 80 python3 $ROOT/.gpu/evict_profile.py "$ck" > $OUT/evict_profile.log 2>&1; echo "profile rc $? at $SECONDS s"
head -c 3000 $OUT/evict_profile.log
if grep -q " passed" $OUT/cand_dcp_shapes.log && ! grep -q "failed\|error" $OUT/cand_*.log; then
  timeout 100 python3 benchmarks/attention.py --methods dcp-fused > $OUT/base_timing.log 2>&1; echo "base timing rc $? at $SECONDS s"
  (cd $CAND && PYTHONPATH=/tmp/site:. timeout 100 python3 benchmarks/attention.py --methods dcp-fused) > $OUT/cand_timing.log 2>&1; echo "cand timing rc $? at $SECONDS s"
  bash benchmarks/candidates/ab.sh table dcp_tf32x2 $OUT/base_timing.log $OUT/cand_timing.log
fi
