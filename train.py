"""Command line: ``python train.py {fit,validate,test,predict} --config <name>.yaml [--key value ...]``.

A config name that is not a file in the working directory is looked up in this repository's ``configs/`` (the run
says which file it used); ``--config configs/<name>.yaml`` works as well.

The model is ``modules.LanguageModel``; ``data`` takes any ``datamodules.TextDataModule`` subclass
(``data.class_path``). Every run gets a TensorBoard logger under ``runs/<name>/version_<n>`` (the YAML
names it), a ModelCheckpoint (``checkpoint.*``: the best by ``val/loss`` plus ``last.ckpt``, in the
logger's ``checkpoints/`` folder) and its resolved ``config.yaml``. Resume with ``--ckpt_path <file>``.
``predict`` continues the prompts of a ``datamodules.PromptDataModule`` (``--data.class_path``) and writes JSONL
(``--predictions.path``, README "Generation"). ``model.model.max_seq_len`` is not set by hand: it is linked to
``data.init_args.seq_len``. Precision is ``trainer.precision``, set explicitly in each YAML (bf16-mixed for the GPU
configs, 32-true for the CPU quickstart). YAML values may use ``${...}`` interpolation (omegaconf) to keys of the
same file, resolved at parse time.
"""
from __future__ import annotations

import os
import pathlib
import sys

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from callbacks import GenerationWriter
from datamodules import TextDataModule
from modules import LanguageModel

CONFIG_DIR = pathlib.Path(__file__).resolve().parent / "configs"
TRAINER_DEFAULTS = {
    "logger": {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
        "init_args": {"save_dir": "runs", "name": "default"},
    },
}


class TrainCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
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


def with_resolved_configs(args: list[str]) -> list[str]:
    """``--config NAME`` / ``--config=NAME`` / ``-c NAME`` with each NAME resolved by ``resolve_config``."""
    out, expect_path = [], False
    for arg in args:
        if expect_path:
            arg, expect_path = resolve_config(arg), False
        elif arg in ("--config", "-c"):
            expect_path = True
        elif arg.startswith("--config="):
            arg = "--config=" + resolve_config(arg.split("=", 1)[1])
        out.append(arg)
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
        save_config_kwargs={"overwrite": True},
        auto_configure_optimizers=False,  # the optimizer is LanguageModel's (model.optim), not a CLI option
        args=args,
        run=run,
    )


if __name__ == "__main__":
    main()
