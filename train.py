"""Command line: ``python train.py {fit,validate,test,predict} --config <name>.yaml [--key value ...]``.

A config name that is not a file in the working directory is looked up in this repository's ``configs/`` (the run
says which file it used); ``--config configs/<name>.yaml`` works as well.

Bases (overlays): a config file whose top level has ``base: <file>`` holds only what differs from that file;
``--config overlay.yaml`` is read as ``--config <file> --config overlay.yaml`` (LightningCLI merges repeated
``--config`` in order, later over earlier: a mapping merges key by key, a list replaces the base's list). ``<file>``
is a path relative to the folder of the file that names it, else a name in ``configs/``; a base may have its own
base (``configs/study/fpa.yaml`` -> ``configs/base/study.yaml`` -> ``configs/base/110m.yaml``). A base that exists
nowhere, or a chain that comes back to a file it passed through, is an error before anything is parsed. The key
itself is dropped: ``--print_config`` and the run's saved ``config.yaml`` hold the full merged config, no ``base``.

The model is ``modules.LanguageModel``; ``data`` takes any ``datamodules.TextDataModule`` subclass
(``data.class_path``). Every run gets a TensorBoard logger under ``runs/<name>/version_<n>`` (the YAML
names it), a ModelCheckpoint (``checkpoint.*``: the best by ``val/loss`` plus ``last.ckpt``, in the
logger's ``checkpoints/`` folder) and its resolved ``config.yaml``. Resume with ``--ckpt_path <file>``, or with
``fit --resume auto`` (the latest run of the same logger name, from its ``last.ckpt``, in the same folder). SIGTERM or
SIGINT writes ``last.ckpt`` of the last finished optimizer step and exits 128 + the signal number
(``callbacks.preemption``; docs/training.md, "Resuming and preemption").
``predict`` continues the prompts of a ``datamodules.PromptDataModule`` (``--data.class_path``) and writes JSONL
(``--predictions.path``, docs/generation.md). ``model.model.max_seq_len`` is not set by hand: it is linked to
``data.init_args.seq_len``. Precision is ``trainer.precision``, set explicitly in each YAML (bf16-mixed for the GPU
configs, 32-true for the CPU quickstart). YAML values may use ``${...}`` interpolation (omegaconf) to keys of the
same file, resolved at parse time.

Safety (docs/training.md, "Safety and resume"): checkpoints are written atomically (``modules.checkpoint_io``); a remote
``--ckpt_path`` is refused; a resume lists the command-line values that the checkpoint's hyper-parameters replace; with
``--trainer.logger=false`` an existing ``./config.yaml`` is never overwritten.

Mistakes (docs/training.md, "Troubleshooting"): before the logger creates a run folder, the run checks the
``--ckpt_path`` file, the data its subcommand reads (files found, hub reachable, some usable record) and that the
attention implementation can run on the device. A failed check, and the known errors of a running job (bad data,
a non-finite loss), end it with one line ``train.py: error: ...`` on stderr (exit code 2 before the run, 1 during it
and for a truncated or corrupt data file wherever it is found); ``FPA_DEBUG=1`` shows the full traceback instead. The training bar counts optimizer steps (``callbacks.progress``).
"""
from __future__ import annotations

import argparse
import logging
import os
import pathlib
import sys
import warnings
from typing import Literal, Optional

import yaml
from lightning.fabric.strategies.fsdp import _is_sharded_checkpoint
from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar, TQDMProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from lightning_utilities.core import rank_zero as lightning_rank_zero

from callbacks import GenerationWriter, PreemptionCheckpoint, Preempted
from callbacks.progress import StepProgressBar
from datamodules import TextDataModule
from datamodules.sources import CorruptDataError
from datamodules.text import DataChangedError
from modules import LanguageModel
from modules.checkpoint_io import AtomicCheckpointIO, is_remote
from modules.guards import NonFiniteLossError

CONFIG_DIR = pathlib.Path(__file__).resolve().parent / "configs"
BASE_KEY = "base"  # a config file's top-level key naming the file it overlays (module docstring, "Bases")
TRAINER_DEFAULTS = {
    "logger": {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
        "init_args": {"save_dir": "runs", "name": "default"},
    },
}
RESUME_AUTO = "auto"  # ``fit --resume auto``: continue the latest run of the logger's name (TrainCLI.resolve_resume)
DEBUG_ENV = "FPA_DEBUG"  # FPA_DEBUG=1: a known error shows its full traceback instead of one line

# Noise on every run that is not ours to fix, silenced by its exact text only: Lightning's advertisement for its
# cloud logger, and torch's deprecation of LeafSpec, which Lightning's own pytree helper still uses.
_LIGHTNING_TIP = "💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]"


def _not_the_tip(record) -> bool:
    return not str(record.msg).startswith(_LIGHTNING_TIP)


def silence_foreign_noise() -> None:
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                            category=FutureWarning)
    if _not_the_tip not in lightning_rank_zero.log.filters:
        lightning_rank_zero.log.addFilter(_not_the_tip)


silence_foreign_noise()


def checkpoint_path_problem(path: str) -> str | None:
    """Why ``path`` cannot be resumed from, or None. A checkpoint is a file, or the folder of a sharded FSDP
    checkpoint (``state_dict_type="sharded"``), recognised by the check Lightning's own FSDP loader makes (the
    ``meta.pt`` it writes beside the shards)."""
    if os.path.isfile(path) or _is_sharded_checkpoint(pathlib.Path(path)):
        return None
    return "is a folder, not a checkpoint file or a sharded checkpoint" if os.path.isdir(path) else "does not exist"


class HeldBackLog(logging.Handler):
    """Holds what Lightning's loggers write while the trainer is built ("Seed set to 0", "GPU available: ...": INFO
    on stderr) until the run's checks pass, so that a mistake is the only line printed. ``replay`` writes the records
    in order through Lightning's own handlers; ``forget`` drops them (not release/acquire: those are a Handler's
    lock)."""

    LOGGERS = ("lightning.pytorch", "lightning.fabric")  # (each has its own stderr handler and does not propagate)

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.saved: dict[str, list[logging.Handler]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def hold(self) -> None:
        for name in self.LOGGERS:
            logger = logging.getLogger(name)
            if self in logger.handlers:
                continue
            self.saved[name], logger.handlers = logger.handlers, [self]

    def _restore(self) -> None:
        for name, handlers in self.saved.items():
            logging.getLogger(name).handlers = handlers
        self.saved = {}

    def replay(self) -> None:
        saved, records = self.saved, self.records
        self._restore()
        self.records = []
        for record in records:
            for name, handlers in saved.items():
                if record.name == name or record.name.startswith(f"{name}."):
                    for handler in handlers:
                        if record.levelno >= handler.level:
                            handler.handle(record)

    def forget(self) -> None:
        self._restore()
        self.records = []


SETUP_LOG = HeldBackLog()


class SetupError(Exception):
    """A mistake found before the run starts (no run folder exists yet): ``train.py`` prints it as one line, exit 2."""


class TrainCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # An overlay's ``base: <file>`` (expanded by with_resolved_configs before parsing): accepted and dropped from
        # --print_config and the saved config.yaml (a suppressed option is never dumped).
        parser.add_argument(f"--{BASE_KEY}", default=None, help=argparse.SUPPRESS)
        parser.add_argument("--resume", type=Optional[Literal["auto"]], default=None,
                            help="auto (fit): continue the latest run of the logger's save_dir/name from its last.ckpt, "
                                 "in the same folder; a new run when there is none")
        # A parser-level callback (not a trainer.callbacks entry), so a YAML that lists its own
        # callbacks adds to it instead of replacing it.
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        # the JSONL writer of ``predict`` (a PromptDataModule): --predictions.path; idle in fit/validate/test
        parser.add_lightning_class_args(GenerationWriter, "predictions")
        # The model's training context length is the data's row length, whatever the command line overrides.
        parser.link_arguments("data.init_args.seq_len", "model.model.max_seq_len")
        parser.set_defaults({
            "checkpoint.monitor": "val/loss",
            "checkpoint.mode": "min",
            "checkpoint.save_top_k": 1,
            "checkpoint.save_last": True,
            "checkpoint.filename": "step{step}-val_loss{val/loss:.4f}",
            "checkpoint.auto_insert_metric_name": False,
        })

    def instantiate_classes(self) -> None:
        # The config dataclasses and data modules check their values in their constructors; report a
        # failed check as a configuration error (usage line + message, exit code 2), before any training.
        try:
            super().instantiate_classes()
        except ValueError as error:
            self.parser.error(f"invalid configuration: {error}")
        strategy = getattr(getattr(self, "trainer", None), "strategy", None)
        if strategy is not None and type(strategy.checkpoint_io) is TorchCheckpointIO:  # not a user's own plugin
            strategy.checkpoint_io = AtomicCheckpointIO()
        trainer = getattr(self, "trainer", None)
        bar = getattr(trainer, "progress_bar_callback", None)
        configured = str((self._get(self.config, "trainer") or {}).get("callbacks"))  # the YAML/command line's
        if type(bar) in (TQDMProgressBar, RichProgressBar) and "ProgressBar" not in configured:
            # Lightning's default bar (Rich's where rich is installed) counts an endless epoch's batches: one in
            # optimizer steps to max_steps instead (callbacks.progress); a bar the user configured stays
            trainer.callbacks[trainer.callbacks.index(bar)] = StepProgressBar()
        if trainer is not None and not any(isinstance(c, PreemptionCheckpoint) for c in trainer.callbacks):
            trainer.callbacks.append(PreemptionCheckpoint())  # SIGTERM/SIGINT: checkpoint, then stop

    def _run_subcommand(self, subcommand: str) -> None:
        self.check_before_run(subcommand)
        SETUP_LOG.replay()
        super()._run_subcommand(subcommand)

    def check_before_run(self, subcommand: str) -> None:
        """The ordinary mistakes that would otherwise fail after the logger made a run folder, with a traceback:
        the data the subcommand reads (``TextDataModule.check_stage``: files found, hub reachable, a usable record)
        and an attention implementation the device cannot run. Raises ``SetupError``."""
        datamodule = self.datamodule
        if isinstance(datamodule, TextDataModule):
            try:
                datamodule.check_stage(subcommand)
            except CorruptDataError:
                raise  # the same line and exit code (1) as when the run itself reaches the damage
            except (ValueError, FileNotFoundError, ConnectionError, KeyError) as error:
                detail = error.args[0] if isinstance(error, KeyError) and error.args else error
                raise SetupError(f"data ({type(datamodule).__name__}): {detail}") from error
        try:
            device = self.trainer.strategy.root_device
        except Exception:  # noqa: BLE001 - a strategy that knows its device only once launched: set-up checks it
            return
        try:
            self.model.model.attention_impls(device)
        except (ValueError, RuntimeError) as error:
            raise SetupError(f"--model.model.attention: {error}") from error

    def _parse_ckpt_path(self) -> None:
        """LightningCLI puts a checkpoint's hyper-parameters over the parsed ``model`` values (so the model matches
        the weights, and a resumed optimizer and schedule continue from their saved state anyway). Refuses a remote
        checkpoint, and lists on stderr every value the checkpoint replaces, before anything runs."""
        subcommand = self.config.get("subcommand")
        if subcommand:
            self.resolve_resume(subcommand)
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path and (is_remote(ckpt_path) or ckpt_path == "registry" or str(ckpt_path).startswith("registry:")):
            self.parser.error(f"--ckpt_path {ckpt_path!r}: remote checkpoints are refused (Lightning would unpickle "
                              f"them with weights_only=False, which can run code from the file); download it, check "
                              f"where it comes from, and pass the local file")
        problem = checkpoint_path_problem(ckpt_path) if ckpt_path else None
        if problem:
            raise SetupError(f"--ckpt_path {ckpt_path}: {problem}; pass a .ckpt file (a run's checkpoints are in "
                             f"runs/<name>/version_<n>/checkpoints/, last.ckpt the latest)")
        before = _flat(self.config[subcommand].get("model")) if ckpt_path else {}
        try:
            super()._parse_ckpt_path()  # reads the checkpoint's hyper-parameters (torch.load)
        except Exception as error:  # noqa: BLE001 - torch.load of a damaged file raises many types
            reason = _first_line(error)
            if "weights_only" in reason:  # torch's advice to load with weights_only=False is not ours to give
                reason = "not a checkpoint of tensors and plain containers"
            raise SetupError(f"--ckpt_path {ckpt_path}: not a readable checkpoint, truncated or corrupt "
                             f"({type(error).__name__}: {reason}); pass a complete .ckpt file, e.g. the run's "
                             f"last.ckpt") from error
        if not ckpt_path:
            return
        after = _flat(self.config[subcommand].get("model"))
        changed = [key for key in sorted(before.keys() | after.keys()) if before.get(key) != after.get(key)]
        if changed and rank_zero_only.rank == 0:
            lines = [f"  model.{key}: {before.get(key)!r} (command line/config) -> {after.get(key)!r} (checkpoint)"
                     for key in changed]
            print(f"train.py: --ckpt_path {ckpt_path}: the checkpoint's hyper-parameters win over these command-line/"
                  f"config values (the run uses the checkpoint's; to change them, start a new run from the "
                  f"weights):\n" + "\n".join(lines), file=sys.stderr)

    def resolve_resume(self, subcommand: str) -> None:
        """``fit --resume auto``: the TensorBoard logger's ``save_dir/name/version_<n>`` of highest n whose
        ``checkpoints/last.ckpt`` exists (or the logger's own ``version`` when set) becomes ``ckpt_path``, and the
        logger's ``version`` is set to it, so the run continues in the same folder. No such run: a new one. The resume
        then goes through every check of an explicit ``--ckpt_path``."""
        config = self.config[subcommand]
        if config.get("resume") != RESUME_AUTO:
            return
        if subcommand != "fit":
            raise SetupError(f"--resume {RESUME_AUTO} continues a training run; {subcommand} takes --ckpt_path")
        if config.get("ckpt_path"):
            raise SetupError(f"--resume {RESUME_AUTO} and --ckpt_path {config['ckpt_path']}: pass one of them")
        loggers = config["trainer"].get("logger")
        loggers = loggers if isinstance(loggers, list) else [loggers]
        tensorboard = next((logger for logger in loggers if str(getattr(logger, "class_path", "")).endswith(
            "TensorBoardLogger")), None)
        if tensorboard is None:
            raise SetupError(f"--resume {RESUME_AUTO} finds runs through the TensorBoard logger's save_dir/name "
                             f"(version_<n>/checkpoints/last.ckpt), and this run has none; resume with --ckpt_path")
        args = tensorboard.init_args
        folder = pathlib.Path(args.get("save_dir") or ".") / (args.get("name") or "")
        version = args.get("version")
        if version is not None:
            name = version if isinstance(version, str) else f"version_{version}"
            candidates = [(version, folder / name)]
        else:
            candidates = sorted(((int(path.name.split("_", 1)[1]), path) for path in folder.glob("version_*")
                                 if path.name.split("_", 1)[1].isdigit()), reverse=True)
        for version, run in candidates:
            last = run / "checkpoints" / "last.ckpt"
            if checkpoint_path_problem(str(last)) is None:  # a file, or a sharded FSDP folder
                args["version"] = version
                config["ckpt_path"] = str(last)
                if rank_zero_only.rank == 0:
                    print(f"train.py: --resume {RESUME_AUTO}: continuing {run} from {last}", file=sys.stderr)
                return
        if rank_zero_only.rank == 0:
            print(f"train.py: --resume {RESUME_AUTO}: no run in {folder} has checkpoints/last.ckpt; starting a new "
                  f"run", file=sys.stderr)


class NoClobberSaveConfig(SaveConfigCallback):
    """Saves the resolved ``config.yaml`` into the run's log folder (a new ``version_<n>`` per run). Without a logger
    that folder is the working directory (``trainer.default_root_dir``), where a ``config.yaml`` may be the user's own:
    an existing one is never replaced; the run says so on stderr and does not save its config."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        if trainer.logger is None and not self.already_saved:
            path = os.path.join(trainer.log_dir or ".", self.config_filename)
            if trainer.strategy.broadcast(os.path.isfile(path) if trainer.is_global_zero else False):
                if trainer.is_global_zero:
                    print(f"train.py: {path} exists and is not overwritten (no logger, so this run has no folder of "
                          f"its own); its resolved config is not saved (print it with --print_config)", file=sys.stderr)
                self.already_saved = True
                return
        super().setup(trainer, pl_module, stage)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ""


def _flat(namespace, prefix: str = "") -> dict:
    """``{"optim.lr": 0.003, ...}`` of a (nested) jsonargparse Namespace or dict; tuples as lists."""
    items = namespace.as_dict() if hasattr(namespace, "as_dict") else (namespace or {})
    flat = {}
    for key, value in items.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
    return flat


def resolve_config(name: str) -> str:
    """A config path as given if it is a file; else ``configs/<name>`` (``.yaml`` optional) of this repository, which
    the run announces. A name found nowhere is an error listing the available configs."""
    if os.path.isfile(name):
        return name
    for candidate in (CONFIG_DIR / name, CONFIG_DIR / f"{name}.yaml"):
        if candidate.is_file():
            print(f"train.py: using config {candidate}", file=sys.stderr)
            return str(candidate)
    available = ", ".join(sorted(p.name for p in CONFIG_DIR.glob("*.yaml")))
    raise SystemExit(f"train.py: error: config {name!r} is neither a file nor in {CONFIG_DIR}; available: {available}")


def config_chain(path: str, _through: tuple[str, ...] = ()) -> list[str]:
    """``[..., base of base, base, path]``: the files a config overlays through its top-level ``base: <file>`` key,
    the farthest first (module docstring, "Bases"). ``<file>``: relative to ``path``'s folder, else in ``configs/``.
    A missing base or a cycle is an error; a file that is not readable YAML is left to the parser to report."""
    real = os.path.realpath(path)
    if real in _through:
        cycle = " -> ".join(_through[_through.index(real):] + (real,))
        raise SystemExit(f"train.py: error: config {path!r}: the {BASE_KEY!r} chain is a cycle: {cycle}")
    try:
        data = yaml.safe_load(pathlib.Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return [path]
    base = data.get(BASE_KEY) if isinstance(data, dict) else None
    if base is None:
        return [path]
    if not isinstance(base, str) or not base:
        raise SystemExit(f"train.py: error: config {path!r}: {BASE_KEY!r} must be a file name, got {base!r}")
    near, in_configs = os.path.join(os.path.dirname(path), base), CONFIG_DIR / base
    if os.path.isfile(near):
        found = near
    elif in_configs.is_file():
        found = str(in_configs)
    else:
        raise SystemExit(f"train.py: error: config {path!r}: its {BASE_KEY} {base!r} is neither {near!r} nor "
                         f"{str(in_configs)!r}")
    return config_chain(found, _through + (real,)) + [path]


def with_resolved_configs(args: list[str]) -> list[str]:
    """``--config NAME`` / ``--config=NAME`` / ``-c NAME`` with each NAME resolved by ``resolve_config``, and preceded
    by its bases (``config_chain``), each as a ``--config`` of its own. Idempotent: bases that already stand right
    before their overlay are not added again (a DDP launch re-runs this script with the rewritten ``sys.argv``)."""
    out, flag, recent = [], None, []  # recent: the real paths of the --config values just before, in a row

    def add(option: str, name: str) -> None:
        chain = config_chain(resolve_config(name))
        bases = [os.path.realpath(path) for path in chain[:-1]]
        if bases and recent[-len(bases):] == bases:
            chain = chain[-1:]
        for i, path in enumerate(chain):
            if option == "--config=":
                out.append(f"--config={path}")
            else:  # the first path's option is already in out
                out.extend([option, path] if i else [path])
            recent.append(os.path.realpath(path))

    for arg in args:
        if flag:
            add(flag, arg)
            flag = None
        elif arg in ("--config", "-c"):
            out.append(arg)
            flag = arg
        elif arg.startswith("--config="):
            add("--config=", arg.split("=", 1)[1])
        elif arg.split("=", 1)[0] == f"--{BASE_KEY}":
            raise SystemExit(f"train.py: error: {BASE_KEY!r} is a key of a config file; on the command line, give "
                             f"the base as an earlier --config")
        else:
            out.append(arg)
            recent = []
    return out


def main(args: list[str] | None = None, run: bool = True) -> TrainCLI:
    """Run the CLI (``args=None`` reads sys.argv). ``run=False`` only parses and instantiates (no
    subcommand in ``args``); the returned CLI holds the model, data module and trainer."""
    if args is None:  # LightningCLI reads sys.argv itself (and warns when given both)
        sys.argv[1:] = with_resolved_configs(sys.argv[1:])
    else:
        args = with_resolved_configs(args)
    SETUP_LOG.hold()  # released once the checks pass (TrainCLI._run_subcommand); a mistake prints alone
    try:
        cli = TrainCLI(
            LanguageModel,
            TextDataModule,
            subclass_mode_data=True,
            parser_kwargs={"parser_mode": "omegaconf"},
            trainer_defaults=TRAINER_DEFAULTS,
            save_config_callback=NoClobberSaveConfig,
            save_config_kwargs={"overwrite": True},  # in a logger's folder (new per run); see NoClobberSaveConfig
            auto_configure_optimizers=False,  # the optimizer is LanguageModel's (model.optim), not a CLI option
            args=args,
            run=run,
        )
    except SetupError:
        SETUP_LOG.forget()
        raise
    finally:
        SETUP_LOG.replay()  # run=False, --print_config, or an error during the run: what was held, in order
    return cli


def one_line(error: BaseException) -> str:
    """A known error's message on one line; one re-raised from a DataLoader worker ("Caught X in DataLoader worker
    process 0. Original Traceback ...") is its original message, the traceback's last line."""
    message = str(error).strip()
    if message.startswith("Caught "):
        message = message.splitlines()[-1].split(": ", 1)[-1]
    return " ".join(message.split("\n"))


def command(args: list[str] | None = None) -> int:
    """``train.py`` as a command: runs ``main`` and returns the exit code. A known error (a mistake found before the
    run, bad data, a non-finite loss) is one line on stderr, exit 2 before the run and 1 during it; with
    ``FPA_DEBUG=1`` it is raised with its full traceback."""
    try:
        main(args)
    except Preempted as stop:  # a checkpoint of the last finished step was written (callbacks.preemption)
        print(f"train.py: {stop}; continue with the same command and --resume {RESUME_AUTO}", file=sys.stderr)
        return stop.code
    except (SetupError, NonFiniteLossError, CorruptDataError, DataChangedError) as error:
        if os.environ.get(DEBUG_ENV, "").lower() in ("1", "true", "yes", "on"):
            raise
        print(f"train.py: error: {one_line(error)} (full traceback: {DEBUG_ENV}=1)", file=sys.stderr)
        return 2 if isinstance(error, SetupError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(command())
