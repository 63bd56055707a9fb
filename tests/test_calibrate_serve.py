"""`provision calibrate` on serving benchmarks (issue 37): readers, fit, file, CLI."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hardware_catalog import load_catalog
from provisioner.benchfiles import read_bench_file
from provisioner.servefit import fit_runs, price_runs
from provisioner.study import model_in_dtype
from simcore.engine_overheads import fitted_overheads
from simcore.kernels import KernelPerformanceModel
from simcore.perfmodel import load_performance_model
from tests.harness import run_cli

BENCH = Path(__file__).parent / "data" / "bench"
SWEEP, DETAILED = BENCH / "vllm-sweep.jsonl", BENCH / "vllm-rate4-detailed.json"
GUIDELLM = BENCH / "guidellm-concurrent.json"
TRUE = {"iteration_s": 0.0015, "sequence_s": 20e-6, "first_token_s": 0.025}   # generate.py
PAIR = ["--model", "llama-3.1-8b", "--machine", "dgx-h100"]


def calibration(files, tp):
    catalog = load_catalog()
    model = model_in_dtype(catalog.models["llama-3.1-8b"], "bf16", "bf16")
    curves = KernelPerformanceModel("vllm", "bf16").curves(model, catalog.machines["dgx-h100"], tp)
    runs = [r for f in files for r in read_bench_file(f)]
    return fit_runs(price_runs(runs, curves, model.layers), fitted_overheads("vllm"))


def test_vllm_reader():
    sweep = read_bench_file(SWEEP)
    assert [r.label for r in sweep] == [f"run {i}" for i in range(1, 6)]
    assert all(r.concurrency_from == "Little's law" and not r.per_request for r in sweep)
    assert [round(r.rate_rps) for r in sweep] == [1, 2, 4, 8, 12]
    assert sorted(r.concurrency for r in sweep) == [r.concurrency for r in sweep]
    (detailed,) = read_bench_file(DETAILED)
    assert detailed.per_request and detailed.requests == 40
    assert 900 < detailed.input_tokens < 1100 and 115 < detailed.output_tokens < 140
    assert 0.005 < detailed.tpot_s < 0.02 and 0.03 < detailed.ttft_s < 0.1


def test_guidellm_reader():
    runs = read_bench_file(GUIDELLM)
    assert [r.concurrency for r in runs] == [1, 4, 16, 32, 64]
    assert all(r.concurrency_from == "closed loop" and r.per_request for r in runs)
    assert runs[0].label == "benchmark 1 (concurrent@1)"
    assert runs[0].model_id == "meta-llama/Llama-3.1-8B-Instruct"
    assert all(r.output_tokens == 256 for r in runs)


def test_fit_recovers_the_known_terms():
    fit = calibration([SWEEP, DETAILED], 1)
    assert fit.composition == "serial" and not fit.notes
    t = fit.terms
    assert t["iteration_s"] == pytest.approx(TRUE["iteration_s"], rel=0.2)
    assert t["first_token_s"] == pytest.approx(TRUE["first_token_s"], rel=0.1)
    assert 5e-6 < t["sequence_s"] < 40e-6
    assert t["prompt_scale"] == pytest.approx(1, abs=0.05)
    assert t["decode_scale"] == pytest.approx(1, abs=0.05)
    held = fit.held_out
    assert held["runs"] == 6
    for k in ("tpot", "ttft"):   # the defaults miss the fixture's terms; the fit does not
        assert held[k]["after"]["median"] < 0.06 < held[k]["before"]["median"]
    serial = calibration([GUIDELLM], 2).compositions["serial"]["terms"]
    assert serial["iteration_s"] == pytest.approx(TRUE["iteration_s"], rel=0.2)
    assert serial["first_token_s"] == pytest.approx(TRUE["first_token_s"], rel=0.1)


def test_fewer_runs_fit_fewer_parameters():
    runs = read_bench_file(SWEEP)[:3]
    catalog = load_catalog()
    model = model_in_dtype(catalog.models["llama-3.1-8b"], "bf16", "bf16")
    curves = KernelPerformanceModel("vllm", "bf16").curves(model, catalog.machines["dgx-h100"], 1)
    fit = fit_runs(price_runs(runs, curves, model.layers), fitted_overheads("vllm"))
    assert fit.free == ("iteration_s", "sequence_s", "first_token_s")
    assert fit.terms["prompt_scale"] == 1.0 and "scales fixed at 1" in fit.notes[0]


def test_cli_writes_a_perf_model_a_simulation_uses(tmp_path):
    out = tmp_path / "calib.json"
    done = run_cli("calibrate", str(SWEEP), str(DETAILED), *PAIR, "--tp", "1", "--out",
                   str(out), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["kind"] == "engine-calibration" and report["composition"] == "serial"
    assert len(report["runs"]) == 6 and report["held_out"]["tpot"]["after"]["median"] < 0.06
    assert {s["path"] for s in report["source"]["files"]} == {str(SWEEP), str(DETAILED)}
    document = json.loads(out.read_text())
    assert document["terms"] == report["terms"]

    catalog = load_catalog()
    loaded = load_performance_model(out, catalog)
    h100, model = catalog.machines["dgx-h100"], catalog.models["llama-3.1-8b"]
    curves = loaded.curves(model, h100, 1)
    assert curves.first_token_s == pytest.approx(document["terms"]["first_token_s"])
    assert curves.iteration_overhead_s == pytest.approx(document["terms"]["iteration_s"])
    other = loaded.curves(catalog.models["llama-3.1-70b"], h100, 8)   # the engine's defaults
    assert other.first_token_s == pytest.approx(fitted_overheads("vllm").first_token(80))

    def simulate(*extra):
        done = run_cli("simulate", "--design", "baseline-h100", "--machines", "1", "--model",
                       "llama-3.1-8b", "--rate", "2", "--duration", "10", "--json", *extra)
        assert done.returncode in (0, 1), done.stderr
        return json.loads(done.stdout)
    before, after = simulate(), simulate("--perf-model", str(out))
    assert str(out) in after["latency_source"] and "calib.json" in after["latency_source"]
    # +1.5 ms per iteration and a 24.5 ms first-token term (vs 0.53 ms x 32 layers)
    assert after["latency_ms"]["tpot"]["p50"] > before["latency_ms"]["tpot"]["p50"] + 1.0
    assert after["latency_ms"]["ttft"]["p50"] > before["latency_ms"]["ttft"]["p50"] + 4.0


def test_guidellm_cli_table():
    # (a wide terminal: at the width a run inherits the table may cut the run names short)
    done = run_cli("calibrate", str(GUIDELLM), *PAIR, "--tp", "2", env={"COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    words = " ".join(done.stdout.split())   # (and the lines below it wrap)
    assert "held out (leave one run out)" in words and "concurrent@64" in words


BAD = {
    "broken.json": ('{"completed": 3, ', "broken JSON"),
    "no-ttft.json": (json.dumps({"completed": 10, "duration": 5.0, "mean_ttft_ms": 40.0,
                                 "mean_tpot_ms": 8.0, "total_input_tokens": 1000}),
                     "field 'total_output_tokens'"),
    "negative.json": (json.dumps({"completed": 10, "duration": -5.0, "mean_ttft_ms": 40.0}),
                      "field 'duration'"),
    "strategy.json": (json.dumps({"benchmarks": [{"config": {"strategy": {"type_": "trace"}},
                                                  "metrics": {}}]}),
                      "field 'benchmarks[0].config.strategy.type_'"),
    "other.json": (json.dumps({"hello": 1}), "not a serving-benchmark result"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_files_are_refused_in_one_line(tmp_path, name):
    text, fragment = BAD[name]
    path = tmp_path / name
    path.write_text(text)
    out = tmp_path / "calib.json"
    done = run_cli("calibrate", str(path), *PAIR, "--tp", "1", "--out", str(out))
    assert done.returncode == 2, done.stdout
    assert fragment in done.stderr and str(path) in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_options_that_do_not_apply_are_refused(tmp_path):
    csv = tmp_path / "p.csv"
    csv.write_text("model,hardware,tensor_parallel,prompt_size,batch_size,token_size,"
                   "prompt_time,token_time\n")
    done = run_cli("calibrate", str(csv), "--model", "llama-3.1-8b")
    assert done.returncode == 2 and "--model applies to serving-benchmark results" in done.stderr
    done = run_cli("calibrate", str(SWEEP), "--machine", "dgx-h100", "--tp", "1")
    assert done.returncode == 2 and "need --model" in done.stderr
    done = run_cli("calibrate", str(SWEEP), *PAIR, "--tp", "1", "--seed", "3")
    assert done.returncode == 2 and "--seed applies to a profile CSV" in done.stderr
    assert "Traceback" not in done.stderr


def test_search_runs_with_the_calibration(tmp_path):
    out = tmp_path / "calib.json"
    assert run_cli("calibrate", str(SWEEP), str(DETAILED), *PAIR, "--tp", "1", "--out",
                   str(out)).returncode == 0
    done = run_cli("search", "--designs", "baseline-h100", "--model", "llama-3.1-8b", "--rate",
                   "5", "--duration", "20", "--verify-seeds", "1", "--no-cache", "--perf-model",
                   str(out), "--json", "--out", str(tmp_path / "report"))
    assert done.returncode in (0, 1), done.stderr
    assert "calib.json: vllm bf16 kernel tables" in done.stdout
    done = run_cli("search", "--designs", "baseline-h100", "--model", "llama-3.1-8b", "--rate",
                   "5", "--duration", "20", "--no-cache", "--perf-model", str(out),
                   "--engine", "sglang", "--out", str(tmp_path / "r2"))
    assert done.returncode == 2 and "engine calibration of --engine vllm" in done.stderr
