#!/usr/bin/env bash
# The GPU run behind BENCHMARKS.md, in one go: the GPU tests, the attention benchmark and whole-model training
# throughput. Run from the repository root on a CUDA machine with the project importable (PYTHONPATH=. works).
#   bash benchmarks/gpu_suite.sh [results folder]
# Environment: TOKENIZER=path/to/tokenizer.json where mistral-common is absent; TESTS (default: tests);
# STEPS (default 200) for the fpa/fox/sdpa models, PEER_STEPS (default 60) for selective and dcp.
set -uo pipefail
results=${1:-gpu_results}
mkdir -p "$results"
export PYTHONUNBUFFERED=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$results/machine.txt"
python3 -c "import torch, triton, lightning; print('torch', torch.__version__, '| triton', triton.__version__, '| lightning', lightning.__version__)" | tee -a "$results/machine.txt"
status=0
python3 -m pytest -q -m gpu -p no:cacheprovider --continue-on-collection-errors ${TESTS:-tests} 2>&1 | tee "$results/gpu_tests.log" || status=1
python3 benchmarks/attention.py 2>&1 | tee "$results/attention.log" || status=1
python3 benchmarks/train_throughput.py --configs fpa fox sdpa --steps "${STEPS:-200}" --profile-steps 5 \
    ${TOKENIZER:+--tokenizer "$TOKENIZER"} --json "$results/throughput.json" 2>&1 | tee "$results/throughput.log" || status=1
python3 benchmarks/train_throughput.py --configs selective dcp --steps "${PEER_STEPS:-60}" --warmup 20 \
    ${TOKENIZER:+--tokenizer "$TOKENIZER"} --json "$results/throughput_peers.json" 2>&1 | tee "$results/throughput_peers.log" || status=1
exit $status
