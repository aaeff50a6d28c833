"""The documentation holds together: every relative link in README.md, docs/*.md and benchmarks/README.md names a
file of the checkout, and a link to a heading names a heading of that file; the README stays a short front page."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import ROOT

PAGES = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def links(page: Path) -> list[str]:
    text = CODE.sub("", page.read_text(encoding="utf-8"))  # code shows links, it does not make them
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for the headings of a markdown page: lower case, punctuation dropped, spaces to hyphens."""
    found = set()
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        found.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return found


def test_every_relative_link_points_to_an_existing_file_and_heading():
    assert len(PAGES) > 8
    checked = 0
    for page in PAGES:
        for target in links(page):
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            assert file.exists(), f"{page.relative_to(ROOT)}: the link to {target} names no file"
            assert file.is_relative_to(ROOT), f"{page.relative_to(ROOT)}: the link to {target} leaves the checkout"
            if anchor and file.suffix == ".md":
                assert anchor in anchors(file), f"{page.relative_to(ROOT)}: {file.relative_to(ROOT)} has no heading #{anchor}"
            checked += 1
    assert checked > 40


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("See [there](missing.md), [`code`](../x.py#L1), `[not a link](nowhere.md)`, [web](https://example.org).\n")
    assert links(page) == ["missing.md", "../x.py#L1"]
    assert anchors(ROOT / "docs" / "cli.md") >= {"veritrain-run", "veritrain-runs-list", "exit-codes"}


def test_the_readme_is_a_front_page():
    assert len((ROOT / "README.md").read_bytes()) <= 10_000
