"""The documentation site builds (issue 40): `mkdocs build --strict` turns every warning (a
broken link or anchor, a page left out of the navigation) into a failure. mkdocs is in the
test extra, so CI (.ci/run) builds the site; without it the test skips."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--clean",
                          "--config-file", str(REPO / "mkdocs.yml"),
                          "--site-dir", str(tmp_path / "site")],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    for page in ("index.html", "search/index.html", "api/index.html", "img/report-latency.png"):
        assert (tmp_path / "site" / page).exists(), page
