"""The documentation for readers (pure checks over the repository's files; issue #43, item 7).

The pages stay within their sizes, name no dated run, agree on one version, and every reference to a
page or a section, in the docs or in a message of the code, leads to a page and heading that exist.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from app import cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *DOCS]
SOURCES = sorted(p for folder in ("app", "topics", "projections", "bench") for p in (ROOT / folder).rglob("*.py"))
KB = 1024

# What a reader-facing page is, not a lab notebook: a run's clock time or a build's commit id.
CLOCK_TIME = re.compile(r"\b\d{1,2}:\d\d(?:-\d{1,2}:\d\d)? UTC\b")
COMMIT_ID = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
NAMED_RUN = re.compile(r"\b(?:last|latest|previous)\b[^.;:]{0,40}\bruns?\b", re.IGNORECASE)

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
DOC_REFERENCE = re.compile(r"\bdocs/[\w.-]+\.md(?:#[\w-]+)?")
FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
RELEASE = re.compile(r"^## (Unreleased — )?(\d+\.\d+\.\d+)\s*$", re.MULTILINE)
PRE_RELEASE = re.compile(r"^(\d+\.\d+\.\d+)(?:\.dev\d+|a\d+|b\d+|rc\d+)$")


def prose(text: str) -> list[str]:
    """The lines of a Markdown text outside its fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a page, a repeated heading numbered as GitHub numbers it."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose(page.read_text(encoding="utf-8")):
        heading = HEADING.match(line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken(target: Path, anchor: str) -> str | None:
    """Why a reference to target#anchor leads nowhere, or None when it leads to a page and heading."""
    if not target.exists():
        return "no such file"
    if anchor and anchor not in anchors(target):
        return f"no heading with the anchor #{anchor}"
    return None


def test_slug_is_githubs() -> None:
    assert slug("Restart to first decision — `bench restart`") == "restart-to-first-decision--bench-restart"
    assert slug("At-least-once and exactly-once") == "at-least-once-and-exactly-once"
    assert slug("Ingest (`app/ingest/`)") == "ingest-appingest"


@pytest.mark.parametrize(("name", "limit_kb"), [("docs/benchmarks.md", 15), ("docs/architecture.md", 20),
                                                ("CHANGELOG.md", 10)])
def test_page_is_within_its_size(name: str, limit_kb: int) -> None:
    size = len((ROOT / name).read_bytes())
    assert size <= limit_kb * KB, f"{name} is {size} bytes, over {limit_kb} KB: say less, or move history out"


@pytest.mark.parametrize("name", ["README.md", "CHANGELOG.md", "docs/benchmarks.md", "docs/architecture.md"])
def test_page_names_no_dated_run(name: str) -> None:
    text = (ROOT / name).read_text(encoding="utf-8")
    assert not CLOCK_TIME.findall(text), f"{name} gives a run's clock time: give the figure, not when it was found"
    assert not COMMIT_ID.findall(text), f"{name} names builds by commit: name the version instead"


def test_readme_names_no_run() -> None:
    found = NAMED_RUN.findall((ROOT / "README.md").read_text(encoding="utf-8"))
    assert not found, f"README names runs ({found}): the figures live in docs/benchmarks.md"


def test_the_checks_catch_what_they_are_for() -> None:
    assert CLOCK_TIME.search("runs at 10:46 and 11:40 UTC")
    assert COMMIT_ID.search("build `b2acc70`") and not COMMIT_ID.search("1000000 resources, deadbeef")
    assert NAMED_RUN.search("in the last three `bench e2e` runs (12 rounds)")
    assert broken(ROOT / "docs" / "architecture.md", "no-such-section")
    assert broken(ROOT / "docs" / "no-such-page.md", "")


def test_one_version_in_pyproject_changelog_and_the_program(capsys: pytest.CaptureFixture[str]) -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    top = RELEASE.search((ROOT / "CHANGELOG.md").read_text(encoding="utf-8"))
    assert top, "CHANGELOG.md's first release heading is neither '## Unreleased — X.Y.Z' nor '## X.Y.Z'"
    unreleased, release = bool(top.group(1)), top.group(2)
    if unreleased:
        pre = PRE_RELEASE.fullmatch(declared)
        assert pre and pre.group(1) == release, (
            f"pyproject says {declared}; the CHANGELOG's unreleased {release} wants {release}.devN (or aN, bN, rcN)")
    else:
        assert declared == release, f"pyproject says {declared}, the CHANGELOG's latest release {release}"
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"orderly {declared}\n", (
        "`orderly --version` reads the installed metadata: after pyproject.toml changed, run `make setup`")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_of_a_page_leads_to_a_page_and_heading(page: Path) -> None:
    failures = []
    for line in prose(page.read_text(encoding="utf-8")):
        for href in LINK.findall(line):
            if re.match(r"[a-z]+:", href):  # http:, https:, mailto: lead outside the repository
                continue
            path, _, anchor = href.partition("#")
            why = broken((page.parent / path).resolve() if path else page, anchor)
            if why:
                failures.append(f"{href}: {why}")
    assert not failures, f"{page.relative_to(ROOT)}: {failures}"


def test_every_page_the_code_names_exists() -> None:
    failures = []
    for source in SOURCES:
        for reference in DOC_REFERENCE.findall(source.read_text(encoding="utf-8")):
            path, _, anchor = reference.partition("#")
            why = broken(ROOT / path, anchor)
            if why:
                failures.append(f"{source.relative_to(ROOT)}: {reference}: {why}")
    assert not failures, failures


def test_no_message_sends_the_reader_to_a_readme_section() -> None:
    """The README's sections moved to docs/ once; a message names the page (and heading) instead."""
    stale = [f"{source.relative_to(ROOT)}: {match}" for source in SOURCES
             for match in re.findall(r"README,\s*\w+", source.read_text(encoding="utf-8"))]
    assert not stale, stale
