"""Evaluate checkpoints: ``python eval.py --task TASK --ckpt PATH [--compare CKPT_B] [--data ...] [--out DIR]``, or
export one: ``python eval.py export --ckpt PATH --out DIR``.

``--help`` lists the tasks, ``--task TASK --help`` a task's options. The application lives in ``modules/evaluation``
(its tasks in ``modules/evaluation/tasks/``); this file wires it to the data layer (``datamodules.EvalCorpus`` reads
``--data``).
"""
from __future__ import annotations

from datamodules import EvalCorpus
from modules.evaluation.cli import main as run_cli


def main(argv: list[str] | None = None) -> str:
    """Run one evaluation or export (``argv=None`` reads sys.argv); returns the JSON path (the export folder)."""
    return run_cli(argv, data_factory=EvalCorpus)


if __name__ == "__main__":
    main()
