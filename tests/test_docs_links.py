"""The documentation's links hold (issue 40), without mkdocs: every page of docs/ is in the
site's navigation (mkdocs.yml) and every page there exists; every relative link of README.md
and of the pages names a file that exists, and a `#anchor` names a heading of that page (its
anchor as mkdocs makes it) or an explicit `<a id="...">`. tests/test_docs_build.py builds the
site with `mkdocs build --strict`, which checks the same, when mkdocs is installed. The README
stays an overview of a screen or two: the reference lives in the pages."""
from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """Python-Markdown's toc anchor (mkdocs' default): ASCII, punctuation but hyphens dropped,
    lower case, runs of spaces and hyphens to one hyphen."""
    text = unicodedata.normalize("NFKD", heading.replace("`", "")).encode("ascii", "ignore")
    text = re.sub(r"[^\w\s-]", "", text.decode("ascii")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def prose(text: str) -> str:
    """The text outside fenced code blocks."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            kept.append(line)
    return "\n".join(kept)


def anchors(page: Path) -> set[str]:
    text = prose(page.read_text())
    found = {slug(line.lstrip("#")) for line in text.splitlines() if re.match(r"^#{1,6} ", line)}
    return found | set(re.findall(r'<a id="([^"]+)"></a>', text))


def nav_pages(entries) -> list[str]:
    pages = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_page_is_in_the_navigation_and_every_entry_exists():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    listed = nav_pages(config["nav"])
    assert len(listed) == len(set(listed)), "a page is listed twice in mkdocs.yml"
    assert sorted(listed) == sorted(p.name for p in DOCS.glob("*.md"))


def test_every_relative_link_names_a_file_and_a_heading_that_exist():
    broken = []
    for page in [REPO / "README.md", *sorted(DOCS.glob("*.md"))]:
        for target in LINK.findall(prose(page.read_text())):
            if re.match(r"^[a-z]+:", target):          # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and anchor not in anchors(file):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken


def test_the_readme_is_an_overview_that_links_the_docs():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 120
    assert "(docs/index.md)" in readme
    image = re.search(r"!\[[^\]]*\]\(([^)]+)\)", readme)
    assert image and (REPO / image.group(1)).stat().st_size < 300_000
