"""Registers, spills (ptxas -v on the PTX) and the largest SASS loop per iteration (instructions, MUFU, BAR, local
memory ops, HGMMA; benchmarks/kernel_offline.py's counters) of every build under a folder written by offline_builds.py.
usage: python loop_stats.py BUILDS_DIR"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import kernel_offline as ko
root = Path(sys.argv[1])
for p in sorted(root.rglob("sass")):
    n = str(p.parent.relative_to(root))
    usage = ko.ptxas_usage((p.parent / "ptx").read_text())
    loops = ko.sass_loops(p.read_text())
    big = max(loops, key=lambda r: list(r.values())[0]) if loops else {}
    print(n, "| regs, spill st/ld:", usage, "| loops:", len(loops), "| largest loop:", big)
