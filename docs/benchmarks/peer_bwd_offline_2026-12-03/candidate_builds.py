"""DCP's default forward and backward builds (D = 64, r = 32, bf16 q, fp32 interaction inputs, dot prefix, no
documents) with the bias sums in BPREC = "tf32x2", the candidate benchmarks/candidates/dcp_tf32x2.patch's default.
Run in a tree with the patch applied: PYTHONPATH=. python candidate_builds.py OUT"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dcp_d3_1_offline_2026-12-03"))
import offline_builds as ob  # noqa: E402

out = Path(sys.argv[1])
for b in ob.dcp_builds(ob.GPU_TILES, (("bf16", "fp32"),), ((64, 32),), (True,), (False,), False, "tf32x2",
                       ("fwd", "bwd_kv", "bwd_q")):
    name, fn, cx, *rest = b
    name = name.replace("tf32x3", "tf32x2")
    res = ob.compile_one((name, fn, dict(cx, BPREC="tf32x2"), *rest))
    (out / name).mkdir(parents=True, exist_ok=True)
    for kind, text in res.items():
        (out / name / kind).write_text(text)
