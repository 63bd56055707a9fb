"""Issue 36, first slice: MLA and modern mixture-of-experts models priced from the measured
tables (simcore.kernels): MLA attention from the MLA module tables, gpt-oss's head size 64 and
128-token windows from their attention tables, DeepSeek's shared experts and dense first
layers, the MoE layers from the MoE tables in the data type they are measured in; a shape the
tables do not hold is refused in one line naming what they hold, never estimated."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from hardware_catalog import InputError, load_catalog
from simcore.kernels import (EnginePerformanceModel, KernelPerformanceModel, ModelShapes,
                             _context_attention, _generation_attention, iteration_time,
                             load_tables, pricing_problem)
from simcore.perfmodel import default_performance_model

CATALOG = load_catalog()
R1 = replace(CATALOG.model("deepseek-r1"), bytes_per_value=1)      # --dtype fp8
OSS = CATALOG.model("gpt-oss-120b")
H200_FP8 = load_tables("h200_sxm", "vllm", "fp8")
H200 = load_tables("h200_sxm", "vllm", "bf16")


def _measured(table: dict, heads: int, batch: int, x: int, axis: str) -> float:
    grid = np.array(table["pairs"][f"{heads}/1"], dtype=float).reshape(
        len(table["batch"]), len(table[axis]))
    return grid[table["batch"].index(batch), table[axis].index(x)] * 1e-6


def test_mla_attention_is_the_measured_mla_module():
    """DeepSeek-R1 at TP8 (16 heads per GPU): a 4,096-token prompt's attention block and 64
    decodes at 4,097 tokens are the MLA module's measurements (no QKV/output GEMMs besides)."""
    shapes = ModelShapes(R1, 8)
    doc = H200_FP8.document
    assert float(_context_attention(H200_FP8, shapes, 1, 4096)) == pytest.approx(
        _measured(doc["mla_context"], 16, 1, 4096, "isl"))
    assert float(_generation_attention(H200_FP8, shapes, [64], 4097)[0]) == pytest.approx(
        _measured(doc["mla_generation"], 16, 64, 4097, "kv_tokens"))
    assert doc["mla_context"]["gemm_dtype"] == "fp8_block"
    gemms = shapes.gemms()   # router, shared expert up (gate+up) and down: no attention GEMMs
    assert gemms == [(256, 7168), (2 * 2048 // 8, 7168), (7168, 2048 // 8)]
    assert shapes.dense_mlp_gemms() == [(2 * 18432 // 8, 7168), (7168, 18432 // 8)]


def test_dense_first_layers_and_shared_experts_are_priced():
    no_shared = replace(R1, shared_experts=None)
    all_moe = replace(R1, dense_layers=0)
    t = iteration_time(R1, H200_FP8, 8, [2048])
    assert iteration_time(no_shared, H200_FP8, 8, [2048]) < t
    assert iteration_time(all_moe, H200_FP8, 8, [2048]) != t


def test_sliding_window_layers_read_the_window_tables():
    """gpt-oss-120b: half its layers attend to 128 tokens, so decode attention grows with the
    context at half the rate of its full-attention layers (and head size 64 is its own table)."""
    shapes = ModelShapes(OSS, 8)
    full = H200.variant("generation_attention_d64")
    window = H200.variant("generation_attention_d64_w128")
    mean = _generation_attention(H200, shapes, [32], 16385)[0]
    at = [g.seconds(32, [16385], 8, 1, "kv")[0] for g in (full, window)]
    assert mean == pytest.approx(0.5 * at[0] + 0.5 * at[1])
    assert at[1] < at[0]
    growth = (_generation_attention(H200, shapes, [32], 65537)[0]
              / _generation_attention(H200, shapes, [32], 4097)[0])
    full_growth = full.seconds(32, [65537], 8, 1, "kv")[0] / full.seconds(32, [4097], 8, 1,
                                                                          "kv")[0]
    assert growth < full_growth


@pytest.mark.parametrize("name,tables,dtype", [
    ("deepseek-r1", H200_FP8, "fp8_block"), ("kimi-k2", H200_FP8, "fp8_block"),
    ("gpt-oss-120b", H200, "w4a16_mxfp4"), ("qwen3-235b-a22b", H200, "bf16")])
def test_each_models_moe_layer_is_measured_and_named(name, tables, dtype):
    model = CATALOG.model(name)
    assert not pricing_problem(model, tables)
    assert f"({dtype}, power_law_1.01" in tables.moe_source(model)
    a, b = tables.moe_layer([64.0, 4096.0], model, 8)
    assert 0 < a < b


def test_a_shape_outside_the_data_is_refused_in_one_line_naming_what_exists():
    # DeepSeek's MoE is measured in block fp8 only: refused in bf16, pointing at the fp8 tables
    problem = pricing_problem(CATALOG.model("deepseek-r1"), H200)
    assert "7168/2048/256/8" in problem and "fp8" in problem and "measured:" in problem
    assert "\n" not in problem
    with pytest.raises(InputError, match="no measured MoE layer"):
        iteration_time(CATALOG.model("deepseek-r1"), H200, 8, [512])
    # A100's collection has no MLA module: refused naming the tables that have one
    a100 = load_tables("a100_sxm", "vllm", "bf16")
    problem = pricing_problem(CATALOG.model("deepseek-r1"), a100)
    assert "no measured MLA attention" in problem and "h200_sxm/vllm/fp8" in problem
    # with fp8 weights there is no other source: the engine model refuses
    engine = EnginePerformanceModel(KernelPerformanceModel("vllm", "fp8"),
                                    default_performance_model())
    fp8_r1 = replace(R1, name="r1-no-moe-table", experts=512)
    with pytest.raises(InputError, match="no measured MoE layer"):
        engine.curves(fp8_r1, CATALOG.machine("h200"), 8)


def test_a_deepseek_search_answers_with_tensor_parallel_layouts(cli, tmp_path):
    outcome = cli(["search", "--model", "deepseek-r1", "--designs", "h200/h200", "--dtype",
                   "fp8", "--duration", "20", "--verify-seeds", "2", "--out", tmp_path])
    assert outcome.code == 0, outcome.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["inputs"]["model"]["kv_bytes_per_token"] == 61 * 576 * 2
    design = report["designs"][0]
    assert design["feasible"]
    layout = design["optimum"]["layout"]
    assert {layout["prompt"]["tp"], layout["token"]["tp"]} <= {4, 8}
    source = next(a["value"] for a in report["assumptions"] if a["name"] == "latency_source")
    assert "MLA module" in source and "fp8_block" in source


def test_a_model_measured_in_another_dtype_is_refused_naming_it(cli):
    """DeepSeek-R1's MoE layer is measured in block fp8 only: a bf16 search is refused in one
    line that says so, not sized on the 2023 model."""
    outcome = cli(["search", "--model", "deepseek-r1", "--designs", "h200/h200",
                   "--duration", "20", "--verify-seeds", "2"])
    assert outcome.code == 2
    line = outcome.stderr.strip().splitlines()[-1]
    assert "7168/2048/256/8" in line and "--dtype fp8" in line and "measured:" in line
