"""Training one row of the table: every seed of one (probe, backend, shape) at once, then held-out accuracy.

Data: a training pool and a held-out set are drawn once per row from fixed generator seeds, so every backend
sees the same pool and is scored on the same held-out sequences (paired seeds, docs/probes.md). Each seed draws
its own minibatches from the pool. Optimiser: AdamW (no weight decay unless ``Budget.weight_decay`` asks for it),
one-cycle learning rate (linear warm-up over the first 10 % of the steps, then linear decay to zero).
"""
from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from fpa_lightning.probes.base import IGNORE, Probe, ProbeBatch
from fpa_lightning.probes.model import ProbeModel, SeedEnsemble, Shape, Variant

POOL_SEED, TEST_SEED = 1, 2


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

    def __post_init__(self):
        if self.steps < 1 or self.batch < 1 or self.pool < 1 or self.test < 1:
            raise ValueError(f"probe budget: steps, batch, pool and test must be positive, got {self}")
        if not (self.lr > 0 and 0 <= self.warmup < 1 and self.weight_decay >= 0):
            raise ValueError(f"probe budget: lr must be positive, warmup in [0, 1) and weight_decay non-negative, "
                             f"got {self.lr}, {self.warmup}, {self.weight_decay}")

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
    ensemble: SeedEnsemble | None = field(default=None, repr=False)
    """The trained seeds, for analyses after training (not part of a row's record)."""


def make_model(probe: Probe, variant: Variant, shape: Shape) -> ProbeModel:
    attention = variant.attention(shape.layers, dcp_dim=shape.head_dim)
    return ProbeModel(probe.vocab_size, probe.n_classes, shape, attention, probe.reads_token)


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


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


def train_row(probe: Probe, variant: Variant, shape: Shape, seeds: list[int], budget: Budget,
              device: torch.device, progress: Callable[[int, float], None] | None = None) -> RowRun:
    """Train every seed of one row together; `progress(step, mean loss)` is called every few steps."""
    started = time.time()
    pool_size = min(budget.pool, budget.steps * budget.batch)
    pool = probe.sample(pool_size, seeded(POOL_SEED)).to(device)
    test = probe.sample(budget.test, seeded(TEST_SEED)).to(device)
    ensemble = SeedEnsemble(lambda: make_model(probe, variant, shape), seeds).to(device)
    optimizer = torch.optim.AdamW(ensemble.decay_groups(budget.weight_decay), lr=budget.lr, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, budget.lr_factor)
    # each seed draws its own minibatches, the same whichever seeds run beside it
    pickers = [seeded(zlib.crc32(probe.key.encode()) + seed) for seed in seeds]
    tail = max(1, budget.steps // 20)
    recent = torch.zeros(len(seeds), device=device)
    for step in range(budget.steps):
        index = torch.stack([torch.randint(0, pool_size, (budget.batch,), generator=g) for g in pickers]).to(device)
        loss = per_seed_loss(ensemble(pool.tokens[index]), pool.labels[index])  # (E,)
        optimizer.zero_grad(set_to_none=True)
        loss.sum().backward()
        optimizer.step()
        schedule.step()
        if step >= budget.steps - tail:
            recent += loss.detach()
        if progress is not None and ((step + 1) % 50 == 0 or step == budget.steps - 1):
            progress(step + 1, float(loss.detach().mean()))
    return RowRun(accuracy(ensemble, test), (recent / tail).tolist(), time.time() - started, ensemble)
