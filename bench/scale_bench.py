"""Simulator scaling: rate and cluster grow together, BLOOM-176B on Splitwise-HH, coding.

The ladder runs 70, 700 and 7,000 req/s on 25 + 7, 250 + 70 and 2,500 + 700 DGX-H100 (32, 320,
3,200 machines), 2-minute Poisson windows, seed 0. Each rung runs in its own process (so its
peak RSS is its own): after a warm-up on a small run (loads the compiled core), it times
`simulate` on the rung's workload (the median of at least 3 runs and of as many as fill a
second: a 7 ms run timed 3 times moved the spread by 0.2x) and reports wall time,
time per request and the process's peak RSS (ru_maxrss: Python, numpy, numba, the workload and
every array of the run).

    python bench/scale_bench.py            # the whole ladder
    python bench/scale_bench.py --rung 2   # one rung (0, 1, 2), in this process
    python bench/scale_bench.py --idle     # the bottom rung's work on every rung's fleet

With --idle every rung runs the bottom rung's rate (70 req/s, over 20 minutes so that setting
up thousands of machines is a small part of a run) on its fleet with all but 25 prompt and 7
token machines down from the start, never repaired: the same work with routing trees and
machine arrays of each size. Set beside the plain ladder, it separates what a larger fleet
costs by itself (deeper routing trees: a log factor) from what its activity costs (a busy heap
of thousands of machines, records that no longer stay in cache).
"""
from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import subprocess
import sys
import time

LADDER = [(70.0, 1), (700.0, 10), (7000.0, 100)]  # (req/s, multiple of 25 prompt + 7 token)
MIN_RUNS, MIN_SECONDS = 3, 1.0   # timed runs per rung: at least 3, and at least a second's worth
IDLE_WINDOW_S = 1200.0


def run_rung(index: int, idle: bool = False) -> dict:
    from hardware_catalog import load_catalog
    from simcore import Cluster, SimOptions, simulate
    from simcore.perfmodel import default_performance_model
    from simcore.workload import synthesize

    rate, scale = LADDER[index]
    catalog = load_catalog()
    model, perf = catalog.model("bloom-176b"), default_performance_model()
    reference = catalog.machine("dgx-a100")
    design = catalog.design("splitwise-hh")
    simulate(Cluster(design, 25, 7), synthesize("coding", 70.0, 10.0, seed=0), model, perf,
             reference)  # warm-up: load the compiled core
    cluster = Cluster(design, 25 * scale, 7 * scale)
    if idle:
        rate = LADDER[0][0]
    workload = synthesize("coding", rate, IDLE_WINDOW_S if idle else 120.0, seed=0)
    options = SimOptions(failures=tuple(  # --idle: only the bottom rung's 25 + 7 machines up
        (0.0, pool, i, math.inf) for pool, first, count in (("prompt", 25, 25 * scale),
                                                             ("token", 7, 7 * scale))
        for i in range(first, count))) if idle else SimOptions()
    times, result = [], None
    while len(times) < MIN_RUNS or sum(times) < MIN_SECONDS:
        result = None  # let the previous run's arrays go first
        start = time.perf_counter()
        result = simulate(cluster, workload, model, perf, reference, options)
        times.append(time.perf_counter() - start)
    wall = statistics.median(times)
    return {"rate": rate, "machines": 32 * scale, "requests": len(workload), "runs": len(times),
            "wall_s": wall,
            "us_per_request": wall / len(workload) * 1e6, "feasible": bool(result.feasible),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rung", type=int, choices=range(len(LADDER)),
                        help="run one rung in this process and print it as JSON")
    parser.add_argument("--idle", action="store_true",
                        help="the bottom rung's workload on each fleet, 32 machines up")
    args = parser.parse_args()
    if args.rung is not None:
        print(json.dumps(run_rung(args.rung, args.idle)))
        return
    print(f"{'req/s':>6} {'machines':>9} {'requests':>9} {'runs':>5} {'wall s':>8} "
          f"{'us/request':>11} {'peak RSS MiB':>13}")
    per_request = []
    for index in range(len(LADDER)):
        run = subprocess.run([sys.executable, __file__, "--rung", str(index)]
                             + (["--idle"] if args.idle else []),
                             capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"rung {index} failed:\n{run.stderr}")
        r = json.loads(run.stdout.strip().splitlines()[-1])
        print(f"{r['rate']:>6.0f} {r['machines']:>9} {r['requests']:>9} {r['runs']:>5} "
              f"{r['wall_s']:>8.3f} {r['us_per_request']:>11.2f} {r['peak_rss_mib']:>13.0f}")
        per_request.append(r["us_per_request"])
    print(f"spread of time per request: {max(per_request) / min(per_request):.2f}x "
          + ("(the same work on each fleet)" if args.idle else "(target 1.5x)"))


if __name__ == "__main__":
    main()
