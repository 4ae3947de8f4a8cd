"""The documentation's links hold: README.md, BENCHMARKS.md, benchmarks/KERNEL_LOG.md and every docs/*.md.

- Every relative Markdown link (``[text](target)``, images included, code spans and fenced blocks left out) points
  to a file or folder that exists, relative to the page that holds it.
- Every ``#anchor``, in-page or to another ``.md`` file, is the slug of a heading of the target page under GitHub's
  rules: the heading's text lower-cased, every character that is not a letter, digit, '-', '_' or space dropped
  (non-ASCII letters such as φ are kept), each space turned into '-'; a repeated slug gets '-1', '-2', ...
- README.md is a front page: at most 200 lines.
"""
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)((?:(?!\n[ \t]*\n).)+?)\1", re.S)  # may wrap over a line, not over a blank one
# [text](target "title"): the text may hold one level of brackets; the target may be wrapped in <...>.
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s)]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:[^>]*\s)?(?:id|name)=[\"']([^\"']+)[\"']", re.I)


def pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", root / "BENCHMARKS.md", root / "benchmarks" / "KERNEL_LOG.md",
            *sorted((root / "docs").glob("*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    out, fenced = [], None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if match:
            if fenced is None:
                fenced = match.group(1)
            elif match.group(1) == fenced:
                fenced = None
            continue
        if fenced is None:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: the rendered text (code spans and link syntax reduced to their text),
    lower-cased, with every character that is not a letter, digit, '-', '_' or space dropped and spaces turned into
    '-'."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # [text](url) -> text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a page: its headings' slugs (repeats numbered as GitHub does) and explicit HTML anchors."""
    found, seen = set(), {}
    text = path.read_text(encoding="utf-8")
    for _, line in prose_lines(text):
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    found.update(HTML_ANCHOR.findall(text))
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every Markdown link outside code; a link's text may wrap over lines."""
    text = path.read_text(encoding="utf-8")
    prose = dict(prose_lines(text))
    text = "\n".join(prose.get(number, "") for number in range(1, len(text.splitlines()) + 1))  # fences blanked
    text = CODE_SPAN.sub(lambda m: "code" + "\n" * m.group(0).count("\n"), text)  # line numbers kept
    return [(text.count("\n", 0, match.start()) + 1, match.group(1).strip("<>")) for match in LINK.finditer(text)]


def broken_links(path: Path) -> list[str]:
    """Every relative link of `path` whose file does not exist, or whose anchor names no heading of its page."""
    problems = []
    for number, target in links(path):
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http:, https:, mailto:, ...
            continue
        file_part, _, anchor = target.partition("#")
        where = f"{path.name}:{number}: ({target})"
        destination = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not destination.exists():
            problems.append(f"{where} no such file or folder")
            continue
        if anchor and destination.suffix == ".md" and unquote(anchor) not in anchors(destination):
            problems.append(f"{where} no heading with anchor #{anchor} in {destination.name}")
    return problems


@pytest.mark.parametrize("path", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(path):
    assert path.exists()
    assert broken_links(path) == []


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines, at most {README_MAX_LINES}"


def test_the_slug_follows_github():
    assert slug("Safety and resume") == "safety-and-resume"
    assert slug("Multi-GPU (DDP, FSDP)") == "multi-gpu-ddp-fsdp"
    assert slug("`ladder(r)` — the alive set after a dip") == "ladderr--the-alive-set-after-a-dip"
    assert slug("Decoding (`fpa_lightning.generation`)") == "decoding-fpa_lightninggeneration"
    assert slug("1. FPA") == "1-fpa"
    assert slug("Inside the study (H200, 2026-12-02)") == "inside-the-study-h200-2026-12-02"
    assert slug("Why φ ≥ ψ") == "why-φ--ψ"  # non-ASCII letters stay, symbols go
    assert slug("See [the kernel](docs/kernel.md)") == "see-the-kernel"


def test_the_checker_finds_a_broken_link_and_a_broken_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## A section, with punctuation!\n\n## A section\n",
                                       encoding="utf-8")
    (tmp_path / "sub").mkdir()
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[fine](other.md) [fine anchor](other.md#a-section-with-punctuation) [repeat](other.md#a-section)\n"
        "[in page](#page) [folder](sub) [web](https://example.com/missing.md#nowhere) ![image](sub/)\n"
        "[missing file](nowhere.md)\n"
        "[missing anchor](other.md#no-such-section)\n"
        "[missing in-page anchor](#nothing)\n"
        "`[not a link](in-a-code-span.md)` and `a span wrapped\nover a line [not a link](wrapped-span.md)`\n"
        "[a link wrapped\nover a line](wrapped.md)\n"
        "```\n[not a link](in-a-fence.md)\n```\n",
        encoding="utf-8")
    assert broken_links(page) == [
        "page.md:5: (nowhere.md) no such file or folder",
        "page.md:6: (other.md#no-such-section) no heading with anchor #no-such-section in other.md",
        "page.md:7: (#nothing) no heading with anchor #nothing in page.md",
        "page.md:10: (wrapped.md) no such file or folder",
    ]


def test_repeated_headings_are_numbered(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Notes\n\n## Notes\n\n```\n# Notes\n```\n\n### Notes\n", encoding="utf-8")
    assert anchors(page) == {"notes", "notes-1", "notes-2"}
