"""The documentation holds together: the README fits on a screen (at most 300 lines), every
relative link and image in README.md, docs/*.md, validators/README.md and tests/README.md points at a file that
exists, every #anchor names a heading of its page (GitHub's slugs), and docs/README.md lists
every page of docs/ and nothing else. Standard library only; no build needed."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README_MAX_LINES = 300


def pages():
    """The markdown files whose links are checked."""
    return [ROOT / "README.md", ROOT / "validators" / "README.md", ROOT / "tests" / "README.md",
            *sorted(DOCS.glob("*.md"))]


def ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text):
    """The lines outside fenced code blocks, with inline code spans blanked."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else re.sub(r"(`+)(?:(?!\1).)+?\1", "", line))
    return out


INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s<>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
IMG_TAG = re.compile(r"<img\s[^>]*src=\"([^\"]+)\"", re.I)


def links(path):
    """(line number, target) of every link and image in a markdown file, code left out."""
    found = []
    for n, line in enumerate(prose_lines(path.read_text(encoding="utf-8")), 1):
        for rx in (INLINE_LINK, REF_DEF, IMG_TAG):
            found += [(n, m.group(1)) for m in rx.finditer(line)]
    return found


def is_external(target):
    return re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) is not None  # http:, https:, mailto:


def slug(heading):
    """GitHub's anchor for a heading: markup dropped, lowercase, punctuation other than '-' and
    '_' dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = text.strip().lower()
    return "".join(c for c in text if c.isalnum() or c in "-_ ").replace(" ", "-")


HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")


def anchors(path):
    """Every heading's anchor in a markdown file (repeats get -1, -2, ... as GitHub does)."""
    seen, out = {}, set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if not m:
            continue
        s = slug(m.group(2))
        k = seen.get(s, 0)
        seen[s] = k + 1
        out.add(s if k == 0 else f"{s}-{k}")
    return out


def test_slugs_follow_github():
    assert slug("The numerics contract, in short") == "the-numerics-contract-in-short"
    assert slug("`[fp8_monitor]`") == "fp8_monitor"
    assert slug("`parallax check determinism` and `parallax check resume`") == \
        "parallax-check-determinism-and-parallax-check-resume"
    assert slug("Context parallelism: ring and Ulysses") == "context-parallelism-ring-and-ulysses"


def test_readme_fits_on_a_screen():
    n = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; at most {README_MAX_LINES}"


@pytest.mark.parametrize("page", pages(), ids=ids(pages()))
def test_relative_links_resolve(page):
    broken = []
    for n, target in links(page):
        if is_external(target):
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        where = f"{page.relative_to(ROOT)}:{n}: {target}"
        if not dest.exists():
            broken.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{where}: no heading '{anchor}' in {dest.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def index_links():
    return {t.partition("#")[0] for _, t in links(DOCS / "README.md") if not is_external(t)}


def test_docs_index_lists_every_page():
    listed = index_links()
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.name != "README.md" and p.name not in listed]
    assert not missing, f"docs/README.md does not list: {', '.join(missing)}"


def test_docs_index_links_only_existing_pages():
    listed = {t for t in index_links() if t.endswith(".md")}
    gone = sorted(t for t in listed if not (DOCS / t).resolve().is_file())
    assert not gone, f"docs/README.md lists pages that do not exist: {', '.join(gone)}"
