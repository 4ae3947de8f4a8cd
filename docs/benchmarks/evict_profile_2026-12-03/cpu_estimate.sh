#!/usr/bin/env bash
# cache_prune --real-eviction's announced estimate against the time taken, on the CPU: this tree's calibrate against
# the same tree with calibrate's timed points as before c1eb203 (length / 2 and length; no warm-up at length, no
# pass at the longest item), three runs each, alternating. From the repository root:
#   bash docs/benchmarks/evict_profile_2026-12-03/cpu_estimate.sh CKPT > docs/benchmarks/evict_profile_2026-12-03/cpu_estimate.txt
set -euo pipefail
ckpt=$1; root=$PWD; old=$(mktemp -d); out=$(mktemp -d)
git archive HEAD | tar -x -C "$old"
python - "$old/modules/evaluation/progress.py" <<'PY'
import sys
path = sys.argv[1]
s = open(path).read()
new = """    short, long = (length, longest) if longest is not None and longest > length else (max(2, length // 2), length)
    tiny = min(16, short)
    seconds(tiny)
    seconds(length)
"""
old = """    short, long = max(2, length // 2), length
    tiny = min(16, short)
    seconds(tiny)
"""
assert s.count(new) == 1
open(path, "w").write(s.replace(new, old))
PY
echo "# $(date -u +%FT%TZ), $(nproc)-core CPU, HEAD $(git rev-parse --short HEAD), quickstart checkpoint"
for run in 1 2 3; do
    for tree in "$old" "$root"; do
        name=$([ "$tree" = "$old" ] && echo "calibrate as before c1eb203" || echo "calibrate now")
        (cd "$tree" && PYTHONPATH=. python eval.py --task cache_prune --ckpt "$ckpt" --data "$root/data/corpus/pg19" \
            --real-eviction --thresholds -10 --lengths 512 2048 --max-docs 2 --passkey-lengths --device cpu \
            --out "$out/$run$RANDOM" 2>&1 | grep "took" | sed "s/^/$name, run $run: /")
    done
done
rm -rf "$old" "$out"
