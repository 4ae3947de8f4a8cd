#!/usr/bin/env bash
# session 10, call 4 (carry .whl .snap): the FPA piece kernel, HEAD against the candidate fpa_piece_skip.patch,
# benchmarks/piece_attention.py with 0 and 1 dense heads, each tree in its own process, alternating.
set -u
OUT=$1; ROOT=$PWD; export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:.
CAND=/tmp/cand; cp -r $ROOT/.snap $CAND; (cd $CAND && patch -p1 -s < benchmarks/candidates/fpa_piece_skip.patch) || exit 4
for dense in 0 1; do
  for tree in $ROOT/.snap $CAND; do
    echo "== $tree dense $dense"
    (cd $tree && timeout 120 python3 benchmarks/piece_attention.py --dense-heads $dense) 2>&1 | tail -n 8
  done
done
