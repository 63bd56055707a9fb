"""Simulator scaling: rate and cluster grow together, BLOOM-176B on Splitwise-HH, coding.

The ladder runs 70, 700 and 7,000 req/s on 25 + 7, 250 + 70 and 2,500 + 700 DGX-H100 (32, 320,
3,200 machines), 2-minute Poisson windows, seed 0. Each rung runs in its own process (so its
peak RSS is its own): after a warm-up on a small run (loads the compiled core), it times
`simulate` on the rung's workload (median of 3 runs) and reports wall time,
time per request and the process's peak RSS (ru_maxrss: Python, numpy, numba, the workload and
every array of the run).

    python bench/scale_bench.py            # the whole ladder
    python bench/scale_bench.py --rung 2   # one rung (0, 1, 2), in this process
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

LADDER = [(70.0, 1), (700.0, 10), (7000.0, 100)]  # (req/s, multiple of 25 prompt + 7 token)


def run_rung(index: int) -> dict:
    from hardware_catalog import load_catalog
    from simcore import Cluster, simulate
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
    workload = synthesize("coding", rate, 120.0, seed=0)
    times, result = [], None
    for _ in range(3):
        result = None  # let the previous run's arrays go first
        start = time.perf_counter()
        result = simulate(cluster, workload, model, perf, reference)
        times.append(time.perf_counter() - start)
    wall = statistics.median(times)
    return {"rate": rate, "machines": 32 * scale, "requests": len(workload), "wall_s": wall,
            "us_per_request": wall / len(workload) * 1e6, "feasible": bool(result.feasible),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rung", type=int, choices=range(len(LADDER)),
                        help="run one rung in this process and print it as JSON")
    args = parser.parse_args()
    if args.rung is not None:
        print(json.dumps(run_rung(args.rung)))
        return
    print(f"{'req/s':>6} {'machines':>9} {'requests':>9} {'wall s':>8} {'us/request':>11} "
          f"{'peak RSS MiB':>13}")
    for index in range(len(LADDER)):
        run = subprocess.run([sys.executable, __file__, "--rung", str(index)],
                             capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"rung {index} failed:\n{run.stderr}")
        r = json.loads(run.stdout.strip().splitlines()[-1])
        print(f"{r['rate']:>6.0f} {r['machines']:>9} {r['requests']:>9} {r['wall_s']:>8.3f} "
              f"{r['us_per_request']:>11.2f} {r['peak_rss_mib']:>13.0f}")


if __name__ == "__main__":
    main()
