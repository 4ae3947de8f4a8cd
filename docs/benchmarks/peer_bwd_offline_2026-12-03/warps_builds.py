"""DCP's default backward builds (as offline_builds.py's "gpu" builds: bf16 q, fp32 interaction inputs, tf32x3 bias
sums, dot prefix, no documents, D = 64, r = 32) compiled with 8 warps instead of 4, written like offline_builds.py
under OUT/dcp/<kernel>/warps8/... . usage: PYTHONPATH=. python warps_builds.py OUT"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dcp_d3_1_offline_2026-12-03"))
import offline_builds as ob  # noqa: E402

out = Path(sys.argv[1])
for b in ob.dcp_builds(ob.GPU_TILES, (("bf16", "fp32"),), ((64, 32),), (True,), (False,), False, "warps8",
                       ("bwd_kv", "bwd_q")):
    name, fn, cx, qkv, inter, D, R, nT, nJ, launch = b
    res = ob.compile_one((name, fn, cx, qkv, inter, D, R, nT, nJ, dict(launch, num_warps=8)))
    (out / name).mkdir(parents=True, exist_ok=True)
    for kind, text in res.items():
        (out / name / kind).write_text(text)
