#!/usr/bin/env bash
# call 1 (2026-12-03): profile a probe-row step of the MQAR paper regime; Selective kernel GPU tests; whole-model
# tokens/s of all five backends in one process.
set -u
OUT=$1; ROOT=$PWD
export PYTHONUNBUFFERED=1
R=$OUT/res; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/machine.txt; python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $R/machine.txt
finish() { cd $OUT && tar czf res.tgz res && rm -rf res; }
cd $ROOT/.snap && export PYTHONPATH=/tmp/site:.
G2="mqar, paper regime, 2 layers, 32 pairs, T=256"
timeout 120 python3 benchmarks/probe_step.py --group "$G2" --json $R/probe_step_t256.json > $R/probe_step_t256.log 2>&1
echo "probe fp32 ${SECONDS} s"; grep "|" $R/probe_step_t256.log
timeout 90 python3 benchmarks/probe_step.py --group "$G2" --tf32 --top 8 --json $R/probe_step_t256_tf32.json > $R/probe_step_t256_tf32.log 2>&1
timeout 60 python3 benchmarks/probe_step.py --group "mqar, paper regime, 2 layers, 64 pairs, T=512" --backends fpa sdpa --top 8 --json $R/probe_step_t512.json > $R/probe_step_t512.log 2>&1
echo "probe ${SECONDS} s"; grep -h "|" $R/probe_step_t256_tf32.log $R/probe_step_t512.log
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ops/test_selective_fused.py > $R/tests_selective_fused.log 2>&1
echo "selective tests ${SECONDS} s"; tail -n 2 $R/tests_selective_fused.log
left=$((560 - SECONDS))
timeout $left python3 benchmarks/train_throughput.py --configs fpa fox sdpa selective dcp --steps 30 --warmup 8 --tokenizer $ROOT/.whl/tokenizer.json --json $R/throughput.json > $R/throughput.log 2>&1
echo "throughput ${SECONDS} s"; tail -n 12 $R/throughput.log
finish
