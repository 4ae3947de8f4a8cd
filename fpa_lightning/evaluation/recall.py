"""Recall of the facts of synthetic retrieval documents, scored teacher-forced (``eval.py --task retrieval_recall``).

The documents are the train mixture's synthetic retrieval documents (``datamodules.retrieval_synth``: prose with facts
that tie a key to a value, each recalled later in the same document by a sentence that names the key again and ends
with the value), built held out by the data (``EvalData.retrieval_documents``). This module turns one document into
model inputs and scores its values:

* the input is ``[BOS] text [EOS]``, the text tokenised whole, as training packs a document (``datamodules.packing``);
* a value's tokens are found from the tokenizer's character offsets: the tokens that spell exactly the value's
  characters before the recall's full stop (the first may also hold the space before it); a value whose tokens
  straddle its edges is an error, never a guess;
* one forward pass scores every value of a document: *exact* when each value token is the argmax given the document
  before it (so greedy decoding after the recall's words would return the value), and the value's summed NLL;
* the no-retrieval baseline is the same document with every fact sentence removed (filler and recalls kept). There
  the value is nowhere before its recall, so its NLL and exact rate measure what the model guesses from the recall
  sentence alone, its prior (14 colours, towns made of 24 x 12 parts, 3-4 digit counts): retrieval is the gap between
  the document's numbers and the baseline's, not the document's numbers alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fpa_lightning.model import Decoder


@dataclass(frozen=True)
class RecallItem:
    """One asked fact of a document: its kind, key and value, its distance (tokens from the fact's first token to the
    recall's end) and its value's tokens [start, end) in the document's input and in the baseline's."""

    kind: str
    key: str
    value: str
    distance: int
    span: tuple[int, int]
    baseline_span: tuple[int, int]


@dataclass(frozen=True)
class RecallDocument:
    input_ids: torch.Tensor  # (T,) [BOS] text [EOS]
    baseline_ids: torch.Tensor  # (T',) the same without its fact sentences
    items: list[RecallItem]


def recall_document(tokenizer, bos_id: int, eos_id: int, text: str, facts) -> RecallDocument:
    """The inputs and items of one document: its ``text`` (pieces joined by single spaces) and its ``facts``
    (``datamodules.retrieval_synth.Fact``: kind, key, value, statement, recall or None for a distractor, distance)."""
    asked = [f for f in facts if f.recall is not None]
    ids, spans = _encode(tokenizer, bos_id, eos_id, text, asked)
    baseline_ids, baseline_spans = _encode(tokenizer, bos_id, eos_id, _without(text, [f.statement for f in facts]),
                                           asked)
    items = [RecallItem(f.kind, f.key, f.value, f.distance, s, b) for f, s, b in zip(asked, spans, baseline_spans)]
    return RecallDocument(ids, baseline_ids, items)


def _encode(tokenizer, bos_id: int, eos_id: int, text: str, asked) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """``[BOS] text [EOS]`` (T,) and the value span of each asked fact in it."""
    encoding = tokenizer.encode(text, add_special_tokens=False)
    spans = []
    for f in asked:
        if not f.recall.endswith(f" {f.value}."):
            raise ValueError(f"the recall {f.recall!r} does not end with its value {f.value!r} and a full stop")
        end = _only(text, f.recall) + len(f.recall) - 1  # the value ends before the full stop
        first, last = value_span(encoding.offsets, text, end - len(f.value), end)
        spans.append((first + 1, last + 1))  # after BOS
    return torch.tensor([bos_id, *encoding.ids, eos_id]), spans


def _only(text: str, piece: str) -> int:
    """Where ``piece`` starts in ``text``; it must occur once (a fact's key and value make its sentences unique)."""
    if text.count(piece) != 1:
        raise ValueError(f"{piece!r} occurs {text.count(piece)} times in its document, not once")
    return text.index(piece)


def _without(text: str, pieces: list[str]) -> str:
    """``text`` without each of ``pieces`` and the single space that joined it to its neighbour."""
    for piece in pieces:
        start = _only(text, piece)
        text = text[:start - 1] + text[start + len(piece):] if start else text[len(piece) + 1:]
    return text


def value_span(offsets: list[tuple[int, int]], text: str, start: int, end: int) -> tuple[int, int]:
    """The tokens [i, j) of an encoding (each token's character ``offsets`` in ``text``) that spell exactly
    ``text[start:end]``; the first may also hold whitespace before it (SentencePiece's "▁"). ValueError when a token
    straddles either edge (the value cannot be scored on its own)."""
    inside = [k for k, (a, b) in enumerate(offsets) if a < end and b > start]
    if not inside or offsets[inside[-1]][1] != end or text[offsets[inside[0]][0]:start].strip():
        context = text[max(0, start - 40):end + 1]
        raise ValueError(f"the value {text[start:end]!r} is not a whole number of tokens in {context!r}: a token "
                         "straddles its edges in this tokenizer")
    return inside[0], inside[-1] + 1


@torch.no_grad()
def score_values(decoder: Decoder, ids: torch.Tensor, spans: list[tuple[int, int]],
                 device: torch.device) -> list[tuple[bool, float]]:
    """Per value span [a, b) of ``ids`` (T,): (every value token is the argmax given the tokens before it, the value's
    summed NLL in nats), from one forward pass; only the positions predicting value tokens are projected onto the
    vocabulary."""
    ids = ids.to(device)
    hidden = decoder.features(ids[None])[0]  # (T, C)
    rows = torch.cat([torch.arange(a - 1, b - 1) for a, b in spans]).to(device)  # (n,): each predicts the next token
    logits = decoder.lm_head(hidden[rows]).float()  # (n, V)
    targets = ids[rows + 1]  # (n,)
    nll = F.cross_entropy(logits, targets, reduction="none").tolist()
    hit = (logits.argmax(-1) == targets).tolist()
    out, k = [], 0
    for a, b in spans:
        out.append((all(hit[k:k + b - a]), float(sum(nll[k:k + b - a]))))
        k += b - a
    return out
