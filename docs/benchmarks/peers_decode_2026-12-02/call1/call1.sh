#!/usr/bin/env bash
# call 1: fused peers' GPU tests + MQAR step cost (parallel), then peers' timing and the decode profile (sequential)
set -u
OUT=$1; ROOT=$PWD
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/machine.txt; python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $OUT/machine.txt
mkdir -p $OUT/sel $OUT/dcp $OUT/mqar $OUT/decode
cd $ROOT/.snap_peers
export PYTHONPATH=/tmp/site:.
timeout 250 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ops/test_selective_fused.py -k bf16_shapes > $OUT/sel/tests_shapes.log 2>&1 &
timeout 250 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ops/test_selective_fused.py -k "not bf16_shapes" > $OUT/sel/tests_rest.log 2>&1 &
timeout 250 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ops/test_dcp_fused.py -k bf16_shapes > $OUT/dcp/tests_shapes.log 2>&1 &
timeout 250 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ops/test_dcp_fused.py -k "not bf16_shapes" > $OUT/dcp/tests_rest.log 2>&1 &
cd $ROOT/.snap
P='mqar(pairs=64, keys=256, values=256, length=512)'
( timeout 240 python3 eval.py --task probes --device cuda --workers 1 --seeds 2 --steps 100 --impl auto --backends fpa --probes "$P" --out $OUT/mqar/auto > $OUT/mqar/auto.log 2>&1
  timeout 120 python3 eval.py --task probes --device cuda --workers 1 --seeds 2 --steps 100 --impl auto --backends sdpa --probes "$P" --out $OUT/mqar/auto_sdpa > $OUT/mqar/auto_sdpa.log 2>&1 ) &
timeout 240 python3 eval.py --task probes --device cuda --workers 1 --seeds 15 --steps 40 --impl naive --backends fpa --probes "$P" --out $OUT/mqar/naive > $OUT/mqar/naive.log 2>&1 &
wait
echo "phase A ${SECONDS} s"; tail -n 2 $OUT/sel/*.log $OUT/dcp/*.log
cd $ROOT/.snap_peers
timeout 100 python3 benchmarks/attention.py --shapes 8x2048,4x4096,2x8192,1x16384 --methods selective,selective-fused > $OUT/sel/timing.log 2>&1
timeout 100 python3 benchmarks/attention.py --shapes 8x2048,4x4096,2x8192,1x16384 --methods dcp,dcp-fused > $OUT/dcp/timing.log 2>&1
echo "phase B peers ${SECONDS} s"
cd $ROOT/.snap
timeout $((570 - SECONDS)) python3 benchmarks/decode.py --profile --json $OUT/decode/before.json > $OUT/decode/before.log 2>&1
echo "done ${SECONDS} s"
