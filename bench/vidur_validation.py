"""simcore.kernels against Vidur's public profiles (c) and chunked-prefill overhead (d), issue 24.

    python bench/vidur_validation.py ops --vidur-dir DIR [--attention-2024 FILE]
    python bench/vidur_validation.py chunks --vidur-dir DIR [--attention-2024 FILE]

DIR is Vidur's `data/profiling` folder (github.com/microsoft/vidur; exported with git, see
bench/RESULTS.md): `compute/<gpu>/<hf org>/<hf model>/mlp.csv` and `.../attention.csv`,
`network/<gpu>_dgx/all_reduce.csv`. Vidur need not be installed; only its CSVs are read.

What the CSVs hold (read from vidur/profiling/ and vidur/execution_time_predictor/):
- mlp.csv: per (model shape, num_tensor_parallel_workers, num_tokens) the min/max/mean/median/std
  of one layer's operators on one GPU, in **ms** (CUDA events or Kineto): attn_pre_proj (QKV
  GEMM), attn_post_proj (output GEMM), mlp_up_proj (gate+up GEMM), mlp_down_proj, mlp_act,
  attn_rope, input_layernorm, post_attention_layernorm, add (Sarathi's layers, fp16, eager).
- attention.csv: per (n_q_head, n_kv_head, TP, block_size, batch_size, prefill_chunk_size,
  kv_cache_size) one layer's attn_prefill (batch 1, a chunk of prefill_chunk_size tokens after
  kv_cache_size cached ones) or attn_decode (prefill_chunk_size 0: batch_size requests holding
  kv_cache_size tokens), ms, FlashAttention/FlashInfer kernels only (Kineto).
- network/*/all_reduce.csv: NCCL all_reduce via torch.distributed, eager (no CUDA graph), `size`
  in **bytes** of fp16 (2 per value), the median NCCL kernel time in ms; rows with
  devices_per_node == num_workers are what Vidur uses for TP.
Vidur's predictor adds nccl_cpu_launch_overhead_ms = 0.02 per all-reduce and excludes the
embedding and LM head from model time; the layer sums below do the same.

(c) `ops`: per catalog model of the same shape (Llama-2-70B -> llama2-70b, Meta-Llama-3-8B ->
llama-3.1-8b, Meta-Llama-3-70B -> llama-3.1-70b), GPU (a100 -> a100_sxm, h100 -> h100_sxm, vLLM
bf16 tables), TP 1/2/4/8 and token count T, each profiled operator against the same operator of
simcore.kernels, and the layer without attention; attention (prefill, chunked prefill, decode)
and whole-iteration model time where an attention.csv of the shape exists.

(d) `chunks`: a prompt of P tokens done as chunks of c tokens (each attending to its cached
prefix) over one P-token prefill, batch 1, per operator class (linear, attention, all-reduce)
and overall, as Sarathi-Serve's Figure 11 (Yi-34B, 2 A100s): with our composition for Yi-34B's
shape at TP2 on A100, and for Llama-2-70B at TP2 on A100 both with our composition and composed
from Vidur's A100 profiles (the only TP2 attention profile available to us).
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hardware_catalog import ModelSpec, load_catalog  # noqa: E402
from simcore.kernels import (CUDA_GRAPH_TOKENS, BF16_BYTES, Chunk, ModelShapes,  # noqa: E402
                             _layer_dense_seconds, iteration_time, load_tables)

CATALOG = load_catalog()
MODELS = {"meta-llama/Llama-2-70b-hf": "llama2-70b",
          "meta-llama/Meta-Llama-3-8B": "llama-3.1-8b",
          "meta-llama/Meta-Llama-3-70B": "llama-3.1-70b"}
LEGACY_HF = "meta-llama/Llama-2-70b-hf"   # the model of Vidur's 2024-05-08 a100/attention.csv
GPUS = {"a100": "a100_sxm", "h100": "h100_sxm"}
TPS = (1, 2, 4, 8)
TOKENS = (1, 16, 64, 256, 1024, 4096)
NCCL_LAUNCH_MS = 0.02          # Vidur's nccl_cpu_launch_overhead_ms, added per all-reduce
# 01-ai/Yi-34B config.json: Sarathi-Serve's Figure 11 model (not in our catalog)
YI_34B = ModelSpec(name="yi-34b", layers=60, hidden=7168, heads=56, kv_heads=8, params_b=34.4,
                   bytes_per_value=2, tensor_parallel=2, intermediate_size=20480,
                   vocab_size=64000, source="01-ai/Yi-34B config.json")
ELEMENTWISE = ("input_layernorm", "post_attention_layernorm", "add", "mlp_act", "attn_rope")


# --- Vidur's CSVs ----------------------------------------------------------------------
def _median(frame: pd.DataFrame, op: str) -> float:
    col = f"time_stats.{op}.median"
    if col not in frame or frame.empty:
        return float("nan")
    return float(frame[col].fillna(0.0).median())


def load_mlp(vidur: Path, gpu: str, hf: str) -> pd.DataFrame | None:
    path = vidur / "compute" / gpu / hf / "mlp.csv"
    return pd.read_csv(path).drop_duplicates() if path.is_file() else None


def load_attention(vidur: Path, gpu: str, hf: str, model: ModelSpec, tp: int,
                   extra: Path | None) -> tuple[pd.DataFrame | None, str]:
    """Vidur's attention rows for the model's shape at TP `tp` (block size 16): from
    compute/<gpu>/<hf>/attention.csv, else (Llama-2-70B on A100) from the 2024-05-08
    single-file profile if given (it holds that shape at TP2 only)."""
    for path, label in ((vidur / "compute" / gpu / hf / "attention.csv", "current"),
                        (extra if extra and gpu == "a100" and hf == LEGACY_HF else None,
                         "2024-05-08")):
        if path is None or not path.is_file():
            continue
        frame = pd.read_csv(path).drop_duplicates()
        frame = frame[(frame.n_embd == model.hidden) & (frame.n_q_head == model.heads)
                      & (frame.n_kv_head == model.kv_heads) & (frame.block_size == 16)
                      & (frame.num_tensor_parallel_workers == tp)]
        if not frame.empty:
            return frame, label
    return None, ""


class VidurAllReduce:
    """NCCL all-reduce times of one network profile, by GPU count, interpolated log-log in
    the message size (bytes)."""

    def __init__(self, path: Path):
        frame = pd.read_csv(path)
        frame = frame[(frame.collective == "all_reduce")
                      & (frame.devices_per_node == frame.num_workers)]
        self.curves = {}
        for gpus, group in frame.groupby("num_workers"):
            g = group.groupby("size")["time_stats.all_reduce.median"].median()
            self.curves[int(gpus)] = (g.index.to_numpy(float), g.to_numpy(float))

    def ms(self, nbytes: float, gpus: int) -> float:
        if gpus <= 1:
            return 0.0
        if gpus not in self.curves:
            return float("nan")
        xs, ys = self.curves[gpus]
        return float(np.exp(np.interp(np.log(nbytes), np.log(xs), np.log(ys))))


# --- the comparison --------------------------------------------------------------------
def ours_ops(tables, shapes: ModelShapes, tokens: int) -> dict[str, float]:
    """Our per-layer operator times (ms) at T tokens, named like Vidur's."""
    m, tp = shapes.model, shapes.tp
    (qkv, out, up, down) = shapes.gemms()
    graph = tokens <= CUDA_GRAPH_TOKENS
    elementwise = (2 * tables.memory_op(tokens * 4 * m.hidden * BF16_BYTES)
                   + tables.memory_op(tokens * 3 * (m.intermediate_size // tp) * BF16_BYTES))
    nccl = (tables._collective(np.array([tokens * m.hidden], float), tp, tables.nccl_values,
                               tables.nccl)[0] if tp > 1 and tables.nccl else 0.0)
    return {"attn_pre_proj": float(tables.gemm(tokens, *qkv)) * 1e3,
            "attn_post_proj": float(tables.gemm(tokens, *out)) * 1e3,
            "mlp_up_proj": float(tables.gemm(tokens, *up)) * 1e3,
            "mlp_down_proj": float(tables.gemm(tokens, *down)) * 1e3,
            "elementwise": float(elementwise) * 1e3,
            "all_reduce": float(tables.all_reduce(tokens * m.hidden, tp, graph)) * 1e3,
            "all_reduce_nccl": float(nccl) * 1e3,
            "layer_dense": float(_layer_dense_seconds(tables, shapes, tokens, graph)) * 1e3}


def vidur_ops(rows: pd.DataFrame, allreduce: VidurAllReduce, model: ModelSpec, tp: int,
              tokens: int) -> dict[str, float]:
    out = {op: _median(rows, op) for op in
           ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")}
    out["elementwise"] = sum(_median(rows, op) for op in ELEMENTWISE)
    ar = allreduce.ms(tokens * model.hidden * 2, tp)
    out["all_reduce"] = out["all_reduce_nccl"] = ar
    out["layer_dense"] = (sum(out[k] for k in ("attn_pre_proj", "attn_post_proj",
                                               "mlp_up_proj", "mlp_down_proj", "elementwise"))
                          + (2 * (ar + NCCL_LAUNCH_MS) if tp > 1 else 0.0))
    return out


def _attention_rows(frame: pd.DataFrame, chunk: int, kv: int, batch: int = 1) -> pd.DataFrame:
    return frame[(frame.prefill_chunk_size == chunk) & (frame.kv_cache_size == kv)
                 & (frame.batch_size == batch)]


def ops(vidur: Path, extra: Path | None) -> None:
    rows, missing = [], []
    for hf, name in MODELS.items():
        model = CATALOG.model(name)
        for gpu, system in GPUS.items():
            mlp = load_mlp(vidur, gpu, hf)
            if mlp is None:
                missing.append(f"{hf} on {gpu}: no mlp.csv")
                continue
            want = (model.heads, model.kv_heads, model.hidden, model.intermediate_size)
            have = set(map(tuple, mlp[["n_head", "n_kv_head", "n_embd",
                                       "n_expanded_embd"]].drop_duplicates().values.tolist()))
            assert want in have, (hf, want, have)
            tables = load_tables(system, "vllm", "bf16")
            allreduce = VidurAllReduce(vidur / "network" / f"{gpu}_dgx" / "all_reduce.csv")
            for tp in TPS:
                shapes = ModelShapes(model, tp)
                at_tp = mlp[mlp.num_tensor_parallel_workers == tp]
                for t in TOKENS:
                    r = at_tp[at_tp.num_tokens == t]
                    if r.empty:
                        continue
                    theirs, ours = vidur_ops(r, allreduce, model, tp, t), ours_ops(
                        tables, shapes, t)
                    for op in theirs:
                        if tp == 1 and op.startswith("all_reduce"):
                            continue
                        rows.append((name, gpu, tp, op, f"T={t}", theirs[op], ours[op]))
                attention, label = load_attention(vidur, gpu, hf, model, tp, extra)
                if attention is None:
                    missing.append(f"{hf} on {gpu} TP{tp}: no attention profile")
                    continue
                rows += attention_rows(attention, label, tables, shapes, mlp, allreduce, gpu)
    frame = pd.DataFrame(rows, columns=["model", "GPU", "TP", "op", "shape", "vidur_ms",
                                        "ours_ms"])
    frame["ratio"] = frame.ours_ms / frame.vidur_ms
    print("| model | GPU | TP | op | shape | Vidur ms | ours ms | ours/Vidur |")
    print("|---|---|---|---|---|---|---|---|")
    for r in frame.itertuples():
        print(f"| {r.model} | {r.GPU} | {r.TP} | {r.op} | {r.shape} | {r.vidur_ms:.3f} | "
              f"{r.ours_ms:.3f} | {r.ratio:.2f} |")
    print("\nSummary, ours/Vidur by op and GPU (median, range, count):\n")
    print("| op | GPU | median | min | max | n |")
    print("|---|---|---|---|---|---|")
    valid = frame[np.isfinite(frame.ratio) & (frame.vidur_ms > 0)]
    for (op, gpu), g in valid.groupby(["op", "GPU"], sort=False):
        print(f"| {op} | {gpu} | {g.ratio.median():.2f} | {g.ratio.min():.2f} | "
              f"{g.ratio.max():.2f} | {len(g)} |")
    groups = {"GEMMs (4 per layer)": ["attn_pre_proj", "attn_post_proj", "mlp_up_proj",
                                      "mlp_down_proj"],
              "all-reduce, ours NCCL": ["all_reduce_nccl"], "all-reduce, ours as composed":
              ["all_reduce"], "layer without attention": ["layer_dense"]}
    print("\nBy T (all models and TPs; median ours/Vidur):\n")
    print("| ops | GPU | " + " | ".join(f"T={t}" for t in TOKENS) + " |")
    print("|---|---|" + "---|" * len(TOKENS))
    for label, names in groups.items():
        sel = valid[valid.op.isin(names)]
        for gpu, g in sel.groupby("GPU", sort=False):
            cells = [g[g["shape"] == f"T={t}"].ratio.median() for t in TOKENS]
            print(f"| {label} | {gpu} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    print("\nNot compared: " + "; ".join(missing))


def attention_rows(attention, label, tables, shapes: ModelShapes, mlp, allreduce, gpu):
    """Prefill, chunked prefill and decode attention per layer, and whole-iteration model
    time (layers x (layer ops + attention), no embedding / LM head) composed both ways."""
    m, tp, rows = shapes.model, shapes.tp, []
    name = f"{m.name} ({label} attention)"
    h, kv = shapes.heads, shapes.kv_heads
    prefill, decode = attention[attention.prefill_chunk_size > 0], attention[
        attention.prefill_chunk_size == 0]
    at_tp = mlp[mlp.num_tensor_parallel_workers == tp]

    def dense(tokens):
        r = at_tp[at_tp.num_tokens == tokens]
        return vidur_ops(r, allreduce, m, tp, tokens)["layer_dense"] if not r.empty else np.nan

    for c in (128, 512, 1024, 2048, 4096):
        r = _attention_rows(prefill, c, 0)
        if r.empty:
            continue
        theirs = _median(r, "attn_prefill")
        ours = float(tables.context_attention(1, c, h, kv)) * 1e3
        rows.append((name, gpu, tp, "attn prefill", f"P={c}", theirs, ours))
        graph = c <= CUDA_GRAPH_TOKENS
        model_ours = m.layers * (float(_layer_dense_seconds(tables, shapes, c, graph)) * 1e3
                                 + ours)
        rows.append((name, gpu, tp, "model time prefill", f"P={c}",
                     m.layers * (dense(c) + theirs), model_ours))
    for c, c0 in ((256, 1792), (512, 1536), (512, 3584), (1024, 1024), (1024, 3072),
                  (2048, 2048)):
        r = _attention_rows(prefill, c, c0)
        if r.empty:
            continue
        rows.append((name, gpu, tp, "attn chunk", f"{c} @ {c0}", _median(r, "attn_prefill"),
                     float(tables.context_attention(1, math.sqrt(c * c + 2 * c * c0), h, kv))
                     * 1e3))
    for b in (1, 16, 64, 128):
        for ctx in (256, 1024, 4032):
            r = _attention_rows(decode, 0, ctx, b)
            if r.empty:
                continue
            theirs = _median(r, "attn_decode")
            ours = float(tables.generation_attention([b], ctx + 1, h, kv)[0]) * 1e3
            rows.append((name, gpu, tp, "attn decode", f"b={b} @ {ctx}", theirs, ours))
            if ctx == 1024:
                graph = b <= CUDA_GRAPH_TOKENS
                rows.append((name, gpu, tp, "model time decode", f"b={b} @ {ctx}",
                             m.layers * (dense(b) + theirs),
                             m.layers * (float(_layer_dense_seconds(tables, shapes, b, graph))
                                         * 1e3 + ours)))
    return rows


# --- (d) chunked prefill overhead ------------------------------------------------------
def _ours_parts(tables, shapes: ModelShapes, chunk: int, cached: int) -> dict[str, float]:
    """Seconds of one iteration holding one chunk, by operator class (all layers)."""
    m, tp, L = shapes.model, shapes.tp, shapes.model.layers
    graph = chunk <= CUDA_GRAPH_TOKENS
    linear = sum(float(tables.gemm(chunk, n, k)) for n, k in shapes.gemms())
    attn = float(tables.context_attention(1, math.sqrt(chunk ** 2 + 2 * chunk * cached),
                                          shapes.heads, shapes.kv_heads))
    ar = 2 * float(tables.all_reduce(chunk * m.hidden, tp, graph))
    total = iteration_time(m, tables, tp, [Chunk(chunk, cached)])
    return {"linear": L * linear, "attention": L * attn, "all-reduce": L * ar,
            "overall": total}


def _vidur_parts(mlp, attention, allreduce, model: ModelSpec, tp: int, chunk: int,
                 cached: int) -> dict[str, float]:
    rows = mlp[(mlp.num_tensor_parallel_workers == tp) & (mlp.num_tokens == chunk)]
    att = _attention_rows(attention[attention.prefill_chunk_size > 0], chunk, cached)
    if rows.empty or att.empty:
        return {}
    ops_ = vidur_ops(rows, allreduce, model, tp, chunk)
    linear = sum(ops_[k] for k in ("attn_pre_proj", "attn_post_proj", "mlp_up_proj",
                                   "mlp_down_proj"))
    attn = _median(att, "attn_prefill")
    ar = 2 * (ops_["all_reduce"] + NCCL_LAUNCH_MS)
    L = model.layers
    return {"linear": L * linear * 1e-3, "attention": L * attn * 1e-3,
            "all-reduce": L * ar * 1e-3, "overall": L * (ops_["layer_dense"] + attn) * 1e-3}


def _overhead(parts_of, prompt: int, chunk: int) -> dict[str, float]:
    whole = parts_of(prompt, 0)
    if not whole or chunk > prompt:
        return {}
    pieces = [parts_of(chunk, i * chunk) for i in range(prompt // chunk)]
    if any(not p for p in pieces):
        return {}
    return {k: sum(p[k] for p in pieces) / whole[k] for k in whole}


def chunks(vidur: Path, extra: Path | None) -> None:
    a100 = load_tables("a100_sxm", "vllm", "bf16")
    llama = CATALOG.model("llama2-70b")
    mlp = load_mlp(vidur, "a100", "meta-llama/Llama-2-70b-hf")
    attention, label = load_attention(vidur, "a100", "meta-llama/Llama-2-70b-hf", llama, 2,
                                      extra)
    allreduce = VidurAllReduce(vidur / "network" / "a100_dgx" / "all_reduce.csv")
    setups = [("yi-34b TP2 A100, ours", lambda c, c0: _ours_parts(
                  a100, ModelShapes(YI_34B, 2), c, c0), (2048, 4096, 8192)),
              ("llama2-70b TP2 A100, ours", lambda c, c0: _ours_parts(
                  a100, ModelShapes(llama, 2), c, c0), (2048, 4096)),
              (f"llama2-70b TP2 A100, Vidur profiles ({label or 'none'})",
               (lambda c, c0: _vidur_parts(mlp, attention, allreduce, llama, 2, c, c0))
               if attention is not None else (lambda c, c0: {}), (2048, 4096))]
    kinds = ("linear", "attention", "all-reduce", "overall")
    print("Chunked prefill time / one-prefill time, batch 1 (Sarathi-Serve Figure 11's "
          "measure; its values are given in the figure only):\n")
    print("| setup | prompt | chunk | " + " | ".join(kinds) + " |")
    print("|---|---|---|" + "---|" * len(kinds))
    for label_, parts_of, prompts in setups:
        for p in prompts:
            for c in (256, 512, 1024, 2048):
                ov = _overhead(parts_of, p, c)
                if not ov:
                    continue
                print(f"| {label_} | {p} | {c} | "
                      + " | ".join(f"{ov[k]:.3f}" for k in kinds) + " |")
    whole = _ours_parts(a100, ModelShapes(YI_34B, 2), 4096, 0)
    print("\nYi-34B TP2 A100, one 4,096-token prefill (ours): "
          + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in whole.items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("ops", "chunks"))
    parser.add_argument("--vidur-dir", type=Path, required=True,
                        help="Vidur's data/profiling folder")
    parser.add_argument("--attention-2024", type=Path, default=None,
                        help="Vidur's 2024-05-08 data/profiling/a100/attention.csv (used for "
                             "A100 where compute/a100/<model>/attention.csv is absent)")
    args = parser.parse_args()
    if not (args.vidur_dir / "compute").is_dir():
        parser.error(f"{args.vidur_dir} has no compute/ folder (give Vidur's data/profiling)")
    if args.part == "ops":
        ops(args.vidur_dir, args.attention_2024)
    else:
        chunks(args.vidur_dir, args.attention_2024)
    return 0


if __name__ == "__main__":
    sys.exit(main())
