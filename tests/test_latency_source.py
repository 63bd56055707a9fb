"""The latency source is explicit and never changes silently (issue 34).

- TensorRT-LLM fp8 is simulated with its measured fp8 tables (H100, H200, B200, B300, L40S),
  not the 2023 profiles;
- an engine and data type without tables for a machine of the question (fp8 on A100, SGLang
  fp8 anywhere) is refused before any simulation, in one line naming what the tables hold per
  GPU;
- --kv-dtype is separate from the weights' --dtype: "auto" does as the engine does (vLLM and
  SGLang keep a bf16 KV with fp8 weights; TensorRT-LLM follows the fp8 checkpoint), fp8 halves
  the KV bytes per token and reads the fp8-KV attention tables; echoed, in the cache identity;
- the derivation leaves database anomalies out (fp8 slower than bf16 for the same shape,
  latency not monotone in tokens), records them, and the report names the fallback: the
  Hopper fp8 MoE tables (2.5-3.3x slower than bf16) no longer make fp8 Mixtral slower;
- `catalog --json` gives each SKU's latency source instead of a bare `calibrated` flag.
"""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from harness import REPO
from hardware_catalog import InputError, load_catalog
from provisioner.api import assumptions, uncalibrated
from provisioner.options import SearchOptions, build
from provisioner.question import identity, resolve_study, to_echo
from simcore.kernels import KernelPerformanceModel, iteration_time, load_tables

CATALOG = load_catalog(None)
HOPPER = ("splitwise-hh",)


def study_of(**values):
    return resolve_study(build(SearchOptions, values))


def _source(study) -> str:
    return next(a["value"] for a in assumptions(study) if a["name"] == "latency_source")


# ------------------------------------------------------------------ TensorRT-LLM fp8 tables
@pytest.mark.parametrize("machine", ["dgx-h100", "h200", "b200"])
def test_trtllm_fp8_is_simulated_with_its_measured_tables(machine):
    model = CATALOG.model("llama2-70b")
    sku = CATALOG.machine(machine)
    assert KernelPerformanceModel("trtllm", "fp8").is_calibrated(model, sku)
    study = study_of(engine="trtllm", dtype="fp8", model="llama2-70b",
                     designs=(f"{machine}/{machine}",))
    assert uncalibrated(study.designs[0], study) == []
    source = _source(study)
    assert "TensorRT-LLM 1.3.0rc20" in source and "splitwise-2023" not in source


# -------------------------------------------------------- refused up front, naming what exists
def test_fp8_on_a100_is_refused_before_any_simulation(cli, bad_input):
    outcome = cli(["simulate", "--design", "baseline-a100", "--machines", "2", "--model",
                   "llama2-70b", "--dtype", "fp8", "--duration", "5"])
    line = bad_input(outcome, "--dtype fp8", "dgx-a100", "A100: vLLM bf16;",
                     "H100:", "TensorRT-LLM bf16/fp8")
    assert "warning" not in line
    outcome = cli(["search", "--dtype", "fp8"])      # the default designs include A100s
    bad_input(outcome, "--dtype fp8", "dgx-a100")


def test_an_engine_without_tables_of_the_data_type_is_refused(cli, bad_input):
    with pytest.raises(InputError, match="no SGLang fp8 kernel data") as err:
        study_of(engine="sglang", dtype="fp8", designs=HOPPER)
    assert "H100: SGLang bf16" in str(err.value)
    outcome = cli(["search", "--engine", "sglang", "--dtype", "fp8", "--designs",
                   "splitwise-hh"])
    bad_input(outcome, "--engine sglang", "--dtype fp8", "H200:")


def test_bf16_engines_still_fall_back_with_a_warning(capsys):
    """bf16 has a 2023 model to fall back to (named in the report, marked uncalibrated)."""
    study = study_of(engine="trtllm", designs=("baseline-a100",))
    assert "no kernel data" in capsys.readouterr().err
    assert "dgx-a100: the splitwise-2023 model" in _source(study)


# -------------------------------------------------------------------------------- --kv-dtype
def test_kv_dtype_defaults_to_what_the_engine_does():
    bf16 = study_of(designs=HOPPER)
    vllm = study_of(dtype="fp8", designs=HOPPER)          # vLLM: --kv-cache-dtype auto = bf16
    trt = study_of(engine="trtllm", dtype="fp8", designs=HOPPER)   # the fp8 checkpoint's
    assert (vllm.perf.kv_dtype, trt.perf.kv_dtype) == ("bf16", "fp8")
    assert vllm.model.kv_bytes_per_token == bf16.model.kv_bytes_per_token
    assert trt.model.kv_bytes_per_token == bf16.model.kv_bytes_per_token / 2
    assert "fp8 weights, bf16 KV cache" in _source(vllm)
    assert "fp8 weights, fp8 KV cache" in _source(trt)


def test_kv_dtype_changes_kv_bytes_attention_echo_and_identity():
    bf16 = study_of(designs=HOPPER)
    kv8 = study_of(kv_dtype="fp8", designs=HOPPER)
    assert kv8.model.bytes_per_value == 2
    assert kv8.model.kv_bytes_per_token == bf16.model.kv_bytes_per_token / 2
    echo = to_echo(kv8)
    assert echo["options"]["kv_dtype"] == "fp8" and echo["perf_model"]["kv_dtype"] == "fp8"
    assert echo["model"]["kv_bytes_per_token"] == bf16.model.kv_bytes_per_token / 2
    assert identity(kv8) != identity(bf16)
    assert "kv_dtype" not in to_echo(bf16)["perf_model"]    # all-bf16 reports unchanged
    # the fp8-KV attention tables are read: decode attention over a long context is faster
    plain, fp8kv = load_tables("h100_sxm"), load_tables("h100_sxm", "vllm", "bf16", "fp8")
    assert fp8kv.generation_attention([64], 8192, 8, 1)[0] < \
        plain.generation_attention([64], 8192, 8, 1)[0]
    model = CATALOG.model("llama2-70b")
    assert iteration_time(model, fp8kv, 8, [], [8192] * 64) < \
        iteration_time(model, plain, 8, [], [8192] * 64)


def test_kv_dtype_fp8_is_refused_where_it_has_no_tables(cli, bad_input):
    with pytest.raises(InputError, match="kv-dtype"):
        study_of(engine="splitwise-2023", kv_dtype="fp8")
    outcome = cli(["search", "--kv-dtype", "fp8", "--designs", "baseline-a100"])
    bad_input(outcome, "--kv-dtype fp8", "dgx-a100", "A100: vLLM bf16")


# ------------------------------------------------------------------- anomalies of the database
def _derive_module():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import derive_kernel_tables
    finally:
        sys.path.pop(0)
    return derive_kernel_tables


def test_the_derivation_drops_latencies_that_fall_with_more_tokens():
    derive = _derive_module()
    curve = np.array([4.3, 6.7, 3.3, 3.5, np.nan, 9.0])   # 6.7 at m=8 vs 3.3 at m=16
    assert derive.spike_mask(curve, axis=0).tolist() == [False, True, False, False, False,
                                                         False]


def test_the_derivation_replaces_fp8_slower_than_bf16_and_says_so():
    derive = _derive_module()
    grid = {"m": [1, 2], "n": [32], "k": [32], "file": "x"}
    fp8 = derive.fp8_against_bf16({**grid, "us": [10.0, 30.0]}, {**grid, "us": [10.0, 10.0]})
    assert fp8["us"] == [10.0, 10.0]
    (note,) = fp8["anomalies"]
    assert note["kind"] == "fp8 slower than bf16" and note["cells"] == 1
    assert "bf16" in note["fallback"]


def test_hopper_fp8_moe_anomaly_is_recorded_and_left_out():
    tables = load_tables("h200_sxm", "vllm", "fp8")
    notes = [n for n in tables.document["anomalies"]
             if n["table"] == "moe" and n["shape"] == "4096/14336/8/2" and n["tp"] == 1]
    assert notes and "2,487 us against 752 us" in notes[0]["note"]
    mixtral = CATALOG.model("mixtral-8x7b")
    bf16 = load_tables("h200_sxm", "vllm", "bf16")
    for tokens in (1, 64, 512, 4096):
        assert tables.moe_layer([tokens], mixtral, 1)[0] <= \
            1.1 * bf16.moe_layer([tokens], mixtral, 1)[0]
        # a whole iteration: fp8 weights are no slower than bf16 (they were ~2-3x)
        assert iteration_time(mixtral, tables, 8, [tokens]) <= \
            1.1 * iteration_time(mixtral, bf16, 8, [tokens])
    source = _source(study_of(model="mixtral-8x7b", dtype="fp8", designs=("h200/h200",)))
    assert "database anomaly left out on h200_sxm: MoE 4096/14336/8/2" in source
    assert "used instead: the bf16 latency" in source
    doc = (REPO / "docs" / "kernel-data.md").read_text()
    assert "2,487" in doc and "not monotone in tokens" in doc


# ------------------------------------------------------------------------------ catalog --json
def test_catalog_json_gives_each_skus_latency_source(cli):
    outcome = cli(["catalog", "--json"])
    assert outcome.returncode == 0, outcome.stderr
    machines = {m["name"]: m for m in json.loads(outcome.stdout)["machines"]}
    for name in ("h200", "b200", "b300", "l40s", "dgx-h100", "dgx-a100"):
        source = machines[name]["latency_source"]
        assert "calibrated" not in machines[name]
        assert source["default"] == "kernel_tables:vllm:bf16", name
        tables = source["kernel_tables"]
        assert tables["database"] == "aiconfigurator-core 0.12.0"
        assert "bf16" in tables["engines"]["vllm"]["dtypes"]
    h200 = machines["h200"]["latency_source"]["kernel_tables"]["engines"]
    assert h200["vllm"]["versions"]["fp8"] == "0.24.0"
    assert h200["trtllm"]["dtypes"] == ["bf16", "fp8"] and "fp8" in h200["trtllm"]["kv_dtypes"]
    a100 = machines["dgx-a100"]["latency_source"]["kernel_tables"]["engines"]
    assert a100["vllm"]["dtypes"] == ["bf16"] and a100["vllm"]["kv_dtypes"] == ["bf16"]
    mi300x = machines["mi300x"]["latency_source"]
    assert mi300x["default"] == "splitwise-2023" and mi300x["kernel_tables"] is None
    assert mi300x["splitwise-2023"]["calibrated"] is False
