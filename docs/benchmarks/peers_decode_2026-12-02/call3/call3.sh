#!/usr/bin/env bash
# call 3: GPU tests (vmap rule, Selective kernel in the backend: whole model and decode), then timing: FPA op A/B
# (wrapper change), whole-model tokens/s fpa vs selective, compiled decode step at 8k.
set -u
OUT=$1; ROOT=$PWD
export PYTHONUNBUFFERED=1
R=$OUT/res; mkdir -p $R/tests $R/timing $R/decode
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/machine.txt; python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $R/machine.txt
finish() { cd $OUT && tar czf res.tgz res && rm -rf res; }
cd $ROOT/.snap && export PYTHONPATH=/tmp/site:.
T0=$SECONDS
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ops/test_fpa_fused.py tests/probes/test_model.py -k vmap > $R/tests/vmap.log 2>&1 &
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_fast_path_whole_model.py -k selective > $R/tests/whole_model_selective.log 2>&1 &
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/generation/test_generation_gpu.py -k "selective or fpa" > $R/tests/decode_selective.log 2>&1 &
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ops/test_fpa_fused.py -k "gpu_fp16 or gpu_drift or gpu_all_alive" > $R/tests/fpa_classic.log 2>&1 &
wait
echo "tests ${SECONDS} s"; tail -qn 1 $R/tests/*.log
timeout 40 python3 benchmarks/attention.py --shapes 8x2048,4x4096,2x8192,1x16384 --methods fpa > $R/timing/fpa_new.log 2>&1
(cd $ROOT/.snap_old && timeout 40 python3 benchmarks/attention.py --shapes 8x2048,4x4096,2x8192,1x16384 --methods fpa > $R/timing/fpa_old.log 2>&1)
timeout 40 python3 benchmarks/attention.py --shapes 8x2048,4x4096,2x8192,1x16384 --methods fpa > $R/timing/fpa_new2.log 2>&1
echo "ab ${SECONDS} s"
timeout 100 python3 benchmarks/train_throughput.py --configs fpa selective --steps 30 --warmup 8 --tokenizer $ROOT/.whl/tokenizer.json --json $R/timing/throughput.json > $R/timing/throughput.log 2>&1
echo "throughput ${SECONDS} s"
for v in softmax fpa fpa-prune-10; do
  left=$((555 - SECONDS)); [ $left -lt 30 ] && break
  timeout $left python3 benchmarks/decode.py --variants $v --lengths 8192 --batches 1 --modes graph --compile-lengths 8192 --json $R/decode/compile_$v.json > $R/decode/compile_$v.log 2>&1
  echo "decode $v ${SECONDS} s"
done
finish
