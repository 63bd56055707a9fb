"""The README's table of contents, from its ## and ### headings (GitHub's anchors):
`python scripts/readme_toc.py` prints it; `--write` replaces the block between the markers
<!-- toc --> and <!-- /toc --> (tests/test_readme_toc.py fails when it is stale)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- toc -->", "<!-- /toc -->"


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but hyphens dropped, spaces to
    hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def headings(text: str) -> list[tuple[int, str]]:
    found, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"^#{2,3} ", line):
            level = len(line) - len(line.lstrip("#"))
            found.append((level, line[level + 1:].strip()))
    return found


def toc(text: str) -> str:
    lines = []
    for level, title in headings(text):
        indent = "  " * (level - 2)
        lines.append(f"{indent}- [{title.replace('`', '')}](#{anchor(title)})")
    return "\n".join(lines)


def with_toc(text: str) -> str:
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    return f"{before}{START}\n{toc(text)}\n{END}{after}"


if __name__ == "__main__":
    text = README.read_text()
    if "--write" in sys.argv:
        README.write_text(with_toc(text))
    else:
        print(toc(text))
