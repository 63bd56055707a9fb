"""What a search costs as the fleet grows (issue 26): CPU seconds of the default search (70
req/s), issue 38's 3-design Llama2-70B question, the 8 designs at 700 req/s and baseline-h100
at 7,000 req/s, for one or two source trees, run alternately in fresh processes (jobs=1, no
cache), so the machine's load does not move them. Each line also gives the points evaluated
and each design's optimum with its cost over the design's capacity bound, and says whether an
optimum lies below its bound (it never may: the bound is what the pools cost at full
utilisation), so an A/B shows whether an answer moved.

    python bench/fleet_bench.py                      # this checkout
    python bench/fleet_bench.py /path/to/other/tree  # this checkout against another one
    python bench/fleet_bench.py --only default,3-design   # some questions only
    python bench/fleet_bench.py OTHER --only 3-design --pairs 3   # three alternated pairs
"""
from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
PACKAGES = ("provisioner", "simcore", "hardware_catalog", "slo_profiles")
QUESTIONS = {
    "default": [],
    # issue 38's comparison with an analytic planner and aiconfigurator: three H100 designs
    "3-design": ["--model", "llama2-70b", "--workload", "coding", "--rate", "70", "--slo",
                 "interactive-chat", "--designs", "baseline-h100,sarathi-h100,splitwise-hh"],
    "700": ["--rate", "700", "--designs", "all"],
    "7000-baseline-h100": ["--rate", "7000", "--designs", "baseline-h100"],
}


def cache_bytecode(tree: Path) -> None:
    """Write the tree's bytecode before any timing. A fresh worktree has none, and with
    PYTHONDONTWRITEBYTECODE set every run would compile its sources again (0.14-0.17 CPU s a
    search here), which once showed as a 10% gain of the tree that had its bytecode cached."""
    for package in PACKAGES:
        if (tree / package).is_dir():
            compileall.compile_dir(str(tree / package), quiet=1)


def run(tree: Path, args: list[str]) -> tuple[float, str]:
    """(CPU seconds of the search's process, its simulations and optima)."""
    with tempfile.TemporaryDirectory() as out:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-m", "provisioner.cli", "search", *args, "--jobs", "1",
                        "--no-cache", "--out", out, "-q"], cwd=tree, check=True,
                       stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(tree)})
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        report = json.loads((Path(out) / "report.json").read_text())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    optima = ", ".join(f"{d['design']} {_pools(d['optimum'])} (bound x{_over_bound(d)})"
                       for d in report["designs"])
    below = [d["design"] for d in report["designs"] if d["optimum"] is not None
             and d["optimum"]["cost_per_hour"] < d["capacity_bound"]["value"] - 1e-6]
    bounds = f"BELOW ITS BOUND: {', '.join(below)}" if below else "every optimum >= its bound"
    return cpu, f"{report['summary']['evaluations']} points; {bounds}; {optima}"


def _over_bound(design: dict) -> str:
    """The optimum's cost over the design's capacity bound."""
    if design["optimum"] is None:
        return "-"
    return f"{design['optimum']['cost_per_hour'] / design['capacity_bound']['value']:.2f}"


def _pools(optimum) -> str:
    if optimum is None:
        return "infeasible"
    if "machines" in optimum:   # a colocated design
        return str(optimum["machines"])
    return f"{optimum['prompt_machines']}P+{optimum['token_machines']}T"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", type=Path, help="other source trees to compare")
    parser.add_argument("--only", type=lambda text: text.split(","), default=list(QUESTIONS),
                        help=f"questions to run, comma-separated ({', '.join(QUESTIONS)})")
    parser.add_argument("--pairs", type=int, default=1, help="alternations of the trees")
    args = parser.parse_args(argv)
    unknown = [name for name in args.only if name not in QUESTIONS]
    if unknown:
        parser.error(f"unknown question(s) {', '.join(unknown)}: choose from "
                     f"{', '.join(QUESTIONS)}")
    trees = [HERE] + [tree.resolve() for tree in args.trees]
    for tree in trees:
        cache_bytecode(tree)
    for name in args.only:
        for _ in range(args.pairs):   # alternated: A B A B ..., so a load change hits both
            for tree in trees:
                cpu, summary = run(tree, QUESTIONS[name])
                print(f"{name:<20} {cpu:8.2f} CPU s  {tree}  {summary}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
