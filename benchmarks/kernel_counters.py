"""What bounds each attention kernel, from the GPU's hardware counters (Nsight Compute), one forward+backward a method.

    python benchmarks/kernel_counters.py --out DIR [--shape 1x16384] [--methods fpa,sdpa-flash] [--H 12] [--D 64]
    python benchmarks/kernel_counters.py --summarize DIR      # the tables again, from DIR's CSV files

For each method of `benchmarks/attention.py` (the same inputs: bf16, FPA on realistic walks) it runs `ncu --set full`
over one forward+backward after two warm-up steps (the profiled range is cudaProfilerStart/Stop, so Triton's
compilation and the warm-up are not in it), with `--clock-control none` (the clocks stay as the machine sets them).
Written to DIR: `METHOD.ncu-rep` (open it in Nsight Compute), `METHOD.csv` (ncu's raw page: every metric of every
kernel) and, for the FPA kernels, `METHOD_source_KERNEL.csv` (SASS with stall samples per instruction); then
`summary.json` and the printed table: per kernel its time, registers, warps per scheduler (resident and eligible to
issue), the share of cycles in which a scheduler issued, and the warp stall reasons as cycles per issued instruction
(a kernel whose warps mostly wait on one reason is bound by it; docs/kernel.md, section 7, reads them).
Counters slow each kernel down (ncu replays it once per pass), so no time here compares with a timed benchmark's
except `gpu__time_duration`, which ncu measures in its own pass with nothing else collected.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE_KERNELS = ("_fpa_fwd_kernel", "_fpa_bwd_dq_kernel", "_fpa_bwd_dkdv_kernel", "_fpa_field_kernel")
"""The kernels whose per-instruction stall samples are exported (SASS with the source page)."""

STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")
"""ncu's stall reasons: warps stalled for a reason per issued instruction, averaged over the schedulers."""

METRICS = {
    "time_us": "gpu__time_duration.sum",  # in µs whatever unit ncu chose (`TIME_UNITS`)
    "registers": "launch__registers_per_thread",
    "block_size": "launch__block_size",
    "grid_size": "launch__grid_size",
    "blocks_per_sm_limit": "launch__occupancy_limit_registers",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "warps_active_per_scheduler": "smsp__warps_active.avg.per_cycle_active",
    "warps_eligible_per_scheduler": "smsp__warps_eligible.avg.per_cycle_active",
    "issue_active_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "instructions_issued": "smsp__inst_issued.sum",
    "sm_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_throughput_pct": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "tensor_pipe_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "fma_pipe_pct": "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "alu_pipe_pct": "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
    "xu_pipe_pct": "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",  # special functions
}
"""The summary's columns: our name → ncu's metric. A metric this ncu does not report is left out."""

TIME_UNITS = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6,
              "nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}
"""µs per unit: ncu picks a time metric's unit per report (its raw page's second row)."""


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def read_raw(path: Path) -> list[dict[str, str]]:
    """ncu's raw page as rows of {metric: value}: a header row, a units row, then one row per kernel launch. Times
    come back in µs."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header, units = rows[0], rows[1]
    launches = [dict(zip(header, row)) for row in rows[2:] if len(row) == len(header)]
    for metric, unit in zip(header, units):
        if unit in TIME_UNITS:
            for launch in launches:
                value = number(launch[metric])
                if value is not None:
                    launch[metric] = str(value * TIME_UNITS[unit])
    return launches


def kernel_summary(row: dict[str, str]) -> dict:
    """One launch's columns of the summary; the stall reasons sorted, largest first, those under 0.05 left out."""
    out = {"kernel": row.get("Kernel Name", "?")}
    for name, metric in METRICS.items():
        value = number(row.get(metric, ""))
        if value is not None:
            out[name] = round(value, 3)
    stalls = {m.group(1): number(v) for k, v in row.items() if (m := STALL.match(k)) and number(v) is not None}
    out["stalls_per_issue"] = {k: round(v, 3) for k, v in sorted(stalls.items(), key=lambda kv: -kv[1]) if v >= 0.05}
    return out


def summarize(folder: Path, methods: list[str]) -> dict:
    summary = {}
    for method in methods:
        raw = folder / f"{method}.csv"
        if raw.exists():
            summary[method] = [kernel_summary(row) for row in read_raw(raw)]
    return summary


def print_tables(summary: dict) -> None:
    print("| method | kernel | µs | regs | warps/scheduler resident, eligible | issue % | tensor / fma / xu pipe % "
          "| top stalls (cycles per issued instruction) |")
    print("|---|---|---|---|---|---|---|---|")
    for method, kernels in summary.items():
        for k in kernels:
            if k.get("time_us", 0) < 5:
                continue  # the small glue kernels
            get = lambda name: k.get(name, float("nan"))  # noqa: E731  (a metric this ncu lacks prints as nan)
            stalls = ", ".join(f"{name} {v:.2f}" for name, v in list(k["stalls_per_issue"].items())[:5])
            pipes = " / ".join(f"{get(p):.0f}" for p in ("tensor_pipe_pct", "fma_pipe_pct", "xu_pipe_pct"))
            print(f"| {method} | {k['kernel'][:48]} | {get('time_us'):.0f} | {k.get('registers', '?')} | "
                  f"{get('warps_active_per_scheduler'):.2f}, {get('warps_eligible_per_scheduler'):.2f} | "
                  f"{get('issue_active_pct'):.1f} | {pipes} | {stalls} |")


def target(args) -> None:
    """Inside ncu: warm up, then one profiled forward+backward of one method."""
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from attention import make_methods

    B, T = map(int, args.shape.split("x"))
    f, leaves = make_methods(B, T, args.H, args.D, "cuda")[args.methods]()
    do = torch.randn(B, T, args.H, args.D, device="cuda", dtype=torch.bfloat16)

    def step():
        for t in leaves:
            t.grad = None
        f().backward(do)

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def run_ncu(args, folder: Path, method: str) -> None:
    ncu = shutil.which("ncu")
    if ncu is None:
        raise SystemExit("kernel_counters: ncu (Nsight Compute) is not on the PATH")
    report = folder / f"{method}.ncu-rep"
    cmd = [ncu, "--profile-from-start", "off", "--clock-control", "none", "--set", "full", "--import-source", "no",
           "--target-processes", "all", "-f", "-o", str(report.with_suffix("")),
           sys.executable, __file__, "--target", "--shape", args.shape, "--methods", method,
           "--H", str(args.H), "--D", str(args.D)]
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    with open(folder / f"{method}.csv", "w") as f:
        subprocess.run([ncu, "--import", str(report), "--page", "raw", "--csv"], check=True, stdout=f)
    if method.startswith("fpa"):
        for kernel in SOURCE_KERNELS:
            with open(folder / f"{method}_source_{kernel.strip('_')}.csv", "w") as f:
                subprocess.run([ncu, "--import", str(report), "--page", "source", "--csv", "--print-source", "sass",
                                "--kernel-name", kernel], stdout=f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--summarize", type=Path, metavar="DIR", help="print DIR's tables again from its CSV files")
    ap.add_argument("--shape", default="1x16384", help="B x T")
    ap.add_argument("--methods", default="fpa,sdpa-flash", help="methods of benchmarks/attention.py, comma-separated")
    ap.add_argument("--H", type=int, default=12)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--target", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.target:
        return target(args)
    methods = args.methods.split(",")
    if args.summarize:
        folder = args.summarize
        methods = sorted(p.stem for p in folder.glob("*.csv") if "_source_" not in p.stem)
    elif args.out:
        folder = args.out
        folder.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("PYTHONPATH", ".")
        for method in methods:
            run_ncu(args, folder, method)
    else:
        ap.error("give --out DIR (to measure) or --summarize DIR")
    summary = summarize(folder, methods)
    written = folder / "summary.json"
    shape = json.loads(written.read_text())["shape"] if args.summarize and written.exists() else args.shape
    written.write_text(json.dumps({"shape": shape, "kernels": summary}, indent=1))
    print_tables(summary)


if __name__ == "__main__":
    main()
