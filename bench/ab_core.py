"""A/B of two versions of the fast core on the sim_bench cluster, without the load-order bias.

A version's core is its simcore/fast/ package or, before that package, simcore/fastsim.py.

Two copies of the core in one process do not time alike: the copy that ran the set-up
simulation is 15-20% faster even when both are the same file. So each comparison runs in a
fresh process (and an empty numba cache) once with each version in that role, and prints the
geometric mean of the new / old ratios: BLOOM-176B, Splitwise-HH 27P + 3T, 70 req/s, 2 minutes.

    python bench/ab_core.py 6353f55            # that commit's core against HEAD's
    python bench/ab_core.py 6353f55 --pairs 3  # more alternations (default 2)
    python bench/ab_core.py HEAD WORKTREE      # the uncommitted core against HEAD's
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TIME_BOTH = r"""
import importlib.util, json, statistics, sys, time
def load(name, path):  # a package (simcore/fast/ copied) or one file (simcore/fastsim.py)
    package = not path.endswith(".py")
    spec = importlib.util.spec_from_file_location(
        name, path + "/__init__.py" if package else path,
        submodule_search_locations=[path] if package else None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (its relative imports find it)
    spec.loader.exec_module(module)
    return module
first, second = load("core_first", sys.argv[1]), load("core_second", sys.argv[2])
binding = sys.modules["simcore.simulate"]
from hardware_catalog import load_catalog
from simcore import Cluster, simulate
from simcore.perfmodel import default_performance_model
from simcore.workload import synthesize
catalog = load_catalog()
calls = []
current = binding.simulate_fast  # gives `simulate` the results it reads; the first core still
# runs the set-up simulation (the role whose bias the alternation cancels)
binding.simulate_fast = lambda w, m, **kw: (calls.append((w, m)), first.simulate_fast(w, m),
                                            current(w, m, **kw))[2]
medians = {}
for workload in ("coding", "conversation"):
    calls.clear()
    simulate(Cluster(catalog.design("splitwise-hh"), 27, 3), synthesize(workload, 70.0, 120.0, seed=0),
             catalog.model("bloom-176b"), default_performance_model(), catalog.machine("dgx-a100"))
    times = {"first": [], "second": []}
    for i in range(21):
        for name, core in (("first", first), ("second", second))[:: 1 if i % 2 else -1]:
            start = time.perf_counter()
            core.simulate_fast(*calls[0])
            times[name].append(time.perf_counter() - start)
    medians[workload] = {k: statistics.median(v) * 1e3 for k, v in times.items()}
print(json.dumps(medians))
"""


def _show(revision: str, path: str) -> str | None:
    if revision == "WORKTREE":
        file = ROOT / path
        return file.read_text() if file.is_file() else None
    run = subprocess.run(["git", "show", f"{revision}:{path}"], cwd=ROOT, capture_output=True,
                         text=True)
    return run.stdout if run.returncode == 0 else None


def core_file(revision: str, work: Path) -> Path:
    """The revision's core: the package simcore/fast/ copied into a folder (loaded under
    another name: its imports are relative), or before it, simcore/fastsim.py."""
    name = f"core_{revision.replace('/', '_')}"
    if _show(revision, "simcore/fast/__init__.py") is not None:
        if revision == "WORKTREE":
            names = [p.name for p in (ROOT / "simcore" / "fast").glob("*.py")]
        else:
            names = subprocess.run(["git", "ls-tree", "--name-only", f"{revision}:simcore/fast"],
                                   cwd=ROOT, capture_output=True, text=True,
                                   check=True).stdout.split()
        folder = work / name
        folder.mkdir()
        for file in names:
            if file.endswith(".py"):
                (folder / file).write_text(_show(revision, f"simcore/fast/{file}"))
        return folder
    folder = work / name  # beside it the files its source digest reads
    folder.mkdir()
    for file in ("fastsim.py", "cluster.py"):
        source = _show(revision, f"simcore/{file}")
        if source is not None:
            (folder / file).write_text(source)
    return folder / "fastsim.py"


def timed(first: Path, second: Path, work: Path, run: int) -> dict:
    env = {**os.environ, "PROVISION_NO_AOT": "1", "NUMBA_CACHE_DIR": str(work / f"cache{run}")}
    out = subprocess.run([sys.executable, "-c", TIME_BOTH, str(first), str(second)], cwd=ROOT,
                         env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", help="git revision of the old core")
    parser.add_argument("new", nargs="?", default="HEAD",
                        help="git revision of the new core (WORKTREE: the file as it is now)")
    parser.add_argument("--pairs", type=int, default=2, help="runs with each in the first role")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        old, new = core_file(args.old, work), core_file(args.new, work)
        ratios: dict[str, list[float]] = {"coding": [], "conversation": []}
        for run in range(2 * args.pairs):
            new_first = run % 2 == 1
            medians = timed(new, old, work, run) if new_first else timed(old, new, work, run)
            for workload, m in medians.items():
                new_ms, old_ms = ((m["first"], m["second"]) if new_first
                                  else (m["second"], m["first"]))
                ratios[workload].append(new_ms / old_ms)
                print(f"run {run + 1} ({'new' if new_first else 'old'} first) {workload:12} "
                      f"old {old_ms:6.2f} ms  new {new_ms:6.2f} ms  new/old {new_ms / old_ms:.3f}")
        for workload, values in ratios.items():
            mean = math.exp(sum(map(math.log, values)) / len(values))
            print(f"{workload}: new / old = {mean:.3f} (geometric mean of {len(values)} runs)")


if __name__ == "__main__":
    main()
