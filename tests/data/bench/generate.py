"""Write the synthetic serving-benchmark fixtures of this folder (README.md beside it).

    PYTHONPATH=. python tests/data/bench/generate.py

Numbers come from provision's own model: the vLLM bf16 kernel curves of llama-3.1-8b on
dgx-h100, the steady-state predictions of `provisioner.servefit.predict` with the TRUE terms
below, and multiplicative noise (seeded). Rate runs get their concurrency by solving Little's
law c = rate x (TTFT + (osl - 1) x TPOT) with the same predictions.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from hardware_catalog import load_catalog  # noqa: E402
from provisioner.benchfiles import BenchRun  # noqa: E402
from provisioner.servefit import predict, price_runs  # noqa: E402
from provisioner.study import model_in_dtype  # noqa: E402
from simcore.kernels import KernelPerformanceModel  # noqa: E402

TRUE = {"iteration_s": 0.0015, "sequence_s": 20e-6, "first_token_s": 0.025,
        "prompt_scale": 1.0, "decode_scale": 1.0}
COMPOSITION = "serial"
NOISE = 0.02            # relative, per run mean (and per request in the detailed run)
MODEL_ID = "meta-llama/Llama-3.1-8B-Instruct"


def curves(tp: int):
    catalog = load_catalog()
    model = model_in_dtype(catalog.models["llama-3.1-8b"], "bf16", "bf16")
    return model, KernelPerformanceModel("vllm", "bf16").curves(model, catalog.machines["dgx-h100"], tp)


def truth(tp: int, c: float, isl: float, osl: float) -> tuple[float, float]:
    model, curve = curves(tp)
    run = BenchRun("", "", "", c, "", isl, osl, 1.0, 1.0, 1, None, False)
    return predict(price_runs([run], curve, model.layers)[0], TRUE, COMPOSITION)


def little(tp: int, rate: float, isl: float, osl: float) -> tuple[float, float, float]:
    c = 1.0
    for _ in range(200):
        tpot, ttft = truth(tp, c, isl, osl)
        c = 0.5 * c + 0.5 * rate * (ttft + (osl - 1) * tpot)
    tpot, ttft = truth(tp, c, isl, osl)
    return c, tpot, ttft


def stats(values_ms: np.ndarray, name: str) -> dict:
    out = {f"mean_{name}_ms": float(values_ms.mean()), f"median_{name}_ms": float(np.median(values_ms)),
           f"std_{name}_ms": float(values_ms.std())}
    for p in (50, 90, 99):
        out[f"p{p}_{name}_ms"] = float(np.percentile(values_ms, p))
    return out


def vllm_run(rng, rate: float, prompts: int, detailed: bool, isl=1024, osl=128, tp=1) -> dict:
    c, tpot, ttft = little(tp, rate, isl, osl)
    tpot *= 1 + NOISE * rng.standard_normal()
    ttft *= 1 + NOISE * rng.standard_normal()
    ins = rng.integers(int(isl * 0.9), int(isl * 1.1) + 1, prompts)
    outs = rng.integers(int(osl * 0.9), int(osl * 1.1) + 1, prompts)
    ttfts = ttft * (1 + NOISE * rng.standard_normal(prompts))
    itls = [list(np.round(tpot * (1 + NOISE * rng.standard_normal(o - 1)), 6)) for o in outs]
    tpots = np.array([np.mean(g) for g in itls])
    latencies = ttfts + np.array([np.sum(g) for g in itls])
    duration = prompts / rate
    result = {"date": "20250612-101500", "endpoint_type": "vllm", "backend": "vllm",
              "label": None, "model_id": MODEL_ID, "tokenizer_id": MODEL_ID,
              "num_prompts": prompts, "request_rate": rate, "burstiness": 1.0,
              "max_concurrency": None, "duration": duration, "completed": prompts, "failed": 0,
              "total_input_tokens": int(ins.sum()), "total_output_tokens": int(outs.sum()),
              "request_throughput": prompts / duration, "request_goodput": None,
              "output_throughput": outs.sum() / duration,
              "total_token_throughput": (ins.sum() + outs.sum()) / duration,
              "latencies": [round(x, 6) for x in latencies]}
    result.update(stats(ttfts * 1e3, "ttft"))
    result.update(stats(tpots * 1e3, "tpot"))
    result.update(stats(np.concatenate([np.array(g) for g in itls]) * 1e3, "itl"))
    result.update(stats(latencies * 1e3, "e2el"))
    result["max_output_tokens_per_s"] = float(outs.sum() / duration * 1.3)
    result["max_concurrent_requests"] = int(np.ceil(c * 1.5))
    if detailed:
        result.update({"input_lens": [int(x) for x in ins], "output_lens": [int(x) for x in outs],
                       "ttfts": [round(x, 6) for x in ttfts], "itls": itls,
                       "start_times": [round(i / rate, 4) for i in range(prompts)],
                       "generated_texts": [""] * prompts, "errors": [""] * prompts})
    return result


def distribution(values: np.ndarray) -> dict:
    pct = {k: float(np.percentile(values, q)) for k, q in
           (("p001", 0.1), ("p01", 1), ("p05", 5), ("p10", 10), ("p25", 25), ("p50", 50),
            ("p75", 75), ("p90", 90), ("p95", 95), ("p99", 99), ("p999", 99.9))}
    return {"mean": float(values.mean()), "median": float(np.median(values)),
            "mode": float(np.median(values)), "variance": float(values.var()),
            "std_dev": float(values.std()), "min": float(values.min()), "max": float(values.max()),
            "count": int(values.size), "total_sum": float(values.sum()), "percentiles": pct}


def status(values: np.ndarray) -> dict:
    return {"successful": distribution(values), "incomplete": None, "errored": None,
            "total": distribution(values)}


def guidellm_benchmark(rng, index: int, streams: int, isl=512, osl=256, tp=2,
                       requests=60, records=12) -> dict:
    tpot, ttft = truth(tp, streams, isl, osl)
    tpot *= 1 + NOISE * rng.standard_normal()
    ttft *= 1 + NOISE * rng.standard_normal()
    ttfts = ttft * (1 + NOISE * rng.standard_normal(requests)) * 1e3
    itls = tpot * (1 + NOISE * rng.standard_normal(requests)) * 1e3
    ins = rng.integers(int(isl * 0.95), int(isl * 1.05) + 1, requests).astype(float)
    outs = np.full(requests, float(osl))
    latency = (ttfts + itls * (outs - 1)) / 1e3
    duration = requests * latency.mean() / streams
    sample = [{"type_": "generative_request_stats", "request_id": f"req-{index}-{j}",
               "response_id": None, "request_args": None, "output": None,
               "info": {"timings": {"request_start": 1000.0 + j,
                                    "request_end": 1000.0 + j + float(latency[j])}},
               "input_metrics": {"text_tokens": int(ins[j])},
               "output_metrics": {"text_tokens": int(outs[j])},
               "prompt_tokens": int(ins[j]), "output_tokens": int(outs[j]),
               "total_tokens": int(ins[j] + outs[j]),
               "request_latency": float(latency[j]),
               "time_to_first_token_ms": float(ttfts[j]),
               "time_per_output_token_ms": float(latency[j] * 1e3 / outs[j]),
               "inter_token_latency_ms": float(itls[j])} for j in range(records)]
    return {
        "type_": "generative_benchmark",
        "config": {"id_": f"bench-{index}", "run_id": "run-0", "run_index": index,
                   "strategy": {"type_": "concurrent", "worker_count": min(streams, 8),
                                "max_concurrency": streams, "streams": streams,
                                "rampup_duration": 0.0},
                   "constraints": {"max_requests": {"max_num": requests}}, "sample_size": records},
        "start_time": 1000.0, "end_time": 1000.0 + duration, "duration": duration,
        "metrics": {
            "request_totals": {"successful": requests, "errored": 0, "incomplete": 0,
                               "total": requests},
            "requests_per_second": status(np.full(4, requests / duration)),
            "request_concurrency": status(np.full(4, float(streams))),
            "request_latency": status(latency),
            "prompt_token_count": status(ins), "output_token_count": status(outs),
            "total_token_count": status(ins + outs),
            "time_to_first_token_ms": status(ttfts),
            "time_per_output_token_ms": status(latency * 1e3 / outs),
            "inter_token_latency_ms": status(itls)},
        "requests": {"successful": sample, "incomplete": [], "errored": [], "total": None},
        "warnings": []}


def main() -> None:
    rng = np.random.default_rng(37)
    rates = (1.0, 2.0, 4.0, 8.0, 12.0)
    with open(HERE / "vllm-sweep.jsonl", "w") as handle:   # --append-result: one run a line
        for rate in rates:
            handle.write(json.dumps(vllm_run(rng, rate, 200, False)) + "\n")
    (HERE / "vllm-rate4-detailed.json").write_text(json.dumps(vllm_run(rng, 4.0, 40, True)))
    benchmarks = [guidellm_benchmark(rng, i, s) for i, s in enumerate((1, 4, 16, 32, 64))]
    report = {"metadata": {"version": 2, "guidellm_version": "0.8.1", "python_version": "3.12.3",
                           "platform": "Linux-x86_64"},
              "config": {"spec": {"backend": {"kind": "openai_http", "model": MODEL_ID}}},
              "benchmarks": benchmarks, "conclusions": []}
    (HERE / "guidellm-concurrent.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
