"""The README's table of contents (issue 40) is its headings', and every link inside the
README to one of its sections (`(#anchor)`) names a heading that exists."""
from __future__ import annotations

import re
import runpy
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOC = runpy.run_path(str(REPO / "scripts" / "readme_toc.py"))


def test_the_table_of_contents_is_current():
    text = (REPO / "README.md").read_text()
    assert TOC["with_toc"](text) == text, "run `python scripts/readme_toc.py --write`"


def test_every_section_link_names_a_heading():
    text = (REPO / "README.md").read_text()
    anchors = {TOC["anchor"](title) for _, title in TOC["headings"](text)}
    anchors |= set(re.findall(r'<a id="([^"]+)"></a>', text))   # explicit anchors
    links = set(re.findall(r"\]\(#([^)]+)\)", text))
    assert links and links <= anchors, sorted(links - anchors)
