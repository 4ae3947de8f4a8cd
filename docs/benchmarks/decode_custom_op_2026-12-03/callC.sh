#!/usr/bin/env bash
# call C (2026-12-03, third session of the day): timings only, one at a time. 1. the DCP d3 candidate (.snap_dcp):
# benchmarks/attention.py dcp against dcp-fused (ratios to SDPA-flash from the same process); 2. decode at 8k,
# batch 1, CUDA graph, naive against auto (the fused custom op), then the compiled step with auto for fpa.
set -u
OUT=$1; ROOT=$PWD; export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/machine.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $OUT/machine.txt
cd $ROOT/.snap_dcp
timeout 200 python3 benchmarks/attention.py --methods dcp,dcp-fused > $OUT/d3_timing.log 2>&1; echo "d3 timing rc $? at ${SECONDS} s"
cd $ROOT/.snap
for impl in naive auto; do
  timeout 90 python3 benchmarks/decode.py --variants softmax fpa fpa-prune-10 --lengths 8192 --batches 1 --modes graph \
    --decode-attention $impl --json $OUT/decode_graph_$impl.json > $OUT/decode_graph_$impl.log 2>&1; echo "decode $impl rc $? at ${SECONDS} s"
done
timeout 120 python3 benchmarks/decode.py --variants fpa --lengths 8192 --batches 1 --modes graph --compile-lengths 8192 \
  --decode-attention auto --json $OUT/decode_compile_auto.json > $OUT/decode_compile_auto.log 2>&1; echo "compile rc $? at ${SECONDS} s"
