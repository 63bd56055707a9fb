"""Iteration latencies composed from measured kernel timings (issue 24).

The tables in `simcore/data/kernels/` are derived by `scripts/derive_kernel_tables.py` from
aiconfigurator-core (NVIDIA, Apache-2.0): per (GPU, engine, data type) the latency of GEMMs over
(m, n, k), of context and generation attention, of the all-reduce and of MoE layers, each
measured on one GPU (docs/kernel-data.md). Nothing here needs the package itself.

One iteration on a tensor-parallel group of `tp` GPUs (times per GPU: the GPUs run in lockstep)
over T tokens (the prompt tokens of its prompts or chunks, plus one token per decode) is

    t = max(sum of kernels, dispatch)

    sum of kernels = embedding + LM head + layers x (
        GEMM(T, (H/tp + 2 KVg) d, h)               QKV projection
      + context attention of the prompt tokens, generation attention of the decodes
      + GEMM(T, h, H d / tp)                       attention output projection
      + MLP: GEMM(T, 2 I / tp, h) + GEMM(T, h, I / tp)  (gated; plain: I / tp)
         or MoE: router GEMM(T, E, h) + the measured MoE layer at T tokens, moe_tp = tp
      + 2 all-reduces of T x h bf16 values when tp > 1 (custom or NCCL, the faster)
      + element-wise ops: two residual add + norms, the MLP activation (memory bound))

with h the hidden size, H the heads, KVg = max(1, KV heads / tp) the KV heads per GPU, d the head
dimension, I the MLP width, E the experts. GEMM latencies interpolate the measured (m, n, k)
grid (linear in m, n and k; beyond the last m, proportional). The LM head runs on one token per
sequence (the sampled ones), GEMM(sequences, vocab / tp, h), in bf16 as AIConfigurator prices it.

Attention:
- a prompt of s tokens costs the measured causal context attention at (batch 1, s);
- a chunk of c tokens whose prompt has c0 tokens cached attends to c0 + its own c tokens: it
  does c x c0 + c^2 / 2 query-key pairs, what a fresh prompt of s_eq = sqrt(c^2 + 2 c c0) does,
  so it costs the measured context attention at s_eq (never a fresh prompt's cost: four
  512-token chunks of a 2,048-token prompt do 512^2 + 887^2 + 1145^2 + 1354^2 = 2048^2 pairs);
- several prompts or chunks in one iteration are one batched call at (n, sqrt(mean s_eq^2));
- decodes holding L_1..L_b context tokens are one generation-attention call at (b, mean L).
Heads per GPU not measured are interpolated linearly in the query heads between measured pairs
of the same group ratio (context) or in the KV heads (generation), proportionally beyond.
Measured grids are interpolated log-log (attention is a power law in its sizes); past the
measured batch at a length, proportionally in the batch; past the longest length, with the
last segment's log-log slope (quadratic for context attention).

Dispatch: an iteration is never faster than the host can launch its kernels. Iterations of more
than CUDA_GRAPH_TOKENS tokens run eagerly (vLLM captures CUDA graphs up to 512 tokens), and
launching one kernel eagerly costs what the engine's measured eager all-reduce costs beyond its
graph-captured twin at the smallest message (17 us on H100 with vLLM 0.24): dispatch = kernels
per layer x layers x that. Graph-captured iterations use the graph all-reduce and no dispatch
floor. What the engine does around the kernels (scheduler, input preparation, sampling,
tokenization: not in the kernel data) comes on top of the curves, from
`simcore.engine_overheads` (`KernelPerformanceModel(overheads=...)`).

KV cache data type: the attention tables are measured with a bf16 KV cache; with
`kv_dtype="fp8"` the context and generation attention come from the same GPU's and engine's
fp8-KV measurements (kept in its fp8 file, `kv_fp8_*_attention`); an MLA model's attention
module from the weights' file's `kv_fp8_mla_*` (its GEMMs in the weights' data type). The
derivation leaves out database anomalies (docs/kernel-data.md); each file's `anomalies` names
them and the fallback used (`KernelTables.anomalies`).

`KernelPerformanceModel` tabulates `LatencyCurves` per (model, machine) for the simulator, like
`simcore.perfmodel.FittedPerformanceModel`: the prompt curve is a single prompt of T tokens on the
prompt knots; the decode curve b decodes at the shortest measured context; the context
coefficient K the slope of generation attention in total KV tokens (per layer, times layers);
the chunk terms A (per chunk token x cached token: the context-attention cost per query-key
pair of a long prompt, times 2, times layers) and R = K. `EnginePerformanceModel` is what
`provision --engine vllm|sglang|trtllm` simulates with: this model for the pairs its tables
cover, the 2023 model (`simcore.perfmodel.default_performance_model`) for the others.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from hardware_catalog import InputError, MachineSku, ModelSpec
from simcore.engine_overheads import NO_OVERHEADS, EngineOverheads
from simcore.latency import LatencyCurves
from simcore.perfmodel import DECODE_KNOTS, PROMPT_KNOTS
from simcore.performance import PerformanceModel

__all__ = ["KERNEL_DIR", "GPU_OF_MACHINE", "KernelTables", "load_tables", "available_tables",
           "Chunk", "iteration_time", "ModelShapes", "KernelPerformanceModel",
           "kernel_curves", "CUDA_GRAPH_TOKENS", "EnginePerformanceModel", "tables_sha256",
           "kernel_data_version", "kv_fp8_available", "coverage", "GPU_NAMES",
           "machine_latency_source", "ExpertParallel", "expert_placement"]

KERNEL_DIR = Path(__file__).resolve().parent / "data" / "kernels"
TABLE_FORMAT = "provision-kernel-tables/1"
# catalog `gpu` of a machine -> the aiconfigurator system whose kernels it runs
GPU_OF_MACHINE = {"A100-SXM4-80GB": "a100_sxm", "H100-SXM5-80GB": "h100_sxm",
                  "H100-SXM5-80GB (power-capped)": "h100_sxm", "H200-SXM-141GB": "h200_sxm",
                  "B200-180GB": "b200_sxm", "B300-288GB": "b300_sxm", "L40S-48GB": "l40s",
                  "GB200-186GB": "gb200", "GB300-288GB": "gb300"}
GPU_NAMES = {"a100_sxm": "A100", "h100_sxm": "H100", "h200_sxm": "H200", "b200_sxm": "B200",
             "b300_sxm": "B300", "l40s": "L40S", "gb200": "GB200", "gb300": "GB300"}
CUDA_GRAPH_TOKENS = 512     # vLLM's largest captured batch (max_capture_size)
BF16_BYTES = 2
# Expert-parallel all-to-all across machines (KernelTables.alltoall). DeepEP's published
# low-latency kernels on H800 with 400 Gb/s InfiniBand (github.com/deepseek-ai/DeepEP,
# README, 128 tokens per GPU, hidden 7168, top-8, fp8 dispatch, bf16 combine) reach 43-46 GB/s
# of the 50 GB/s link, and their times fit a ~30 us fixed cost plus bytes at that rate (EP 16
# dispatch 118 us, combine 195 us; EP 64: 173 us, 314 us; this model: 112, 193, 173, 315).
RDMA_LATENCY_S = 30e-6
RDMA_EFFICIENCY = 0.9
DISPATCH_BYTES = 1          # tokens are dispatched in fp8 (DeepEP, engines' fp8 paths)


def available_tables() -> list[tuple[str, str, str]]:
    """(gpu, engine, dtype) of every shipped table."""
    return sorted(tuple(p.stem.rsplit("-", 2)) for p in KERNEL_DIR.glob("*.json"))


def covers(machine: MachineSku, engine: str = "vllm", dtype: str = "bf16",
           kv_dtype: str = "bf16") -> bool:
    """Are there measured kernel tables for the machine's GPU under this engine and dtype
    (and, for an fp8 KV cache, fp8-KV attention tables)?"""
    gpu = GPU_OF_MACHINE.get(machine.gpu)
    return (gpu is not None and (gpu, engine, dtype) in available_tables()
            and (kv_dtype == "bf16" or kv_fp8_available(gpu, engine)))


@lru_cache(maxsize=None)
def _document(gpu: str, engine: str, dtype: str) -> dict:
    path = KERNEL_DIR / f"{gpu}-{engine}-{dtype}.json"
    if not path.is_file():
        known = ", ".join("-".join(t) for t in available_tables())
        raise InputError(f"no kernel tables for {gpu}/{engine}/{dtype}; shipped: {known}")
    document = json.loads(path.read_text())
    if document.get("format") != TABLE_FORMAT:
        raise InputError(f"not a kernel table (format {TABLE_FORMAT})", source=str(path))
    return document


def kv_fp8_available(gpu: str, engine: str) -> bool:
    """Attention measured with an fp8 KV cache for this GPU and engine (in its fp8 file)?"""
    return ((gpu, engine, "fp8") in available_tables()
            and "kv_fp8_generation_attention" in _document(gpu, engine, "fp8"))


@lru_cache(maxsize=None)
def load_tables(gpu: str, engine: str = "vllm", dtype: str = "bf16",
                kv_dtype: str = "bf16") -> "KernelTables":
    document = _document(gpu, engine, dtype)
    if kv_dtype == "bf16":
        return KernelTables(document)
    if not kv_fp8_available(gpu, engine):
        raise InputError(f"no fp8-KV attention tables for {gpu}/{engine}")
    return KernelTables(document, kv_dtype, _document(gpu, engine, "fp8"))


def coverage() -> dict[str, dict[str, dict]]:
    """What the shipped tables hold, per GPU and engine: the engine version of its GEMMs, the
    weight data types and the KV cache data types."""
    out: dict[str, dict[str, dict]] = {}
    for gpu, engine, dtype in available_tables():
        entry = out.setdefault(gpu, {}).setdefault(engine, {"dtypes": [], "kv_dtypes": ["bf16"]})
        entry["dtypes"].append(dtype)
        document = _document(gpu, engine, dtype)
        entry.setdefault("engine_version", {})[dtype] = document["gemm"]["engine_version"]
        if dtype == "fp8" and kv_fp8_available(gpu, engine):
            entry["kv_dtypes"].append("fp8")
    return out


def _bracket(grid: np.ndarray, x: float) -> tuple[int, int, float, float]:
    """(i0, i1, weight of i1, scale): linear interpolation on `grid`; below the grid the first
    value holds, beyond it the last value scales proportionally (scale = x / last)."""
    if x <= grid[0]:
        return 0, 0, 0.0, 1.0
    if x >= grid[-1]:
        return len(grid) - 1, len(grid) - 1, 0.0, x / grid[-1]
    i1 = int(np.searchsorted(grid, x))
    i0 = i1 - 1
    return i0, i1, (x - grid[i0]) / (grid[i1] - grid[i0]), 1.0


def _loglog(x: np.ndarray, xs: np.ndarray, ys: np.ndarray, slope_cap: float | None = None):
    """Log-log interpolation through (xs, ys); below xs[0] the first value holds; beyond xs[-1]
    the last segment's log-log slope continues (clipped to [1, slope_cap] when given)."""
    lx, ly = np.log(xs), np.log(ys)
    q = np.log(np.maximum(np.asarray(x, dtype=float), xs[0]))
    out = np.interp(q, lx, ly)
    if len(xs) >= 2:
        slope = (ly[-1] - ly[-2]) / (lx[-1] - lx[-2])
        if slope_cap is not None:
            slope = min(max(slope, 1.0), slope_cap)
        out = np.where(q > lx[-1], ly[-1] + slope * (q - lx[-1]), out)
    return np.exp(out)


class _AttentionGrid:
    """One attention table (context or generation): per (heads, kv heads) pair a grid over
    (batch, length) with holes."""

    def __init__(self, table: dict, length_key: str, slope_cap: float):
        self.batch = np.array(table["batch"], dtype=float)
        self.length = np.array(table[length_key], dtype=float)
        self.slope_cap = slope_cap
        self.pairs = {}
        for key, values in table["pairs"].items():
            h, kv = (int(v) for v in key.split("/"))
            grid = np.array([np.nan if v is None else v for v in values], dtype=float)
            self.pairs[(h, kv)] = grid.reshape(len(self.batch), len(self.length)) * 1e-6

    def _row(self, pair, bi: int, lengths: np.ndarray) -> np.ndarray:
        """Seconds at batch index bi over lengths; where the row stops short, scaled from the
        largest smaller batch that has the length (proportionally in the batch)."""
        grid = self.pairs[pair]
        row = grid[bi]
        ok = np.isfinite(row)
        out = np.full(lengths.shape, np.nan)
        if ok.sum() >= 2:
            inside = lengths <= self.length[ok][-1]
            if bi == 0:   # the first batch row extrapolates itself (last log-log slope)
                inside = np.ones_like(inside)
            out = np.where(inside, _loglog(lengths, self.length[ok], row[ok], self.slope_cap),
                           np.nan)
        missing = ~np.isfinite(out)
        if missing.any():
            for lower in range(bi - 1, -1, -1):
                r = grid[lower]
                good = np.isfinite(r)
                if good.sum() < 2:
                    continue
                reach = lengths <= self.length[good][-1]
                if lower == 0:
                    reach = np.ones_like(reach)
                fill = missing & reach
                if fill.any():
                    scaled = (_loglog(lengths[fill], self.length[good], r[good], self.slope_cap)
                              * self.batch[bi] / self.batch[lower])
                    out[fill] = scaled
                    missing = ~np.isfinite(out)
                if not missing.any():
                    break
        return out

    def _pair_seconds(self, pair, batch: float, lengths: np.ndarray) -> np.ndarray:
        i0, i1, w, scale = _bracket(self.batch, batch)
        if i0 == i1:
            return self._row(pair, i0, lengths) * scale
        a, b = self._row(pair, i0, lengths), self._row(pair, i1, lengths)
        # log-log between the two batches
        lw = (math.log(batch) - math.log(self.batch[i0])) / (
            math.log(self.batch[i1]) - math.log(self.batch[i0]))
        return np.exp((1 - lw) * np.log(a) + lw * np.log(b))

    def seconds(self, batch: float, lengths, heads: int, kv_heads: int,
                scale_by: str) -> np.ndarray:
        """Seconds of one layer's call; heads interpolated among pairs of the same group ratio
        (linearly in `scale_by`: "heads" or "kv"), proportionally beyond them."""
        lengths = np.atleast_1d(np.asarray(lengths, dtype=float))
        if (heads, kv_heads) in self.pairs:
            return self._pair_seconds((heads, kv_heads), batch, lengths)
        ratio = heads / kv_heads
        same = sorted(p for p in self.pairs if p[0] / p[1] == ratio)
        if not same:   # another group ratio: the measured pair closest in query heads
            same = sorted(self.pairs, key=lambda p: (abs(math.log(p[0] / p[1] / ratio)),
                                                     abs(p[0] - heads)))[:1]
        axis = 0 if scale_by == "heads" else 1
        want = heads if axis == 0 else kv_heads
        xs = np.array([p[axis] for p in same], dtype=float)
        i0, i1, w, scale = _bracket(xs, want)
        if i0 == i1:
            return self._pair_seconds(same[i0], batch, lengths) * (want / xs[i0])
        return ((1 - w) * self._pair_seconds(same[i0], batch, lengths)
                + w * self._pair_seconds(same[i1], batch, lengths))


class KernelTables:
    """Measured kernel latencies of one (GPU, engine, data type); all results in seconds."""

    def __init__(self, document: dict, kv_dtype: str = "bf16", kv_document: dict | None = None):
        self.document = document
        self.gpu, self.engine, self.dtype = document["gpu"], document["engine"], document["dtype"]
        self.kv_dtype = kv_dtype
        attention = (document["context_attention"], document["generation_attention"]) \
            if kv_dtype == "bf16" else (kv_document["kv_fp8_context_attention"],
                                        kv_document["kv_fp8_generation_attention"])
        g = document["gemm"]
        self.gemm_m = np.array(g["m"], dtype=float)
        self.gemm_n = np.array(g["n"], dtype=float)
        self.gemm_k = np.array(g["k"], dtype=float)
        self._gemm_curves: dict[tuple[int, int], np.ndarray] = {}
        self.gemm_s = np.array(g["us"], dtype=float).reshape(
            len(self.gemm_m), len(self.gemm_n), len(self.gemm_k)) * 1e-6
        self.context = _AttentionGrid(attention[0], "isl", 2.0)
        self.generation = _AttentionGrid(attention[1], "kv_tokens", 1.0)
        ar = document["all_reduce"]
        self.ar_values = np.array(ar["message_values"], dtype=float)
        self.ar = {mode: {int(g): np.array(v, dtype=float) * 1e-6 for g, v in ar[mode].items()}
                   for mode in ("graph", "eager") if mode in ar}
        nccl = document.get("nccl_all_reduce")
        self.nccl_values = np.array(nccl["message_values"], dtype=float) if nccl else None
        self.nccl = ({int(g): np.array(v, dtype=float) * 1e-6 for g, v in nccl["graph"].items()}
                     if nccl else {})
        self.moe = (document.get("moe") or {}).get("shapes", {})
        # MLA: the module tables of the file's GEMM data type; with an fp8 KV cache its
        # kv_fp8_mla_* (fp8 weights: the fp8 file, kv_document; fp4: its own nvfp4 module)
        self.mla_keys = (("mla_context", "mla_generation") if kv_dtype == "bf16"
                         else (f"kv_{kv_dtype}_mla_context", f"kv_{kv_dtype}_mla_generation"))
        self.mla = ((_AttentionGrid(document[self.mla_keys[0]], "isl", 2.0),
                     _AttentionGrid(document[self.mla_keys[1]], "kv_tokens", 1.0))
                    if self.mla_keys[0] in document else None)
        self._variants: dict[str, _AttentionGrid] = {}
        mem = document["memory"]
        self.mem_bytes_per_s = mem["hbm_bytes_per_s"] * mem["bandwidth_scaling"]
        self.mem_latency_s = mem["constant_latency_s"]

    @cached_property
    def bf16(self) -> "KernelTables":
        """The bf16 tables of the same GPU and engine (the LM head runs in bf16)."""
        return self if self.dtype == "bf16" else load_tables(self.gpu, self.engine, "bf16")

    def version(self) -> str:
        d = self.document
        kv = "" if self.kv_dtype == "bf16" else f", KV {self.kv_dtype}"
        return (f"{d['source']} {d['version']} ({self.gpu}, {self.engine} "
                f"{d['gemm']['engine_version']}, {self.dtype}{kv})")

    def anomalies(self, model: ModelSpec | None = None, tps: Iterable[int] = ()) -> list[str]:
        """The database anomalies the derivation left out of these tables, each with the
        fallback used; given a model, only those its latencies at TP `tps` read: GEMM cells
        around its (n, k) shapes, its MoE shape."""
        out: list[str] = []
        moe: dict[tuple, list[dict]] = {}
        for note in self.document.get("anomalies", []):
            if model is not None and note["table"] == "gemm":
                counts = np.array(note["cells_by_nk"])
                used = set()
                for tp in tps:
                    shapes = ModelShapes(model, tp)
                    for n, k in [*shapes.gemms(), *self._moe_gemms(shapes)]:
                        j0, j1, _, _ = _bracket(self.gemm_n, n)
                        l0, l1, _, _ = _bracket(self.gemm_k, k)
                        used |= {(j, i) for j in (j0, j1) for i in (l0, l1)}
                hit = sum(int(counts[j, i]) for j, i in used)
                if not hit:
                    continue
                out.append(f"{hit} GEMM measurements near {model.name}'s shapes {note['kind']}"
                           f" (used instead: {note['fallback']})")
            elif note["table"] == "moe":
                if model is not None and (not model.is_moe or note["shape"] != (
                        f"{model.hidden}/{model.expert_intermediate_size}/{model.experts}/"
                        f"{model.experts_per_token}")):
                    continue
                moe.setdefault((note["shape"], note["kind"], note["fallback"]), []).append(note)
            else:
                out.append(f"{note['table']} {note['kind']}: {note['note']} "
                           f"(used instead: {note['fallback']})")
        for (shape, kind, fallback), notes in moe.items():   # one line per MoE shape
            out.append(f"MoE {shape} at moe_tp {', '.join(str(n['tp']) for n in notes)} "
                       f"{kind}: moe_tp {notes[0]['tp']}: {notes[0]['note']} "
                       f"(used instead: {fallback})")
        return out

    def _moe_gemms(self, shapes: "ModelShapes") -> list[tuple[int, int]]:
        """The grouped-GEMM shapes `moe_layer` prices a MoE shape it has no table for with."""
        m = shapes.model
        key = f"{m.hidden}/{m.expert_intermediate_size}/{m.experts}/{m.experts_per_token}"
        if not m.is_moe or self.moe.get(key):
            return []
        up = (2 if m.mlp_gated else 1) * m.expert_intermediate_size // shapes.tp
        return [(up, m.hidden), (m.hidden, m.expert_intermediate_size // shapes.tp)]

    # --- GEMM --------------------------------------------------------------------------
    def _gemm_curve(self, n: int, k: int) -> np.ndarray:
        """Seconds over the m grid for one (n, k), interpolated linearly in n and k (cached:
        a model has a handful of shapes)."""
        cached = self._gemm_curves.get((n, k))
        if cached is not None:
            return cached
        j0, j1, wn, sn = _bracket(self.gemm_n, n)
        l0, l1, wk, sk = _bracket(self.gemm_k, k)
        s = self.gemm_s
        curve = ((1 - wn) * ((1 - wk) * s[:, j0, l0] + wk * s[:, j0, l1])
                 + wn * ((1 - wk) * s[:, j1, l0] + wk * s[:, j1, l1]))
        self._gemm_curves[(n, k)] = curve * sn * sk
        return self._gemm_curves[(n, k)]

    def gemm(self, m, n: int, k: int) -> np.ndarray:
        """Seconds of an (m x k) @ (k x n) GEMM; m may be an array; 0 for m = 0."""
        m = np.asarray(m, dtype=float)
        curve = self._gemm_curve(int(n), int(k))
        top = self.gemm_m[-1]
        out = np.where(m > top, curve[-1] * m / top, np.interp(m, self.gemm_m, curve))
        return np.where(m > 0, out, 0.0)

    # --- communication and memory ------------------------------------------------------
    def all_reduce(self, values, gpus: int, graph: bool = True) -> np.ndarray:
        """Seconds of one all-reduce of `values` bf16 elements over `gpus` GPUs (0 for one
        GPU): the engine's custom all-reduce or NCCL's, whichever is faster at the size
        (engines switch to NCCL beyond their custom all-reduce's buffer)."""
        values = np.asarray(values, dtype=float)
        if gpus <= 1:
            return np.zeros_like(values)
        x = np.maximum(values, 1.0)
        out = self._collective(x, gpus, self.ar_values,
                               self.ar["graph" if graph or "eager" not in self.ar else "eager"])
        if self.nccl:
            out = np.minimum(out, self._collective(x, gpus, self.nccl_values, self.nccl))
        return np.where(values > 0, out, 0.0)

    @staticmethod
    def _collective(x, gpus: int, sizes: np.ndarray, table: dict) -> np.ndarray:
        g = gpus if gpus in table else min(table, key=lambda s: (abs(s - gpus), -s))
        out = _loglog(x, sizes, table[g], 1.0)
        if g != gpus:  # ring all-reduce moves 2 (g - 1) / g of the message
            out = out * (2 * (gpus - 1) / gpus) / (2 * (g - 1) / g)
        return out

    @cached_property
    def launch_s(self) -> float:
        """Host cost of launching one kernel eagerly: the eager all-reduce's latency beyond its
        CUDA-graph twin at the smallest message (median over GPU counts); 0 if not measured."""
        if "eager" not in self.ar:
            return 0.0
        deltas = [self.ar["eager"][g][0] - self.ar["graph"][g][0] for g in self.ar["eager"]
                  if g in self.ar["graph"]]
        return max(0.0, float(statistics.median(deltas))) if deltas else 0.0

    def memory_op(self, nbytes) -> np.ndarray:
        nbytes = np.asarray(nbytes, dtype=float)
        return np.where(nbytes > 0, nbytes / self.mem_bytes_per_s + self.mem_latency_s, 0.0)

    # --- attention ---------------------------------------------------------------------
    def context_attention(self, batch: float, seq, heads: int, kv_heads: int) -> np.ndarray:
        """Seconds of one layer's causal prefill attention of `batch` sequences of `seq` tokens."""
        seq = np.asarray(seq, dtype=float)
        out = self.context.seconds(max(batch, 1.0), np.maximum(seq, 1.0), heads, kv_heads,
                                   "heads")
        return np.where(seq > 0, out.reshape(seq.shape) if seq.ndim else out[0], 0.0)

    def generation_attention(self, batch, kv_tokens: float, heads: int,
                             kv_heads: int) -> np.ndarray:
        """Seconds of one layer's decode attention of `batch` requests holding `kv_tokens`
        tokens each (batch may be an array)."""
        batch = np.atleast_1d(np.asarray(batch, dtype=float))
        out = np.array([self.generation.seconds(max(b, 1.0), [max(kv_tokens, 1.0)], heads,
                                                kv_heads, "kv")[0] for b in batch])
        return np.where(batch > 0, out, 0.0)

    def generation_attention_grid(self, batch: np.ndarray, kv_tokens: float, heads: int,
                                  kv_heads: int) -> np.ndarray:
        """`generation_attention` over many batch sizes, interpolated between the measured
        batches (log-log) for speed."""
        measured = self.generation.batch
        points = measured[measured <= max(batch.max(), measured[0])]
        points = _sorted_distinct([*points, max(batch.max(), measured[0])])
        values = self.generation_attention(points, kv_tokens, heads, kv_heads)
        return _loglog(np.maximum(batch, 1.0), points, values)

    def variant(self, key: str) -> "_AttentionGrid | None":
        """An attention table for another head size or a sliding window (e.g.
        context_attention_d64_w128), None where not derived (bf16 KV only)."""
        if key not in self._variants:
            table = self.document.get(key) if self.kv_dtype == "bf16" else None
            self._variants[key] = (None if table is None else _AttentionGrid(
                table, "isl" if key.startswith("context") else "kv_tokens",
                2.0 if key.startswith("context") else 1.0))
        return self._variants[key]

    def what(self) -> str:
        return f"{self.gpu}/{self.engine}/{self.dtype}" + (
            "" if self.kv_dtype == "bf16" else f"/KV {self.kv_dtype}")

    # --- mixture of experts ------------------------------------------------------------
    def model_note(self, model: ModelSpec) -> str:
        """What an issue-36 model's latencies read beyond the GEMM and GQA tables (its MLA
        module, attention variants, measured MoE data type), for the latency_source line;
        "" for the other models."""
        if not _modern(model) and not (model.is_moe and self.moe.get(_moe_key(model), {})
                                       .get("moe_dtype")):
            return ""
        parts = []
        if model.is_mla and self.mla is not None:
            table = self.document[self.mla_keys[0]]
            parts.append(f"MLA module of {table['model']} ({table['kernel_source']}, "
                         f"{table['gemm_dtype']} GEMMs, {self.kv_dtype} KV)")
        elif model.head_dim != 128 or model.sliding_layers:
            keys = [_variant_key("context", model.head_dim, w)
                    for w in (0, model.sliding_window or 0) if w or
                    model.layers > model.sliding_layers]
            parts.append("attention " + ", ".join(k.removeprefix("context_attention_")
                                                  for k in dict.fromkeys(keys)))
        if model.is_moe:
            parts.append(self.moe_source(model))
        return ", " + "; ".join(parts)

    def moe_elsewhere(self, model: ModelSpec) -> list[str]:
        """The other data types of this GPU and engine whose tables measure the model's MoE
        shape when these do not (DeepSeek in bf16: ["fp8"])."""
        key = _moe_key(model)
        if not model.is_moe or key in self.moe:
            return []
        return [d for g, e, d in available_tables() if (g, e) == (self.gpu, self.engine)
                and d != self.dtype and key in ((_document(g, e, d).get("moe") or {})
                                                .get("shapes", {}))]

    def moe_source(self, model: ModelSpec) -> str:
        """Where the model's MoE layer latency comes from (its measured data type)."""
        shape = self.moe.get(_moe_key(model))
        if shape is None:
            return "grouped GEMM estimate (no MoE rows of the shape)"
        return (f"measured MoE {_moe_key(model)} ({shape.get('moe_dtype', self.dtype)}, "
                f"{shape['distribution']}, {shape['kernel_source']})")

    def moe_layer(self, tokens, model: ModelSpec, tp: int) -> np.ndarray:
        """Seconds of one MoE layer's experts (fused dispatch, expert GEMMs, combine) at
        `tokens` tokens. Measured where the shape and moe_tp are in the tables; at another
        measured moe_tp of the shape, scaled by moe_tp_measured / tp (the experts' work splits
        evenly) but never below the measured one-token latency; a shape not measured at all is
        a grouped GEMM: the GEMMs of all routed tokens (tokens x top-k rows) or reading the
        weights of every expert the tokens reach, whichever is slower."""
        tokens = np.asarray(tokens, dtype=float)
        key = _moe_key(model)
        measured = self.moe.get(key, {}).get("tp", {})
        if measured:
            have = sorted(int(t) for t in measured)
            lower = [t for t in have if t <= tp]
            use = tp if tp in have else (lower[-1] if lower else have[0])
            shape = measured[str(use)]
            xs, ys = np.array(shape["tokens"], float), np.array(shape["us"], float) * 1e-6
            out = _loglog(np.maximum(tokens, xs[0]), xs, ys, 1.0)
            if use != tp:
                out = np.maximum(out * use / tp, ys[0])
            return np.where(tokens > 0, out, 0.0)
        if _modern(model):
            measured = ", ".join(sorted(self.moe)) or "none"
            other = self.moe_elsewhere(model)
            hint = (f" (the {', '.join(other)} tables measure it: --dtype {other[0]})"
                    if other else "")
            raise InputError(f"no measured MoE layer of {model.name}'s shape {key} (hidden/"
                             f"expert width/experts/top-k) in the {self.what()} kernel tables"
                             f"{hint}; measured: {measured}")
        e, topk, width = model.experts, model.experts_per_token, model.expert_intermediate_size
        routed = tokens * topk
        up = (2 if model.mlp_gated else 1) * width // tp
        compute = self.gemm(routed, up, model.hidden) + self.gemm(routed, model.hidden, width // tp)
        reached = e * (1.0 - (1.0 - topk / e) ** np.maximum(tokens, 0.0))
        weight_bytes = reached * (up + width // tp) * model.hidden * model.bytes_per_value
        return np.where(tokens > 0, np.maximum(compute, self.memory_op(weight_bytes)), 0.0)


    # --- expert parallelism (issue 36) --------------------------------------------------
    def moe_ep_sizes(self, model: ModelSpec, balanced: bool = False) -> list[int]:
        """The EP sizes (moe_tp 1) at which the model's MoE layer is measured."""
        shape = self.moe.get(_moe_key(model), {})
        return sorted(int(e) for e in shape.get("ep_balanced" if balanced else "ep", {}))

    def moe_layer_ep(self, tokens, model: ModelSpec, ep: int,
                     balanced: bool = False) -> np.ndarray:
        """Seconds of one MoE layer on one GPU of an expert-parallel group of `ep` GPUs
        (experts / ep whole experts each, moe_tp 1) when the group's attention ranks send it
        `tokens` tokens in all, as measured (routing skewed as the tables' power law, or
        `balanced`: expert load balancing). Refused where the EP size is not measured."""
        key = _moe_key(model)
        table = self.moe.get(key, {}).get("ep_balanced" if balanced else "ep", {})
        row = table.get(str(ep))
        if row is None:
            have = ", ".join(str(e) for e in self.moe_ep_sizes(model, balanced)) or "none"
            raise InputError(f"no measured MoE layer of {model.name} ({key}) at EP {ep} in "
                             f"the {self.what()} kernel tables; measured EP sizes: {have}")
        tokens = np.asarray(tokens, dtype=float)
        xs, ys = np.array(row["tokens"], float), np.array(row["us"], float) * 1e-6
        out = _loglog(np.maximum(tokens, xs[0]), xs, ys, 1.0)
        return np.where(tokens > 0, out, 0.0)

    def _alltoall_entry(self, model: ModelSpec) -> tuple[dict, str, float]:
        """(measured all-to-all of one node, where from, bytes factor): this file's, or the same
        GPU's under another engine; the model's (hidden, top-k) shape, else the nearest
        measured hidden size of its top-k, scaled by the bytes a token carries."""
        documents = [self.document] + [_document(g, e, d) for g, e, d in available_tables()
                                       if g == self.gpu and (e, d) != (self.engine, self.dtype)]
        for document in documents:
            table = document.get("moe_alltoall")
            if not table or not table.get("shapes"):
                continue
            shapes = {tuple(int(x) for x in k.split("/")): v for k, v in table["shapes"].items()}
            same = [k for k in shapes if k[1] == model.experts_per_token] or list(shapes)
            best = min(same, key=lambda k: (abs(k[0] - model.hidden), abs(k[2] - model.experts)))
            factor = (model.hidden * model.experts_per_token) / (best[0] * best[1])
            where = (f"{document['engine']} {table.get('kernel_source', 'all-to-all')} "
                     f"{'/'.join(str(x) for x in best)}")
            return shapes[best], where, factor
        raise InputError(f"no measured MoE all-to-all for {self.gpu} in the kernel tables: "
                         "data-parallel attention with expert parallelism cannot be priced")

    def alltoall(self, tokens, model: ModelSpec, placement: "ExpertParallel",
                 phase: str) -> np.ndarray:
        """Seconds of one MoE layer's dispatch plus combine when every GPU of the group sends
        `tokens` tokens: measured within one node (its EP size, per token count; prompt
        iterations with the engine's high-throughput kernels, decodes with its low-latency
        ones), the part above the one-token latency scaled by the share of a GPU's
        destinations that are other GPUs of its machine (an NVL72 rack's 72 GPUs are one
        NVLink domain); a group spanning machines also sends the tokens bound for other
        machines over each GPU's link, RDMA_LATENCY_S plus their bytes at RDMA_EFFICIENCY of
        the link, and pays the slower of the two paths."""
        tokens = np.asarray(tokens, dtype=float)
        entry, _, factor = self._alltoall_entry(model)
        sizes = sorted(int(e) for e in entry)
        measured_ep = sizes[-1]
        rows = entry[str(measured_ep)].get(phase) or next(iter(entry[str(measured_ep)].values()))
        # the share of a GPU's destinations that are other GPUs of its machine, against the
        # measured node's (its bandwidth term scales with the bytes; the latency does not)
        inside = min(placement.ep, placement.machine_gpus)
        share = ((inside - 1.0) / placement.ep) / ((measured_ep - 1.0) / measured_ep)
        total = np.zeros_like(tokens)
        remote = max(0.0, 1.0 - placement.machine_gpus / placement.ep)
        for kind, value_bytes in (("dispatch", DISPATCH_BYTES), ("combine", BF16_BYTES)):
            xs = np.array(rows[kind]["tokens"], float)
            ys = np.array(rows[kind]["us"], float) * 1e-6
            measured = _loglog(np.maximum(tokens, xs[0]), xs, ys, 1.0)
            local = ys[0] + np.maximum(measured * factor - ys[0], 0.0) * share
            if remote:
                sent = (tokens * model.experts_per_token * remote * model.hidden * value_bytes)
                rdma = RDMA_LATENCY_S + sent / (RDMA_EFFICIENCY * placement.link_bytes_per_s)
                local = np.maximum(local, rdma)
            total = total + local
        return np.where(tokens > 0, total, 0.0)


def _moe_key(model: ModelSpec) -> str:
    return (f"{model.hidden}/{model.expert_intermediate_size}/{model.experts}/"
            f"{model.experts_per_token}")


def _modern(model: ModelSpec) -> bool:
    """An issue-36 architecture (MLA, shared experts, dense first layers, sliding windows,
    another head size): priced from measured tables only, never from an estimate."""
    return bool(model.is_mla or model.shared_experts or model.dense_layers
                or model.sliding_layers or model.attention_sinks
                or (model.head_dim != 128 and model.head_dim_size is not None))


def _attention_kinds(tables: "KernelTables", model: ModelSpec):
    """[(context grid, generation grid, share of the layers, window)] of the model's attention:
    the head_dim-128 GQA tables (None: the tables' own methods), an MLA model's MLA module, or
    per head size and window the derived variants. Refused in one line naming what the tables
    hold where the model's attention is not measured."""
    if model.is_mla:
        if tables.mla is None:
            key = tables.mla_keys[0]
            have = [f"{g}/{e}/{d}" for g, e, d in available_tables()
                    if key in _document(g, e, d)]
            held = ("(bf16 KV only); MLA tables" if tables.kv_dtype == "bf16" else
                    f"({key}); {tables.kv_dtype}-KV MLA tables (in the weights' file)")
            raise InputError(f"no measured MLA attention for {model.name} in the "
                             f"{tables.what()} kernel tables {held}: "
                             f"{', '.join(have) or 'none'}")
        return [(tables.mla[0], tables.mla[1], 1.0, None)]
    if model.head_dim == 128 and not model.sliding_layers:
        return [(None, None, 1.0, None)]
    kinds = []
    full = model.layers - model.sliding_layers
    for window, share in ((0, full / model.layers),
                          (model.sliding_window or 0, model.sliding_layers / model.layers)):
        if share == 0:
            continue
        context = tables.variant(_variant_key("context", model.head_dim, window))
        generation = tables.variant(_variant_key("generation", model.head_dim, window))
        if context is None or generation is None:
            key = _variant_key("context", model.head_dim, window)
            raise InputError(f"no measured attention of head size {model.head_dim}"
                             + (f" with a {window}-token window" if window else "")
                             + f" for {model.name} in the {tables.what()} kernel tables "
                             f"({key}; bf16 KV only); they hold head size 128 without a window")
        kinds.append((context, generation, share, window or None))
    return kinds


def pricing_problem(model: ModelSpec, tables: "KernelTables") -> str:
    """Why the tables cannot price an issue-36 model's attention or MoE layers ("" when they
    can): its MLA or attention variant, or its MoE shape, is not measured."""
    try:
        _attention_kinds(tables, model)
        if model.is_moe:
            tables.moe_layer(1.0, model, 1)
    except InputError as err:
        return str(err)
    return ""


def _variant_key(kind: str, head_dim: int, window: int) -> str:
    return f"{kind}_attention_d{head_dim}" + (f"_w{window}" if window else "")


def _context_attention(tables: "KernelTables", shapes: "ModelShapes", batch: float, seq):
    """Per layer (mean over the layers), seconds of causal prefill attention of `batch`
    sequences of `seq` tokens (for MLA: the whole measured attention module)."""
    kinds = _attention_kinds(tables, shapes.model)
    if kinds[0][0] is None:
        return tables.context_attention(batch, seq, shapes.heads, shapes.kv_heads)
    seq = np.asarray(seq, dtype=float)
    kv = 1 if shapes.model.is_mla else shapes.kv_heads
    total = 0.0
    for context, _, share, _ in kinds:
        out = context.seconds(max(batch, 1.0), np.maximum(seq, 1.0), shapes.heads, kv, "heads")
        total = total + share * (out.reshape(seq.shape) if seq.ndim else out[0])
    return np.where(seq > 0, total, 0.0)


def _generation_attention(tables: "KernelTables", shapes: "ModelShapes", batch,
                          kv_tokens: float):
    """Per layer (mean), seconds of decode attention of `batch` requests holding `kv_tokens`
    each (a sliding-window table is measured with the window: the kernel reads at most it)."""
    kinds = _attention_kinds(tables, shapes.model)
    if kinds[0][0] is None:
        return tables.generation_attention(batch, kv_tokens, shapes.heads, shapes.kv_heads)
    batch = np.atleast_1d(np.asarray(batch, dtype=float))
    mla = shapes.model.is_mla
    kv, axis = (1, "heads") if mla else (shapes.kv_heads, "kv")
    total = np.zeros(batch.shape)
    for _, generation, share, _ in kinds:
        total = total + share * np.array([generation.seconds(
            max(b, 1.0), [max(kv_tokens, 1.0)], shapes.heads, kv, axis)[0] for b in batch])
    return np.where(batch > 0, total, 0.0)


def _sorted_distinct(values) -> np.ndarray:
    """np.unique of a few floats without NaN, the same array: numpy's np.unique and np.median
    import numpy.ma (about 12 ms of every command that builds curves)."""
    return np.array(sorted(set(map(float, values))), dtype=float)


def _generation_attention_grid(tables: "KernelTables", shapes: "ModelShapes",
                               batch: np.ndarray, kv_tokens: float):
    kinds = _attention_kinds(tables, shapes.model)
    if kinds[0][0] is None:
        return tables.generation_attention_grid(batch, kv_tokens, shapes.heads,
                                                shapes.kv_heads)
    measured = kinds[0][1].batch
    points = measured[measured <= max(batch.max(), measured[0])]
    points = _sorted_distinct([*points, max(batch.max(), measured[0])])
    values = _generation_attention(tables, shapes, points, kv_tokens)
    return _loglog(np.maximum(batch, 1.0), points, values)


def _shortest_kv(tables: "KernelTables", model: ModelSpec) -> float:
    kinds = _attention_kinds(tables, model)
    return float((tables.generation if kinds[0][0] is None else kinds[0][1]).length[0])


@dataclass(frozen=True)
class Chunk:
    """Prompt work in an iteration: `tokens` new tokens of a prompt with `cached` tokens
    already in the KV cache (0: a whole prompt or a first chunk)."""
    tokens: int
    cached: int = 0


@dataclass(frozen=True)
class ExpertParallel:
    """Where an expert-parallel layout's MoE layers run (issue 36): a group of `ep` GPUs, each
    holding experts / ep whole experts, fed by `dp` attention ranks (dp = 1: tensor-parallel
    attention over the group, every GPU holds every token and the experts' outputs are
    all-reduced as a dense layer's; dp > 1: data-parallel attention, tokens dispatched to
    their experts' GPUs and combined back by all-to-all). `machine_gpus` is one machine's
    NVLink domain, `link_bytes_per_s` one GPU's link to other machines."""
    ep: int
    dp: int
    machine_gpus: int
    link_bytes_per_s: float
    balanced: bool = False     # expert load balancing: the measured balanced routing


@dataclass(frozen=True)
class ModelShapes:
    """Per-GPU shapes of a model at tensor parallelism `tp` (of one attention rank when the
    experts are expert-parallel, `experts`)."""
    model: ModelSpec
    tp: int
    experts: ExpertParallel | None = None

    def __post_init__(self):
        m = self.model
        missing = [f for f in ("intermediate_size", "vocab_size") if getattr(m, f) is None]
        if missing:
            raise InputError(f"model '{m.name}' lacks {', '.join(missing)} (needed for its "
                             "GEMM shapes; see hardware_catalog/models.yaml)")
        if self.tp < 1 or m.heads % self.tp:
            raise InputError(f"model '{m.name}': {m.heads} heads do not split over TP {self.tp}")

    @property
    def heads(self) -> int:
        return self.model.heads // self.tp

    @property
    def kv_heads(self) -> int:
        return max(1, self.model.kv_heads // self.tp)

    def gemms(self) -> list[tuple[int, int]]:
        """(n, k) of the dense per-layer GEMMs, each run with m = the iteration's tokens (an
        MLA model's attention projections are in its measured MLA module; a model with dense
        first layers: the MoE layers' GEMMs, see `dense_mlp_gemms`)."""
        m, tp, d = self.model, self.tp, self.model.head_dim
        shapes = [] if m.is_mla else [((self.heads + 2 * self.kv_heads) * d, m.hidden),  # QKV
                                      (m.hidden, self.heads * d)]          # attention output
        if m.is_moe and m.shared_experts:
            width = m.shared_experts * m.expert_intermediate_size // tp
            shapes += [(m.experts, m.hidden), (2 * width, m.hidden), (m.hidden, width)]
            return shapes
        if not m.is_moe:
            shapes += [((2 if m.mlp_gated else 1) * m.intermediate_size // tp, m.hidden),
                       (m.hidden, m.intermediate_size // tp)]
        else:
            shapes += [(m.experts, m.hidden)]                          # router (replicated)
        return shapes

    def dense_mlp_gemms(self) -> list[tuple[int, int]]:
        """(n, k) of a dense first layer's MLP (DeepSeek's first_k_dense_replace layers)."""
        m, tp = self.model, self.tp
        return [((2 if m.mlp_gated else 1) * m.intermediate_size // tp, m.hidden),
                (m.hidden, m.intermediate_size // tp)]

    @property
    def kernels_per_layer(self) -> int:
        """Kernel launches per layer: GEMMs, attention (+ rotary / KV write), three element-wise
        ops, the MoE layer's dispatch, experts and combine, two all-reduces."""
        return (len(self.gemms()) + 2 + 3 + (3 if self.model.is_moe else 0)
                + (2 if self.tp > 1 else 0))


def _layer_dense_seconds(tables: KernelTables, shapes: ModelShapes, tokens, graph: bool,
                         phase: str = "context"):
    """Per-layer seconds of everything but attention, for iterations of `tokens` tokens
    (`phase`: "context" for prompt iterations, "generation" for decodes, which use different
    all-to-all kernels under expert parallelism)."""
    m = shapes.model
    tokens = np.asarray(tokens, dtype=float)
    if m.is_mla or m.shared_experts or m.dense_layers:
        t = _modern_layer_seconds(tables, shapes, tokens, phase)
        act_width = 0
    elif m.is_moe:
        t = sum(tables.gemm(tokens, n, k) for n, k in shapes.gemms())
        t = t + _experts_seconds(tables, shapes, tokens, phase)
        act_width = 0
    else:
        t = sum(tables.gemm(tokens, n, k) for n, k in shapes.gemms())
        act_width = m.intermediate_size // shapes.tp
    t = t + 2 * tables.all_reduce(tokens * m.hidden, shapes.tp, graph)
    # two residual add + RMSNorm (read 2h, write 2h) and the gated activation (2I/tp -> I/tp)
    t = t + 2 * tables.memory_op(tokens * 4 * m.hidden * BF16_BYTES)
    if act_width:
        t = t + tables.memory_op(tokens * 3 * act_width * BF16_BYTES)
    return t


def _modern_layer_seconds(tables: KernelTables, shapes: ModelShapes, tokens,
                          phase: str = "context"):
    """Per layer (mean over the layers), DeepSeek-style: the attention GEMMs (none for MLA:
    its projections are in the measured MLA module), and the MLP: in the first
    `dense_layers` layers a dense gated MLP, in the others the router, the measured routed
    experts and the shared experts (a dense gated MLP of shared x expert width, split by TP
    as vLLM does), each MLP with its activation."""
    m = shapes.model
    gemms = shapes.gemms()
    attention = 0 if m.is_mla else 2     # the QKV and output GEMMs come first
    t = sum(tables.gemm(tokens, n, k) for n, k in gemms[:attention])
    moe = (sum(tables.gemm(tokens, n, k) for n, k in gemms[attention:])
           + _experts_seconds(tables, shapes, tokens, phase))
    if m.shared_experts:
        width = m.shared_experts * m.expert_intermediate_size // shapes.tp
        moe = moe + tables.memory_op(tokens * 3 * width * BF16_BYTES)
    if not m.dense_layers:
        return t + moe
    dense = (sum(tables.gemm(tokens, n, k) for n, k in shapes.dense_mlp_gemms())
             + tables.memory_op(tokens * 3 * (m.intermediate_size // shapes.tp) * BF16_BYTES))
    return t + (m.moe_layers * moe + m.dense_layers * dense) / m.layers


def _experts_seconds(tables: KernelTables, shapes: ModelShapes, tokens, phase: str):
    """Seconds of one MoE layer's routed experts for an iteration of `tokens` tokens on one
    attention rank: split by TP (`KernelTables.moe_layer`), or expert-parallel: the measured
    MoE layer at the group's EP over the group's tokens, plus, under data-parallel attention,
    the dispatch and combine all-to-all (`KernelTables.alltoall`).

    The group's tokens are the rank's times its `dp` ranks: every rank is taken to carry as
    many tokens as this one (engines balance requests over the ranks; a rank with fewer
    tokens still waits for the group's MoE layer). This is exact for balanced ranks and
    pessimistic for a lone request (its rank is priced as if the group were as busy)."""
    placement = shapes.experts
    if placement is None:
        return tables.moe_layer(tokens, shapes.model, shapes.tp)
    tokens = np.asarray(tokens, dtype=float)
    t = tables.moe_layer_ep(tokens * placement.dp, shapes.model, placement.ep,
                            placement.balanced)
    if placement.dp > 1:
        t = t + tables.alltoall(tokens / shapes.tp, shapes.model, placement, phase)
    return t


def _once_seconds(tables: KernelTables, shapes: ModelShapes, tokens, sequences, graph: bool):
    """Embedding (a gather of T rows, an all-reduce under vocabulary parallelism) and the LM
    head on one token per sequence."""
    m = shapes.model
    tokens = np.asarray(tokens, dtype=float)
    return (tables.memory_op(tokens * m.hidden * BF16_BYTES)
            + tables.all_reduce(tokens * m.hidden, shapes.tp, graph)
            + tables.bf16.gemm(sequences, m.vocab_size // shapes.tp, m.hidden))


def _finish(tables: KernelTables, shapes: ModelShapes, kernels, tokens):
    tokens = np.asarray(tokens, dtype=float)
    eager = tokens > CUDA_GRAPH_TOKENS
    dispatch = np.where(eager, shapes.kernels_per_layer * shapes.model.layers * tables.launch_s,
                        0.0)
    return np.maximum(kernels, dispatch)


def iteration_time(model: ModelSpec, tables: KernelTables, tp: int,
                   prompts: Iterable[Chunk | int] = (), decode_contexts: Sequence[float] = (),
                   experts: ExpertParallel | None = None) -> float:
    """Seconds of one iteration (see the module docstring): `prompts` are whole prompts (ints,
    token counts) or `Chunk`s with their cached prefix; `decode_contexts` the context length
    of every decode request in the batch."""
    shapes = ModelShapes(model, tp, experts)
    chunks = [c if isinstance(c, Chunk) else Chunk(int(c)) for c in prompts]
    chunks = [c for c in chunks if c.tokens > 0]
    decodes = [float(x) for x in decode_contexts]
    tokens = sum(c.tokens for c in chunks) + len(decodes)
    if tokens == 0:
        return 0.0
    graph = tokens <= CUDA_GRAPH_TOKENS
    layer = float(_layer_dense_seconds(tables, shapes, tokens, graph,
                                       "context" if chunks else "generation"))
    if chunks:
        s_eq = [math.sqrt(c.tokens ** 2 + 2.0 * c.tokens * c.cached) for c in chunks]
        rms = math.sqrt(sum(s * s for s in s_eq) / len(s_eq))
        layer += float(_context_attention(tables, shapes, len(chunks), rms))
    if decodes:
        layer += float(_generation_attention(tables, shapes, len(decodes),
                                             float(np.mean(decodes)))[0])
    kernels = model.layers * layer + float(_once_seconds(tables, shapes, tokens,
                                                         len(chunks) + len(decodes), graph))
    return float(_finish(tables, shapes, kernels, tokens))


def _monotone(values: np.ndarray) -> np.ndarray:
    """Measured timings are noisy; a curve never falls (a dip is flattened to its left value)."""
    return np.maximum.accumulate(values)


def kernel_curves(model: ModelSpec, tables: KernelTables, tp: int,
                  experts: ExpertParallel | None = None) -> LatencyCurves:
    """`LatencyCurves` of the composition for one model instance at TP `tp` (uncapped; one
    attention rank of an expert-parallel group when `experts` is given)."""
    shapes = ModelShapes(model, tp, experts)
    layers = model.layers
    # prompt: one prompt of T tokens
    t = PROMPT_KNOTS
    graph = t <= CUDA_GRAPH_TOKENS
    dense = np.where(graph, _layer_dense_seconds(tables, shapes, t, True, "context"),
                     _layer_dense_seconds(tables, shapes, t, False, "context"))
    attention = _context_attention(tables, shapes, 1, t)
    once = np.where(graph, _once_seconds(tables, shapes, t, 1, True),
                    _once_seconds(tables, shapes, t, 1, False))
    prompt = _finish(tables, shapes, layers * (dense + attention) + once, t)
    # decode: b requests at the shortest measured context; context cost K per KV token
    b = DECODE_KNOTS
    kv0 = _shortest_kv(tables, model)
    gen = _generation_attention_grid(tables, shapes, b, kv0)
    graph_b = b <= CUDA_GRAPH_TOKENS
    dense_b = np.where(graph_b, _layer_dense_seconds(tables, shapes, b, True, "generation"),
                       _layer_dense_seconds(tables, shapes, b, False, "generation"))
    once_b = np.where(graph_b, _once_seconds(tables, shapes, b, b, True),
                      _once_seconds(tables, shapes, b, b, False))
    decode = _finish(tables, shapes, layers * (dense_b + gen) + once_b, b)
    k = layers * context_cost_per_token(tables, shapes)
    a = layers * pair_cost(tables, shapes)
    return LatencyCurves(t.copy(), _monotone(prompt), b.copy(), _monotone(decode), k,
                         chunk_attention_s=a, chunk_kv_read_s=k)


def context_cost_per_token(tables: KernelTables, shapes: ModelShapes) -> float:
    """Per layer: seconds of decode attention per KV token held, the median slope of the
    generation-attention table between 4k and 16k tokens per request at batches 8 to 64."""
    slopes = []
    for batch in (8, 16, 32, 64):
        lo, hi = _generation_attention(tables, shapes, [batch], 4096)[0], \
            _generation_attention(tables, shapes, [batch], 16384)[0]
        slopes.append((hi - lo) / (batch * (16384 - 4096)))
    return max(float(statistics.median(slopes)), 0.0)


def pair_cost(tables: KernelTables, shapes: ModelShapes) -> float:
    """Per layer: seconds per (chunk token x cached token) of context attention, from a long
    prompt's measured attention (S^2 / 2 pairs at S = 8192)."""
    s = 8192.0
    return float(_context_attention(tables, shapes, 1, s)) / (s * s / 2)


class KernelPerformanceModel(PerformanceModel):
    """Latency curves per (model, machine) from the kernel tables: a
    `simcore.performance.PerformanceModel` (`curves`, `is_calibrated`). TP is the layout's
    (`curves(..., tp)`), the whole machine when not given, unless the model was built with a
    fixed `tp`. `overheads`: the engine's time around the kernels, carried by the curves
    (none by default: the kernels alone)."""

    def __init__(self, engine: str = "vllm", dtype: str = "bf16", tp: int | None = None,
                 kv_dtype: str = "bf16", overheads: EngineOverheads = NO_OVERHEADS):
        self.engine, self.dtype, self.tp = engine, dtype, tp
        self.kv_dtype = kv_dtype
        self.overheads = overheads
        self.source = f"kernels:{engine}:{dtype}" + ("" if kv_dtype == "bf16"
                                                      else f":kv-{kv_dtype}")
        self._cache: dict[tuple, LatencyCurves] = {}

    def tables(self, machine: MachineSku) -> KernelTables:
        gpu = GPU_OF_MACHINE.get(machine.gpu)
        if gpu is None:
            raise InputError(f"no kernel tables for GPU '{machine.gpu}' of machine "
                             f"'{machine.name}'; measured: {', '.join(sorted(GPU_OF_MACHINE))}")
        return load_tables(gpu, self.engine, self.dtype, self.kv_dtype)

    def tensor_parallel(self, model: ModelSpec, machine: MachineSku, tp: int | None = None) -> int:
        tp = self.tp or tp or machine.instance_tp
        if tp > machine.gpus:
            raise InputError(f"TP {tp} exceeds the {machine.gpus} GPUs of '{machine.name}'")
        return tp

    def is_calibrated(self, model: ModelSpec, machine: MachineSku, tp: int | None = None) -> bool:
        """Measured kernels exist for the machine's GPU (and the model has its shapes)."""
        if not covers(machine, self.engine, self.dtype, self.kv_dtype):
            return False
        return model.intermediate_size is not None and model.vocab_size is not None

    def curves(self, model: ModelSpec, machine: MachineSku, tp: int | None = None) -> LatencyCurves:
        """Latency curves in seconds, the power cap applied to prompt latencies only."""
        tp = self.tensor_parallel(model, machine, tp)
        key = (model, machine, tp)  # the records: an fp8 model or an edited catalog is another key
        if key not in self._cache:
            curves = kernel_curves(model, self.tables(machine), tp)
            self._cache[key] = self.overheads.apply(
                curves.scaled(prompt_factor=machine.prompt_slowdown), model)
        return self._cache[key]

    def prices_expert_parallelism(self, model: ModelSpec, machine: MachineSku) -> bool:
        return model.is_moe and self.is_calibrated(model, machine)

    def expert_parallel_curves(self, model: ModelSpec, machine: MachineSku,
                               layout) -> LatencyCurves:
        """Latency curves of one attention rank of an expert-parallel layout
        (`hardware_catalog.Layout` with ep > 1), the power cap applied to prompts."""
        key = (model, machine, layout)
        if key not in self._cache:
            tables = self.tables(machine)
            if not model.is_moe:
                raise InputError(f"{model.name} has no experts to spread (EP {layout.ep})")
            curves = kernel_curves(model, tables, layout.tp, expert_placement(machine, layout))
            self._cache[key] = self.overheads.apply(
                curves.scaled(prompt_factor=machine.prompt_slowdown), model)
        return self._cache[key]


def expert_placement(machine: MachineSku, layout, balanced: bool = False) -> ExpertParallel:
    """The `ExpertParallel` record of an expert-parallel layout on a machine."""
    return ExpertParallel(layout.ep, layout.dp, machine.gpus,
                          machine.kv_link_gbps * 1e9 / 8.0, balanced)


def machine_latency_source(machine: MachineSku) -> dict:
    """Where a machine's latencies come from (`provision catalog --json`): the kernel tables
    of its GPU (database and version, per engine its version and the weight and KV data types)
    and the splitwise-2023 model's view of it (its own 2023 profiles, or scaled from another
    SKU's by datasheet ratios); `default` is what `--engine vllm --dtype bf16` uses."""
    gpu = GPU_OF_MACHINE.get(machine.gpu)
    engines = coverage().get(gpu, {}) if gpu is not None else {}
    legacy = ({"calibrated": True, "from": f"the 2023 Splitwise profiles of {machine.perf_profile}"}
              if machine.calibrated else
              {"calibrated": False, "from": f"{machine.perf_profile}'s 2023 profiles scaled by "
                                            "datasheet ratios (expect 15-30% error)"})
    tables = None
    if engines:
        tables = {"database": kernel_data_version(), "gpu": gpu,
                  "engines": {engine: {"versions": entry["engine_version"],
                                       "dtypes": sorted(entry["dtypes"]),
                                       "kv_dtypes": entry["kv_dtypes"]}
                              for engine, entry in sorted(engines.items())}}
    default = ("kernel_tables:vllm:bf16" if "bf16" in engines.get("vllm", {}).get("dtypes", ())
               else "splitwise-2023")
    return {"default": default, "kernel_tables": tables, "splitwise-2023": legacy}


@lru_cache(maxsize=1)
def kernel_data_version() -> str:
    """Where the shipped kernel tables come from, e.g. 'aiconfigurator-core 0.12.0'."""
    gpu, engine, dtype = available_tables()[0]
    document = load_tables(gpu, engine, dtype).document
    return f"{document['source']} {document['version']}"


def tables_sha256(engine: str, dtype: str, kv_dtype: str = "bf16") -> str:
    """A hash of every shipped table of (engine, dtype) (part of a search's cache identity),
    with the fp8 files that hold the fp8-KV attention when `kv_dtype` is fp8."""
    import hashlib
    digest = hashlib.sha256()
    wanted = {dtype} | ({"fp8"} if kv_dtype == "fp8" else set())
    for gpu, e, d in available_tables():
        if e == engine and d in wanted:
            digest.update(f"{gpu}-{e}-{d}\0".encode())
            digest.update((KERNEL_DIR / f"{gpu}-{e}-{d}.json").read_bytes())
    return digest.hexdigest()


class EnginePerformanceModel(PerformanceModel):
    """An engine's latencies: the kernel model (`KernelPerformanceModel(engine, dtype)`) for
    every (model, machine) pair its tables cover, `fallback` (the model fitted to the 2023
    Splitwise profiles) for the others: a GPU without tables for the engine and data type
    (MI300X; L40S under SGLang), a model without its GEMM shapes (`intermediate_size`,
    `vocab_size`) or whose heads do not split over its TP. Fallback pairs are not this engine's
    measurements: `is_calibrated` is False for them. The choice is made once per pair."""

    def __init__(self, kernels: KernelPerformanceModel, fallback):
        self.kernels, self.fallback = kernels, fallback
        self.engine, self.dtype, self.kv_dtype = kernels.engine, kernels.dtype, kernels.kv_dtype
        self.source = kernels.source
        self._covers: dict = {}

    def covers(self, model: ModelSpec, machine: MachineSku, tp: int | None = None) -> bool:
        key = (model, machine, tp or machine.instance_tp)
        if key not in self._covers:
            covered = self.kernels.is_calibrated(model, machine)
            if covered and _modern(model):
                tables = self.kernels.tables(machine)
                problem = pricing_problem(model, tables)
                if problem and ((self.dtype, self.kv_dtype) != ("bf16", "bf16")
                                or tables.moe_elsewhere(model)):
                    # no fp8 fallback, or another --dtype is measured: refused in one line
                    raise InputError(problem)
                covered = not problem   # bf16 without MLA tables (A100, the SLO reference):
                #                         the 2023 model, named as the fallback
            if covered:
                try:
                    ModelShapes(model, self.kernels.tensor_parallel(model, machine, tp))
                except InputError:
                    covered = False
            self._covers[key] = covered
        return self._covers[key]

    def curves(self, model: ModelSpec, machine: MachineSku, tp: int | None = None) -> LatencyCurves:
        source = self.kernels if self.covers(model, machine, tp) else self.fallback
        return source.curves(model, machine, tp)

    def is_calibrated(self, model: ModelSpec, machine: MachineSku, tp: int | None = None) -> bool:
        return self.covers(model, machine, tp)

    def prices_expert_parallelism(self, model: ModelSpec, machine: MachineSku) -> bool:
        return self.kernels.prices_expert_parallelism(model, machine)

    def expert_parallel_curves(self, model: ModelSpec, machine: MachineSku,
                               layout) -> LatencyCurves:
        """Only the kernel tables measure expert-parallel MoE layers and their all-to-all."""
        if not self.kernels.is_calibrated(model, machine):
            raise InputError(f"expert parallelism on '{machine.name}' needs the {self.engine} "
                             f"{self.dtype} kernel tables of its GPU, which do not exist")
        return self.kernels.expert_parallel_curves(model, machine, layout)
