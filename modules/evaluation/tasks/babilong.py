"""babilong: bAbI-like fact chains (qa1–qa5, evaluation.babilong) hidden in book text at 4k–16k tokens; string-match
score per task, exact intervals, McNemar tests with --compare."""
from __future__ import annotations

import argparse

from fpa_lightning.evaluation.babilong import QA, BabilongBuilder
from fpa_lightning.evaluation.checkpoint import LoadedModel
from fpa_lightning.evaluation.data import EvalData
from fpa_lightning.evaluation.scoring import Runtime
from modules.evaluation.tasks.common import Task, TaskOutput
from modules.evaluation.tasks.ruler import BOOK_DOCUMENTS, DEFAULT_ITEMS, DEFAULT_LENGTHS, option_help
from modules.evaluation.tasks.synthetic import run_generated


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--qa", nargs="+", choices=sorted(QA), help="babilong: the patterns to run (default all)")


def run(args: argparse.Namespace, models: list[LoadedModel], runtime: Runtime, data: EvalData) -> TaskOutput:
    return babilong(models, runtime, data, args.qa or sorted(QA), args.lengths or DEFAULT_LENGTHS,
                    args.trials or DEFAULT_ITEMS, args.max_docs or BOOK_DOCUMENTS)


def babilong(models: list[LoadedModel], runtime: Runtime, data: EvalData, patterns: list[str], lengths: list[int],
             n_items: int, max_docs: int) -> TaskOutput:
    """Every pattern at every length, n_items each, in the data's test documents."""
    texts = data.texts(max_docs)
    builder = BabilongBuilder(data.tokenizer, data.bos_id, texts)
    output = run_generated("babilong", models, runtime, builder.encode, data.eos_id, builder.items, patterns,
                           lengths, n_items, "--qa")
    output.results["book_documents"] = len(texts)
    return output


TASK = Task("BABILong-style qa1-qa5 fact chains in book text at 4k-16k; string-match score, exact CIs, McNemar "
            "with --compare", frozenset({"lengths", "trials", "max_docs", "data", "qa"}), run,
            add_arguments=add_arguments, option_help=option_help("babilong"))
