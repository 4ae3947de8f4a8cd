"""ruler: RULER-style retrieval, tracking and aggregation tasks (evaluation.ruler) at 4k, 8k and 16k tokens;
string-match score per task, exact intervals, McNemar tests with --compare."""
from __future__ import annotations

import argparse

from fpa_lightning.evaluation.checkpoint import LoadedModel
from fpa_lightning.evaluation.data import EvalData
from fpa_lightning.evaluation.ruler import BOOK_TASKS, RULER_TASKS, RulerBuilder
from fpa_lightning.evaluation.scoring import Runtime
from modules.evaluation.tasks.common import Task, TaskOutput
from modules.evaluation.tasks.synthetic import run_generated

DEFAULT_LENGTHS = [4096, 8192, 16384]
DEFAULT_ITEMS = 100
BOOK_DOCUMENTS = 16  # documents read for the book haystack unless --max-docs says otherwise


def option_help(task: str) -> dict[str, str]:
    """What the shared options mean for a generated-prompt task (ruler, babilong)."""
    return {"lengths": f"{task}: prompt lengths (default {' '.join(map(str, DEFAULT_LENGTHS))})",
            "trials": f"{task}: items per task and length (default {DEFAULT_ITEMS})",
            "max_docs": f"{task}: documents read for the book haystack (default {BOOK_DOCUMENTS})"}


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--ruler-tasks", nargs="+", choices=RULER_TASKS, metavar="NAME",
                       help=f"ruler: the tasks to run (default all: {' '.join(RULER_TASKS)})")


def run(args: argparse.Namespace, models: list[LoadedModel], runtime: Runtime, data: EvalData) -> TaskOutput:
    return ruler(models, runtime, data, args.ruler_tasks or list(RULER_TASKS), args.lengths or DEFAULT_LENGTHS,
                 args.trials or DEFAULT_ITEMS, args.max_docs or BOOK_DOCUMENTS)


def ruler(models: list[LoadedModel], runtime: Runtime, data: EvalData, tasks: list[str], lengths: list[int],
          n_items: int, max_docs: int) -> TaskOutput:
    """Every task at every length, n_items each; the book haystack (and the cwe words) from the data's test
    documents."""
    texts = data.texts(max_docs) if BOOK_TASKS.intersection(tasks) else None
    builder = RulerBuilder(data.tokenizer, data.bos_id, texts)
    output = run_generated("ruler", models, runtime, builder.encode, data.eos_id, builder.items, tasks, lengths,
                           n_items, "--ruler-tasks")
    output.results["book_documents"] = len(texts) if texts else 0
    return output


TASK = Task("RULER-style needle retrieval, variable tracking, common/frequent words at 4k-16k; string-match score, "
            "exact CIs, McNemar with --compare",
            frozenset({"lengths", "trials", "max_docs", "data", "ruler_tasks"}), run, add_arguments=add_arguments,
            option_help=option_help("ruler"))
