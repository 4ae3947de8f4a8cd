#!/usr/bin/env bash
# GPU tests run beside probe rows (not timings): WHAT = d3 (the DCP d3 candidate on .snap_dcp) or decode (the
# decode custom op and its graph/compile tests on .snap). usage: bash .gpu/beside_tests.sh OUT WHAT LIMIT_S
set -u
OUT=$1; WHAT=$2; LIMIT=$3; ROOT=$PWD; D=$OUT/${WHAT}_tests; mkdir -p $D
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
t() { timeout "$LIMIT" python3 -m pytest -q -m gpu -p no:cacheprovider "$@"; }
if [ "$WHAT" = d3 ]; then
  cd $ROOT/.snap_dcp
  t tests/ops/test_dcp_fused.py -k bf16_shapes > $D/tests_shapes.log 2>&1 &
  t tests/ops/test_dcp_fused.py -k "not bf16_shapes" > $D/tests_rest.log 2>&1 &
  t tests/ops/test_selective_fused.py > $D/tests_selective.log 2>&1 &
else
  cd $ROOT/.snap
  t tests/ops/test_decode_attention.py > $D/tests_op.log 2>&1 &
  t tests/generation > $D/tests_generation.log 2>&1 &
fi
wait
echo "$WHAT tests done ${SECONDS} s"; tail -qn 2 $D/*.log
