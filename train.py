"""Command line: ``python train.py {fit,validate,test} --config configs/<name>.yaml [--key value ...]``.

The model is ``modules.LanguageModel``; ``data`` takes any ``datamodules.TextDataModule`` subclass
(``data.class_path``). Every run gets a TensorBoard logger under ``runs/<name>/version_<n>`` (the YAML
names it), a ModelCheckpoint (``checkpoint.*``: the best by ``val/loss`` plus ``last.ckpt``, in the
logger's ``checkpoints/`` folder) and its resolved ``config.yaml``. Resume with ``--ckpt_path <file>``.
``model.model.max_seq_len`` is not set by hand: it is linked to ``data.init_args.seq_len``. Precision is
``trainer.precision``, set explicitly in each YAML (bf16-mixed for the GPU configs, 32-true for the CPU
quickstart). YAML values may use ``${...}`` interpolation (omegaconf) to keys of the same file,
resolved at parse time.
"""
from __future__ import annotations

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from datamodules import TextDataModule
from modules import LanguageModel

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


def main(args: list[str] | None = None, run: bool = True) -> TrainCLI:
    """Run the CLI (``args=None`` reads sys.argv). ``run=False`` only parses and instantiates (no
    subcommand in ``args``); the returned CLI holds the model, data module and trainer."""
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
