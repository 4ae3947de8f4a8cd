#!/usr/bin/env bash
# call 2: MQAR paper regime on the vmapped fused path (+ GPU tests of the vmap rule and the refactored kernel wrapper
# in parallel), then timing: FPA op before/after the wrapper change, and the fused Selective Attention candidate.
set -u
OUT=$1; ROOT=$PWD
export PYTHONUNBUFFERED=1
mkdir -p $OUT/res/tests $OUT/res/timing
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/res/machine.txt; python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $OUT/res/machine.txt
cd $ROOT/.snap && export PYTHONPATH=/tmp/site:.
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ops/test_fpa_fused.py tests/probes/test_model.py -k vmap > $OUT/res/tests/vmap.log 2>&1 &
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ops/test_fpa_fused.py -k "gpu_bf16_random_shapes" > $OUT/res/tests/fpa_shapes.log 2>&1 &
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ops/test_fpa_fused.py -k "gpu_variant_bf16_shapes or gpu_fp16 or gpu_drift" > $OUT/res/tests/fpa_variants.log 2>&1 &
timeout 410 python3 eval.py --task probes --device cuda --workers 4 --probes "mqar(pairs=32, keys=256, values=256, length=256)" "mqar(pairs=64, keys=256, values=256, length=512)" --out $OUT/res/mqar_regime > $OUT/res/mqar_regime.log 2>&1
echo "mqar rc $? at ${SECONDS} s" | tee -a $OUT/res/mqar_regime.log
wait
echo "tests done ${SECONDS} s"; tail -n 2 $OUT/res/tests/*.log
timeout 60 python3 benchmarks/attention.py --shapes 8x2048,4x4096,2x8192,1x16384 --methods fpa > $OUT/res/timing/fpa_new.log 2>&1
cd $ROOT/.snap_old && timeout 60 python3 benchmarks/attention.py --shapes 8x2048,4x4096,2x8192,1x16384 --methods fpa > $OUT/res/timing/fpa_old.log 2>&1
cd $ROOT/.snap_peers && timeout $((585 - SECONDS)) python3 benchmarks/attention.py --shapes 8x2048,4x4096,2x8192,1x16384 --methods selective,selective-fused > $OUT/res/timing/selective.log 2>&1
echo "done ${SECONDS} s"
cd $OUT && tar czf res.tgz res && rm -rf res
