"""The offline Mistral conversion must give sentencepiece's ids on every string and round-trip exactly."""

import pathlib
import random
import sysconfig

import pytest

from datamodules import BOS_ID, EOS_ID, VOCAB_SIZE, mistral_tokenizer
from datamodules.corpus import kjv_books
from datamodules.packing import DocumentEncoder, split_text
from datamodules.sources import HubUnavailableError


def varied_strings(n_random: int = 1100) -> list[str]:
    """Hand-picked edge cases plus random mixes of prose, code, whitespace, digits, CJK and emoji."""
    fixed = [
        "", " ", "  ", "   ", "\t", "\n", "\r\n", " \t \n ", "a", " a", "a ", "  a  b   c    ",
        "<s>", "</s>", "<unk>", "<s> hello </s>", "text<s>more", "▁", "▁▁x", "12345", "3.14159", "1,000,000",
        "日本語のテキストです。", "中文文本", "한국어", "😀🎉👍🏽", "🏳️‍🌈 flag", "naïve café", "\u200b zero width",
        "def f(x):\n    return x ** 2\n", "if (a && b) { c(); }\t// comment", "\x00\x01 control", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    ]
    rng = random.Random(1234)
    verses = [t for _, t in kjv_books()[:5]]
    prose = " ".join(verses).split(" ")
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    code_lines = (stdlib / "json" / "decoder.py").read_text().splitlines() + (stdlib / "textwrap.py").read_text().splitlines()
    atoms = [
        lambda: " ".join(rng.sample(prose, rng.randint(1, 30))),
        lambda: "\n".join(rng.sample(code_lines, rng.randint(1, 8))),
        lambda: " " * rng.randint(1, 12),
        lambda: "\t" * rng.randint(1, 4),
        lambda: "\n" * rng.randint(1, 3),
        lambda: str(rng.randint(0, 10**12)),
        lambda: "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(rng.randint(1, 10))),
        lambda: "".join(chr(rng.randint(0x1F300, 0x1FAFF)) for _ in range(rng.randint(1, 4))),
        lambda: rng.choice(["<s>", "</s>", "<unk>", "<0x0A>", "▁", "▁▁"]),
        lambda: "".join(chr(rng.randint(0x20, 0x2FFF)) for _ in range(rng.randint(1, 12))),
    ]
    randoms = ["".join(rng.choice(atoms)() for _ in range(rng.randint(1, 6))) for _ in range(n_random)]
    return fixed + randoms


def test_constants(tok):
    assert (BOS_ID, EOS_ID, VOCAB_SIZE) == (1, 2, 32000)
    assert tok.get_vocab_size() == VOCAB_SIZE
    assert [tok.id_to_token(i) for i in (0, 1, 2)] == ["<unk>", "<s>", "</s>"]


def test_ids_equal_sentencepiece_on_1000_plus_strings(tok, sp):
    strings = varied_strings()
    assert len(strings) >= 1000
    ours = [e.ids for e in tok.encode_batch(strings, add_special_tokens=False)]
    theirs = sp.encode(strings)
    mismatches = [(s, a, b) for s, a, b in zip(strings, ours, theirs) if a != b]
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[0]!r}"


def test_decode_roundtrip(tok, sp):
    strings = varied_strings(300)
    # U+2581 "▁" is SentencePiece's own space marker: text containing it cannot round-trip in
    # sentencepiece either (it decodes to " "), so for those we require sentencepiece's decoding.
    plain = [s for s in strings if "▁" not in s]
    bad = [s for s in plain if tok.decode(tok.encode(s).ids) != s]
    assert len(plain) > 250 and not bad, bad[:5]
    marked = [s for s in strings if "▁" in s]
    assert marked and all(tok.decode(tok.encode(s).ids) == sp.decode(sp.encode(s)) for s in marked)


def test_literal_special_text_is_not_special(tok, sp):
    ids = tok.encode("<s>").ids
    assert BOS_ID not in ids and ids == sp.encode("<s>")
    assert tok.encode("").ids == [] == sp.encode("")


def test_split_encoding_equals_whole(tok):
    """Long documents are encoded in pieces; the result must equal encoding the whole text."""
    rng = random.Random(0)
    books = [t for _, t in kjv_books()[:3]]
    texts = [books[0][:150_000], "x" * 30_000, ("word  " * 4000) + "\n\n" + "end", "a b\n" * 5000,
             " ".join(rng.choice(["  ", " ", "\t", "ab", "日本", "😀", "\n", "12"]) for _ in range(20_000))]
    enc = DocumentEncoder(tok, chunk_chars=1000)
    for text, ids in zip(texts, enc.encode(texts)):
        assert len(split_text(text, 1000)) > 1 or text == "x" * 30_000
        assert ids.tolist() == tok.encode(text).ids


def test_cached_second_time(tok, monkeypatch):
    from datamodules import tokenizer as tokenizer_module
    from datamodules.files import cache_dir

    cached = list(cache_dir().glob("mistral-7b-v0.1-tokenizer-*.json"))
    assert len(cached) == 1
    written = cached[0].stat().st_mtime_ns

    def no_conversion(*args, **kwargs):
        raise AssertionError("the cached tokenizer.json was not used: the SentencePiece model was converted again")

    monkeypatch.setattr(tokenizer_module, "convert_sentencepiece_bpe", no_conversion)
    again = mistral_tokenizer()
    assert cached[0].stat().st_mtime_ns == written
    assert again.encode("In the beginning").ids == tok.encode("In the beginning").ids


def test_accepts_tokenizer_json_path(tok, tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text(tok.to_str())
    for source in (str(path), str(tmp_path)):
        assert mistral_tokenizer(source).encode("hello  world").ids == tok.encode("hello  world").ids
    with pytest.raises(FileNotFoundError):
        mistral_tokenizer(str(tmp_path / "missing.json"))


def test_hub_id_fails_fast_offline(monkeypatch):
    """Offline by the environment: the error comes without even probing the network (how long the probe takes when
    it runs is measured by benchmarks/data_latency.py, not asserted here)."""
    from datamodules import sources

    def no_probe(*args, **kwargs):
        raise AssertionError("HF_HUB_OFFLINE is set: the hub must not be probed")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(sources, "_hub_reachable", no_probe)
    with pytest.raises(HubUnavailableError, match="tokenizer.json"):
        mistral_tokenizer("mistralai/Mistral-7B-v0.1")
