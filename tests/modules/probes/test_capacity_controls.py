"""The capacity-control rule (issue #22, item 2): the table has a control group for every peer row of the multi-dip
ladder and of the positioned unnamed-ladder sweep, and the report counts a row as a capacity result only if its
backend's control passes."""
from modules.probes.report import (capacity_note, comparison_table, control_for, counts_as_capacity_result, is_control,
                                   markdown_table)
from modules.probes.table import GROUPS


def test_the_table_has_a_control_for_every_peer_row():
    """Every peer row of the multi-dip ladder and of the positioned unnamed-ladder sweep has a control group: the same
    probe and position embedding at d = r + 2, holding the same peers."""
    multi = [g for g in GROUPS if g.probe.name == "multi_dip_ladder"]
    sweep = [g for g in GROUPS if g.probe.name == "unnamed_ladder" and g.shape.positions]
    assert {g.probe.r for g in multi} == {g.probe.r for g in sweep} == {10, 14, 18}
    assert len(multi) == 12 and len(sweep) == 29
    assert sorted({g.shape.head_dim for g in sweep if g.probe.r == 14}) == [2, 4, 11, 12, 16]
    assert sorted({g.shape.head_dim for g in sweep if g.probe.r == 18}) == list(range(2, 21))  # every width 2..r+2
    for g in multi + sweep:
        r = g.probe.r
        assert ("control" in g.label) == (g.shape.head_dim == r + 2)
        positions = any(b in g.backends for b in ("nope", "alibi", "fox"))
        length = g.probe.length if g.probe.name == "multi_dip_ladder" else r + 2
        assert g.shape.positions == (length if positions else 0)
        peers = set(g.backends) - {"fpa"}
        control = [c for c in multi + sweep if "control" in c.label and c.probe == g.probe
                   and c.shape.positions == g.shape.positions]
        assert len(control) == 1 and peers <= set(control[0].backends)
        assert control[0].steps == g.steps


def row(group: str, backend: str, d: int, successes: int, positions: int = 14, seeds: int = 3,
        steps: int = 100) -> dict:
    success = [i < successes for i in range(seeds)]
    return {"group": group, "probe": "multi_dip_ladder(r=10, dips=3)", "backend": backend, "seeds": list(range(seeds)),
            "shape": {"heads": 1, "head_dim": d, "layers": 1, "width": 32, "positions": positions, "mlp": 0,
                      "norm": False},
            "budget": {"steps": steps, "lr": 0.01, "batch": 128}, "accuracies": [1.0 if s else 0.8 for s in success],
            "success": success, "successes": successes, "paper": None}


def test_a_row_counts_only_if_its_control_passes():
    rows = [row("multi-dip ladder, positions, d=4, r=10", "fpa", 4, 3),
            row("multi-dip ladder, positions, d=4, r=10", "nope", 4, 0),
            row("multi-dip ladder, positions, d=4, r=10", "fox", 4, 0),
            row("multi-dip ladder, positions, d=4, r=10", "alibi", 4, 0),
            row("multi-dip ladder control, positions, d=12, r=10", "nope", 12, 0),
            row("multi-dip ladder control, positions, d=12, r=10", "fox", 12, 3),
            row("multi-dip ladder control, positions, d=12, r=10", "alibi", 12, 3, steps=200),  # trained otherwise
            row("multi-dip ladder control, d=12, r=10", "alibi", 12, 3, positions=0)]  # without positions
    assert [is_control(r) for r in rows] == [False] * 4 + [True] * 4
    fpa, nope, fox, alibi = rows[:4]
    assert control_for(nope, rows) is rows[4] and control_for(fox, rows) is rows[5]
    assert control_for(alibi, rows) is None and control_for(fpa, rows) is None
    assert capacity_note(nope, rows) == "control failed: not a capacity result (d=12: 0/3)"
    assert capacity_note(fox, rows) == "control d=12 passes (3/3)"
    assert capacity_note(alibi, rows) == "no control row: not a capacity result"
    assert capacity_note(fpa, rows) == ""  # the reference needs no control of its own
    assert [counts_as_capacity_result(r, rows) for r in rows[:4]] == [True, False, True, False]
    assert capacity_note(rows[4], rows) == "control failed: not a capacity result (d=12: 0/3)"
    assert capacity_note(rows[5], rows) == "control: passes (3/3)"
    comparisons = [{"group": fpa["group"], "a": "fpa", "b": b, "budget": fpa["budget"], "a_only": 3, "b_only": 0,
                    "p_value": 0.125, "p_value_reverse": 1.0} for b in ("nope", "fox", "alibi")]
    table = markdown_table(rows, comparisons)
    assert "| 0.12 (3:0) | control failed: not a capacity result (d=12: 0/3) |" in table
    lines = comparison_table(comparisons, rows).splitlines()
    assert lines[0].endswith("| capacity result |")
    assert lines[2].endswith("| control failed: not a capacity result (d=12: 0/3) |")
    assert lines[3].endswith("| yes |") and lines[4].endswith("| no control row: not a capacity result |")
    assert not comparison_table(comparisons).splitlines()[0].endswith("capacity result |")  # without rows: as before
