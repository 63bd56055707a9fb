"""Seed-robust optima: how often does each design's optimum meet every SLO on fresh samples of
the same workload, and what does verification cost?

For each verification setting (1 sample, the default 3, ...) it runs the default search
(BLOOM-176B, coding, 70 req/s, all designs, min-cost), then simulates every design's optimum
on 20 fresh seeds the search never saw (seed + 1000 ...) and prints the pass rate, plus the
simulations and wall time of the search (the verified search should cost <= ~2x one sample).

    python bench/verify_bench.py                  # --verify-seeds 1 and 3
    python bench/verify_bench.py --seeds 1,3,5 --fresh 20
"""
from __future__ import annotations

import argparse
import time

import provisioner
from provisioner.evaluate import SimulationEvaluator
from provisioner.study import Point


def fresh_pass_rate(result, fresh: int) -> dict[str, tuple[int, int, float]]:
    """design -> (passes, samples, worst margin seen) over `fresh` unseen seeds."""
    evaluator = SimulationEvaluator(result.study)
    rates = {}
    for design in result.designs:
        o = design.optimum
        if o is None:
            continue
        point = Point(design.design, o.prompt_machines, o.token_machines, o.rate_rps)
        outcomes = [evaluator.outcome(point, result.study.seed + 1000 + k) for k in range(fresh)]
        margins = [x.worst_margin for x in outcomes if x.worst_margin is not None]
        rates[design.design.name] = (sum(x.meets_slos for x in outcomes), fresh,
                                     min(margins) if margins else float("nan"))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,3", help="verification sample counts to compare")
    parser.add_argument("--fresh", type=int, default=20, help="unseen seeds per optimum")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    provisioner.search(designs="splitwise-hh", rate=5, duration=10, jobs=1)  # compile once
    baseline_sims = None
    for n in (int(x) for x in args.seeds.split(",")):
        start = time.perf_counter()
        result = provisioner.search(verify_seeds=n, jobs=args.jobs)
        wall = time.perf_counter() - start
        sims = result.stats.simulated
        baseline_sims = baseline_sims or sims
        print(f"--verify-seeds {n}: {sims} simulations ({sims / baseline_sims:.2f}x the first "
              f"setting), {wall:.1f} s wall")
        rates = fresh_pass_rate(result, args.fresh)
        for design in result.designs:
            o = design.optimum
            if o is None:
                print(f"  {design.design.name:16} infeasible")
                continue
            passes, total, worst = rates[design.design.name]
            cells = (f"{o.prompt_machines}" if design.design.is_baseline
                     else f"{o.prompt_machines}P+{o.token_machines}T")
            print(f"  {design.design.name:16} {cells:>9}  ${o.cost_per_hour:>8,.1f}/h  fresh "
                  f"seeds passed {passes}/{total} ({passes / total:.0%}), worst margin "
                  f"{worst:+.1%}")


if __name__ == "__main__":
    main()
