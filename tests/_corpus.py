"""A small corpus in the layout datamodules.build_corpus writes, for tests that train the study's configs."""
from __future__ import annotations

import json
import pathlib

import zstandard

from datamodules.corpus import kjv_books


def write_slimpajama_layout(root: pathlib.Path) -> pathlib.Path:
    """KJV chapters as documents in <root>/slimpajama/<split>/chunk1/part-00000.jsonl.zst; returns that folder.
    Chapters are short, so packed rows hold several documents (the boundary statistics need document boundaries)."""
    folder_root = root / "slimpajama"
    chapters = [(f"{name} {i}", text) for name, book in kjv_books()[:3] for i, text in enumerate(book.split("\n\n"))]
    for split, chosen in (("train", chapters[:60]), ("validation", chapters[60:90]), ("test", chapters[90:100])):
        folder = folder_root / split / "chunk1"
        folder.mkdir(parents=True)
        lines = "".join(json.dumps({"text": text, "meta": {"title": name}}) + "\n" for name, text in chosen)
        (folder / "part-00000.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))
    return folder_root
