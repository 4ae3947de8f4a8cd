"""probes: the paper's synthetic probe table, trained from scratch (no checkpoint), 15 seeds per row, sign tests.

``python eval.py --task probes [--probes NAME ...] [--groups LABEL ...] [--backends NAME ...] [--seeds 15]
[--steps N ...] [--lr LR ...] [--split sequence|label] [--data-seed K] [--salt S] [--devices D ...] [--impl I]
--out DIR``
writes ``probes.json`` (rows and comparisons, with Holm-adjusted p-values), ``probes.md`` (the table beside the
paper's, and the loss curves) and ``probes.png``. Several --steps or --lr values sweep them (every row at each).
Rows already in DIR/probes.json (or in files given to --merge) with the same settings are reused, so the table
can be filled in over several runs; a row trained in seed ranges (``--seed A --seeds N`` in separate runs) is joined
from them. Definitions and results: docs/probes.md.
"""
from __future__ import annotations

import argparse
import os
import platform
from collections import Counter
from dataclasses import replace

import torch

from fpa_lightning.evaluation.checkpoint import LoadedModel
from fpa_lightning.evaluation.data import EvalData
from fpa_lightning.evaluation.scoring import Runtime
from fpa_lightning.probes import PROBES
from fpa_lightning.probes.model import VARIANTS
from fpa_lightning.probes.train import SPLITS, Budget
from modules.evaluation.tasks.common import Task, TaskOutput
from modules.probes.report import comparison_table, curve_table, markdown_table, plot_table, training
from modules.probes.runner import PARTIAL, comparisons, device_name, is_seed_part, load_rows, run_rows, sweep
from modules.probes.table import GROUPS, label_split_rows, select

DEFAULT_SEEDS = 15


def listing() -> str:
    """Every probe with its parameters, every backend, and every group of the table."""
    lines = ["probes (name(parameters): summary):"]
    lines += [f"  {cls().key}: {cls.summary}" for cls in PROBES.values()]
    lines += ["backends:"] + [f"  {name:15s} {v.description}" for name, v in VARIANTS.items()]
    lines += ["table groups (probe · model · backends · default steps):"]
    lines += [f"  {g.label}: {g.probe.key} · {g.shape.describe()} · {', '.join(g.backends)} · {g.steps}"
              for g in GROUPS]
    return "\n".join(lines)


class _ListAction(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=None, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(listing())
        parser.exit()


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--probes", nargs="+", metavar="NAME", help="probes: only these probes, by name (ladder) or "
                       "key (ladder(r=10)) (default: the whole table; --list shows them)")
    group.add_argument("--groups", nargs="+", metavar="LABEL", help="probes: only these table groups, by their full "
                       "label (\"mqar, paper regime, 2 layers, 32 pairs, T=256\"; --list shows them) or a pattern "
                       "(\"unnamed ladder*positions, d=*, r=18\": * any text, ? one character)")
    group.add_argument("--backends", nargs="+", metavar="NAME", help="probes: only these backends (default: each "
                       "group's own)")
    group.add_argument("--seeds", type=int, help=f"probes: seeds per row, --seed .. --seed + N − 1 (default "
                       f"{DEFAULT_SEEDS})")
    group.add_argument("--steps", type=int, nargs="+", help="probes: training steps per row (default: each group's "
                       "own); several values train every row at each")
    group.add_argument("--train-batch", type=int, help=f"probes: sequences per step and seed (default "
                       f"{Budget.batch})")
    group.add_argument("--lr", type=float, nargs="+", help=f"probes: peak learning rate (default {Budget.lr}); "
                       "several values train every row at each")
    group.add_argument("--split", choices=SPLITS, help="probes: what the held-out split hashes: the whole sequence "
                       "(default) or its label-determining part ('label': groups whose probe defines none are left "
                       "out)")
    group.add_argument("--data-seed", type=int, help="probes: the data replicate: another pool and held-out set "
                       "(default 0, the committed rows')")
    group.add_argument("--salt", help="probes: the key of the held-out split's hash: another split of the same "
                       "space (default: none, the committed rows')")
    group.add_argument("--devices", nargs="+", metavar="DEVICE", help="probes: spread the rows' seed chunks over "
                       "these devices (cuda:0 cuda:1 ...; at least as many workers as devices)")
    group.add_argument("--weight-decay", type=float, help="probes: AdamW decay of every parameter but the backend's "
                       "gate maps (default 0)")
    group.add_argument("--workers", type=int, help="probes: rows trained at once in separate processes (default 1; "
                       "on a GPU several workers share it)")
    group.add_argument("--merge", nargs="+", metavar="JSON", help="probes: reuse rows from these probes.json files "
                       "(or folders) and include them in the table")
    group.add_argument("--list", action=_ListAction, help="probes: list probes, backends and table groups, then exit")


def check(args: argparse.Namespace, models: list[LoadedModel]) -> None:
    for option in ("seeds", "steps", "train_batch", "workers"):
        values = getattr(args, option)
        for value in values if isinstance(values, list) else [values]:
            if value is not None and value < 1:
                raise ValueError(f"--{option.replace('_', '-')} must be a positive integer, got {value}")
    if args.lr is not None and not all(lr > 0 for lr in args.lr):
        raise ValueError(f"--lr must be positive, got {args.lr}")
    if args.data_seed is not None and args.data_seed < 0:
        raise ValueError(f"--data-seed must be non-negative, got {args.data_seed}")
    Budget(**budget_knobs(args))  # raises for a salt too long
    if args.weight_decay is not None and args.weight_decay < 0:
        raise ValueError(f"--weight-decay must be non-negative, got {args.weight_decay}")
    select(args.probes, args.backends, args.groups)  # raises for unknown names or an empty selection


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device_name(str(device))} (torch {torch.__version__})"
    return f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores (torch {torch.__version__})"


def row_machines(rows: list[dict]) -> dict[str, int]:
    """Rows per machine that trained them: ``machine`` is where this command ran, while merged rows (--merge, the
    output folder's earlier files) may have trained elsewhere; rows from before rows recorded it count as "not
    recorded"."""
    return dict(sorted(Counter(row.get("machine") or "not recorded" for row in rows).items()))


def budget_knobs(args: argparse.Namespace) -> dict:
    """The ``Budget`` fields the command line sets (the steps and learning rates are swept: ``runner.sweep``)."""
    knobs = {"batch": args.train_batch, "weight_decay": args.weight_decay, "split": args.split,
             "data_seed": args.data_seed, "salt": args.salt}
    return {k: v for k, v in knobs.items() if v is not None}


def run(args: argparse.Namespace, models: list[LoadedModel], runtime: Runtime, data: EvalData) -> TaskOutput:
    plan = select(args.probes, args.backends, args.groups)
    if args.impl is not None:  # every selected group on this implementation (naive: the seeds as one vmapped model)
        plan = [(replace(group, impl=args.impl), backend) for group, backend in plan]
    if args.split == "label":
        plan, left_out = label_split_rows(plan)
        if left_out:
            print(f"probes: --split label leaves out {len(left_out)} group(s) whose probe defines no "
                  f"label-determining part: {'; '.join(left_out)}")
        if not plan:
            raise ValueError("--split label: no selected group's probe defines a label-determining part")
    seeds = list(range(runtime.seed, runtime.seed + (args.seeds or DEFAULT_SEEDS)))
    budget = Budget(**budget_knobs(args))
    earlier = load_rows([args.out, *(args.merge or [])])
    os.makedirs(args.out, exist_ok=True)
    partial = os.path.join(args.out, PARTIAL)
    rows = run_rows(sweep(plan, budget, args.steps, args.lr), seeds, budget, None, args.devices or str(runtime.device),
                    earlier, workers=args.workers or 1, partial=partial)
    rows = _with_other_rows(rows, earlier)
    if os.path.exists(partial):
        os.remove(partial)  # probes.json, written next, holds every row
    comps = comparisons(rows)
    curves = curve_table(rows)
    table = markdown_table(rows, comps) + "\n" + comparison_table(comps, rows) + (f"\n{curves}" if curves else "")
    with open(os.path.join(args.out, "probes.md"), "w", encoding="utf-8") as f:
        f.write(table)
    print(table)
    results = {"rows": rows, "comparisons": comps, "seeds": seeds, "budget": budget.record(),
               "machine": machine(runtime.device), "row_machines": row_machines(rows)}
    names = [f"probes/{r['group']}/{r['backend']}" for r in rows]
    scalars = {name + (f"/{training(r['budget'])}" if names.count(name) > 1 else ""): r["successes"] / len(r["seeds"])
               for name, r in zip(names, rows)}  # a swept row is named with its budget
    return TaskOutput(results, {"probes": plot_table(rows)}, scalars)


def _with_other_rows(rows: list[dict], earlier: list[dict]) -> list[dict]:
    """This run's rows plus every earlier row it did not redo (first copy of each) and did not join as a seed range
    of one of its rows, in the table's group order."""
    keys = {_key(r) for r in rows}
    merged = list(rows)
    for r in earlier:
        if _key(r) not in keys and not is_seed_part(r, rows):
            keys.add(_key(r))
            merged.append(r)
    order = {g.label: i for i, g in enumerate(GROUPS)}
    return sorted(merged, key=lambda r: order.get(r["group"], len(order)))


def _key(row: dict) -> str:
    return repr(sorted((k, repr(v)) for k, v in row.items() if k in ("group", "backend", "seeds", "budget", "impl")))


TASK = Task("the paper's synthetic probe table: trains probe models from scratch (no --ckpt), sign tests",
            frozenset({"probes", "groups", "backends", "seeds", "steps", "train_batch", "lr", "weight_decay", "workers",
                       "merge", "list", "split", "data_seed", "salt", "devices"}),
            run, check=check, add_arguments=add_arguments, needs_checkpoint=False, resumes=True)
