"""The example latency tables in examples/perf-tables/ (documented in docs/perf-model-tables.md)
load with the `--perf-model` loader, agree with each other, and drive `provision simulate`."""
from __future__ import annotations

from pathlib import Path

import pytest

from hardware_catalog import load_catalog
from simcore.perfmodel import load_performance_model

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "perf-tables"
FILES = [EXAMPLES / "dgx-h100-bloom.yaml", EXAMPLES / "dgx-h100-bloom.csv"]


def load(path: Path, catalog):
    """`load_performance_model(path, catalog)`, or the older one-argument form."""
    try:
        return load_performance_model(path, catalog)
    except TypeError:
        return load_performance_model(path)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.suffix[1:])
def test_example_table_loads(path):
    catalog = load_catalog()
    perf = load(path, catalog)
    assert set(perf.tables) == {("dgx-h100", "bloom-176b")}
    bloom, h100 = catalog.model("bloom-176b"), catalog.machine("dgx-h100")
    curves = perf.curves(bloom, h100)
    assert perf.coefficients(bloom, h100) is None          # the table, not the default model
    # knots are read exactly (ms -> s); below the first knot the first value holds
    assert float(curves.prompt_time(1024)) == pytest.approx(0.134 * h100.prompt_slowdown)
    assert float(curves.prompt_time(16)) == pytest.approx(0.0483 * h100.prompt_slowdown)
    assert float(curves.token_time(32, 0)) == pytest.approx(0.0451)
    assert float(curves.token_time(1, 10_000)) == pytest.approx(0.0361 + 0.000125 * 10_000 / 1000)
    # another pair keeps the default model
    llama = catalog.model("llama2-70b")
    assert perf.coefficients(llama, h100) is not None


def test_yaml_and_csv_examples_agree():
    catalog = load_catalog()
    (yaml_model, csv_model) = (load(p, catalog) for p in FILES)
    key = ("dgx-h100", "bloom-176b")
    a, b = yaml_model.tables[key], csv_model.tables[key]
    for field in ("prompt_tokens", "prompt_seconds", "decode_batch", "decode_seconds"):
        assert list(getattr(a, field)) == list(getattr(b, field)), field
    assert a.context_seconds_per_token == b.context_seconds_per_token


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.suffix[1:])
def test_simulate_runs_with_example_table(path, run_cli):
    run = run_cli("simulate", "--design", "splitwise-hh", "--prompt", "25", "--token", "7",
                  "--rate", "70", "--perf-model", path.relative_to(ROOT), cwd=ROOT)
    # 0: all SLOs met, 1: some missed; 2 would be bad input (the file rejected)
    assert run.returncode in (0, 1), run.stderr[-3000:]
    assert "SLO" in run.stdout
