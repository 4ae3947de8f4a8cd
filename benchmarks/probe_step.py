"""Time and profile one training step of a probe row: every seed of a (group, backend) at once, as
``eval.py --task probes`` trains it (``fpa_lightning.probes.train.train_step``), on a GPU.

Prints, per row: wall ms per step (CUDA synchronised, after --warmup steps), the summed CUDA kernel time per step
from torch.profiler over --profile-steps more steps (kernel time well below the wall time means the step is bound by
launches and host work, not by the GPU), the number of kernels per step, and the costliest kernels.

    python benchmarks/probe_step.py --group "mqar, paper regime, 2 layers, 32 pairs, T=256" --backends fpa sdpa
    python benchmarks/probe_step.py --group "mqar, paper regime, 2 layers, 32 pairs, T=256" --tf32 --json out.json
"""
from __future__ import annotations

import argparse
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

from fpa_lightning.probes.model import variant as probe_variant
from fpa_lightning.probes.train import Budget, draw_minibatches, make_trainee, minibatch_pickers, train_step
from fpa_lightning.probes.train import training_pool
from modules.probes.table import GROUPS


def find_group(label: str):
    matches = [g for g in GROUPS if g.label == label] or [g for g in GROUPS if g.label.startswith(label)]
    if len(matches) != 1:
        raise SystemExit(f"--group {label!r} matches {len(matches)} groups; give one of: "
                         + "; ".join(g.label for g in GROUPS))
    return matches[0]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(group, backend: str, seeds: int, budget: Budget, warmup: int, steps: int, profile_steps: int,
            top: int, device: torch.device) -> dict:
    var = probe_variant(backend)
    pool = training_pool(group.probe, min(budget.pool, 4 * budget.batch), budget.holdout).to(device)
    ensemble, optimizer = make_trainee(group.probe, var, group.shape, list(range(seeds)), budget, device,
                                       group.impl)
    pickers = minibatch_pickers(group.probe, list(range(seeds)))

    def step():
        index = draw_minibatches(pickers, pool.tokens.shape[0], budget.batch, device)
        train_step(ensemble, optimizer, pool.tokens[index], pool.labels[index], var)

    for _ in range(warmup):
        step()
    sync(device)
    started = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    wall_ms = (time.perf_counter() - started) / steps * 1e3
    with profile(activities=[ProfilerActivity.CUDA if device.type == "cuda" else ProfilerActivity.CPU]) as prof:
        for _ in range(profile_steps):
            step()
        sync(device)
    kernels = [e for e in prof.key_averages() if e.device_time_total > 0]
    kernels.sort(key=lambda e: -e.device_time_total)
    per_step = lambda us: round(us / 1e3 / profile_steps, 3)  # noqa: E731
    return {
        "group": group.label, "backend": backend, "seeds": seeds, "batch": budget.batch,
        "tokens_per_step": seeds * budget.batch * pool.tokens.shape[-1],
        "vmapped": ensemble.vmapped, "impl": group.impl,
        "tf32": torch.backends.cuda.matmul.allow_tf32,
        "wall_ms_per_step": round(wall_ms, 3),
        "cuda_ms_per_step": per_step(sum(e.device_time_total for e in kernels)),
        "kernels_per_step": sum(e.count for e in kernels) / profile_steps,
        "peak_mem_GiB": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None,
        "top_kernels": [(e.key[:100], per_step(e.device_time_total), e.count // profile_steps)
                        for e in kernels[:top]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--group", required=True, help="a group label of modules/probes/table.py (or its prefix)")
    parser.add_argument("--backends", nargs="+", help="default: the group's backends")
    parser.add_argument("--seeds", type=int, default=15)
    parser.add_argument("--batch", type=int, default=Budget.batch)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--profile-steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--tf32", action="store_true", help="allow TF32 matmuls (the runner does not)")
    parser.add_argument("--json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("probe_step.py times a GPU step: no CUDA device here")
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    group = find_group(args.group)
    budget = Budget(batch=args.batch)
    rows = []
    for backend in args.backends or group.backends:
        row = measure(group, backend, args.seeds, budget, args.warmup, args.steps, args.profile_steps, args.top,
                      torch.device("cuda"))
        rows.append(row)
        print(f"{row['group']} | {backend}: {row['wall_ms_per_step']:.1f} ms/step wall, "
              f"{row['cuda_ms_per_step']:.1f} ms kernels, {row['kernels_per_step']:.0f} kernels/step, "
              f"vmapped={row['vmapped']}, tf32={row['tf32']}, peak {row['peak_mem_GiB']} GiB", flush=True)
        for name, ms, count in row["top_kernels"]:
            print(f"    {ms:8.3f} ms  x{count:<5d} {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
