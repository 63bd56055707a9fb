"""Failure injection speed and effect: the 2-minute coding workload (BLOOM-176B, Poisson
70 req/s) on Splitwise-HH 27P + 5T (the default search's optimum) without failures, and with
seeded MTBF schedules under restart and replicate. Failures add O(affected requests) events:
a run with an MTBF schedule must stay within 1.5x the no-failure run.

The MTBF is short on purpose (0.5 h per machine: ~2 failures per 2-minute window on 32
machines, repaired after 1 minute) so that every run has failures to recover from.

Prints, per run, the best wall time of 9 runs after a warm-up, the ratio to the no-failure
run, the failures, requests affected, tokens recomputed, E2E P99 slowdown and goodput.

    python bench/failure_bench.py
"""
from __future__ import annotations

import time

import numpy as np

from hardware_catalog import load_catalog
from simcore import Cluster, SimOptions, simulate
from simcore.failures import failure_metrics, goodput
from simcore.perfmodel import default_performance_model
from simcore.workload import synthesize
from slo_profiles import load_slo_profile

LIMIT = 1.5   # a run with failures may take at most this many times the no-failure one
SEEDS = (0, 1, 2, 3)


def timed(cluster, workload, model, perf, reference, options, runs=9):
    """The best of `runs` (the machine is shared: the minimum is the least disturbed)."""
    simulate(cluster, workload, model, perf, reference, options)  # warm-up (JIT, caches)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        result = simulate(cluster, workload, model, perf, reference, options)
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    catalog = load_catalog()
    model, perf = catalog.model("bloom-176b"), default_performance_model()
    reference = catalog.machine("dgx-a100")
    profile = load_slo_profile("splitwise")
    workload = synthesize("coding", 70.0, 120.0, seed=0)
    cluster = Cluster(catalog.design("splitwise-hh"), 27, 5)
    base, plain = timed(cluster, workload, model, perf, reference, SimOptions())
    print(f"{len(workload)} requests, splitwise-hh 27P+5T")
    print(f"{'run':34s} {'ms':>7s} {'x':>5s} {'iters':>7s} {'fail':>4s} {'affected':>8s} "
          f"{'recomputed':>10s} {'E2E P99':>8s} {'goodput':>8s}")
    good, rate = goodput(plain, profile, 120.0)
    print(f"{'no failures':34s} {base * 1000:7.1f} {1.0:5.2f} "
          f"{int(plain.machine_stats['iterations'].sum()):7d} {0:4d} {0:8d} {0:10d} "
          f"{np.percentile(plain.e2e_slowdown, 99):8.3f} {rate:8.2f}")
    worst = 1.0
    for seed in SEEDS:
        for recovery in ("restart", "replicate"):
            options = SimOptions(mtbf_hours=0.5, repair_s=60.0, failure_seed=seed,
                                 recovery=recovery)
            wall, result = timed(cluster, workload, model, perf, reference, options)
            metrics = failure_metrics(result, result.failure_stats["schedule"])
            good, rate = goodput(result, profile, 120.0)
            worst = max(worst, wall / base)
            print(f"{f'MTBF 0.5 h, seed {seed}, {recovery}':34s} {wall * 1000:7.1f} "
                  f"{wall / base:5.2f} {int(result.machine_stats['iterations'].sum()):7d} "
                  f"{metrics['failures']:4d} "
                  f"{metrics['requests_affected']:8d} {metrics['tokens_recomputed']:10d} "
                  f"{np.percentile(result.e2e_slowdown, 99):8.3f} {rate:8.2f}")
    print(f"worst ratio {worst:.2f}x (limit {LIMIT}x): {'OK' if worst <= LIMIT else 'TOO SLOW'}")


if __name__ == "__main__":
    main()
