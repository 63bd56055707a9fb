"""simcore.kernels against AIConfigurator's own estimator, and against the 2023 profiles.

    pip install aiconfigurator-core==0.12.0     # part (a) only
    python bench/kernel_validation.py aic        # (a) per-iteration: ours vs AicEngine
    python bench/kernel_validation.py splitwise  # (b) ours vs SplitwiseSim's 2023 profiles

(a) compiles AIConfigurator's engine (`EngineHandle.compile(hf model, system, backend,
tp_size=...)`) for the same model, GPU, TP and engine, and compares its
`predict_prefill_latency(1, isl, prefix)` (one prompt, or a chunk: isl includes the prefix)
and `predict_decode_latency(batch, isl, 2)` with `simcore.kernels.iteration_time` at the
same shapes (decodes holding isl + 1 tokens). Both are kernel sums from the same measured
tables; the differences are composition choices (see docs/kernel-data.md).

(b) reads /work/shared/profiles/splitwise_sim_perf_model.csv (vLLM of 2023, TP8; mean of the
repeated rows), prices the same (model, hardware, prompt size, batch) with the kernel model
(Llama2-70B and BLOOM-176B, their catalog shapes) and prints the speed-up per phase: prompt
(prompt_time, a batch of `batch_size` prompts of `prompt_size` tokens) and token (token_time,
one decode iteration of `batch_size` requests at context prompt_size + token_size / 2).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hardware_catalog import load_catalog  # noqa: E402
from simcore.kernels import Chunk, iteration_time, load_tables  # noqa: E402

CATALOG = load_catalog()
HF = {"llama-3.1-8b": "meta-llama/Meta-Llama-3.1-8B",
      "llama-3.1-70b": "meta-llama/Meta-Llama-3.1-70B",
      "llama-3.1-405b": "meta-llama/Meta-Llama-3.1-405B",
      "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
      "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1"}
CASES = [("llama-3.1-8b", "h100_sxm", 1), ("llama-3.1-70b", "h100_sxm", 8),
         ("llama-3.1-70b", "h100_sxm", 4), ("llama-3.1-70b", "a100_sxm", 8),
         ("llama-3.1-70b", "h200_sxm", 8), ("llama-3.1-70b", "b200_sxm", 8),
         ("llama-3.1-8b", "l40s", 2), ("llama-3.1-405b", "h200_sxm", 8),
         ("qwen3-30b-a3b", "h100_sxm", 4)]
PREFILL = (128, 512, 2048, 8192)
DECODE = (1, 16, 64, 256)
CONTEXT = 1024
SPLITWISE_CSV = Path("/work/shared/profiles/splitwise_sim_perf_model.csv")


def aic(engine: str = "vllm") -> None:
    import logging
    logging.disable(logging.WARNING)
    from aiconfigurator_core.sdk.engine import EngineHandle
    print("| model | GPU | TP | shape | AIC ms | ours ms | ours/AIC |")
    print("|---|---|---|---|---|---|---|")
    ratios = {"prefill": [], "chunk": [], "decode": []}
    for name, gpu, tp in CASES:
        model = CATALOG.model(name)
        tables = load_tables(gpu, engine, "bf16")
        kwargs = {"moe_tp_size": tp} if model.is_moe else {}
        handle = EngineHandle.compile(HF[name], gpu, engine, tp_size=tp, **kwargs)
        rows = []
        for isl in PREFILL:
            rows.append(("prefill", f"prefill {isl}", handle.predict_prefill_latency(1, isl),
                         iteration_time(model, tables, tp, [isl])))
        rows.append(("chunk", "chunk 512 @ 1536", handle.predict_prefill_latency(1, 2048, 1536),
                     iteration_time(model, tables, tp, [Chunk(512, 1536)])))
        for b in DECODE:
            rows.append(("decode", f"decode {b} @ {CONTEXT}",
                         handle.predict_decode_latency(b, CONTEXT, 2),
                         iteration_time(model, tables, tp, [], [CONTEXT + 1] * b)))
        for kind, shape, theirs, ours in rows:
            ratio = ours * 1e3 / theirs
            ratios[kind].append(ratio)
            print(f"| {name} | {gpu} | {tp} | {shape} | {theirs:.2f} | {ours * 1e3:.2f} | "
                  f"{ratio:.2f} |")
    # other engines and fp8 on one case: Llama-3.1-70B, H100, TP8
    model = CATALOG.model("llama-3.1-70b")
    for engine_, dtype, kwargs in (("sglang", "bf16", {}), ("trtllm", "bf16", {}),
                                   ("vllm", "fp8", {"gemm_quant_mode": "fp8"})):
        handle = EngineHandle.compile(HF[model.name], "h100_sxm", engine_, tp_size=8, **kwargs)
        tables = load_tables("h100_sxm", engine_, dtype)
        for isl in (512, 2048, 8192):
            theirs, ours = handle.predict_prefill_latency(1, isl), iteration_time(
                model, tables, 8, [isl])
            ratios["prefill"].append(ours * 1e3 / theirs)
            print(f"| {model.name} {engine_} {dtype} | h100_sxm | 8 | prefill {isl} | "
                  f"{theirs:.2f} | {ours * 1e3:.2f} | {ours * 1e3 / theirs:.2f} |")
        for b in (1, 64, 256):
            theirs = handle.predict_decode_latency(b, CONTEXT, 2)
            ours = iteration_time(model, tables, 8, [], [CONTEXT + 1] * b)
            ratios["decode"].append(ours * 1e3 / theirs)
            print(f"| {model.name} {engine_} {dtype} | h100_sxm | 8 | decode {b} @ {CONTEXT} | "
                  f"{theirs:.2f} | {ours * 1e3:.2f} | {ours * 1e3 / theirs:.2f} |")
    for kind, values in ratios.items():
        v = np.array(values)
        print(f"\n{kind}: ours/AIC median {np.median(v):.2f}, range {v.min():.2f}-{v.max():.2f}"
              f" over {len(v)} shapes", end="")
    print()


def splitwise() -> None:
    import pandas as pd
    frame = pd.read_csv(SPLITWISE_CSV)
    frame = frame[frame.tensor_parallel == 8]
    groups = frame.groupby(["model", "hardware", "prompt_size", "batch_size", "token_size"])[
        ["prompt_time", "token_time"]].mean().reset_index()
    gpu_of = {"a100-80gb": "a100_sxm", "h100-80gb": "h100_sxm"}
    rows = []
    for r in groups.itertuples():
        if r.hardware not in gpu_of:
            continue
        model, tables = CATALOG.model(r.model), load_tables(gpu_of[r.hardware], "vllm", "bf16")
        prompt = iteration_time(model, tables, 8, [int(r.prompt_size)] * int(r.batch_size))
        context = r.prompt_size + r.token_size / 2
        token = iteration_time(model, tables, 8, [], [context] * int(r.batch_size))
        rows.append((r.model, r.hardware, r.prompt_size, r.batch_size, r.prompt_time,
                     prompt * 1e3, r.token_time, token * 1e3))
    out = pd.DataFrame(rows, columns=["model", "hardware", "prompt", "batch", "prompt_2023_ms",
                                      "prompt_now_ms", "token_2023_ms", "token_now_ms"])
    out["prompt_speedup"] = out.prompt_2023_ms / out.prompt_now_ms
    out["token_speedup"] = out.token_2023_ms / out.token_now_ms
    summary = out.groupby(["model", "hardware"]).agg(
        rows=("prompt", "size"),
        prompt_median=("prompt_speedup", "median"), prompt_min=("prompt_speedup", "min"),
        prompt_max=("prompt_speedup", "max"), token_median=("token_speedup", "median"),
        token_min=("token_speedup", "min"), token_max=("token_speedup", "max"))
    print(_markdown(summary.round(2).reset_index()))
    pick = out[(out.batch.isin([1, 16])) & (out.prompt.isin([512, 2048, 8192]))]
    pick = pick.groupby(["model", "hardware", "prompt", "batch"]).mean().reset_index()
    print()
    print(_markdown(pick.round(2)))


def _markdown(frame) -> str:
    rows = [list(frame.columns)] + frame.astype(str).values.tolist()
    lines = ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    lines.insert(1, "|" + "---|" * len(frame.columns))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("aic", "splitwise"))
    parser.add_argument("--engine", default="vllm")
    args = parser.parse_args()
    if args.part == "aic":
        aic(args.engine)
    else:
        splitwise()
    return 0


if __name__ == "__main__":
    sys.exit(main())
