"""Investigation behind docs/probes.md, "Where we differ from the paper", 1: does FPA's count on the unnamed ladder
(no positions, one head of d = 4) really fall with r, or is the table's 1500-step budget too short at larger r?

Trains FPA's rows of the groups `unnamed ladder, d=4, r=…` with a longer budget (the table's seeds, batch, learning
rate and held-out sets; only the number of steps differs), and writes the rows as the runner records them, so that
`report.markdown_table` renders them (the JSON has probes.json's layout, ``{"results": {"rows": [...]}}``):

    python examples/probes/unnamed_ladder_budget.py --steps 4500 [--r 10 14 18] [--device cuda] [--workers 2] \
        --json out.json
"""
import argparse
import json

from fpa_lightning.atomic import write_json
from fpa_lightning.probes.train import Budget
from modules.probes.runner import run_rows
from modules.probes.table import GROUPS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4500)
    parser.add_argument("--r", type=int, nargs="+", default=[10, 14, 18])
    parser.add_argument("--seeds", type=int, default=15)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--json", required=True, help="where the rows go ({'rows': [...]})")
    args = parser.parse_args()
    labels = [f"unnamed ladder, d=4, r={r}" for r in args.r]
    plan = [(next(g for g in GROUPS if g.label == label), "fpa") for label in labels]
    rows = run_rows(plan, list(range(args.seeds)), Budget(), args.steps, args.device, [], workers=args.workers)
    write_json(args.json, {"command": "examples/probes/unnamed_ladder_budget.py", "settings": vars(args),
                           "results": {"rows": rows, "comparisons": []}})
    print(json.dumps([(row["group"], row["successes"]) for row in rows]))


if __name__ == "__main__":
    main()
