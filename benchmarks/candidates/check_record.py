"""One JSON record of a `kernel_check.sh` results folder, so that a call's every number comes back in one small file
(a device call returns a limited number of files; the per-round logs may not all come back) and the record that
benchmarks/results/ keeps is the folder's content, not a copy made by hand.

    python3 benchmarks/candidates/check_record.py RESULTS [--command "..."] [--out RESULTS/record.json]

    python3 benchmarks/candidates/check_record.py RESULTS --kernel-table NAME   # base against NAME, kernel by kernel

It reads RESULTS/tests_*.log (each test process's last line), timing_base_N.log and timing_candidate_NAME_N.log
(benchmarks/attention.py's table and its GPU line, per round), profile_base.log and profile_candidate_NAME.log
(attention.py --profile: CUDA ms of each kernel), same_candidate_NAME.log (same_numbers.py's table) and
attention.log, and writes what, command, machine, versions and date (from attention.py's GPU line) with the numbers.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

GPU_LINE = re.compile(r"GPU (?P<gpu>.+?) \| torch (?P<torch>\S+) \| triton (?P<triton>\S+) \| (?P<when>\S+)")
TIMING_ROW = re.compile(r"\| (\S+) \| (\S+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|")
ROUND_LOG = re.compile(r"timing_(?:base|candidate_(?P<name>.+))_(?P<round>\d+)\.log")
PROFILE_LOG = re.compile(r"profile_(?:base|candidate_(?P<name>.+))\.log")
PROFILE_LINE = re.compile(r"^\s*(?P<shape>\d+x\d+) (?P<method>\S+): kernels (?P<kernels>[\d.]+) ms of a "
                          r"(?P<step>[\d.]+) ms step, \d+ distinct; (?P<rest>.*)$")
KERNEL_MS = re.compile(r"(?P<kernel>.+?) (?P<ms>\d+\.\d{3})(?:, |$)")


def timing(path: Path) -> dict:
    """attention.py's log: its GPU line and one dict per table row."""
    text = path.read_text()
    gpu = GPU_LINE.search(text)
    rows = [{"shape": m[1], "method": m[2], "fwd_ms": float(m[3]), "fwd_vs_flash": float(m[4]),
             "fwd_bwd_ms": float(m[5]), "fwd_bwd_vs_flash": float(m[6]), "peak_mib": float(m[7])}
            for m in TIMING_ROW.finditer(text)]
    return {"gpu_line": gpu.group(0) if gpu else None, "rows": rows}


def same_numbers(path: Path) -> list[dict]:
    """same_numbers.py's table: per variant, each tensor's cell ("same", or the largest difference)."""
    lines = [line for line in path.read_text().splitlines() if line.startswith("|")]
    if len(lines) < 3:
        return []
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")))) for line in lines[2:]]


def profile_text(text: str) -> list[dict]:
    """attention.py --profile's lines: per shape and method, the kernels' summed and the step's CUDA ms and each
    listed kernel's (its name cut at 40 characters, as printed; a name may hold commas, a time never)."""
    found = []
    for line in text.splitlines():
        m = PROFILE_LINE.match(line)
        if m:
            kernels = {k["kernel"]: float(k["ms"]) for k in KERNEL_MS.finditer(m["rest"])}
            found.append({"shape": m["shape"], "method": m["method"], "kernels_ms": float(m["kernels"]),
                          "step_ms": float(m["step"]), "kernels": kernels})
    return found


def profile(path: Path) -> list[dict]:
    """A profile log's lines (``profile_text``)."""
    return profile_text(path.read_text())


def profiles(folder: Path) -> dict[str, list[dict]]:
    """"base" and each candidate's name -> its per-kernel profile."""
    return {m["name"] or "base": profile(path) for path in sorted(folder.glob("profile_*.log"))
            if (m := PROFILE_LOG.fullmatch(path.name))}


def kernel_table(folder: Path, name: str) -> list[str]:
    """Base against one candidate, kernel by kernel: a markdown table of CUDA ms per shape and method."""
    found = profiles(folder)
    base = {(r["shape"], r["method"]): r for r in found.get("base", [])}
    lines = [f"| shape | method | kernel | base ms | {name} ms | change |", "|---|---|---|---|---|---|"]
    for row in found.get(name, []):
        other = base.get((row["shape"], row["method"]), {"kernels": {}})
        for kernel in sorted(set(row["kernels"]) | set(other["kernels"]),
                             key=lambda k: -max(row["kernels"].get(k, 0.0), other["kernels"].get(k, 0.0))):
            b, c = other["kernels"].get(kernel), row["kernels"].get(kernel)
            change = f"{(c / b - 1) * 100:+.1f} %" if b and c else "-"
            cells = [f"{x:.3f}" if x is not None else "-" for x in (b, c)]
            lines.append(f"| {row['shape']} | {row['method']} | {kernel} | {cells[0]} | {cells[1]} | {change} |")
    return lines


def rounds(folder: Path) -> dict[str, list[dict]]:
    """"base" and each candidate's name -> its timing rounds in order."""
    found: dict[str, list[dict]] = {}
    for path in folder.glob("timing_*.log"):
        m = ROUND_LOG.fullmatch(path.name)
        if m:
            found.setdefault(m["name"] or "base", []).append({"round": int(m["round"]), **timing(path)})
    return {name: sorted(runs, key=lambda r: r["round"]) for name, runs in sorted(found.items())}


def record(folder: Path, command: str) -> dict:
    tests = {path.stem: (path.read_text().strip().splitlines() or [""])[-1]
             for path in sorted(folder.glob("tests_*.log"))}
    attention_log = folder / "attention.log"
    attention = timing(attention_log) if attention_log.exists() else {"gpu_line": None, "rows": []}
    timed = rounds(folder)
    gpu_lines = [attention["gpu_line"], *(r["gpu_line"] for runs in timed.values() for r in runs)]
    gpu = next((GPU_LINE.search(line) for line in gpu_lines if line), None)
    if gpu is None:
        raise SystemExit(f"check_record: no GPU line in {folder}'s attention.py logs: nothing ran on a GPU")
    candidates = sorted(name for name in timed if name != "base")
    same = {path.name[len("same_candidate_"):-len(".log")]: same_numbers(path)
            for path in sorted(folder.glob("same_candidate_*.log"))}
    return {
        "what": "benchmarks/kernel_check.sh: the fused kernels' GPU tests on the base and on each candidate's patched "
                "copy, benchmarks/attention.py on the base, then base and candidates alternating in separate "
                f"processes, every ratio to SDPA-flash in the same process; candidates timed: {candidates or 'none'}",
        "command": command,
        "machine": gpu["gpu"],
        "versions": {"torch": gpu["torch"], "triton": gpu["triton"]},
        "date": gpu["when"][:10],
        "tests": tests,
        "same_numbers": same,
        "rounds": timed,
        "per_kernel": profiles(folder),
        "attention": attention,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path, help="a kernel_check.sh results folder")
    ap.add_argument("--command", default="bash benchmarks/kernel_check.sh RESULTS", help="the command that made it")
    ap.add_argument("--out", type=Path, help="where to write (default RESULTS/record.json)")
    ap.add_argument("--kernel-table", metavar="NAME", help="print base against candidate NAME kernel by kernel instead")
    args = ap.parse_args(argv)
    if args.kernel_table:
        print("\n".join(kernel_table(args.results, args.kernel_table)))
        return 0
    out = args.out or args.results / "record.json"
    out.write_text(json.dumps(record(args.results, args.command), indent=1) + "\n")
    print(f"check_record: wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
