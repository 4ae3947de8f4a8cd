"""The paper's rows against ours: the summary table that opens docs/probes.md, generated from committed results.

**What is tested.** Every row of ours that carries a paper count (``Group.paper``) is an *entry*. An entry whose
backend is compared with FPA in its group, and whose paper counts for the two backends differ by at least
``SEPARATION`` seeds of 15, claims a *separation* in the paper's direction (FPA better, e.g. 11/15 against 0/15; or
the other better, e.g. MQAR's softmax 15/15 against FPA's 0/15). Every other entry claims a *count* (FPA's own
11/15, a control's 15/15, "fails").

**Two families of tests, each adjusted with Holm** (``fpa_lightning.probes.stats.holm``):
- *sign tests*: every comparison of every committed result file (``SOURCES``), one test each, in its tested
  direction (``direction_to_test``: the paper's where its counts claim a separation, else FPA better). Over a hundred
  of them are read together, so a raw p of 5e-4 is not significant after adjustment;
- *count tests*: our count against the paper's, Fisher's exact test (two-sided, ``stats.fisher_exact``), for every
  entry of the summary that is neither untestable nor pending. "fails" is read as 0/15; a range ("14–15/15") is
  tested at the end nearer ours.

**Verdicts**, at α = ``ALPHA`` on the adjusted p-values:
- a separation is *reproduced* when its sign test is significant, *contradicted* when our count differs
  significantly from the paper's (the peer the paper says fails succeeds, or the reverse), else *inconclusive*;
- a count is *contradicted* when it differs significantly from the paper's, else *reproduced* (consistent with it);
- a line of the summary (one group) is *contradicted* if any entry is, else *inconclusive* if any is, else
  *reproduced*; *untestable* where the line says why (``Line.untestable``), *pending* where its run has not been made.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from fpa_lightning.probes.stats import fisher_exact, holm

REFERENCE = "fpa"
ALPHA = 0.05
SEPARATION = 5
"""A pair of paper counts claims a separation when they differ by at least this many seeds (of 15)."""
N_PAPER = 15
"""The paper's seeds per row."""

NAMES = {"fpa": "FPA", "fpa_stack": "stack form", "fpa_dipsum": "dip-sum", "fpa_nolevel": "no key level",
         "fpa_querylevel": "query level", "fpa_nobias1": "no layer-1 bias",
         "fpa_nobias1_rope": "no layer-1 bias, RoPE there", "sdpa_rope1": "softmax, RoPE in layer 1",
         "fpa_noretrieval": "no content retrieval", "fox": "FoX", "selective": "Selective", "dcp": "DCP",
         "sdpa": "softmax", "nope": "NoPE", "alibi": "ALiBi"}


def name(backend: str) -> str:
    return NAMES.get(backend, backend)


# --- paper counts and the tested direction -----------------------------------------------------------------------
def paper_count(text: str | None) -> tuple[int, int] | None:
    """The paper's result as a range of successes out of 15: "11/15" -> (11, 11), "14–15/15" -> (14, 15), "fails"
    -> (0, 0); None where the paper gives none."""
    if not text:
        return None
    if text.strip() == "fails":
        return 0, 0
    match = re.fullmatch(r"\s*(\d+)(?:\s*[–-]\s*(\d+))?\s*/\s*(\d+)\s*", text)
    if match is None:
        raise ValueError(f"unreadable paper count {text!r}")
    low, high = int(match.group(1)), int(match.group(2) or match.group(1))
    return low, high


def paper_direction(paper_a: str | None, paper_b: str | None) -> str | None:
    """Which backend the paper's counts put ahead ("a" or "b") where they differ by at least ``SEPARATION`` seeds;
    None where the paper claims no separation (or gives a count for one of the two only)."""
    a, b = paper_count(paper_a), paper_count(paper_b)
    if a is None or b is None:
        return None
    if a[0] - b[1] >= SEPARATION:
        return "a"
    if b[0] - a[1] >= SEPARATION:
        return "b"
    return None


def direction_to_test(paper_a: str | None, paper_b: str | None) -> str:
    """The direction a comparison is tested in: the paper's where its counts claim a separation, else "a" (FPA
    better, the table's hypothesis)."""
    return paper_direction(paper_a, paper_b) or "a"


def count_p(paper: str, successes: int, n: int) -> float:
    """Fisher's exact test of our count against the paper's (at the end of a range nearer ours)."""
    low, high = paper_count(paper)
    return max(fisher_exact(k, N_PAPER, successes, n) for k in {low, high})


# --- the summary's sources and lines ------------------------------------------------------------------------------
SOURCES = {
    # the H200 table, with dip_depth at 6000 steps (run on an H100) merged in
    "h200": ("benchmarks/results/probes/h100_2026-12-06_dip_depth_steps/probes.json", "H200"),
    "mqar": ("benchmarks/results/probes/h100_2026-12-06_mqar_regime_rope1/probes.json", "H200"),
    "cpu": ("benchmarks/results/probes/cpu_2026-12-02_noretrieval/probes.json", "CPU"),
    "dip6000": ("benchmarks/results/probes/cpu_2026-12-05_dip_depth_6000/probes.json", "CPU"),
    "dipdata1": ("benchmarks/results/probes/cpu_2026-12-05_dip_depth_data_seed1/probes.json", "CPU"),
    "dip1data1": ("benchmarks/results/probes/cpu_2026-12-05_dip_depth_duration1_data_seed1/probes.json", "CPU"),
    # the label split of every probe that defines a label-determining part; the summary's label-split lines read it
    "label": ("benchmarks/results/probes/h100_2026-12-06_label_split/probes.json", "H100"),
    # the CPU's label-split runs of 2026-12-05, which it repeats (within two seeds a row): no line reads them, but
    # their tests stay in the family, which is every committed test
    "ladderlabel": ("benchmarks/results/probes/cpu_2026-12-05_ladder_label/probes.json", "CPU"),
    "unnamedlabel": ("benchmarks/results/probes/cpu_2026-12-05_unnamed_ladder_label/probes.json", "CPU"),
    "diplabel": ("benchmarks/results/probes/cpu_2026-12-05_dip_depth_label/probes.json", "CPU"),
    "walkslabel": ("benchmarks/results/probes/cpu_2026-12-05_walks_label/probes.json", "CPU"),
    "multidiplabel": ("benchmarks/results/probes/cpu_2026-12-05_multi_dip_ladder_label/probes.json", "CPU"),
    "durationlabel": ("benchmarks/results/probes/cpu_2026-12-05_dip_duration_label/probes.json", "CPU"),
    "salt1": ("benchmarks/results/probes/cpu_2026-12-05_salt1/probes.json", "CPU"),
    "multidipsalt1": ("benchmarks/results/probes/cpu_2026-12-05_multi_dip_positions_label_salt1/probes.json", "CPU"),
    "dipextrasalt1": ("benchmarks/results/probes/cpu_2026-12-05_dip_depth_extrapolation_salt1/probes.json", "CPU"),
    "laddersalt1": ("benchmarks/results/probes/cpu_2026-12-05_ladder_salt1/probes.json", "CPU"),
    "unnamedsalt1": ("benchmarks/results/probes/cpu_2026-12-05_unnamed_ladder_salt1/probes.json", "CPU"),
    "restsalt1": ("benchmarks/results/probes/cpu_2026-12-05_rest_salt1/probes.json", "CPU"),
    "mqarsalt1": ("benchmarks/results/probes/cpu_2026-12-06_mqar_salt1/probes.json", "CPU"),
    # the positioned unnamed ladder at r = 18, 4500 steps, two rates, widths 2-19 and the control: 120 rows on an
    # H200 and lr 0.003's widths 13-19 and control on an H100 (a line of those says so); the CPU's run of the same
    # rows is in the family, no line reads it
    "r18": ("benchmarks/results/probes/h200_h100_2026-12-07_unnamed_ladder_r18_widths/probes.json", "H200"),
    "r18cpu": ("benchmarks/results/probes/cpu_2026-12-06_unnamed_ladder_r18_widths/probes.json", "CPU"),
    # the MQAR paper regime's 2-layer group at salt 1: FPA, softmax and FPA without the layer-1 bias
    "mqarregimesalt1": ("benchmarks/results/probes/h100_2026-12-07_mqar_regime_salt1/probes.json", "H100"),
    # its 3-layer group at salt 1 (FPA alone, as in the paper's row), from two calls' seed chunks
    "mqarregime3salt1": ("benchmarks/results/probes/h100_2026-12-07_mqar_regime_salt1_3layers/probes.json", "H100"),
    # its 4-layer group at salt 1 (FPA alone), from three calls' seed chunks
    "mqarregime4salt1": ("benchmarks/results/probes/h100_2026-12-07_mqar_regime_salt1_4layers/probes.json", "H100"),
    # its 2-layer group's FPA without the layer-1 bias and softmax, both with RoPE in layer 1, at salt 1, beside FPA
    # (the same FPA row as mqarregimesalt1's)
    "mqarregimerope1salt1": ("benchmarks/results/probes/h100_2026-12-07_mqar_regime_salt1_rope1/probes.json", "H100"),
    # the MQAR regime at T = 512, softmax alone at 9000 steps: lr 0.01 on seeds 0-7, lr 0.003 on seeds 4-7
    "mqar512": ("benchmarks/results/probes/h100_2026-12-06_mqar_t512_9000_s0-7/probes.json", "H100"),
    "mqar512lr": ("benchmarks/results/probes/h200_2026-12-06_mqar_t512_9000_lr0003_s4/probes.json", "H200"),
}
"""Every committed result file with sign tests (the Holm family is all of them), each read by lines of the summary but
the CPU's label-split files, and the two softmax-only files (no sign test) of the T = 512 regime's lines: key -> (path
from the repository root, device)."""


@dataclass(frozen=True)
class Line:
    """One line of the summary: the rows of one group of one source, or a run still to be made."""

    group: str
    """The group's label (in the source, or in ``table.GROUPS`` for a pending line)."""
    source: str | None = None
    """A key of ``SOURCES``; None for a pending line."""
    note: str = ""
    """A few words after the verdict."""
    untestable: str = ""
    """Why the line cannot test the paper's claim (its verdict then says so)."""
    pending: str = ""
    """The command of a run still to be made (its verdict then says so)."""
    pending_note: str = ""
    """A few words after the pending command."""
    title: str = ""
    """The first cell where it is not the group's label (a pending line of several groups)."""
    paper: str = ""
    """The paper's cell of a pending line."""
    lr: float | None = None
    """Only the group's rows trained at this peak learning rate, where the source holds several rates."""
    steps: int | None = None
    """Only the group's rows trained for this many steps, where the source holds several step counts."""
    backends: tuple[str, ...] = ()
    """Only these backends' rows are the line's entries, where the group's rows are split over two lines (FPA's row
    is still shown and gives the paper's direction; its count is tested on the line that lists it); those of them
    without a paper count are shown too."""
    device: str = ""
    """The device cell where it is not the source's (a merged file whose rows ran on two machines)."""
    replicates: str = ""
    """For a data replicate (another salt): the first cell of the line whose rows it repeats on other data."""


T512_DROPPED = "the regime is dropped (\"Runs to make\", 2)"
"""How the T = 512 regime's 9000-step lines end: softmax, the paper's 15/15, leaves the loss plateau at chance on some
seeds only, at a step that varies by seed and rate, so any count there measures the plateau and the regime is not
run further (docs/probes.md, "Status: what ran where")."""


def ladder_groups(named: str, unnamed: str) -> list[tuple[str, str]]:
    """(group, source) of the named ladder's d = 4 rows and wide controls from ``named``, then the unnamed ladder's
    with positions from ``unnamed``: the groups every replicate of the ladders re-runs."""
    return ([(f"ladder, d=4, r={r}", named) for r in (6, 10, 14, 18)]
            + [(f"ladder control, d={r + 2}, r={r}", named) for r in (10, 14, 18)]
            + [(f"unnamed ladder, positions, d=4, r={r}", unnamed) for r in (10, 14, 18)]
            + [(f"unnamed ladder control, positions, d={r + 2}, r={r}", unnamed) for r in (10, 14, 18)])


LABEL_NOTE = "held-out parts never in the pool, on which the hand-set FPA head is exact (\"Training, held-out sets\")"
LABEL_FIXED_NOTE = "label split; unlike the sequence split's, its held-out part holds every class"
LABEL_SPLIT_LINES = [
    Line(group, "label", title=f"{group}, label split",
         note=LABEL_NOTE if i == 0 else LABEL_FIXED_NOTE if group == "dip duration, fixed" else "label split, as above")
    for i, group in enumerate(
        [group for group, _ in ladder_groups("label", "label")]
        + [f"multi-dip ladder, d=4, r={r}" for r in (10, 14, 18)]
        + ["dip duration, variable", "dip duration, fixed", "dip depth, durations 1-2", "dip depth, duration 1",
           "two families, 2 heads of d=2", "push/pop"])]
"""The rows under the label split (issue #45, item 4) of the ladders, the multi-dip ladder, dip_duration, dip_depth,
two_families and push_pop, after their sequence-split lines: one run on the GPU (the same commands on the CPU gave
every row within two seeds, docs/probes.md "Status: what ran where")."""

SALT_LINES = [
    Line(group, source, title=f"{group}, salt 1", replicates=group,
         note="another quarter of the space held out (`--salt 1`)" if i == 0 else "salt 1, as above")
    for i, (group, source) in enumerate(
        ladder_groups("laddersalt1", "unnamedsalt1")
        + [(f"multi-dip ladder, d=4, r={r}", "restsalt1") for r in (10, 14, 18)]
        + [("dip duration, variable", "restsalt1"), ("dip duration, fixed", "restsalt1")]
        + [(group, "salt1") for group in ["two families, 2 heads of d=2", "push/pop", "find a name among alive keys",
                                          "find a name, without content retrieval", "flip-flop", "counting"]]
        + [("copy", "restsalt1"), ("variable assignment", "restsalt1")]
        + [(f"mqar, {layers} layers", "mqarsalt1") for layers in (2, 3, 4)])] + [
    Line("mqar, paper regime, 2 layers, 32 pairs, T=256", "mqarregimesalt1",
         title="mqar, paper regime, 2 layers, 32 pairs, T=256, salt 1", note="salt 1, as above",
         replicates="mqar, paper regime, 2 layers, 32 pairs, T=256"),
    Line("mqar, paper regime, 3 layers, 32 pairs, T=256", "mqarregime3salt1",
         title="mqar, paper regime, 3 layers, 32 pairs, T=256, salt 1", note="salt 1, as above",
         replicates="mqar, paper regime, 3 layers, 32 pairs, T=256"),
    Line("mqar, paper regime, 4 layers, 32 pairs, T=256", "mqarregime4salt1",
         title="mqar, paper regime, 4 layers, 32 pairs, T=256, salt 1", note="salt 1, as above",
         replicates="mqar, paper regime, 4 layers, 32 pairs, T=256"),
    Line("mqar, paper regime, 2 layers, 32 pairs, T=256", "mqarregimerope1salt1",
         backends=("fpa_nobias1_rope", "sdpa_rope1"),
         title="mqar, paper regime, 2 layers, 32 pairs, T=256: layer 1 softmax with RoPE, salt 1",
         note="salt 1, as above",
         replicates="mqar, paper regime, 2 layers, 32 pairs, T=256: layer 1 softmax with RoPE")]
"""A data replicate (issue #45, item 5) of the H200 table's sequence-split lines: the split's hash keyed with another
salt, so that another part of each sequence space is held out and the pool is drawn from the rest (of the MQAR paper
regime the 2-layer group's FPA, softmax and no-layer-1-bias rows, the 3- and 4-layer groups' FPA, and the
no-layer-1-bias and softmax rows with RoPE in layer 1; ``dip_depth``'s replicate draws another pool and held-out
set, ``--data-seed 1``)."""

LINES = [
    Line("ladder, d=4, r=6", "h200"),
    Line("ladder, d=4, r=10", "h200", note="each push names its rung, so a vote over the pushes answers"),
    Line("ladder, d=4, r=14", "h200", note="each push names its rung"),
    Line("ladder, d=4, r=18", "h200", note="each push names its rung"),
    Line("ladder control, d=12, r=10", "h200"),
    Line("ladder control, d=16, r=14", "h200"),
    Line("ladder control, d=20, r=18", "h200"),
    Line("unnamed ladder, positions, d=4, r=10", "h200", note="our ladder: pushes name only their colour, every "
         "backend gets a learned position embedding"),
    Line("unnamed ladder, positions, d=4, r=14", "h200", note="our ladder, as above"),
    Line("unnamed ladder, positions, d=4, r=18", "h200", note="our ladder, as above; the peers' mean 0.988 sits on "
         "the 0.99 criterion"),
    Line("unnamed ladder, positions, d=4, r=18", "r18", lr=0.01,
         title="unnamed ladder, positions, d=4, r=18, 4500 steps",
         note="three times the steps at the same rate (0.01); widths 2–19: \"Where we differ from the paper\", 1"),
    Line("unnamed ladder control, positions, d=20, r=18", "r18", lr=0.01,
         title="unnamed ladder control, positions, d=20, r=18, 4500 steps"),
    Line("unnamed ladder, positions, d=4, r=18", "r18", lr=0.003,
         title="unnamed ladder, positions, d=4, r=18, 4500 steps, lr 0.003", note="the line above at the second rate"),
    Line("unnamed ladder control, positions, d=20, r=18", "r18", lr=0.003, device="H100",
         title="unnamed ladder control, positions, d=20, r=18, 4500 steps, lr 0.003"),
    Line("unnamed ladder control, positions, d=12, r=10", "h200"),
    Line("unnamed ladder control, positions, d=16, r=14", "h200"),
    Line("unnamed ladder control, positions, d=20, r=18", "h200"),
    Line("multi-dip ladder, d=4, r=10", "h200", note="one layer, no positions; the positioned rows (no paper count) "
         "are under \"Where we differ from the paper\""),
    Line("multi-dip ladder, d=4, r=14", "h200", note="as above"),
    Line("multi-dip ladder, d=4, r=18", "h200", note="as above"),
    Line("dip duration, variable", "h200", note="every dip token names its depth; 133 distinct held-out sequences"),
    Line("dip duration, fixed", "h200", untestable="its held-out part holds 28 sequences and no class 2"),
    Line("dip depth, durations 1-2", "h200", steps=2000, note="our unit-step probe; trained 1–2 and tested 3–4, "
         "the dip sum fails (next section)"),
    Line("dip depth, duration 1", "h200", steps=2000, note="our unit-step probe"),
    Line("dip depth, durations 1-2", "h200", steps=6000, device="H100",
         title="dip depth, durations 1-2, 6000 steps, GPU", note="three times the budget of the 2000-step line"),
    Line("dip depth, duration 1", "h200", steps=6000, device="H100", title="dip depth, duration 1, 6000 steps, GPU",
         note="as above"),
    Line("dip depth, durations 1-2", "dip6000", title="dip depth, durations 1-2, 6000 steps",
         note="the 6000-step line above, on the CPU"),
    Line("dip depth, duration 1", "dip6000", title="dip depth, duration 1, 6000 steps", note="as above"),
    Line("dip depth, durations 1-2", "dipdata1", title="dip depth, durations 1-2, data seed 1",
         note="a data replicate (another pool and held-out set) of the 2000-step line"),
    Line("dip depth, duration 1", "dip1data1", title="dip depth, duration 1, data seed 1",
         note="a data replicate (another pool and held-out set) of the 2000-step line"),
    *LABEL_SPLIT_LINES,
    Line("two families, 2 heads of d=2", "h200"),
    Line("push/pop", "h200"),
    Line("find a name among alive keys", "h200", note="a global binding is its own token, so content marks it"),
    Line("find a name, without content retrieval", "cpu"),
    Line("flip-flop", "h200"),
    Line("copy", "h200", note="one FPA layer without positions cannot point n back"),
    Line("counting", "h200"),
    Line("variable assignment", "h200"),
    *SALT_LINES,
    Line("mqar, 2 layers", "h200", note="compact MQAR: 8 pairs, no MLP"),
    Line("mqar, 3 layers", "h200", note="compact MQAR"),
    Line("mqar, 4 layers", "h200", note="compact MQAR"),
    Line("mqar, paper regime, 2 layers, 32 pairs, T=256", "mqar", backends=(REFERENCE, "sdpa", "fpa_nobias1"),
         note="our no-layer-1-bias model has no position in layer 1 (confounded; next line)"),
    Line("mqar, paper regime, 2 layers, 32 pairs, T=256", "mqar", backends=("fpa_nobias1_rope", "sdpa_rope1"),
         title="mqar, paper regime, 2 layers, 32 pairs, T=256: layer 1 softmax with RoPE",
         device="H200 (FPA), H100 (RoPE rows)", note="the all-softmax model with the same layer 1 has no paper count"),
    Line("mqar, paper regime, 3 layers, 32 pairs, T=256", "mqar"),
    Line("mqar, paper regime, 4 layers, 32 pairs, T=256", "mqar"),
    Line("mqar, paper regime, 2 layers, 64 pairs, T=512", "mqar", untestable="softmax recalls on 2/15 in 3000 steps, "
         "13 seeds at chance: the row measures the budget (9000 steps: next two lines)"),
    Line("mqar, paper regime, 2 layers, 64 pairs, T=512", "mqar512",
         title="mqar, paper regime, 2 layers, 64 pairs, T=512, 9000 steps, lr 0.01",
         untestable="3 seeds end at chance (loss 4.90-4.91), 5 recall by step 1350: whether and when softmax leaves "
         "the plateau varies by seed; " + T512_DROPPED),
    Line("mqar, paper regime, 2 layers, 64 pairs, T=512", "mqar512lr",
         title="mqar, paper regime, 2 layers, 64 pairs, T=512, 9000 steps, lr 0.003",
         untestable="seeds 6 and 7 at chance again (loss 4.99, 4.97), seed 4 recalls only after about 4200 steps, "
         "seeds 0 and 1 recalled in the calibration (4/6); " + T512_DROPPED),
]


# --- computing the summary ----------------------------------------------------------------------------------------
def load_sources(root: Path, spec: dict[str, tuple[str, str]] = SOURCES) -> dict[str, dict]:
    """key -> the ``results`` of each file of `spec` (``SOURCES``: the committed ones)."""
    return {key: json.loads((root / path).read_text(encoding="utf-8"))["results"] for key, (path, _) in spec.items()}


def sign_family(sources: dict[str, dict]) -> list[dict]:
    """Every comparison of every source, each with its tested direction, tested p-value and Holm-adjusted p-value
    over the whole family (``tested``, ``p_tested``, ``p_holm``; new keys, the source's comparison is not
    changed)."""
    family = []
    for key, results in sources.items():
        rows = results["rows"]
        for c in results["comparisons"]:
            a, b = (next(r for r in rows if r["backend"] == c[side] and r["group"] == c["group"]
                         and r["budget"] == c["budget"]) for side in ("a", "b"))
            tested = direction_to_test(a.get("paper"), b.get("paper"))
            family.append({**c, "source": key, "tested": tested,
                           "p_tested": c["p_value"] if tested == "a" else c["p_value_reverse"]})
    for c, adjusted in zip(family, holm([c["p_tested"] for c in family])):
        c["p_holm"] = adjusted
    return family


@dataclass
class Entry:
    row: dict
    comparison: dict | None
    direction: str | None
    """The separation the paper claims ("a": FPA better, "b": the other), or None: a count claim."""
    count_p: float = 1.0
    count_holm: float = 1.0

    @property
    def ours(self) -> str:
        return f"{self.row['successes']}/{len(self.row['seeds'])}"

    def kind(self) -> str:
        count_differs = self.count_holm <= ALPHA
        if self.direction is not None and self.comparison is not None:
            if self.comparison["p_holm"] <= ALPHA and self.comparison["tested"] == self.direction:
                return "reproduced"
            return "contradicted" if count_differs else "inconclusive"
        return "contradicted" if count_differs else "reproduced"


def format_p(value: float) -> str:
    """A p-value as the summary prints it: two significant digits, scientific below 0.001."""
    return f"{value:.2g}" if value >= 0.001 else f"{value:.1e}"


def entries(line: Line, sources: dict[str, dict], family: list[dict]) -> list[Entry]:
    """The rows of the line's group with a paper count (FPA's row first where it has one), each with its comparison
    with FPA from the family."""
    rows = _group_rows(line, sources)
    if not rows:
        raise ValueError(f"summary line {line.group!r}: no row of that group in source {line.source!r}")
    reference = next((r for r in rows if r["backend"] == REFERENCE), None)
    out = []
    for row in rows:
        if not row.get("paper") or (line.backends and row["backend"] not in line.backends):
            continue
        comparison = next((c for c in family if c["source"] == line.source and c["group"] == row["group"]
                           and c["b"] == row["backend"] and c["budget"] == row["budget"]), None)
        direction = paper_direction(reference.get("paper"), row["paper"]) if reference and comparison else None
        out.append(Entry(row, comparison, direction))
    return out


def _group_rows(line: Line, sources: dict[str, dict]) -> list[dict]:
    """The rows of the line's group in its source, FPA's first."""
    rows = [r for r in sources[line.source]["rows"]
            if r["group"] == line.group and (line.lr is None or r["budget"]["lr"] == line.lr)
            and (line.steps is None or r["budget"]["steps"] == line.steps)]
    return sorted(rows, key=lambda r: r["backend"] != REFERENCE)


def summary(root: Path, lines: list[Line] = LINES, spec: dict[str, tuple[str, str]] = SOURCES) -> list[dict]:
    """Each line's cells and verdict kind: [{"cells": [...], "kind": ...}] in the order of `lines`, from the result
    files of `spec` (key -> (path under `root`, device))."""
    sources = load_sources(root, spec)
    family = sign_family(sources)
    per_line = {i: entries(line, sources, family) for i, line in enumerate(lines)
                if line.source is not None}
    counted = [e for i, es in per_line.items() if not lines[i].untestable for e in es]
    raw = [count_p(e.row["paper"], e.row["successes"], len(e.row["seeds"])) for e in counted]
    for e, p, adjusted in zip(counted, raw, holm(raw)):
        e.count_p, e.count_holm = p, adjusted
    return [_render(line, per_line.get(i), sources, spec) for i, line in enumerate(lines)]


def replicate_verdicts(root: Path, lines: list[Line] = LINES,
                       spec: dict[str, tuple[str, str]] = SOURCES) -> list[tuple[str, str, str]]:
    """Each data replicate's verdict beside the one of the line it repeats (issue #45, item 5: does every verdict
    hold on other data?): [(the replicate's first cell, the original's kind, the replicate's kind)]."""
    pairs = list(zip(lines, summary(root, lines, spec)))
    original = {line.title or line.group: found["kind"] for line, found in pairs if not line.replicates}
    return [(line.title or line.group, original[line.replicates], found["kind"]) for line, found in pairs
            if line.replicates]


def _render(line: Line, found: list[Entry] | None, sources: dict[str, dict], spec: dict[str, tuple[str, str]]) -> dict:
    if line.pending:
        note = f" ({line.pending_note})" if line.pending_note else ""
        return {"cells": [line.title or line.group, line.paper, "—", "—", f"pending: `{line.pending}`{note}"],
                "kind": "pending"}
    rows = _group_rows(line, sources)
    reference = next((r for r in rows if r["backend"] == REFERENCE), None)
    paper = "; ".join(f"{name(e.row['backend'])} {e.row['paper']}" for e in found)
    shown = ([reference] if reference is not None and all(e.row is not reference for e in found) else []) + \
        [e.row for e in found] + [r for r in rows if not r.get("paper") and r["backend"] in line.backends]
    budget = shown[0]["budget"]
    protocol = (f"{line.device or spec[line.source][1]}, {len(shown[0]['seeds'])} seeds, {budget['steps']} steps, "
                f"{budget.get('split', 'sequence')} split")
    ours = protocol + ": " + "; ".join(f"{name(r['backend'])} {r['successes']}/{len(r['seeds'])}" for r in shown)
    tests = [e for e in found if e.comparison is not None]
    p_cell = "; ".join(f"{name(e.row['backend'])}{' better' if e.comparison['tested'] == 'b' else ''} "
                       f"{format_p(e.comparison['p_tested'])} → {format_p(e.comparison['p_holm'])}" for e in tests) or "—"
    if line.untestable:
        kind, verdict = "untestable", f"untestable: {line.untestable}"
    else:
        kinds = [e.kind() for e in found]
        kind = next(k for k in ("contradicted", "inconclusive", "reproduced") if k in kinds or k == "reproduced")
        detail = _detail(kind, [e for e in found if e.kind() == kind])
        verdict = kind + (f": {detail}" if detail else "") + (f"; {line.note}" if line.note else "")
    return {"cells": [line.title or line.group, paper, ours, p_cell, verdict], "kind": kind}


def _detail(kind: str, which: list[Entry]) -> str:
    if kind == "contradicted":
        return ", ".join(f"{name(e.row['backend'])} {e.ours} vs {e.row['paper']} (count p {format_p(e.count_holm)})"
                         for e in which)
    if kind == "inconclusive":
        return ", ".join(f"{name(e.row['backend'])} {e.comparison['a_only']}:{e.comparison['b_only']}, "
                         f"p {format_p(e.comparison['p_holm'])}" for e in which)
    separations = [e for e in which if e.direction is not None]
    return ", ".join(f"{name(e.row['backend'])} p {format_p(e.comparison['p_holm'])}" for e in separations)


KINDS = ("reproduced", "contradicted", "inconclusive", "untestable", "pending")
"""A summary line's verdict kinds, in the tally's order."""

HEADER = ["paper row (our group)", "the paper", "ours: device, seeds, steps, held-out split: seeds ≥ 0.99",
          "sign test vs FPA (the paper's direction): p raw → Holm", "verdict (α = 0.05, adjusted)"]


def summary_table(root: Path, lines: list[Line] = LINES, spec: dict[str, tuple[str, str]] = SOURCES) -> str:
    """The summary as a Markdown table."""
    out = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    out += ["| " + " | ".join(line["cells"]) + " |" for line in summary(root, lines, spec)]
    return "\n".join(out) + "\n"


def tally(root: Path, lines: list[Line] = LINES, spec: dict[str, tuple[str, str]] = SOURCES) -> dict[str, int]:
    """How many lines of each kind (every kind, 0 where no line has it)."""
    counts = dict.fromkeys(KINDS, 0)
    for line in summary(root, lines, spec):
        counts[line["kind"]] += 1
    return counts
