"""Issue 36 follow-up: MLA attention with an fp8 KV cache. The fp8 (and fp4) kernel files carry
the MLA module measured with kv_cache_dtype fp8 (kv_fp8_mla_context / kv_fp8_mla_generation,
bf16 queries, the file's GEMM data type); `--kv-dtype fp8` prices DeepSeek-R1 from them, its KV
cache holds half the bytes, and where the tables lack them the refusal names the fp8-KV ones."""
from __future__ import annotations

import json

import pytest

from hardware_catalog import load_catalog
from provisioner.study import model_in_dtype
from simcore.kernels import (ModelShapes, _generation_attention, load_tables,
                             pricing_problem)

CATALOG = load_catalog()
R1 = CATALOG.model("deepseek-r1")
R1_FP8_KV = model_in_dtype(R1, "fp8", "fp8")
R1_BF16_KV = model_in_dtype(R1, "fp8", "bf16")


@pytest.mark.parametrize("engine", ["vllm", "trtllm"])
def test_fp8_kv_mla_decode_attention_is_faster_than_bf16_kv_on_b200(engine):
    """64 decodes at 8k context, TP8 (16 heads per GPU): the fp8-KV MLA module is faster
    (measured 0.645x bf16 KV under vLLM 0.24, 0.611x under TensorRT-LLM 1.3.0rc20)."""
    bf16_kv = load_tables("b200_sxm", engine, "fp8")
    fp8_kv = load_tables("b200_sxm", engine, "fp8", "fp8")
    table = fp8_kv.document["kv_fp8_mla_generation"]
    assert table["kv_cache_dtype"] == "fp8" and table["gemm_dtype"] == "fp8_block"
    assert fp8_kv.mla_keys == ("kv_fp8_mla_context", "kv_fp8_mla_generation")
    slow = float(_generation_attention(bf16_kv, ModelShapes(R1_BF16_KV, 8), [64], 8192)[0])
    fast = float(_generation_attention(fp8_kv, ModelShapes(R1_FP8_KV, 8), [64], 8192)[0])
    assert fast < 0.8 * slow
    assert "fp8 KV" in fp8_kv.model_note(R1_FP8_KV)
    assert "bf16 KV" in bf16_kv.model_note(R1_BF16_KV)


def test_the_kv_bytes_per_token_halve():
    assert R1_BF16_KV.kv_bytes_per_token == 61 * 576 * 2 == 70_272
    assert R1_FP8_KV.kv_bytes_per_token == 35_136


def test_missing_fp8_kv_mla_tables_are_named():
    """L40S's vLLM collection measures the MLA module with a bf16 KV cache only."""
    problem = pricing_problem(R1_FP8_KV, load_tables("l40s", "vllm", "fp8", "fp8"))
    assert "no measured MLA attention" in problem and "kv_fp8_mla_context" in problem
    assert "fp8-KV MLA tables" in problem and "b200_sxm/vllm/fp8" in problem
    assert "\n" not in problem


def test_vllm_with_an_fp8_kv_cache_answers_for_deepseek(cli, tmp_path):
    outcome = cli(["search", "--model", "deepseek-r1", "--dtype", "fp8", "--engine", "vllm",
                   "--kv-dtype", "fp8", "--hardware", "b200", "--duration", "10",
                   "--verify-seeds", "2", "--no-cache", "--quiet", "--out", tmp_path])
    assert outcome.code == 0, outcome.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["inputs"]["model"]["kv_bytes_per_token"] == 35_136
    assert any(d["feasible"] for d in report["designs"])
    source = next(a["value"] for a in report["assumptions"] if a["name"] == "latency_source")
    assert "MLA module" in source and "fp8 KV" in source


def test_trtllm_fp8_is_no_longer_refused_for_its_mla_attention(cli, tmp_path):
    """TensorRT-LLM's auto KV is fp8 for fp8 weights: the MLA attention is now priced, but its
    B200 MoE collection (1.3.0rc23, the newest) has no DeepSeek MoE shape, so the search is
    still refused, naming the MoE layer."""
    outcome = cli(["search", "--model", "deepseek-r1", "--dtype", "fp8", "--engine", "trtllm",
                   "--hardware", "b200", "--duration", "10", "--verify-seeds", "2",
                   "--no-cache", "--quiet", "--out", tmp_path])
    if outcome.code == 0:
        return
    line = outcome.stderr.strip().splitlines()[-1]
    assert "MLA" not in line and "no measured MoE layer" in line
    assert pricing_problem(R1_FP8_KV, load_tables("b200_sxm", "trtllm", "fp8", "fp8")) \
        .startswith("no measured MoE layer")
