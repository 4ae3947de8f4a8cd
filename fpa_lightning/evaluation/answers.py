"""Prompts with a fixed answer (RULER- and BABILong-style tasks): the item, how it is assembled from separately
tokenised pieces, how the model's answer is read, and RULER's string-match metric.

Reading the answer. ``predict`` decodes the model's greedy continuation of the prompt through the KV cache
(``fpa_lightning.generation``: the prompt is prefilled by the parallel forward, then one cached step per token),
as many tokens as the canonical answer has plus ``ANSWER_SLACK``, stopping at EOS; RULER's string match is then
applied to that text, so references named in any order count.

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

from fpa_lightning.generation import generate
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


ANSWER_SLACK = 16  # tokens generated beyond the canonical answer's length (a short preamble, another order)


@dataclass(frozen=True)
class Prediction:
    text: str  # the decoded greedy continuation
    tokens: list[int]


@torch.no_grad()
def predict(decoder: Decoder, item: PromptItem, encoder: PieceEncoder, eos_id: int | None) -> Prediction:
    """The greedy continuation of ``item.prompt`` through the KV cache, len(answer) + ANSWER_SLACK tokens at most,
    ending at EOS. Run it under the task's autocast."""
    prompt = torch.tensor(item.prompt, device=next(decoder.parameters()).device)
    ids = generate(decoder, [prompt], len(item.answer) + ANSWER_SLACK, eos_id=eos_id)[0]
    tokens = [t for t in ids[len(item.prompt):].tolist() if t != eos_id]
    return Prediction(encoder.decode(tokens), tokens)


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
