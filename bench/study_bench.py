"""The full example study: 2 models x 2 workloads x 6 designs x 4 goals (examples/specs/*.yaml).

Runs every spec file as `provision search --spec` would, with one fresh, empty evaluation cache
for the whole study (so min-power reuses the min-cost simulations of the same model and
workload, as back-to-back runs of a user would). Prints the wall time and the number of
simulations against the full grid's count, per model, with the BLOOM-176B half timed on its own.

The full grid: min-cost / min-power, every (P, T) cell of the box the search considered (the
largest pools that can still beat the first feasible corner) at the goal's rate (baselines: every
pool size up to that corner); max-rate, every cell within the budget at each rate the search
probed for that design.

    python bench/study_bench.py                    # both models, one job per core
    python bench/study_bench.py --models bloom-176b --jobs 2
    python bench/study_bench.py --backend loky     # local processes instead of threads
    python bench/study_bench.py --designs baseline-a100,baseline-h100,splitwise-aa,splitwise-hh,\
        splitwise-ha,splitwise-hhcap --verify-seeds 1  # the study as issue 13 first timed it
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "examples" / "specs"
sys.path.insert(0, str(ROOT))

from hardware_catalog import Design, InputError  # noqa: E402
from provisioner.api import merge_options, resolve_study, run_study  # noqa: E402
from provisioner.options import SearchOptions, from_keywords  # noqa: E402
from provisioner.runner import default_jobs  # noqa: E402
from provisioner.study import DesignResult  # noqa: E402


def grid_count(result: DesignResult, pools: Design) -> int:
    if result.box is None:
        return 0
    if result.goal.name != "max-rate":
        p_hi, t_hi = result.box
        return p_hi * max(t_hi, 1)
    rates = len({m.rate_rps for m in result.points})
    return cells_in_budget(pools, result.goal.budget) * rates


def cells_in_budget(pools: Design, budget) -> int:
    def unit(m):
        return budget.of(m.cost_per_hour, m.power_kw)

    if pools.token is None:
        return math.floor(budget.value / unit(pools.prompt) + 1e-9)
    cells, p = 0, 1
    while (room := budget.value - p * unit(pools.prompt)) >= unit(pools.token) - 1e-9:
        cells += math.floor(room / unit(pools.token) + 1e-9)
        p += 1
    return cells


def run_spec(spec: Path, jobs: int, backend: str, cache_dir: str, overrides: dict) -> dict:
    options = merge_options(SearchOptions, {"jobs": jobs, "backend": backend,
                                            "cache_dir": cache_dir, **overrides}, spec)
    start = time.perf_counter()
    run = run_study(resolve_study(options), options.execution)
    wall = time.perf_counter() - start
    grid = sum(grid_count(r, r.design) for r in run.designs)
    summary = run.to_dict()["summary"]
    return {"spec": spec.stem, "wall_s": wall, "simulated": run.stats.simulated,
            "cache_hits": run.stats.cache_hits, "points": summary["evaluations"], "grid": grid,
            "best": summary["best_design"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=default_jobs())
    parser.add_argument("--backend", default="threads", help="threads (default) or loky")
    parser.add_argument("--models", default="bloom-176b,llama2-70b")
    parser.add_argument("--designs", help="comma-separated designs instead of each spec's")
    parser.add_argument("--verify-seeds", type=int,
                        help="verification samples instead of each spec's (1: screening only)")
    args = parser.parse_args()
    given = {**({"designs": args.designs} if args.designs else {}),
             **({"verify_seeds": args.verify_seeds} if args.verify_seeds is not None else {})}
    try:
        overrides = from_keywords(SearchOptions, given)   # checked as the Python API checks
    except InputError as err:
        parser.error(str(err))
    _warm_up()
    print(f"{'spec':34} {'wall s':>7} {'sims':>6} {'cached':>7} {'grid':>8}  best design")
    totals = {}
    with tempfile.TemporaryDirectory(prefix="provision-study-cache-") as cache_dir:
        for model in args.models.split(","):
            try:
                rows = [run_spec(spec, args.jobs, args.backend, cache_dir, overrides)
                        for spec in sorted(SPECS.glob(f"{model}-*.yaml"))]
            except InputError as err:
                sys.exit(f"study_bench.py: {err}")
            for row in rows:
                print(f"{row['spec']:34} {row['wall_s']:>7.1f} {row['simulated']:>6} "
                      f"{row['cache_hits']:>7} {row['grid']:>8}  {row['best']}")
            totals[model] = {key: sum(r[key] for r in rows)
                             for key in ("wall_s", "simulated", "grid")}
    for model, t in totals.items():
        print(f"{model}: {t['wall_s']:.1f} s wall, {t['simulated']} simulations "
              f"vs {t['grid']} full-grid evaluations ({t['simulated'] / max(t['grid'], 1):.1%})")
    print(f"study: {sum(t['wall_s'] for t in totals.values()):.1f} s wall, "
          f"{sum(t['simulated'] for t in totals.values())} simulations, {args.jobs} jobs ({args.backend})")


def _warm_up() -> None:
    """Load the compiled simulator once so the first spec does not pay for it."""
    from hardware_catalog import load_catalog
    from simcore import Cluster, simulate
    from simcore.perfmodel import default_performance_model
    from simcore.workload import synthesize
    catalog = load_catalog()
    simulate(Cluster(catalog.design("splitwise-hh"), 2, 2), synthesize("coding", 2.0, 5.0, 0),
             catalog.model("llama2-70b"), default_performance_model(), catalog.machine("dgx-a100"))


if __name__ == "__main__":
    main()
