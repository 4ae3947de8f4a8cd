"""docs/probes.md against the repository it describes (this file reads the committed probe results under
benchmarks/results/probes/: checking the page against them is its purpose; other probe tests read fixtures under
tests/probes/fixtures/).

- Every relative link, and every repository path in a code span, points to an existing file or folder.
- Every section of docs/probes.md that the code cites by name (the page, a comma, the quoted heading) exists.
- The summary that opens the page is what ``modules.probes.verdicts.summary_table`` makes of the committed result
  files today (counts, raw and Holm-adjusted p-values over every committed sign test, verdicts), its tally is the
  summary's, and every command it gives for a pending run parses; the run's own probes.md is its JSON rendered.
- Every committed row was measured under the disjoint held-out protocol.
- The numbers of the held-out sections: the share of held-out sequences whose label-determining part is in the pool,
  the overlap audit of the old protocol (pool and held-out set drawn independently, generator seeds 1 and 2), and
  the distinct held-out counts of the new protocol.
"""
import json
import re
import shlex
from pathlib import Path

import pytest
import torch

from fpa_lightning.probes.train import POOL_SEED, TEST_SEED, Budget, held_out_set, part_overlap, row_data, seeded
from modules.probes.report import comparison_table, markdown_table
from modules.probes.table import GROUPS
from modules.probes.verdicts import (LINES, REFERENCE, SALT_LINES, SOURCES, _group_rows, load_sources, sign_family,
                                     summary_table, tally)

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
PAGE = DOCS / "probes.md"
RESULTS = ROOT / "benchmarks" / "results" / "probes"
REPO_DIRS = ("docs/", "fpa_lightning/", "modules/", "examples/", "tests/", "benchmarks/")


def page() -> str:
    return PAGE.read_text(encoding="utf-8")


def flat(text: str) -> str:
    """Whitespace collapsed, so that a sentence wrapped over lines is found as one string."""
    return " ".join(text.split())


def results(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))["results"]


def split(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def cells(path: Path) -> dict[tuple[str, str], list[str]]:
    """(group, backend) -> the cells of its line in markdown_table of the JSON at `path`, in the JSON's order:
    group, backend, training, successes, paper, mean, min–max, comparison, capacity control."""
    r = results(path)
    return {tuple(c[:2]): c for c in map(split, markdown_table(r["rows"], r["comparisons"]).splitlines()[2:])}


def table_after(marker: str, text: str | None = None) -> list[str]:
    """The lines of the Markdown table (header included) that follows the line `marker`, an HTML comment that
    docs/probes.md holds exactly once."""
    lines = (text if text is not None else page()).splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == marker]
    assert len(starts) == 1, f"docs/probes.md must hold the marker {marker} exactly once"
    table = []
    for line in lines[starts[0] + 1:]:
        if not line.startswith("|"):
            break
        table.append(line)
    assert len(table) > 2, f"no table under {marker}"
    return table


def table_under(marker: str, text: str | None = None) -> list[str]:
    """The table under `<!-- table: {marker} -->`."""
    return table_after(f"<!-- table: {marker} -->", text)


# --- links, paths and cited sections ---------------------------------------------------------------------------------
def test_every_relative_link_points_to_an_existing_file():
    links = re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", page())
    assert links, "docs/probes.md has no links to check"
    missing = [link for link in links if not re.match(r"[a-z]+:", link) and not link.startswith("#")
               and not (DOCS / link.split("#")[0]).exists()]
    assert not missing, f"links in docs/probes.md to files that do not exist: {missing}"


def test_every_repository_path_in_a_code_span_exists():
    paths = set()
    prose = re.sub(r"```.*?```", "", page(), flags=re.S)  # code blocks hold commands, not paths to check
    for span in re.findall(r"`([^`]+)`", prose):  # a span may wrap over a line break
        words = span.split()
        if words and words[0].startswith(REPO_DIRS):
            paths.add(words[0].rstrip(".,;:"))
    assert len(paths) > 5
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"paths named in docs/probes.md that do not exist: {missing}"


def test_every_section_the_code_cites_exists():
    headings = [line.lstrip("#").strip() for line in page().splitlines() if line.startswith("#")]
    cited = set()
    for folder in ("fpa_lightning", "modules", "examples", "tests"):
        for file in (ROOT / folder).rglob("*.py"):
            for name in re.findall(r'docs/probes\.md,\s+"([^"]+)"', file.read_text(encoding="utf-8")):
                cited.add((file.relative_to(ROOT).as_posix(), name))
    assert any(name == "Hand-built heads and bounds" for _, name in cited)
    missing = sorted((file, name) for file, name in cited if not any(h.startswith(name) for h in headings))
    assert not missing, f"sections of docs/probes.md cited in the code but not in it: {missing}"


# --- the summary of the paper's rows, generated from the committed results -----------------------------------------
SUMMARY = "<!-- summary: modules/probes/verdicts.py -->"
RUN = "benchmarks/results/probes/h200_2026-12-02/probes.json"


def test_the_summary_is_the_committed_results():
    """The table that opens the page is ``verdicts.summary_table`` of the committed files, cell for cell: counts,
    raw and Holm-adjusted p-values and verdicts."""
    assert table_after(SUMMARY) == summary_table(ROOT).splitlines()


def test_a_changed_number_fails():
    """The check above can fail: one count or one adjusted p-value changed in the page is caught."""
    text = page()
    line = next(line for line in table_after(SUMMARY, text) if line.startswith("| mqar, paper regime, 2 layers, 32 "
                                                                               "pairs, T=256 |"))
    assert "FPA 6/15" in line and "softmax better 0.002 → 1;" in line
    for old, new in (("FPA 6/15", "FPA 0/15"), ("→ 1;", "→ 0.002;")):
        assert table_after(SUMMARY, text.replace(line, line.replace(old, new, 1))) != summary_table(ROOT).splitlines()


def row_key(row: dict) -> tuple:
    """What makes a row the same row in two files: its group, backend, budget, seeds and every seed's accuracy."""
    return (row["group"], row["backend"], json.dumps(row["budget"], sort_keys=True), tuple(row["seeds"]),
            tuple(row["accuracies"]))


def test_the_tally_and_the_family_are_the_summarys():
    counts = tally(ROOT)
    total = sum(counts.values())
    sentence = (f"Of the {total} lines: **{counts['reproduced']} reproduced, {counts['contradicted']} contradicted, "
                f"{counts['inconclusive']} inconclusive, {counts['untestable']} untestable, {counts['pending']} "
                f"pending.**")
    assert sentence in flat(page())
    # the Holm family is every sign test of every committed result file (the summary's sources are all of them), but
    # a file whose every row a later --merge carried into another is that file's, not a second set of tests
    committed = [path for path in sorted(RESULTS.rglob("probes.json")) if results(path).get("comparisons")
                 and path.parent.parent == RESULTS]
    rows = {path: {row_key(r) for r in results(path)["rows"]} for path in committed}
    superseded = {p for p in committed if any(q != p and rows[p] < rows[q] for q in committed)}
    assert {p.relative_to(RESULTS).parent.name for p in superseded} == {"h200_2026-12-03_mqar_regime",
                                                                        "h200_2026-12-02"}
    committed = [p for p in committed if p not in superseded]
    with_tests = [path for path, _ in SOURCES.values() if results(ROOT / path).get("comparisons")]
    assert sorted(str(p.relative_to(ROOT)) for p in committed) == sorted(with_tests)
    family = sign_family(load_sources(ROOT))
    assert len(family) == sum(len(results(p)["comparisons"]) for p in committed) == 659
    assert "all 659 committed sign tests" in flat(page())
    smallest = min(c["p_tested"] for c in family)
    assert smallest == pytest.approx(2**-15) and min(c["p_holm"] for c in family) == pytest.approx(659 * 2**-15)


DEVICE_NAMES = ("H200", "H100", "CPU")
"""The device names a summary line's device cell uses."""


def machine_name(machine: str) -> str:
    """The summary's short device name of a row's recorded ``machine`` (the machine itself where none fits)."""
    return next((short for short in DEVICE_NAMES if short in machine), machine)


def test_a_lines_device_names_where_its_rows_trained():
    """Where the committed rows record their machine (files since 2026-12-06), a summary line's device cell names
    every machine its rows trained on and no other: the merged r = 18 file's lr 0.003 control ran on an H100, the rest
    of it on an H200."""
    sources = load_sources(ROOT)
    checked = 0
    for line in LINES:
        if line.source is None:
            continue
        rows = [r for r in _group_rows(line, sources)
                if not line.backends or r["backend"] in line.backends or r["backend"] == REFERENCE]
        machines = {r.get("machine") for r in rows}
        if None in machines:
            continue  # an older file: its rows do not say where they trained
        device = line.device or SOURCES[line.source][1]
        named = {short for short in DEVICE_NAMES if short in device}
        assert named == {machine_name(m) for m in machines}, (line.title or line.group, device, machines)
        checked += 1
    assert checked >= 6


def test_every_sequence_split_line_has_a_data_replicate():
    """The page says every sequence-split line of the H200 table (and the CPU ablation beside it) has a data
    replicate: a `--salt 1` line, or for dip_depth a `--data-seed 1` line; the MQAR paper regime's too, every group and
    the no-layer-1-bias row and softmax, both with RoPE in layer 1; so no run is left to make."""
    primary = {line.group for line in LINES if line.source in ("h200", "cpu")}
    replicated = {line.group for line in SALT_LINES} | {line.group for line in LINES
                                                        if line.source in ("dipdata1", "dip1data1")}
    assert primary - replicated == set()
    regime = {line.group for line in SALT_LINES if "paper regime" in line.group}
    assert regime == {f"mqar, paper regime, {layers} layers, 32 pairs, T=256" for layers in (2, 3, 4)}
    assert any(line.backends == ("fpa_nobias1_rope", "sdpa_rope1") for line in SALT_LINES)
    assert "So every sequence-split line of the H200 table has a data replicate" in flat(page())
    assert tally(ROOT)["pending"] == 0
    assert "No run is left to make" in flat(table_section("## Runs to make"))


def test_the_replicates_verdicts_are_the_pages():
    """Issue #45, item 5: whether every verdict holds on other data. Each `--salt 1` line is paired with the line it
    repeats (by the first cell, unique on the page), and the page's count of kept verdicts and the lines that change
    are the summary's."""
    from modules.probes.verdicts import replicate_verdicts

    first_cells = [line.title or line.group for line in LINES]
    assert len(first_cells) == len(set(first_cells))
    pairs = replicate_verdicts(ROOT)
    assert {title for title, _, _ in pairs} == {line.title for line in SALT_LINES}
    changed = {title: (before, after) for title, before, after in pairs if before != after}
    assert changed == {"dip duration, fixed, salt 1": ("untestable", "contradicted"),
                       "mqar, paper regime, 3 layers, 32 pairs, T=256, salt 1": ("contradicted", "reproduced")}
    assert f"{len(pairs) - len(changed)} of the {len(pairs)} replicated lines keep their verdict" in flat(page())


def probe_commands(text: str) -> list[str]:
    """Every probes command in ``text`` (code spans that start with python eval.py), placeholders filled in."""
    spans = re.findall(r"`(python eval\.py --task probes[^`]*)`", text)
    return [span.replace("--lr LR", "--lr 0.01") for span in spans]


def test_every_command_parses_and_selects_rows():
    """The commands the page gives, those that made the committed files ("Status: what ran where") and any for runs
    still to be made, parse as eval.py command lines of today's code, pass the probes task's checks, select rows of
    the table and merge only committed files (nothing is trained)."""
    from modules.evaluation.cli import build_parser, check_args
    from modules.evaluation.tasks import probes as task
    from modules.probes.table import select

    commands = probe_commands(table_section("## Status: what ran where") + table_section("## Runs to make")
                              + "\n".join(table_after(SUMMARY)))
    assert len(commands) >= 9  # the status table's GPU runs (the CPU's are written as argument lists)
    for command in commands:
        argv = shlex.split(command)[2:]
        parser = build_parser()
        args = parser.parse_args(argv)
        check_args(args, parser)
        task.check(args, [])
        assert select(args.probes, args.backends, args.groups), command
        for merged in args.merge or []:
            assert (ROOT / merged).exists(), merged


def table_section(heading: str) -> str:
    text = page()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:end if end > 0 else None]


def test_the_mqar_regime_rows_were_trained_on_the_gpu():
    rows = results(RESULTS / "h200_2026-12-03_mqar_regime/probes.json")["rows"]
    assert {(r["backend"], r["device"]) for r in rows} == {("fpa", "cuda"), ("sdpa", "cuda"), ("fpa_nobias1", "cuda")}
    merged = results(RESULTS / "h100_2026-12-06_mqar_regime_rope1/probes.json")["rows"]
    assert {r["backend"] for r in merged} == {"fpa", "sdpa", "fpa_nobias1", "fpa_nobias1_rope", "sdpa_rope1"}
    assert {r["device"] for r in merged} == {"cuda"}
    first = {(r["group"], r["backend"]): r["successes"] for r in rows}  # the merge kept the H200 rows as they were
    assert all(first[(r["group"], r["backend"])] == r["successes"] for r in merged if r["backend"] in
               ("fpa", "sdpa", "fpa_nobias1"))


def test_the_dip_depth_merge_adds_only_gpu_rows_at_6000_steps():
    """The summary reads the H200 table through the file that merged dip_depth at 6000 steps into it: every H200 row
    is there unchanged, and the only new rows are dip_depth's at 6000 steps, trained on a GPU."""
    table = results(RESULTS / "h200_2026-12-02/probes.json")["rows"]
    merged = results(RESULTS / "h100_2026-12-06_dip_depth_steps/probes.json")["rows"]
    before = {row_key(r) for r in table}
    assert before < {row_key(r) for r in merged}
    new = [r for r in merged if row_key(r) not in before]
    assert len(new) == 18 and {r["device"] for r in new} == {"cuda"}
    assert all(r["group"].startswith("dip depth") and r["budget"]["steps"] == 6000 for r in new)
    assert {r["group"] for r in new} == {r["group"] for r in table if r["group"].startswith("dip depth")}


def test_the_runs_own_probes_md_is_its_json():
    r = results(ROOT / RUN)
    committed = (ROOT / RUN).with_name("probes.md").read_text(encoding="utf-8").splitlines()
    rows = markdown_table(r["rows"], r["comparisons"]).splitlines()
    assert committed[:len(rows)] == rows
    comparisons = comparison_table(r["comparisons"], r["rows"]).splitlines()
    start = committed.index(comparisons[0])
    assert committed[start:start + len(comparisons)] == comparisons


def test_the_longer_budget_sentence_is_its_json():
    c = cells(RESULTS / "cpu_2026-12-02_unnamed_ladder_4500/rows.json")
    parts = [f"{c[(f'unnamed ladder, d=4, r={r}', 'fpa')][3]} (mean {c[(f'unnamed ladder, d=4, r={r}', 'fpa')][5]}) "
             f"at r = {r}" for r in (10, 14, 18)]
    assert "4500 steps" in c[("unnamed ladder, d=4, r=10", "fpa")][2]
    assert "FPA at 4500 steps: " + ", ".join(parts) + " (the same seeds" in flat(page())


def test_every_committed_row_uses_the_disjoint_protocol():
    for path in sorted(RESULTS.rglob("probes.json")) + sorted(RESULTS.rglob("rows.json")):
        for row in results(path)["rows"]:
            assert row["budget"].get("holdout") == 4, f"{path}: {row['group']} · {row['backend']}: old protocol"
            assert row["held_out_distinct"] > 0


def probe(key: str):
    return next(g.probe for g in GROUPS if g.probe.key == key)


# the audit table of the status section: its first cell, and the probes (keys) of that line
AUDIT = [("`ladder(r=6)`, `unnamed_ladder(r=6)`", ["ladder(r=6)", "unnamed_ladder(r=6)"]),
         ("`ladder(r=10)`, `unnamed_ladder(r=10)`", ["ladder(r=10)", "unnamed_ladder(r=10)"]),
         ("`ladder(r=14)`, `unnamed_ladder(r=14)`", ["ladder(r=14)", "unnamed_ladder(r=14)"]),
         ("`ladder(r=18)`, `unnamed_ladder(r=18)`", ["ladder(r=18)", "unnamed_ladder(r=18)"]),
         ("`dip_duration`, variable", ["dip_duration(r=8, duration=variable, order=any)"]),
         ("`dip_duration`, fixed", ["dip_duration(r=8, duration=fixed, order=any)"]),
         ("`push_pop`", ["push_pop(ops=12)"]),
         ("`copy`", ["copy(n=8, symbols=8)"]),
         ("`two_families`, `find_name`, `flip_flop`, `counting`, `var_assign`, `mqar`",
          ["two_families(steps=12)", "find_name(names=4, values=4, length=14)", "flip_flop(length=32)",
           "counting(length=20, symbols=4, cap=4)", "var_assign(names=4, values=8, length=16)",
           "mqar(pairs=8, keys=16, values=16)"])]


def old_protocol_overlap(key: str, pool: int = 32768, test: int = 2048) -> tuple[str, int]:
    """The old protocol's draws of a probe (every published row: a pool of 32768, 2048 held out, generator seeds 1
    and 2, no exclusion): the share of held-out sequences also in the pool, and the distinct held-out sequences."""
    p = probe(key)
    in_pool = set(map(tuple, p.sample(pool, seeded(POOL_SEED)).tokens.tolist()))
    held_out = list(map(tuple, p.sample(test, seeded(TEST_SEED)).tokens.tolist()))
    return f"{100 * sum(t in in_pool for t in held_out) / test:.1f} %", len(set(held_out))


@pytest.mark.parametrize("first,keys", [pytest.param(*line, marks=[pytest.mark.slow] if len(line[1]) > 2 else [])
                                        for line in AUDIT], ids=[keys[0] for _, keys in AUDIT])
def test_the_audit_table_is_the_old_protocols_draws(first, keys):
    """(The line of six probes draws six pools of 32768 sequences by plain loops: about 25 s, marked slow.)"""
    torch.set_num_threads(1)
    lines = {split(line)[0]: split(line) for line in table_under_audit()}
    assert first in lines, first
    for key in keys:
        share, distinct = old_protocol_overlap(key)
        assert lines[first][1:3] == [share, str(distinct)], key


def table_under_audit() -> list[str]:
    return table_after("<!-- audit: tests/modules/probes/test_probe_docs.py recomputes this table -->")[2:]


def test_the_new_held_out_sets_of_small_spaces():
    counts = {key: len(torch.unique(held_out_set(probe(key), 2048).tokens, dim=0))
              for key in ("ladder(r=6)", "ladder(r=10)", "ladder(r=14)", "unnamed_ladder(r=6)", "unnamed_ladder(r=10)",
                          "dip_duration(r=8, duration=variable, order=any)",
                          "dip_duration(r=8, duration=fixed, order=any)")}
    text = flat(page())
    assert (f"`ladder` r = 6: {counts['ladder(r=6)']}, r = 10: {counts['ladder(r=10)']}, r = 14: "
            f"{counts['ladder(r=14)']}; `unnamed_ladder` r = 6: {counts['unnamed_ladder(r=6)']}, r = 10: "
            f"{counts['unnamed_ladder(r=10)']}; `dip_duration` variable "
            f"{counts['dip_duration(r=8, duration=variable, order=any)']}, fixed "
            f"{counts['dip_duration(r=8, duration=fixed, order=any)']}, the fixed one without any sequence of class 2"
            ) in text
    fixed = held_out_set(probe("dip_duration(r=8, duration=fixed, order=any)"), 2048)
    assert 2 not in fixed.labels[:, -1].tolist()
    # the label split's held-out part of the same space holds every class, which makes that row testable
    fixed = held_out_set(probe("dip_duration(r=8, duration=fixed, order=any)"), 2048, split="label")
    assert set(fixed.labels[:, -1].tolist()) == {0, 1, 2, 3}
    assert f"fixed, on {len(torch.unique(fixed.tokens, dim=0))} held-out sequences of all four classes" in text
    # so does the sequence split's held-out part with --salt 1, whose row the page calls testable
    salted = held_out_set(probe("dip_duration(r=8, duration=fixed, order=any)"), 2048, salt="1")
    assert set(salted.labels[:, -1].tolist()) == {0, 1, 2, 3}
    assert f"holds all four classes too ({len(torch.unique(salted.tokens, dim=0))} sequences)" in text


def test_the_constant_answers_of_the_label_split_are_its_held_out_sets():
    """The label split's held-out sets are not balanced by class; the page gives what a constant answer scores."""
    def constant(probe) -> str:
        share = float(held_out_set(probe, 2048, split="label").labels[:, -1].float().mean())
        return f"{max(share, 1 - share):.2f}"
    named = [constant(probe(f"ladder(r={r})")) for r in (6, 10, 14, 18)]
    unnamed = [constant(probe(f"unnamed_ladder(r={r})")) for r in (10, 14, 18)]
    multi_dip = [constant(probe(f"multi_dip_ladder(r={r}, dips=3)")) for r in (10, 14, 18)]
    text = flat(page())
    assert f"A constant answer scores {named[0]}, {named[1]}, {named[2]} and {named[3]} on these held-out sets" in text
    assert f"(constant {unnamed[0]}, {unnamed[1]}, {unnamed[2]} at r = 10, 14, 18)" in text
    assert f"a constant answer {min(multi_dip)}–{max(multi_dip)})" in text


OVERLAP = "<!-- overlap: tests/modules/probes/test_probe_docs.py recomputes this table -->"
FAST = ("ladder, d=4, r=10", "ladder, d=4, r=18")  # vectorised generators: about a second each


def overlap_groups() -> list[str]:
    return [split(line)[0] for line in table_after(OVERLAP)[2:]]


@pytest.mark.parametrize("label", [pytest.param(label, marks=[] if label in FAST else [pytest.mark.slow])
                                   for label in overlap_groups()])
def test_the_label_part_overlap_table_is_the_committed_split(label):
    """Each line: the group's pool and held-out set as the committed rows drew them (its default budget), the share of
    held-out sequences whose label-determining part occurs in the pool, and how many distinct parts are held out.
    (The plain-loop generators draw 32768 sequences each: slow.)"""
    torch.set_num_threads(1)
    group = next(g for g in GROUPS if g.label == label)
    pool, test = row_data(group.probe, Budget(steps=group.steps), group.test_probe)
    parts, overlap = part_overlap(group.test_probe or group.probe, pool, test)
    line = next(split(line) for line in table_after(OVERLAP)[2:] if split(line)[0] == label)
    assert line[1:] == [f"{100 * overlap:.1f} %", str(parts)]


def test_the_t512_untestable_lines_quote_their_files():
    """The T = 512 lines' reasons are written by hand in verdicts.py: every number in them is the files'."""
    high = results(RESULTS / "h100_2026-12-06_mqar_t512_9000_s0-7/probes.json")["rows"]
    low = results(RESULTS / "h200_2026-12-06_mqar_t512_9000_lr0003_s4/probes.json")["rows"]
    calibration = results(RESULTS / "h100_2026-12-06_mqar_t512_calibration/probes.json")["rows"]
    (high,), (low,) = high, low
    assert (high["backend"], high["budget"]["lr"], high["budget"]["steps"], high["seeds"]) == ("sdpa", 0.01, 9000,
                                                                                              list(range(8)))
    assert high["device"] == low["device"] == "cuda"
    failed = [f"{loss:.2f}" for loss, ok in zip(high["final_loss"], high["success"]) if not ok]
    assert high["successes"] == 5 and failed == ["4.91", "4.91", "4.90"]
    assert all(curve[3] < 0.01 for curve, ok in zip(high["loss_curve"], high["success"]) if ok)  # from step 1350
    assert (low["backend"], low["budget"]["lr"], low["seeds"], low["success"]) == ("sdpa", 0.003, [4, 5, 6, 7],
                                                                                  [True, True, False, False])
    assert [f"{loss:.2f}" for loss in low["final_loss"][2:]] == ["4.99", "4.97"]
    seed4 = low["loss_curve"][0]  # 20 windows of 450 steps: on the plateau until the 10th (steps 4050-4500)
    assert min(seed4[:9]) > 5.0 and 1.0 < seed4[9] < 5.0 and max(seed4[10:]) < 0.01
    lower_rate_calibration = next(r for r in calibration if r["budget"]["lr"] == 0.003)
    assert lower_rate_calibration["seeds"] == [0, 1] and lower_rate_calibration["successes"] == 2
    reasons = {line.title: line.untestable for line in LINES if line.source in ("mqar512", "mqar512lr")}
    assert "3 seeds end at chance (loss 4.90-4.91), 5 recall by step 1350" in reasons[
        "mqar, paper regime, 2 layers, 64 pairs, T=512, 9000 steps, lr 0.01"]
    assert "(loss 4.99, 4.97), seed 4 recalls only after about 4200 steps" in reasons[
        "mqar, paper regime, 2 layers, 64 pairs, T=512, 9000 steps, lr 0.003"]
