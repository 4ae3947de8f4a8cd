"""The paper's 1-layer probe table as groups of rows (docs/probes.md, "The probes"), with the paper's numbers.

A group is one probe instance and one model shape, trained with several backends; within a group, FPA is compared
with every other backend by the sign test. ``GROUPS`` lists them in the paper's order. Budgets are the groups'
defaults; the sweeps that calibrate them are in docs/probes.md, "Status: what ran where".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from fpa_lightning.probes.base import Probe
from fpa_lightning.probes.dips import DipDepth
from fpa_lightning.probes.ladder import DipDuration, Ladder, UnnamedLadder
from fpa_lightning.probes.model import VARIANTS, Shape
from fpa_lightning.probes.names import FindName, VarAssign
from fpa_lightning.probes.recall import Mqar
from fpa_lightning.probes.sequences import Copy, Counting, FlipFlop
from fpa_lightning.probes.stats import CRITERION
from fpa_lightning.probes.walks import PushPop, TwoFamilies

REFERENCE = "fpa"
"""The backend every other backend of a group is compared with."""


@dataclass(frozen=True)
class Group:
    label: str
    """Unique, e.g. "ladder, d=4, r=10"."""
    probe: Probe
    shape: Shape
    backends: tuple[str, ...]
    paper: dict[str, str] = field(default_factory=dict)
    """Backend -> the paper's result ("11/15", "0/15", "fails", ...); missing: not reported."""
    steps: int = 1000
    """Training steps unless the command line overrides them."""
    criterion: float = CRITERION
    test_probe: Probe | None = None
    """Where set, the held-out set is drawn from this probe instead of `probe` (same vocabulary and classes): the
    group trains at one setting and tests at another, e.g. longer dips (``train.row_data``). None: `probe`."""
    impl: str = "naive"
    """The attention implementation of the group's models: "naive" (every seed in one vmapped model, the default),
    or "auto" for long sequences (the backend's fast path: vmapped too where it can be, else seeds one after another;
    ``train.train_row``): the naive (T, T) biases of 15 seeds × 128 sequences of 256–512 tokens do not train in a
    lease's time."""

    def __post_init__(self):
        unknown = [b for b in self.backends if b not in VARIANTS]
        if unknown:
            raise ValueError(f"group {self.label!r}: unknown backends {unknown}")


POSITIONAL_PEERS = ("sdpa", "nope", "alibi", "fox")
LADDER = ("fpa", "fpa_stack", *POSITIONAL_PEERS)
LADDER_STEPS = 1500
"""The ladders' budget; docs/probes.md, "Status: what ran where", has the r = 18 sweep at 4500 steps and two
learning rates that tests it."""


def _ladder_groups() -> list[Group]:
    groups = [Group("ladder, d=4, r=6", Ladder(r=6), Shape(heads=1, head_dim=4), LADDER,
                    {b: "14–15/15" for b in POSITIONAL_PEERS}, steps=LADDER_STEPS)]
    for r, fpa in ((10, "11/15"), (14, "12/15"), (18, "13/15")):
        groups.append(Group(f"ladder, d=4, r={r}", Ladder(r=r), Shape(heads=1, head_dim=4), LADDER,
                            {"fpa": fpa, **{b: "0/15" for b in POSITIONAL_PEERS}}, steps=LADDER_STEPS))
    for r in (10, 14, 18):
        groups.append(Group(f"ladder control, d={r + 2}, r={r}", Ladder(r=r), Shape(heads=1, head_dim=r + 2),
                            POSITIONAL_PEERS, {b: "15/15" for b in POSITIONAL_PEERS}, steps=LADDER_STEPS))
    return groups


def _unnamed_ladder_groups() -> list[Group]:
    """Our variant, not a row of the paper: the same ladder with pushes that name only their colour
    (docs/probes.md, "Where we differ from the paper")."""
    groups = [Group(f"unnamed ladder, d=4, r={r}", UnnamedLadder(r=r), Shape(heads=1, head_dim=4), LADDER,
                    steps=LADDER_STEPS) for r in (6, 10, 14, 18)]
    groups += [Group(f"unnamed ladder control, d={r + 2}, r={r}", UnnamedLadder(r=r), Shape(heads=1, head_dim=r + 2),
                     POSITIONAL_PEERS, steps=LADDER_STEPS) for r in (10, 14, 18)]
    return groups


DIP_SUM_PEERS = ("fpa", "fpa_dipsum", "selective", "fox")
DIP_DEPTH_STEPS = 2000
"""The table's longest one-layer budget (as ``var_assign``), chosen from a CPU pilot (docs/probes.md, "Pilots");
the sweep ``--steps 2000 6000`` tests it (docs/probes.md, "Status: what ran where")."""


def _dip_depth_groups() -> list[Group]:
    """Issue #22, item 3: minimum against sum on ``dip_depth`` (``fpa_lightning/probes/dips.py``), a unit-step walk
    whose tokens never name a depth. The paper's row "variable-duration dips (the deepest step lasts 1 or 2
    steps)": FPA 13/15, dip-sum FPA 0/15, Selective Attention 0/15; fixed duration: both 15/15. Its probe is not
    ours (docs/probes.md describes ours), so its counts stand beside the groups of the same durations only.
    - durations 1–2, and 1–4: trained and tested at the same durations;
    - durations 1–2 → 3–4: trained on dips that last 1–2 steps at the bottom, tested on 3–4 (``test_probe``). The
      path minimum is invariant by construction; a sum of dips that fits 1–2 must extrapolate (not in the paper);
    - duration 1: the control (sum = minimum, both should fit), the paper's fixed-duration row;
    - stays, 1–2 → 3–4: the time at the bottom written as a stay token S, the control of the argument that a learned
      dip-sum head can make S invisible (dips.py), so dip-sum should extrapolate there.
    Backends: FPA, its dip-sum ablation, Selective Attention (both sums, the paper's peers) and FoX (a sum of
    per-token decays with no minimum at all). Shape: one layer, one head of d = 4 and width 32, as ``dip_duration``:
    FPA's hand-built head (``theory.dip_depth_head``) needs no more, so a failure at this width is not capacity."""
    shape = Shape(heads=1, head_dim=4)
    variable = {"fpa": "13/15", "fpa_dipsum": "0/15", "selective": "0/15"}
    longer = DipDepth(durations=(3, 4))
    return [
        Group("dip depth, durations 1-2", DipDepth(durations=(1, 2)), shape, DIP_SUM_PEERS, variable,
              steps=DIP_DEPTH_STEPS),
        Group("dip depth, train durations 1-2, test 3-4", DipDepth(durations=(1, 2)), shape, DIP_SUM_PEERS,
              steps=DIP_DEPTH_STEPS, test_probe=longer),
        Group("dip depth, durations 1-4", DipDepth(durations=(1, 2, 3, 4)), shape, DIP_SUM_PEERS,
              steps=DIP_DEPTH_STEPS),
        Group("dip depth, duration 1", DipDepth(durations=(1,)), shape, DIP_SUM_PEERS[:3],
              {"fpa_dipsum": "15/15", "selective": "15/15"}, steps=DIP_DEPTH_STEPS),
        Group("dip depth with stays, train durations 1-2, test 3-4", DipDepth(durations=(1, 2), bottom="stay"), shape,
              DIP_SUM_PEERS[:3], steps=DIP_DEPTH_STEPS, test_probe=DipDepth(durations=(3, 4), bottom="stay")),
    ]


def _longer_test_groups() -> list[Group]:
    """Issue #22, item 1: the walk probes trained at the table's length and tested at twice it (``test_probe``; not
    in the paper). FPA's alive set is the stack, or the keys above each walk's minimum, at any length; a positional
    code (RoPE in softmax and Selective Attention) or a sum of decays (FoX) must extrapolate. Shapes, backends and
    budgets as the groups they extend."""
    return [
        Group("push/pop, train 12 ops, test 24", PushPop(ops=12), Shape(heads=1, head_dim=4),
              ("fpa", "fpa_dipsum", "fox", "sdpa", "selective"), test_probe=PushPop(ops=24)),
        Group("two families, 2 heads of d=2, train 12 steps, test 24", TwoFamilies(steps=12),
              Shape(heads=2, head_dim=2), ("fpa", "selective", "dcp"), test_probe=TwoFamilies(steps=24)),
    ]


def _mqar_regime_and_find_name_groups() -> list[Group]:
    """Issue #22, item 4. MQAR in the regime of the paper's recall experiments rather than the compact probe above:
    a full 2-layer block (GELU MLP of width 256, pre-LayerNorm, width 64, 2 heads of d = 32), 256 keys and 256
    values, 32 pairs in 256 tokens and 64 pairs in 512, the queries scattered after the pairs among filler tokens
    (``Mqar(length=...)``, docs/probes.md). The paper's counts are its MQAR row (FPA 0/15, softmax 15/15, FPA
    without the layer-1 bias 15/15; 3 and 4 FPA layers fail); the paper's own vocabulary, pair count and length are
    not in docs/, so these settings are ours, and the step budget is not yet calibrated on a GPU run.

    find_name with globals told apart only by their place in the walk (``FindNameByPlace``): not a paper row, the
    control for "without key level fails" (docs/probes.md, "Where we differ from the paper").

    The 2-layer groups also hold FPA without the layer-1 bias whose layer 1 has positions (``fpa_nobias1_rope``:
    softmax with RoPE there) and the all-softmax model with the same layer 1 (``sdpa_rope1``): ``fpa_nobias1``'s
    layer 1 has no positional signal at all, while FPA's layer-1 bias is what locates the previous token, so the
    paper's "without layer-1 bias" is read both ways. The paper's count of that ablation stands beside both
    FPA variants."""
    from fpa_lightning.probes.names import FindNameByPlace

    groups = []
    two = ("fpa", "sdpa", "fpa_nobias1", "fpa_nobias1_rope", "sdpa_rope1")
    two_paper = {"fpa": "0/15", "sdpa": "15/15", "fpa_nobias1": "15/15", "fpa_nobias1_rope": "15/15"}
    for layers, pairs, length, backends, paper in (
            (2, 32, 256, two, two_paper),
            (3, 32, 256, ("fpa",), {"fpa": "0/15"}),
            (4, 32, 256, ("fpa",), {"fpa": "0/15"}),
            (2, 64, 512, two, two_paper)):
        groups.append(Group(f"mqar, paper regime, {layers} layers, {pairs} pairs, T={length}",
                            Mqar(pairs=pairs, keys=256, values=256, length=length),
                            Shape(heads=2, head_dim=32, layers=layers, width=64, mlp=256, norm=True), backends, paper,
                            steps=3000, impl="auto"))
    groups.append(Group("find a name, globals by place only", FindNameByPlace(), Shape(heads=1, head_dim=4),
                        ("fpa", "fpa_stack", "fpa_nolevel", "fpa_querylevel", "selective")))
    return groups


MULTI_DIP_STEPS = 3000
"""Twice the ladder's 1500, chosen from CPU pilots (docs/probes.md, "Pilots"); not calibrated. A one-head peer is
capped at any budget (``theory.one_head_obstruction``)."""


def _multi_dip_ladder_groups() -> list[Group]:
    """Issue #22, item 2, first half: ``multi_dip_ladder`` (pushes name only their colour; three dips, pushes between
    them; read at the last dip), r ∈ {10, 14, 18}. Not a capacity test, as first intended: a one-head softmax peer
    cannot realise these alive sets at any width (``theory.one_head_obstruction``), so its d = r + 2 control fails by
    construction (docs/probes.md, "Pilots") and every peer row is flagged as no capacity result. What the groups
    measure is expressivity: FPA at d = 4 against one-head peers that can locate every push (a learned absolute
    position embedding, ``Shape.positions``, for NoPE, ALiBi and FoX; RoPE for softmax), and the controls check the
    obstruction empirically. The paper's counts are its ladder rows (docs/method.md, section 5), whose probe this is
    not; they stand beside FPA's d = 4 group only."""
    from fpa_lightning.probes.ladder import MultiDipLadder

    groups = []
    for r, fpa in ((10, "11/15"), (14, "12/15"), (18, "13/15")):
        probe = MultiDipLadder(r=r)
        positions = Shape(heads=1, head_dim=4, positions=probe.length)
        groups += [
            Group(f"multi-dip ladder, d=4, r={r}", probe, Shape(heads=1, head_dim=4), ("fpa", "sdpa"),
                  {"fpa": fpa}, steps=MULTI_DIP_STEPS),
            Group(f"multi-dip ladder, positions, d=4, r={r}", probe, positions, ("fpa", "nope", "alibi", "fox"),
                  steps=MULTI_DIP_STEPS),
            Group(f"multi-dip ladder control, d={r + 2}, r={r}", probe, Shape(heads=1, head_dim=r + 2), ("sdpa",),
                  steps=MULTI_DIP_STEPS),
            Group(f"multi-dip ladder control, positions, d={r + 2}, r={r}", probe,
                  Shape(heads=1, head_dim=r + 2, positions=probe.length), ("nope", "alibi", "fox"),
                  steps=MULTI_DIP_STEPS)]
    return groups


R18_WIDTHS = (2, 3, *range(4, 21))
"""The positioned unnamed ladder's head widths at r = 18: every width from 2 to the control's r + 2 = 20."""


def _positioned_unnamed_ladder_groups() -> list[Group]:
    """Issue #22, item 2, second half: the capacity test whose controls can pass. The unnamed ladder (one dip, pushes
    that name only their colour) with a learned absolute position embedding for every backend of the group
    (``Shape.positions``), so that NoPE, ALiBi and FoX can locate the pushes (without it they fail even their
    d = r + 2 controls, docs/probes.md, "Where we differ from the paper"), swept over d ∈ {2, 4, r − 3, r − 2, r + 2}
    to locate each backend's transition, and at r = 18, where the peers' d = 4 rows sit on the criterion, over every
    width from 4 to r + 2 (``R18_WIDTHS``); the d = r + 2 groups are the controls (``report.capacity_note``: a row
    counts only if its control passes). The paper's counts (FPA 11, 12, 13 of 15 at d = 4; the peers 0/15; the
    controls 15/15) are for its named ladder without positions: they stand beside the d = 4 and d = r + 2 groups as
    targets."""
    groups = []
    for r, fpa in ((10, "11/15"), (14, "12/15"), (18, "13/15")):
        probe = UnnamedLadder(r=r)
        for d in (R18_WIDTHS if r == 18 else (2, 4, r - 3, r - 2, r + 2)):
            control = d == r + 2
            paper = ({"fpa": fpa, **{b: "0/15" for b in ("nope", "alibi", "fox")}} if d == 4 else
                     {b: "15/15" for b in ("nope", "alibi", "fox")} if control else {})
            groups.append(Group(f"unnamed ladder{' control' if control else ''}, positions, d={d}, r={r}", probe,
                                Shape(heads=1, head_dim=d, positions=r + 2),  # <bos>, r pushes, the dip
                                ("nope", "alibi", "fox") if control else ("fpa", "nope", "alibi", "fox"), paper,
                                steps=LADDER_STEPS))
    return groups


GROUPS: list[Group] = [
    *_ladder_groups(),
    *_unnamed_ladder_groups(),
    *_multi_dip_ladder_groups(),
    *_positioned_unnamed_ladder_groups(),
    Group("dip duration, variable", DipDuration(duration="variable"), Shape(heads=1, head_dim=4),
          ("fpa", "fpa_dipsum", "selective"), {"fpa": "13/15", "fpa_dipsum": "0/15", "selective": "0/15"}),
    Group("dip duration, fixed", DipDuration(duration="fixed"), Shape(heads=1, head_dim=4),
          ("fpa", "fpa_dipsum", "selective"), {"fpa_dipsum": "15/15", "selective": "15/15"}),
    *_dip_depth_groups(),
    Group("two families, 2 heads of d=2", TwoFamilies(), Shape(heads=2, head_dim=2),
          ("fpa", "selective", "dcp"), {"fpa": "11/15", "selective": "0/15", "dcp": "0/15"}),
    Group("push/pop", PushPop(), Shape(heads=1, head_dim=4), ("fpa", "fpa_dipsum", "fox", "sdpa", "selective"),
          {"fpa": "14/15", "fpa_dipsum": "11/15", "fox": "fails", "sdpa": "fails", "selective": "fails"}),
    *_longer_test_groups(),
    Group("find a name among alive keys", FindName(), Shape(heads=1, head_dim=4),
          ("fpa", "fpa_nolevel", "fpa_querylevel", "selective"),
          {"fpa": "15/15", "fpa_nolevel": "fails", "fpa_querylevel": "fails", "selective": "13/15"}),
    # the paper's third find_name ablation, trained as such (its query projections held at zero); a group of its own
    # so that the H200 run of the find_name group stays reusable as it is
    Group("find a name, without content retrieval", FindName(), Shape(heads=1, head_dim=4),
          ("fpa", "fpa_noretrieval"), {"fpa": "15/15", "fpa_noretrieval": "fails"}),
    Group("flip-flop", FlipFlop(), Shape(heads=1, head_dim=4), ("fpa",), {"fpa": "15/15"}),
    Group("copy", Copy(), Shape(heads=2, head_dim=8), ("fpa", "sdpa"), {"fpa": "15/15"}, steps=1500),
    Group("counting", Counting(), Shape(heads=1, head_dim=4), ("fpa",), {"fpa": "15/15"}),
    Group("variable assignment", VarAssign(), Shape(heads=1, head_dim=8), ("fpa", "fox"),
          {"fpa": "9/15", "fox": "15/15"}, steps=2000),
    Group("mqar, 2 layers", Mqar(), Shape(heads=2, head_dim=16, layers=2, width=64), ("fpa", "sdpa", "fpa_nobias1"),
          {"fpa": "0/15", "sdpa": "15/15", "fpa_nobias1": "15/15"}, steps=1500),
    Group("mqar, 3 layers", Mqar(), Shape(heads=2, head_dim=16, layers=3, width=64), ("fpa",), {"fpa": "0/15"},
          steps=1500),
    Group("mqar, 4 layers", Mqar(), Shape(heads=2, head_dim=16, layers=4, width=64), ("fpa",), {"fpa": "0/15"},
          steps=1500),
    *_mqar_regime_and_find_name_groups(),
]


def matches(label: str, pattern: str) -> bool:
    """Whether a group label matches a --groups entry: the label itself, or a shell-style pattern (``*`` any text,
    ``?`` one character), e.g. "unnamed ladder*positions, d=*, r=18"."""
    return label == pattern or fnmatchcase(label, pattern)


def select(probes: list[str] | None, backends: list[str] | None,
           groups: list[str] | None = None) -> list[tuple[Group, str]]:
    """The (group, backend) rows to run: groups whose probe name (``ladder``) or probe key (``ladder(r=10)``) is in
    `probes` and whose label is in `groups` (labels or patterns, ``matches``), backends in `backends` (None: no
    restriction)."""
    known = list(dict.fromkeys([g.probe.name for g in GROUPS] + [g.probe.key for g in GROUPS]))
    for name in probes or []:
        if name not in known:
            raise ValueError(f"unknown probe {name!r}; known: {', '.join(known)}")
    for name in backends or []:
        if name not in VARIANTS:
            raise ValueError(f"unknown probe backend {name!r}; known: {', '.join(VARIANTS)}")
    labels = [g.label for g in GROUPS]
    for label in groups or []:
        if not any(matches(known_label, label) for known_label in labels):
            raise ValueError(f"unknown table group {label!r}; the labels are listed by --list")
    rows = [(g, b) for g in GROUPS
            if (probes is None or g.probe.name in probes or g.probe.key in probes)
            and (groups is None or any(matches(g.label, pattern) for pattern in groups))
            for b in g.backends if backends is None or b in backends]
    if not rows:
        raise ValueError("no row of the table matches --probes, --groups and --backends (see --list)")
    return rows


def label_split_rows(plan: list[tuple[Group, str]]) -> tuple[list[tuple[Group, str]], list[str]]:
    """The rows of `plan` whose probes define a label-determining part (``Probe.label_mask``; for a group tested
    on another probe, both), so that they can run with the held-out split "label"; and the labels of the groups
    left out."""
    from fpa_lightning.probes.train import has_label_split

    def allowed(group: Group) -> bool:
        return has_label_split(group.probe) and (group.test_probe is None or has_label_split(group.test_probe))

    verdict = {}
    for group, _ in plan:
        if group.label not in verdict:
            verdict[group.label] = allowed(group)
    return [(g, b) for g, b in plan if verdict[g.label]], [label for label, ok in verdict.items() if not ok]
