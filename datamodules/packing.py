"""Tokenising documents and packing them into fixed-length rows.

BOS/EOS policy
--------------
Every document becomes ``[BOS] + tokens + [EOS]`` (Mistral/Llama pre-training convention: BOS opens
each document, EOS closes it). Documents are concatenated into one stream per shard, and row ``r`` of
the stream is ``stream[r*T : r*T + T + 1]``: rows overlap by one token, so ``input_ids = row[:-1]``
covers every stream token exactly once and in order, and ``labels = row[1:]`` is always the true next
token (also across row boundaries). A document's BOS and EOS belong to that document's segment; the
label of an EOS position is the next document's BOS. Documents are never padded or dropped: short
ones share a row, long ones span rows. Only the final, incomplete row of a finite split (validation,
test) is left out, and its length is counted as ``tail_tokens`` in the stats.

``segment_ids`` numbers the documents within a row: 0 for the document at position 0 (possibly begun
in an earlier row), +1 at every BOS after it.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Sequence

import numpy as np
from tokenizers import Tokenizer, normalizers

from .tokenizer import BOS_ID, EOS_ID

# Long texts are cut into pieces of about this many characters before encode_batch: a single 4 MB
# document encodes ~3x slower than the same text in 4 KB pieces, and pieces parallelise.
CHUNK_CHARS = 8192


class DocumentEncoder:
    """``encode(texts) -> [np.int32 array of ids]`` equal to encoding each text whole (no BOS/EOS).

    For the Mistral conversion (normaliser = prepend "▁" + replace " " by "▁", no pre-tokeniser) long
    texts are split at points no token can straddle: after a newline (no Mistral piece contains "\\n")
    or before a space that follows a non-space (the only pieces containing "▁" past their first
    character are runs of "▁"). Pieces after the first are encoded without the dummy prefix, so the
    concatenation equals the whole-text encoding (tested). Other tokenizers are encoded whole.
    """

    def __init__(self, tokenizer: Tokenizer, chunk_chars: int = CHUNK_CHARS):
        self.tokenizer = tokenizer
        self.chunk_chars = chunk_chars
        self.continuation = _without_dummy_prefix(tokenizer)

    def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
        if self.continuation is None:
            return [np.asarray(e.ids, dtype=np.int32) for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]
        firsts, rests, owner = [], [], []
        for i, text in enumerate(texts):
            pieces = split_text(text, self.chunk_chars)
            firsts.append(pieces[0])
            rests.extend(pieces[1:])
            owner.extend([i] * (len(pieces) - 1))
        first_ids = self.tokenizer.encode_batch(firsts, add_special_tokens=False)
        rest_ids = self.continuation.encode_batch(rests, add_special_tokens=False) if rests else []
        parts: list[list[list[int]]] = [[e.ids] for e in first_ids]
        for i, e in zip(owner, rest_ids):
            parts[i].append(e.ids)
        return [np.fromiter((t for p in ps for t in p), dtype=np.int32) if len(ps) > 1 else np.asarray(ps[0], dtype=np.int32) for ps in parts]


def _without_dummy_prefix(tokenizer: Tokenizer) -> Tokenizer | None:
    """A copy of the Mistral-style tokenizer without its "▁" prefix, or None for other tokenizers."""
    spec = json.loads(tokenizer.to_str())
    norm = spec.get("normalizer") or {}
    steps = norm.get("normalizers", []) if norm.get("type") == "Sequence" else []
    is_mistral = (
        spec.get("pre_tokenizer") is None
        and len(steps) == 2
        and steps[0] == {"type": "Prepend", "prepend": "▁"}
        and steps[1].get("type") == "Replace"
        and steps[1].get("content") == "▁"
        and steps[1].get("pattern", {}).get("String") == " "
    )
    if not is_mistral:
        return None
    clone = Tokenizer.from_str(tokenizer.to_str())
    clone.normalizer = normalizers.Replace(" ", "▁")
    return clone


def split_text(text: str, chunk_chars: int) -> list[str]:
    """Cut ``text`` into pieces of about ``chunk_chars`` at token-safe points (see DocumentEncoder)."""
    if len(text) <= chunk_chars:
        return [text]
    pieces, start, n = [], 0, len(text)
    while n - start > chunk_chars:
        cut = _safe_cut(text, start + chunk_chars // 2, start + chunk_chars)
        if cut is None:  # no safe point in the window: take the next one after it, or stop
            cut = _safe_cut_forward(text, start + chunk_chars)
            if cut is None:
                break
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


def _is_safe(text: str, i: int) -> bool:
    return text[i - 1] == "\n" or (text[i] == " " and text[i - 1] != " ")


def _safe_cut(text: str, lo: int, hi: int) -> int | None:
    """The last safe cut in ``(lo, hi]``, preferring line ends."""
    nl = text.rfind("\n", lo, hi)
    if nl != -1:
        return nl + 1
    i = text.rfind(" ", lo, hi)
    while i > lo:
        if _is_safe(text, i):
            return i
        i = text.rfind(" ", lo, i)
    return None


def _safe_cut_forward(text: str, lo: int) -> int | None:
    for i in range(lo, len(text)):
        if _is_safe(text, i):
            return i
    return None


def with_bos_eos(ids: np.ndarray) -> np.ndarray:
    """``[BOS] + ids + [EOS]`` as int64 (the dtype of the batch tensors)."""
    out = np.empty(len(ids) + 2, dtype=np.int64)
    out[0], out[-1] = BOS_ID, EOS_ID
    out[1:-1] = ids
    return out


class Packer:
    """Packs ``[BOS] doc [EOS]`` token arrays into rows of ``seq_len + 1`` tokens (stride ``seq_len``).

    Knows, for resuming, where the next row starts: ``cursor() -> (doc_index, token_offset)``.
    """

    def __init__(self, seq_len: int):
        self.T = seq_len
        # each piece: [doc_index, offset of piece[0] within its document, tokens (int64)]
        self.pieces: deque[list] = deque()
        self.size = 0
        self.next_doc = 0

    def add(self, doc_index: int, tokens: np.ndarray, offset: int = 0) -> None:
        """Append document ``doc_index`` (BOS/EOS included), starting at token ``offset``."""
        if offset < len(tokens):
            self.pieces.append([doc_index, offset, tokens[offset:]])
            self.size += len(tokens) - offset
        self.next_doc = doc_index + 1

    def cursor(self) -> tuple[int, int]:
        """(document, token offset) at which the next row starts."""
        if self.pieces:
            return self.pieces[0][0], self.pieces[0][1]
        return self.next_doc, 0

    def ready(self) -> bool:
        return self.size >= self.T + 1

    def pop_row(self) -> tuple[np.ndarray, np.ndarray]:
        """Next row: tokens (T+1,) and segment ids (T,) of its input positions; advances by T."""
        tokens = np.empty(self.T + 1, dtype=np.int64)
        starts = np.zeros(self.T + 1, dtype=np.int64)  # 1 where a document begins
        filled = 0
        for _doc, offset, piece in self.pieces:
            take = min(len(piece), self.T + 1 - filled)
            tokens[filled : filled + take] = piece[:take]
            starts[filled] = offset == 0
            filled += take
            if filled == self.T + 1:
                break
        self._consume(self.T)
        starts[0] = 0  # the row's first document is segment 0 whether or not it begins here
        segments = np.cumsum(starts[: self.T])
        return tokens, segments

    def _consume(self, n: int) -> None:
        self.size -= n
        while n:
            piece = self.pieces[0]
            if len(piece[2]) <= n:
                n -= len(piece[2])
                self.pieces.popleft()
            else:
                piece[1] += n
                piece[2] = piece[2][n:]
                n = 0
