"""Helpers for the data-layer tests: file writers in the real formats and synthetic documents."""

import gzip
import json
import pathlib


def write_jsonl(path: pathlib.Path, records, compress: str | None = None) -> pathlib.Path:
    """Write records (dicts, or raw bytes lines) as jsonl / jsonl.gz / jsonl.zst."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = b"".join(r if isinstance(r, bytes) else (json.dumps(r) + "\n").encode() for r in records)
    if compress == "gz":
        data = gzip.compress(data)
    elif compress == "zst":
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


def write_parquet(path: pathlib.Path, texts, column: str = "text") -> pathlib.Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({column: texts, "short_book_title": [f"book {i}" for i in range(len(texts))]}), path)
    return path


def make_docs(n: int, seed: int = 0, min_words: int = 5, max_words: int = 400) -> list[str]:
    """``n`` distinct documents of varied length (``doc<i>`` marks each)."""
    import random

    rng = random.Random(seed)
    words = "the of and to in that he shall unto for his a lord they be is him not them it with all thou".split()
    return [f"doc{i} " + " ".join(rng.choice(words) for _ in range(rng.randint(min_words, max_words))) for i in range(n)]
