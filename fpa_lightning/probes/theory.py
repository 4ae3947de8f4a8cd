"""The constructive half of the theory (docs/probes.md, "Hand-built heads and bounds"): one FPA head of constant width
d = 4, its weights set by hand, solves ``ladder`` for every r and ``dip_duration`` with either duration, without
training. The same weights with the dip-sum reduction fail ``dip_duration`` when the duration varies. The ladder
head also solves ``unnamed_ladder``, whose pushes name only their colour: the walk counts the rungs.

A softmax head of width 2 whose scores are a linear threshold over the rungs (``linear_threshold_head``) does not
solve ``ladder``: linear scores weigh the survivors geometrically where a majority needs equal weights
(docs/probes.md, "Hand-built heads and bounds").

And a bound for the other side (``best_accuracy_from``, ``position_blind_features``): a one-layer softmax head
without positions sees the dip's keys as a multiset, so on ``unnamed_ladder`` its answer can depend only on the dip
and the number of pushes of each colour, whatever its width.

Both constructions use one-hot token embeddings and the same walk: a push climbs one rung (δ = 1) and its key's
level is the new height (h = 0); D_k puts the field k below the walk (g = −k); every other token leaves the field at
the walk; BOS's level is far below every field (h = −100), so it never dies. A key the dip went j levels below gets
the bias −β·j, and exactly 0 while it survives.
- ``ladder``: q = 0, so the dip attends uniformly to the surviving keys (BOS and itself included, both with value 0);
  a push's value is +1 for colour 1 and −1 for colour 0. The output is (#1 − #0 among survivors) / (survivors + 2),
  and the readout thresholds it just above 0.
- ``dip_duration``: the query scores the marked key A, BOS c = A − 6 and every other key −c, so the head's output
  (the marked key's value 1 times its attention) is σ(6 − β·j): one level per depth, read by the nearest level.
"""
from __future__ import annotations

import math

import torch

from fpa_lightning.attention import AttentionConfig
from fpa_lightning.probes.base import ProbeBatch
from fpa_lightning.probes.ladder import DipDuration, Ladder, UnnamedLadder
from fpa_lightning.probes.model import ProbeModel, Shape

HEAD_DIM = 4
BOS_LEVEL = -100.0


def hand_built_fpa_head(probe: Ladder | DipDuration, reduction: str = "min") -> ProbeModel:
    """A one-layer, one-head FPA probe model (d = 4) that solves `probe`."""
    if isinstance(probe, Ladder):
        return _ladder_head(probe, reduction)
    if isinstance(probe, DipDuration):
        return _dip_duration_head(probe, reduction)
    raise TypeError(f"no hand-built head for {type(probe).__name__}")


def _model(probe, reduction: str = "min", backend: str = "fpa", head_dim: int = HEAD_DIM) -> ProbeModel:
    options = {"fpa_reduction": reduction} if backend == "fpa" else {}
    attention = AttentionConfig(backend=backend, impl="naive", **options)
    V = probe.vocab_size
    model = ProbeModel(V, probe.n_classes, Shape(heads=1, head_dim=head_dim, layers=1, width=V), attention)
    with torch.no_grad():
        model.embed.weight.copy_(torch.eye(V))
        model.readout.weight.zero_()
        model.readout.bias.zero_()
    return model


def _set_projections(model: ProbeModel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q, k, v (d, V) hold one column per token; the scores q·k are the logits."""
    layer = model.layers[0]
    with torch.no_grad():
        layer.qkv.weight.copy_(torch.cat([q * math.sqrt(layer.head_dim), k, v]))  # the layer divides q·k by √d
        layer.out.weight.zero_()
        layer.out.weight[0, 0] = 1.0  # residual coordinate 0 carries the head's value coordinate 0


def _set_head(model: ProbeModel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor,
              beta: float) -> None:
    """An FPA head: projections as in `_set_projections`, and gate (3, V: δ, g, h) with one column per token."""
    _set_projections(model, q, k, v)
    backend = model.layers[0].backend
    with torch.no_grad():
        backend.gate.weight.copy_(gate)
        backend.gate.bias.zero_()
        backend.beta_raw.fill_(math.log(math.expm1(beta)))  # softplus⁻¹


def _ladder_head(probe: Ladder, reduction: str) -> ProbeModel:
    model = _model(probe, reduction)
    V, r = probe.vocab_size, probe.r
    q, k, v, gate = torch.zeros(HEAD_DIM, V), torch.zeros(HEAD_DIM, V), torch.zeros(HEAD_DIM, V), torch.zeros(3, V)
    for rung in range(1, r + 1):
        for colour in (0, 1):
            gate[0, probe.push(rung, colour)] = 1.0
            v[0, probe.push(rung, colour)] = 2.0 * colour - 1.0
    for depth in range(1, r):
        gate[1, probe.dip(depth)] = -depth
    gate[2, 0] = BOS_LEVEL
    _set_head(model, q, k, v, gate, beta=30.0)
    _read_majority(model, r)
    return model


def _read_majority(model: ProbeModel, r: int) -> None:
    """Class 1 when the head's output, the mean ±1 colour of the keys it attends to, is above 1 / (4(r + 2)): a
    one-vote majority among the survivors gives at least 1 / (r + 1)."""
    with torch.no_grad():
        model.readout.weight[1, 0] = 1000.0
        model.readout.bias[1] = -1000.0 / (4 * (r + 2))


def linear_threshold_head(probe: Ladder, sharpness: float = 40.0) -> ProbeModel:
    """A softmax head without positions, d = 2, that scores the survivors of D_k above the dead rungs with a linear
    threshold: q(D_k)·k(P_i) = λ·(r − k + ½ − i) (q = λ·(r − k + ½, −1), k = (1, i)); BOS and the dip score as rung
    r + 1 (dead); a push's value is its colour ±1 and the readout is the FPA ladder head's."""
    if type(probe) is not Ladder:
        raise TypeError(f"the linear threshold head needs pushes that name their rung (ladder), got {probe.name}")
    model = _model(probe, backend="nope", head_dim=2)
    r, V = probe.r, probe.vocab_size
    q, k, v = torch.zeros(2, V), torch.zeros(2, V), torch.zeros(2, V)
    k[:, 0] = torch.tensor([1.0, r + 1.0])
    for rung in range(1, r + 1):
        for colour in (0, 1):
            k[:, probe.push(rung, colour)] = torch.tensor([1.0, float(rung)])
            v[0, probe.push(rung, colour)] = 2.0 * colour - 1.0
    for depth in range(1, r):
        q[:, probe.dip(depth)] = sharpness * torch.tensor([r - depth + 0.5, -1.0])
        k[:, probe.dip(depth)] = torch.tensor([1.0, r + 1.0])
    _set_projections(model, q, k, v)
    _read_majority(model, r)
    return model


DEPTH_BETA, DEPTH_MARGIN, DEPTH_SCORE = 4.0, 6.0, 40.0
"""The depth heads' constants: β, and the query's scores of the marked key (40) and BOS (40 − 6)."""


def _marked_key_head(probe, query: int, mark: int) -> tuple[torch.Tensor, ...]:
    """q, k, v (d, V) and gate maps (3, V) of a depth head: the query token scores the marked key at 40, BOS at 34
    and every other key at −34, and only the marked key has a value (1). The caller sets the walk in ``gate``."""
    V = probe.vocab_size
    q, k, v, gate = torch.zeros(HEAD_DIM, V), torch.zeros(HEAD_DIM, V), torch.zeros(HEAD_DIM, V), torch.zeros(3, V)
    q[:2, query] = torch.tensor([DEPTH_SCORE, DEPTH_SCORE - DEPTH_MARGIN])
    k[1] = -1.0  # every key scores −34 ...
    k[:, mark] = torch.tensor([1.0, 0.0, 0.0, 0.0])  # ... but the marked key (40) and BOS (34)
    k[:, 0] = torch.tensor([0.0, 1.0, 0.0, 0.0])
    v[0, mark] = 1.0
    gate[2, 0] = BOS_LEVEL
    return q, k, v, gate


def _read_nearest_depth(model: ProbeModel, max_class: int) -> None:
    """The head's output is σ(6 − β·depth): class c wins where the output is nearest its level (2·m·a − m², scaled)."""
    levels = [1 / (1 + math.exp(-(DEPTH_MARGIN - DEPTH_BETA * j))) for j in range(max_class + 1)]
    with torch.no_grad():
        for c, level in enumerate(levels):
            model.readout.weight[c, 0] = 100 * 2 * level
            model.readout.bias[c] = -100 * level**2


def _dip_duration_head(probe: DipDuration, reduction: str) -> ProbeModel:
    model = _model(probe, reduction)
    q, k, v, gate = _marked_key_head(probe, probe.QUERY, probe.MARK)  # the marked push is A
    gate[0, [probe.PUSH, probe.MARK]] = 1.0
    for depth in range(1, probe.r):
        gate[1, probe.dip(depth)] = -depth
    _set_head(model, q, k, v, gate, DEPTH_BETA)
    _read_nearest_depth(model, probe.MAX_CLASS)
    return model


def position_blind_features(probe: UnnamedLadder, batch: ProbeBatch) -> torch.Tensor:
    """(N, 2): the dip token and the number of colour-1 pushes of each sequence. A one-layer softmax head without
    positional encoding (any number of heads, any width) scores and mixes its keys by their tokens alone; at the dip
    its keys are BOS, r pushes of two tokens and the dip itself, so its output, and the readout's answer, is a
    function of these two numbers."""
    if not isinstance(probe, UnnamedLadder):
        raise TypeError(f"position_blind_features is defined for unnamed_ladder, got {probe.name}")
    colour_1 = probe.push(1, 1)
    return torch.stack([batch.tokens[:, -1], (batch.tokens[:, 1:-1] == colour_1).sum(dim=1)], dim=1)


def best_accuracy_from(features: torch.Tensor, labels: torch.Tensor) -> float:
    """The highest accuracy that any classifier seeing only `features` (N, F) reaches on these N labels (N,): each
    distinct row of features predicts its most common label."""
    _, group = torch.unique(features, dim=0, return_inverse=True)
    counts = torch.zeros(int(group.max()) + 1, int(labels.max()) + 1)
    counts.index_put_((group, labels), torch.ones(len(labels)), accumulate=True)
    return int(counts.max(dim=1).values.sum()) / len(labels)


# --- hand-built heads for two_families, push_pop and find_name (issue #22, item 4) -------------------------------
# The same conventions as above: one-hot token embeddings (width = vocabulary), a walk set through δ, levels through h
# (BOS far below), q, k and v one column per token. Scores are 20 for the key a query looks for and 0 for every
# other key, and β is 60, so a key the field went one level below weighs e^(20 − 60) beside the others: a dead key
# is gone, and the ≤ 15 other keys at score 0 carry less than 15·e^(−20) of the weight.
from fpa_lightning.probes.names import FindName, FindNameByPlace  # noqa: E402
from fpa_lightning.probes.walks import PushPop, TwoFamilies  # noqa: E402

MATCH_SCORE = 20.0
KILL_BETA = 60.0


def _heads_model(probe, heads: int, head_dim: int, **options) -> ProbeModel:
    """A one-layer FPA probe model of `heads` heads of width `head_dim` with one-hot embeddings (width = vocabulary)
    and a zero readout; `options` go to the ``AttentionConfig`` (e.g. fpa_form, fpa_level)."""
    V = probe.vocab_size
    attention = AttentionConfig(backend="fpa", impl="naive", **options)
    model = ProbeModel(V, probe.n_classes, Shape(heads=heads, head_dim=head_dim, layers=1, width=V), attention)
    with torch.no_grad():
        model.embed.weight.copy_(torch.eye(V))
        model.readout.weight.zero_()
        model.readout.bias.zero_()
    return model


def _set_heads(model: ProbeModel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor,
               beta: float, out: dict[tuple[int, int], int]) -> None:
    """q, k, v (H, d, V) and gate (3, H, V: δ, g, h per head), one column per token; out maps (head, value
    coordinate) to the residual coordinate the readout reads. Maps the backend does not have (g and h in the stack
    form, h without a level) must be zero here."""
    layer = model.layers[0]
    backend = layer.backend
    H, d, _ = q.shape
    with torch.no_grad():
        layer.qkv.weight.copy_(torch.cat([q.reshape(H * d, -1) * math.sqrt(d), k.reshape(H * d, -1),
                                          v.reshape(H * d, -1)]))
        layer.out.weight.zero_()
        for (head, coordinate), residual in out.items():
            layer.out.weight[residual, head * d + coordinate] = 1.0
        maps = backend.n_maps
        if gate[maps:].abs().sum() > 0:
            raise ValueError(f"the backend has {maps} gate map(s); the head needs more")
        backend.gate.weight.copy_(gate[:maps].reshape(maps * H, -1))
        backend.gate.bias.zero_()
        backend.beta_raw.fill_(math.log(math.expm1(beta)))


def hand_built_walk_head(probe, **options) -> ProbeModel:
    """A one-layer FPA model, weights set by hand, that solves `probe` (two_families, push_pop, find_name or
    find_name_by_place) at accuracy 1: see each ``_..._head`` below. `options` select an FPA variant
    (``fpa_form="stack"``, ``fpa_level="none"``...) where the construction does not need what it removes."""
    heads = {TwoFamilies: _two_families_head, PushPop: _push_pop_head, FindName: _find_name_head,
             FindNameByPlace: _find_name_by_place_head}
    if type(probe) not in heads:
        raise TypeError(f"no hand-built walk head for {type(probe).__name__}")
    return heads[type(probe)](probe, **options)


def _two_families_head(probe: TwoFamilies, **options) -> ProbeModel:
    """Two heads of d = 2 (the table's shape), one per walk. Head j climbs at U_j and steps down at D_j (δ = ±1),
    the other walk's steps leave its field alone; M's key sits at the walk's height (h = 0), so it is alive exactly
    while walk j never went below its height at M. Q scores M at 20 and M's value is 1, so head j's output is 1
    when M is alive under walk j and e^(−40) when it is not; the readout reads the two bits (alive₁ + 2·alive₂)."""
    model = _heads_model(probe, heads=2, head_dim=2, **options)
    V = probe.vocab_size
    q, k, v, gate = torch.zeros(2, 2, V), torch.zeros(2, 2, V), torch.zeros(2, 2, V), torch.zeros(3, 2, V)
    for token, (walk, step) in probe.STEP.items():
        gate[0, walk, token] = float(step)
    for head in range(2):
        q[head, 0, probe.QUERY] = MATCH_SCORE
        k[head, 0, probe.MARK] = 1.0
        v[head, 1, probe.MARK] = 1.0
    _set_heads(model, q, k, v, gate, KILL_BETA, out={(0, 1): 0, (1, 1): 1})
    with torch.no_grad():  # class c = b₁ + 2·b₂ scores Σ_j (2 b_j − 1)(o_j − ½): the right bits win
        for c in range(4):
            signs = torch.tensor([2.0 * (c & 1) - 1, 2.0 * ((c >> 1) & 1) - 1])
            model.readout.weight[c, :2] = 100 * signs
            model.readout.bias[c] = -50 * float(signs.sum())
    return model


def _push_pop_head(probe: PushPop, **options) -> ProbeModel:
    """One head of d = 4 (the table's shape) in stack form: a push climbs (δ = +1) and writes its key at the new
    height, POP steps down (δ = −1), so the alive pushes are exactly the stack. As in the ladder head, q = 0: Q
    attends uniformly to the alive keys (BOS, the stack, alive POP keys and Q itself, the last three of value 0, a
    push ±1 by colour); the output (#1 − #0) / (alive keys) is at least 1 / (ops + 2) when colour 1 has the
    majority and at most 0 otherwise, and the readout thresholds it at a quarter of that."""
    model = _heads_model(probe, heads=1, head_dim=HEAD_DIM, **options)
    V = probe.vocab_size
    q, k, v, gate = (torch.zeros(1, HEAD_DIM, V), torch.zeros(1, HEAD_DIM, V), torch.zeros(1, HEAD_DIM, V),
                     torch.zeros(3, 1, V))
    gate[0, 0, [probe.PUSH0, probe.PUSH1]] = 1.0
    gate[0, 0, probe.POP] = -1.0
    v[0, 0, probe.PUSH0], v[0, 0, probe.PUSH1] = -1.0, 1.0
    _set_heads(model, q, k, v, gate, beta=30.0, out={(0, 0): 0})
    _read_majority(model, probe.ops)
    return model


def _binding_head(probe, model: ProbeModel, gate: torch.Tensor, bindings) -> ProbeModel:
    """find_name's retrieval, shared by both forms: ?x scores x's bindings at 20 (k = e_name, q = 20·e_x) and a
    binding's value is e_value; the names and values fit the head's width d = 4 (the table's: 4 names, 4 values).
    The bias leaves x's one alive binding at 0 and its dead ones ≥ 1 level down, so the output is e_value of the
    alive binding, which the readout reads as the class. `bindings`: (token, name, value) of every binding token."""
    V = probe.vocab_size
    if probe.names > HEAD_DIM or probe.values > HEAD_DIM:
        raise ValueError(f"the hand-built find_name head has width {HEAD_DIM}: at most {HEAD_DIM} names and values")
    q, k, v = torch.zeros(1, HEAD_DIM, V), torch.zeros(1, HEAD_DIM, V), torch.zeros(1, HEAD_DIM, V)
    for token, name, value in bindings:
        k[0, name, token] = 1.0
        v[0, value, token] = 1.0
    for name in range(probe.names):
        q[0, name, probe.query(name)] = MATCH_SCORE
    gate[0, 0, probe.OPEN], gate[0, 0, probe.CLOSE] = 1.0, -1.0
    _set_heads(model, q, k, v, gate, KILL_BETA, out={(0, c): c for c in range(probe.values)})
    with torch.no_grad():
        for c in range(probe.values):
            model.readout.weight[c, c] = 100.0
    return model


def _find_name_head(probe: FindName, **options) -> ProbeModel:
    """One head of d = 4: "(" climbs, ")" steps down; a local binding's key sits at its block's height (h = 0), so
    it dies when the block closes; a global binding's (and BOS's) level is far below every field (h = −100), so it
    never dies. This uses the key level h: without it (fpa_level="none") a global written inside a block dies."""
    model = _heads_model(probe, heads=1, head_dim=HEAD_DIM, **options)
    gate = torch.zeros(3, 1, probe.vocab_size)
    gate[2, 0, 0] = BOS_LEVEL
    bindings = []
    for is_global in (False, True):
        for name in range(probe.names):
            for value in range(probe.values):
                token = probe.binding(is_global, name, value)
                bindings.append((token, name, value))
                if is_global:
                    gate[2, 0, token] = BOS_LEVEL
    return _binding_head(probe, model, gate, bindings)


def _find_name_by_place_head(probe: FindNameByPlace, **options) -> ProbeModel:
    """One head of d = 4 in stack form (g = h = 0): "(" climbs, ")" steps down and every key sits at its height. A
    top-level binding is at height 0, below which the walk never goes, so it never dies; a binding inside a block
    dies when the block closes. No level offset is used, so the same weights work with fpa_level="none" and
    fpa_form="stack"."""
    model = _heads_model(probe, heads=1, head_dim=HEAD_DIM, **options)
    bindings = [(probe.binding(name, value), name, value) for name in range(probe.names)
                for value in range(probe.values)]
    return _binding_head(probe, model, torch.zeros(3, 1, probe.vocab_size), bindings)


def push_pop_position_blind_features(probe: PushPop, batch: ProbeBatch) -> torch.Tensor:
    """(N, 3): the numbers of S0, S1 and POP tokens of each sequence. A one-layer softmax head without positional
    encoding (NoPE; any number of heads, any width) scores and mixes its keys by their tokens alone; at Q its keys are
    BOS, the program and Q, so its output, and the readout's answer, is a function of these three counts. (RoPE,
    ALiBi and FoX do see order; the bound is for NoPE.)"""
    if not isinstance(probe, PushPop):
        raise TypeError(f"push_pop_position_blind_features is defined for push_pop, got {probe.name}")
    program = batch.tokens[:, 1:-1]
    return torch.stack([(program == token).sum(dim=1) for token in (probe.PUSH0, probe.PUSH1, probe.POP)], dim=1)


# --- a hand-built head for dip_depth (issue #22, item 3) ------------------------------------------------------------
from fpa_lightning.probes.dips import DipDepth  # noqa: E402


def dip_depth_head(probe: DipDepth, reduction: str = "min") -> ProbeModel:
    """One FPA head of d = 4 that solves ``dip_depth`` at every duration. The walk: U climbs and D steps down
    (δ = ±1), every other token leaves it (N, S, M, Q); g = 0; M's key sits at the walk's height (h = 0), BOS's far
    below every field (h = −100). M's bias at Q is then −β·depth, the depth of the path minimum below M, whatever
    the path did at its bottom. The query scores M at 40, BOS at 34 and every other key at −34 (as
    ``_dip_duration_head``), so the head's output, M's value 1 times its attention, is σ(6 − β·depth) with β = 4:
    one level per class (depth ≥ 3 all fall nearest the level of 3), read by the nearest level.

    With ``reduction="dipsum"`` the same weights give M the bias −β·Σ_{u after M} (levels the walk is below M at u),
    which counts every position at the bottom (and on the way down and up) and so confuses depth with duration."""
    if not isinstance(probe, DipDepth):
        raise TypeError(f"dip_depth_head is defined for dip_depth, got {probe.name}")
    model = _model(probe, reduction)
    q, k, v, gate = _marked_key_head(probe, probe.Q, probe.M)
    for token, step in probe.STEP.items():
        gate[0, token] = float(step)
    _set_head(model, q, k, v, gate, DEPTH_BETA)
    _read_nearest_depth(model, probe.MAX_CLASS)
    return model


# --- multi_dip_ladder: what one FPA head does and no one-head peer can (issue #22, item 2) ------------------------
# ``hand_built_fpa_head`` above already solves ``multi_dip_ladder`` (a ``Ladder``: the same walk, dips and readout;
# a one-vote majority gives at least 1 / (r + dips + 1), above the readout's threshold 1 / (4(r + 2))).
from fpa_lightning.probes.ladder import MultiDipLadder  # noqa: E402


def one_head_obstruction(probe: MultiDipLadder) -> ProbeBatch:
    """Four sequences of `probe`'s support on which every one-layer model with ONE softmax head (RoPE, ALiBi, NoPE,
    a learned absolute position embedding, or FoX's forget gate; any head width) is wrong at least once, while one
    FPA head of width 4 (``hand_built_fpa_head``) is right on all four. So no width makes such a peer solve the
    probe: its d = r + 2 control cannot pass, and its failure is not capacity.

    The sequences: runs ending at rungs 4, 5, 6, …, r (the later dips kill every push of their runs, so only rungs
    1–3 matter); the first dip is D1 (kills rung 4) or D3 (kills rungs 2–4); colours of rungs 1, 2, 3 are
    (b, a, a) or (a, b, b), every other push is a. Labels (D1, baa) = 0, (D3, baa) = 1, (D1, abb) = 1, (D3, abb) = 0.

    Why a one-head peer fails one of them: at the last token t its class-1 logit minus its class-0 logit is
    Σ_s a_s·u_s / Σ_s a_s, with a_s = exp(score of key s) > 0 and u_s = the readout of the value of s. For a given
    last token, the score and value of key s depend only on its token and position (RoPE, ALiBi, a position
    embedding), and FoX adds Σ_{s<u≤t} log σ(f_u), so every key before the first dip p carries the factor
    λ = σ(f_p) of the dip's token (λ = 1 without a gate). The four sequences differ only at p (depth k) and in the
    colours c of rungs 1–3, all before p, so the sign of the logit difference is that of
    S(k, c) = λ_k·P(c) + Q(k) + C, with λ_k > 0. The labels need S(D1, baa) ≤ 0 < S(D1, abb), hence
    P(abb) > P(baa), and S(D3, abb) ≤ 0 < S(D3, baa), hence P(baa) > P(abb): impossible. (With several heads the
    logit is a sum of such ratios and the argument does not apply; the table's ladder heads are one.)"""
    if not isinstance(probe, MultiDipLadder):
        raise TypeError(f"one_head_obstruction is defined for multi_dip_ladder, got {probe.name}")
    r, m = probe.r, probe.dips
    ends = [4, *range(5, 5 + m - 2), r]
    if r < m + 3 or len(set(ends)) != m:
        raise ValueError(f"the construction needs r ≥ dips + 3, got r={r}, dips={m}")
    rows = []
    for first_depth in (1, 3):
        for first_colours in ((1, 0, 0), (0, 1, 1)):
            colours = [*first_colours, *[0] * (r - 3)]
            tokens, done = [0], 0
            for j, end in enumerate(ends):
                tokens += [probe.push(None, c) for c in colours[done:end]]
                tokens.append(probe.dip(first_depth if j == 0 else end - done))  # later dips: back to the last end
                done = end
            rows.append(tokens)
    tokens = torch.tensor(rows)
    labels = torch.tensor([probe.reference_labels(t) for t in rows])
    return ProbeBatch(tokens, labels)
