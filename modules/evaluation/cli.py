"""Command line of ``eval.py``: ``--task TASK`` runs one evaluation (parse, check, load the checkpoint(s), run the
task, write its outputs); the verb ``export`` writes a checkpoint as a transformers folder (``export.py``).

``eval.py --help`` shows the options every task reads and lists the tasks; ``eval.py --task TASK --help`` shows that
task's own options first, then the common ones, and no other task's. The verb ``seeds`` compares two models across
training seeds from per-seed result files (``seeds.py``), as does ``--ckpt A0 A1 ... --compare B0 B1 ...`` after
evaluating each pair. The data come from outside: ``main`` takes a factory that builds an ``EvalData`` from ``--data``
(``eval.py`` passes ``datamodules.EvalCorpus``)."""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections.abc import Sequence

import torch

from fpa_lightning.attention.config import IMPLS
from fpa_lightning.evaluation.checkpoint import CheckpointError, LoadedModel, load_decoder
from fpa_lightning.evaluation.data import EvalData
from fpa_lightning.evaluation.scoring import Runtime
from fpa_lightning.evaluation.seeds import ONE_PAIR_NOTE
from fpa_lightning.generation.rule import check_threshold
from modules.evaluation import export, seeds
from modules.evaluation.inputs import DataFactory, load_data, resolve_device
from modules.evaluation.report import write_outputs
from modules.evaluation.tasks import TASKS

# the task-specific options (argparse dests); each task lists the ones it reads, any other one is an error
TASK_SPECIFIC_OPTIONS = sorted(set().union(*(task.options for task in TASKS.values())))


class _Moved(argparse.Action):
    """The old ``--export hf``: a one-line error that names the verb which replaced it."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(export.MOVED)


class _Options:
    """Where ``build_parser`` puts each option. One that every task reads goes on the parser; a task-specific one only
    when one of the parser's tasks reads it, and for the help of a single task into a group of its own, with the help
    text that task gives it (``Task.option_help``)."""

    def __init__(self, parser: argparse.ArgumentParser, tasks: Sequence[str]):
        self.parser, self.tasks = parser, list(tasks)
        # one task's help lists its own options first (issue #47): its group is made before the common options'
        self.group = parser.add_argument_group(f"--task {tasks[0]}") if len(tasks) == 1 else parser
        self.common = parser.add_argument_group("options of every task") if len(tasks) == 1 else parser

    def add_argument_group(self, title: str) -> _Options:  # Task.add_arguments adds its options here
        return self

    def add_argument(self, *flags: str, **settings) -> None:
        dest = settings.get("dest") or flags[0].lstrip("-").replace("-", "_")
        if dest not in TASK_SPECIFIC_OPTIONS:
            self.common.add_argument(*flags, **settings)
        elif any(dest in TASKS[name].options for name in self.tasks):
            if len(self.tasks) == 1:
                settings["help"] = TASKS[self.tasks[0]].option_help.get(dest, settings.get("help"))
            self.group.add_argument(*flags, **settings)


def build_parser(tasks: Sequence[str] = tuple(TASKS)) -> argparse.ArgumentParser:
    """The options all tasks read and those of `tasks`: every task's to parse a command line; one task's, or none,
    for ``--help``."""
    width = max(map(len, TASKS))
    described = (f"--task {tasks[0]}: {TASKS[tasks[0]].description}" if len(tasks) == 1 else "tasks:\n" + "\n".join(
        f"  {name:{width}s} {task.description}" for name, task in TASKS.items()))
    every = len(tasks) > 1  # the parser of a command line, whose usage would list every task's options
    p = argparse.ArgumentParser(
        prog="eval.py", add_help=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage=("eval.py --task TASK [options] (eval.py --task TASK --help), or eval.py export|seeds" if every else
               f"eval.py --task {tasks[0]} [options]" if tasks else "eval.py --task TASK [options]"),
        description=f"Evaluate a trained checkpoint (optionally paired against a second one).\n\n{described}",
        epilog="eval.py --task TASK --help: the options of TASK. eval.py export --help: the verb that writes a "
        "checkpoint as a transformers model folder. eval.py seeds --help: the verb that compares two models across "
        "training seeds.")
    options = _Options(p, tasks)
    options.common.add_argument("-h", "--help", action="store_true", default=argparse.SUPPRESS,
                                help="show this help (with --task TASK: that task's options first) and exit")
    add_options(options)
    return p


def add_options(p: _Options) -> None:
    p.add_argument("--task", choices=sorted(TASKS), help="which evaluation to run")
    p.add_argument("--export", nargs="?", action=_Moved, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument("--overwrite", action="store_true", help="replace the task's earlier JSON and figures in --out "
                   "(default: an existing result is an error)")
    p.add_argument("--ckpt", nargs="+", metavar="CKPT", help="Lightning checkpoint of model A (every task but probes, "
                   "which trains its models); several (one per training seed) with as many --compare: each pair "
                   "evaluated into OUT/pair<i>, then the seed-level comparison (eval.py seeds) into OUT")
    p.add_argument("--compare", nargs="+", metavar="CKPT_B", help="checkpoint(s) of model B: same items, paired "
                   "differences A − B, paired with --ckpt by position")
    p.add_argument("--data", help="local data: folder (PG-19 / SlimPajama layout), file or glob of "
                   ".jsonl/.jsonl.gz/.jsonl.zst/.parquet with a 'text' field (default: the offline corpus's test split)")
    p.add_argument("--out", help="output folder for the JSON and PNGs (default: eval_results/<task>-<checkpoint>, "
                   "the checkpoint named by its run folder, file name, global step and a hash of its path, plus "
                   "-vs-<checkpoint B> with --compare); an existing result is never replaced without --overwrite")
    p.add_argument("--tensorboard", metavar="LOGDIR", help="also log scalars and figures to TensorBoard here")
    p.add_argument("--tokenizer", help="tokenizer.json (or SentencePiece .model) for prompts and data (default: "
                   "the one the checkpoint was trained with, recorded in it)")
    p.add_argument("--impl", choices=IMPLS, help="override the attention implementation (default: the checkpoint's; "
                   "a fused checkpoint runs chunked on a CPU); cache_prune always runs chunked; probes: every selected group's "
                   "models (default: each group's own, Group.impl), recorded in each row")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    p.add_argument("--precision", choices=("32", "bf16"), default="32", help="bf16 = autocast; losses stay float32")
    p.add_argument("--seed", type=int, default=0, help="seed of pass-key prompts and bootstrap resampling")
    p.add_argument("--n-boot", type=int, default=10_000, help="bootstrap resamples")
    p.add_argument("--confidence", type=float, default=0.95, help="interval confidence level")
    # the options of several tasks (--max-docs, --trials, --lengths, --max-len, --batch-size, --window, --data):
    # each of those tasks says in its Task.option_help what one means for it
    p.add_argument("--max-docs", type=int, help="at most this many documents")
    p.add_argument("--trials", type=int, help="items per length")
    p.add_argument("--lengths", type=int, nargs="+", help="lengths in tokens")
    p.add_argument("--max-len", type=int, help="a length in tokens")
    p.add_argument("--buckets", type=int, nargs="+", help="pg19_long: position bucket edges (default: 0 and "
                   "powers of two from ~max_len/64 up to max_len)")
    p.add_argument("--min-tokens", type=int, help="pg19_long: skip books shorter than this (default max_len + 1, "
                   "so every book covers every bucket)")
    p.add_argument("--seq-len", type=int, help="test_loss: sequence length (default: the model's training context)")
    p.add_argument("--batch-size", type=int, help="inputs per forward pass")
    p.add_argument("--margin", type=float, help="test_loss --compare: non-inferiority margin in nats of the "
                   "seed-level verdict (several --ckpt/--compare pairs, or eval.py seeds; default 0.00995)")
    p.add_argument("--thresholds", type=float, nargs="+", help="cache_prune: bias thresholds, the first one also "
                   "for the pass keys (default -10 -20 -5 -2 -1)")
    p.add_argument("--window", type=int, help="sliding window for a checkpoint without a bias")
    p.add_argument("--passkey-lengths", type=int, nargs="*", help="cache_prune: pass-key lengths under pruning "
                   "(default 8192 16384; none to skip)")
    for name, task in TASKS.items():  # options only one task reads may be defined by that task
        if task.add_arguments is not None:
            task.add_arguments(p.add_argument_group(f"--task {name}"))


def check_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if args.task is None:
        parser.error("give --task TASK (eval.py --help lists the tasks), or the verb export (eval.py export --help)")
    for option in TASK_SPECIFIC_OPTIONS:
        if getattr(args, option) is not None and option not in TASKS[args.task].options:
            users = sorted(name for name, task in TASKS.items() if option in task.options)
            parser.error(f"--{option.replace('_', '-')} does not apply to --task {args.task} "
                         f"(used by: {', '.join(users)})")
    for option in ("max_docs", "trials", "max_len", "min_tokens", "seq_len", "batch_size", "window", "n_boot",
                   "block_rows", "piece_tokens"):
        value = getattr(args, option)
        if value is not None and value < 1:
            parser.error(f"--{option.replace('_', '-')} must be a positive integer, got {value}")
    for option in ("lengths", "passkey_lengths", "buckets"):
        bad = [v for v in getattr(args, option) or [] if v < (0 if option == "buckets" else 2)]
        if bad:
            parser.error(f"--{option.replace('_', '-')} has invalid values {bad}")
    if args.margin is not None and (args.margin <= 0 or args.compare is None):
        parser.error("--margin needs --compare and a positive value (nats)")
    for threshold in args.thresholds or []:
        try:  # the one check every receiver of a prune threshold makes, here before any model is loaded
            check_threshold(threshold)
        except ValueError as error:
            parser.error(f"--thresholds: {error} (use -inf for no pruning)")
    if not 0 < args.confidence < 1:
        parser.error(f"--confidence must be in (0, 1), got {args.confidence}")
    if TASKS[args.task].needs_checkpoint and args.ckpt is None:
        parser.error(f"--task {args.task} needs --ckpt")
    if not TASKS[args.task].needs_checkpoint and (args.ckpt or args.compare):
        parser.error(f"--task {args.task} trains its own models; --ckpt and --compare do not apply")
    if args.ckpt is not None and (len(args.ckpt) > 1 or len(args.compare or []) > 1):
        if len(args.ckpt) != len(args.compare or []):
            parser.error(f"{len(args.ckpt)} --ckpt and {len(args.compare or [])} --compare checkpoints: several "
                         "training seeds need one --compare checkpoint per --ckpt (paired by position)")
        if args.task not in seeds.COMPARING_TASKS:
            parser.error(f"several pairs of checkpoints: --task {args.task} has no seed-level comparison (tasks: "
                         f"{', '.join(seeds.COMPARING_TASKS)})")
    needed = TASKS[args.task].impl
    if needed is not None and args.impl not in (None, needed):
        parser.error(f"--task {args.task} runs the {needed} attention path; --impl must be {needed} (or left out)")
    if args.data is not None and not (os.path.exists(args.data) or any(c in args.data for c in "*?[")):
        parser.error(f"--data {args.data!r} does not exist")


def settings(args: argparse.Namespace) -> dict:
    """Every option as given (None = the task's default, resolved values are in the results)."""
    skip = {"task", "ckpt", "compare", "data", "out", "overwrite", "tensorboard"}
    return {k: v for k, v in vars(args).items() if k not in skip}


def announce_setup(args: argparse.Namespace, models: list[LoadedModel], data: EvalData, device: torch.device,
                   training: list[dict]) -> None:
    """Before any work (stderr): what runs on which implementation, with which training seed, the tokenizer, and the
    data when the task reads any, so that no default goes unnoticed."""
    for i, (m, t) in enumerate(zip(models, training)):
        impls = sorted(set(m.decoder.attention_impls(device)))
        note = f"; {m.impl_note}" if m.impl_note else ""
        print(f"{'AB'[i]}: {m.path} ({m.backend}, {m.decoder.num_parameters() / 1e6:.1f}M parameters, step "
              f"{m.global_step}, training seed {t['seed_everything']}, data seed {t['data_seed']}): attention "
              f"{', '.join(impls)} on {device}{note}", file=sys.stderr)
    if not TASKS[args.task].needs_checkpoint:
        return
    described = data.describe()
    print(f"tokenizer: {described['tokenizer']}", file=sys.stderr)
    if "data" in TASKS[args.task].options:
        print(f"data: {described['source']}", file=sys.stderr)
    sys.stderr.flush()


def main(argv: list[str] | None, data_factory: DataFactory) -> str:
    """Run one evaluation (several pairs, with as many --ckpt as --compare), or the verb ``export`` or ``seeds``;
    returns the JSON path (the export folder; with several pairs the seed comparison's JSON). ``data_factory(--data,
    tokenizer)`` builds the task's data. Errors in arguments or checkpoints exit with a message."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["export"]:
        return export.main(argv[1:], data_factory)
    if argv[:1] == ["seeds"]:
        return seeds.main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if "help" in args:
        build_parser([args.task] if args.task else []).print_help()
        parser.exit()
    check_args(args, parser)
    if args.ckpt is not None and len(args.ckpt) > 1:
        return evaluate_seeds(args, argv, parser, data_factory)
    return evaluate(args, argv, parser, data_factory, (args.ckpt or [None])[0], (args.compare or [None])[0],
                    args.out)


def evaluate_seeds(args: argparse.Namespace, argv: list[str], parser: argparse.ArgumentParser,
                   data_factory: DataFactory) -> str:
    """``--ckpt A0 A1 … --compare B0 B1 …``: each pair (by position; a pair must share its training seed) evaluated
    into OUT/pair<i>, then the seed-level comparison of those paired results (``seeds.compare_files``) into OUT."""
    out = args.out or seeds.default_out(args.task, args.ckpt + args.compare)
    paths = []
    for i, (a, b) in enumerate(zip(args.ckpt, args.compare)):
        print(f"pair {i + 1}/{len(args.ckpt)}: A {a}, B {b}", file=sys.stderr, flush=True)
        paths.append(evaluate(args, argv, parser, data_factory, a, b, os.path.join(out, f"pair{i}"),
                              same_seed=True))
    try:
        return seeds.compare_files(args.task, paths, None, out, args.overwrite, args.margin, args.confidence,
                                   args.n_boot, args.seed, " ".join(["eval.py", *argv]))
    except FileExistsError as err:
        parser.exit(2, f"{parser.prog}: error: {err}; pass --overwrite to replace it, or choose another --out\n")
    except seeds.SeedError as err:
        parser.error(str(err))


def evaluate(args: argparse.Namespace, argv: list[str], parser: argparse.ArgumentParser, data_factory: DataFactory,
             ckpt: str | None, compare: str | None, out: str | None, same_seed: bool = False) -> str:
    """One evaluation of checkpoint `ckpt` (paired with `compare`) into `out`; returns the JSON path. same_seed: the
    two checkpoints must record one training seed (else an error before any compute; a lone pair only warns)."""
    try:
        device = resolve_device(args.device)
        task = TASKS[args.task]
        impl = task.impl or args.impl
        models = [load_decoder(path, device, impl) for path in filter(None, (ckpt, compare))]
        if task.check is not None:
            task.check(args, models)
        # a task that trains its own models (probes) reads no text
        data = (load_data(data_factory, args.data, args.tokenizer, models) if task.needs_checkpoint
                else data_factory(args.data, None))
    except (CheckpointError, ValueError, RuntimeError) as err:
        parser.error(str(err))
    training = [seeds.training_record(m) for m in models]
    check_pair_seeds(training, models, parser, same_seed)
    runtime = Runtime(device, args.precision, args.seed, args.n_boot, args.confidence)
    out = out or default_out(args.task, models)
    overwrite = args.overwrite or task.resumes
    if not overwrite:
        existing = existing_outputs(out, args.task)
        if existing:
            parser.error(f"{existing[0]} exists (an earlier result): pass --overwrite to replace it, or choose "
                         "another --out")
    data = DataErrors(data, args.data)
    announce_setup(args, models, data, device, training)
    started = time.time()
    try:
        output = task.run(args, models, runtime, data)
    except (ValueError, FileNotFoundError, ConnectionError) as err:  # data / length problems, stated by the task
        parser.exit(2, f"{parser.prog}: error: --task {args.task}: {err}\n")
    header = {
        "checkpoint": {**models[0].describe(device), **training[0]} if models else None,
        "compare": {**models[1].describe(device), **training[1]} if len(models) == 2 else None,
        "data": data.describe() if "data" in task.options else None,
        "tokenizer": data.describe()["tokenizer"] if task.needs_checkpoint else None,
        "settings": settings(args),
        "device": str(device),
        "seconds": round(time.time() - started, 2),
        "command": " ".join(["eval.py", *argv]),
    }
    step = (models[0].global_step or 0) if models else 0
    try:
        path = write_outputs(out, args.task, header, output, args.tensorboard, step, overwrite=overwrite)
    except FileExistsError as err:  # written meanwhile by another run: still nothing is replaced
        parser.exit(2, f"{parser.prog}: error: {err}; pass --overwrite to replace it, or choose another --out\n")
    print(output.table) if output.table is not None else print_summary(output.scalars)
    if len(models) == 2 and args.task in seeds.COMPARING_TASKS:
        print(f"note: {ONE_PAIR_NOTE}")
    print(f"{args.task}: wrote {path}")
    return path


def check_pair_seeds(training: list[dict], models: list[LoadedModel], parser: argparse.ArgumentParser,
                     required: bool) -> None:
    """Two compared checkpoints should share their training seeds (seed_everything and the data's): in a seed series
    (`required`) a mismatch is an error, for a lone pair a warning on stderr."""
    if len(training) < 2:
        return
    keys = ("seed_everything", "data_seed")
    a, b = ([t[k] for k in keys] for t in training)
    if a == b and (not required or a[0] is not None):
        return
    message = (f"{models[0].path} was trained with seed_everything={a[0]}, data seed {a[1]}; {models[1].path} with "
               f"seed_everything={b[0]}, data seed {b[1]}")
    if required:
        parser.error(f"{message}: the pairs of --ckpt and --compare are matched by position and each pair must "
                     "record one training seed")
    print(f"warning: {message}", file=sys.stderr, flush=True)


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

    def retrieval_documents(self, length, count, seed, distance_law):
        try:
            return self._data.retrieval_documents(length, count, seed, distance_law)
        except KeyError as err:
            raise self._error(err) from err


def print_summary(scalars: dict[str, float]) -> None:
    """The task's headline numbers (the same scalars TensorBoard gets), one per line."""
    width = max((len(tag) for tag in scalars), default=0)
    for tag, value in scalars.items():
        print(f"{tag:<{width}}  {value:.4f}")
