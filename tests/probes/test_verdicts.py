"""The summary of the paper's rows (modules/probes/verdicts.py) on fixture results (tests/probes/fixtures: rows of
the committed runs copied unchanged): the paper's counts read, each comparison tested in the paper's direction and
adjusted with Holm over the family, counts compared with Fisher's test, and the verdict rule."""
from pathlib import Path

import pytest

from fpa_lightning.probes.stats import fisher_exact, holm
from modules.probes.runner import comparisons
from modules.probes.verdicts import (Entry, Line, count_p, direction_to_test, format_p, load_sources, paper_count,
                                     paper_direction, sign_family, summary, summary_table)

FIXTURES = Path(__file__).parent / "fixtures"
SPEC = {"h200": ("h200_2026-12-02_subset.json", "H200"), "mqar": ("h200_2026-12-03_mqar_subset.json", "H200")}


def test_the_papers_counts_and_directions():
    assert paper_count("11/15") == (11, 11) and paper_count("14–15/15") == (14, 15) and paper_count("fails") == (0, 0)
    assert paper_count(None) is None and paper_count("") is None
    with pytest.raises(ValueError, match="unreadable"):
        paper_count("most")
    assert paper_direction("11/15", "0/15") == "a" and paper_direction("0/15", "15/15") == "b"
    assert paper_direction("9/15", "15/15") == "b"  # variable assignment: FoX ahead by 6
    assert paper_direction("14/15", "11/15") is None  # push/pop's dip-sum: no separation claimed
    assert paper_direction(None, "14–15/15") is None and paper_direction("15/15", "fails") == "a"
    assert direction_to_test("14/15", "11/15") == "a" and direction_to_test("0/15", "15/15") == "b"
    assert count_p("14–15/15", 13, 15) == max(fisher_exact(14, 15, 13, 15), fisher_exact(15, 15, 13, 15))


def test_the_sign_family_is_every_comparison_adjusted_together():
    sources = load_sources(FIXTURES, SPEC)
    family = sign_family(sources)
    assert len(family) == sum(len(s["comparisons"]) for s in sources.values()) == 15
    assert [c["p_holm"] for c in family] == holm([c["p_tested"] for c in family])
    by = {(c["group"], c["b"]): c for c in family}
    fox = by[("variable assignment", "fox")]  # the paper has FoX ahead: tested in that direction
    assert fox["tested"] == "b" and fox["p_tested"] == fox["p_value_reverse"]
    softmax = by[("mqar, paper regime, 2 layers, 32 pairs, T=256", "sdpa")]
    assert softmax["tested"] == "b" and softmax["p_tested"] == pytest.approx(2**-9)
    nope = by[("unnamed ladder, positions, d=4, r=18", "nope")]
    assert nope["tested"] == "a" and nope["p_tested"] == pytest.approx(2**-13)
    # push/pop's three 2⁻¹⁵ come first in the family of 15, so NoPE's 2⁻¹³ is the fourth smallest: times 12
    assert nope["p_holm"] == pytest.approx(12 * 2**-13)
    assert "p_holm" not in sources["h200"]["comparisons"][0]  # the sources are not changed


LINES = [Line("ladder, d=4, r=10", "h200", note="each push names its rung"),
         Line("unnamed ladder, positions, d=4, r=18", "h200"),
         Line("variable assignment", "h200"),
         Line("push/pop", "h200"),
         Line("flip-flop", "h200", untestable="a reason"),
         Line("mqar, paper regime, 2 layers, 32 pairs, T=256", "mqar"),
         Line("a run to make", pending="python eval.py --task probes --out DIR", paper="FPA 15/15")]


def test_the_verdicts_of_fixture_lines():
    lines = summary(FIXTURES, LINES, SPEC)
    kinds = [line["kind"] for line in lines]
    assert kinds == ["contradicted", "reproduced", "inconclusive", "reproduced", "untestable", "contradicted",
                     "pending"]
    ladder = lines[0]["cells"]
    assert ladder[1] == "FPA 11/15; softmax 0/15; NoPE 0/15; ALiBi 0/15; FoX 0/15"
    assert ladder[2] == ("H200, 15 seeds, 1500 steps, sequence split: FPA 15/15; softmax 15/15; NoPE 15/15; "
                         "ALiBi 15/15; FoX 15/15")
    assert ladder[4].startswith("contradicted: softmax 15/15 vs 0/15 (count p ")
    assert ladder[4].endswith("; each push names its rung")
    # the positioned ladder at r = 18: within a family of 15 every peer's separation is significant (ranks 4, 5, 6:
    # times 12, 11 and 10)
    assert lines[1]["cells"][3] == "NoPE 1.2e-04 → 0.0015; ALiBi 2.4e-04 → 0.0027; FoX 9.8e-04 → 0.0098"
    assert lines[2]["cells"][3] == "FoX better 0.99 → 1"
    assert lines[4]["cells"][4] == "untestable: a reason"
    assert lines[6]["cells"] == ["a run to make", "FPA 15/15", "—", "—",
                                 "pending: `python eval.py --task probes --out DIR`"]
    table = summary_table(FIXTURES, LINES, SPEC).splitlines()
    assert len(table) == 2 + len(LINES) and table[2] == "| " + " | ".join(ladder) + " |"


def test_the_verdict_rule():
    row = {"backend": "nope", "paper": "0/15", "successes": 0, "seeds": list(range(15))}
    significant = {"p_holm": 0.01, "tested": "a", "a_only": 12, "b_only": 0}
    weak = {"p_holm": 0.2, "tested": "a", "a_only": 3, "b_only": 0}
    assert Entry(row, significant, "a").kind() == "reproduced"
    assert Entry(row, weak, "a", count_holm=0.5).kind() == "inconclusive"
    assert Entry(row, weak, "a", count_holm=0.01).kind() == "contradicted"  # the paper's 0/15 peer succeeds here
    assert Entry(row, None, None, count_holm=0.5).kind() == "reproduced"  # a count consistent with the paper's
    assert Entry(row, None, None, count_holm=0.04).kind() == "contradicted"


def test_a_runs_comparisons_carry_their_holm_adjusted_p_values():
    rows = load_sources(FIXTURES, SPEC)["h200"]["rows"]
    out = comparisons(rows)
    assert len(out) == 13 and [c["p_holm"] for c in out] == holm([c["p_tested"] for c in out])
    fox = next(c for c in out if c["group"] == "variable assignment")
    assert fox["tested"] == "b" and fox["p_tested"] == fox["p_value_reverse"]


def test_a_group_split_over_two_lines_tests_each_count_once():
    spec = {"mqar": ("h100_2026-12-06_mqar_rope1_subset.json", "H200")}
    group = "mqar, paper regime, 2 layers, 32 pairs, T=256"
    lines = [Line(group, "mqar", backends=("fpa", "sdpa", "fpa_nobias1")),
             Line(group, "mqar", backends=("fpa_nobias1_rope", "sdpa_rope1"), title="with RoPE",
                  device="H200 (FPA), H100 (RoPE rows)")]
    first, second = summary(FIXTURES, lines, spec)
    assert first["cells"][2] == ("H200, 15 seeds, 3000 steps, sequence split: FPA 6/15; softmax 15/15; "
                                 "no layer-1 bias 0/15")
    # FPA's row is shown on both lines but its count is tested once: four counts with a paper's, one Holm family
    assert second["cells"][1] == "no layer-1 bias, RoPE there 15/15"
    assert second["cells"][2] == ("H200 (FPA), H100 (RoPE rows), 15 seeds, 3000 steps, sequence split: FPA 6/15; "
                                  "no layer-1 bias, RoPE there 7/15; softmax, RoPE in layer 1 15/15")
    rows = {r["backend"]: r for r in load_sources(FIXTURES, spec)["mqar"]["rows"]}
    counted = ["fpa", "sdpa", "fpa_nobias1", "fpa_nobias1_rope"]  # FPA twice would make a family of five
    adjusted = dict(zip(counted, holm([count_p(rows[b]["paper"], rows[b]["successes"], 15) for b in counted])))
    assert first["kind"] == "contradicted" and f"(count p {format_p(adjusted['fpa_nobias1'])})" in first["cells"][4]
    # the paper's separation (no layer-1 bias ahead of FPA) has 3:4 discordant seeds; 7/15 against the paper's 15/15
    # is significant in this family of four counts
    assert second["cells"][3] == "no layer-1 bias, RoPE there better 0.5 → 1"
    assert second["kind"] == "contradicted" and second["cells"][4] == (
        f"contradicted: no layer-1 bias, RoPE there 7/15 vs 15/15 (count p {format_p(adjusted['fpa_nobias1_rope'])})")
