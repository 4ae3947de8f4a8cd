#!/usr/bin/env bash
# The GPU run behind BENCHMARKS.md, in one go: the GPU tests, the attention benchmark and whole-model training
# throughput. Run from the repository root on a CUDA machine with the project importable (PYTHONPATH=. works).
#   bash benchmarks/gpu_suite.sh [results folder]   (TOKENIZER=path/to/tokenizer.json where mistral-common is absent)
set -uo pipefail
results=${1:-gpu_results}
mkdir -p "$results"
export PYTHONUNBUFFERED=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$results/machine.txt"
python -c "import torch, triton, lightning; print('torch', torch.__version__, '| triton', triton.__version__, '| lightning', lightning.__version__)" | tee -a "$results/machine.txt"
status=0
python -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$results/gpu_tests.log" || status=1
python benchmarks/attention.py 2>&1 | tee "$results/attention.log" || status=1
python benchmarks/train_throughput.py --configs fpa fox sdpa selective dcp --steps "${STEPS:-200}" \
    ${TOKENIZER:+--tokenizer "$TOKENIZER"} --json "$results/throughput.json" 2>&1 | tee "$results/throughput.log" || status=1
exit $status
