"""The README and every page under docs/ link only to files that exist (relative links; web links are not followed),
and docs/ holds pages, pictures and results, not run logs, scripts or marker files."""
from __future__ import annotations

import re
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")
#: what docs/ may hold
KINDS = {".md", ".json", ".png", ".svg"}


def broken(page: Path) -> List[str]:
    """The relative links of ``page`` whose file is missing (an anchor after ``#`` is not checked here)."""
    out = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            out.append(f"{page.relative_to(ROOT)}: {target}")
    return out


def test_every_relative_link_of_the_readme_and_docs_exists():
    pages = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    found = [line for page in pages for line in broken(page)]
    assert not found, "\n".join(found)


def test_docs_holds_pages_pictures_and_results_only():
    odd = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*") if p.is_file() and p.suffix not in KINDS)
    assert not odd, "not a page, picture or result: " + ", ".join(odd)


def test_the_link_check_finds_a_missing_file(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("[here](gone.md) [web](https://example.org) [anchor](#x) [ok](p.md#top)\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert broken(page) == ["p.md: gone.md"]
    finally:
        ROOT = saved
