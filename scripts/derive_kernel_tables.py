"""Derive the compact kernel tables of `simcore.kernels` from an installed aiconfigurator-core.

    pip install aiconfigurator-core==0.12.0
    python scripts/derive_kernel_tables.py            # writes simcore/data/kernels/*.json
    python scripts/derive_kernel_tables.py --check    # re-derives and compares, writes nothing

aiconfigurator-core (NVIDIA, Apache-2.0) ships kernel timings measured on real GPUs as parquet
files under aiconfigurator_core/systems/data/<gpu>/<op>/<engine>/<version>/ (see
docs/kernel-data.md). This script keeps only what the iteration composition needs, per (GPU,
engine, data type), and writes one JSON file each with its source and versions named:

- gemm: latency over the package's (m, n, k) grid for one kernel source of the data type (m
  thinned to GEMM_M; n and k as measured); holes of the grid are filled by interpolation along
  m (log-log), then n and k (linear), and their count is recorded;
- context_attention / generation_attention: head_dim 128, no sliding window, bf16 KV cache,
  for the (query heads, KV heads) pairs whose group ratio some catalog model has, over (batch,
  sequence length) and (batch, KV length) as measured (null where not measured);
- all_reduce: the engine's custom all-reduce (CUDA-graph variant where both are measured, the
  eager one as well) by message size (in values, bf16 elements: the package's message_size
  is the tensor's element count, as its models query it with tokens x hidden) and GPU count,
  else NCCL's; nccl_all_reduce: NCCL's
  (the engines use it beyond their custom all-reduce's buffer);
- moe: the MoE layer of every catalog MoE model (its hidden, expert width, experts, top-k) at
  moe_tp 1/2/4/8, ep 1, power_law_1.01 routing (AIConfigurator's default; balanced where
  that is not measured);
  the data type of the file, else the next of MOE_DTYPES that measures the shape (named in
  the shape's `moe_dtype`: DeepSeek/Kimi in fp8_block, gpt-oss in w4a16_mxfp4);
- context_attention_d<head_dim>[_w<window>] / generation_...: the attention tables for the
  catalog models with another head size or a sliding window (gpt-oss: d64 and d64_w128);
- mla_context / mla_generation: the MLA attention module (latent projections, attention,
  output projection; DeepSeek-V3's shapes) per GPU heads, bf16 KV, its GEMMs in bf16 or
  (fp8 files) fp8_block, where the engine's collection has it (issue 36);
- memory: the system's HBM bandwidth and AIConfigurator's empirical memory-op constants, for
  the element-wise ops (norms, activation, embedding) that have no table;
- fp8 files also carry kv_fp8_context_attention / kv_fp8_generation_attention: the same
  attention tables with an fp8 KV cache (bf16 queries), for --kv-dtype fp8.
- fp8 and fp4 files with those also carry kv_fp8_mla_context / kv_fp8_mla_generation (issue
  36 follow-up; added last, the other keys unchanged): the MLA module tables measured with
  kv_cache_dtype fp8 and bf16 queries (mla_dtype bfloat16), GEMMs as the file's mla_context,
  where the engine's collection has them (not L40S).

Issue 36, second part (keys added only: the older files' other keys are unchanged):
- moe.shapes[<hidden>/<inter>/<experts>/<topk>].ep / .ep_balanced: {"<ep>": {"tokens",
  "us"}} for ep in MOE_EP (as measured: up to the expert count), rows with moe_tp_size 1 and
  moe_ep_size ep, the shape's moe_dtype, power_law_1.01 (ep) or balanced (ep_balanced, for
  expert load balancing) routing, tokens thinned to MOE_EP_TOKENS; the tp tables' kernel source
  where measured, else the EP rows' own (named in ep_kernel_source / ep_balanced_kernel_source).
  The latency is one GPU's: its num_experts / ep experts. **num_tokens is the token count
  entering the MoE layer of the whole EP group** (every attention-DP rank's tokens, after
  the dispatch gathered them), not one rank's: AIConfigurator's collector routes num_tokens
  tokens over all num_experts and times the rank's local experts (expert map), and its query
  multiplies the per-rank tokens by attention_dp_size (sdk/operations/moe_comm.py lines
  324-327, MoEExpertCompute: "scales tokens by attention_dp_size (attention DP globalizes
  tokens through the A2A dispatch - the same scaling as the legacy MoE ... query paths)";
  sdk/operations/moe.py line 108: "the A2A dispatch globalizes tokens across all (cp*ep)
  ranks, so expert compute sees the full token set"). Same anomaly handling as the tp rows;
  their notes go to the file's moe_ep_anomalies (table "moe_ep", with ep and distribution).
- moe_alltoall: MoE dispatch and combine within one node (node_num 1) or null where the
  engine's collection on the GPU has none (A100, L40S): {"file", "files": {phase: path},
  "engine_version", "kernel_source", "backend": {"context": DeepEP high-throughput,
  "generation": DeepEP low-latency}, "sms", "comm_dtype", "node_num": 1, "gpus_per_node",
  "tokens", "measured_shapes", "shapes": {"<hidden>/<topk>/<experts>": {"<ep>": {"context":
  {"dispatch": {"tokens", "us"}, "combine": {...}}, "generation": {...}}}}} for the catalog
  shapes measured exactly. vLLM and TensorRT-LLM: comm/<engine>/<v>/moe_a2a_perf.parquet
  (ep 8, GB200/GB300 ep 4 = one node); SGLang: wideep_deepep_normal (context) and
  wideep_deepep_ll (generation), which have no ep column: the node's GPUs (system yaml).
  High-throughput kernels at A2A_HT_SMS SMs (SGLang: dispatch and combine sms 20); TensorRT-
  LLM's wire data type as AIConfigurator's communication_dtype_for picks it for the file's
  data type. Tokens are per rank (moe_comm.py lines 225-226: "Comm ops see per-rank token
  counts ... never by attention_dp_size"). The package's a2a latency is already in
  microseconds (latency = transmit_us + notify_us; DeepEP LL dispatch of one token 47 us),
  kept with 4 significant digits.
- GB200 and GB300 (NVL72 trays of 4 GPUs): files like B200's (vLLM and TensorRT-LLM bf16 and
  fp8, SGLang bf16).
- fp4 files (B200, B300, GB200, GB300; vLLM, SGLang, TensorRT-LLM): nvfp4 GEMMs (TensorRT-LLM
  and SGLang measure n, k from 128), MoE in nvfp4 where measured (else w4a16_mxfp4, fp8,
  fp8_block, named per shape), MLA with nvfp4 GEMMs, attention as the fp8 files (bf16 KV
  tables and kv_fp8_*); the LM head reads the bf16 file of the same GPU and engine (SGLang
  bf16 on B300 is written for it). fp4 slower than bf16 is handled like fp8 (compared on the
  common grid).

Anomalies of the database are checked and left out, each with a note in the file's
`anomalies` list (docs/kernel-data.md lists them):
- latency not monotone in tokens: a GEMM measurement (along m) or MoE measurement (along
  tokens) more than SPIKE times the latency of a larger token count (more work cannot take
  less than half the time) is dropped; a GEMM hole is filled like the grid's other holes,
  an MoE point is simply absent;
- fp8 slower than bf16 for the same shape: an fp8 GEMM cell or MoE point more than
  FP8_TOLERANCE slower than the bf16 measurement of the same (m, n, k) or (shape, moe_tp,
  tokens) of the same GPU and engine takes the bf16 latency (fp8 moves half the bytes for
  the same math; the report names this fallback).

Latencies are stored in microseconds with 4 significant digits (the package's are ms, but
for the all-to-all tables, which are in us).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from importlib import metadata
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OUT = ROOT / "simcore" / "data" / "kernels"
FORMAT = "provision-kernel-tables/1"
GPUS = ("a100_sxm", "h100_sxm", "h200_sxm", "b200_sxm", "b300_sxm", "l40s", "gb200", "gb300")
# GPUs whose TensorRT-LLM collection has fp8 GEMMs (A100's 1.0.0 collection has none)
TRTLLM_FP8_GPUS = ("h100_sxm", "h200_sxm", "b200_sxm", "b300_sxm", "l40s", "gb200", "gb300")
# Blackwell GPUs with nvfp4 GEMMs (issue 36): fp4 files for every engine whose GEMM
# collection has nvfp4 rows (all three), each beside a bf16 file of the same engine (LM head)
FP4_GPUS = ("b200_sxm", "b300_sxm", "gb200", "gb300")
SGLANG_BF16_GPUS = ("h100_sxm", "b200_sxm", "b300_sxm", "gb200", "gb300")
# (gpu, engine, dtype) files written: vLLM everywhere (bf16, fp8 where the GPU has fp8 GEMMs),
# SGLang bf16 on H100, B200, B300, GB200, GB300, TensorRT-LLM bf16 and fp8 where it has fp8
# GEMMs (its bf16 tables there too: the LM head runs in bf16), fp4 on FP4_GPUS.
TARGETS = ([(g, "vllm", d) for g in GPUS for d in ("bf16", "fp8")]
           + [(g, "sglang", "bf16") for g in SGLANG_BF16_GPUS]
           + [(g, "trtllm", d) for g in TRTLLM_FP8_GPUS for d in ("bf16", "fp8")]
           + [(g, e, "fp4") for g in FP4_GPUS for e in ("vllm", "sglang", "trtllm")])
GEMM_DTYPE = {"bf16": "bfloat16", "fp8": "fp8", "fp4": "nvfp4"}
GEMM_M = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 256, 384, 512, 768, 1024, 1536, 2048,
          2560, 3072, 3584, 4096, 6144, 8192, 12288, 16384, 32768)
HEAD_DIM = 128
MOE_TP = (1, 2, 4, 8)
MOE_EP = (2, 4, 8, 16, 32, 64, 128, 256)
# token counts kept in the expert-parallel MoE tables (the package measures 27, 1-16384)
MOE_EP_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768,
                 65536)
SPIKE = 2.0            # a latency above SPIKE x that of more tokens is a broken measurement
FP8_TOLERANCE = 0.10   # fp8 slower than bf16 by more than this (timing noise) is an anomaly


def package_dir() -> Path:
    import aiconfigurator_core
    return Path(aiconfigurator_core.__file__).resolve().parent


def package_version() -> str:
    return metadata.version("aiconfigurator-core")


def _version_key(text: str):
    from packaging.version import InvalidVersion, Version
    try:
        return (1, Version(text))
    except InvalidVersion:
        return (0, text)


def newest(base: Path, filename: str) -> Path | None:
    """The parquet `filename` of the newest version directory under `base` that has it."""
    if not base.is_dir():
        return None
    versions = sorted((d for d in base.iterdir() if (d / filename).is_file()),
                      key=lambda d: _version_key(d.name))
    return versions[-1] / filename if versions else None


def us(values) -> list:
    """ms -> microseconds, 4 significant digits; NaN -> None."""
    out = []
    for v in np.asarray(values, dtype=float).ravel():
        out.append(None if not math.isfinite(v) else float(f"{v * 1000.0:.4g}"))
    return out


def us_from_us(values) -> list:
    """microseconds (the all-to-all tables' unit) -> 4 significant digits; NaN -> None."""
    return [None if not math.isfinite(v) else float(f"{v:.4g}")
            for v in np.asarray(values, dtype=float).ravel()]


def _rel(path: Path, root: Path) -> str:
    return str(path.relative_to(root))


def _dominant(frame, column: str):
    return frame[column].value_counts().idxmax()


def _fill_line(y: np.ndarray, x: np.ndarray, log: bool) -> np.ndarray:
    ok = np.isfinite(y)
    if ok.sum() < 2 or ok.all():
        return y
    xs = np.log(x) if log else x.astype(float)
    ys = np.log(y[ok]) if log else y[ok]
    filled = np.interp(xs, xs[ok], ys)
    filled = np.exp(filled) if log else filled
    return np.where(ok, y, filled)


def fill_grid(grid: np.ndarray, axes: list[np.ndarray]) -> np.ndarray:
    """Fill NaN holes: along m (log-log), then n and k (linear), repeated while it helps."""
    grid = grid.copy()
    for _ in range(4):
        if not np.isnan(grid).any():
            break
        for axis, log in ((0, True), (1, False), (2, False)):
            grid = np.apply_along_axis(_fill_line, axis, grid, axes[axis], log)
    return grid


def derive_gemm(data: Path, root: Path, engine: str, dtype: str) -> dict | None:
    import pandas as pd
    path = newest(data / "gemm" / engine, "gemm_perf.parquet")
    if path is None:
        return None
    frame = pd.read_parquet(path)
    frame = frame[frame.gemm_dtype == GEMM_DTYPE[dtype]]
    if frame.empty:
        return None
    source = _dominant(frame, "kernel_source")
    frame = frame[frame.kernel_source == source]
    ms = [m for m in GEMM_M if m in set(frame.m)]
    ns, ks = sorted(set(frame.n)), sorted(set(frame.k))
    frame = frame[frame.m.isin(ms)].groupby(["m", "n", "k"]).latency.min()
    grid = np.full((len(ms), len(ns), len(ks)), np.nan)
    index = {v: i for i, v in enumerate(ms)}, {v: i for i, v in enumerate(ns)}, \
        {v: i for i, v in enumerate(ks)}
    for (m, n, k), value in frame.items():
        grid[index[0][m], index[1][n], index[2][k]] = value
    holes = int(np.isnan(grid).sum())
    spikes = spike_mask(grid, axis=0)
    grid[spikes] = np.nan
    grid = fill_grid(grid, [np.array(ms), np.array(ns), np.array(ks)])
    out = {"file": _rel(path, root), "engine_version": path.parent.name,
           "kernel_source": source, "gemm_dtype": GEMM_DTYPE[dtype], "m": ms, "n": ns, "k": ks,
           "filled_holes": holes, "us": us(grid)}
    if spikes.any():
        out["anomalies"] = [{
            "table": "gemm", "kind": "not monotone in tokens", "cells": int(spikes.sum()),
            "of": int(grid.size),
            "note": (f"{int(spikes.sum())} measurements more than {SPIKE:g}x the latency of a "
                     "larger m at the same (n, k) left out"),
            "fallback": "interpolated along m like the grid's holes",
            "cells_by_nk": spikes.sum(axis=0).astype(int).tolist()}]
    return out


def spike_mask(values: np.ndarray, axis: int) -> np.ndarray:
    """Measurements more than SPIKE times the smallest latency at a larger token count along
    `axis` (NaN-safe): latency must not fall that far with more work."""
    flipped = np.flip(values, axis=axis)
    filled = np.where(np.isnan(flipped), np.inf, flipped)
    later = np.minimum.accumulate(filled, axis=axis)
    # the minimum over strictly larger token counts: shift by one along the axis
    later = np.flip(later, axis=axis)
    shifted = np.full(values.shape, np.inf)
    index = [slice(None)] * values.ndim
    source = [slice(None)] * values.ndim
    index[axis], source[axis] = slice(0, -1), slice(1, None)
    shifted[tuple(index)] = later[tuple(source)]
    with np.errstate(invalid="ignore"):
        return np.isfinite(values) & (values > SPIKE * shifted)


def _on_grid(table: dict, grid: dict) -> np.ndarray:
    """`table`'s latencies at the (m, n, k) cells of `grid` (NaN where `table` lacks one)."""
    values = np.array(table["us"], dtype=float).reshape(
        len(table["m"]), len(table["n"]), len(table["k"]))
    out = np.full((len(grid["m"]), len(grid["n"]), len(grid["k"])), np.nan)
    axes = [[(i, table[a].index(v)) for i, v in enumerate(grid[a]) if v in table[a]]
            for a in ("m", "n", "k")]
    for i, ti in axes[0]:
        for j, tj in axes[1]:
            for k, tk in axes[2]:
                out[i, j, k] = values[ti, tj, tk]
    return out.ravel()


def fp8_against_bf16(fp8: dict, bf16: dict, dtype: str = "fp8") -> dict:
    """fp8 (or fp4) GEMM cells more than FP8_TOLERANCE slower than bf16 at the same (m, n, k)
    take the bf16 latency; the count is recorded as an anomaly. fp4 grids may be smaller than
    bf16's (TensorRT-LLM and SGLang measure nvfp4 from n, k = 128): compared where both are."""
    a = np.array(fp8["us"], dtype=float)
    if (fp8["m"], fp8["n"], fp8["k"]) == (bf16["m"], bf16["n"], bf16["k"]):
        b = np.array(bf16["us"], dtype=float)
    elif dtype != "fp8":
        b = _on_grid(bf16, fp8)
    else:
        raise SystemExit(f"fp8 and bf16 GEMM grids differ ({fp8['file']}): cannot compare")
    with np.errstate(invalid="ignore"):
        slow = a > b * (1.0 + FP8_TOLERANCE)
    if not slow.any():
        return fp8
    ratio = a[slow] / b[slow]
    out = dict(fp8, us=[float(v) for v in np.where(slow, b, a)])
    notes = list(fp8.get("anomalies", []))
    notes.append({
        "table": "gemm", "kind": f"{dtype} slower than bf16", "cells": int(slow.sum()),
        "of": int(slow.size),
        "note": (f"{int(slow.sum())} of {slow.size} {dtype} cells more than "
                 f"{FP8_TOLERANCE:.0%} slower than bf16 at the same (m, n, k) (median "
                 f"x{float(np.median(ratio)):.2f}, at most x{float(ratio.max()):.2f})"),
        "fallback": "the bf16 latency of the same (m, n, k)",
        "cells_by_nk": slow.reshape(len(fp8["m"]), len(fp8["n"]), len(fp8["k"]))
                           .sum(axis=0).astype(int).tolist()})
    out["anomalies"] = notes
    return out


def _attention(path: Path, root: Path, ratios: set[int], x_column: str,
               kv_dtype: str = "bfloat16", head_dim: int = HEAD_DIM,
               window: int = 0) -> dict | None:
    import pandas as pd
    frame = pd.read_parquet(path)
    if "window_size" not in frame.columns:      # older collections: no sliding window column
        frame = frame.assign(window_size=0)
    frame = frame[(frame.head_dim == head_dim) & (frame.window_size == window)
                  & (frame.kv_cache_dtype == kv_dtype)]
    if kv_dtype != "bfloat16":                        # bf16 queries, as with a bf16 KV cache
        frame = frame[frame.attn_dtype == "bfloat16"]
    if frame.empty:
        return None
    frame = frame[(frame.num_heads % frame.num_key_value_heads == 0)
                  & (frame.num_heads // frame.num_key_value_heads).isin(ratios)]
    source = _dominant(frame, "kernel_source")
    frame = frame[frame.kernel_source == source]
    if x_column == "kv":
        frame = frame.assign(kv=frame.isl + frame.step)
    batches, xs = sorted(set(frame.batch_size)), sorted(set(frame[x_column]))
    pairs = {}
    for (h, kv), group in frame.groupby(["num_heads", "num_key_value_heads"]):
        values = group.groupby(["batch_size", x_column]).latency.min()
        grid = np.full((len(batches), len(xs)), np.nan)
        for (b, x), v in values.items():
            grid[batches.index(b), xs.index(x)] = v
        pairs[f"{h}/{kv}"] = us(grid)
    out = {"file": _rel(path, root), "engine_version": path.parent.name,
           "kernel_source": source, "head_dim": head_dim, "kv_cache_dtype": kv_dtype,
           "batch": batches, ("isl" if x_column == "isl" else "kv_tokens"): xs,
           "pairs": pairs}
    if window:
        out["window"] = window
    return out


def attention_variants(catalog) -> dict[tuple[int, int], set[int]]:
    """(head_dim, window) -> group ratios of the catalog's models whose attention is not the
    default head_dim 128 without a window (gpt-oss: head_dim 64, full and 128-token window
    layers); MLA models read the MLA tables instead."""
    out: dict[tuple[int, int], set[int]] = {}
    for m in catalog.models.values():
        if m.is_mla or (m.head_dim == HEAD_DIM and not m.sliding_layers):
            continue
        for window in {0, m.sliding_window or 0}:
            out.setdefault((m.head_dim, window), set()).add(m.heads // m.kv_heads)
    return out


def attention_key(kind: str, head_dim: int, window: int) -> str:
    """Document key of an attention table variant, e.g. context_attention_d64_w128."""
    return f"{kind}_attention_d{head_dim}" + (f"_w{window}" if window else "")


def derive_attention_variants(data: Path, root: Path, engine: str, catalog) -> dict:
    out = {}
    base = data / "attention" / engine
    ctx = newest(base, "context_attention_perf.parquet")
    gen = newest(base, "generation_attention_perf.parquet")
    if ctx is None or gen is None:
        return out
    for (head_dim, window), ratios in sorted(attention_variants(catalog).items()):
        context = _attention(ctx, root, ratios, "isl", head_dim=head_dim, window=window)
        generation = _attention(gen, root, ratios, "kv", head_dim=head_dim, window=window)
        if context and generation:
            out[attention_key("context", head_dim, window)] = context
            out[attention_key("generation", head_dim, window)] = generation
    return out


MLA_GEMM_DTYPE = {"bf16": "bfloat16", "fp8": "fp8_block",   # DeepSeek's fp8 is block-scaled
                  "fp4": "nvfp4"}


def derive_mla(data: Path, root: Path, engine: str, dtype: str,
               kv: str = "bfloat16") -> dict:
    """MLA attention blocks (the whole attention module of DeepSeek-V3's shapes: query and KV
    latent projections, attention, output projection) per GPU heads, bf16 KV, the module's
    GEMMs in bf16 or (fp8 files) fp8_block. With kv "fp8": the same module measured with an
    fp8 KV cache and bf16 queries (mla_dtype bfloat16, as the kv_fp8 attention tables), keys
    kv_fp8_mla_context / kv_fp8_mla_generation."""
    import pandas as pd
    out = {}
    prefix = "" if kv == "bfloat16" else f"kv_{kv}_"
    base = data / "mla" / engine
    for kind, filename, x_column in (
            ("context", "mla_context_module_perf.parquet", "isl"),
            ("generation", "mla_generation_module_perf.parquet", "kv")):
        path = newest(base, filename)
        if path is None:
            return {}
        frame = pd.read_parquet(path)
        frame = frame[(frame.gemm_type == MLA_GEMM_DTYPE[dtype])
                      & (frame.kv_cache_dtype == kv) & (frame.tp_size == 1)]
        if kv != "bfloat16":                          # bf16 queries, as with a bf16 KV cache
            frame = frame[frame.mla_dtype == "bfloat16"]
        if frame.empty:
            return {}
        # every kernel the engine picks by length (vLLM: the absorbed MLA kernel for short
        # prompts, FlashAttention beyond 512 tokens), the faster where both are measured
        source = " + ".join(sorted(set(frame.kernel_source)))
        if x_column == "kv":
            frame = frame.assign(kv=frame.isl + frame.step)
        batches, xs = sorted(set(frame.batch_size)), sorted(set(frame[x_column]))
        pairs = {}
        for heads, group in frame.groupby("num_heads"):
            values = group.groupby(["batch_size", x_column]).latency.min()
            grid = np.full((len(batches), len(xs)), np.nan)
            for (b, x), v in values.items():
                grid[batches.index(b), xs.index(x)] = v
            pairs[f"{heads}/1"] = us(grid)
        out[f"{prefix}mla_{kind}"] = {
            "file": _rel(path, root), "engine_version": path.parent.name,
            "kernel_source": source, "model": str(frame.model.iloc[0]),
            "gemm_dtype": MLA_GEMM_DTYPE[dtype], "kv_cache_dtype": kv,
            **({} if kv == "bfloat16" else {"mla_dtype": "bfloat16"}),
            "batch": batches, ("isl" if x_column == "isl" else "kv_tokens"): xs,
            "pairs": pairs}
    return out


def derive_attention(data: Path, root: Path, engine: str, ratios: set[int],
                     kv: str = "bfloat16"):
    base = data / "attention" / engine
    ctx = newest(base, "context_attention_perf.parquet")
    gen = newest(base, "generation_attention_perf.parquet")
    if ctx is None or gen is None:
        return None, None
    context, generation = (_attention(ctx, root, ratios, "isl", kv),
                           _attention(gen, root, ratios, "kv", kv))
    return (context, generation) if context and generation else (None, None)


def derive_nccl(data: Path, root: Path) -> dict | None:
    """NCCL's all-reduce (half) by message size and GPU count: engines fall back to it for
    messages beyond their custom all-reduce's buffer."""
    import pandas as pd
    path = newest(data / "comm" / "nccl", "nccl_perf.parquet")
    if path is None:
        return None
    frame = pd.read_parquet(path)
    frame = frame[(frame.op_name == "all_reduce") & (frame.nccl_dtype == "half")]
    sizes = sorted(set(frame.message_size))
    table = frame.groupby(["num_gpus", "message_size"]).latency.min()
    return {"file": _rel(path, root), "nccl_version": path.parent.name, "message_values": sizes,
            "graph": {str(g): us([table.get((g, s), np.nan) for s in sizes])
                      for g in sorted(set(frame.num_gpus))}}


def derive_all_reduce(data: Path, root: Path, engine: str) -> dict:
    import pandas as pd
    path = newest(data / "comm" / engine, "custom_allreduce_perf.parquet")
    if path is None:
        return {**derive_nccl(data, root), "kind": "nccl"}
    frame = pd.read_parquet(path)
    kind = "custom"
    sizes = sorted(set(frame.message_size))
    variants = {}
    if "backend" in frame.columns:
        for backend, group in frame.groupby("backend"):
            variants["eager" if "eager" in backend else "graph" if "graph" in backend
                     else backend] = group
    else:
        variants["graph"] = frame
    out = {"file": _rel(path, root), "engine_version": path.parent.name, "kind": kind,
           "message_values": sizes}
    for name, group in variants.items():
        table = group.groupby(["num_gpus", "message_size"]).latency.min()
        out[name] = {str(g): us([table.get((g, s), np.nan) for s in sizes])
                     for g in sorted(set(group.num_gpus))}
    return out


# MoE data types read per file, in order: a shape not measured in the first is read in the
# next (DeepSeek-V3/R1 and Kimi-K2 are measured in block-scaled fp8 only, as they ship; gpt-oss
# with its checkpoint's MXFP4 experts and bf16 activations only); each shape records its own.
MOE_DTYPES = {"bf16": ("bfloat16", "w4a16_mxfp4"), "fp8": ("fp8", "fp8_block", "w4a16_mxfp4"),
              "fp4": ("nvfp4", "w4a16_mxfp4", "fp8", "fp8_block")}


def moe_shapes(catalog) -> list[tuple[int, int, int, int]]:
    return sorted({(m.hidden, m.expert_intermediate_size, m.experts, m.experts_per_token)
                   for m in catalog.models.values() if m.is_moe})


def moe_collection(base: Path, shapes, dtype: str):
    """(path, frame) of the newest MoE collection under `base` that measures any catalog shape
    in the file's MoE data types: a newer collection may measure other models only
    (TensorRT-LLM 1.3.0rc23 holds none of the catalog's MoE shapes; 1.3.0rc20 holds DeepSeek's
    and the others)."""
    import pandas as pd
    if not base.is_dir():
        return None, None
    wanted = {tuple(shape) for shape in shapes}
    versions = sorted((d for d in base.iterdir() if (d / "moe_perf.parquet").is_file()),
                      key=lambda d: _version_key(d.name), reverse=True)
    for version in versions:
        frame = pd.read_parquet(version / "moe_perf.parquet")
        rows = frame[frame.moe_dtype.isin(MOE_DTYPES[dtype])]
        measured = {tuple(int(x) for x in row) for row in rows[
            ["hidden_size", "inter_size", "num_experts", "topk"]].drop_duplicates().values}
        if measured & wanted:
            return version / "moe_perf.parquet", frame
    if not versions:
        return None, None
    return versions[0] / "moe_perf.parquet", pd.read_parquet(versions[0] / "moe_perf.parquet")


def derive_moe(data: Path, root: Path, engine: str, dtype: str, shapes) -> dict | None:
    path, full = moe_collection(data / "moe" / engine, shapes, dtype)
    if path is None:
        return None
    frame = full[full.moe_ep_size == 1]
    expert_parallel = full[(full.moe_tp_size == 1) & (full.moe_ep_size > 1)]
    out = {"file": _rel(path, root), "engine_version": path.parent.name, "shapes": {}}
    for hidden, inter, experts, topk in shapes:
        rows = frame[(frame.hidden_size == hidden) & (frame.inter_size == inter)
                     & (frame.num_experts == experts) & (frame.topk == topk)]
        moe_dtype = next((d for d in MOE_DTYPES[dtype] if (rows.moe_dtype == d).any()), None)
        if moe_dtype is None:
            continue
        rows = rows[rows.moe_dtype == moe_dtype]
        # AIConfigurator's default token distribution (real routers are skewed), else balanced
        dist = "power_law_1.01" if (rows.distribution == "power_law_1.01").any() else "balanced"
        rows = rows[rows.distribution == dist]
        source = _dominant(rows, "kernel_source")
        rows = rows[rows.kernel_source == source]
        per_tp = {}
        for tp in MOE_TP:
            table = rows[rows.moe_tp_size == tp].groupby("num_tokens").latency.min()
            table = _without_spikes(table, out, "anomalies", {
                "table": "moe", "shape": f"{hidden}/{inter}/{experts}/{topk}", "tp": tp})
            if len(table) >= 2:
                per_tp[str(tp)] = {"tokens": [int(t) for t in table.index], "us": us(table.values)}
        if per_tp:
            out["shapes"][f"{hidden}/{inter}/{experts}/{topk}"] = {
                "distribution": dist, "kernel_source": source, "tp": per_tp}
            if moe_dtype != GEMM_DTYPE[dtype]:   # older shapes' records stay as they were
                out["shapes"][f"{hidden}/{inter}/{experts}/{topk}"]["moe_dtype"] = moe_dtype
            ep_rows = expert_parallel[
                (expert_parallel.hidden_size == hidden) & (expert_parallel.inter_size == inter)
                & (expert_parallel.num_experts == experts) & (expert_parallel.topk == topk)
                & (expert_parallel.moe_dtype == moe_dtype)]
            for key, ep_dist in (("ep", "power_law_1.01"), ("ep_balanced", "balanced")):
                table, ep_source = derive_moe_ep(ep_rows[ep_rows.distribution == ep_dist],
                                                 source, f"{hidden}/{inter}/{experts}/{topk}",
                                                 ep_dist, out)
                if table:
                    out["shapes"][f"{hidden}/{inter}/{experts}/{topk}"][key] = table
                    if ep_source != source:
                        out["shapes"][f"{hidden}/{inter}/{experts}/{topk}"][
                            f"{key}_kernel_source"] = ep_source
    return out


def _without_spikes(table, out: dict, key: str, where: dict):
    """A MoE latency series (by token count) without its not-monotone points, each left-out
    set noted in out[key] with `where` (table, shape, tp or ep) it was found."""
    spikes = spike_mask(table.values.astype(float), axis=0)
    if not spikes.any():
        return table
    out.setdefault(key, []).append({**where, "kind": "not monotone in tokens", "points": int(spikes.sum()),
                  "of": int(len(table)),
                  "note": (f"tokens {', '.join(str(int(t)) for t in table.index[spikes])}: "
                           f"more than {SPIKE:g}x the latency of more tokens, left out"),
                  "fallback": "interpolated between the other token counts"})
    return table[~spikes]


def derive_moe_ep(rows, source: str, shape: str, dist: str, out: dict) -> tuple[dict, str]:
    """The MoE layer at moe_tp 1, moe_ep MOE_EP (per GPU, its num_experts / ep experts), thinned
    to MOE_EP_TOKENS; num_tokens is the token count entering the MoE layer of the whole EP
    group (every attention-DP rank's tokens), of which this GPU computes those routed to its
    experts. The tp tables' kernel source where measured; not-monotone points are dropped and
    noted in out["ep_anomalies"]."""
    if rows.empty:
        return {}, source
    if not (rows.kernel_source == source).any():
        source = _dominant(rows, "kernel_source")
    rows = rows[(rows.kernel_source == source) & rows.num_tokens.isin(MOE_EP_TOKENS)]
    per_ep = {}
    for ep in MOE_EP:
        table = rows[rows.moe_ep_size == ep].groupby("num_tokens").latency.min()
        table = _without_spikes(table, out, "ep_anomalies", {
            "table": "moe_ep", "shape": shape, "ep": ep, "distribution": dist})
        if len(table) >= 2:
            per_ep[str(ep)] = {"tokens": [int(t) for t in table.index], "us": us(table.values)}
    return per_ep, source


def _against(table: dict, reference: dict) -> tuple[list, list]:
    """`table`'s latencies, those more than FP8_TOLERANCE above `reference` at the same token
    count replaced by it; and the (tokens, value, reference) replaced."""
    base = dict(zip(reference.get("tokens", []), reference.get("us", [])))
    values, slow = [], []
    for tokens, value in zip(table["tokens"], table["us"]):
        ref = base.get(tokens)
        if ref is not None and value is not None and value > ref * (1 + FP8_TOLERANCE):
            slow.append((tokens, value, ref))
            value = ref
        values.append(value)
    return values, slow


def moe_fp8_against_bf16(fp8: dict | None, bf16: dict | None,
                         dtype: str = "fp8") -> dict | None:
    """fp8 (fp4) MoE points more than FP8_TOLERANCE slower than the bf16 measurement of the
    same shape, moe_tp and token count take the bf16 latency; one note per (shape, moe_tp).
    The expert-parallel tables likewise per (shape, ep, distribution), noted in ep_anomalies."""
    if not fp8 or not bf16:
        return fp8
    out = dict(fp8, shapes={})
    notes = list(fp8.get("anomalies", []))
    ep_notes = list(fp8.get("ep_anomalies", []))
    for key, shape in fp8["shapes"].items():
        ep_tables = {}
        for ep_key, dist in (("ep", "power_law_1.01"), ("ep_balanced", "balanced")):
            if ep_key not in shape:
                continue
            reference = bf16["shapes"].get(key, {}).get(ep_key, {})
            ep_tables[ep_key] = {}
            for ep, table in shape[ep_key].items():
                values, slow = _against(table, reference.get(ep, {}))
                ep_tables[ep_key][ep] = {"tokens": table["tokens"], "us": values}
                if slow:
                    ratios = [v / r for _, v, r in slow]
                    ep_notes.append({
                        "table": "moe_ep", "shape": key, "ep": int(ep), "distribution": dist,
                        "kind": f"{dtype} slower than bf16", "points": len(slow),
                        "of": len(table["tokens"]),
                        "note": (f"{dtype} {float(np.median(ratios)):.1f}x slower than bf16 at "
                                 f"{len(slow)} of {len(table['tokens'])} token counts (median)"),
                        "fallback": "the bf16 latency of the same shape, ep and tokens"})
        reference = bf16["shapes"].get(key, {}).get("tp", {})
        tables = {}
        for tp, table in shape["tp"].items():
            values, slow = _against(table, reference.get(tp, {}))
            tables[tp] = {"tokens": table["tokens"], "us": values}
            if slow:
                ratios = [v / r for _, v, r in slow]
                at = next(((t, v, r) for t, v, r in slow if t == 64), slow[0])
                notes.append({
                    "table": "moe", "shape": key, "tp": int(tp),
                    "kind": f"{dtype} slower than bf16",
                    "points": len(slow), "of": len(table["tokens"]),
                    "note": (f"{dtype} {float(np.median(ratios)):.1f}x slower than bf16 at "
                             f"{len(slow)} of {len(table['tokens'])} token counts (median; "
                             f"{at[0]} tokens: {at[1]:,.0f} us against {at[2]:,.0f} us)"),
                    "fallback": "the bf16 latency of the same shape, moe_tp and tokens"})
        out["shapes"][key] = dict(shape, tp=tables, **ep_tables)
    if notes:
        out["anomalies"] = notes
    if ep_notes:
        out["ep_anomalies"] = ep_notes
    return out


# MoE all-to-all (issue 36): the engine's DeepEP modes, high-throughput for prefill
# ("context"), low-latency for decode ("generation"), as AIConfigurator composes them
A2A_BACKENDS = {"vllm": {"context": "deepep_ht", "generation": "deepep_ll"},
                "trtllm": {"context": "trtllm_deepep_ht", "generation": "trtllm_deepep_ll"},
                "sglang": {"context": "deepep_ht", "generation": "deepep_ll"}}
A2A_SGLANG_FILES = {"context": "wideep_deepep_normal_perf.parquet",
                    "generation": "wideep_deepep_ll_perf.parquet"}
# SMs of the high-throughput kernels: DeepEP's and AIConfigurator's default (sdk/config.py
# `sms: int = 20`; the low-latency kernels take none, recorded as 0; TensorRT-LLM's rows are
# all sms 0: no such knob)
A2A_HT_SMS = 20
A2A_QUANT = {"bf16": "bfloat16", "fp8": "fp8", "fp4": "nvfp4"}


def _a2a_comm_dtype(gpu: str, engine: str, dtype: str, backend: str, comm_phase: str,
                    phase: str) -> str:
    """The wire data type AIConfigurator's serving contract picks (TensorRT-LLM: HT sends fp8
    models' activations in bf16, LL in fp8; nvfp4 models in nvfp4 / fp4 combine)."""
    if engine != "trtllm":
        return "default"
    from aiconfigurator_core.sdk.operations.moe_comm import communication_dtype_for
    try:
        return communication_dtype_for(system=gpu, comm_backend=backend,
                                       model_quantization=A2A_QUANT[dtype],
                                       communication_phase=comm_phase, inference_phase=phase)
    except ValueError:
        return "bfloat16"


def derive_alltoall(pkg: Path, data: Path, root: Path, gpu: str, engine: str, dtype: str,
                    shapes) -> dict | None:
    """MoE dispatch and combine latency (us) within one node (node_num 1) by per-rank token
    count, for the catalog's (hidden, top-k, experts) measured exactly; None where the engine's
    collection on this GPU has no all-to-all table."""
    import pandas as pd
    import yaml
    backends = A2A_BACKENDS[engine]
    frames, files = {}, {}
    if engine == "sglang":       # one file per mode, one column pair per comm phase, no ep
        for phase, filename in A2A_SGLANG_FILES.items():
            path = newest(data / "comm" / engine, filename)
            if path is None:
                return None
            frame = pd.read_parquet(path)
            frame = frame[frame.node_num == 1]
            if "dispatch_sms" in frame.columns:
                frame = frame[(frame.dispatch_sms == A2A_HT_SMS)
                              & (frame.combine_sms == A2A_HT_SMS)]
            rows = []
            for comm in ("dispatch", "combine"):
                value = (frame[f"{comm}_transmit_us"] + frame[f"{comm}_notify_us"]
                         if f"{comm}_transmit_us" in frame.columns else frame[f"{comm}_avg_t_us"])
                rows.append(pd.DataFrame({
                    "phase": comm, "hidden_size": frame.hidden_size, "topk": frame.num_topk,
                    "num_experts": frame.num_experts, "num_tokens": frame.num_token,
                    "latency": value, "kernel_source": frame.kernel_source}))
            frames[phase], files[phase] = pd.concat(rows), path
        spec = yaml.safe_load((pkg / "systems" / f"{gpu}.yaml").read_text())
        gpus_per_node = int(spec["node"]["num_gpus_per_node"])
        sms = {"context": A2A_HT_SMS, "generation": 0}
        for frame in frames.values():
            frame["ep_size"] = gpus_per_node
    else:
        path = newest(data / "comm" / engine, "moe_a2a_perf.parquet")
        if path is None:
            return None
        frame = pd.read_parquet(path)
        frame = frame[frame.node_num == 1]
        sms = {}
        for phase, backend in backends.items():
            rows = frame[frame.comm_backend == backend]
            if rows.empty:
                continue
            sms[phase] = (A2A_HT_SMS if (rows.sms == A2A_HT_SMS).any() and phase == "context"
                          else int(rows.sms.min()))
            frames[phase], files[phase] = rows[rows.sms == sms[phase]], path
        if not frames:
            return None
        gpus_per_node = int(max(frame.ep_size))
    comm_dtypes = {phase: {comm: _a2a_comm_dtype(gpu, engine, dtype, backends[phase], comm,
                                                  phase) for comm in ("dispatch", "combine")}
                   for phase in frames}
    measured = sorted({(int(h), int(k), int(e)) for f in frames.values()
                       for h, k, e in zip(f.hidden_size, f.topk, f.num_experts)})
    out_shapes = {}
    for hidden, topk, experts in sorted({(h, k, e) for h, _, e, k in shapes}):
        entry = {}
        for phase, frame in frames.items():
            rows = frame[(frame.hidden_size == hidden) & (frame.topk == topk)
                         & (frame.num_experts == experts)]
            for ep, group in rows.groupby("ep_size"):
                per_comm = {}
                for comm in ("dispatch", "combine"):
                    part = group[group.phase == comm]
                    if "comm_dtype" in part.columns:
                        part = part[part.comm_dtype == comm_dtypes[phase][comm]]
                    table = part.groupby("num_tokens").latency.min()
                    if len(table) >= 2:
                        per_comm[comm] = {"tokens": [int(t) for t in table.index],
                                          "us": us_from_us(table.values)}
                if len(per_comm) == 2:
                    entry.setdefault(str(int(ep)), {})[phase] = per_comm
        if entry:
            out_shapes[f"{hidden}/{topk}/{experts}"] = entry
    first = files.get("context") or next(iter(files.values()))
    out = {"file": _rel(first, root),
           "files": {phase: _rel(path, root) for phase, path in files.items()},
           "engine_version": first.parent.name,
           "kernel_source": _dominant(pd.concat(frames.values()), "kernel_source"),
           "backend": {phase: backends[phase] for phase in frames},
           "sms": sms, "comm_dtype": comm_dtypes, "node_num": 1,
           "gpus_per_node": gpus_per_node,
           "tokens": "per rank: each GPU dispatches (and gets back) its own tokens' top-k copies",
           "measured_shapes": [f"{h}/{k}/{e}" for h, k, e in measured],
           "shapes": out_shapes}
    return out


def system_memory(pkg: Path, gpu: str) -> dict:
    import yaml
    spec = yaml.safe_load((pkg / "systems" / f"{gpu}.yaml").read_text())["gpu"]
    return {"file": f"systems/{gpu}.yaml", "hbm_bytes_per_s": float(spec["mem_bw"]),
            "bandwidth_scaling": float(spec.get("mem_bw_empirical_scaling_factor", 1.0)),
            "constant_latency_s": float(spec.get("mem_empirical_constant_latency", 0.0)),
            "bf16_flops": float(spec.get("bfloat16_tc_flops", 0.0)),
            "fp8_flops": float(spec.get("fp8_tc_flops", 0.0) or 0.0)}


def derive(gpu: str, engine: str, dtype: str, catalog) -> dict | None:
    pkg = package_dir()
    data = pkg / "systems" / "data" / gpu
    root = pkg
    gemm = derive_gemm(data, root, engine, dtype)
    if gemm is None:
        return None
    ratios = {m.heads // m.kv_heads for m in catalog.models.values()
              if not m.is_mla and m.head_dim == HEAD_DIM}
    context, generation = derive_attention(data, root, engine, ratios)
    if context is None:
        return None
    import pandas as pd
    device = str(pd.read_parquet(root / gemm["file"], columns=["device"]).device.iloc[0])
    moe = derive_moe(data, root, engine, dtype, moe_shapes(catalog))
    extra = {}
    if dtype != "bf16":
        gemm = fp8_against_bf16(gemm, derive_gemm(data, root, engine, "bf16"), dtype)
        moe = moe_fp8_against_bf16(moe, derive_moe(data, root, engine, "bf16",
                                                   moe_shapes(catalog)), dtype)
        kv_context, kv_generation = derive_attention(data, root, engine, ratios, "fp8")
        if kv_context is not None:
            extra = {"kv_fp8_context_attention": kv_context,
                     "kv_fp8_generation_attention": kv_generation}
    anomalies = [*gemm.pop("anomalies", []), *((moe or {}).pop("anomalies", []))]
    ep_anomalies = (moe or {}).pop("ep_anomalies", [])
    doc = {"format": FORMAT, "source": "aiconfigurator-core", "version": package_version(),
           "license": "Apache-2.0 (NVIDIA); derived by scripts/derive_kernel_tables.py",
           "gpu": gpu, "device": device, "engine": engine, "dtype": dtype,
           "units": "latency in microseconds per kernel call on one GPU; bytes; tokens",
           "gemm": gemm, "context_attention": context, "generation_attention": generation,
           "all_reduce": derive_all_reduce(data, root, engine),
           "nccl_all_reduce": derive_nccl(data, root),
           "moe": moe,
           "memory": system_memory(pkg, gpu), **extra,
           **derive_attention_variants(data, root, engine, catalog),
           **derive_mla(data, root, engine, dtype)}
    if anomalies:
        doc["anomalies"] = anomalies
    # issue 36 (EP, all-to-all): new keys only, so the older files' keys stay as they were
    doc["moe_alltoall"] = derive_alltoall(pkg, data, root, gpu, engine, dtype,
                                          moe_shapes(catalog))
    if ep_anomalies:
        doc["moe_ep_anomalies"] = ep_anomalies
    # MLA with an fp8 KV cache (issue 36 follow-up): new keys only, in the files that carry
    # the kv_fp8 attention tables, where the engine's collection measures them
    if extra:
        doc.update(derive_mla(data, root, engine, dtype, "fp8"))
    return doc


def derive_all(catalog=None) -> dict[str, dict]:
    from hardware_catalog import load_catalog
    catalog = catalog or load_catalog()
    docs = {}
    for gpu, engine, dtype in TARGETS:
        doc = derive(gpu, engine, dtype, catalog)
        if doc is not None:
            docs[f"{gpu}-{engine}-{dtype}.json"] = doc
    return docs


def dumps(doc: dict) -> str:
    """One top-level key per line, the tables compact."""
    lines = [f"  {json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in doc.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--check", action="store_true",
                        help="re-derive and compare with the files in --out; write nothing")
    args = parser.parse_args(argv)
    out = Path(args.out)
    docs = derive_all()
    if args.check:
        bad = [name for name, doc in docs.items()
               if not (out / name).is_file() or json.loads((out / name).read_text()) != doc]
        print("differ:" if bad else f"{len(docs)} tables match", *bad)
        return 1 if bad else 0
    out.mkdir(parents=True, exist_ok=True)
    total = 0
    for name, doc in docs.items():
        text = dumps(doc)
        (out / name).write_text(text)
        total += len(text)
        print(f"{name}: {len(text) / 1024:.0f} KiB, gemm {doc['gemm']['kernel_source']} "
              f"{doc['gemm']['engine_version']}, attention "
              f"{doc['context_attention']['kernel_source']}, all-reduce "
              f"{doc['all_reduce']['kind']} {doc['all_reduce']['engine_version']}, moe shapes "
              f"{len((doc['moe'] or {}).get('shapes', {}))}")
    print(f"{len(docs)} files, {total / 1024:.0f} KiB in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
