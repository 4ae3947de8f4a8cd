"""What every probe shares: the batch record, the probe contract, and sampling helpers.

A probe is a seeded generator of token sequences with labels at some positions (``docs/probes.md`` defines each
one). Labels are class indices; positions that are not scored hold ``IGNORE``. Every sequence starts with BOS
(token 0). Each probe also has ``reference_labels``: the same labels computed from the tokens alone by a plain
loop over its definition, which the tests compare with the vectorised generator.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import random
from collections.abc import Callable

import torch

IGNORE = -1
"""Label of a position that is not scored."""
BOS = 0
"""Token 0 starts every sequence (an always-present key: a natural place for attention to rest)."""


@dataclass(frozen=True)
class ProbeBatch:
    tokens: torch.Tensor
    """(N, T) int64 token ids, BOS first."""
    labels: torch.Tensor
    """(N, T) int64 class per scored position, ``IGNORE`` elsewhere."""

    def to(self, device) -> ProbeBatch:
        return ProbeBatch(self.tokens.to(device), self.labels.to(device))


@dataclass(frozen=True)
class Probe:
    """Base of every probe. Subclasses are frozen dataclasses whose fields are the probe's parameters."""

    name = "probe"
    family = "probe"
    summary = ""
    reads_token = False
    """Whether the readout also sees the current token's embedding (only where the answer needs it)."""

    # --- what a subclass provides ----------------------------------------------------------------------------
    def vocab(self) -> list[str]:
        """Token names, index = token id ("<bos>" first)."""
        raise NotImplementedError

    def classes(self) -> list[str]:
        """Class names, index = label."""
        raise NotImplementedError

    def sample(self, n: int, gen: torch.Generator) -> ProbeBatch:
        """n sequences drawn with `gen` (CPU generator), vectorised."""
        raise NotImplementedError

    def reference_labels(self, tokens: list[int]) -> list[int]:
        """The labels of one sequence from its tokens alone: a plain loop over the definition (for tests)."""
        raise NotImplementedError

    def label_mask(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """(N, T) tokens -> (N, T) bool: the label-determining part of each sequence, the positions whose tokens can
        change its label (for ``ladder``: the dip and the surviving pushes; the dead pushes' colours cannot). Two
        sequences with the same tokens at these positions (and at no others) have the same label. ``None`` (the
        default): not defined for this probe, whose labels depend on the whole sequence as far as we define it
        (``train.split_keys``: the held-out split "label" needs it)."""
        return None

    # --- shared -----------------------------------------------------------------------------------------------
    @property
    def params(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def key(self) -> str:
        """A stable id: name and parameters, e.g. ``ladder(r=10)``."""
        return f"{self.name}({', '.join(f'{k}={v}' for k, v in self.params.items())})" if self.params else self.name

    @property
    def vocab_size(self) -> int:
        return len(self.vocab())

    @property
    def n_classes(self) -> int:
        return len(self.classes())

    def token_ids(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.vocab())}


# --- sampling helpers (all on CPU with an explicit generator) ---------------------------------------------------
def uniform_int(low: torch.Tensor | int, high: torch.Tensor | int, n: int, gen: torch.Generator) -> torch.Tensor:
    """n integers, each uniform in [low, high] inclusive (bounds may be per-sample tensors)."""
    low, high = torch.as_tensor(low), torch.as_tensor(high)
    u = torch.rand(n, generator=gen)
    return (low + (u * (high - low + 1)).floor().long()).clamp(max=high)


def random_permutations(n: int, size: int, gen: torch.Generator) -> torch.Tensor:
    """(n, size): a random permutation of 0..size-1 per row."""
    return torch.rand(n, size, generator=gen).argsort(dim=1)


def pick_where(mask: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """(n,) the index of one True entry per row of mask (n, m), uniformly; every row needs one."""
    if not bool(mask.any(dim=1).all()):
        raise ValueError("pick_where: a row has no candidate")
    scores = torch.rand(mask.shape, generator=gen).masked_fill(~mask, -1.0)
    return scores.argmax(dim=1)


def suffix_min_after(values: torch.Tensor) -> torch.Tensor:
    """(N, T) -> (N, T): entry s = min(values[:, s+1:]) (+inf for the last position)."""
    shifted = torch.cat([values[:, 1:], torch.full_like(values[:, :1], torch.iinfo(values.dtype).max)], dim=1)
    return shifted.flip(1).cummin(dim=1).values.flip(1)


def scored_at_end(tokens: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    """Labels for a probe scored only at the last position: (N, T) IGNORE except answer (N,) at the end."""
    labels = torch.full_like(tokens, IGNORE)
    labels[:, -1] = answer
    return labels


def python_rng(gen: torch.Generator) -> random.Random:
    """A ``random.Random`` seeded from `gen`, for generators written as a plain loop per sequence."""
    return random.Random(int(torch.randint(0, 2**62, (1,), generator=gen)))


def stack_sequences(rows: list[tuple[list[int], list[int]]]) -> ProbeBatch:
    """(tokens, labels) pairs of equal length -> a batch."""
    return ProbeBatch(torch.tensor([t for t, _ in rows]), torch.tensor([y for _, y in rows]))


def sample_each(n: int, gen: torch.Generator, one: Callable[[random.Random], tuple[list[int], list[int]] | None],
                balance: int | None = None, max_tries: int = 1000) -> ProbeBatch:
    """n sequences from `one(rng)`, which returns (tokens, labels) or None to reject a draw. With `balance` = K,
    each sequence first picks a class uniformly and draws until its last label is that class (balanced classes)."""
    rng, rows = python_rng(gen), []
    for _ in range(n):
        target = rng.randrange(balance) if balance else None
        for _ in range(max_tries):
            row = one(rng)
            if row is not None and (target is None or row[1][-1] == target):
                rows.append(row)
                break
        else:
            raise RuntimeError(f"the generator found no acceptable sequence in {max_tries} draws")
    return stack_sequences(rows)
