"""docs/probes.md against the repository it describes.

- Every relative link, and every repository path in a code span, points to an existing file or folder.
- Every section of docs/probes.md that the code cites by name (the page, a comma, the quoted heading) exists.
- The main table is what ``modules.probes.report.markdown_table`` makes of the committed run's probes.json today, and
  the verdict table holds every row with a paper count, its cells copied from that JSON and a verdict of one of the
  three kinds; the run's own probes.md is its JSON rendered.
- Every committed row was measured under the disjoint held-out protocol.
- The numbers of the history section: the overlap audit of the old protocol (pool and held-out set drawn
  independently, generator seeds 1 and 2), and the distinct held-out counts of the new protocol.
"""
import json
import re
from pathlib import Path

import pytest
import torch

from fpa_lightning.probes.train import POOL_SEED, TEST_SEED, held_out_set, seeded
from modules.probes.report import comparison_table, markdown_table
from modules.probes.table import GROUPS

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
PAGE = DOCS / "probes.md"
RESULTS = DOCS / "probes"
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
    assert len(paths) > 10
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


# --- tables copied from the committed JSON ---------------------------------------------------------------------------
RUN = "docs/probes/h200_2026-12-02/probes.json"
VERDICTS = ("reproduced", "not reproduced", "not testable here")


def test_the_main_table_is_the_committed_json():
    r = results(ROOT / RUN)
    assert table_under(RUN) == markdown_table(r["rows"], r["comparisons"]).splitlines()


def verdict_lines(text: str | None = None, run: str = RUN) -> list[str]:
    return table_after(f"<!-- verdicts: {run} -->", text)


def verdict_errors(text: str, run: str = RUN) -> list[str]:
    """What is wrong with the verdict table of the run `run` in `text`: a missing or extra row, a cell that is not the
    JSON's, a verdict of no known kind."""
    want = {key: c for key, c in cells(ROOT / run).items() if c[4] != "—"}  # rows with a paper count
    body = [split(line) for line in verdict_lines(text, run)[2:]]
    errors = [] if [tuple(c[:2]) for c in body] == list(want) else ["not one verdict per paper row in the JSON's order"]
    for c in body:
        w = want.get(tuple(c[:2]))
        if w is not None and c[2:5] != [w[4], w[3], w[7]]:  # paper, ours, comparison
            errors.append(f"{c[:2]}: {c[2:5]} is not the JSON's {[w[4], w[3], w[7]]}")
        if not any(c[5].startswith(v) for v in VERDICTS):
            errors.append(f"{c[:2]}: verdict {c[5]!r}")
    return errors


def test_every_paper_row_has_a_verdict_with_the_jsons_numbers():
    assert len(verdict_lines(page())) > 50
    assert not verdict_errors(page())


MQAR_REGIME_RUN = "docs/probes/h200_2026-12-03_mqar_regime/probes.json"


def test_the_mqar_regime_verdicts_are_their_json():
    """The MQAR paper regime ran apart from the table (docs/probes.md, "Status"): its verdict table is checked against
    its own JSON, rows trained on the GPU under the disjoint protocol; a changed count is caught."""
    text = page()
    assert not verdict_errors(text, MQAR_REGIME_RUN)
    rows = results(ROOT / MQAR_REGIME_RUN)["rows"]
    assert {(r["backend"], r["device"]) for r in rows} == {("fpa", "cuda"), ("sdpa", "cuda"), ("fpa_nobias1", "cuda")}
    line = verdict_lines(text, MQAR_REGIME_RUN)[2]
    assert "| 6/15 |" in line
    assert verdict_errors(text.replace(line, line.replace("| 6/15 |", "| 0/15 |", 1)), MQAR_REGIME_RUN)


def test_the_runs_own_probes_md_is_its_json():
    r = results(ROOT / RUN)
    committed = (ROOT / RUN).with_name("probes.md").read_text(encoding="utf-8").splitlines()
    rows = markdown_table(r["rows"], r["comparisons"]).splitlines()
    assert committed[:len(rows)] == rows
    comparisons = comparison_table(r["comparisons"], r["rows"]).splitlines()
    start = committed.index(comparisons[0])
    assert committed[start:start + len(comparisons)] == comparisons


def test_a_changed_number_fails():
    """The checks above can fail: one digit changed in a copied cell, or a verdict of no known kind, is caught."""
    text = page()
    line = next(line for line in table_under(RUN, text) if "| 0.989 |" in line)
    r = results(ROOT / RUN)
    assert table_under(RUN, text.replace(line, line.replace("| 0.989 |", "| 0.988 |", 1))) != \
        markdown_table(r["rows"], r["comparisons"]).splitlines()
    verdict = verdict_lines(text)[2]
    assert "| 14/15 |" in verdict and "| reproduced" in verdict
    assert verdict_errors(text.replace(verdict, verdict.replace("| 14/15 |", "| 15/15 |", 1)))
    assert verdict_errors(text.replace(verdict, verdict.replace("| reproduced", "| agrees", 1)))


CPU_RUN = "docs/probes/cpu_2026-12-02_noretrieval/probes.json"


def test_the_cpu_rows_sentence_is_its_json():
    c = cells(ROOT / CPU_RUN)
    group = "find a name, without content retrieval"
    _, _, _, count, paper, mean, _, p, _ = c[(group, "fpa_noretrieval")]
    sentence = (f"**{group} · fpa_noretrieval: {count} (paper: {paper}; mean accuracy {mean}), against FPA "
                f"{c[(group, 'fpa')][3]} in the same group, FPA better with p = {p}: reproduced.**")
    assert sentence in page()


def test_the_longer_budget_sentence_is_its_json():
    c = cells(ROOT / "docs/probes/cpu_2026-12-02_unnamed_ladder_4500/rows.json")
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
