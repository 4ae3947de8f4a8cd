"""The table as Markdown (ours next to the paper's) and as a figure.

**Capacity controls.** A failure at a narrow head width says something about capacity only if the same backend
succeeds with a wide head on the same probe (the paper's d = r + 2 rows: "so the failure is capacity, not optimisation",
docs/method.md, section 5). A group is a *control* when its label holds the word "control" (``is_control``, e.g.
"ladder control, d=12, r=10"). A row's control (``control_for``) is the row of a control group with the same probe
(its key, so the same r), backend, seeds and training budget, and the same model shape except the head width
(positions, layers, heads, width, MLP and norm equal: a control with a position embedding does not vouch for a row
without one). A control *passes* when every seed succeeds. A row that has a failed control, or a row of a backend
other than the reference whose setting has controls but none of its own, is *not a capacity result*: the Markdown
table says so in its last column, and the comparison table flags its comparison with FPA. A failed control row is
not a capacity result either.
"""
from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")  # files only
import matplotlib.pyplot as plt

from modules.probes.table import REFERENCE


def _p(value: float) -> str:
    return f"{value:.2g}" if value >= 0.001 else f"{value:.1e}"


def training(budget: dict) -> str:
    """A budget in a few words: steps, learning rate and (when used) weight decay, and the held-out split's knobs
    where they are not their defaults (``Budget.record``)."""
    decay = budget.get("weight_decay", 0.0)
    extras = [f"wd {decay:g}" if decay else "", f"{budget['split']} split" if "split" in budget else "",
              f"data seed {budget['data_seed']}" if "data_seed" in budget else "",
              f"salt {budget['salt']!r}" if "salt" in budget else ""]
    return ", ".join([f"{budget['steps']} steps, lr {budget['lr']:g}", *filter(None, extras)])


def is_control(row: dict) -> bool:
    """Whether the row belongs to a capacity-control group (the word "control" in its group label)."""
    return re.search(r"\bcontrol\b", row["group"]) is not None


def _setting(row: dict) -> tuple:
    """The probe (and the held-out set's, where it differs) and the model shape but its head width: rows of one
    setting differ only in d."""
    return row["probe"], row.get("test_probe"), tuple(sorted((k, v) for k, v in row["shape"].items()
                                                             if k != "head_dim"))


def _run(row: dict) -> tuple:
    """Backend, seeds and the whole budget: a control must have been trained as the row was."""
    return row["backend"], tuple(row["seeds"]), tuple(sorted(row["budget"].items()))


def control_for(row: dict, rows: list[dict]) -> dict | None:
    """The control row of `row` among `rows` (module docstring), or None; a control row is its own control."""
    if is_control(row):
        return row
    return next((c for c in rows if is_control(c) and _setting(c) == _setting(row) and _run(c) == _run(row)), None)


def control_passes(control: dict) -> bool:
    return control["successes"] == len(control["seeds"])


def capacity_note(row: dict, rows: list[dict], reference: str = REFERENCE) -> str:
    """The last column of the Markdown table: what the row's capacity control says ("" where its setting has no
    control at all)."""
    control = control_for(row, rows)
    if control is None:
        has_controls = any(is_control(c) and _setting(c) == _setting(row) for c in rows)
        return "no control row: not a capacity result" if has_controls and row["backend"] != reference else ""
    count, d = f"{control['successes']}/{len(control['seeds'])}", control["shape"]["head_dim"]
    if not control_passes(control):
        return f"control failed: not a capacity result (d={d}: {count})"
    return f"control: passes ({count})" if control is row else f"control d={d} passes ({count})"


def counts_as_capacity_result(row: dict, rows: list[dict], reference: str = REFERENCE) -> bool:
    """False for a row that is not a capacity result (module docstring); True otherwise."""
    return "not a capacity result" not in capacity_note(row, rows, reference)


def markdown_table(rows: list[dict], comparisons: list[dict]) -> str:
    """Every row (ours and the paper's), then every FPA comparison; the last column is the row's capacity control."""
    tests = {(c["group"], c["b"], training(c["budget"])): c for c in comparisons}
    lines = ["| group | backend | training | seeds succeeding (ours) | paper | mean accuracy | min–max "
             "| FPA better: p (FPA only : other only) | capacity control |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        n, acc = len(r["seeds"]), r["accuracies"]
        budget = training(r["budget"])
        test = tests.get((r["group"], r["backend"], budget))
        p = f"{_p(test['p_value'])} ({test['a_only']}:{test['b_only']})" if test else ""
        lines.append(f"| {r['group']} | {r['backend']} | {budget} | {r['successes']}/{n} | {r.get('paper') or '—'} | "
                     f"{sum(acc) / n:.3f} | {min(acc):.3f}–{max(acc):.3f} | {p} | {capacity_note(r, rows)} |")
    return "\n".join(lines) + "\n"


def comparison_table(comparisons: list[dict], rows: list[dict] | None = None) -> str:
    """Every FPA comparison. Where the comparisons carry Holm-adjusted p-values (``runner.comparisons``; results
    recorded before it have none), a column gives the tested direction's adjusted value beside the raw ones. With
    `rows`, a comparison whose other row is not a capacity result (module docstring) is flagged in the last column:
    its p-value says nothing about capacity."""
    adjusted = bool(comparisons) and all("p_holm" in c for c in comparisons)
    lines = ["| group | training | FPA vs | only FPA succeeds | only the other succeeds | p (FPA better) "
             "| p (other better) |" + (" Holm, tested direction |" if adjusted else "")
             + (" capacity result |" if rows is not None else ""),
             "|---|---|---|---|---|---|---|" + ("---|" if adjusted else "") + ("---|" if rows is not None else "")]
    for c in comparisons:
        line = (f"| {c['group']} | {training(c['budget'])} | {c['b']} | {c['a_only']} | {c['b_only']} "
                f"| {_p(c['p_value'])} | {_p(c['p_value_reverse'])} |")
        if adjusted:
            line += f" {_p(c['p_holm'])} ({'FPA' if c['tested'] == 'a' else 'other'} better) |"
        if rows is not None:
            other = next((r for r in rows if r["group"] == c["group"] and r["backend"] == c["b"]
                          and r["budget"] == c["budget"]), None)
            note = capacity_note(other, rows, c["a"]) if other is not None else ""
            line += f" {note if 'not a capacity result' in note else 'yes' if note else ''} |"
        lines.append(line)
    return "\n".join(lines) + "\n"


def curve_table(rows: list[dict], still: float = 0.1) -> str:
    """The rows that recorded loss curves (``RowRun.loss_curve``): the seeds' mean training loss at a quarter, half,
    three quarters and the end of the steps, and how many seeds are still falling at the end (their loss in the
    last window more than `still` below the window a quarter of the steps before it) or never left the start
    (the last window within `still` of the first): a budget is long enough for a row when no seed is still
    falling. Empty where no row has curves."""
    with_curves = [r for r in rows if r.get("loss_curve")]
    if not with_curves:
        return ""
    lines = ["| group | backend | training | mean loss at 25 % | 50 % | 75 % | 100 % | seeds still falling "
             "| seeds that never left the start |", "|---|---|---|---|---|---|---|---|---|"]
    for r in with_curves:
        curves, n = r["loss_curve"], len(r["loss_curve"][0])
        at = [sum(c[min(n - 1, round(f * n) - 1)] for c in curves) / len(curves) for f in (0.25, 0.5, 0.75, 1.0)]
        back = max(0, n - 1 - max(1, n // 4))
        falling = sum(c[-1] < (1 - still) * c[back] for c in curves)
        stuck = sum(c[-1] > (1 - still) * c[0] for c in curves)
        lines.append(f"| {r['group']} | {r['backend']} | {training(r['budget'])} | "
                     + " | ".join(f"{x:.3g}" for x in at) + f" | {falling}/{len(curves)} | {stuck}/{len(curves)} |")
    return "\n".join(lines) + "\n"


def plot_table(rows: list[dict]) -> plt.Figure:
    """One horizontal bar per row: the fraction of seeds that succeed (the paper's count as a tick where numeric)."""
    fig, ax = plt.subplots(figsize=(8, 0.28 * len(rows) + 1.2))
    labels = [f"{r['group']} · {r['backend']}" for r in rows]
    y = range(len(rows))
    ax.barh(y, [r["successes"] / len(r["seeds"]) for r in rows], color="tab:blue", label="ours")
    ticks = [(int(p[0]) / int(p[1]), i) for i, r in enumerate(rows)
             if len(p := (r.get("paper") or "").split("/")) == 2 and p[0].isdigit()]
    ax.plot([x for x, _ in ticks], [i for _, i in ticks], "k|", linestyle="none", markersize=10, label="paper")
    ax.set_yticks(list(y), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set(xlim=(0, 1.02), xlabel="fraction of seeds at or above the criterion", title="probes")
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    return fig
