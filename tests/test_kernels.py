"""Kernel-level iteration model (simcore.kernels): composition, curves, chunk pricing, tables."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from hardware_catalog import InputError, load_catalog
from simcore.kernels import (KERNEL_DIR, Chunk, KernelPerformanceModel, available_tables,
                             iteration_time, load_tables, pricing_problem)
from simcore.latency import LatencyCurves

REPO = Path(__file__).resolve().parents[1]
CATALOG = load_catalog()
L70 = CATALOG.model("llama-3.1-70b")
H100 = load_tables("h100_sxm", "vllm", "bf16")
KERNELS = KernelPerformanceModel()
GPU_MACHINES = ("dgx-a100", "dgx-h100", "h200", "b200", "l40s")
# issue-36 models only where the tables measure their attention and MoE (elsewhere refused:
# tests/test_modern_models.py)
PAIRS = [(m, s) for m in CATALOG.models.values() for s in GPU_MACHINES
         if not pricing_problem(m, KERNELS.tables(CATALOG.machine(s)))]


def test_shipped_tables_cover_the_required_gpus_and_name_their_source():
    shipped = set(available_tables())
    for gpu in ("a100_sxm", "h100_sxm", "h200_sxm", "b200_sxm", "l40s"):
        assert (gpu, "vllm", "bf16") in shipped
    assert ("h100_sxm", "vllm", "fp8") in shipped and ("h100_sxm", "sglang", "bf16") in shipped
    total = 0
    for path in KERNEL_DIR.glob("*.json"):
        document = json.loads(path.read_text())
        assert document["source"] == "aiconfigurator-core" and document["version"] == "0.12.0"
        total += path.stat().st_size
    assert total < 10 * 2**20   # 46 files with EP, all-to-all, GB200/GB300 and fp4: 8.3 MiB


def test_a_chunked_prompt_is_not_priced_as_fresh_prompts():
    """Issue 24: 2,048 tokens in four 512-token chunks cost at most 1.3x one 2,048-token
    prefill (H100, TP8, Llama-3.1-70B); each later chunk attends to its cached prefix."""
    whole = iteration_time(L70, H100, 8, [2048])
    chunks = [iteration_time(L70, H100, 8, [Chunk(512, 512 * i)]) for i in range(4)]
    assert sum(chunks) <= 1.3 * whole
    # yet a chunk is dearer than a fresh 512-token prompt, and the more so the longer its prefix
    assert chunks[0] == pytest.approx(iteration_time(L70, H100, 8, [512]))
    assert chunks[0] < chunks[1] < chunks[2] < chunks[3]
    # and never cheaper in all than the whole prompt
    assert sum(chunks) >= whole
    # the tabulated curves price chunks the same way (within 10% of the composition)
    curves = KERNELS.curves(L70, CATALOG.machine("dgx-h100"))
    tabulated = sum(float(curves.prompt_time(512)) + curves.chunk_extra(512, 512 * i)
                    for i in range(4))
    assert tabulated == pytest.approx(sum(chunks), rel=0.1)


@pytest.mark.parametrize("model,machine", PAIRS, ids=[f"{m.name}@{s}" for m, s in PAIRS])
def test_curves_are_latency_curves_and_non_decreasing(model, machine):
    machine = CATALOG.machine(machine)
    assert KERNELS.is_calibrated(model, machine)
    curves = KERNELS.curves(model, machine)
    assert isinstance(curves, LatencyCurves)
    tokens = np.arange(0, 70000, 7.0)
    batch = np.arange(0, 5000, 1.0)
    assert np.all(np.diff(curves.prompt_time(tokens)) >= 0)
    assert np.all(np.diff(curves.token_time(batch, 0)) >= 0)
    assert np.all(np.diff(curves.token_time(8, np.arange(0, 1e6, 997.0))) >= 0)
    assert curves.context_seconds_per_token > 0 and curves.chunk_attention_s > 0
    # a decode is far cheaper per token than a prompt token at scale, dearer at batch 1
    assert curves.token_time(256, 0) / 256 < curves.prompt_time(1)


@pytest.mark.parametrize("tokens", [1, 64, 512, 2048, 8192])
def test_iteration_time_grows_with_prompt_tokens_and_decodes(tokens):
    t = iteration_time(L70, H100, 8, [tokens])
    assert iteration_time(L70, H100, 8, [tokens + 512]) > t
    assert iteration_time(L70, H100, 8, [tokens], [1000] * 32) > t
    assert iteration_time(L70, H100, 8, [], [4000] * 64) > iteration_time(L70, H100, 8, [],
                                                                            [1000] * 64)


def test_tensor_parallel_scaling_is_sane():
    prefill = [iteration_time(L70, H100, tp, [2048]) for tp in (1, 2, 4, 8)]
    decode = [iteration_time(L70, H100, tp, [], [1000] * 32) for tp in (1, 2, 4, 8)]
    for series in (prefill, decode):
        # more GPUs: faster, but never better than linear (all-reduces and fixed costs)
        assert all(a > b for a, b in zip(series, series[1:]))
        assert all(a / b < tp_ratio for a, b, tp_ratio in zip(series, series[1:], (2, 2, 2)))
    assert prefill[0] / prefill[3] > 2.5 and decode[0] / decode[3] > 3


def test_composition_agrees_with_the_roofline():
    """A 70B prefill of 8k tokens runs near the GEMM roofline, a batch-1 decode near the
    weight-read bound (H100: 989 TFLOP/s, 3.35 TB/s per GPU)."""
    t = iteration_time(L70, H100, 8, [8192])
    flops_bound = 2 * L70.params_b * 1e9 * 8192 / (8 * 989e12)
    assert 1.2 * flops_bound < t < 4 * flops_bound
    decode = iteration_time(L70, H100, 8, [], [1])
    read_bound = L70.params_b * 1e9 * 2 / (8 * 3.35e12)
    assert 1.0 * read_bound < decode < 3 * read_bound


def test_moe_model_costs_by_active_experts():
    qwen, dense = CATALOG.model("qwen3-30b-a3b"), CATALOG.model("llama-3.1-8b")
    assert qwen.is_moe
    # 3.35B active parameters: on one GPU a long prefill is cheaper than a dense 8B's (at TP8
    # the experts' GEMMs, 768 / 8 = 96 wide, run so inefficiently that the two meet)
    assert iteration_time(qwen, H100, 1, [8192]) < 0.8 * iteration_time(dense, H100, 1, [8192])
    moe = [float(H100.moe_layer(n, qwen, 8)) for n in (1, 64, 512, 8192)]
    assert moe == sorted(moe) and moe[-1] > 10 * moe[0]
    assert iteration_time(qwen, H100, 8, [], [100] * 64) > iteration_time(qwen, H100, 8, [],
                                                                          [100] * 1)


def test_fp8_and_other_engines_load():
    fp8 = load_tables("h100_sxm", "vllm", "fp8")
    assert iteration_time(L70, fp8, 8, [8192]) < iteration_time(L70, H100, 8, [8192])
    for engine in ("sglang", "trtllm"):
        assert iteration_time(L70, load_tables("h100_sxm", engine, "bf16"), 8, [2048]) > 0


def test_power_cap_and_unknown_gpu():
    capped = KERNELS.curves(L70, CATALOG.machine("dgx-h100-cap"))
    full = KERNELS.curves(L70, CATALOG.machine("dgx-h100"))
    assert capped.prompt_time(2048) == pytest.approx(1.3 * full.prompt_time(2048))
    assert capped.token_time(8, 0) == full.token_time(8, 0)
    assert not KERNELS.is_calibrated(L70, CATALOG.machine("mi300x"))
    with pytest.raises(InputError, match="no kernel tables"):
        KERNELS.curves(L70, CATALOG.machine("mi300x"))
    with pytest.raises(InputError, match="no kernel tables"):
        load_tables("h100_sxm", "vllm", "int3")


@pytest.mark.skipif(importlib.util.find_spec("aiconfigurator_core") is None,
                    reason="aiconfigurator-core is not installed")
def test_shipped_tables_re_derive_from_the_installed_package():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import derive_kernel_tables as derive
    finally:
        sys.path.remove(str(REPO / "scripts"))
    if derive.package_version() != "0.12.0":
        pytest.skip(f"tables were derived from 0.12.0, installed {derive.package_version()}")
    docs = derive.derive_all()
    assert set(docs) == {p.name for p in KERNEL_DIR.glob("*.json")}
    for name, doc in docs.items():
        assert json.loads((KERNEL_DIR / name).read_text()) == doc, name


@pytest.mark.parametrize("name,machine,gpu", [("llama-3.1-70b", "dgx-h100", "h100_sxm"),
                                              ("llama-3.1-8b", "l40s", "l40s"),
                                              ("qwen3-30b-a3b", "b200", "b200_sxm")])
def test_tabulated_curves_follow_the_composition(name, machine, gpu):
    """The simulator's view (one decode curve plus K per context token; mixed iterations as
    max(prompt, decode) + context) stays within 15% of the composition it was tabulated from."""
    model, tables = CATALOG.model(name), load_tables(gpu)
    curves = KERNELS.curves(model, CATALOG.machine(machine))
    for batch, context in ((1, 100), (1, 8000), (16, 2000), (64, 4000), (256, 1000),
                           (256, 8000)):
        composed = iteration_time(model, tables, 8, [], [context] * batch)
        assert float(curves.token_time(batch, batch * context)) == pytest.approx(composed,
                                                                               rel=0.15)
    for prompt, batch, context in ((512, 32, 2000), (2048, 64, 1000)):
        composed = iteration_time(model, tables, 8, [prompt], [context] * batch)
        tabulated = float(curves.mixed_time(prompt, batch, batch * context))
        assert tabulated == pytest.approx(composed, rel=0.05)
    for tokens in (1, 100, 2048, 20000):
        assert float(curves.prompt_time(tokens)) == pytest.approx(
            iteration_time(model, tables, 8, [tokens]), rel=0.01)
