"""Whole-model training throughput on a GPU: tokens/s of the 110M configs, measured in one run.

Each model trains for --steps optimizer steps in bf16-mixed on the offline corpus (the quickstart's text) with the
real LanguageModel and TextDataModule under a Lightning Trainer; tokens/s is counted over the steps after
--warmup (compilation, autotuning and allocator growth stay out), with CUDA synchronised at both ends.

--variants picks what each model runs as: base, compile (model.compile: every block through torch.compile; the
compile time falls in the warm-up), document_mask (attention.document_mask: the batches' segment_ids restrict
attention to each document) and checkpointing (model.activation_checkpointing: every block recomputed in the backward).
The table gives each variant's tokens/s relative to the same model's base run. --activation-checkpointing turns
checkpointing on in every variant. --shape picks the size ladder's shape (docs/training.md, "The size ladder").

A variant that fails (compilation, memory) is reported and the others still run: its traceback, a FAILED line
after the table, a `failed` list in the JSON (written after every run) and exit status 1.

--mfu adds the model TFLOP/s and MFU (fpa_lightning/analysis/flops.py: the FLOPs per training token of the model and
length, over the device's peak dense bf16 FLOP/s from its name, or --peak-tflops) as two more columns.

--tile-census (with --skip, FPA alone) adds, after training, each layer's and each head's fraction of the 64 × 64
tiles that the skip keeps on one batch of its own fields: what the skip can save on this model at this point of
training.

    python benchmarks/train_throughput.py --configs fpa fox sdpa --steps 300 --batch-size 16
    python benchmarks/train_throughput.py --configs fpa fox sdpa --variants base compile document_mask
    python benchmarks/train_throughput.py --configs fpa selective dcp --batch-size 1 --seq-len 16384 --steps 40
    python benchmarks/train_throughput.py --configs fpa fox sdpa --steps 60 --warmup 20 --mfu
    python benchmarks/train_throughput.py --configs fpa sdpa --variants base checkpointing --batch-size 1 --seq-len 16384
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
import traceback

import lightning as L
import torch

from datamodules import TextDataModule
from fpa_lightning import AttentionConfig, ModelConfig
from fpa_lightning.analysis.flops import mfu, peak_tflops, training_flops_per_token
from modules.language_model import LanguageModel, OptimConfig


class StepTimer(L.Callback):
    """Wall time between the end of step `warmup` and the end of the last step, CUDA synchronised. With
    `profile_steps`, the steps after those are profiled too (CUDA time per kernel group, after the timing ends)."""

    def __init__(self, warmup: int, profile_steps: int = 0, profile_top: int = 3):
        self.warmup, self.start, self.end, self.timed_steps = warmup, None, None, 0
        self.profile_steps, self.profiler, self.kernel_ms = profile_steps, None, {}
        self.profile_top = profile_top
        self.top_kernels: dict[str, list[tuple[str, float]]] = {}  # group -> its costliest kernels (name, ms/step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step < self.warmup:
            return
        torch.cuda.synchronize()
        if self.start is None:
            self.start = time.perf_counter()
        elif self.profiler is None:
            self.end, self.timed_steps = time.perf_counter(), self.timed_steps + 1
        if self.profile_steps and step == trainer.max_steps - self.profile_steps:
            from torch.profiler import ProfilerActivity, profile

            self.profiler = profile(activities=[ProfilerActivity.CUDA])
            self.profiler.__enter__()

    def on_train_end(self, trainer, pl_module):
        if self.profiler is None:
            return
        torch.cuda.synchronize()
        self.profiler.__exit__(None, None, None)
        members: dict[str, list[tuple[str, float]]] = {}
        for event in self.profiler.key_averages():
            group, ms = kernel_group(event.key), event.device_time_total / 1e3 / self.profile_steps
            self.kernel_ms[group] = self.kernel_ms.get(group, 0.0) + ms
            members.setdefault(group, []).append((event.key[:90], round(ms, 2)))
        # printed beside the groups, so that a kernel the name rules put in the wrong group shows
        self.top_kernels = {g: sorted(k, key=lambda item: -item[1])[:self.profile_top]
                            for g, k in sorted(members.items())}


def kernel_group(name: str) -> str:
    """Coarse groups of CUDA kernels for the per-step profile: attention forward / backward, matmuls, the rest."""
    low = name.lower()
    if any(word in low for word in ("_fpa_", "flash", "fmha", "attention", "flex", "sdpa", "attn")):
        backward = ("bwd", "backward", "bprop", "_dq", "dkdv", "field", "dipsum", "dphi")
        return "attention (" + ("backward" if any(word in low for word in backward) else "forward") + ")"
    if "gemm" in low or "matmul" in low or "sm90_xmma" in low or "cutlass" in low or "nvjet" in low:
        return "matmuls"
    return "other"


VARIANTS = ("base", "compile", "document_mask", "checkpointing")
# (n_layer, d_model, n_head, d_mlp): the 110M configs and the size ladder's rungs (configs/base/ladder_*.yaml)
SHAPES = {"110m": (12, 768, 12, 2048), "350m": (24, 1024, 16, 2816), "760m": (24, 1536, 24, 4096),
          "1b": (24, 2048, 16, 4096)}


def measure(backend: str, variant: str, args) -> dict:
    # one initialisation for every run: the variants of one model (checkpointing above all) then end at comparable
    # losses, where before each run drew its weights from wherever the previous run had left the generator
    L.seed_everything(0, verbose=False)
    attention = AttentionConfig(backend=backend, skip_threshold=args.skip if backend == "fpa" else None,
                                document_mask=variant == "document_mask")
    n_layer, d_model, n_head, d_mlp = SHAPES[args.shape]
    config = ModelConfig(attention=attention, max_seq_len=max(ModelConfig.max_seq_len, args.seq_len), n_layer=n_layer,
                         d_model=d_model, n_head=n_head, d_mlp=d_mlp,
                         activation_checkpointing=variant == "checkpointing" or args.activation_checkpointing)
    module = LanguageModel(model=config, optim=OptimConfig(warmup_steps=50), compile=variant == "compile")
    data = TextDataModule(
        source="offline", tokenizer=args.tokenizer, seq_len=args.seq_len, batch_size=args.batch_size,
        num_workers=args.workers,
    )
    timer = StepTimer(args.warmup, args.profile_steps, args.profile_top)
    trainer = L.Trainer(
        accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=args.steps, gradient_clip_val=1.0,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, limit_val_batches=0,
        callbacks=[timer], enable_model_summary=False,
    )
    trainer.fit(module, datamodule=data)
    census = tile_census(module.model, data, args.skip) if args.tile_census else None
    tokens = timer.timed_steps * args.batch_size * data.seq_len
    seconds = timer.end - timer.start
    throughput = {}
    if args.mfu:  # model FLOPs (checkpointing's recomputation is not counted), over one device's peak
        flops = training_flops_per_token(config, data.seq_len)
        throughput = {"flops_per_token": flops, "tflops_per_s": tokens / seconds * flops / 1e12,
                      "mfu": None if args.peak is None else mfu(tokens / seconds, flops, args.peak)}
    return {
        "backend": backend,
        "variant": variant,
        "impls": sorted(set(module.hparams["attention_impls"])),  # what ran, as recorded by the module
        "params_M": round(module.model.num_parameters() / 1e6, 2),
        "timed_steps": timer.timed_steps,
        "tokens_per_s": tokens / seconds,
        "final_train_loss": float(trainer.callback_metrics.get("train/loss", float("nan"))),
        "peak_mem_GiB": torch.cuda.max_memory_allocated() / 2**30,
        "cuda_ms_per_step": {k: round(v, 2) for k, v in sorted(timer.kernel_ms.items())},
        "top_kernels": timer.top_kernels,
        "activation_checkpointing": config.activation_checkpointing,
        **({"kept_tiles": census} if census is not None else {}),
        **throughput,
    }


def tile_census(model, data, threshold: float) -> dict:
    """After training: on one batch of the training data, per layer, the fraction of off-diagonal 64 × 64 tiles
    whose largest bias is ≥ threshold (what skipping at that threshold computes; fpa_lightning/analysis/tiles.py),
    from the probe path's fields, each head's too (a head whose walk never dips keeps every tile), and the mean
    over layers."""
    from fpa_lightning.analysis.tiles import kept_tile_fraction

    start = time.perf_counter()
    input_ids = next(iter(data.train_dataloader()))["input_ids"].to(next(model.parameters()).device)
    print(f"tile census: one batch loaded in {time.perf_counter() - start:.1f} s", flush=True)

    def block_done(i):  # the probe's pass through each block, timed: at 1 x 16384 it has stalled before now
        return lambda *_: print(f"tile census: probe through block {i + 1}/{len(model.blocks)} at "
                                f"{time.perf_counter() - start:.1f} s", flush=True)

    hooks = [block.register_forward_hook(block_done(i)) for i, block in enumerate(model.blocks)]
    try:
        probes = model.probe(input_ids)
    finally:
        for hook in hooks:
            hook.remove()
    print(f"tile census: the probe path's fields at {time.perf_counter() - start:.1f} s", flush=True)
    per_layer, per_head = [], []
    for i, probe in enumerate(probes):
        heads = kept_tile_fraction(probe, threshold)  # (H or 1,)
        per_layer.append(heads.mean().item())
        per_head.append([round(f, 4) for f in heads.tolist()])
        print(f"tile census: layer {i + 1}/{len(probes)} keeps {per_layer[-1]:.3f} (heads {min(per_head[-1]):.3f} "
              f"to {max(per_head[-1]):.3f}; {time.perf_counter() - start:.1f} s)", flush=True)
    return {"threshold": threshold, "per_layer": [round(f, 4) for f in per_layer], "per_head": per_head,
            "mean": round(sum(per_layer) / len(per_layer), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=["fpa", "fox", "sdpa"])
    parser.add_argument("--variants", nargs="+", default=["base"], choices=VARIANTS)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=2048,
                        help="tokens per sequence (16384 with --batch-size 1: the peers' long-context memory)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--skip", type=float, default=None, help="FPA dead-block skip threshold (None = exact)")
    parser.add_argument("--tokenizer", default=None, help="a tokenizer.json (machines without mistral-common)")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--shape", default="110m", choices=SHAPES, help="the model's shape (default: the 110M configs)")
    parser.add_argument("--activation-checkpointing", action="store_true",
                        help="model.activation_checkpointing in every variant (the checkpointing variant: only there)")
    parser.add_argument("--mfu", action="store_true", help="add model TFLOP/s and MFU columns")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="peak dense bf16 TFLOP/s of the GPU for --mfu (default: from its name; unknown: no MFU)")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="profile the last N steps (after the timed ones): CUDA ms per step by kernel group, "
                             "which says what bounds FPA against softmax")
    parser.add_argument("--profile-top", type=int, default=3,
                        help="with --profile-steps: how many of each group's costliest kernels to list")
    parser.add_argument("--tile-census", action="store_true",
                        help="with --skip and FPA: after training, each layer's fraction of 64 x 64 tiles that the "
                             "skip keeps, on one batch (what the skip can save on the model's own fields)")
    args = parser.parse_args()
    if args.tile_census and (args.skip is None or args.configs != ["fpa"]):
        parser.error("--tile-census counts the tiles FPA's skip keeps: pass --skip and --configs fpa")
    if not torch.cuda.is_available():
        raise SystemExit("train_throughput.py measures GPU training: no CUDA device is available")
    torch.backends.cuda.matmul.allow_tf32 = True
    args.peak = args.peak_tflops or peak_tflops(torch.cuda.get_device_name())
    if args.mfu and args.peak is None:
        print(f"unknown device {torch.cuda.get_device_name()!r}: MFU not reported, pass --peak-tflops", flush=True)
    runs = []  # every (backend, variant): a measurement, or the error that stopped it
    for backend in args.configs:
        for variant in args.variants:
            torch.cuda.reset_peak_memory_stats()
            runs.append(measure_or_error(backend, variant, args))
            print(json.dumps(runs[-1]), flush=True)
            write_json(args, runs)  # after every run: a call stopped by its time limit keeps what finished
    results = [r for r in runs if "error" not in r]
    base = {r["backend"]: r["tokens_per_s"] for r in results if r["variant"] == "base"}
    print(f"\n{torch.cuda.get_device_name()} | torch {torch.__version__} | lightning {L.__version__} | "
          f"python {platform.python_version()} | {datetime.date.today()} | B={args.batch_size}x{args.seq_len}, "
          f"{args.steps} steps, timed after {args.warmup}"
          + (f" | peak {args.peak} TFLOP/s (dense bf16)" if args.mfu and args.peak else ""))
    mfu_header, mfu_rule = (" TFLOP/s | MFU |", "---|---|") if args.mfu else ("", "")
    print("| model | variant | impl | tokens/s | vs base | vs sdpa | vs fox | peak GiB | loss at end |" + mfu_header)
    print("|---|---|---|---|---|---|---|---|---|" + mfu_rule)
    for r in results:
        rel = lambda ref: f"{r['tokens_per_s'] / base[ref]:.3f}x" if ref in base else "-"
        mfu_cells = ""
        if args.mfu:
            mfu_cells = f" {r['tflops_per_s']:.1f} | " + ("-" if r["mfu"] is None else f"{100 * r['mfu']:.1f} %") + " |"
        print(f"| {r['backend']}_{args.shape} | {r['variant']} | {','.join(r['impls'])} | {r['tokens_per_s']:,.0f} | "
              f"{rel(r['backend'])} | {rel('sdpa')} | {rel('fox')} | {r['peak_mem_GiB']:.1f} | "
              f"{r['final_train_loss']:.3f} |" + mfu_cells)
    if args.profile_steps:
        print("\nCUDA ms per step by kernel group (torch.profiler, the last --profile-steps steps):")
        for r in results:
            groups = ", ".join(f"{k} {v:.1f}" for k, v in r["cuda_ms_per_step"].items())
            print(f"  {r['backend']} {r['variant']}: {groups}")
            for group, kernels in r["top_kernels"].items():
                print(f"    {group}: " + "; ".join(f"{name} {ms:.2f}" for name, ms in kernels))
    for r in results:
        if "kept_tiles" in r:
            census = r["kept_tiles"]
            print(f"\n{r['backend']} {r['variant']}: tiles kept at {census['threshold']}, per layer: "
                  + " ".join(f"{f:.3f}" for f in census["per_layer"]) + f"; mean {census['mean']:.3f}")
    failed = [r for r in runs if "error" in r]
    for r in failed:
        print(f"FAILED {r['backend']}_{args.shape} {r['variant']}: {r['error']}")
    if failed:
        raise SystemExit(1)


def measure_or_error(backend: str, variant: str, args) -> dict:
    """measure(), or what stopped it: a variant that fails (an Inductor error, memory) must not lose the other
    variants' numbers. The traceback goes to stderr, the error into the results, and the script exits non-zero."""
    try:
        return measure(backend, variant, args)
    except Exception as error:  # every failure is reported: the table's FAILED lines, the JSON, the exit status
        traceback.print_exc()
        torch._dynamo.reset()  # a failed compilation must not leave its caches to the next variant
        first_line = (str(error).splitlines() or [""])[0]
        return {"backend": backend, "variant": variant, "error": f"{type(error).__name__}: {first_line}"[:500]}


def write_json(args, runs: list[dict]) -> None:
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": [r for r in runs if "error" not in r], "failed": [r for r in runs if "error" in r],
                       "args": vars(args)}, f, indent=1)


if __name__ == "__main__":
    main()
