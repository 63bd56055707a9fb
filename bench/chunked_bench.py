"""Chunked prefill speed: the 2-minute coding workload (BLOOM-176B, Poisson 70 req/s) on
Baseline-H100 (whole prompts, stalling) and Sarathi-H100 (chunked, budgets 256-2048), same
machines. The event count is O(requests + chunks), not O(tokens): the chunked run must stay
within 2x the unchunked one.

Prints, per run, the median wall time of 5 runs after a warm-up, the iterations simulated, the
prompt pieces per prompt, the ratio to the unchunked run and the TBT P99 / TTFT P50.

    python bench/chunked_bench.py
"""
from __future__ import annotations

import dataclasses
import statistics
import time

import numpy as np

from hardware_catalog import load_catalog
from simcore import Cluster, simulate
from simcore.perfmodel import default_performance_model
from simcore.workload import synthesize

MACHINES = 76   # DGX-H100 machines: the stalling baseline's min-cost pool for this load
LIMIT = 2.0     # the chunked run may take at most this many times the unchunked one


def timed(cluster, workload, model, perf, reference, runs=5):
    simulate(cluster, workload, model, perf, reference)  # warm-up (JIT, caches)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        result = simulate(cluster, workload, model, perf, reference)
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    catalog = load_catalog()
    model, perf = catalog.model("bloom-176b"), default_performance_model()
    reference = catalog.machine("dgx-a100")
    workload = synthesize("coding", 70.0, 120.0, seed=0)
    runs = [("baseline-h100", catalog.design("baseline-h100"))]
    runs += [(f"sarathi-h100 chunk {b}", dataclasses.replace(catalog.design("sarathi-h100"),
                                                              chunk_tokens=b))
             for b in (2048, 1024, 512, 256)]
    print(f"{len(workload)} requests, {MACHINES} machines")
    print(f"{'run':24} {'median ms':>10} {'iterations':>11} {'pieces/prompt':>14} "
          f"{'x unchunked':>12} {'TBT P99 ms':>11} {'TTFT P50 ms':>12}")
    base_time, worst = None, 0.0
    for label, design in runs:
        median, result = timed(Cluster(design, MACHINES), workload, model, perf, reference)
        stats = result.machine_stats
        pieces = (stats["prompt_chunks"].sum() / len(workload) if "prompt_chunks" in stats
                  else 1.0)
        base_time = base_time or median
        ratio = median / base_time
        if design.is_chunked:
            worst = max(worst, ratio)
        print(f"{label:24} {median * 1000:>10.1f} {int(stats['iterations'].sum()):>11} "
              f"{pieces:>14.2f} {ratio:>12.2f} {np.nanpercentile(result.tbt_s, 99) * 1000:>11.1f} "
              f"{np.percentile(result.ttft_s, 50) * 1000:>12.1f}")
    print(f"worst chunked / unchunked: {worst:.2f}x (limit {LIMIT:g}x): "
          + ("met" if worst <= LIMIT else "MISSED"))


if __name__ == "__main__":
    main()
