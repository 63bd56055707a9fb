"""Derive SplitwiseSim's latency curves (simcore/data/splitwise_sim_curves.json) from its profiles.

Usage: python scripts/derive_splitwise_sim_curves.py [--profile CSV] [--out FILE]

Reads the public SplitwiseSim performance profiles of 2023 (`data/perf_model.csv` of
Mutinifni/splitwise-sim, MIT; `shared/profiles/splitwise_sim_perf_model.csv` beside the
repository) and writes, per (model, hardware, tensor_parallel), the two 1-D curves its
`DatabasePerformanceModel.init_predictor` builds (shared/design/splitwise-sim-semantics.md, row
7): x = "batch tokens" = prompt_size x batch_size, y = the median prompt_time (resp. token_time)
in seconds of the rows with that x (times divided by 1000 first, as it does). Its interp1d
extrapolates linearly on both sides; `simcore.splitwise_sim` adds the knot at x = 1 that makes
our curves (first value held below the first knot) do the same where it is looked up.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PROFILE = REPO.parent / "shared" / "profiles" / "splitwise_sim_perf_model.csv"
DEFAULT_OUT = REPO / "simcore" / "data" / "splitwise_sim_curves.json"


def derive(profile: Path) -> dict:
    rows = defaultdict(lambda: defaultdict(lambda: ([], [])))
    with profile.open(newline="") as handle:
        for r in csv.DictReader(handle):
            key = (r["model"], r["hardware"], int(r["tensor_parallel"]))
            x = int(r["prompt_size"]) * int(r["batch_size"])
            rows[key][x][0].append(float(r["prompt_time"]) / 1000)
            rows[key][x][1].append(float(r["token_time"]) / 1000)
    groups = []
    for (model, hardware, tp), by_x in sorted(rows.items()):
        xs = sorted(by_x)
        groups.append({"model": model, "hardware": hardware, "tensor_parallel": tp,
                       "batch_tokens": xs,
                       "prompt_s": [float(np.median(by_x[x][0])) for x in xs],
                       "token_s": [float(np.median(by_x[x][1])) for x in xs]})
    return {"format": "provision-splitwise-sim-curves/1",
            "source": "SplitwiseSim data/perf_model.csv (Mutinifni/splitwise-sim, MIT), sha256 "
                      + hashlib.sha256(profile.read_bytes()).hexdigest(),
            "command": "python scripts/derive_splitwise_sim_curves.py",
            "rule": "per (model, hardware, tensor_parallel): x = prompt_size x batch_size, "
                    "y = median seconds of the rows with that x (DatabasePerformanceModel."
                    "init_predictor)",
            "groups": groups}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    args.out.write_text(json.dumps(derive(args.profile), indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
