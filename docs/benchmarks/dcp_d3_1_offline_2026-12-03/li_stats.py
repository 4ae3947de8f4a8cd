"""For the builds whose SASS differs with line info: registers / spills (ptxas -v on the PTX) and the SASS loops'
instruction / MUFU / BAR / local / HGMMA counts (benchmarks/kernel_offline.py's), base against patched."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import kernel_offline as ko  # noqa: E402

a, b = Path(sys.argv[1]), Path(sys.argv[2])
same_stats = 0
for p in sorted(b.rglob("sass")):
    n = str(p.parent.relative_to(b))
    if (a / n / "sass").read_bytes() == p.read_bytes():
        continue
    sa, sb = [ko.ptxas_usage((d / n / "ptx").read_text()) for d in (a, b)]
    la, lb = [[tuple(r.values()) for r in ko.sass_loops((d / n / "sass").read_text())] for d in (a, b)]
    ca, cb = [len((d / n / "sass").read_text().splitlines()) for d in (a, b)]
    ok = sa == sb and la == lb
    same_stats += ok
    print(n, "regs/spill st/ld", sa, "->", sb, "| loops", "same" if la == lb else f"{la[:3]} -> {lb[:3]}",
          "| sass lines", ca, "->", cb)
print("differing builds with identical registers, spills and loop counts:", same_stats)
