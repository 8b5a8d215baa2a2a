"""Docstrings that cite the docs point at files and sections that exist, and docs/ALGORITHMS.md's
own table of contents, test files and test names are current.

A citation is `docs/NAME.md`, optionally followed by `, "Section"` (a heading with that text) or
`#anchor` (the GitHub anchor of a heading), e.g. `(docs/ALGORITHMS.md, "SPO")`.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src" / "softrl"
ALGORITHMS_DOC = ROOT / "docs" / "ALGORITHMS.md"

CITATION = re.compile(r'docs/([\w./-]+?\.md)(?:#([\w-]+)|,\s*"([^"\n]+)")?')


def _sources() -> list[Path]:
    files = sorted(SOURCE.rglob("*.py"))
    assert files, f"no Python files under {SOURCE}"
    return files


def _headings(markdown: Path) -> list[str]:
    """Heading texts (`#` .. `######`) outside fenced code blocks."""
    out, fenced = [], False
    for line in markdown.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        match = None if fenced else re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            out.append(match.group(1).strip())
    return out


def _plain(text: str) -> str:
    return text.replace("`", "").strip()


def _anchors(headings: list[str]) -> set[str]:
    """GitHub's anchors: lower case, punctuation dropped, spaces to hyphens, -1, -2 on repeats."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in headings:
        slug = re.sub(r"[^\w\- ]", "", _plain(heading).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _citations() -> list[tuple[str, str, str | None, str | None]]:
    """(where, doc name, anchor, section) of every `docs/*.md` citation in the package's sources."""
    found = []
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        for m in CITATION.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append((f"{path.relative_to(ROOT)}:{line}", m.group(1), m.group(2), m.group(3)))
    return found


def test_docs_citations_in_sources_resolve():
    citations = _citations()
    assert any(doc == "ALGORITHMS.md" for _, doc, _, _ in citations), "expected docstrings citing docs/ALGORITHMS.md"
    problems = []
    for where, doc, anchor, section in citations:
        target = ROOT / "docs" / doc
        if not target.is_file():
            problems.append(f"{where}: cites docs/{doc}, which does not exist")
            continue
        headings = _headings(target)
        if section is not None and _plain(section) not in {_plain(h) for h in headings}:
            problems.append(f"{where}: cites docs/{doc}, {section!r}, but no heading of docs/{doc} has that text")
        if anchor is not None and anchor not in _anchors(headings):
            problems.append(f"{where}: cites docs/{doc}#{anchor}, but no heading of docs/{doc} has that anchor")
    assert not problems, "\n".join(problems)


# Sources must cite the docs by their path in the repository (`docs/ALGORITHMS.md`), not a bare
# `ALGORITHMS.md` / `DESIGN.md` (the math contract and design notes outside the repository).
# NOTE: the DESIGN.md citations are being moved to docs/ by another change; until that lands the
# DESIGN.md case of this test is expected to fail.
@pytest.mark.parametrize("name", ["ALGORITHMS.md", "DESIGN.md"])
def test_no_bare_doc_citations_in_sources(name):
    bare = re.compile(r"(?<!docs/)\b" + re.escape(name))
    problems = []
    for path in _sources():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if bare.search(line):
                problems.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not problems, f"cite docs/{name}, not a bare {name}:\n" + "\n".join(problems)


def test_algorithms_doc_contents_links_resolve():
    text = ALGORITHMS_DOC.read_text(encoding="utf-8")
    anchors = _anchors(_headings(ALGORITHMS_DOC))
    links = re.findall(r"\]\(#([^)\s]+)\)", text)
    assert len(links) >= 10, "docs/ALGORITHMS.md should open with a table of contents"
    missing = sorted({link for link in links if link not in anchors})
    assert not missing, f"links to no heading in docs/ALGORITHMS.md: {missing}"


def test_algorithms_doc_names_existing_tests():
    """Every test file and test function the guide names exists (so it follows renames)."""
    text = ALGORITHMS_DOC.read_text(encoding="utf-8")
    files = set(re.findall(r"tests/(test_\w+\.py)", text))
    assert files, "docs/ALGORITHMS.md names no test files"
    missing_files = sorted(f for f in files if not (ROOT / "tests" / f).is_file())
    assert not missing_files, f"docs/ALGORITHMS.md names test files that do not exist: {missing_files}"
    defined = set()
    for path in (ROOT / "tests").glob("test_*.py"):
        defined |= set(re.findall(r"^\s*(?:async\s+)?def (test_\w+)", path.read_text(encoding="utf-8"), re.M))
    named = set(re.findall(r"`(test_\w+)(?:\[[^\]]*\])?`", text))
    assert len(named) >= 20, "docs/ALGORITHMS.md should say where each objective is tested"
    missing = sorted(named - defined)
    assert not missing, f"docs/ALGORITHMS.md names tests that do not exist: {missing}"
