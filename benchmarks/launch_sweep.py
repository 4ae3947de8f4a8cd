"""Per-kernel CUDA times of the fused FPA kernels under launch overrides (GPU), one process a setting.

    python3 benchmarks/launch_sweep.py FPA_FIELD_MAXNREG=128 FPA_FWD_STAGES=2 "FPA_DQ_STAGES=2 FPA_DKDV_STAGES=3" \
        [--shapes 8x2048,1x16384] [--methods fpa] [--json results.json]

Each setting (one or more `FPA_<KERNEL>_{WARPS,STAGES,MAXNREG}` or `FPA_{DQ,DKDV}_SUBTILES` assignments, docs/kernel.md
section 2) runs `benchmarks/attention.py --profile` in its own process; the default launch runs first and again last,
so the two default columns show how far a kernel's time moves between processes. A kernel's own time moves far less
than a whole forward+backward's (benchmarks/KERNEL_LOG.md, v9.11), so a launch change to one kernel is read here, in
its own row. It prints one table (a row per shape, method and kernel; a column per setting, in ms) and, with --json,
writes a record (what, command, machine, versions, date, the times). Progress goes to stderr as each process ends.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "candidates"))
from check_record import profile_text  # noqa: E402  (attention.py --profile's lines, parsed once)

SETTING = re.compile(r"FPA_(FWD|DQ|DKDV|FIELD|DIP_CARRY|DIPSUM_BWD|DPHI_SUM)_(WARPS|STAGES|MAXNREG)=\d+"
                     r"|FPA_(DQ|DKDV)_SUBTILES=\d+")
DEFAULT = "default"


def parse_setting(text: str) -> dict[str, str]:
    """One setting's assignments; anything but the launch variables of docs/kernel.md is refused."""
    pairs = text.split()
    bad = [p for p in pairs if not SETTING.fullmatch(p)]
    if bad or not pairs:
        raise SystemExit(f"launch_sweep: not a launch override: {bad or text!r} (FPA_<KERNEL>_WARPS|STAGES|MAXNREG=N "
                         "or FPA_DQ_SUBTILES / FPA_DKDV_SUBTILES=N)")
    return dict(p.split("=", 1) for p in pairs)


def profile_lines(text: str) -> dict[tuple[str, str], dict[str, float]]:
    """(shape, method) -> {kernel: ms} from attention.py --profile's output."""
    return {(row["shape"], row["method"]): row["kernels"] for row in profile_text(text)}


def run_setting(env_update: dict[str, str], shapes: str, methods: str) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if not SETTING.fullmatch(f"{k}=0")}  # no inherited override
    env.update(env_update)
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(ROOT)
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "attention.py"), "--profile", "--shapes", shapes,
                          "--methods", methods], env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"launch_sweep: attention.py failed under {env_update or DEFAULT}:\n{out.stderr[-2000:]}")
    return profile_lines(out.stdout), out.stdout


def table(columns: list[str], times: list[dict]) -> list[str]:
    keys = sorted({(shape, method, kernel) for t in times for (shape, method), ks in t.items() for kernel in ks})
    lines = ["| shape | method | kernel | " + " | ".join(columns) + " |", "|---|---|---|" + "---|" * len(columns)]
    for shape, method, kernel in keys:
        cells = [f"{t[(shape, method)][kernel]:.3f}" if kernel in t.get((shape, method), {}) else "-" for t in times]
        lines.append(f"| {shape} | {method} | {kernel} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("settings", nargs="+", help="launch overrides, one quoted setting per process")
    ap.add_argument("--shapes", default="8x2048,1x16384")
    ap.add_argument("--methods", default="fpa", help="FPA methods of benchmarks/attention.py, comma-separated")
    ap.add_argument("--json", type=Path, help="write the record here")
    args = ap.parse_args(argv)
    settings = [parse_setting(s) for s in args.settings]
    runs = [{}, *settings, {}]
    columns = [DEFAULT, *args.settings, f"{DEFAULT} again"]
    times, start = [], time.time()
    for i, (name, env_update) in enumerate(zip(columns, runs), start=1):
        found, stdout = run_setting(env_update, args.shapes, args.methods)
        times.append(found)
        elapsed = time.time() - start
        print(f"[{i}/{len(runs)}] {name}: {elapsed:.0f} s, about {elapsed / i * (len(runs) - i):.0f} s left",
              file=sys.stderr, flush=True)
    print("\n".join(table(columns, times)))
    if args.json:
        import torch
        import triton

        record = {
            "what": "per-kernel CUDA ms of one fwd+bwd (benchmarks/attention.py --profile, 5 steps) under launch "
                    "overrides, each setting its own process, the default first and last",
            "command": "python3 benchmarks/launch_sweep.py " + " ".join(f"'{s}'" for s in args.settings)
                       + f" --shapes {args.shapes} --methods {args.methods}",
            "machine": torch.cuda.get_device_name(),
            "versions": {"torch": torch.__version__, "triton": triton.__version__},
            "date": datetime.date.today().isoformat(),
            "times_ms": {name: {f"{shape} {method}": ks for (shape, method), ks in t.items()}
                         for name, t in zip(columns, times)},
        }
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
