"""Performance model: curve contract, power cap, GQA transfer, tabulation, table and coefficient files."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from hardware_catalog import InputError, load_catalog
from simcore.perfcalib import fit_group
from simcore.perfmodel import (DEFAULT_COEFFICIENTS, FittedPerformanceModel, PairCoefficients,
                               default_performance_model, load_performance_model)

CATALOG = load_catalog()
PAIRS = [(m, s) for m in CATALOG.models.values() for s in CATALOG.machines.values()]
PAIR_IDS = [f"{m.name}@{s.name}" for m, s in PAIRS]
PERF = default_performance_model()


@pytest.mark.parametrize("model,machine", PAIRS, ids=PAIR_IDS)
def test_curves_non_decreasing_in_tokens_and_batch(model, machine):
    curves = PERF.curves(model, machine)
    tokens = np.arange(0, 70000, 7.0)           # below, across and beyond the knots
    batch = np.arange(0, 9000, 1.0)
    assert np.all(np.diff(curves.prompt_time(tokens)) >= 0)
    assert np.all(np.diff(curves.token_time(batch, 0)) >= 0)
    assert np.all(np.diff(curves.token_time(8, np.arange(0, 1e6, 997.0))) >= 0)


@pytest.mark.parametrize("model,machine", PAIRS, ids=PAIR_IDS)
def test_decode_latency_depends_on_batch_size(model, machine):
    curves = PERF.curves(model, machine)
    one, many = curves.token_time(1, 0), curves.token_time(256, 0)
    # the fitted model reads a sparse MoE's every expert whatever the batch, and its per-request
    # compute scales with the active parameters only, so the growth shrinks with the active
    # share (A100, 256 vs 1: Qwen3-30B-A3B 11% active +7%, DeepSeek-R1 5.6% +5%, Kimi-K2 3.2%
    # +1.7%); the margin required scales with that share
    active = model.active_params_b / model.params_b if model.is_moe else 1.0
    assert many > (1 + 0.25 * active if model.is_moe else 1.1) * one
    # at the same total context, more requests cost more (the batch is an input of its own)
    assert curves.token_time(64, 64_000) > curves.token_time(1, 64_000)


@pytest.mark.parametrize("model,machine", PAIRS, ids=PAIR_IDS)
def test_tabulated_curves_within_a_tenth_percent_of_closed_form(model, machine):
    curves, pair = PERF.curves(model, machine), PERF.coefficients(model, machine)
    tokens, batch = np.arange(1, 32769.0), np.arange(1, 4097.0)
    exact_prompt = pair.prompt.seconds(tokens) * machine.prompt_slowdown
    assert np.max(np.abs(curves.prompt_time(tokens) / exact_prompt - 1)) < 1e-3
    assert np.max(np.abs(curves.token_time(batch, 0) / pair.decode.seconds(batch) - 1)) < 1e-3
    assert curves.context_seconds_per_token == pair.decode.context_s_per_token


def test_power_cap_slows_prompt_only():
    model = CATALOG.model("bloom-176b")
    capped, full = CATALOG.machine("dgx-h100-cap"), CATALOG.machine("dgx-h100")
    assert capped.prompt_slowdown > 1
    a, b = PERF.curves(model, capped), PERF.curves(model, full)
    tokens = np.array([1, 100, 2048, 8192, 50000])
    np.testing.assert_allclose(a.prompt_time(tokens), capped.prompt_slowdown * b.prompt_time(tokens))
    np.testing.assert_array_equal(a.token_time([1, 16, 200], [0, 5000, 90000]),
                                  b.token_time([1, 16, 200], [0, 5000, 90000]))
    assert a.context_seconds_per_token == b.context_seconds_per_token


def test_calibrated_pairs_use_their_fitted_group_and_are_cached():
    model, machine = CATALOG.model("llama2-70b"), CATALOG.machine("dgx-a100")
    pair = PERF.coefficients(model, machine)
    assert (pair.model, pair.hardware, pair.tensor_parallel) == ("llama2-70b", "a100-80gb", 8)
    assert PERF.curves(model, machine) is PERF.curves(model, machine)


def test_gqa_shrinks_context_cost_by_the_kv_head_ratio():
    llama = CATALOG.model("llama2-70b")
    mha = dataclasses.replace(llama, name="llama2-70b-mha", kv_heads=llama.heads, perf_profile=None)
    for machine in (CATALOG.machine("dgx-a100"), CATALOG.machine("h200")):
        gqa_cost = PERF.curves(llama, machine).context_seconds_per_token
        mha_cost = PERF.curves(mha, machine).context_seconds_per_token
        assert mha_cost == pytest.approx(gqa_cost * llama.heads / llama.kv_heads, rel=1e-9)
    # an uncalibrated GQA model with the same KV layout pays the same per context token
    llama3 = CATALOG.model("llama-3-70b")
    assert llama3.kv_bytes_per_token == llama.kv_bytes_per_token
    machine = CATALOG.machine("dgx-h100")
    assert (PERF.curves(llama3, machine).context_seconds_per_token
            == pytest.approx(PERF.curves(llama, machine).context_seconds_per_token))


def test_uncalibrated_machine_scales_by_datasheet_ratios():
    model = CATALOG.model("llama2-70b")
    h100, h200 = CATALOG.machine("dgx-h100"), CATALOG.machine("h200")
    base, scaled = PERF.coefficients(model, h100), PERF.coefficients(model, h200)
    bandwidth = h100.hbm_bandwidth_gbs / h200.hbm_bandwidth_gbs
    assert scaled.decode.memory_s == pytest.approx(base.decode.memory_s * bandwidth)
    assert scaled.decode.compute_s_per_request == pytest.approx(
        base.decode.compute_s_per_request * bandwidth)
    assert scaled.prompt.compute_s_per_token == pytest.approx(base.prompt.compute_s_per_token)
    assert scaled.decode.overhead_s == base.decode.overhead_s
    assert PERF.curves(model, h200).token_time(32, 0) < PERF.curves(model, h100).token_time(32, 0)


def test_smaller_model_transfers_from_closest_calibrated_model():
    small = CATALOG.model("llama-3-8b")
    pair = PERF.coefficients(small, CATALOG.machine("dgx-a100"))
    base = PERF.coefficients(CATALOG.model("llama2-70b"), CATALOG.machine("dgx-a100"))
    assert pair.prompt.compute_s_per_token == pytest.approx(
        base.prompt.compute_s_per_token * small.flops_params_b / 68.98)
    assert pair.decode.overhead_s == pytest.approx(base.decode.overhead_s * small.layers / 80)


def test_fit_recovers_a_known_closed_form():
    truth = PERF.coefficients(CATALOG.model("bloom-176b"), CATALOG.machine("dgx-h100"))
    prompt_sizes = [128, 256, 512, 1024, 2048, 4096, 8192] + [512] * 6
    batch = [1] * 7 + [2, 4, 8, 16, 32, 64]
    rows = pd.DataFrame({"prompt_size": prompt_sizes, "batch_size": batch, "token_size": 128})
    tokens, n = rows.prompt_size * rows.batch_size, rows.batch_size
    rows["prompt_time"] = truth.prompt.seconds(tokens, n) * 1000
    rows["token_time"] = truth.decode.seconds(n, n * (rows.prompt_size + 64)) * 1000
    prompt, decode = fit_group(rows)
    np.testing.assert_allclose(prompt.seconds(tokens, n) * 1000, rows.prompt_time, rtol=0.02)
    np.testing.assert_allclose(decode.seconds(n, n * (rows.prompt_size + 64)) * 1000,
                               rows.token_time, rtol=0.01)


# ----------------------------------------------------------------------------- table files
TABLE_YAML = """\
tables:
  - machine: dgx-a100
    model: llama2-70b
    prefill: {tokens: [128, 512, 2048], ms: [60, 100, 300]}
    decode: {batch: [1, 8, 64], ms: [40, 48, 72]}
    context_ms_per_token: 0.001
  - machine: dgx-h100-cap
    prefill: {tokens: [100, 1000], ms: [50, 150]}
    decode: {batch: [1, 10], ms: [30, 39]}
"""
TABLE_CSV = """\
machine,model,phase,x,ms
dgx-a100,llama2-70b,prefill,128,60
dgx-a100,llama2-70b,prefill,512,100
dgx-a100,llama2-70b,prefill,2048,300
dgx-a100,llama2-70b,decode,1,40
dgx-a100,llama2-70b,decode,8,48
dgx-a100,llama2-70b,decode,64,72
dgx-a100,llama2-70b,context,,0.001
dgx-h100-cap,,prefill,100,50
dgx-h100-cap,,prefill,1000,150
dgx-h100-cap,,decode,1,30
dgx-h100-cap,,decode,10,39
"""


@pytest.mark.parametrize("name,text", [("t.yaml", TABLE_YAML), ("t.csv", TABLE_CSV)])
def test_table_file_yaml_and_csv_give_the_stated_interpolation(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    perf = load_performance_model(path, load_catalog())
    c = perf.curves(CATALOG.model("llama2-70b"), CATALOG.machine("dgx-a100"))
    # clamp below the first knot, interpolate, continue the last segment beyond the last knot
    np.testing.assert_allclose(c.prompt_time([10, 128, 320, 2048, 3584]),
                               [0.060, 0.060, 0.080, 0.300, 0.500])
    np.testing.assert_allclose(c.token_time([1, 36, 120], [0, 1000, 0]),
                               [0.040, 0.060 + 0.001, 0.096])
    # a machine-wide table covers every model; the power cap is applied on top (prompt only)
    capped = perf.curves(CATALOG.model("bloom-176b"), CATALOG.machine("dgx-h100-cap"))
    assert capped.prompt_time(100) == pytest.approx(0.050 * 1.3)
    assert capped.token_time(1, 0) == pytest.approx(0.030)
    # pairs the file does not cover fall back to the default model
    model, machine = CATALOG.model("bloom-176b"), CATALOG.machine("dgx-a100")
    np.testing.assert_array_equal(perf.curves(model, machine).prompt_seconds,
                                  PERF.curves(model, machine).prompt_seconds)


BAD_TABLES = {
    "decreasing-knots.yaml": (TABLE_YAML.replace("[128, 512, 2048]", "[128, 64, 2048]"),
                              "prefill.tokens", "knots must increase"),
    "negative.yaml": (TABLE_YAML.replace("[60, 100, 300]", "[60, -100, 300]"),
                      "prefill.ms", "must be > 0"),
    "text.yaml": (TABLE_YAML.replace("[40, 48, 72]", "[40, fast, 72]"), "decode.ms",
                  "must be a number"),
    "unknown-sku.yaml": (TABLE_YAML.replace("dgx-h100-cap", "dgx-z9"), "machine",
                         "unknown machine SKU 'dgx-z9'"),
    "falling.yaml": (TABLE_YAML.replace("[40, 48, 72]", "[40, 48, 30]"), "decode.ms",
                     "must not decrease"),
    "one-knot.yaml": (TABLE_YAML.replace("{tokens: [100, 1000], ms: [50, 150]}",
                                         "{tokens: [100], ms: [50]}"), "prefill.ms",
                      "at least 2 knots"),
    "no-decode.yaml": ("tables:\n  - machine: dgx-a100\n    prefill: {tokens: [1, 2], ms: [1, 2]}\n",
                       "decode", "missing"),
    "negative-context.yaml": (TABLE_YAML.replace("0.001", "-0.5"), "context_ms_per_token",
                              ">= 0"),
    "text.csv": (TABLE_CSV.replace("prefill,512,100", "prefill,512,slow"), "ms", "row 3"),
    "decreasing-knots.csv": (TABLE_CSV.replace("decode,8,48", "decode,0.5,48"), "x", "row 6"),
    "unknown-sku.csv": (TABLE_CSV.replace("dgx-h100-cap", "dgx-z9"), "machine", "row 9"),
    "bad-phase.csv": (TABLE_CSV.replace("context,,", "kontext,,"), "phase", "row 8"),
    "missing-column.csv": ("machine,phase,x\ndgx-a100,prefill,1\n", None, "missing column 'ms'"),
    "empty.csv": ("", None, "file is empty"),
}


@pytest.mark.parametrize("name", sorted(BAD_TABLES))
def test_malformed_table_files_raise_one_line_errors(tmp_path, name):
    text, field, fragment = BAD_TABLES[name]
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InputError) as err:
        load_performance_model(path, load_catalog())
    message = str(err.value)
    assert "\n" not in message and str(path) in message and fragment in message
    if field is not None:
        assert f"field '{field}'" in message


def test_malformed_table_file_exits_2_through_the_cli(tmp_path, run_cli):
    text, _, fragment = BAD_TABLES["decreasing-knots.yaml"]
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    run = run_cli("simulate", "--design", "splitwise-aa", "--prompt", "1", "--token", "1",
                  "--perf-model", path, timeout=300)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in run.stderr


# ----------------------------------------------------------------------- coefficient files
def _document(**changes) -> dict:
    """The packaged coefficients document with some fields of its first group changed."""
    document = json.loads(DEFAULT_COEFFICIENTS.read_text())
    group = document["groups"][0]
    for path, value in changes.items():
        section, key = path.split(".")
        group[section][key] = value
    return document


@pytest.mark.parametrize("change,field", [
    ({"prompt.overhead_s": -1.0}, "overhead_s"),
    ({"decode.sharpness": "steep"}, "sharpness"),
    ({"prompt.knee_tokens": 0}, "knee_tokens"),
])
def test_malformed_coefficient_files_raise_one_line_errors(tmp_path, change, field):
    path = tmp_path / "coefficients.json"
    path.write_text(json.dumps(_document(**change)))
    with pytest.raises(InputError, match=rf"coefficients.json, field '{field}'"):
        load_performance_model(path, load_catalog())


def test_coefficient_file_without_format_is_rejected(tmp_path):
    document = _document()
    del document["format"]
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(document))
    with pytest.raises(InputError, match="field 'format'"):
        load_performance_model(path, load_catalog())


def test_user_coefficients_cover_their_pairs_and_fall_back_elsewhere(tmp_path):
    model, machine = CATALOG.model("llama2-70b"), CATALOG.machine("dgx-a100")
    base = PERF.coefficients(model, machine)
    slower = dataclasses.replace(base, prompt=dataclasses.replace(
        base.prompt, overhead_s=base.prompt.overhead_s + 0.5), hardware="dgx-a100")
    document = _document()
    document["groups"] = [slower.as_dict()]
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(document))
    perf = load_performance_model(path, load_catalog())
    assert perf.curves(model, machine).prompt_time(512) == pytest.approx(
        PERF.curves(model, machine).prompt_time(512) + 0.5, rel=1e-3)
    other = CATALOG.model("bloom-176b")
    assert perf.curves(other, machine).prompt_time(512) == PERF.curves(other, machine).prompt_time(512)


def test_a_model_without_any_data_is_an_input_error():
    empty = FittedPerformanceModel([])
    with pytest.raises(InputError, match="no performance data"):
        empty.curves(CATALOG.model("llama2-70b"), CATALOG.machine("dgx-a100"))
    assert isinstance(PERF.coefficients(CATALOG.model("mixtral-8x7b"), CATALOG.machine("l40s")),
                      PairCoefficients)


def _implementations(tmp_path) -> dict:
    """One of each performance model the code builds: the 2023 fit, calibrated coefficients (a
    coefficients file), a user's table, the kernel model, an engine's model, SplitwiseSim's
    curves, and a scaled one (--sensitivity)."""
    from provisioner.study import _Scaled
    from simcore.kernels import EnginePerformanceModel, KernelPerformanceModel
    from simcore.splitwise_sim import SplitwiseSimPerformance
    coefficients = tmp_path / "mine.json"
    coefficients.write_text(json.dumps(_document()))
    table = tmp_path / "t.csv"
    table.write_text(TABLE_CSV)
    return {"2023 fit": PERF,
            "calibrated": load_performance_model(coefficients, CATALOG),
            "user table": load_performance_model(table, CATALOG),
            "kernels": KernelPerformanceModel("vllm"),
            "engine": EnginePerformanceModel(KernelPerformanceModel("vllm"), PERF),
            "splitwise-sim curves": SplitwiseSimPerformance(PERF),
            "scaled": _Scaled(PERF, 1.1)}


def test_every_performance_model_satisfies_the_protocol(tmp_path):
    """`simcore.performance.PerformanceModel` is what the simulators and the search call: each
    implementation declares it, answers it with the protocol's parameter names, and answers."""
    import inspect

    from simcore.latency import LatencyCurves
    from simcore.performance import PerformanceModel
    calls = [name for name, member in vars(PerformanceModel).items()
             if inspect.isfunction(member) and not name.startswith("_")]
    assert calls == ["curves", "is_calibrated", "prices_expert_parallelism",
                     "expert_parallel_curves"]
    model, machine = CATALOG.model("llama2-70b"), CATALOG.machine("dgx-h100")
    for name, perf in _implementations(tmp_path).items():
        assert isinstance(perf, PerformanceModel), name
        assert PerformanceModel in type(perf).__mro__, f"{name} does not declare the protocol"
        for call in calls:
            wanted = list(inspect.signature(getattr(PerformanceModel, call)).parameters)
            assert list(inspect.signature(getattr(type(perf), call)).parameters) == wanted, \
                (name, call)
        assert isinstance(perf.curves(model, machine, 8), LatencyCurves), name
        assert isinstance(perf.is_calibrated(model, machine, 8), bool), name
        assert perf.prices_expert_parallelism(model, machine) is False, name   # dense


def test_an_object_without_the_calls_is_not_a_performance_model():
    from simcore.performance import PerformanceModel

    class CurvesOnly:
        def curves(self, model, machine, tp=None):
            return PERF.curves(model, machine, tp)

    assert not isinstance(CurvesOnly(), PerformanceModel)
