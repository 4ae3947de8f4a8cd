#!/usr/bin/env bash
# GPU check of a pure refactor (split_start / store_split shared by ops/decode's and ops/decode_step's partial kernels),
# from the repository root with .whl carried: the GPU tests of both ops and of graph decoding.
set -u
OUT=$1; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:.
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)"
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfEs -m gpu tests/ops/test_decode_step.py tests/ops/test_decode_attention.py \
  "tests/generation/test_decode_fused.py::test_gpu_graph_decoding_with_the_fused_op" 2>&1 | tee $OUT/tests.log | tail -n 3
