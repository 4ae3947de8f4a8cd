#!/usr/bin/env bash
# call 5 (2026-12-03): the command run right after call 4 on the same warm machine (the run tool's command line,
# from the repository root; $OUT is the run's output folder): graph-mode decode.py at 1k, 8k and 16k for softmax, fpa
# and fpa-prune-10, --decode-attention naive then auto, consecutive processes, on the patched snapshot .snap_dec.
cd .snap_dec && export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1; R=$OUT/res/decode_check; mkdir -p $R; for impl in naive auto; do timeout 70 python3 benchmarks/decode.py --variants softmax fpa fpa-prune-10 --lengths 1024 8192 16384 --batches 1 --modes graph --decode-attention $impl --json $R/decode_full_$impl.json > $R/decode_full_$impl.log 2>&1; echo "$impl rc $? at $SECONDS s"; done
