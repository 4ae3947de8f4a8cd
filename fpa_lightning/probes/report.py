"""The table as Markdown (ours next to the paper's) and as a figure."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only
import matplotlib.pyplot as plt


def _p(value: float) -> str:
    return f"{value:.2g}" if value >= 0.001 else f"{value:.1e}"


def training(budget: dict) -> str:
    """A budget in a few words: steps, learning rate and (when used) weight decay."""
    decay = budget.get("weight_decay", 0.0)
    return f"{budget['steps']} steps, lr {budget['lr']:g}" + (f", wd {decay:g}" if decay else "")


def markdown_table(rows: list[dict], comparisons: list[dict]) -> str:
    """Every row (ours and the paper's), then every FPA comparison."""
    tests = {(c["group"], c["b"], training(c["budget"])): c for c in comparisons}
    lines = ["| group | backend | training | seeds succeeding (ours) | paper | mean accuracy | min–max "
             "| FPA better: p (FPA only : other only) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        n, acc = len(r["seeds"]), r["accuracies"]
        budget = training(r["budget"])
        test = tests.get((r["group"], r["backend"], budget))
        p = f"{_p(test['p_value'])} ({test['a_only']}:{test['b_only']})" if test else ""
        lines.append(f"| {r['group']} | {r['backend']} | {budget} | {r['successes']}/{n} | {r.get('paper') or '—'} | "
                     f"{sum(acc) / n:.3f} | {min(acc):.3f}–{max(acc):.3f} | {p} |")
    return "\n".join(lines) + "\n"


def comparison_table(comparisons: list[dict]) -> str:
    lines = ["| group | training | FPA vs | only FPA succeeds | only the other succeeds | p (FPA better) "
             "| p (other better) |", "|---|---|---|---|---|---|---|"]
    for c in comparisons:
        lines.append(f"| {c['group']} | {training(c['budget'])} | {c['b']} | {c['a_only']} | {c['b_only']} "
                     f"| {_p(c['p_value'])} | {_p(c['p_value_reverse'])} |")
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
