"""A week of load in one streamed simulation (issue 29): time, memory and the per-window
verdicts of a static Splitwise-HH cluster on the shared Azure 2024 week curves.

    python bench/week_bench.py                       # coding and conversation weeks
    python bench/week_bench.py --curve coding --days 1
Prints, per curve: requests simulated, wall and CPU seconds, peak resident memory (the whole
process, interpreter and imports included), and the windows (1 h) that met every SLO.
Needs ../shared (skips a curve whose file is absent).
"""
from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CURVES = {"coding": ("azure_coding_2024_week_rate.csv", "coding", (16, 5)),
          "conversation": ("azure_conversation_2024_week_rate.csv", "conversation", (24, 12))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--curve", choices=sorted(CURVES), action="append")
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--model", default="bloom-176b")
    args = parser.parse_args()
    from hardware_catalog import load_catalog
    from provisioner.loadcurve import read_load_curve
    from simcore import Cluster, evaluate_slos
    from simcore.longrun import simulate_curve
    from simcore.perfmodel import default_performance_model
    from slo_profiles import load_slo_profile
    catalog, perf = load_catalog(), default_performance_model()
    profile = load_slo_profile("splitwise")
    for name in args.curve or sorted(CURVES):
        file, sizes, (p, t) = CURVES[name]
        path = ROOT.parent / "shared" / "traces" / file
        if not path.exists():
            print(f"{name}: {path} not found, skipped")
            continue
        curve = read_load_curve(str(path))
        end = min(curve.end_s, args.days * 86400.0)
        keep = [i for i, start in enumerate(curve.times) if start < end]
        times, rates = [curve.times[i] for i in keep], [curve.rates[i] for i in keep]
        edges = list(np.arange(0.0, end, 3600.0)) + [end]
        cluster = Cluster(catalog.design("splitwise-hh"), p, t)
        wall, cpu = time.perf_counter(), time.process_time()
        run = simulate_curve(cluster, sizes, times, rates, end, edges, 0,
                             catalog.model(args.model), perf, catalog.machine("dgx-a100"))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        met = sum(evaluate_slos(run.window(k), profile).passed
                  for k in range(len(edges) - 1)) if run.feasible else 0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        print(f"{name}: {args.days:g} days, splitwise-hh {p}P+{t}T, {run.requests:,} requests: "
              f"{wall:.1f} s wall, {cpu:.1f} s CPU, peak RSS {rss:,.0f} MB; "
              f"{met} of {len(edges) - 1} windows met every SLO"
              + ("" if run.feasible else f"; infeasible: {run.reason}"))


if __name__ == "__main__":
    main()
