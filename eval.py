"""Evaluate checkpoints: ``python eval.py --task TASK --ckpt PATH [--compare CKPT_B] [--data ...] [--out DIR]`` (one
pair per training seed: ``--ckpt A0 A1 ... --compare B0 B1 ...``), compare two models across training seeds from
per-seed result files: ``python eval.py seeds --task TASK --a A0.json ... --b B0.json ...``, or export a checkpoint:
``python eval.py export --ckpt PATH --out DIR``.

``--help`` lists the tasks, ``--task TASK --help`` a task's options. The application lives in ``modules/evaluation``
(its tasks in ``modules/evaluation/tasks/``); this file wires it to the data layer (``datamodules.EvalCorpus`` reads
``--data``).
"""
from __future__ import annotations

from datamodules import EvalCorpus
from modules.evaluation.cli import main as run_cli


def main(argv: list[str] | None = None) -> str:
    """Run one evaluation, seed comparison or export (``argv=None`` reads sys.argv); returns the JSON path (the export
    folder)."""
    return run_cli(argv, data_factory=EvalCorpus)


if __name__ == "__main__":
    main()
