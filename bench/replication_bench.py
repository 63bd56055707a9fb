"""What KV replication buys against restart, for one failure at a time.

Splitwise-HH 27P + 5T (the default search's optimum), BLOOM-176B coding at Poisson 70 req/s over
2 minutes (seed 0): one machine fails (down for the rest of the run) at each of 15 instants, in
the prompt pool and in the token pool, machine 0 (the router's ties go to it, so it holds the
most work). Each failure runs under `--recovery restart` and `replicate` (host replicas); the
table gives the E2E P99 slowdown of both and their ratio, and the summary how often replication
was better, equal or worse, and by how much at most.

    python bench/replication_bench.py
"""
from __future__ import annotations

import math

import numpy as np

from hardware_catalog import load_catalog
from simcore import Cluster, SimOptions, simulate
from simcore.perfmodel import default_performance_model
from simcore.workload import synthesize

INSTANTS = tuple(range(10, 160, 10))   # seconds: 15 failure instants over the run
POOLS = ("prompt", "token")


def e2e_p99(catalog, cluster, workload, options) -> float:
    result = simulate(cluster, workload, catalog.model("bloom-176b"),
                      default_performance_model(), catalog.machine("dgx-a100"), options)
    return float(np.percentile(result.e2e_slowdown, 99))


def main() -> None:
    catalog = load_catalog()
    cluster = Cluster(catalog.design("splitwise-hh"), 27, 5)
    workload = synthesize("coding", 70.0, 120.0, 0)
    plain = e2e_p99(catalog, cluster, workload, SimOptions())
    print(f"no failure: E2E P99 {plain:.3f}x")
    print(f"{'pool':>6} {'t (s)':>6} {'restart':>8} {'replicate':>9} {'ratio':>6}")
    ratios = []
    for pool in POOLS:
        for at in INSTANTS:
            row = ((float(at), pool, 0, math.inf),)
            restart = e2e_p99(catalog, cluster, workload, SimOptions(failures=row))
            replicate = e2e_p99(catalog, cluster, workload,
                                SimOptions(failures=row, recovery="replicate"))
            ratios.append(replicate / restart)
            print(f"{pool:>6} {at:>6} {restart:>7.3f}x {replicate:>8.3f}x {ratios[-1]:>6.3f}")
    ratios = np.array(ratios)
    print(f"{len(ratios)} single failures: replicate better in {(ratios < 1 - 1e-9).sum()}, "
          f"equal in {(np.abs(ratios - 1) <= 1e-9).sum()}, worse in "
          f"{(ratios > 1 + 1e-9).sum()} (by up to {ratios.max() - 1:.1%}; better by up to "
          f"{1 - ratios.min():.1%})")


if __name__ == "__main__":
    main()
