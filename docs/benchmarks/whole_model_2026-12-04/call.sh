#!/usr/bin/env bash
# GPU call (.whl carried, with gpu-prep's tokenizer.json): the whole 110M model's training throughput and peak memory
# after Selective's s2 and DCP's d5 launches (benchmarks/KERNEL_LOG.md), which changed the peers' backward memory and
# speed after the last whole-model runs: all five backends at 16 x 2048, then FPA and both peers at 1 x 16384.
set -u
OUT=$1; export PYTHONUNBUFFERED=1; R=/tmp/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/machine.txt 2>&1
python3 -c "import torch,triton,lightning;print(torch.__version__,triton.__version__,lightning.__version__)" >> $R/machine.txt
timeout 290 python3 benchmarks/train_throughput.py --configs fpa fox sdpa selective dcp --steps 25 --warmup 8 \
  --tokenizer .whl/tokenizer.json --json $R/train_2k.json > $R/train_2k.log 2>&1
echo "16x2048 rc $? at $SECONDS s"; grep -v "^\[\|Tip\|available\|LOCAL_RANK\|^$" $R/train_2k.log | tail -n 12
timeout 200 python3 benchmarks/train_throughput.py --configs fpa selective dcp --batch-size 1 --seq-len 16384 \
  --steps 30 --warmup 10 --tokenizer .whl/tokenizer.json --json $R/train_16k.json > $R/train_16k.log 2>&1
echo "1x16384 rc $? at $SECONDS s"; grep -v "^\[\|Tip\|available\|LOCAL_RANK\|^$" $R/train_16k.log | tail -n 8
cd /tmp && tar czf $OUT/whole_model.tgz r
