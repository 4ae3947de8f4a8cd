"""Training one row of the table: every seed of one (probe, backend, shape) at once, then held-out accuracy.

Data: a training pool and a held-out set are drawn once per row from fixed generator seeds, so every backend
sees the same pool and is scored on the same held-out sequences (paired seeds, docs/probes.md). Each seed draws
its own minibatches from the pool. Optimiser: AdamW (no weight decay unless ``Budget.weight_decay`` asks for it),
one-cycle learning rate (linear warm-up over the first 10 % of the steps, then linear decay to zero).

**The held-out set is disjoint from the pool by construction.** The space of token sequences is split once and for
all by a hash of each sequence's tokens: one sequence in ``Budget.holdout`` (4) is *held out* (``in_held_out``).
The pool is drawn from the probe's distribution and keeps only sequences of the training part (rows that fall in
the held-out part are dropped and more are drawn); the held-out set keeps only sequences of the held-out part.
Why this, and not the alternatives:
- *excluding the held-out set's own sequences from the pool* fails where a probe's whole space is small: 2048 draws
  of ``ladder(r=6)`` (320 sequences) or ``dip_duration`` (504) cover nearly all of it, and nothing is left to train
  on. A fixed share of the space keeps 3/4 of it for training whatever its size, and a space of any size but the
  tiniest gets a held-out part;
- *fresh sequences every step* would cost a generator call per step and seed (a plain Python loop for most probes,
  15 × 128 sequences a step), and would give each seed different data, where a pool drawn once gives every backend
  and seed the same sequences (the paired design of the sign test);
- the split depends on the tokens alone, not on which sequences a draw happened to produce, so pools of any size,
  a group's separate test probe (``Group.test_probe``: train at one setting, test at another) and later runs all
  agree on which side a sequence lies. The hash is blake2b (well mixed: a linear hash or a CRC taken modulo 4 is a
  parity of token bits, which a label such as a majority can correlate with).
For the large spaces of most probes the two parts are each a uniform random share of the space, so the pool and the
held-out set are, to within that share, draws from the probe's own distribution. A small space has a small held-out
part, which need not hold every class (``dip_duration(duration=fixed)``: 28 of its 112 sequences, none of class 2);
a row records how many distinct sequences its held-out set has (``RowRun.held_out_distinct``), and such probes need
a larger space rather than a larger share. A quarter rather than less: the held-out part of a small space is then
as large as it can be while training keeps most of the space (``ladder(r=10)``: about 2300 of 9216 sequences).

**Three knobs of the split** (``Budget``; each recorded in a row's budget only where it is not its default, so the
committed rows keep their identity):
- ``split="label"``: the hash is taken of each sequence's *label-determining part* (``Probe.label_mask``: for
  ``ladder`` the dip and the surviving pushes, for ``dip_depth`` the walk from M on) instead of the whole sequence, so
  no held-out sequence shares its label-determining part with a training sequence. Under the default split
  (``"sequence"``) the held-out sequences are new, but their label-determining part often is not: the dead pushes or
  the walk before M differ, and the part that decides the label was trained on. Defined for the probes that
  implement ``label_mask``; ``split_keys`` raises for the others;
- ``data_seed``: another replicate of the data: other generator seeds for the pool and the held-out set (``data_seeds``;
  0 is the committed pair 1, 2);
- ``salt``: another split of the same space: the hash is keyed with the salt (blake2b's key; "" is the unkeyed hash
  of the committed rows), so a different salt puts a different quarter of the space in the held-out part.
"""
from __future__ import annotations

import hashlib
import math
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from fpa_lightning.probes.base import IGNORE, Probe, ProbeBatch
from fpa_lightning.probes.model import ProbeModel, SeedEnsemble, Shape, Variant

POOL_SEED, TEST_SEED = 1, 2
SPLITS = ("sequence", "label")
"""What the held-out split hashes: the whole sequence, or its label-determining part (module docstring)."""
MAX_SALT_BYTES = 64
"""blake2b's longest key."""


@dataclass(frozen=True)
class Budget:
    """How a row is trained."""

    steps: int = 2000
    batch: int = 128
    """Sequences per step and seed."""
    lr: float = 1e-2
    weight_decay: float = 0.0
    """AdamW decoupled decay of every parameter but the backend's own gate maps (0: none, the default)."""
    warmup: float = 0.1
    pool: int = 32768
    """Training sequences drawn once per row (at most steps × batch)."""
    test: int = 2048
    """Held-out sequences."""
    holdout: int = 4
    """One sequence in `holdout` of the probe's sequence space is held out: never in the pool, the only kind in the
    held-out set (``in_held_out``; the module docstring says why)."""
    split: str = "sequence"
    """What the split hashes: "sequence" (the whole sequence) or "label" (its label-determining part)."""
    data_seed: int = 0
    """The data replicate: 0 draws the pool and the held-out set from generator seeds 1 and 2 (``data_seeds``)."""
    salt: str = ""
    """The key of the split's hash ("" : unkeyed, the committed split)."""

    def __post_init__(self):
        if self.steps < 1 or self.batch < 1 or self.pool < 1 or self.test < 1:
            raise ValueError(f"probe budget: steps, batch, pool and test must be positive, got {self}")
        if self.holdout < 2:
            raise ValueError(f"probe budget: holdout must be at least 2 (one sequence in holdout is held out), "
                             f"got {self.holdout}")
        if not (self.lr > 0 and 0 <= self.warmup < 1 and self.weight_decay >= 0):
            raise ValueError(f"probe budget: lr must be positive, warmup in [0, 1) and weight_decay non-negative, "
                             f"got {self.lr}, {self.warmup}, {self.weight_decay}")
        if self.split not in SPLITS:
            raise ValueError(f"probe budget: split must be one of {SPLITS}, got {self.split!r}")
        if self.data_seed < 0:
            raise ValueError(f"probe budget: data_seed must be non-negative, got {self.data_seed}")
        if len(self.salt.encode()) > MAX_SALT_BYTES:
            raise ValueError(f"probe budget: salt must be at most {MAX_SALT_BYTES} bytes, "
                             f"got {len(self.salt.encode())}")

    def record(self) -> dict:
        """The budget as a row records it: every field, but the split's knobs (split, data_seed, salt) only where
        they differ from their defaults, so rows recorded before the knobs existed keep their identity."""
        record = asdict(self)
        for name in ("split", "data_seed", "salt"):
            if record[name] == getattr(Budget, name):
                del record[name]
        return record

    @property
    def data(self) -> dict:
        """The keyword arguments of ``draw_part``, ``held_out_set`` and ``training_pool`` that this budget sets."""
        return {"holdout": self.holdout, "split": self.split, "data_seed": self.data_seed, "salt": self.salt}

    def lr_factor(self, step: int) -> float:
        """One-cycle: linear warm-up, then linear decay to 0."""
        warm = max(1, math.ceil(self.warmup * self.steps))
        return (step + 1) / warm if step < warm else max(0.0, (self.steps - step) / (self.steps - warm + 1))


@dataclass
class RowRun:
    accuracies: list[float]
    """Held-out accuracy per seed (scored positions only)."""
    final_loss: list[float]
    """Per seed, the training loss averaged over the last 5 % of the steps."""
    seconds: float
    held_out_distinct: int = 0
    """How many distinct sequences the held-out set holds (fewer than its size where the probe's space is small)."""
    held_out_parts: int | None = None
    """How many distinct label-determining parts it holds (None where the probe defines none, ``Probe.label_mask``)."""
    part_overlap: float | None = None
    """The share of held-out sequences whose label-determining part also occurs in the pool (0 under
    ``split="label"``; None where the probe defines none)."""
    loss_curve: list[list[float]] = field(default_factory=list)
    """Per seed, the training loss averaged over each of ``CURVE_WINDOWS`` equal windows of the steps: whether a
    budget is long enough (a seed still falling at the end, or stuck where it started)."""
    ensemble: SeedEnsemble | None = field(default=None, repr=False)
    """The trained seeds, for analyses after training (not part of a row's record)."""


CURVE_WINDOWS = 20


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def data_seeds(data_seed: int = 0) -> tuple[int, int]:
    """The generator seeds of a row's pool and held-out set for data replicate `data_seed` (0: 1 and 2, the
    committed rows')."""
    return POOL_SEED + 2 * data_seed, TEST_SEED + 2 * data_seed


def in_held_out(tokens: torch.Tensor, holdout: int, salt: str = "") -> torch.Tensor:
    """(N, T) token rows -> (N,) bool: whether each sequence lies in the held-out part of the sequence space, one
    sequence in `holdout`. A function of the tokens alone (blake2b of the row as int64, keyed with `salt`; the empty
    salt is the unkeyed hash), the same on every machine."""
    rows = tokens.detach().to("cpu", torch.int64).contiguous().numpy()
    key = salt.encode()
    digests = [int.from_bytes(hashlib.blake2b(row.tobytes(), digest_size=8, key=key).digest(), "little")
               for row in rows]
    return torch.tensor([d % holdout == 0 for d in digests], dtype=torch.bool)


def split_keys(probe: Probe, tokens: torch.Tensor, split: str = "sequence") -> torch.Tensor:
    """What the held-out split hashes for each sequence: the tokens themselves ("sequence"), or their
    label-determining part ("label": the tokens outside ``Probe.label_mask`` replaced by −1)."""
    if split == "sequence":
        return tokens
    if split != "label":
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    mask = probe.label_mask(tokens)
    if mask is None:
        raise ValueError(f"{probe.key}: no label-determining part is defined (Probe.label_mask), so it has no "
                         f"label-disjoint split")
    return tokens.masked_fill(~mask, -1)


def has_label_split(probe: Probe) -> bool:
    """Whether `probe` defines its label-determining part (and so the split "label")."""
    return probe.label_mask(probe.sample(1, seeded(0)).tokens) is not None


def label_parts(probe: Probe, tokens: torch.Tensor) -> set[tuple[int, ...]] | None:
    """The distinct label-determining parts of these sequences, or None where the probe defines none."""
    mask = probe.label_mask(tokens)
    return None if mask is None else set(map(tuple, tokens.masked_fill(~mask, -1).tolist()))


def part_overlap(probe: Probe, pool: ProbeBatch, test: ProbeBatch) -> tuple[int, float] | tuple[None, None]:
    """(distinct label-determining parts of the held-out set, the share of held-out sequences whose part also
    occurs in the pool), or (None, None) where the probe defines none."""
    in_pool = label_parts(probe, pool.tokens)
    if in_pool is None:
        return None, None
    mask = probe.label_mask(test.tokens)
    parts = list(map(tuple, test.tokens.masked_fill(~mask, -1).tolist()))
    return len(set(parts)), sum(p in in_pool for p in parts) / max(len(parts), 1)


MAX_DRAW_ROUNDS = 50


def draw_part(probe: Probe, n: int, seed: int, holdout: int, held_out: bool, split: str = "sequence",
              salt: str = "") -> ProbeBatch:
    """n sequences of `probe` drawn with generator `seed`, keeping only those of one part of the space (the held-out
    part if `held_out`, else the training part), in the order drawn. The part is decided by the hash of the whole
    sequence or of its label-determining part (`split`, ``split_keys``), keyed with `salt`. Raises if the part seems
    to be empty."""
    gen, kept, have = seeded(seed), [], 0
    share = 1 / holdout if held_out else 1 - 1 / holdout
    for _ in range(MAX_DRAW_ROUNDS):
        if have >= n:
            break
        batch = probe.sample(math.ceil((n - have) / share * 1.1) + 16, gen)  # about what the rest needs
        keep = in_held_out(split_keys(probe, batch.tokens, split), holdout, salt) == held_out
        kept.append(ProbeBatch(batch.tokens[keep], batch.labels[keep]))
        have += int(keep.sum())
    if have < n:
        raise RuntimeError(f"{probe.key}: only {have} of {n} sequences drawn in {MAX_DRAW_ROUNDS} rounds fall in the "
                           f"{'held-out' if held_out else 'training'} part of its sequence space (one in {holdout} "
                           f"is held out, split by {split}): the space is too small for this split")
    return ProbeBatch(torch.cat([b.tokens for b in kept])[:n], torch.cat([b.labels for b in kept])[:n])


def held_out_set(probe: Probe, n: int, holdout: int = Budget.holdout, split: str = "sequence", data_seed: int = 0,
                 salt: str = "") -> ProbeBatch:
    """The held-out set of a row: n sequences of the held-out part, drawn from generator ``TEST_SEED`` (data
    replicate 0; ``data_seeds``)."""
    return draw_part(probe, n, data_seeds(data_seed)[1], holdout, held_out=True, split=split, salt=salt)


def training_pool(probe: Probe, n: int, holdout: int = Budget.holdout, split: str = "sequence", data_seed: int = 0,
                  salt: str = "") -> ProbeBatch:
    """The training pool of a row: n sequences of the training part, drawn from generator ``POOL_SEED`` (data
    replicate 0; ``data_seeds``)."""
    return draw_part(probe, n, data_seeds(data_seed)[0], holdout, held_out=False, split=split, salt=salt)


def check_test_probe(probe: Probe, test_probe: Probe) -> None:
    """A probe that tests a model trained on `probe` must speak its language: the same tokens and classes."""
    if test_probe.vocab() != probe.vocab() or test_probe.classes() != probe.classes():
        raise ValueError(f"test probe {test_probe.key} differs from the training probe {probe.key} in its "
                         f"vocabulary or classes, so a model trained on one cannot be scored on the other")


def row_data(probe: Probe, budget: Budget, test_probe: Probe | None = None) -> tuple[ProbeBatch, ProbeBatch]:
    """A row's (pool, held-out set): min(pool, steps × batch) training sequences of `probe` and ``budget.test``
    held-out ones, of `test_probe` where given (a group trained at one setting and tested at another), else of
    `probe`. Disjoint by construction (module docstring), on the whole sequences or, with ``budget.split`` =
    "label", on their label-determining parts."""
    if test_probe is not None:
        check_test_probe(probe, test_probe)
    pool = training_pool(probe, min(budget.pool, budget.steps * budget.batch), **budget.data)
    return pool, held_out_set(test_probe or probe, budget.test, **budget.data)


def make_model(probe: Probe, variant: Variant, shape: Shape, impl: str = "naive") -> ProbeModel:
    attention = variant.attention(shape.layers, dcp_dim=shape.head_dim, impl=impl)
    first = variant.first_layer_attention(shape.layers, dcp_dim=shape.head_dim, impl=impl)
    return ProbeModel(probe.vocab_size, probe.n_classes, shape, attention, probe.reads_token, first_attention=first)


def runs_under_vmap(model: ProbeModel, device: torch.device) -> bool:
    """Whether every attention layer of `model` runs under ``torch.func.vmap`` on `device`: the naive (dense) path
    always, the fused path where its backend says so (``AttentionBackend.fused_vmappable``); the chunked path is not
    run under vmap. One launch per layer then serves every seed, where a loop over 15 seeds launches 15."""
    implementations = [(layer.backend, layer.backend.resolve_impl(device)) for layer in model.layers]
    return all(impl == "naive" or (impl == "fused" and backend.fused_vmappable) for backend, impl in implementations)


def per_seed_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """logits (E, B, T, K), labels (E, B, T) -> (E,) mean cross-entropy over scored positions."""
    losses = F.cross_entropy(logits.flatten(0, 2).float(), labels.flatten().clamp(min=0), reduction="none")
    scored = (labels != IGNORE).flatten().float()
    return (losses * scored).view(labels.shape).sum((1, 2)) / scored.view(labels.shape).sum((1, 2)).clamp(min=1)


@torch.no_grad()
def accuracy(ensemble: SeedEnsemble, data: ProbeBatch, chunk: int = 512) -> list[float]:
    """Held-out accuracy per seed: the same sequences for every seed."""
    correct = torch.zeros(len(ensemble.seeds), dtype=torch.float64, device=data.tokens.device)
    total = 0
    for i in range(0, data.tokens.shape[0], chunk):
        tokens, labels = data.tokens[i:i + chunk], data.labels[i:i + chunk]
        E = len(ensemble.seeds)
        logits = ensemble(tokens.expand(E, -1, -1))  # (E, b, T, K)
        scored = labels != IGNORE
        hits = (logits.argmax(-1) == labels) & scored
        correct += hits.sum((1, 2)).double()
        total += int(scored.sum())
    return (correct / max(total, 1)).tolist()


def make_trainee(probe: Probe, variant: Variant, shape: Shape, seeds: list[int], budget: Budget,
                 device: torch.device, impl: str = "naive") -> tuple[SeedEnsemble, torch.optim.Optimizer]:
    """A row's seeds as one ensemble on `device` (vmapped where every layer allows it) and their AdamW optimiser."""
    ensemble = SeedEnsemble(lambda: make_model(probe, variant, shape, impl), seeds).to(device)
    ensemble.vmapped = runs_under_vmap(ensemble.template, device)
    if not variant.content_retrieval:
        ensemble.zero_queries()
    optimizer = torch.optim.AdamW(ensemble.decay_groups(budget.weight_decay), lr=budget.lr, betas=(0.9, 0.98))
    return ensemble, optimizer


def minibatch_pickers(probe: Probe, seeds: list[int]) -> list[torch.Generator]:
    """One generator per seed for its minibatches: each seed draws the same ones whichever seeds run beside it."""
    return [seeded(zlib.crc32(probe.key.encode()) + seed) for seed in seeds]


def draw_minibatches(pickers: list[torch.Generator], pool_size: int, batch: int, device: torch.device) -> torch.Tensor:
    """(E, batch) pool indices, row i drawn with seed i's picker."""
    return torch.stack([torch.randint(0, pool_size, (batch,), generator=g) for g in pickers]).to(device)


def train_step(ensemble: SeedEnsemble, optimizer: torch.optim.Optimizer, tokens: torch.Tensor,
               labels: torch.Tensor, variant: Variant) -> torch.Tensor:
    """One optimiser step of every seed on its own minibatch: tokens, labels (E, B, T) -> the (E,) losses before it."""
    loss = per_seed_loss(ensemble(tokens), labels)  # (E,)
    optimizer.zero_grad(set_to_none=True)
    loss.sum().backward()
    optimizer.step()
    if not variant.content_retrieval:  # AdamW moved the query rows: back to zero before the next forward
        ensemble.zero_queries()
    return loss


def train_row(probe: Probe, variant: Variant, shape: Shape, seeds: list[int], budget: Budget,
              device: torch.device, progress: Callable[[int, float], None] | None = None,
              test_probe: Probe | None = None, impl: str = "naive") -> RowRun:
    """Train every seed of one row together on `probe` and score it on held-out sequences of `test_probe` (default:
    `probe`); `progress(step, mean loss)` is called every few steps. impl: the attention implementation; "naive"
    trains the seeds as one vmapped model, any other (for long sequences: "auto" takes the backend's fused kernel on
    a GPU) runs them as one vmapped model too where every layer's implementation allows it (``runs_under_vmap``: the
    FPA kernel does), and otherwise one after another within each step."""
    started = time.time()
    pool, test = row_data(probe, budget, test_probe)
    parts, overlap = part_overlap(test_probe or probe, pool, test)
    pool, test = pool.to(device), test.to(device)
    pool_size = pool.tokens.shape[0]
    ensemble, optimizer = make_trainee(probe, variant, shape, seeds, budget, device, impl)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, budget.lr_factor)
    pickers = minibatch_pickers(probe, seeds)
    tail = max(1, budget.steps // 20)
    recent = torch.zeros(len(seeds), device=device)
    windows = curve_windows(budget.steps)
    window_of = [i for i, (start, end) in enumerate(windows) for _ in range(start, end)]  # step -> its window
    curve = torch.zeros(len(windows), len(seeds), device=device)
    for step in range(budget.steps):
        index = draw_minibatches(pickers, pool_size, budget.batch, device)
        loss = train_step(ensemble, optimizer, pool.tokens[index], pool.labels[index], variant)  # (E,)
        schedule.step()
        curve[window_of[step]] += loss.detach()
        if step >= budget.steps - tail:
            recent += loss.detach()
        if progress is not None and ((step + 1) % 50 == 0 or step == budget.steps - 1):
            progress(step + 1, float(loss.detach().mean()))
    sizes = torch.tensor([b - a for a, b in windows], dtype=curve.dtype, device=device)[:, None]
    return RowRun(accuracy(ensemble, test), (recent / tail).tolist(), time.time() - started,
                  held_out_distinct=len(torch.unique(test.tokens, dim=0)), held_out_parts=parts,
                  part_overlap=overlap, loss_curve=(curve / sizes).T.tolist(), ensemble=ensemble)


def curve_windows(steps: int, windows: int = CURVE_WINDOWS) -> list[tuple[int, int]]:
    """The [start, end) step ranges of a loss curve's windows: `windows` near-equal ranges (fewer for fewer
    steps)."""
    n = min(windows, steps)
    bounds = [round(i * steps / n) for i in range(n + 1)]
    return list(zip(bounds, bounds[1:]))
