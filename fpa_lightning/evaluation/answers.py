"""Prompts with a fixed answer (RULER- and BABILong-style tasks): the item, how it is assembled from separately
tokenised pieces, how the model's answer is read, and RULER's string-match metric.

Reading the answer. ``predict`` returns the start of the model's greedy continuation of the prompt. Until a
KV-cache generator is available it comes from one teacher-forced pass: at each answer position the argmax given
the prompt and the canonical answer's earlier tokens is what greedy decoding emits as long as every earlier
argmax equalled the canonical token. So the greedy output is known exactly up to and including the first token
that differs from the canonical answer, and ``predict`` returns that prefix. Scoring it with the string match
gives a lower bound on the score of a full greedy generation (text the model would write after the divergence
is not seen), exact whenever the canonical answer is reproduced. Replacing ``predict`` by real generation
changes nothing else.

Assembly. Pieces are tokenised separately, each as it reads after a space (see ``evaluation.passkey``: with the
Mistral tokenizer this equals tokenising the text joined by spaces), and a haystack is filled with whole units
(sentences, list entries) up to the token budget, so that an item never exceeds its nominal length.
"""
from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from fpa_lightning.model import Decoder


@dataclass
class PromptItem:
    """One prompt and its canonical answer, in tokens; ``references`` are the strings RULER's metric looks for."""

    task: str
    length: int  # nominal length: prompt + answer fit in it
    prompt: list[int]
    answer: list[int]
    references: tuple[str, ...]
    meta: dict = field(default_factory=dict)  # what the generator chose (depths, keys), for the JSON

    @property
    def tokens(self) -> int:
        return len(self.prompt) + len(self.answer)

    def input_ids(self) -> torch.Tensor:
        """(L,) the prompt followed by all answer tokens but the last (teacher forcing)."""
        return torch.tensor(self.prompt + self.answer[:-1], dtype=torch.long)


class PieceEncoder:
    """Token ids of text pieces, each as it reads after a space (the tokenizer's dummy prefix plays the space)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def many(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))


def take_units(units: Iterable[list[int]], budget: int) -> list[list[int]]:
    """Units in order while their total stays within ``budget`` tokens (stops at the first that does not fit)."""
    out, used = [], 0
    for unit in units:
        if used + len(unit) > budget:
            break
        out.append(unit)
        used += len(unit)
    return out


def insert_at_depths(units: list[list[int]], inserts: list[list[int]],
                     depths: list[float]) -> tuple[list[int], list[int]]:
    """The units with each insert placed before unit ``round(depth · len(units))``; inserts keep their order
    (depths are sorted). Returns (tokens, the offset of each insert in them)."""
    if len(inserts) != len(depths) or any(not 0.0 <= d <= 1.0 for d in depths):
        raise ValueError(f"need one depth in [0, 1] per insert, got {depths} for {len(inserts)} inserts")
    slots = [round(d * len(units)) for d in sorted(depths)]
    tokens, offsets, k = [], [], 0
    for i in range(len(units) + 1):
        while k < len(inserts) and slots[k] == i:
            offsets.append(len(tokens))
            tokens.extend(inserts[k])
            k += 1
        if i < len(units):
            tokens.extend(units[i])
    return tokens, offsets


@dataclass(frozen=True)
class Prediction:
    text: str  # the decoded start of the greedy continuation
    tokens: list[int]
    reproduced: bool  # the canonical answer itself (then the string match is exact)


@torch.no_grad()
def predict(decoder: Decoder, item: PromptItem, encoder: PieceEncoder, device: torch.device) -> Prediction:
    """The start of the greedy continuation of ``item.prompt`` (see the module doc), from one forward pass; only
    the answer positions are projected onto the vocabulary. Run it under the task's autocast."""
    ids = item.input_ids().to(device)[None]  # (1, L)
    hidden = decoder.features(ids)[:, len(item.prompt) - 1:]  # (1, m, C): the positions predicting the answer
    greedy = decoder.lm_head(hidden)[0].float().argmax(-1).tolist()  # (m,)
    tokens = []
    for guess, expected in zip(greedy, item.answer):
        tokens.append(guess)
        if guess != expected:
            break
    return Prediction(encoder.decode(tokens), tokens, tokens == item.answer)


def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """RULER's metric for its synthetic tasks: the fraction of references found in the prediction (case-insensitive
    substring)."""
    text = prediction.lower()
    return sum(ref.lower() in text for ref in references) / len(references)



def split_sentences(text: str) -> list[str]:
    """Sentence-like units of book text: whitespace normalised, split after . ! ? ; or : followed by a space."""
    return [s for s in re.split(r"(?<=[.!?;:])\s+", " ".join(text.split())) if s]


class BookHaystack:
    """Sentences of local book text, tokenised once; a haystack is a run of them from a random start, wrapping
    around at the end of the text."""

    def __init__(self, texts: Sequence[str], encoder: PieceEncoder):
        sentences = [s for text in texts for s in split_sentences(text)]
        if not sentences:
            raise ValueError("the book text for the haystack is empty")
        self.units = encoder.many(sentences)
        self.tokens = sum(len(u) for u in self.units)

    def units_from(self, start: int) -> Iterable[list[int]]:
        """Sentences from ``start`` on, cycling (a haystack longer than the text repeats it)."""
        return (self.units[(start + i) % len(self.units)] for i in itertools.count())

    def take(self, budget: int, rng) -> list[list[int]]:
        return take_units(self.units_from(rng.randrange(len(self.units))), budget)
