"""Simulator speed: BLOOM-176B on Splitwise-HH (27 prompt + 3 token DGX-H100), Poisson 70 req/s.

Prints, per workload and window, the median wall time of 5 runs after a warm-up, the peak memory
of one run (tracemalloc's peak, which includes the core's numpy working arrays), time per
request, and the reference simulator's time for one run of the 2-minute window.

    python bench/sim_bench.py            # 2-minute and 60-minute windows
    python bench/sim_bench.py --quick    # 2-minute window only
"""
from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc

from hardware_catalog import load_catalog
from simcore import Cluster, evaluate_slos, simulate
from simcore.perfmodel import default_performance_model
from simcore.workload import synthesize
from slo_profiles import load_slo_profile


def timed_runs(cluster, workload, model, perf, catalog, runs=5):
    simulate(cluster, workload, model, perf, catalog.machine("dgx-a100"))  # warm-up (JIT, caches)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        result = simulate(cluster, workload, model, perf, catalog.machine("dgx-a100"))
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def peak_memory(cluster, workload, model, perf, catalog) -> int:
    """Peak bytes of one run: tracemalloc's peak (Python and numpy, the core's state included:
    it is allocated as numpy arrays before the compiled loop runs)."""
    tracemalloc.start()
    simulate(cluster, workload, model, perf, catalog.machine("dgx-a100"))
    traced = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return traced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the 2-minute window")
    args = parser.parse_args()
    catalog = load_catalog()
    model = catalog.model("bloom-176b")
    perf = default_performance_model()
    cluster = Cluster(catalog.design("splitwise-hh"), 27, 3)
    profile = load_slo_profile("splitwise")
    windows = [120.0] if args.quick else [120.0, 3600.0]
    print(f"{'workload':13} {'window':>7} {'requests':>9} {'median ms':>10} {'us/request':>11} "
          f"{'peak MiB':>9} {'reference s':>12} {'SLOs':>5}")
    for name in ("coding", "conversation"):
        for window in windows:
            workload = synthesize(name, 70.0, window, seed=0)
            median, result = timed_runs(cluster, workload, model, perf, catalog)
            peak = peak_memory(cluster, workload, model, perf, catalog)
            reference = ""
            if window == 120.0:
                start = time.perf_counter()
                simulate(cluster, workload, model, perf, catalog.machine("dgx-a100"), engine="reference")
                reference = f"{time.perf_counter() - start:.2f}"
            verdict = "pass" if evaluate_slos(result, profile).passed else "fail"
            print(f"{name:13} {window / 60:>5.0f}min {len(workload):>9} {median * 1000:>10.1f} "
                  f"{median / len(workload) * 1e6:>11.2f} {peak / 2**20:>9.1f} {reference:>12} "
                  f"{verdict:>5}")


if __name__ == "__main__":
    main()
