#!/usr/bin/env bash
# RULER- and BABILong-style evaluation on a GPU for a small FPA / FoX pair trained here first, in one go. The pair is
# the quickstart model (3 layers, d_model 192) trained with the fused kernels on the offline KJV corpus, so its
# scores say nothing about the paper's 110M claims (docs/evaluation.md); what the run shows is that the
# long-context tasks run on the GPU path at 4k-16k (fused kernels, bf16) with a tokenizer.json and no
# mistral-common, how fast, and the paired statistics end to end.
#   bash benchmarks/long_context_eval_gpu.sh [results folder]
# Environment: TOKENIZER (default .whl/tokenizer.json, written by gpu-prep), STEPS (default 1000 per model),
# TRIALS (default 20 items per task and length).
set -euo pipefail
results=${1:-gpu_eval_results}
tokenizer=${TOKENIZER:-.whl/tokenizer.json}
mkdir -p "$results"
export PYTHONUNBUFFERED=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
for backend in fpa fox; do
  SECONDS=0
  python3 train.py fit --config configs/quickstart.yaml --trainer.accelerator=gpu --trainer.precision=bf16-mixed \
      --trainer.max_steps="${STEPS:-1000}" --trainer.val_check_interval=250 \
      --trainer.logger.init_args.save_dir="$results/runs" --trainer.logger.init_args.name="$backend" \
      --model.model.attention.backend="$backend" --model.model.attention.impl=fused \
      --data.init_args.tokenizer="$tokenizer" --data.init_args.num_workers=4 2>&1 | tail -3
  echo "trained $backend in $SECONDS s" | tee -a "$results/times.txt"
done
ckpt() { ls "$results/runs/$1"/version_*/checkpoints/last.ckpt | tail -1; }
for task in ruler babilong; do
  SECONDS=0
  python3 eval.py --task "$task" --ckpt "$(ckpt fpa)" --compare "$(ckpt fox)" --precision bf16 \
      --trials "${TRIALS:-20}" --out "$results/$task" 2>&1 | tee "$results/$task.log"
  echo "$task in $SECONDS s" | tee -a "$results/times.txt"
done
