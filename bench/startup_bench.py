"""Start-up and whole-command times, as a user sees them (each command in a fresh process).

Prints the wall time of `provision --version`, of `provision simulate` (BLOOM-176B
Splitwise-HH 27P + 3T, the 2-minute coding workload at 70 req/s) and of the default
`provision search` without the evaluation cache (its summary line gives simulations per
second), each the median and best of several runs after one untimed run. It says which
build of the simulator core runs (simcore.fastsim.CORE: "aot", compiled at install; "jit",
compiled by numba on first use and cached). With --cold, the first search after install is
timed too, as a user's first `provision search`: an empty numba cache directory and an empty
evaluation cache (every simulation is written to it); with --no-aot, the install-time build
is ignored (PROVISION_NO_AOT=1), as on an install without a C compiler.

    python bench/startup_bench.py                  # as installed
    python bench/startup_bench.py --cold           # also the first run after install
    python bench/startup_bench.py --cold --no-aot  # the same without the install-time build
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIMULATE = ["simulate", "--design", "splitwise-hh", "--prompt", "27", "--token", "3",
            "--rate", "70", "--duration", "120"]


def provision(args: list[str], env: dict, cwd: str) -> tuple[float, str]:
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "provisioner.cli", *args], env=env, cwd=cwd,
                         capture_output=True, text=True)
    wall = time.perf_counter() - start
    if run.returncode not in (0, 1):  # 1: the simulated cluster misses an SLO (still a run)
        sys.exit(f"provision {' '.join(args)} failed:\n{run.stderr}")
    return wall, run.stdout + run.stderr


def timed(label: str, args: list[str], env: dict, cwd: str, runs: int) -> str:
    provision(args, env, cwd)  # untimed: loads (or builds) the compiled core
    walls, output = [], ""
    for _ in range(runs):
        wall, output = provision(args, env, cwd)
        walls.append(wall)
    print(f"{label:34} {statistics.median(walls):8.2f} {min(walls):8.2f}")
    return output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true",
                        help="first build the compiled core in an empty cache and time that")
    parser.add_argument("--no-aot", action="store_true",
                        help="ignore the install-time build of the core (numba compiles it)")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per command")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.no_aot:
        env["PROVISION_NO_AOT"] = "1"
    core = subprocess.run([sys.executable, "-c", "from simcore import fastsim; print(fastsim.CORE)"],
                          env=env, capture_output=True, text=True).stdout.strip()
    print(f"simulator core: {core}")
    with tempfile.TemporaryDirectory() as work:
        out = str(Path(work) / "report")
        search = ["search", "--no-cache", "--out", out]
        if args.cold:
            env["NUMBA_CACHE_DIR"] = str(Path(work) / "numba-cache")
            first = ["search", "--cache-dir", str(Path(work) / "evaluation-cache"), "--out", out]
            wall, _ = provision(first, env, work)
            print(f"{'search, first run after install':34} {wall:8.2f}")
        print(f"{'command':34} {'median s':>8} {'best s':>8}")
        timed("provision --version", ["--version"], env, work, args.runs)
        timed("provision simulate (2 min, 70/s)", SIMULATE, env, work, args.runs)
        output = timed("provision search --no-cache", search, env, work, max(1, args.runs // 2))
        summary = re.search(r"(\d+) simulations \((\d+)/s over ([\d.]+) s\)", output)
        if summary:
            print(f"  last search: {summary.group(1)} simulations, {summary.group(2)}/s over "
                  f"{summary.group(3)} s of search")


if __name__ == "__main__":
    main()
