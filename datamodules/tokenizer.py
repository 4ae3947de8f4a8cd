"""The Mistral-7B v0.1 tokenizer (32k SentencePiece BPE) as a fast ``tokenizers.Tokenizer``, built offline.

mistral-common ships the SentencePiece model ``data/tokenizer.model.v1``. We convert it ourselves rather
than through transformers' slow->fast converter, which disagrees with sentencepiece on whitespace runs
and on a literal ``"<s>"`` in text. What makes the conversion exact (checked against sentencepiece in
``tests/datamodules/test_tokenizer.py``):

* merges are ranked by the *score of the merged piece* (sentencepiece's BPE merges highest score
  first), not by id: the whitespace pieces ``"▁▁"``, ``"▁▁▁"``... have score -1e9 and must merge last;
* ``<s>``/``</s>`` stay ordinary vocabulary entries, not added special tokens, so text that literally
  contains ``"<s>"`` is split into characters as sentencepiece does;
* normaliser: prepend ``"▁"`` (add_dummy_prefix) and replace ``" "`` by ``"▁"``; no pre-tokeniser;
  byte fallback for characters outside the vocabulary; decoder undoes it all.

No BOS/EOS is added by the tokenizer (sentencepiece's ``encode`` adds none either); the data pipeline
adds them explicitly (see ``datamodules.packing``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import pathlib

from tokenizers import Tokenizer, decoders, models, normalizers

from .files import atomic_write_text, cache_dir, installed_package_file

log = logging.getLogger(__name__)

UNK_ID = 0
BOS_ID = 1
EOS_ID = 2
VOCAB_SIZE = 32000
_CACHE_NAME = "mistral-7b-v0.1-tokenizer-{digest}.json"


def sentencepiece_model_path() -> pathlib.Path:
    """Path of the Mistral-7B v0.1 SentencePiece model inside the installed mistral-common package."""
    return installed_package_file("mistral_common", "data/tokenizer.model.v1", "mistral-common")


def convert_sentencepiece_bpe(model_file: str | os.PathLike) -> Tokenizer:
    """Convert a SentencePiece BPE model (byte_fallback, add_dummy_prefix) into an equivalent Tokenizer."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    scores = [sp.get_score(i) for i in range(len(pieces))]
    model = models.BPE(
        vocab=vocab,
        merges=_merges_by_score(pieces, vocab, scores, sp),
        unk_token=pieces[sp.unk_id()],
        byte_fallback=True,
        fuse_unk=True,
        dropout=None,
    )
    tok = Tokenizer(model)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return tok


def _merges_by_score(pieces, vocab, scores, sp) -> list[tuple[str, str]]:
    """All (left, right) pairs whose concatenation is a normal piece, best-scored result first.

    sentencepiece's BPE repeatedly merges the adjacent pair whose *result* has the highest score, so
    the rank of a merge is the score of the piece it produces (ties: lower id first, then the split).
    Control, unknown and byte pieces never take part in merges.
    """
    mergeable = {
        p for i, p in enumerate(pieces) if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i))
    }
    ranked = []
    for piece in mergeable:
        pid = vocab[piece]
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in mergeable and right in mergeable:
                ranked.append((-scores[pid], pid, vocab[left], (left, right)))
    ranked.sort()
    return [pair for *_, pair in ranked]


def _offline_mistral() -> Tokenizer:
    """Convert once, then load the cached JSON (keyed by the model file's hash)."""
    model_path = sentencepiece_model_path()
    digest = hashlib.sha256(model_path.read_bytes()).hexdigest()[:12]
    cached = cache_dir() / _CACHE_NAME.format(digest=digest)
    if cached.is_file():
        return Tokenizer.from_file(str(cached))
    log.info("converting %s to %s (one time)", model_path, cached)
    tok = convert_sentencepiece_bpe(model_path)
    atomic_write_text(cached, tok.to_str())
    return tok


def mistral_tokenizer(source: str | None = None) -> Tokenizer:
    """The tokenizer used by the data pipeline.

    Args:
        source: ``None`` (default) = Mistral-7B v0.1 converted offline from mistral-common's
            SentencePiece model and cached under ``$FPA_CACHE_DIR`` or ``~/.cache/fpa_lightning``;
            a path to a ``tokenizer.json`` (or a folder containing one); a path to a SentencePiece
            ``.model`` file (converted on the fly); or a hub id such as
            ``"mistralai/Mistral-7B-v0.1"`` (needs a network; fails fast without one).
    """
    if source is None or source in ("mistral", "offline"):
        return _offline_mistral()
    path = pathlib.Path(os.path.expanduser(source))
    if path.is_dir() and (path / "tokenizer.json").is_file():
        path = path / "tokenizer.json"
    if path.is_file():
        if path.suffix == ".model" or path.name.startswith("tokenizer.model"):
            return convert_sentencepiece_bpe(path)
        try:
            return Tokenizer.from_file(str(path))
        except Exception as error:  # tokenizers raises a bare Exception ("expected ident at line 1 column 2")
            raise ValueError(
                f"tokenizer file {str(path)!r} is not a valid tokenizer.json ({error}); pass a tokenizer.json written "
                f"by the tokenizers library (Tokenizer.save), a SentencePiece .model file, or tokenizer=None for the "
                f"offline Mistral tokenizer") from None
    if path.exists() or source.startswith((".", "/", "~")) or source.endswith(".json"):
        raise FileNotFoundError(f"tokenizer file not found: {source!r} (expected a tokenizer.json or .model file)")
    from .sources import require_hub

    require_hub(source, what="tokenizer", local_hint="tokenizer=None (offline Mistral) or a path to tokenizer.json")
    return Tokenizer.from_pretrained(source)
