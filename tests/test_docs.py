"""The repository's documentation stands alone: a user's clone has nothing beside it, so no file
may send readers outside it, and every relative link of the README and docs/ must resolve."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from service.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
# Directories that hold no repository content (environments, caches, build outputs).
NOT_CONTENT = {
    ".git",
    ".venv",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    "build",
    "dist",
    "node_modules",
}
# Built from pieces so that this file does not match itself.
OUTSIDE_REFERENCES = ("../" + "shared", "shared" + "/papers", "shared" + "/DESIGN")
DESIGN_DOC = "DESIGN" + ".md"
README_MAX_LINES = 250

# [text](target) and reference definitions `[label]: target`; images too.
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
# A repository document named in prose or a code comment: docs/<path>.md.
DOC_MENTION = re.compile(r"(?<![\w/.])docs/[\w./-]*\.md")


def repository_files() -> list[Path]:
    """The files a clone holds: git's tracked and untracked-but-not-ignored files, or, outside a
    git checkout (an unpacked sdist), every file outside the non-content directories."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return [
            p
            for p in ROOT.rglob("*")
            if p.is_file() and not NOT_CONTENT & set(p.relative_to(ROOT).parts)
        ]
    paths = [ROOT / name for name in listed.decode().split("\0") if name]
    return [p for p in paths if p.is_file()]  # a deletion not yet committed is no file


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary file (a NUL byte in its first 8 KiB)."""
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


def markdown_docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a document's headings: lower case, punctuation other than `-`
    and `_` dropped, spaces as `-`, and `-1`, `-2` ... on repeats."""
    anchors: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", markdown)):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        candidate, repeat = slug, 0
        while candidate in anchors:
            repeat += 1
            candidate = f"{slug}-{repeat}"
        anchors.add(candidate)
    return anchors


def relative_links(markdown: str) -> list[str]:
    """Every link target that is neither a URL nor an e-mail address, outside code fences."""
    prose = FENCE.sub("", markdown)
    targets = INLINE_LINK.findall(prose) + REFERENCE_LINK.findall(prose)
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.IGNORECASE)]


def test_no_file_refers_outside_the_repository() -> None:
    files = repository_files()
    has_design_doc = any(p.name == DESIGN_DOC for p in files)
    offenders = []
    for path in files:
        text = text_of(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            found = [s for s in OUTSIDE_REFERENCES if s in line]
            if DESIGN_DOC in line and not has_design_doc:
                found.append(DESIGN_DOC)
            if found:
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {', '.join(found)}")
    assert not offenders, (
        "these lines point at documents a clone does not have; point them at "
        "docs/ instead:\n" + "\n".join(offenders)
    )


def test_the_scan_sees_the_files_it_must_check() -> None:
    """The scan above covers code, tests and docs alike (an empty listing would pass it)."""
    names = {p.relative_to(ROOT).as_posix() for p in repository_files()}
    for expected in (
        "README.md",
        "docs/api.md",
        "service/api/app.py",
        "trainers/collapse.py",
        "tests/test_docs.py",
    ):
        assert expected in names


@pytest.mark.parametrize("doc", markdown_docs(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = []
    for target in relative_links(doc.read_text(encoding="utf-8")):
        path_part, _, anchor = target.partition("#")
        resolved = (doc.parent / path_part).resolve() if path_part else doc
        if ROOT not in resolved.parents and resolved != ROOT:
            broken.append(f"{target}: outside the repository")
        elif not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md":
            if anchor not in heading_anchors(resolved.read_text(encoding="utf-8")):
                broken.append(f"{target}: no heading with the anchor #{anchor}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def test_documents_named_in_files_exist() -> None:
    """Code comments and docs name documents as `docs/<path>.md`; each must be there."""
    missing = set()
    for path in repository_files():
        text = text_of(path)
        if text is None:
            continue
        for mention in DOC_MENTION.findall(text):
            if not (ROOT / mention.rstrip(".")).is_file():
                missing.add(f"{path.relative_to(ROOT)}: {mention}")
    assert not missing, "documents named but absent:\n" + "\n".join(sorted(missing))


def test_the_link_checker_finds_what_it_must() -> None:
    """The checks above can fail: a broken link, an escape from the root and a missing anchor
    are each reported, and GitHub's anchors are computed as GitHub does."""
    links = relative_links(
        "see [a](docs/api.md#x) and [b](https://example.org) and "
        "![c](img.png)\n\n```\n[d](not-a-link.md)\n```\n[e]: ../outside.md\n"
    )
    assert links == ["docs/api.md#x", "img.png", "../outside.md"]
    assert heading_anchors(
        "# `cff` and the dataset layer\n## 4. The protocol\n"
        "### `GET /experiments/{id}/stats`\n## Twice\n## Twice\n"
    ) == {
        "cff-and-the-dataset-layer",
        "4-the-protocol",
        "get-experimentsidstats",
        "twice",
        "twice-1",
    }


def test_every_setting_is_documented_in_the_settings_page() -> None:
    """docs/settings.md is where users look for a setting: each field of
    service.settings.Settings must appear there under its environment variable."""
    page = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    undocumented = [
        f"SEEDGRID_{name.upper()}"
        for name in Settings.model_fields
        if f"`SEEDGRID_{name.upper()}`" not in page
    ]
    assert not undocumented, f"settings missing from docs/settings.md: {', '.join(undocumented)}"


def test_the_readme_stays_short() -> None:
    """The README says what seedgrid is, the two commands, the first five minutes and where to
    read on; everything else belongs in docs/."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines < README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES - 1}): move detail to docs/"
    )
