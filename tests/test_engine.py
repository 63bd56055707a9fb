"""--engine and --dtype (issue 24): whose latencies a search simulates.

- splitwise-2023 is the model fitted to the 2023 Splitwise profiles, exactly as before the
  option existed; vllm (the default) answers with the kernel tables and moves the optimum;
- the engine and data type are part of the evaluation cache's identity and of the echo;
- fp8 halves the model's weight and KV bytes, and needs an engine's kernel tables;
- machines the engine's tables cover are calibrated (H100, L40S under vLLM), the others
  (MI300X) fall back to the 2023 model and stay marked uncalibrated.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

import provisioner
from hardware_catalog import InputError, load_catalog
from provisioner.api import assumptions, uncalibrated
from provisioner.options import SearchOptions, build
from provisioner.question import identity, resolve_study, to_echo
from simcore.kernels import EnginePerformanceModel, KernelPerformanceModel
from simcore.perfmodel import default_performance_model

SMALL = dict(designs="splitwise-hh,sarathi-h100", rate=40, duration=30, verify_seeds=3, jobs=1)
# The same search before --engine existed (commit 2dde709): design -> (P, T or pool, worst
# margin, TTFT P99, TBT P99), and its evaluations; sarathi-h100 since its chunk budget counts
# the running decodes (Sarathi-Serve's Algorithm 3): 32 -> 33 machines.
BEFORE = {"splitwise-hh": (17, 3, 0.239971, 2.87578, 3.80015),
          "sarathi-h100": (33, None, 0.0662507, 1.67296, 1.94943)}
BEFORE_EVALUATIONS = 45   # (47 before the load sweep ran before the headroom climb, whose
#                            steps above a failing sweep point it settles; 59 before a
#                            rejected candidate's neighbours went unscreened,
#                            62 before the staircase was walked within the cheapest cost
#                            found, 71 before the budget rule, 72 before the growth started at
#                            the capacity bound's pool sizes)


def study_of(**values):
    return resolve_study(build(SearchOptions, values))


def _optima(document: dict) -> dict:
    out = {}
    for entry in document["designs"]:
        o = entry["optimum"]
        pool = o.get("machines", o.get("prompt_machines"))
        out[entry["design"]] = (pool, o.get("token_machines"), o["worst_margin"],
                                o["slo"]["ttft_p99"]["value"], o["slo"]["tbt_p99"]["value"])
    return out


def test_splitwise_2023_reproduces_the_results_from_before_the_option():
    # (the KV admission of that time: reserved up front; paged is the default since)
    document = provisioner.search(engine="splitwise-2023", kv_admission="reserve",
                                  **SMALL).to_dict()
    assert _optima(document) == BEFORE
    assert document["summary"]["evaluations"] == BEFORE_EVALUATIONS
    assert document["inputs"]["options"]["engine"] == "splitwise-2023"


def test_vllm_is_the_default_and_moves_the_answer():
    document = provisioner.search(**SMALL).to_dict()
    assert document["inputs"]["options"]["engine"] == "vllm"
    assert document["inputs"]["options"]["dtype"] == "bf16"
    assert _optima(document) != BEFORE
    source = next(a["value"] for a in document["assumptions"] if a["name"] == "latency_source")
    assert "aiconfigurator-core" in source and "vLLM" in source and "dgx-h100" in source


def test_the_engine_and_dtype_are_in_the_cache_identity_and_the_echo():
    keys = {(engine, dtype): identity(study_of(engine=engine, dtype=dtype, designs=HOPPER))
            for engine, dtype in (("vllm", "bf16"), ("vllm", "fp8"), ("sglang", "bf16"),
                                  ("trtllm", "bf16"), ("trtllm", "fp8"),
                                  ("splitwise-2023", "bf16"))}
    assert len({repr(sorted(k["perf"].items())) for k in keys.values()}) == len(keys)
    echo = to_echo(study_of(engine="sglang"))
    assert echo["options"]["engine"] == "sglang" and echo["options"]["dtype"] == "bf16"
    perf = echo["perf_model"]
    assert perf["engine"] == "sglang" and perf["dtype"] == "bf16"
    assert perf["kernel_data"].startswith("aiconfigurator-core ")
    legacy = to_echo(study_of(engine="splitwise-2023"))["perf_model"]
    assert legacy["engine"] == "splitwise-2023" and "kernel_data" not in legacy


HOPPER = ("splitwise-hh", "sarathi-h100")   # fp8 needs fp8 tables: none on A100


def test_fp8_halves_the_weight_and_kv_bytes():
    """--dtype fp8 halves the weights; the KV cache is --kv-dtype's (auto under vLLM: bf16,
    its --kv-cache-dtype auto), halved with --kv-dtype fp8 (issue 34)."""
    bf16, fp8 = study_of(designs=HOPPER), study_of(dtype="fp8", designs=HOPPER)
    both = study_of(dtype="fp8", kv_dtype="fp8", designs=HOPPER)
    assert fp8.model.bytes_per_value == 1 == both.model.bytes_per_value
    assert fp8.model.weight_bytes == bf16.model.weight_bytes / 2
    assert fp8.model.kv_bytes_per_token == bf16.model.kv_bytes_per_token
    assert both.model.kv_bytes_per_token == bf16.model.kv_bytes_per_token / 2
    assert to_echo(fp8)["model"]["bytes_per_value"] == 1
    assert to_echo(both)["kv_capacity_tokens"]["dgx-h100"] > \
        2 * to_echo(bf16)["kv_capacity_tokens"]["dgx-h100"]
    run = provisioner.simulate(design="splitwise-hh", prompt=20, token=4, duration=10,
                               dtype="fp8")
    assert run.model.weight_bytes == bf16.model.weight_bytes / 2


def test_fp8_is_refused_with_the_2023_model(cli):
    with pytest.raises(InputError, match="dtype"):
        study_of(engine="splitwise-2023", dtype="fp8")
    with pytest.raises(InputError, match="splitwise-sim"):
        study_of(assumptions="splitwise-sim", dtype="fp8")
    outcome = cli(["search", "--engine", "splitwise-2023", "--dtype", "fp8"])
    assert outcome.code == 2
    assert len(outcome.stderr.strip().splitlines()) == 1 and "--dtype fp8" in outcome.stderr


def test_covered_gpus_are_calibrated_and_mi300x_is_not():
    study = study_of(designs=("dgx-h100/l40s", "mi300x/mi300x"))
    covered, mi300x = study.designs
    assert uncalibrated(covered, study) == []
    assert uncalibrated(mi300x, study) == ["mi300x"]
    legacy = study_of(engine="splitwise-2023", designs=("dgx-h100/l40s", "mi300x/mi300x"))
    assert "mi300x" in uncalibrated(legacy.designs[1], legacy)
    source = next(a["value"] for a in assumptions(study) if a["name"] == "latency_source")
    assert "mi300x: the splitwise-2023 model" in source and "uncalibrated" in source


def test_uncovered_pairs_fall_back_to_the_2023_model():
    catalog = load_catalog(None)
    h100, mi300x = catalog.machine("dgx-h100"), catalog.machine("mi300x")
    model = catalog.model("llama2-70b")
    engine = EnginePerformanceModel(KernelPerformanceModel("sglang"), default_performance_model())
    default = default_performance_model()
    assert engine.is_calibrated(model, h100)
    assert engine.curves(model, h100) is not default.curves(model, h100)
    assert engine.curves(model, mi300x) is default.curves(model, mi300x)
    shapeless = replace(model, intermediate_size=None)
    assert not engine.is_calibrated(shapeless, h100)
    assert engine.curves(shapeless, h100) is default.curves(shapeless, h100)
    a100 = catalog.machine("dgx-a100")   # SGLang has no A100 tables
    assert not engine.is_calibrated(model, a100)


def test_an_engine_without_tables_for_the_designs_warns_and_falls_back(capsys):
    study = study_of(engine="trtllm", designs=("baseline-a100",))
    assert "no kernel data" in capsys.readouterr().err
    assert uncalibrated(study.designs[0], study) == ["dgx-a100"]


def test_the_splitwise_sim_preset_pins_the_2023_model():
    study = study_of(assumptions="splitwise-sim")
    assert study.perf.engine == "splitwise-2023" and study.perf.latency_model == "splitwise-sim"
    assert study.options.study.engine == "vllm"   # as asked; the preset decides
