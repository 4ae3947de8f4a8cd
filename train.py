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
logger's ``checkpoints/`` folder) and its resolved ``config.yaml``. Resume with ``--ckpt_path <file>``.
``predict`` continues the prompts of a ``datamodules.PromptDataModule`` (``--data.class_path``) and writes JSONL
(``--predictions.path``, docs/generation.md). ``model.model.max_seq_len`` is not set by hand: it is linked to
``data.init_args.seq_len``. Precision is ``trainer.precision``, set explicitly in each YAML (bf16-mixed for the GPU
configs, 32-true for the CPU quickstart). YAML values may use ``${...}`` interpolation (omegaconf) to keys of the
same file, resolved at parse time.

Safety (docs/training.md, "Safety and resume"): checkpoints are written atomically (``modules.checkpoint_io``); a remote
``--ckpt_path`` is refused; a resume lists the command-line values that the checkpoint's hyper-parameters replace; with
``--trainer.logger=false`` an existing ``./config.yaml`` is never overwritten.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys

import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from callbacks import GenerationWriter
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


class TrainCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # An overlay's ``base: <file>`` (expanded by with_resolved_configs before parsing): accepted and dropped from
        # --print_config and the saved config.yaml (a suppressed option is never dumped).
        parser.add_argument(f"--{BASE_KEY}", default=None, help=argparse.SUPPRESS)
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

    def _parse_ckpt_path(self) -> None:
        """LightningCLI puts a checkpoint's hyper-parameters over the parsed ``model`` values (so the model matches
        the weights, and a resumed optimizer and schedule continue from their saved state anyway). Refuses a remote
        checkpoint, and lists on stderr every value the checkpoint replaces, before anything runs."""
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path and (is_remote(ckpt_path) or ckpt_path == "registry" or str(ckpt_path).startswith("registry:")):
            self.parser.error(f"--ckpt_path {ckpt_path!r}: remote checkpoints are refused (Lightning would unpickle "
                              f"them with weights_only=False, which can run code from the file); download it, check "
                              f"where it comes from, and pass the local file")
        before = _flat(self.config[subcommand].get("model")) if ckpt_path else {}
        super()._parse_ckpt_path()
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
    return TrainCLI(
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


if __name__ == "__main__":
    try:
        main()
    except (NonFiniteLossError, CorruptDataError, DataChangedError) as error:
        message = str(error)
        if message.startswith("Caught "):  # re-raised from a DataLoader worker: the original message is the last line
            message = message.rstrip().splitlines()[-1].split(": ", 1)[-1]
        sys.exit(f"train.py: error: {message}")
