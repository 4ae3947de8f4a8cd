"""offline_builds.py on a subset (bf16 q, GPU default tiles, D = 64 and 128, r = 32): run with line info on."""
import os
import sys
from pathlib import Path

import offline_builds as o

out = Path(sys.argv[1])
shard = os.environ.get("SHARD")
todo = [b for b in o.builds() if b[0].split("/")[2] == "gpu" and "/bf16/" in b[0]
        and (b[0].split("/")[0] == "sel" and (b[0].endswith("/D64") or b[0].endswith("/D128"))
             or b[0].split("/")[0] == "dcp" and ("/carry" in b[0] or (b[0].endswith("/D64/R32") or b[0].endswith("/D128/R32")))
             and "/tf32/" not in b[0])]
if shard:
    i, n = map(int, shard.split("/"))
    todo = todo[i::n]
for b in todo:
    r = o.compile_one(b)
    d = out / b[0]
    d.mkdir(parents=True, exist_ok=True)
    for k, t in r.items():
        (d / k).write_text(t)
    print(b[0], flush=True)
