"""Issue 36 kernel tables: MoE at expert parallelism, all-to-all, GB200/GB300, fp4.

Reads the shipped JSON tables (simcore/data/kernels/) only; a test whose file is absent skips,
every other one asserts on data it found (none passes on an empty selection).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from simcore.kernels import KERNEL_DIR

DEEPSEEK = "7168/2048/256/8"


def _load(name: str) -> dict:
    path = KERNEL_DIR / f"{name}.json"
    if not path.is_file():
        pytest.skip(f"{path.name} is not shipped")
    return json.loads(path.read_text())


def _at(table: dict, tokens: int) -> float:
    assert tokens in table["tokens"], (tokens, table["tokens"])
    return table["us"][table["tokens"].index(tokens)]


def _gemm(doc: dict, m: int, n: int, k: int) -> float:
    g = doc["gemm"]
    grid = np.array(g["us"], dtype=float).reshape(len(g["m"]), len(g["n"]), len(g["k"]))
    return float(grid[g["m"].index(m), g["n"].index(n), g["k"].index(k)])


def test_every_expert_parallel_table_has_increasing_tokens_and_positive_latency():
    paths = sorted(KERNEL_DIR.glob("*.json"))
    if not paths:
        pytest.skip("no kernel tables shipped")
    seen = 0
    for path in paths:
        doc = json.loads(path.read_text())
        assert "moe_alltoall" in doc, path.name        # null where nothing is measured
        for key, shape in ((doc.get("moe") or {}).get("shapes") or {}).items():
            for kind in ("ep", "ep_balanced"):
                for ep, table in shape.get(kind, {}).items():
                    tokens = table["tokens"]
                    assert len(tokens) >= 2 and len(tokens) == len(table["us"])
                    assert all(a < b for a, b in zip(tokens, tokens[1:])), \
                        (path.name, key, kind, ep)
                    assert all(v is not None and v > 0 for v in table["us"]), \
                        (path.name, key, kind, ep)
                    assert int(ep) > 1
                    seen += 1
    assert seen > 100


def test_deepseek_expert_time_per_gpu_falls_as_ep_grows():
    """b200 vLLM fp8: num_tokens is the EP group's tokens, so at 4,096 tokens each GPU's
    share of the experts' work shrinks from EP 8 to EP 32 (fewer local experts, the same
    tokens routed among all)."""
    doc = _load("b200_sxm-vllm-fp8")
    shape = doc["moe"]["shapes"][DEEPSEEK]
    assert shape.get("moe_dtype") == "fp8_block"
    for kind in ("ep", "ep_balanced"):
        ep8, ep32 = _at(shape[kind]["8"], 4096), _at(shape[kind]["32"], 4096)
        assert ep32 < ep8, (kind, ep8, ep32)
    # and EP 8 at 4,096 tokens is cheaper per GPU than the whole layer on one GPU
    assert _at(shape["ep"]["8"], 4096) < _at(shape["tp"]["1"], 4096)


def _check_alltoall(entry: dict, shape: str, ep: str):
    assert entry is not None
    assert entry["node_num"] == 1 and entry["gpus_per_node"] == int(ep)
    assert set(entry["backend"]) == {"context", "generation"}
    assert shape in entry["measured_shapes"]
    table = entry["shapes"][shape][ep]
    for phase in ("context", "generation"):
        for comm in ("dispatch", "combine"):
            t = table[phase][comm]
            assert len(t["tokens"]) >= 2 and len(t["tokens"]) == len(t["us"])
            assert all(a < b for a, b in zip(t["tokens"], t["tokens"][1:]))
            assert all(v is not None and v > 0 for v in t["us"])
    # prefill's high-throughput kernels at many tokens take longer than at few
    ctx = table["context"]["dispatch"]
    assert ctx["us"][-1] > ctx["us"][0]


@pytest.mark.parametrize("name,ep", [("b200_sxm-vllm-fp8", "8"), ("h100_sxm-vllm-bf16", "8"),
                                     ("b200_sxm-trtllm-fp8", "8"), ("gb200-vllm-fp4", "4"),
                                     ("b200_sxm-sglang-bf16", "8"), ("gb200-sglang-bf16", "4")])
def test_alltoall_is_written_for_deepseek_within_one_node(name, ep):
    doc = _load(name)
    entry = doc["moe_alltoall"]
    _check_alltoall(entry, "7168/8/256", ep)
    if "sglang" in name:     # SGLang's DeepEP tables hold the Qwen3 and Mixtral shapes too
        for shape in ("2048/8/128", "4096/8/128", "4096/2/8"):
            _check_alltoall(entry, shape, ep)


def test_alltoall_is_null_where_not_measured():
    doc = _load("l40s-vllm-bf16")
    assert "moe_alltoall" in doc and doc["moe_alltoall"] is None


@pytest.mark.parametrize("engine", ["vllm", "trtllm"])
def test_fp4_gemm_of_a_large_square_shape_beats_fp8_on_b200(engine):
    fp4, fp8 = _load(f"b200_sxm-{engine}-fp4"), _load(f"b200_sxm-{engine}-fp8")
    assert fp4["gemm"]["gemm_dtype"] == "nvfp4" and fp4["dtype"] == "fp4"
    for m in (1024, 8192):
        assert _gemm(fp4, m, 8192, 8192) < _gemm(fp8, m, 8192, 8192), m
    # the fp4 file has the attention tables of the fp8 files and a bf16 sibling (LM head)
    assert fp4["context_attention"]["kv_cache_dtype"] == "bfloat16"
    assert "kv_fp8_context_attention" in fp4
    assert (KERNEL_DIR / f"b200_sxm-{engine}-bf16.json").is_file()


def test_rack_scale_gpus_have_bf16_and_fp8_files():
    for engine in ("vllm", "trtllm"):
        for dtype in ("bf16", "fp8"):
            doc = _load(f"gb200-{engine}-{dtype}")
            assert doc["gpu"] == "gb200" and doc["dtype"] == dtype
            assert doc["moe_alltoall"]["gpus_per_node"] == 4
