"""docs/probes.md against the repository it describes.

- Every relative link, and every repository path in a code span, points to an existing file or folder.
- Every section of docs/probes.md that the code cites by name (the page, a comma, the quoted heading) exists.
- Every table that docs/probes.md copies from a committed probes.json is what
  ``modules.probes.report.markdown_table`` makes of that JSON today: the main table (GPU and CPU runs), the
  unnamed ladder and the learning-rate sweep. Each sits under an HTML comment ``<!-- table: ... -->`` naming its
  source; the main table's last column (our verdict) is free text and only has to be there.
- The committed docs/probes/*/probes.md are their probes.json rendered by ``markdown_table`` (less the capacity
  column, added after they were written) and ``comparison_table``.
- The numbers of the status section: the overlap audit of the old protocol (pool and held-out set drawn
  independently, generator seeds 1 and 2), the distinct held-out counts of the new protocol, and the CPU/GPU
  agreement count.
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


def table_under(marker: str, text: str | None = None) -> list[str]:
    """The lines of the Markdown table that follows the line `<!-- table: {marker} -->` (header included)."""
    lines = (text if text is not None else page()).splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == f"<!-- table: {marker} -->"]
    assert len(starts) == 1, f"docs/probes.md must hold the marker <!-- table: {marker} --> exactly once"
    table = []
    for line in lines[starts[0] + 1:]:
        if not line.startswith("|"):
            break
        table.append(line)
    assert len(table) > 2, f"no table under <!-- table: {marker} -->"
    return table


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
def test_the_main_table_is_the_committed_gpu_and_cpu_json():
    gpu, cpu = cells(RESULTS / "gpu" / "probes.json"), cells(RESULTS / "cpu" / "probes.json")
    table = table_under("docs/probes/gpu/probes.json, CPU run: docs/probes/cpu/probes.json")
    assert split(table[0])[:5] == ["group", "backend", "training", "GPU (this table)", "CPU run"]
    body = [split(line) for line in table[2:]]
    assert [tuple(c[:2]) for c in body] == list(gpu), "the table must have every GPU row, in the JSON's order"
    for c in body:
        want = gpu[tuple(c[:2])]
        key = f"{c[0]} · {c[1]}"
        assert len(c) == 10, key
        assert c[2:4] == want[2:4], key  # training, successes
        assert c[4] == (cpu[tuple(c[:2])][3] if tuple(c[:2]) in cpu else "not run"), key
        assert c[5:9] == want[4:8], key  # paper, mean, min–max, comparison
        assert c[9], f"{key}: no verdict"


def unnamed_ladder_lines(path: Path) -> list[str]:
    """The unnamed-ladder summary of docs/probes.md from the JSON at `path`: per r, each backend at d = 4 as
    'successes (mean), p = comparison' with the capacity rule's verdict, and the controls' successes."""
    c = cells(path)
    backends = ("fpa", "fpa_stack", "sdpa", "nope", "alibi", "fox")
    lines = ["| r | FPA | FPA, stack form | RoPE | NoPE | ALiBi | FoX | controls, d = r + 2: RoPE / NoPE / ALiBi / FoX |",
             "|---|---|---|---|---|---|---|---|"]
    for r in (6, 10, 14, 18):
        row = [str(r)]
        for b in backends:
            _, _, _, count, _, mean, _, p, note = c[(f"unnamed ladder, d=4, r={r}", b)]
            cell = f"{count} ({mean})" + (f", p = {p}" if p else "")
            cell += ("; not a capacity result" if "not a capacity result" in note
                     else "; control passes" if "passes" in note else "")
            row.append(cell)
        controls = [c.get((f"unnamed ladder control, d={r + 2}, r={r}", b)) for b in backends[2:]]
        row.append(" / ".join(x[3] for x in controls) if all(controls) else "—")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def test_the_unnamed_ladder_table_is_the_committed_json():
    source = "docs/probes/unnamed_ladder/probes.json"
    assert table_under(source) == unnamed_ladder_lines(ROOT / source)


LR_SWEEP = ("docs/probes/gpu/probes.json", "docs/probes/lr_sweep/lr0.003.json", "docs/probes/lr_sweep/lr0.001.json")


def lr_sweep_lines() -> list[str]:
    """The learning-rate sweep of docs/probes.md: every row of the sweep's JSON, 'successes (mean)' per rate."""
    runs = [cells(ROOT / path) for path in LR_SWEEP]
    lines = ["| group | backend | lr 0.01 (table) | lr 0.003 | lr 0.001 |", "|---|---|---|---|---|"]
    for key in runs[2]:
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(f"{run[key][3]} ({run[key][5]})" for run in runs) + " |")
    return lines


def test_the_learning_rate_sweep_table_is_the_committed_json():
    assert table_under(", ".join(LR_SWEEP)) == lr_sweep_lines()


@pytest.mark.parametrize("folder", sorted(p.parent.name for p in RESULTS.glob("*/probes.md")),
                         ids=lambda folder: f"docs/probes/{folder}")  # an id "gpu" would mark the test as needing one
def test_each_committed_probes_md_is_its_json(folder):
    """docs/probes.md links these files as the runs' own tables: each is markdown_table (less its capacity column,
    added after the runs) and comparison_table of the probes.json beside it."""
    r = results(RESULTS / folder / "probes.json")
    committed = (RESULTS / folder / "probes.md").read_text(encoding="utf-8").splitlines()
    rows = ["|".join(line.split("|")[:-2]) + "|" for line in markdown_table(r["rows"], r["comparisons"]).splitlines()]
    assert committed[:len(rows)] == rows
    comparisons = comparison_table(r["comparisons"]).splitlines()
    start = committed.index(comparisons[0])
    assert committed[start:start + len(comparisons)] == comparisons


def test_a_changed_number_fails(tmp_path):
    """The checks above can fail: one digit changed in a copied cell is caught."""
    text = page()
    line = table_under("docs/probes/unnamed_ladder/probes.json", text)[2]
    changed = line.replace("(0.983)", "(0.984)", 1)
    assert changed != line
    assert table_under("docs/probes/unnamed_ladder/probes.json", text.replace(line, changed)) != \
        unnamed_ladder_lines(ROOT / "docs/probes/unnamed_ladder/probes.json")


# --- the numbers of the status section -------------------------------------------------------------------------------
def test_cpu_and_gpu_runs_differ_on_the_rows_the_page_names():
    gpu, cpu = cells(RESULTS / "gpu" / "probes.json"), cells(RESULTS / "cpu" / "probes.json")
    both = [k for k in cpu if k in gpu]
    differ = [(k, gpu[k][3].split("/")[0], cpu[k][3].split("/")[0]) for k in both if gpu[k][3] != cpu[k][3]]
    assert all(abs(int(g) - int(c)) == 1 for _, g, c in differ)
    named = [f"`{group}` · `{backend}` ({'GPU ' if i == 0 else ''}{g}, {'CPU ' if i == 0 else ''}{c})"
             for i, ((group, backend), g, c) in enumerate(differ)]
    sentence = (f"Of the {len(both)} rows both runs have, {len(both) - len(differ)} have the same count and "
                f"{len(differ)} differ by one seed: " + ", ".join(named[:-1]) + " and " + named[-1] + ".")
    assert sentence in flat(page())


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


def test_every_published_row_uses_a_probe_of_the_audit():
    audited = {key for _, keys in AUDIT for key in keys}
    for folder in sorted(RESULTS.glob("*/probes.json")) + sorted((RESULTS / "lr_sweep").glob("*.json")):
        for row in results(folder)["rows"]:
            assert row["probe"] in audited and row["budget"]["pool"] == 32768 and row["budget"]["test"] == 2048
            assert "holdout" not in row["budget"], "a row of the new protocol: the status section is out of date"


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
    lines = page().splitlines()
    start = lines.index("<!-- audit: tests/modules/probes/test_probe_docs.py recomputes this table -->")
    table = []
    for line in lines[start + 1:]:
        if not line.startswith("|"):
            break
        table.append(line)
    return table[2:]


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
