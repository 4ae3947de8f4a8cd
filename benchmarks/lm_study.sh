#!/usr/bin/env bash
# The language-model study (docs/lm_study.md) on any machine with a GPU: train FPA, FoX and softmax (configs/study/)
# on the offline corpus through train.py with several initialisation seeds, evaluate every trained model alone with
# the eval.py tasks on the same items (per-item results kept), and compare the backends across seeds with
# `eval.py seeds` (seed-level intervals, sign test; a verdict only from two seeds on).
#
#   bash benchmarks/lm_study.sh verify                      # the corpus's sha256 against its manifest
#   bash benchmarks/lm_study.sh all                         # verify, then run fpa fox sdpa, then compare fpa fox/sdpa
#   SEEDS="0 1 2 3 4" bash benchmarks/lm_study.sh run fpa fox   # train + evaluate every (backend, lr, seed) unit
#   LRS="3e-4 6e-4 1e-3 2e-3" bash benchmarks/lm_study.sh sweep fpa fox sdpa   # train only (seed 0): val loss per lr
#   bash benchmarks/lm_study.sh compare fpa fox             # eval.py seeds for each task both sides have (CPU is fine)
#   bash benchmarks/lm_study.sh compare fpa@6e-4 sdpa@3e-4  # each side at its own (tuned) rate; the seeds both have
#   bash benchmarks/lm_study.sh summary                     # every finished run's final losses, then status.tsv
#   bash benchmarks/lm_study.sh pack FILE.tar.gz            # the results without checkpoints or event files' images
#   bash benchmarks/lm_study.sh record RECORDS              # finished units' records into RECORDS (to commit); a
#                                                           #   retraining that differs from RECORDS' goes to retrained/
#   bash benchmarks/lm_study.sh restore RECORDS             # a fresh $RESULTS from committed records: units whose
#                                                           #   records are complete are skipped by the next run
# The retrieval arm (configs/study/retrieval_*.yaml: the corpus mixed with synthetic retrieval documents):
#   SHARES="0.05 0.1 0.2" bash benchmarks/lm_study.sh pilot # FPA, seed 0, per share: pass keys at the training length
#                                                           #   and recall of the synthetic documents' own facts;
#                                                           #   pilot.json: the smallest share finding 90 % of them
#   SHARE=0.1 SEEDS="0 1 2" bash benchmarks/lm_study.sh retrieval fpa fox sdpa   # train + evaluate at one share
#   bash benchmarks/lm_study.sh compare retrieval_fpa_share0.1 retrieval_fox_share0.1
#
# A unit is one (backend, learning rate, seed), and for the retrieval arm its synthetic share: its run is named
# study_<backend>_lr<lr>_s<seed>, or study_retrieval_<backend>_share<share>_lr<lr>_s<seed> (the seed and the
# rate are in the name, in the run's config.yaml and in every eval JSON, which reads them from the checkpoint).
# Resuming across GPU leases: a unit whose evaluations are all in $RESULTS is skipped; one trained in an earlier lease
# whose checkpoint is gone but whose evaluations are incomplete is trained again, and its new final losses are
# checked against the recorded ones (runs/<name>/final.json; a mismatch is reported, FPA's training is deterministic).
# Carry $RESULTS (without checkpoints: `pack`) into the next lease and run the same command; or, where nothing survives
# a lease but the repository, `record` the finished units into a committed folder (benchmarks/results/lm_study_seeds:
# trainings/<name>.json, eval/, compare/, status.tsv) and `restore` it at the start of the next lease.
#
# Environment:
#   SEEDS      initialisation seeds (seed_everything), default "0" (the pilot: 0)
#   SHARES     the pilot's synthetic shares, default "0.05 0.1 0.2"; SHARE: the retrieval mode's one share
#   VARY_DATA  1: the data order's seed follows the initialisation seed (default 0: one data order for every run)
#   LRS        peak learning rates, default "1e-3" (configs/base/110m.yaml's; a test keeps the two equal)
#   EVALS      evaluation groups per unit, default "loss long passkey ruler babilong prune" (the tasks that compare);
#              also: evict (cache_prune with real eviction), generate, lm_eval (needs lm-evaluation-harness),
#              recall (retrieval_recall: the facts of held-out synthetic retrieval documents at 1, 2 and 4 times the
#              training length, 100 documents each). In the retrieval arm pass keys are 100 trials at 1, 1.5, 2, 4
#              and 8 times the training length, prune adds cache_prune's pass keys under the threshold -10 (1 and 4
#              times), and recall joins the default groups; the pilot evaluates passkey1x (pass keys at the training
#              length) and recall
#   PARALLEL   units trained side by side on the one GPU (default 1; 2 overlaps start-up, data and evaluation)
#   CORPUS     the corpus folder (default data/corpus: python -m datamodules.build_corpus --out data/corpus)
#   RESULTS    where runs/, eval/, compare/, logs/ and status.tsv go (default lm_study_results)
#   TOKENIZER  a tokenizer.json for train.py and eval.py (default: the offline Mistral tokenizer, which needs the
#              mistral-common package; pass one written by datamodules.mistral_tokenizer().save(path) elsewhere)
#   SMOKE=1    the same steps at a tiny shape on a CPU (a few steps, short lengths): checks the whole script
#   TRAIN_ARGS extra train.py overrides for every model
#   STOP_AFTER no unit (training) or comparison starts after this many seconds; a unit that started still runs its
#              evaluations (a machine that runs one command for at most N minutes runs the study as several
#              commands: what finished is skipped on the next call)
#   DRY_RUN=1  print every step's command instead of running it (nothing is trained or evaluated)
# Every step's command, exit code and seconds go to $RESULTS/status.tsv; a failed step does not stop the others, and
# the script exits non-zero if any step failed. A TERM or INT sent to the script stops the step of every lane too
# (exit 143); the next call trains an interrupted unit again from its start.
set -uo pipefail
cd "$(dirname "$0")/.."
corpus=${CORPUS:-data/corpus}
results=${RESULTS:-lm_study_results}
seeds=(${SEEDS:-0})
lrs=(${LRS:-1e-3})
shares=(plain)  # the arm of every unit: plain (configs/study/<backend>.yaml), or a synthetic share (the retrieval arm)
evals=(${EVALS:-loss long passkey ruler babilong prune})
parallel=${PARALLEL:-1}
export PYTHONUNBUFFERED=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
python=${PYTHON:-python3}
mkdir -p "$results/logs" "$results/eval" "$results/runs" "$results/compare"
touch "$results/status.tsv"
failed=0

if [ "${SMOKE:-0}" = 1 ]; then  # the shape and lengths shrunk so that every step runs on a CPU in seconds
    context=128
    train_shape=(--trainer.accelerator=cpu --trainer.precision=32-true --trainer.max_steps=4
                 --trainer.val_check_interval=2 --trainer.log_every_n_steps=1 --model.model.n_layer=2 --model.model.d_model=64
                 --model.model.n_head=1 --model.model.d_mlp=128 --model.model.attention.impl=chunked
                 --data.init_args.seq_len=$context --data.init_args.batch_size=4 --data.init_args.max_val_batches=2
                 --data.init_args.num_workers=1 --model.optim.warmup_steps=2
                 # the long-context loss over 2 contexts of one document, not 8 of four: the callback still runs at
                 # each validation, at an eighth of the tokens and in a quadratic CPU attention (this override goes
                 # to the last callback of configs/base/study.yaml's list, LongContextLossCallback; another class
                 # there fails the run, it does not go unnoticed)
                 --trainer.callbacks.context_multiple=2 --trainer.callbacks.n_documents=1)
    eval_common=(--device cpu --precision 32)
    trials=2; ruler_trials=1; ruler_factors="4 8 16"; prune_docs=2; max_docs=(--max-docs 8); real_eviction_docs=1
    max_new_tokens=8; retrieval_trials=2
else
    context=2048
    train_shape=()
    eval_common=(--device cuda --precision bf16)
    trials=50; ruler_trials=10; ruler_factors="2 4 8"; prune_docs=8; max_docs=(); real_eviction_docs=2
    max_new_tokens=96; retrieval_trials=100
fi
tokenizer_train=(); tokenizer_eval=()
if [ -n "${TOKENIZER:-}" ]; then
    tokenizer_train=(--data.init_args.tokenizer="$TOKENIZER"); tokenizer_eval=(--tokenizer "$TOKENIZER")
fi

too_late() { [ -n "${STOP_AFTER:-}" ] && [ "$SECONDS" -ge "$STOP_AFTER" ]; }
dry_run() { [ "${DRY_RUN:-0}" = 1 ]; }  # every step printed, none run, no earlier run moved or removed

# step NAME COMMAND...: run, log to logs/NAME.log, record "NAME exit seconds command" in status.tsv
step() {
    local name=$1; shift
    dry_run && { echo "== $name (dry run): $*"; return 0; }
    local start=$SECONDS
    echo "== $name: $*"
    "$@" >"$results/logs/$name.log" 2>&1
    local code=$?
    printf '%s\t%s\t%s\t%s\n' "$name" "$code" "$((SECONDS - start))" "$*" >>"$results/status.tsv"
    tail -n 3 "$results/logs/$name.log"
    echo "== $name: exit $code after $((SECONDS - start)) s"
    [ "$code" -eq 0 ] || failed=1
    return "$code"
}

run_name() {  # backend lr seed [share]
    case ${4:-plain} in plain) echo "study_$1_lr$2_s$3" ;; *) echo "study_retrieval_$1_share$4_lr$2_s$3" ;; esac
}
ckpt() {  # the run's last checkpoint (where it will be, when there is none yet)
    ls "$results/runs/$1"/version_*/checkpoints/last.ckpt 2>/dev/null | tail -n 1 | grep . \
        || echo "$results/runs/$1/version_0/checkpoints/last.ckpt"
}
has_bias() { [[ $1 != study_sdpa_* && $1 != study_retrieval_sdpa_* ]]; }  # softmax has none: nothing to prune

verify() { step verify "$python" -m datamodules.build_corpus --verify "$corpus"; }

# train BACKEND LR SEED SHARE: one training; on success runs/<name>/final.json holds its final losses
train() {
    local backend=$1 lr=$2 seed=$3 share=$4 name config=configs/study/$1.yaml arm=()
    name=$(run_name "$@")
    if [ "$share" != plain ]; then
        config=configs/study/retrieval_$backend.yaml; arm=(--data.init_args.mixture_weights.retrieval="$share")
    fi
    local data_seed=()
    [ "${VARY_DATA:-0}" = 1 ] && data_seed=(--data.init_args.seed="$seed")
    local previous="$results/runs/$name/final.json"
    if ! dry_run; then  # an interrupted or earlier lease's run: start that unit afresh (its record kept to compare)
        [ -f "$previous" ] && mv "$previous" "$results/runs/$name.final_before.json"
        rm -rf "$results/runs/$name"
    fi
    step "train_$name" "$python" train.py fit --config "$config" "${arm[@]}" \
        --trainer.logger.init_args.save_dir="$results/runs" --trainer.logger.init_args.name="$name" \
        --seed_everything="$seed" --model.optim.lr="$lr" "${data_seed[@]}" \
        --data.init_args.source="$corpus/slimpajama" "${tokenizer_train[@]}" "${train_shape[@]}" ${TRAIN_ARGS:-} \
        || return 1
    dry_run && return 0
    "$python" benchmarks/lm_study_runs.py final "$results/runs/$name" --backend "$backend" --lr "$lr" \
        --seed "$seed" --compare-with "$results/runs/$name.final_before.json"
}

lengths() { local f out=(); for f in "$@"; do out+=($((context * $f))); done; echo "${out[@]}"; }  # 3/2: 1.5x

# The pass keys of the units that follow: the plain arm's (none under pruning: unpruned, every model scored 0), or
# with retrieval_arm SHARE... the retrieval arm's at those shares: 100 trials a length, and under pruning at -10
passkey_args=(--lengths $(lengths 1 2 4 8) --trials "$trials"); prune_passkeys=(--passkey-lengths)
retrieval_arm() {
    shares=("$@")
    passkey_args=(--lengths $(lengths 1 3/2 2 4 8) --trials "$retrieval_trials")
    prune_passkeys=(--passkey-lengths $(lengths 1 4) --trials "$retrieval_trials")
}

# eval_task GROUP: the eval.py task of an evaluation group, and the folder its results go to (eval/<name>/<folder>)
eval_task() {
    case $1 in
    loss) echo "test_loss test_loss" ;; long) echo "pg19_long pg19_long" ;; prune) echo "cache_prune cache_prune" ;;
    evict) echo "cache_prune cache_prune_real" ;; passkey1x) echo "passkey passkey_1x" ;;
    recall) echo "retrieval_recall retrieval_recall" ;;
    passkey|ruler|babilong|generate|lm_eval) echo "$1 $1" ;;
    *) return 1 ;;
    esac
}

# evaluate NAME GROUP: one eval.py task on the unit's checkpoint alone, into eval/<name>/<folder>/
evaluate() {
    local name=$1 group=$2 args=() task folder
    read -r task folder < <(eval_task "$group") || { echo "unknown eval group $group" >&2; failed=1; return 1; }
    # a model without a bias (softmax) has nothing to prune: its window comparison needs FPA's kept size
    [[ $task == cache_prune ]] && ! has_bias "$name" && return 0
    case $group in
    loss)     args=(--data "$corpus/slimpajama" "${max_docs[@]}") ;;
    long)     args=(--data "$corpus/pg19" --max-len "$((context * 8))") ;;
    passkey)  args=("${passkey_args[@]}") ;;
    passkey1x) args=(--lengths "$context" --trials "$retrieval_trials") ;;
    recall)   args=(--data "$corpus/slimpajama" --lengths $(lengths 1 2 4) --trials "$retrieval_trials") ;;
    ruler)    args=(--data "$corpus/pg19" --lengths $(lengths $ruler_factors) --trials "$ruler_trials") ;;
    babilong) args=(--data "$corpus/pg19" --lengths $(lengths 1 2 4) --trials "$ruler_trials") ;;
    prune)    args=(--data "$corpus/pg19" --thresholds -10 -5 --lengths $(lengths 1 4) --max-docs "$prune_docs"
                    "${prune_passkeys[@]}") ;;
    evict)    args=(--data "$corpus/pg19" --real-eviction --thresholds -10 --lengths "$context"
                    --max-docs "$real_eviction_docs" --passkey-lengths) ;;
    generate) args=(--max-new-tokens "$max_new_tokens" --prompt "And God said unto Moses," "def fibonacci(n):"
                    "The kernel's memory allocator") ;;
    lm_eval)  args=(--include-path examples/lm_eval --tasks kjv_cloze) ;;
    esac
    local out="$results/eval/$name/$folder"
    [ -f "$out/$task.json" ] && return 0
    step "eval_${name}_$folder" "$python" eval.py --task "$task" --ckpt "$(ckpt "$name")" --out "$out" --overwrite \
        "${eval_common[@]}" "${tokenizer_eval[@]}" "${args[@]}"
}

evals_done() {  # NAME: every requested evaluation of the unit has its JSON
    local name=$1 group task folder
    for group in "${evals[@]}"; do
        read -r task folder < <(eval_task "$group") || return 1
        [[ $task == cache_prune ]] && ! has_bias "$name" && continue
        [ -f "$results/eval/$name/$folder/$task.json" ] || return 1
    done
}

# unit BACKEND LR SEED SHARE [train-only]: train unless finished (or its checkpoint is still here), then evaluate
unit() {
    local backend=$1 lr=$2 seed=$3 share=$4 only=${5:-} name
    name=$(run_name "$backend" "$lr" "$seed" "$share")
    if [ -f "$results/runs/$name/final.json" ] && { [ -n "$only" ] || evals_done "$name"; }; then
        echo "== $name: finished before, skipped"; return 0
    fi
    too_late && { echo "== $name: not started (STOP_AFTER reached)"; return 1; }
    if [ ! -f "$results/runs/$name/final.json" ] || [ ! -f "$(ckpt "$name")" ]; then
        train "$backend" "$lr" "$seed" "$share" || return 1
    fi
    [ -n "$only" ] && return 0
    local group
    for group in "${evals[@]}"; do evaluate "$name" "$group"; done
}

# units BACKEND... [train-only]: every (backend, lr, seed, share), PARALLEL lanes side by side
units() {
    local only=$1; shift
    local list=() backend lr seed share
    for seed in "${seeds[@]}"; do for lr in "${lrs[@]}"; do for share in "${shares[@]}"; do for backend in "$@"; do
        list+=("$backend $lr $seed $share"); done; done; done; done
    local lane; lane_pids=()
    for ((lane = 0; lane < parallel; lane++)); do
        (for ((i = lane; i < ${#list[@]}; i += parallel)); do unit ${list[$i]} $only; done; exit "$failed") &
        lane_pids+=($!)
    done
    # a TERM or INT sent to this script alone (a scheduler's kill, not Ctrl-C's whole group) reaches each lane's step
    trap stop_lanes TERM INT
    local pid; for pid in "${lane_pids[@]}"; do wait "$pid" || failed=1; done
    trap - TERM INT
}

# stop_lanes: each lane, then the step it was running (its children first read, so the lane cannot start another)
stop_lanes() {
    local pid children=()
    for pid in "${lane_pids[@]}"; do children+=($(pgrep -P "$pid")); done
    kill -TERM "${lane_pids[@]}" "${children[@]}" 2>/dev/null
    local waited=0  # a training checkpoints on TERM before it exits (docs/training.md): give it a minute
    while [ ${#children[@]} -gt 0 ] && kill -0 "${children[@]}" 2>/dev/null && [ $waited -lt 60 ]; do
        sleep 1; waited=$((waited + 1))
    done
    echo "== stopped by a signal: the lanes' steps were sent TERM"
    exit 143
}

# compare A B: eval.py seeds on every task both backends have results for, at every rate of LRS on both sides;
# compare A@LR B@LR: each side at its own rate (e.g. its tuned one)
compare() {
    local a=$1 b=$2 lr
    if [[ $a == *@* || $b == *@* ]]; then
        [[ $a == *@* && $b == *@* ]] || { echo "compare: give both sides a rate (fpa@6e-4 sdpa@3e-4) or neither" >&2
                                          failed=1; return 1; }
        compare_pair "${a%@*}" "${a#*@}" "${b%@*}" "${b#*@}" "${a%@*}_lr${a#*@}-${b%@*}_lr${b#*@}"
    else
        for lr in "${lrs[@]}"; do compare_pair "$a" "$lr" "$b" "$lr" "${a}-${b}_lr$lr" "${a}_${b}_lr$lr"; done
    fi
}

# compare_pair A LR_A B LR_B FOLDER [STEP]: eval.py seeds for each task both sides have, on the seeds both sides have
# (five FPA seeds against softmax's three compare three pairs)
compare_pair() {
    local a=$1 lra=$2 b=$3 lrb=$4 folder=$5 stepname=${6:-$5} task file seed
    for task in test_loss pg19_long passkey ruler babilong cache_prune; do
        local side_a=() side_b=()
        for file in "$results/eval/study_${a}_lr${lra}_s"*/"$task/$task.json"; do
            [ -f "$file" ] || continue
            seed=${file#"$results/eval/study_${a}_lr${lra}_s"}; seed=${seed%%/*}
            local other="$results/eval/study_${b}_lr${lrb}_s$seed/$task/$task.json"
            [ -f "$other" ] && side_a+=("$file") && side_b+=("$other")
        done
        [ ${#side_a[@]} -gt 0 ] || continue
        step "compare_${stepname}_$task" "$python" eval.py seeds --task "$task" --a "${side_a[@]}" \
            --b "${side_b[@]}" --out "$results/compare/$folder" --overwrite
    done
}

# pilot: FPA's retrieval arm at every share of SHARES (seed 0), pass keys at the training length, pilot.json
pilot() {
    retrieval_arm ${SHARES:-0.05 0.1 0.2}; seeds=(0); evals=(passkey1x recall)
    units "" fpa
    local runs=() lr share
    for lr in "${lrs[@]}"; do for share in "${shares[@]}"; do
        runs+=(--run "$share" "$lr" 0 "$results/eval/$(run_name fpa "$lr" 0 "$share")/passkey_1x/passkey.json")
    done; done
    echo "== pilot summary: $results/pilot.json"
    dry_run && return 0
    "$python" benchmarks/lm_study_pilot.py --out "$results/pilot.json" --length "$context" "${runs[@]}" || failed=1
}

# record DEST: every finished unit's final losses (trainings/<name>.json), its evaluations and the comparisons, and
# the status lines DEST lacks; no checkpoints, event files or logs. A unit recorded again replaces its files, except a
# unit trained again whose final losses differ from DEST's record: its record goes to retrained/<name>.json (the
# evaluated model's; eval/<name> is replaced by its evaluations) and the first training's record stays.
record() {
    local dest=$1 final name
    mkdir -p "$dest/trainings" "$dest/eval" "$dest/compare"
    for final in "$results"/runs/*/final.json; do
        [ -f "$final" ] || continue
        name=$(basename "$(dirname "$final")")
        if [ -f "$dest/trainings/$name.json" ] && grep -q '"reproduction": "DIFFERS' "$final"; then
            # trained again in a later lease and not bit for bit: the evaluated model's record goes beside the first
            # training's, which stays (the sweep's, for seed 0)
            mkdir -p "$dest/retrained"; cp "$final" "$dest/retrained/$name.json"
        else
            cp "$final" "$dest/trainings/$name.json"
        fi
    done
    cp -r "$results/eval/." "$dest/eval/"
    cp -r "$results/compare/." "$dest/compare/"
    [ -f "$results/pilot.json" ] && cp "$results/pilot.json" "$dest/"
    touch "$dest/status.tsv"
    local line
    while IFS= read -r line; do
        grep -qxF -- "$line" "$dest/status.tsv" || printf '%s\n' "$line" >>"$dest/status.tsv"
    done <"$results/status.tsv"
    echo "== recorded $(ls "$dest/trainings" | wc -l) trainings and $(find "$dest/eval" -name '*.json' | wc -l) evaluations in $dest"
}

# restore SOURCE: what `record` wrote, back into $RESULTS (nothing there is replaced): a unit with its final losses and
# every requested evaluation is skipped; one whose evaluations are incomplete is trained again (no checkpoint) and
# checked against its recorded losses
restore() {
    local source=$1 training name
    [ -d "$source/trainings" ] || { echo "restore: $source has no trainings/ folder (made by: lm_study.sh record)" >&2
                                    failed=1; return 1; }
    for training in "$source"/trainings/*.json; do
        [ -f "$training" ] || continue
        name=$(basename "$training" .json)
        mkdir -p "$results/runs/$name"
        # a unit trained again: its evaluations are of the retrained model, so a later check compares with that one
        [ -f "$source/retrained/$name.json" ] && training="$source/retrained/$name.json"
        [ -f "$results/runs/$name/final.json" ] || cp "$training" "$results/runs/$name/final.json"
    done
    [ -d "$source/eval" ] && cp -rn "$source/eval/." "$results/eval/"
    [ -d "$source/compare" ] && cp -rn "$source/compare/." "$results/compare/"
    echo "== restored $(ls "$source/trainings" | wc -l) trainings from $source"
}

summary() {
    echo "== finished runs (runs/*/final.json)"
    "$python" benchmarks/lm_study_runs.py finals "$results/runs"
    echo "== status ($results/status.tsv): step, exit code, seconds"; cut -f1-3 "$results/status.tsv"
}

command=${1:-}; shift || true
backends=("$@"); [ ${#backends[@]} -gt 0 ] || backends=(fpa fox sdpa)
case $command in
    verify)  verify ;;
    run)     units "" "${backends[@]}" ;;
    sweep)   seeds=(0); units train-only "${backends[@]}" ;;
    compare) compare "${1:?compare needs two backends}" "${2:?compare needs two backends}" ;;
    all)     verify && units "" "${backends[@]}"; compare fpa fox; compare fpa sdpa ;;
    pilot)   pilot ;;
    retrieval) retrieval_arm ${SHARE:?the retrieval mode needs SHARE, a synthetic share (pilot.json picks one)}
             [ -n "${EVALS:-}" ] || evals+=(recall)
             units "" "${backends[@]}" ;;
    summary) ;;
    pack)    tar --exclude='*.ckpt' -czf "${1:?pack needs an output file}" "$results" && ls -l "$1" ;;
    record)  record "${1:?record needs a folder}" ;;
    restore) restore "${1:?restore needs a folder made by record}" ;;
    *)       echo "usage: $0 verify|all|run [BACKEND...]|sweep [BACKEND...]|pilot|retrieval [BACKEND...]|compare A B|" \
                  "summary|pack FILE|record DIR|restore DIR" >&2; exit 2 ;;
esac
summary
exit "$failed"
