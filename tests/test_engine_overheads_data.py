"""simcore/data/engine_overheads.json: its shape, finite non-negative terms, the composition
(serial or overlap) of each engine's host time with its kernels, and (when
aiconfigurator's silicon corpus is at $PROVISION_SILICON_CSV or /tmp/silicon.csv) that
`scripts/fit_engine_overheads.py --check` re-derives it (docs/engine-overheads.md)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "simcore" / "data" / "engine_overheads.json"
SCRIPT = ROOT / "scripts" / "fit_engine_overheads.py"
ENGINES = ("vllm", "sglang", "trtllm")
TERMS = ("iteration_s", "sequence_s", "first_token_s", "first_token_s_per_layer")
COMPOSITIONS = ("serial", "overlap")


def document() -> dict:
    return json.loads(DATA.read_text())


def silicon_csv() -> Path | None:
    for candidate in (os.environ.get("PROVISION_SILICON_CSV"), "/tmp/silicon.csv"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def test_top_level_shape():
    doc = document()
    assert set(doc) == {"source", "method", "engines"}
    assert "095f58a51c4ca8e61b66ec108d86f223f8d559ce" in doc["source"]
    assert "Apache-2.0" in doc["source"]
    assert set(doc["engines"]) == set(ENGINES)


@pytest.mark.parametrize("engine", ENGINES)
def test_engine_terms_finite_and_non_negative(engine):
    entry = document()["engines"][engine]
    assert set(entry) == {"versions", "composition", *TERMS, "runs", "held_out"}
    assert entry["composition"] in COMPOSITIONS
    for term in TERMS:
        value = entry[term]
        assert isinstance(value, (int, float)) and math.isfinite(value) and value >= 0, term
    assert entry["first_token_s"] == 0 or entry["first_token_s_per_layer"] == 0
    assert isinstance(entry["runs"], int) and entry["runs"] > 0
    assert isinstance(entry["versions"], str) and entry["versions"]


@pytest.mark.parametrize("engine", ENGINES)
def test_held_out_errors_shape(engine):
    held = document()["engines"][engine]["held_out"]
    assert set(held) == {"tpot", "ttft"}
    for metric in held.values():
        assert set(metric) == {"before", "after"}
        for stats in metric.values():
            assert set(stats) == {"median", "p90"}
            assert 0 <= stats["median"] <= stats["p90"]


def test_method_describes_the_composition_choice():
    method = document()["method"]
    for word in ("serial", "overlap", "max(kernels, h)", "composition"):
        assert word in method, word


def test_runs_add_up_to_the_source():
    doc = document()
    used = sum(entry["runs"] for entry in doc["engines"].values())
    assert f"{used} measured serving runs used" in doc["source"]


def test_check_rederives_the_shipped_file():
    corpus = silicon_csv()
    if corpus is None:
        pytest.skip("aiconfigurator's silicon_sample.csv not found (set PROVISION_SILICON_CSV)")
    before = DATA.read_bytes()
    done = subprocess.run([sys.executable, str(SCRIPT), "--check", "--silicon", str(corpus)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "is up to date" in done.stdout
    assert DATA.read_bytes() == before
