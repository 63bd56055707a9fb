"""Speculative decoding (issue 39): decode throughput and TPOT with and without it, per batch
size, on one dense and one MoE model, simulated by the fast core (checked against the
reference at every row), against published speed-ups.

Per (model, method, batch b): b requests (1,024-token prompts, 513-token outputs) are prefilled
on a prompt machine and all decode together on one token machine (the whole machine, vLLM
kernel tables, the engine's fitted overheads); TPOT is their mean (E2E - TTFT) / 512, decode
throughput b / TPOT tokens/s. Rows: plain decoding, then the method at its default acceptance
(simcore.specdecode: MTP 0.85 from the DeepSeek-V3 report; EAGLE 0.75 per position, k = 3).

    python bench/spec_decode_bench.py
"""
from __future__ import annotations

import dataclasses

import numpy as np

from hardware_catalog import load_catalog
from provisioner.options import StudyOptions
from provisioner.question import resolve_perf
from provisioner.study import model_in_dtype
from simcore import layout as layouts
from simcore.cluster import ROLE_PROMPT, ROLE_TOKEN, MachineArrays
from simcore.fastsim import simulate_fast
from simcore.refsim import simulate_reference
from simcore.specdecode import CONTEXT_UNITS, decode_steps, resolve, step_plan
from simcore.workload import Workload

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PROMPT, OUTPUT = 1024, 513
CASES = [  # model, machine, dtype, tp (None: the whole machine), methods, published
    ("llama-3.1-8b", "dgx-h100", "bf16", 1, ("eagle",),
     "EAGLE-3 (arXiv 2503.01840): 1.38x throughput at batch 64 in SGLang (Llama-3.1-8B, "
     "one H100)"),
    ("llama-3.1-70b", "dgx-h100", "bf16", None, ("eagle",),
     "EAGLE-3 (arXiv 2503.01840): ~3-4x speed-up at batch 1 on Llama-3.1 (MT-bench); "
     "1.38x throughput at batch 64 in SGLang (Llama-3.1-8B, H100)"),
    ("deepseek-v3", "h200", "fp8", None, ("mtp",),
     "DeepSeek-V3 report (arXiv 2412.19437, 5.4.3): MTP second-token acceptance 85-90%, "
     "1.8x TPS"),
]


def machines(curves, model) -> MachineArrays:
    return MachineArrays(
        role=np.array([ROLE_PROMPT, ROLE_TOKEN]), kind=np.zeros(2, np.int64),
        kv_capacity=np.array([10**9, 10**9], np.int64), link_bytes_per_s=np.full(2, 50e9),
        layerwise_visible_s=np.full(2, 0.005), curves=(curves,),
        kv_bytes_per_token=model.kv_bytes_per_token, layers=model.layers, mixed_pool=False,
        prompt_token_limit=10**9, queue_threshold=10**9, layerwise_min_prompt_tokens=512)


def tpot(curves, model, batch: int, spec=None) -> float:
    w = Workload("bench", np.zeros(batch), np.full(batch, PROMPT, np.int64),
                 np.full(batch, OUTPUT, np.int64))
    steps = None
    if spec is not None:
        curves = curves.with_spec_decode(spec.tokens, spec.draft_fraction, CONTEXT_UNITS)
        steps = step_plan(w.prompt_tokens, w.output_tokens,
                          decode_steps(w.output_tokens, spec, seed=0))
    m = machines(curves, model)
    fast = simulate_fast(w, m, steps=steps)
    ref = simulate_reference(w, m, steps=steps)
    for key in ("first_token_s", "finish_s"):
        np.testing.assert_array_equal(fast[key], ref[key])
    return float(np.mean((fast["finish_s"] - fast["first_token_s"]) / (OUTPUT - 1)))


def main() -> None:
    catalog = load_catalog()
    for name, sku, dtype, tp, methods, published in CASES:
        study = StudyOptions(model=name, dtype=dtype)
        source = resolve_perf(study)
        perf = source.load(catalog)
        model = model_in_dtype(catalog.model(name), dtype, source.kv_dtype)
        machine = catalog.machine(sku)
        layout = layouts.default_layout(model, machine, 0.10)
        if tp is not None:
            layout = dataclasses.replace(layout, tp=tp)
        curves = layouts.curves(perf, model, machine, layout)
        print(f"\n{name} ({dtype}) on {sku}, tp={layout.tp}; published: {published}")
        plain = {b: tpot(curves, model, b) for b in BATCHES}
        for method in methods:
            spec = resolve(method, None, None, model)
            print(f"  {spec.describe()}, drafting {spec.draft_fraction:.4f} x a decode "
                  "per drafted token")
            print(f"  {'batch':>5} {'TPOT ms':>8} {'spec ms':>8} {'tok/s':>9} "
                  f"{'spec tok/s':>10} {'speed-up':>8}")
            for b in BATCHES:
                fast = tpot(curves, model, b, spec)
                print(f"  {b:>5} {plain[b] * 1e3:>8.2f} {fast * 1e3:>8.2f} "
                      f"{b / plain[b]:>9.0f} {b / fast:>10.0f} {plain[b] / fast:>7.2f}x")


if __name__ == "__main__":
    main()
