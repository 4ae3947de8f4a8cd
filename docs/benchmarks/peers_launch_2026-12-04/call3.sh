#!/usr/bin/env bash
# session 11, call 3 (carry .whl .snap; .snap = git archive HEAD, with benchmarks/candidates/peers_launch.patch):
# 1. the candidate's GPU tests (Selective, DCP) in three processes; 2. alone: base and candidate alternating,
# benchmarks/attention.py --methods selective-fused,dcp-fused at the four shapes (with fwd+bwd peak memory), and fpa
# once for its memory at 1x16384; the candidate with 6 head groups. One archive back.
set -u
OUT=$1; ROOT=$PWD; export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:.; R=/tmp/r; mkdir -p $R
CAND=/tmp/cand; cp -r $ROOT/.snap $CAND; (cd $CAND && patch -p1 -s < benchmarks/candidates/peers_launch.patch) || exit 4
grep -c "PROGRAMS_PER_SM" $CAND/fpa_lightning/ops/selective/fused.py
cd $CAND
pt=(timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider)
"${pt[@]}" tests/ops/test_selective_fused.py > $R/cand_tests_selective.log 2>&1 &
"${pt[@]}" tests/ops/test_dcp_fused.py -k "bf16_shapes" > $R/cand_tests_dcp_shapes.log 2>&1 &
"${pt[@]}" tests/ops/test_dcp_fused.py -k "not bf16_shapes" > $R/cand_tests_dcp_rest.log 2>&1 &
wait; echo "tests at $SECONDS s"; tail -qn 1 $R/cand_tests_*.log; grep -h "FAILED\|Error" $R/cand_tests_*.log | head
t() {  # TREE NAME [env]
  (cd $1 && env ${3:-BASE=1} timeout 90 python3 benchmarks/attention.py --methods selective-fused,dcp-fused > $R/$2.log 2>&1)
  echo "$2 at $SECONDS s"; grep -E '^\| [0-9]' $R/$2.log
}
t $ROOT/.snap base1; t $CAND cand1; t $ROOT/.snap base2; t $CAND cand2
[ $SECONDS -lt 470 ] && t $CAND cand_g6 SEL_HEAD_GROUPS=6
[ $SECONDS -lt 520 ] && (cd $CAND && timeout 40 python3 benchmarks/attention.py --shapes 1x16384 --methods fpa > $R/fpa_memory.log 2>&1; grep -E '^\| [0-9]' $R/fpa_memory.log)
echo "done at $SECONDS s"; cd /tmp && tar czf $OUT/call3.tgz r
