#!/usr/bin/env bash
# Later calls (2026-12-03, session 7): some rows of the MQAR paper regime, each ROW as its own eval.py process (they
# share the GPU, time-sliced) and output folder, so a row that finishes is kept; merged on the CPU afterwards with
# `eval.py --task probes --merge`. A ROW is "LAYERS|PAIRS|T|BACKEND|WORKERS|FIRST_SEED|N_SEEDS": a row may be split
# into seed ranges trained in different calls (each seed trains as it would alone, SeedEnsemble); --merge joins them.
# usage (from the repo root, the snapshot in .snap): bash call_rows.sh OUT LIMIT_S ROW [ROW ...]
# MERGE=FOLDER (relative to the repo root, carried): earlier results (folders with probes.json or the
# probes.partial.json of a call cut short) passed to every row's --merge, so a row resumes with the seeds they lack.
# DEVICE (default cuda) and STEPS (default: the groups' own) are for a dry run of this script on a CPU.
set -u
OUT=$1; LIMIT=$2; shift 2; ROOT=$PWD
export PYTHONUNBUFFERED=1
R=$OUT/res; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/machine.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $R/machine.txt
merge=(); steps=()
if [ -n "${STEPS:-}" ]; then steps=(--steps "$STEPS"); fi
if [ -n "${MERGE:-}" ]; then merge=(--merge "$ROOT/$MERGE"/*/); fi
cd $ROOT/.snap
for row in "$@"; do
  IFS='|' read -r layers pairs T backend workers first n <<< "$row"
  group="mqar, paper regime, $layers layers, $pairs pairs, T=$T"
  name="L${layers}_T${T}_${backend}_s${first}-$((first + n - 1))"
  PYTHONPATH=/tmp/site:. timeout "$LIMIT" python3 eval.py --task probes --device "${DEVICE:-cuda}" \
    --workers "$workers" "${steps[@]}" --groups "$group" --backends "$backend" --seed "$first" --seeds "$n" \
    "${merge[@]}" --out "$R/$name" > "$R/$name.log" 2>&1 &
done
wait
echo "done ${SECONDS} s"; grep -h "seeds succeed" $R/*.log
cd $OUT && tar czf res.tgz res && rm -rf res
