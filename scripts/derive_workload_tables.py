"""Derive the built-in workload size tables (simcore/data/builtin_workloads.json) from the traces.

Usage: python scripts/derive_workload_tables.py [--traces DIR] [--out FILE]

Reads the Azure LLM inference traces of 2023 (Azure Public Dataset, CC-BY 4.0) from the
`shared/traces` folder beside the repository and writes, per workload, the marginal quantile
functions of prompt and output tokens and the empirical copula as request counts in rank cells.
`simcore.workload.SizeTable` documents why this shape and how it is sampled.
"""
from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np

from simcore.workload import BUILTIN_TABLES_PATH, Workload, load_trace

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACES = REPO.parent / "shared" / "traces"
TRACE_FILES = {"coding": ("azure_code_2023.csv", "AzureLLMInferenceTrace_code"),
               "conversation": ("azure_conv_2023.csv", "AzureLLMInferenceTrace_conv")}
DATASET_URL = "https://github.com/Azure/AzurePublicDataset"
# Dense in the tail, where SLO percentiles live; P50, P90 and P99 are knots.
QUANTILE_PROBS = np.round(np.r_[np.arange(90) * 0.01, 0.90 + np.arange(36) * 0.0025,
                                0.99 + np.arange(20) * 0.0005, 1.0], 6)
RANK_BIN_EDGES = np.round(np.r_[np.arange(10) * 0.1, 0.95, 0.99, 1.0], 6)
TIE_BREAK_SEED = 2023


def ordinal_ranks(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Ranks 0..n-1 with ties broken at random, so every rank bin holds its share of requests
    (average ranks would pile tied token counts into one bin and skew the sampled marginal)."""
    order = np.lexsort((rng.random(len(values)), values))
    ranks = np.empty(len(values), dtype=np.int64)
    ranks[order] = np.arange(len(values))
    return ranks


def rank_cell_counts(trace: Workload) -> np.ndarray:
    rng = np.random.default_rng(TIE_BREAK_SEED)
    bins = len(RANK_BIN_EDGES) - 1
    cells = []
    for tokens in (trace.prompt_tokens, trace.output_tokens):
        pseudo = (ordinal_ranks(tokens, rng) + 0.5) / len(tokens)
        cells.append(np.clip(np.searchsorted(RANK_BIN_EDGES, pseudo, side="right") - 1, 0, bins - 1))
    counts = np.zeros((bins, bins), dtype=np.int64)
    np.add.at(counts, (cells[0], cells[1]), 1)
    return counts


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    rng = np.random.default_rng(TIE_BREAK_SEED)
    return float(np.corrcoef(ordinal_ranks(a, rng), ordinal_ranks(b, rng))[0, 1])


def derive_entry(path: Path, dataset_name: str) -> dict:
    trace = load_trace(path)
    span_s = float(trace.arrival_s[-1] - trace.arrival_s[0])
    return {
        "source": {"dataset": f"Azure Public Dataset, {dataset_name} (2023)", "url": DATASET_URL,
                   "licence": "CC-BY 4.0", "file": path.name,
                   "sha256": hashlib.sha256(path.read_bytes()).hexdigest()},
        "requests": len(trace),
        "span_s": round(span_s, 3),
        "native_rate_rps": round((len(trace) - 1) / span_s, 4),  # information only
        "spearman_prompt_output": round(spearman(trace.prompt_tokens, trace.output_tokens), 4),
        "quantile_probs": QUANTILE_PROBS.tolist(),
        "prompt_tokens_quantiles": np.round(np.quantile(trace.prompt_tokens, QUANTILE_PROBS), 2).tolist(),
        "output_tokens_quantiles": np.round(np.quantile(trace.output_tokens, QUANTILE_PROBS), 2).tolist(),
        "rank_bin_edges": RANK_BIN_EDGES.tolist(),
        "rank_cell_counts": rank_cell_counts(trace).tolist(),
    }


def derive_document(traces_dir: Path) -> dict:
    return {
        "description": "Built-in request-size distributions for provision's named workloads: "
                       "marginal quantile functions (linear numpy quantiles of the trace) and "
                       "the empirical copula as request counts in rank cells "
                       "[prompt rank bin][output rank bin].",
        "generated_by": "scripts/derive_workload_tables.py",
        "workloads": {name: derive_entry(traces_dir / file, dataset)
                      for name, (file, dataset) in TRACE_FILES.items()},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--out", type=Path, default=BUILTIN_TABLES_PATH)
    args = parser.parse_args(argv)
    document = derive_document(args.traces)
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    for name, entry in document["workloads"].items():
        print(f"{name}: {entry['requests']} requests, {entry['native_rate_rps']} req/s native, "
              f"spearman {entry['spearman_prompt_output']}")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
