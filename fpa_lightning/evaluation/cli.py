"""Command line of ``eval.py``: parse, check, load the checkpoint(s), run one task, write its outputs.

The data come from outside the core: ``main`` takes a factory that builds an ``EvalData`` from ``--data``
(``eval.py`` passes ``datamodules.EvalCorpus``)."""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import os
import sys
import time
from collections.abc import Callable

import torch

from fpa_lightning.attention.config import IMPLS
from fpa_lightning.evaluation.checkpoint import CheckpointError, LoadedModel, load_decoder
from fpa_lightning.evaluation.data import EvalData
from fpa_lightning.export import load_hf, model_card
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
    p.add_argument("--task", choices=sorted(TASKS), help="which evaluation to run")
    p.add_argument("--export", choices=("hf",), help="instead of a task: write the checkpoint as a transformers "
                   "model folder into --out (safetensors, config.json, the model's code for trust_remote_code, "
                   "tokenizer, model card; needs the hf extra)")
    p.add_argument("--overwrite", action="store_true", help="--export: replace the files of an --out folder that "
                   "already holds some (default: refuse); --task: replace the task's earlier JSON and figures in "
                   "--out (default: an existing result is an error)")
    p.add_argument("--ckpt", help="Lightning checkpoint of model A (every task but probes, which trains its models)")
    p.add_argument("--compare", metavar="CKPT_B", help="checkpoint of model B: same items, paired differences A − B")
    p.add_argument("--data", help="local data: folder (PG-19 / SlimPajama layout), file or glob of "
                   ".jsonl/.jsonl.gz/.jsonl.zst/.parquet with a 'text' field (default: the offline corpus's test split)")
    p.add_argument("--out", help="output folder for the JSON and PNGs (default: eval_results/<task>-<checkpoint>, "
                   "the checkpoint named by its run folder, file name, global step and a hash of its path, plus "
                   "-vs-<checkpoint B> with --compare); an existing result is never replaced without --overwrite")
    p.add_argument("--tensorboard", metavar="LOGDIR", help="also log scalars and figures to TensorBoard here")
    p.add_argument("--tokenizer", help="tokenizer.json (or SentencePiece .model) for prompts and data (default: "
                   "the one the checkpoint was trained with, recorded in it)")
    p.add_argument("--impl", choices=IMPLS, help="override the attention implementation (default: the checkpoint's; "
                   "a fused checkpoint runs chunked on a CPU); cache_prune always runs chunked")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    p.add_argument("--precision", choices=("32", "bf16"), default="32", help="bf16 = autocast; losses stay float32")
    p.add_argument("--seed", type=int, default=0, help="seed of pass-key prompts and bootstrap resampling")
    p.add_argument("--n-boot", type=int, default=10_000, help="bootstrap resamples")
    p.add_argument("--confidence", type=float, default=0.95, help="interval confidence level")
    p.add_argument("--max-docs", type=int, help="at most this many documents / sequences (ruler, babilong: "
                   "documents read for the book haystack, default 16)")
    p.add_argument("--trials", type=int, help="passkey: trials per length; ruler, babilong: items per task and "
                   "length (default 100)")
    p.add_argument("--lengths", type=int, nargs="+", help="passkey: prompt lengths (default 3072 4096 8192 16384); "
                   "cache_prune: evaluation lengths (default 2048 8192); ruler, babilong: default 4096 8192 16384")
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
    p.add_argument("--window", type=int, help="cache_prune, passkey: sliding window for a checkpoint without a bias "
                   "(cache_prune default: matched to the compared model's kept fraction)")
    p.add_argument("--passkey-lengths", type=int, nargs="*", help="cache_prune: pass-key lengths under pruning "
                   "(default 8192 16384; none to skip)")
    for name, task in TASKS.items():  # options only one task reads may be defined by that task
        if task.add_arguments is not None:
            task.add_arguments(p.add_argument_group(f"--task {name}"))
    return p


def check_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if (args.task is None) == (args.export is None):
        parser.error("give one of --task TASK or --export hf")
    if args.export is not None:
        if args.out is None or args.compare is not None:
            parser.error("--export hf writes one checkpoint (--ckpt) into --out DIR; --out is required")
        return
    for option in TASK_SPECIFIC_OPTIONS:
        if getattr(args, option) is not None and option not in TASKS[args.task].options:
            users = sorted(name for name, task in TASKS.items() if option in task.options)
            parser.error(f"--{option.replace('_', '-')} does not apply to --task {args.task} "
                         f"(used by: {', '.join(users)})")
    for option in ("max_docs", "trials", "max_len", "min_tokens", "seq_len", "batch_size", "window", "n_boot",
                   "block_rows"):
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
    skip = {"task", "ckpt", "compare", "data", "out", "overwrite", "tensorboard", "export"}
    return {k: v for k, v in vars(args).items() if k not in skip}


def tokenizer_source(args: argparse.Namespace, models: list[LoadedModel]) -> str | None:
    """--tokenizer, else the tokenizer the checkpoint(s) were trained with (compared checkpoints must agree)."""
    if args.tokenizer is not None:
        return args.tokenizer
    sources = {m.tokenizer for m in models}
    if len(sources) > 1:
        raise ValueError(f"the checkpoints were trained with different tokenizers {sorted(map(str, sources))}: "
                         "paired items need one; choose it with --tokenizer")
    return models[0].tokenizer


def load_data(args: argparse.Namespace, models: list[LoadedModel],
              data_factory: Callable[[str | None, str | None], EvalData]) -> EvalData:
    """The task's data with the checkpoint's tokenizer, which is loaded now so that a missing file fails early."""
    if args.task is not None and not TASKS[args.task].needs_checkpoint:  # a task that trains its own models (probes) reads no text
        return data_factory(args.data, None)
    source = tokenizer_source(args, models)
    data = data_factory(args.data, source)
    try:
        data.tokenizer
    except (FileNotFoundError, ModuleNotFoundError, ConnectionError) as err:
        origin = "--tokenizer" if args.tokenizer else f"the checkpoint's training tokenizer ({source or 'default'})"
        raise ValueError(f"cannot load {origin}: {err}; give --tokenizer PATH/tokenizer.json (a relative path in a "
                         "checkpoint is relative to the training directory)") from err
    return data


def announce_setup(args: argparse.Namespace, models: list[LoadedModel], data: EvalData, device: torch.device) -> None:
    """Before any work (stderr): what runs on which implementation, the tokenizer, and the data when the task
    reads any, so that no default goes unnoticed."""
    for i, m in enumerate(models):
        impls = sorted(set(m.decoder.attention_impls(device)))
        note = f"; {m.impl_note}" if m.impl_note else ""
        print(f"{'AB'[i]}: {m.path} ({m.backend}, {m.decoder.num_parameters() / 1e6:.1f}M parameters, step "
              f"{m.global_step}): attention {', '.join(impls)} on {device}{note}", file=sys.stderr)
    if not TASKS[args.task].needs_checkpoint:
        return
    described = data.describe()
    print(f"tokenizer: {described['tokenizer']}", file=sys.stderr)
    if "data" in TASKS[args.task].options:
        print(f"data: {described['source']}", file=sys.stderr)
    sys.stderr.flush()


def export(model: LoadedModel, data: EvalData, out_dir: str, impl: str | None, overwrite: bool) -> str:
    """``--export hf``: write the transformers folder (``fpa_lightning.hf.export``), reload it with our loader and
    with transformers and check that both give identical logits; returns ``out_dir``. The exported config keeps the
    implementation the model was trained with (``impl`` overrides it)."""
    try:
        from fpa_lightning.hf.export import save_export
        from fpa_lightning.hf.modeling import FPAForCausalLM
    except ImportError as err:
        raise ValueError(f"--export hf needs transformers: pip install -e \".[hf]\" ({err})") from err
    tokenizer = data.describe()["tokenizer"]
    card = model_card(model.decoder, os.path.abspath(model.path), model.global_step, model.training,
                      model.training.get("attention_impls"), tokenizer)
    trained = model.training["hyper_parameters"]["model"]["attention"]["impl"]
    cfg = model.decoder.cfg
    cfg = dataclasses.replace(cfg, attention=dataclasses.replace(cfg.attention, impl=impl or trained))
    paths = save_export(model.decoder, out_dir, card, data.tokenizer, data.bos_id, data.eos_id, cfg, overwrite)
    device = next(model.decoder.parameters()).device
    ids = torch.randint(3, cfg.vocab_size, (1, min(64, cfg.max_seq_len)), device=device)
    ours = load_hf(out_dir, device, model.decoder.cfg.attention.impl)
    config = FPAForCausalLM.config_class.from_pretrained(out_dir)
    config.attention["impl"] = model.decoder.cfg.attention.impl
    theirs = FPAForCausalLM.from_pretrained(out_dir, config=config).to(device).eval()
    with torch.no_grad():
        logits = model.decoder(ids)
        if not (torch.equal(logits, ours(ids)) and torch.equal(logits, theirs(ids).logits)):
            raise RuntimeError(f"{out_dir}: the reloaded export gives different logits")  # a bug: stop loudly
    code = [p for name, p in paths.items() if name.endswith(".py")]
    for name, path in paths.items():
        if not name.endswith(".py"):
            print(f"export: {path}")
    print(f"export: {len(code)} source files for trust_remote_code=True, copied from the installed fpa_lightning")
    print(f"export: reloaded with fpa_lightning.export.load_hf and with transformers (FPAForCausalLM): identical "
          f"logits on {ids.shape[1]} tokens")
    return out_dir


def main(argv: list[str] | None, data_factory: Callable[[str | None, str | None], EvalData]) -> str:
    """Run one evaluation (or an export); returns the JSON path (the export folder). ``data_factory(--data,
    tokenizer)`` builds the task's data. Errors in arguments or checkpoints exit with a message."""
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(args, parser)
    try:
        device = resolve_device(args.device)
        if args.export is not None:
            model = load_decoder(args.ckpt, device, args.impl)
            return export(model, load_data(args, [model], data_factory), args.out, args.impl, args.overwrite)
        task = TASKS[args.task]
        impl = task.impl or args.impl
        models = [load_decoder(path, device, impl) for path in filter(None, (args.ckpt, args.compare))]
        if task.check is not None:
            task.check(args, models)
        data = load_data(args, models, data_factory)
    except (CheckpointError, ValueError, RuntimeError) as err:
        parser.error(str(err))
    runtime = Runtime(device, args.precision, args.seed, args.n_boot, args.confidence)
    args.out = args.out or default_out(args.task, models)
    overwrite = args.overwrite or task.resumes
    if not overwrite:
        existing = existing_outputs(args.out, args.task)
        if existing:
            parser.error(f"{existing[0]} exists (an earlier result): pass --overwrite to replace it, or choose "
                         "another --out")
    data = DataErrors(data, args.data)
    announce_setup(args, models, data, device)
    started = time.time()
    try:
        output = task.run(args, models, runtime, data)
    except (ValueError, FileNotFoundError, ConnectionError) as err:  # data / length problems, stated by the task
        parser.exit(2, f"{parser.prog}: error: --task {args.task}: {err}\n")
    header = {
        "checkpoint": models[0].describe(device) if models else None,
        "compare": models[1].describe(device) if len(models) == 2 else None,
        "data": data.describe() if "data" in task.options else None,
        "tokenizer": data.describe()["tokenizer"] if task.needs_checkpoint else None,
        "settings": settings(args),
        "device": str(device),
        "seconds": round(time.time() - started, 2),
        "command": " ".join(["eval.py", *(sys.argv[1:] if argv is None else argv)]),
    }
    step = (models[0].global_step or 0) if models else 0
    try:
        path = write_outputs(args.out, args.task, header, output, args.tensorboard, step, overwrite=overwrite)
    except FileExistsError as err:  # written meanwhile by another run: still nothing is replaced
        parser.exit(2, f"{parser.prog}: error: {err}; pass --overwrite to replace it, or choose another --out\n")
    print(output.table) if output.table is not None else print_summary(output.scalars)
    print(f"{args.task}: wrote {path}")
    return path


def checkpoint_tag(model: LoadedModel) -> str:
    """A checkpoint's name in a default output folder: its run folder (Lightning's ``<name>/version_N`` above
    ``checkpoints/``), file name and global step, and a hash of its absolute path, so that two checkpoints never share
    a folder (two runs' ``last.ckpt``, or one file re-saved at another step)."""
    path = os.path.abspath(model.path)
    folder = os.path.dirname(path)
    if os.path.basename(folder) == "checkpoints":
        folder = os.path.dirname(folder)
    run = os.path.basename(folder)
    if run.startswith("version_") and os.path.basename(os.path.dirname(folder)):
        run = f"{os.path.basename(os.path.dirname(folder))}_{run}"
    stem = os.path.splitext(os.path.basename(path))[0]
    step = "" if model.global_step is None else f"-step{model.global_step}"
    digest = hashlib.sha1(path.encode("utf-8")).hexdigest()[:8]
    return "".join(c if c.isalnum() or c in "._=-" else "_" for c in f"{run}-{stem}{step}-{digest}")


def default_out(task: str, models: list[LoadedModel]) -> str:
    """eval_results/<task>-<checkpoint A>[-vs-<checkpoint B>] (eval_results/<task> for a task without one)."""
    name = "-".join([task, *map(checkpoint_tag, models[:1])])
    if len(models) > 1:
        name += f"-vs-{checkpoint_tag(models[1])}"
    return os.path.join("eval_results", name)


def existing_outputs(out_dir: str, task: str) -> list[str]:
    """The files of an earlier result of `task` in `out_dir` (its JSON and figures are named after the task)."""
    if not os.path.isdir(out_dir):
        return []
    return sorted(os.path.join(out_dir, name) for name in os.listdir(out_dir)
                  if os.path.splitext(name)[0] == task and name.endswith((".json", ".png")))


class DataErrors:
    """The task's data, with a KeyError from reading it (a parquet file without the text column) turned into a
    ValueError that names the fix, so that the command line reports it as a data problem in one line."""

    def __init__(self, data: EvalData, option: str | None):
        self._data, self._option = data, option

    def __getattr__(self, name: str):
        return getattr(self._data, name)

    def _error(self, err: KeyError) -> ValueError:
        where = f"--data {self._option}" if self._option else "the default data"
        detail = err.args[0] if err.args else err
        return ValueError(f"{where}: {detail} (eval.py reads the documents' 'text' field: give files whose records "
                          "have one)")

    def texts(self, limit):
        try:
            return self._data.texts(limit)
        except KeyError as err:
            raise self._error(err) from err

    def long_documents(self, tokens, min_tokens, limit):
        try:
            return self._data.long_documents(tokens, min_tokens, limit)
        except KeyError as err:
            raise self._error(err) from err

    def test_sequences(self, seq_len, batch_size, limit):
        try:
            yield from self._data.test_sequences(seq_len, batch_size, limit)
        except KeyError as err:
            raise self._error(err) from err


def print_summary(scalars: dict[str, float]) -> None:
    """The task's headline numbers (the same scalars TensorBoard gets), one per line."""
    width = max((len(tag) for tag in scalars), default=0)
    for tag, value in scalars.items():
        print(f"{tag:<{width}}  {value:.4f}")
