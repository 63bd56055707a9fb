"""CPU of a search whose instances span machines (Llama-3.1-405B on DGX-A100 needs TP8xPP2):
the pipeline curves are one object per base curve, so the fast core stacks them and simulate
prices the reference's requests once, not once per simulation.

    python bench/pipeline_bench.py      # CPU s of this process (jobs=1, no cache), 3 runs
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import provisioner  # noqa: E402


def main() -> None:
    for _ in range(3):
        start = time.process_time()
        result = provisioner.search(model="llama-3.1-405b", designs="baseline-a100,splitwise-hh",
                                    rate=20, duration=60, verify_seeds=3, jobs=1)
        optima = ", ".join(f"{d.design.name} ${d.optimum.cost_per_hour:,.0f}/h"
                           for d in result.designs if d.optimum is not None)
        print(f"{time.process_time() - start:.2f} s CPU, {result.stats.simulated} simulations; "
              f"{optima}", flush=True)


if __name__ == "__main__":
    main()
