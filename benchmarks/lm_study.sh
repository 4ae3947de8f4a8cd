#!/usr/bin/env bash
# The language-model study (docs/lm_study.md) on any machine with a GPU: train FPA, FoX and softmax (configs/study/)
# on the offline corpus through train.py, then evaluate them with every eval.py task on the same items.
#
#   bash benchmarks/lm_study.sh all                  # verify + train fpa fox sdpa + eval + summary
#   bash benchmarks/lm_study.sh verify               # the corpus's sha256 against its manifest
#   bash benchmarks/lm_study.sh train fpa fox        # train these (a model trained before is skipped)
#   bash benchmarks/lm_study.sh eval [GROUP ...]     # groups: loss long passkey ruler babilong prune evict generate
#                                                    #         lm_eval (default: all of them)
#   bash benchmarks/lm_study.sh summary              # status table of every step run so far
#   bash benchmarks/lm_study.sh pack FILE.tar.gz     # the results without checkpoints (event files, JSON, logs)
#
# Environment:
#   CORPUS     the corpus folder (default data/corpus: python -m datamodules.build_corpus --out data/corpus)
#   RESULTS    where runs/, eval/, logs/ and status.tsv go (default lm_study_results)
#   TOKENIZER  a tokenizer.json for train.py and eval.py (default: the offline Mistral tokenizer, which needs the
#              mistral-common package; pass one written by datamodules.mistral_tokenizer().save(path) elsewhere)
#   SMOKE=1    the same steps at a tiny shape on a CPU (a few steps, short lengths): checks the whole script
#   TRAIN_ARGS extra train.py overrides for every model
#   STOP_AFTER no step starts after this many seconds (a machine that runs one command for at most N minutes runs
#              the study as several commands: finished models and evaluations are skipped on the next call)
# Every step's command, exit code and seconds go to $RESULTS/status.tsv; a failed eval step does not stop the
# others, and the script exits non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
corpus=${CORPUS:-data/corpus}
results=${RESULTS:-lm_study_results}
backends=(fpa fox sdpa)
export PYTHONUNBUFFERED=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
python=${PYTHON:-python3}
mkdir -p "$results/logs" "$results/eval"
touch "$results/status.tsv"
failed=0

if [ "${SMOKE:-0}" = 1 ]; then  # the shape and lengths shrunk so that every step runs on a CPU in seconds
    context=128
    train_shape=(--trainer.accelerator=cpu --trainer.precision=32-true --trainer.max_steps=6
                 --trainer.val_check_interval=3 --model.model.n_layer=2 --model.model.d_model=64
                 --model.model.n_head=1 --model.model.d_mlp=128 --model.model.attention.impl=chunked
                 --data.init_args.seq_len=$context --data.init_args.batch_size=4 --data.init_args.max_val_batches=2
                 --data.init_args.num_workers=1 --model.optim.warmup_steps=2)
    eval_common=(--device cpu --precision 32)
    trials=2; ruler_trials=1; ruler_factors="4 8 16"; prune_docs=2; real_eviction_docs=1; max_new_tokens=8
else
    context=2048
    train_shape=()
    eval_common=(--device cuda --precision bf16)
    trials=50; ruler_trials=10; ruler_factors="2 4 8"; prune_docs=8; real_eviction_docs=2; max_new_tokens=96
fi
tokenizer_train=(); tokenizer_eval=()
if [ -n "${TOKENIZER:-}" ]; then
    tokenizer_train=(--data.init_args.tokenizer="$TOKENIZER"); tokenizer_eval=(--tokenizer "$TOKENIZER")
fi

# step NAME COMMAND...: run, log to logs/NAME.log, record "NAME exit seconds command" in status.tsv
step() {
    local name=$1; shift
    if [ -n "${STOP_AFTER:-}" ] && [ "$SECONDS" -ge "$STOP_AFTER" ]; then
        echo "== $name: not started (STOP_AFTER=$STOP_AFTER s reached); run the same command again"; return 1
    fi
    local start=$SECONDS
    echo "== $name: $*"
    "$@" >"$results/logs/$name.log" 2>&1
    local code=$?
    printf '%s\t%s\t%s\t%s\n' "$name" "$code" "$((SECONDS - start))" "$*" >>"$results/status.tsv"
    tail -n 4 "$results/logs/$name.log"
    echo "== $name: exit $code after $((SECONDS - start)) s"
    [ "$code" -eq 0 ] || failed=1
    return "$code"
}

ckpt() { ls "$results/runs/study_$1"/version_*/checkpoints/last.ckpt 2>/dev/null | tail -n 1; }

verify() { step verify "$python" -m datamodules.build_corpus --verify "$corpus"; }

train() {
    for backend in "$@"; do
        if awk -F'\t' -v step="train_$backend" '$1 == step && $2 == 0 {ok = 1} END {exit !ok}' "$results/status.tsv"; then echo "== train_$backend: trained before, skipped"; continue; fi
        rm -rf "$results/runs/study_$backend"  # an interrupted run's partial folder: start that model afresh
        step "train_$backend" "$python" train.py fit --config "configs/study/$backend.yaml" \
            --trainer.logger.init_args.save_dir="$results/runs" --data.init_args.source="$corpus/slimpajama" \
            "${tokenizer_train[@]}" "${train_shape[@]}" ${TRAIN_ARGS:-}
    done
}

# evaluate NAME TASK A B [options]: eval.py on checkpoint A (paired against B unless B is "-")
evaluate() {
    local name=$1 task=$2 a=$3 b=$4; shift 4
    if ls "$results/eval/$name"/*.json >/dev/null 2>&1; then echo "== eval_$name: done before, skipped"; return 0; fi
    local pair=(--ckpt "$(ckpt "$a")")
    [ "$b" = - ] || pair+=(--compare "$(ckpt "$b")")
    step "eval_$name" "$python" eval.py --task "$task" "${pair[@]}" --out "$results/eval/$name" \
        "${eval_common[@]}" "${tokenizer_eval[@]}" "$@"
}

lengths() { local f out=(); for f in "$@"; do out+=($((context * f))); done; echo "${out[@]}"; }

eval_group() {
    case $1 in
    loss)      for b in fox sdpa; do evaluate "test_loss-fpa-$b" test_loss fpa "$b" --data "$corpus/slimpajama"; done ;;
    long)      for b in fox sdpa; do evaluate "pg19_long-fpa-$b" pg19_long fpa "$b" --data "$corpus/pg19" \
                   --max-len "$((context * 8))"; done ;;
    passkey)   for b in fox sdpa; do evaluate "passkey-fpa-$b" passkey fpa "$b" --lengths $(lengths 1 2 4 8) \
                   --trials "$trials"; done ;;
    ruler)     for b in fox sdpa; do evaluate "ruler-fpa-$b" ruler fpa "$b" --data "$corpus/pg19" \
                   --lengths $(lengths $ruler_factors) --trials "$ruler_trials"; done ;;
    babilong)  for b in fox sdpa; do evaluate "babilong-fpa-$b" babilong fpa "$b" --data "$corpus/pg19" \
                   --lengths $(lengths 1 2 4) --trials "$ruler_trials"; done ;;
    prune)     # FoX under the same thresholds; softmax with a sliding window of FPA's mean kept size. Pass keys under
               # pruning are left out (PRUNE_PASSKEY=1 adds them): unpruned, every model scores 0 at every length
               # (docs/lm_study.md), and they were four fifths of this step's tokens
               passkey=(--passkey-lengths); [ "${PRUNE_PASSKEY:-0}" = 1 ] && passkey+=($(lengths 4 8) --trials "$trials")
               for b in fox sdpa; do evaluate "cache_prune-fpa-$b" cache_prune fpa "$b" --data "$corpus/pg19" \
                   --thresholds -10 -5 --lengths $(lengths 1 4) --max-docs "$prune_docs" "${passkey[@]}"; done ;;
    evict)     # a subset through the real KV cache (keys evicted from storage), beside the masking simulation
               evaluate cache_prune_real-fpa-fox cache_prune fpa fox --data "$corpus/pg19" --real-eviction \
                   --thresholds -10 --lengths "$context" --max-docs "$real_eviction_docs" --passkey-lengths ;;
    generate)  for b in "${backends[@]}"; do evaluate "generate-$b" generate "$b" - --max-new-tokens "$max_new_tokens" \
                   --prompt "And God said unto Moses," "def fibonacci(n):" "The kernel's memory allocator"; done ;;
    lm_eval)   evaluate lm_eval-fpa-fox lm_eval fpa fox --include-path examples/lm_eval --tasks kjv_cloze ;;
    *)         echo "unknown eval group $1" >&2; failed=1 ;;
    esac
}

summary() { echo "== status ($results/status.tsv): step, exit code, seconds"; cut -f1-3 "$results/status.tsv"; }

command=${1:-all}; shift || true
case $command in
    verify)  verify ;;
    train)   train "${@:-${backends[@]}}" ;;
    eval)    groups=("${@:-loss long passkey ruler babilong prune evict generate lm_eval}")
             for group in ${groups[@]}; do eval_group "$group"; done ;;
    summary) ;;
    pack)    tar --exclude='*.ckpt' -czf "${1:?pack needs an output file}" "$results" && ls -l "$1" ;;
    all)     verify && train "${backends[@]}"
             for group in loss long passkey ruler babilong prune evict generate lm_eval; do eval_group "$group"; done ;;
    *)       echo "usage: $0 [all|verify|train BACKEND...|eval [GROUP...]|summary|pack FILE]" >&2; exit 2 ;;
esac
summary
exit "$failed"
