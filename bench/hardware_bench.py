"""Which hardware to buy (issue 28): `--hardware all` over the catalog's SKUs, with the
pruning by capacity bounds against the same design shapes all searched in full, for the
default question and for Llama-3.1-70B. Wall and CPU seconds in this process (jobs=2, no
cache), the designs generated, pruned before any simulation, simulated, the simulations run,
and each answer (they must be the same design at the same cost).

    python bench/hardware_bench.py             # bloom-176b (the default) and llama-3.1-70b
    python bench/hardware_bench.py MODEL ...
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import provisioner  # noqa: E402
from hardware_catalog import load_catalog  # noqa: E402
from provisioner.hardware import hardware_designs  # noqa: E402

MODELS = ("bloom-176b", "llama-3.1-70b")


def timed(**options):
    wall, cpu = time.perf_counter(), time.process_time()
    result = provisioner.search(jobs=2, **options)
    return time.perf_counter() - wall, time.process_time() - cpu, result


def answer(result) -> str:
    best = result.best
    if best is None:
        return "no feasible design"
    o = best.optimum
    return f"{best.design.name} {o.prompt_machines}P+{o.token_machines}T ${o.cost_per_hour:,.2f}/h"


def main(models) -> None:
    timed(designs="baseline-h100", rate=5, duration=10, verify_seeds=1)   # compile, load
    designs = hardware_designs(["all"], load_catalog())
    for model in models:
        wall, cpu, pruned = timed(model=model, hardware="all")
        summary = pruned.to_dict()["summary"]["hardware"]
        print(f"{model}: --hardware all: {summary['designs']} designs, "
              f"{summary['pruned_before_simulation']} pruned by bound before any simulation, "
              f"{summary['pruned'] - summary['pruned_before_simulation']} stopped when they "
              f"could not beat the best, {summary['simulated']} simulated, "
              f"{pruned.stats.simulated} simulations, {wall:.1f} s wall, {cpu:.1f} s CPU: "
              f"{answer(pruned)}", flush=True)
        wall, cpu, full = timed(model=model, designs=list(designs))
        print(f"{model}: the same {len(designs)} designs, no pruning: "
              f"{full.stats.simulated} simulations, {wall:.1f} s wall, {cpu:.1f} s CPU: "
              f"{answer(full)}; same answer: {answer(full) == answer(pruned)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or MODELS)
