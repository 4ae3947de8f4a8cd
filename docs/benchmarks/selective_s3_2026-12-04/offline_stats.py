"""Selective's backward kernels compiled offline for sm_90a (the local Triton; the GPU runs 3.6, so these are not its
binaries and nothing is timed): registers, spill stores/loads and the largest SASS loop, with one head per pass
(PAIR off, s2) and two (PAIR on, s3; RELOAD: the first head's per-program tiles loaded per iteration
like the second's), at the GPU's tiles, D = 64, bf16, dot prefix, with and without documents.
usage (repository root): PYTHONPATH=. python docs/benchmarks/selective_s3_2026-12-04/offline_stats.py
It ran against the s3 candidate's kernels (their PAIR and RELOAD constexprs), which were rejected and are not in the
tree (README.md beside this file); on the adopted kernels the PAIR/RELOAD builds fail to compile. Output:
offline_stats.txt."""
import itertools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "docs/benchmarks/dcp_d3_1_offline_2026-12-03"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import offline_builds as ob  # noqa: E402
import kernel_offline as ko  # noqa: E402

ob.HPG = 2  # the heads per program of a pair at H = 12 (value() reads it)
(BT, BN, BM) = ob.GPU_TILES[1]
D, T = 64, ob.T
VARIANTS = ((False, False), (True, False), (True, True))  # (PAIR, RELOAD): s2, pairs, pairs reloading
for kernel, seg, (pair, reload), warps in itertools.product(("bwd_kv", "bwd_q"), (False, True), VARIANTS, (4, 8)):
    cx = {"D": D, "PREC": "tf32", "SEG": seg, "DOT": True, "PAIR": pair, "RELOAD": reload}
    if kernel == "bwd_kv":
        fn, cx, stages = ob.sel._sel_bwd_kv_kernel, dict(cx, BT=BT, BN=BN), 2
    else:
        fn, cx, stages = ob.sel._sel_bwd_q_kernel, dict(cx, BM=BM, BN=BN, RATIO=BM // BT), 3
    res = ob.compile_one((kernel, fn, cx, "bf16", "bf16", D, 0, T // BT, T // BN,
                          {"num_warps": warps, "num_stages": stages}))
    usage = ko.ptxas_usage(res["ptx"])
    loops = ko.sass_loops(res["sass"])
    big = max(loops, key=lambda r: list(r.values())[0]) if loops else {}
    print(f"{kernel} seg{int(seg)} pair{int(pair)} reload{int(reload)} warps{warps} stages{stages} | regs, spill st/ld: {usage} | "
          f"largest loop: {big}", flush=True)
