#!/usr/bin/env bash
# session 11, call 2 (carry .whl .snap; .snap = git archive c87f465): 1. the piece op's GPU tests with PIECE_BLOCK_N=128
# (candidate launch) and the fused session's; 2. Selective's and DCP's untuned launch/tile choices, one process per
# setting, benchmarks/attention.py at 8x2048 and 1x16384 (ratios to SDPA-flash from the same process); 3. the piece
# kernel base vs BLOCK_N=128 alternating. One archive back.
set -u
OUT=$1; ROOT=$PWD; export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:.; R=/tmp/r; mkdir -p $R; cd $ROOT/.snap
PIECE_BLOCK_N=128 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/ops/test_fpa_piece.py > $R/tests_piece_bn128.log 2>&1 &
PIECE_BLOCK_N=128 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/generation/test_decode_fused.py > $R/tests_session_bn128.log 2>&1 &
wait; echo "tests at $SECONDS s"; tail -qn 1 $R/tests_*.log; grep -h FAILED $R/tests_*.log | head
ab() {  # LOG METHOD KNOBS...
  local log=$1 method=$2; shift 2
  for knobs in "$@"; do
    [ $SECONDS -gt 560 ] && { echo "out of time before $knobs" >> $R/$log; break; }
    echo "== $knobs" >> $R/$log
    env $knobs timeout 60 python3 benchmarks/attention.py --shapes 8x2048,1x16384 --methods $method 2>&1 \
      | grep -E '^\| [0-9]|FAILED|Error' >> $R/$log
  done
}
ab selective_ab.log selective-fused "BASE=1" "SEL_BWD_Q_STAGES=3" "SEL_BWD_KV_STAGES=3" "SEL_BWD_Q_WARPS=8" \
  "SEL_BWD_KV_WARPS=8" "SEL_BWD_BM=128 SEL_BWD_Q_WARPS=8" "SEL_BWD_BN=128 SEL_BWD_KV_WARPS=8" \
  "SEL_FWD_BM=128 SEL_FWD_WARPS=8" "SEL_HEAD_GROUPS=12" "SEL_PREFIX=scan" "SEL_BWD_BT=64" "BASE=1"
echo "selective at $SECONDS s"
ab dcp_ab.log dcp-fused "BASE=1" "DCP_BWD_Q_WARPS=8" "DCP_BWD_KV_WARPS=8" "DCP_BWD_Q_WARPS=8 DCP_BWD_KV_WARPS=8" \
  "DCP_BWD_BM=32" "DCP_BWD_Q_STAGES=1" "DCP_BWD_KV_STAGES=1" "DCP_FWD_WARPS=8" "DCP_PREFIX=scan" "BASE=1"
echo "dcp at $SECONDS s"
for knobs in PIECE_BLOCK_N=64 PIECE_BLOCK_N=128 PIECE_BLOCK_N=64 PIECE_BLOCK_N=128; do
  [ $SECONDS -gt 580 ] && break
  echo "== $knobs" >> $R/piece_ab.log
  env $knobs timeout 40 python3 benchmarks/piece_attention.py --pieces 2048,8192 --past 1,8192 --dense-heads 1 >> $R/piece_ab.log 2>&1
done
echo "done at $SECONDS s"; cd /tmp && tar czf $OUT/call2.tgz r
