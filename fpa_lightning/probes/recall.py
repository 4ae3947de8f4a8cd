"""Multi-query associative recall (MQAR): key-value pairs, then every key again; recall its value (docs/probes.md).

It needs an induction-style circuit (a value token must first learn which key preceded it), hence two or more
layers; the paper's finding is that FPA's bias in layer 1 stops that first step from forming.

Two forms: the compact one (the table's first rows: the queries follow the pairs at once, length 3·pairs + 1), and a
long one (``length`` > 0) in which the queries are scattered over the rest of a longer sequence among filler tokens,
so that a query can sit hundreds of positions after its pair. ``layer_bias_ablation`` is the causal test of the
paper's explanation: it removes the bias of one layer of a trained model and measures held-out recall again.
"""
from __future__ import annotations

import copy
import random
from dataclasses import dataclass

import torch

from fpa_lightning.attention import AttentionBackend
from fpa_lightning.probes.base import BOS, IGNORE, Probe, ProbeBatch, sample_each
from fpa_lightning.probes.model import ProbeModel
from fpa_lightning.probes.train import held_out_set


@dataclass(frozen=True)
class Mqar(Probe):
    """<bos> k_1 v_1 … k_P v_P, then the P keys again in a random order. Keys are distinct draws from `keys` keys,
    values uniform over `values` values. Label at each repeated key: its value.

    With `length` > 0 the sequence has `length` tokens (BOS included): after the pairs come length − 1 − 2P slots, P
    of them (uniform, in position order) hold the repeated keys in a random order and the others the filler token
    ``_`` (never scored, never a key). `length` = 0 (the default) is the compact form, 3P + 1 tokens, with no
    filler token in the vocabulary."""

    pairs: int = 8
    keys: int = 16
    values: int = 16
    length: int = 0
    """0: compact (3·pairs + 1 tokens). Otherwise the sequence length, at least 3·pairs + 1."""

    name = "mqar"
    family = "recall"
    summary = "key-value pairs, then the keys again: recall each key's value"

    def __post_init__(self):
        if self.pairs > self.keys:
            raise ValueError(f"mqar: pairs ({self.pairs}) cannot exceed keys ({self.keys}): keys are distinct")
        if self.length and self.length < 3 * self.pairs + 1:
            raise ValueError(f"mqar: length ({self.length}) must be 0 (compact) or at least 3·pairs + 1 "
                             f"= {3 * self.pairs + 1}")

    def vocab(self) -> list[str]:
        filler = ["_"] if self.length else []
        return ["<bos>", *(f"k{i}" for i in range(self.keys)), *(f"v{i}" for i in range(self.values)), *filler]

    @property
    def params(self) -> dict:
        """The compact form's parameters leave `length` out, so its key (``mqar(pairs=8, keys=16, values=16)``),
        which names the table's earlier rows and seeds their minibatches, is what it was before `length` existed."""
        params = super().params
        if not self.length:
            del params["length"]
        return params

    @property
    def filler(self) -> int:
        """The filler token of the long form."""
        if not self.length:
            raise ValueError("mqar: the compact form has no filler token")
        return 1 + self.keys + self.values

    def classes(self) -> list[str]:
        return [f"v{i}" for i in range(self.values)]

    def sample(self, n: int, gen) -> ProbeBatch:
        return sample_each(n, gen, self._one)

    def _one(self, rng: random.Random):
        keys = rng.sample(range(self.keys), self.pairs)
        values = [rng.randrange(self.values) for _ in keys]
        order = rng.sample(range(self.pairs), self.pairs)
        tokens = [BOS]
        for k, v in zip(keys, values):
            tokens += [1 + k, 1 + self.keys + v]
        if not self.length:
            tokens += [1 + keys[i] for i in order]
            return tokens, [IGNORE] * (1 + 2 * self.pairs) + [values[i] for i in order]
        slots = self.length - len(tokens)
        labels = [IGNORE] * len(tokens) + [IGNORE] * slots
        tokens += [self.filler] * slots
        for slot, i in zip(sorted(rng.sample(range(slots), self.pairs)), order):
            tokens[1 + 2 * self.pairs + slot] = 1 + keys[i]
            labels[1 + 2 * self.pairs + slot] = values[i]
        return tokens, labels

    def reference_labels(self, tokens: list[int]) -> list[int]:
        labels = []
        for pos, t in enumerate(tokens):
            earlier = [p for p in range(1, pos) if tokens[p] == t]
            labels.append(tokens[earlier[0] + 1] - 1 - self.keys if 1 <= t <= self.keys and earlier else IGNORE)
        return labels

    def value_positions(self) -> torch.Tensor:
        """(P,) positions of the values v_1..v_P; each pair's key sits just before its value."""
        return torch.arange(1, self.pairs + 1) * 2

    def query_positions(self) -> torch.Tensor:
        """(P,) positions of the repeated keys (the scored queries); compact form only (in the long form they
        differ between sequences: the scored positions of the labels)."""
        if self.length:
            raise ValueError("mqar: the long form's query positions differ per sequence (read them off the labels)")
        return torch.arange(2 * self.pairs + 1, 3 * self.pairs + 1)

    def answer_positions(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, T) -> (B, P): for each repeated key, the position of the value it must recall (compact form)."""
        keys = tokens[:, 1:2 * self.pairs:2]  # (B, P) k_1..k_P
        queries = tokens[:, self.query_positions().to(tokens.device)]  # (B, P)
        pair = (queries[:, :, None] == keys[:, None, :]).float().argmax(-1)  # (B, P): index of the matching key
        return 2 * pair + 2


# --- the causal test: remove one layer's bias from a trained model --------------------------------------------------
def without_layer_bias(model: ProbeModel, layer: int = 0) -> ProbeModel:
    """A copy of a trained `model` whose layer `layer` (0: the first) runs plain causal softmax with the same q, k, v
    and output weights and no bias: what ``Variant.no_first_layer_bias`` (``AttentionConfig.bias_layers``) builds
    for layer 0, here applied after training. The layer's positional encoding stays as configured (RoPE lives in
    the layer; FPA and FoX have none, so their layer becomes softmax without positions). For FPA this equals zeroing
    the layer's gate maps (δ = g = h = 0 gives φ = ψ = 0 and a bias of exactly 0)."""
    if not 0 <= layer < len(model.layers):
        raise ValueError(f"layer {layer} out of range for a model of {len(model.layers)} layers")
    ablated = copy.deepcopy(model)
    attention = ablated.layers[layer]
    backend = attention.backend
    if not backend.has_bias:
        raise ValueError(f"layer {layer} has no bias to remove ({type(backend).__name__})")
    plain = AttentionBackend(backend.cfg, attention.qkv.in_features, backend.n_head, backend.head_dim)
    attention.backend = plain.to(attention.qkv.weight.device)
    return ablated


@torch.no_grad()
def held_out_accuracy(model: ProbeModel, probe: Probe, n: int = 2048, chunk: int = 256) -> float:
    """One model's accuracy over the scored positions of a row's held-out set of `n` sequences (``held_out_set``, as
    ``train_row`` scores a row with ``Budget.test`` = n; n = 2048: the table's)."""
    test = held_out_set(probe, n)
    device = next(model.parameters()).device
    correct = total = 0
    was_training = model.training
    model.eval()
    for i in range(0, n, chunk):
        tokens, labels = test.tokens[i:i + chunk].to(device), test.labels[i:i + chunk].to(device)
        scored = labels != IGNORE
        correct += int(((model(tokens).argmax(-1) == labels) & scored).sum())
        total += int(scored.sum())
    model.train(was_training)
    return correct / max(total, 1)


def layer_bias_ablation(model: ProbeModel, probe: Probe, layer: int = 0, n: int = 2048) -> dict[str, float]:
    """Held-out accuracy of a trained `model` before and after removing the bias of layer `layer`
    (``without_layer_bias``): {"before": ..., "after": ...}. If the paper's account of MQAR holds (a layer-1 bias
    stops the first step of the recall circuit), a model that recalls does not lean on that bias and removing it
    changes little; a large drop means the trained circuit runs through the bias."""
    return {"before": held_out_accuracy(model, probe, n), "after": held_out_accuracy(without_layer_bias(model, layer),
                                                                                     probe, n)}
