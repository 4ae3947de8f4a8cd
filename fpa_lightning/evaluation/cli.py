"""Command line of ``eval.py``: parse, check, load the checkpoint(s), run one task, write its outputs.

The data come from outside the core: ``main`` takes a factory that builds an ``EvalData`` from ``--data``
(``eval.py`` passes ``datamodules.EvalCorpus``)."""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable

import torch

from fpa_lightning.config import IMPLS
from fpa_lightning.evaluation.checkpoint import CheckpointError, load_decoder
from fpa_lightning.evaluation.data import EvalData
from fpa_lightning.evaluation.report import write_outputs
from fpa_lightning.evaluation.scoring import Runtime
from fpa_lightning.evaluation.tasks import TASKS

# the task-specific options (argparse dests); each task lists the ones it reads, any other one is an error
TASK_SPECIFIC_OPTIONS = sorted(set().union(*(task.options for task in TASKS.values())))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eval.py",
        description="Evaluate a trained checkpoint (optionally paired against a second one).\n\ntasks:\n"
        + "\n".join(f"  {name:12s} {task.description}" for name, task in TASKS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--task", required=True, choices=sorted(TASKS), help="which evaluation to run")
    p.add_argument("--ckpt", help="Lightning checkpoint of model A (every task but probes, which trains its models)")
    p.add_argument("--compare", metavar="CKPT_B", help="checkpoint of model B: same items, paired differences A − B")
    p.add_argument("--data", help="local data: folder (PG-19 / SlimPajama layout), file or glob of "
                   ".jsonl/.jsonl.gz/.jsonl.zst/.parquet with a 'text' field (default: the offline corpus's test split)")
    p.add_argument("--out", help="output folder for the JSON and PNGs (default: eval_results/<task>-<ckpt name>)")
    p.add_argument("--tensorboard", metavar="LOGDIR", help="also log scalars and figures to TensorBoard here")
    p.add_argument("--impl", choices=IMPLS, help="override the attention implementation (e.g. chunked on a CPU "
                   "for a GPU-trained checkpoint); cache_prune always runs chunked")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    p.add_argument("--precision", choices=("32", "bf16"), default="32", help="bf16 = autocast; losses stay float32")
    p.add_argument("--seed", type=int, default=0, help="seed of pass-key prompts and bootstrap resampling")
    p.add_argument("--n-boot", type=int, default=10_000, help="bootstrap resamples")
    p.add_argument("--confidence", type=float, default=0.95, help="interval confidence level")
    p.add_argument("--max-docs", type=int, help="at most this many documents / sequences")
    p.add_argument("--trials", type=int, help="pass-key trials per length (default 100)")
    p.add_argument("--lengths", type=int, nargs="+", help="passkey: prompt lengths (default 3072 4096 8192 16384); "
                   "cache_prune: evaluation lengths (default 2048 8192)")
    p.add_argument("--max-len", type=int, help="pg19_long: tokens scored per book (default 16384)")
    p.add_argument("--buckets", type=int, nargs="+", help="pg19_long: position bucket edges (default: 0 and "
                   "powers of two from ~max_len/64 up to max_len)")
    p.add_argument("--min-tokens", type=int, help="pg19_long: skip books shorter than this (default max_len + 1, "
                   "so every book covers every bucket)")
    p.add_argument("--seq-len", type=int, help="test_loss: sequence length (default: the model's training context)")
    p.add_argument("--batch-size", type=int, help="test_loss: sequences per forward pass (default 4)")
    p.add_argument("--margin", type=float, help="test_loss --compare: non-inferiority margin in nats (default 0.00995)")
    p.add_argument("--thresholds", type=float, nargs="+", help="cache_prune: bias thresholds, the first one also "
                   "for the pass keys (default -10 -20 -5 -2 -1)")
    p.add_argument("--window", type=int, help="cache_prune: sliding window for a checkpoint without a bias "
                   "(default: matched to the compared model's kept fraction)")
    p.add_argument("--passkey-lengths", type=int, nargs="*", help="cache_prune: pass-key lengths under pruning "
                   "(default 8192 16384; none to skip)")
    for name, task in TASKS.items():  # options only one task reads may be defined by that task
        if task.add_arguments is not None:
            task.add_arguments(p.add_argument_group(f"--task {name}"))
    return p


def check_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    for option in TASK_SPECIFIC_OPTIONS:
        if getattr(args, option) is not None and option not in TASKS[args.task].options:
            users = sorted(name for name, task in TASKS.items() if option in task.options)
            parser.error(f"--{option.replace('_', '-')} does not apply to --task {args.task} "
                         f"(used by: {', '.join(users)})")
    for option in ("max_docs", "trials", "max_len", "min_tokens", "seq_len", "batch_size", "window", "n_boot"):
        value = getattr(args, option)
        if value is not None and value < 1:
            parser.error(f"--{option.replace('_', '-')} must be a positive integer, got {value}")
    for option in ("lengths", "passkey_lengths", "buckets"):
        bad = [v for v in getattr(args, option) or [] if v < (0 if option == "buckets" else 2)]
        if bad:
            parser.error(f"--{option.replace('_', '-')} has invalid values {bad}")
    if args.margin is not None and (args.margin <= 0 or args.compare is None):
        parser.error("--margin needs --compare and a positive value (nats)")
    if any(math.isnan(t) for t in args.thresholds or []):
        parser.error("--thresholds must be numbers (use -inf for no pruning)")
    if not 0 < args.confidence < 1:
        parser.error(f"--confidence must be in (0, 1), got {args.confidence}")
    if TASKS[args.task].needs_checkpoint and args.ckpt is None:
        parser.error(f"--task {args.task} needs --ckpt")
    if not TASKS[args.task].needs_checkpoint and (args.ckpt or args.compare):
        parser.error(f"--task {args.task} trains its own models; --ckpt and --compare do not apply")
    needed = TASKS[args.task].impl
    if needed is not None and args.impl not in (None, needed):
        parser.error(f"--task {args.task} runs the {needed} attention path; --impl must be {needed} (or left out)")
    if args.data is not None and not (os.path.exists(args.data) or any(c in args.data for c in "*?[")):
        parser.error(f"--data {args.data!r} does not exist")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: no CUDA device is available")
    return device


def settings(args: argparse.Namespace) -> dict:
    """Every option as given (None = the task's default, resolved values are in the results)."""
    skip = {"task", "ckpt", "compare", "data", "out", "tensorboard"}
    return {k: v for k, v in vars(args).items() if k not in skip}


def main(argv: list[str] | None, data_factory: Callable[[str | None], EvalData]) -> str:
    """Run one evaluation; returns the JSON path. ``data_factory(--data)`` builds the task's data. Errors in
    arguments or checkpoints exit with a message."""
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(args, parser)
    task = TASKS[args.task]
    try:
        device = resolve_device(args.device)
        impl = task.impl or args.impl
        models = [load_decoder(path, device, impl) for path in filter(None, (args.ckpt, args.compare))]
        if task.check is not None:
            task.check(args, models)
    except (CheckpointError, ValueError, RuntimeError) as err:
        parser.error(str(err))
    runtime = Runtime(device, args.precision, args.seed, args.n_boot, args.confidence)
    stem = os.path.splitext(os.path.basename(args.ckpt))[0] if args.ckpt else None
    args.out = args.out or os.path.join("eval_results", f"{args.task}-{stem}" if stem else args.task)
    data = data_factory(args.data)
    started = time.time()
    try:
        output = task.run(args, models, runtime, data)
    except (ValueError, FileNotFoundError, ConnectionError) as err:  # data / length problems, stated by the task
        parser.exit(2, f"{parser.prog}: error: --task {args.task}: {err}\n")
    header = {
        "checkpoint": models[0].describe(device) if models else None,
        "compare": models[1].describe(device) if len(models) == 2 else None,
        "data": data.describe() if "data" in task.options else None,
        "settings": settings(args),
        "device": str(device),
        "seconds": round(time.time() - started, 2),
        "command": " ".join(["eval.py", *(sys.argv[1:] if argv is None else argv)]),
    }
    step = (models[0].global_step or 0) if models else 0
    path = write_outputs(args.out, args.task, header, output, args.tensorboard, step)
    print_summary(output.scalars)
    print(f"{args.task}: wrote {path}")
    return path


def print_summary(scalars: dict[str, float]) -> None:
    """The task's headline numbers (the same scalars TensorBoard gets), one per line."""
    width = max((len(tag) for tag in scalars), default=0)
    for tag, value in scalars.items():
        print(f"{tag:<{width}}  {value:.4f}")
