"""The constructive half of the theory (docs/probes.md, "Hand-built FPA heads"): one FPA head of constant width
d = 4, its weights set by hand, solves ``ladder`` for every r and ``dip_duration`` with either duration, without
training. The same weights with the dip-sum reduction fail ``dip_duration`` when the duration varies. The ladder
head also solves ``unnamed_ladder``, whose pushes name only their colour: the walk counts the rungs.

A softmax head of width 2 whose scores are a linear threshold over the rungs (``linear_threshold_head``) does not
solve ``ladder``: linear scores weigh the survivors geometrically where a majority needs equal weights
(docs/probes.md, "Where we differ", investigation 5).

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

from fpa_lightning.config import AttentionConfig
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


def _dip_duration_head(probe: DipDuration, reduction: str) -> ProbeModel:
    model = _model(probe, reduction)
    V, beta, margin, score = probe.vocab_size, 4.0, 6.0, 40.0
    q, k, v, gate = torch.zeros(HEAD_DIM, V), torch.zeros(HEAD_DIM, V), torch.zeros(HEAD_DIM, V), torch.zeros(3, V)
    sink = score - margin
    q[:2, probe.QUERY] = torch.tensor([score, sink])
    k[1] = -1.0  # every key scores −c ...
    k[:, probe.MARK] = torch.tensor([1.0, 0.0, 0.0, 0.0])  # ... but the marked push (A) and BOS (c)
    k[:, 0] = torch.tensor([0.0, 1.0, 0.0, 0.0])
    v[0, probe.MARK] = 1.0
    gate[0, [probe.PUSH, probe.MARK]] = 1.0
    for depth in range(1, probe.r):
        gate[1, probe.dip(depth)] = -depth
    gate[2, 0] = BOS_LEVEL
    _set_head(model, q, k, v, gate, beta)
    levels = [1 / (1 + math.exp(-(margin - beta * j))) for j in range(probe.MAX_CLASS + 1)]
    with torch.no_grad():
        for c, level in enumerate(levels):  # the nearest level wins: 2·m·a − m², scaled
            model.readout.weight[c, 0] = 100 * 2 * level
            model.readout.bias[c] = -100 * level**2
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
