"""The tables of benchmarks/multi_gpu.sh, from its results folder (markdown, for BENCHMARKS.md).

    python benchmarks/multi_gpu_summary.py RESULTS
    python benchmarks/multi_gpu_summary.py --compare-resume RESULTS/resume/fpa_110m   # straight vs resumed run
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch


def read_ranks(folder: pathlib.Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("rank*.json"))]


def per_gpu(ranks: list[dict]) -> float:
    """Mean tokens/s of one rank (each rank counts its own tokens)."""
    return sum(r["tokens_per_s"] for r in ranks) / len(ranks)


def peak(ranks: list[dict]) -> str:
    return " / ".join(f"{r['peak_mem_GiB']:.1f}" for r in ranks)


def throughput_table(results: pathlib.Path) -> list[str]:
    rows = []
    for name in ("compile", "document_mask"):
        path = results / f"{name}.json"
        rows += json.loads(path.read_text())["results"] if path.exists() else []
    if not rows:
        return []
    base = {r["backend"]: r["tokens_per_s"] for r in rows if r["variant"] == "base"}
    out = ["| model | variant | impl | tokens/s | vs base | peak GiB |", "|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['tokens_per_s'] / base[r['backend']]:.3f}x" if r["backend"] in base else "-"
        out.append(f"| {r['backend']}_110m | {r['variant']} | {','.join(r['impls'])} | {r['tokens_per_s']:,.0f} | "
                   f"{ratio} | {r['peak_mem_GiB']:.1f} |")
    return out


def scaling_table(folder: pathlib.Path, model: str) -> list[str]:
    runs = {name: read_ranks(folder / name) for name in ("one_gpu", "ddp", "fsdp")}
    runs = {name: ranks for name, ranks in runs.items() if ranks}
    if "one_gpu" not in runs:
        return []
    single = per_gpu(runs["one_gpu"])
    out = [f"| {model} | GPUs | tokens/s per GPU | scaling efficiency | tokens/s in all | peak GiB per GPU |",
           "|---|---|---|---|---|---|"]
    for name, ranks in runs.items():
        out.append(f"| {name} | {len(ranks)} | {per_gpu(ranks):,.0f} | {per_gpu(ranks) / single:.3f} | "
                   f"{per_gpu(ranks) * len(ranks):,.0f} | {peak(ranks)} |")
    return out


def summary(results: pathlib.Path) -> str:
    lines = ["machine: " + (results / "machine.txt").read_text().replace("\n", " | ").strip(" |"), "",
             "| part | exit code | seconds |", "|---|---|---|"]
    for line in (results / "parts.txt").read_text().splitlines():
        fields = dict(f.split("=") for f in line.split()[1:] if "=" in f)
        lines.append(f"| {line.split()[0]} | {fields.get('rc', '-')} | {fields.get('seconds', '-')} |")
    for title, table in (
        ("whole-model tokens/s, one GPU (compile, document masking)", throughput_table(results)),
        ("fpa_110m across GPUs (batch 16 x 2048 per GPU)", scaling_table(results / "scaling", "fpa_110m")),
        ("fpa_1b (batch 8 x 2048 per GPU): memory", scaling_table(results / "memory_1b", "fpa_1b")),
    ):
        if table:
            lines += ["", f"**{title}**", "", *table]
    resume = results / "resume.log"
    if resume.exists():
        lines += ["", *[line for line in resume.read_text().splitlines() if line.startswith("resume:")]]
    return "\n".join(lines)


def compare_resume(run_dir: pathlib.Path) -> int:
    """Straight (version_0) vs resumed (version_1) run: final weights and the losses after the resume."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def final(version: str) -> dict:
        last = max((run_dir / version / "checkpoints").glob("step*.ckpt"), key=lambda p: int(p.stem[4:]))
        return torch.load(last, map_location="cpu", weights_only=True)["state_dict"]

    def losses(version: str) -> dict[int, float]:
        events = EventAccumulator(str(run_dir / version))
        events.Reload()
        return {e.step: e.value for e in events.Scalars("train/loss")}

    a, b = final("version_0"), final("version_1")
    identical = sum(torch.equal(a[k], b[k]) for k in a)
    worst = max(((a[k].float() - b[k].float()).abs().max() / a[k].float().abs().max().clamp_min(1e-12)).item()
                for k in a)
    straight, resumed = losses("version_0"), losses("version_1")
    loss_diff = max(abs(straight[s] - v) for s, v in resumed.items())
    print(f"resume: {identical}/{len(a)} weight tensors bit-identical, worst relative difference {worst:.2e}; "
          f"train/loss after the resume (steps {min(resumed)}-{max(resumed)}): max |difference| {loss_diff:.2e}")
    # Another batch after the resume changes its loss by ~1e-2 (the spread of batch losses); GPU reordering of sums
    # by ~1e-5. Weights are a weaker sign: AdamW can turn a 1e-7 gradient difference into an lr-sized step.
    return 0 if loss_diff < 1e-3 else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="?")
    parser.add_argument("--compare-resume", type=pathlib.Path)
    args = parser.parse_args()
    if args.compare_resume:
        sys.exit(compare_resume(args.compare_resume))
    print(summary(pathlib.Path(args.results)))
