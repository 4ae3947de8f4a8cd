"""Evaluate checkpoints: ``python eval.py --task TASK --ckpt PATH [--compare CKPT_B] [--data ...] [--out DIR]``.

Tasks (``--help`` lists them and every option) live in ``fpa_lightning/evaluation/tasks/``; this file wires the
core's command line to the data layer (``datamodules.EvalCorpus`` reads ``--data``).
"""
from __future__ import annotations

from datamodules import EvalCorpus
from fpa_lightning.evaluation.cli import main as run_cli


def main(argv: list[str] | None = None) -> str:
    """Run one evaluation (``argv=None`` reads sys.argv); returns the JSON path."""
    return run_cli(argv, data_factory=EvalCorpus)


if __name__ == "__main__":
    main()
