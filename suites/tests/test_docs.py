"""The README is a front page and the docs/ pages hold the rest: every link between them
resolves, and every source the code cites by key is in docs/bibliography.md."""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
BIBLIOGRAPHY = DOCS / "bibliography.md"
SKIP_DIRS = {".git", ".venv", "venv", ".nox", "out", "build", "dist", "__pycache__"}

#: A citation key as the code writes it: `[PA-deep-dive]` (words of 2+ letters joined by
#: hyphens, so `[q1-q3]` and character classes are not keys).
CITATION = re.compile(r"\[([A-Za-z]{2,}(?:-[A-Za-z]{2,})+)\]")
#: mypy error codes look like keys (`# type: ignore[arg-type]`): they are dropped first.
TYPE_IGNORE = re.compile(r"type:\s*ignore\[[^\]]*\]")
#: A markdown link: [text](target).
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _repo_files(*suffixes: str) -> list[Path]:
    """The project's own files with these suffixes: hidden folders (.git, .ci-venv, .nox),
    virtual environments (any folder holding pyvenv.cfg) and build outputs are not walked."""
    found = []
    for folder, subdirs, files in os.walk(REPO):
        subdirs[:] = [
            d
            for d in subdirs
            if d not in SKIP_DIRS
            and not d.startswith(".")
            and not (Path(folder) / d / "pyvenv.cfg").exists()
        ]
        found += [Path(folder) / f for f in files if Path(f).suffix in suffixes]
    return found


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a markdown page (lower case, punctuation dropped, spaces
    to hyphens), outside fenced code."""
    out, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return out


def test_readme_is_a_front_page_with_a_quick_start():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail into docs/"
    start = next(i for i, ln in enumerate(lines) if ln.startswith("#") and "Quick start" in ln)
    after = lines[start + 1 :]
    end = next((i for i, ln in enumerate(after) if ln.startswith("## ")), len(after))
    assert any(ln.startswith("```") for ln in after[:end]), "Quick start has no fenced commands"
    linked = set(LINK.findall(README.read_text()))
    for page in sorted(DOCS.glob("*.md")):
        assert any(t.split("#")[0] == f"docs/{page.name}" for t in linked), page.name


def test_every_relative_link_resolves():
    pages = [README, *sorted(DOCS.glob("*.md"))]
    bad = []
    for page in pages:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # http(s):, mailto:
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{page.name}: {target} (no such heading)")
    assert not bad, bad


def test_code_cites_sources_by_their_bibliography_keys():
    keys = set(re.findall(r"`\[([\w-]+)\]`", BIBLIOGRAPHY.read_text()))
    assert {"vLLM-paper", "KV-capacity", "PA-deep-dive", "paged-sim"} <= keys
    unknown, seed_numbers = [], []
    for path in _repo_files(".py", ".md", ".j2"):
        text = TYPE_IGNORE.sub("", path.read_text(errors="replace"))
        rel = path.relative_to(REPO)
        unknown += [f"{rel}: [{k}]" for k in CITATION.findall(text) if k not in keys]
        if path.suffix != ".md":
            seed_numbers += [f"{rel}: {m}" for m in re.findall(r"\b[Ss]eeds? 00\d", text)]
    assert not unknown, f"cite a key listed in docs/bibliography.md: {unknown}"
    assert not seed_numbers, f"cite the document's key, not its seed number: {seed_numbers}"
