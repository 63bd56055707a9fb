"""The fast core of two trees timed on the very clusters a search simulates.

`fleet_bench.py` times whole commands (start-up, search, reports); `ab_core.py` one cluster.
This script first records every (workload sample, cluster) a search hands the fast core, then
replays them all in a fresh process per tree, each tree's own core (its install-time build when
built from its sources), alternating which tree goes first, and prints the CPU seconds of each
replay. A core change that keeps every result shows here what it does to the search's own mix
of clusters, without the noise of the rest of the command.

    python bench/replay_bench.py capture /tmp/default.pkl                 # the default search
    python bench/replay_bench.py capture /tmp/q.pkl -- --rate 7000 --designs baseline-h100
    python bench/replay_bench.py replay /tmp/default.pkl /work/wt-base . --rounds 3

A capture holds every sample's request arrays (a 7,000 req/s search: about 20 MB a
simulation); `--limit N` keeps the first N.
"""
from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

REPLAY = r"""
import pickle, sys, time
sys.path.insert(0, sys.argv[1])
from simcore.fast import CORE, setup
assert setup.__file__.startswith(sys.argv[1]), setup.__file__
clusters = pickle.load(open(sys.argv[2], "rb"))
for workload, machines in clusters[:3]:  # warm-up
    setup.simulate_fast(workload, machines)
start = time.process_time()
for workload, machines in clusters:
    setup.simulate_fast(workload, machines)
print(f"{time.process_time() - start:.3f} {len(clusters)} {CORE}")
"""


def capture(path: Path, search_args: list[str], limit: int) -> None:
    """Run `provision search` in this process, keeping what reaches the fast core."""
    import simcore.simulate  # noqa: F401
    binding = sys.modules["simcore.simulate"]
    inner, kept = binding.simulate_fast, []

    def recording(workload, machines, *args, **kwargs):
        if len(kept) < limit:
            kept.append((workload, machines))
        return inner(workload, machines, *args, **kwargs)

    binding.simulate_fast = recording
    from provisioner.cli import main
    with tempfile.TemporaryDirectory() as reports:   # only the simulations are kept
        sys.argv = ["provision", "search", "--no-cache", "--quiet", "--jobs", "1",
                    "-o", reports, *search_args]
        try:
            main()
        except SystemExit as stop:
            if stop.code:
                raise
    with open(path, "wb") as handle:
        pickle.dump(kept, handle)
    print(f"{len(kept)} simulations recorded in {path}")


def replay(path: Path, trees: list[str], rounds: int) -> None:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    totals: dict[str, list[float]] = {tree: [] for tree in trees}
    for i in range(rounds):
        for tree in trees[:: 1 if i % 2 == 0 else -1]:
            folder = str(Path(tree).resolve())
            out = subprocess.run([sys.executable, "-c", REPLAY, folder, str(path)], env=env,
                                 capture_output=True, text=True, check=True).stdout.split()
            totals[tree].append(float(out[0]))
            print(f"round {i + 1}  {tree:30s} {out[0]:>8s} CPU s  {out[1]} runs, core {out[2]}",
                  flush=True)
    for tree, seconds in totals.items():
        print(f"{tree:30s} " + " / ".join(f"{s:.3f}" for s in seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("capture", help="record a search's simulations")
    rec.add_argument("path", type=Path)
    rec.add_argument("--limit", type=int, default=1000)
    rep = sub.add_parser("replay", help="time two trees' cores on a capture")
    rep.add_argument("path", type=Path)
    rep.add_argument("trees", nargs="+")
    rep.add_argument("--rounds", type=int, default=3)
    argv = sys.argv[1:]
    # after --: the search's options (none: the default search)
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    if args.command == "capture":
        capture(args.path, argv[split + 1:], args.limit)
    else:
        replay(args.path, args.trees, args.rounds)


if __name__ == "__main__":
    main()
