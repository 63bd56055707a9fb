"""Performance model accuracy and speed on the public SplitwiseSim profiles.

Per (model, machine) and phase, on the TP8 rows of llama2-70b and bloom-176b on a100-80gb and
h100-80gb (synthetic h100-80gb-pcap rows excluded; exact duplicate rows counted once):

- random: MAPE on a random 80:20 split of rows (seed 0), and the mean over seeds 0-9. Every grid
  point is repeated ~5 times, so held-out rows almost always have repeats in the training set:
  this split measures fit quality against run-to-run noise, not interpolation;
- leave-one-grid-value-out: each distinct prompt_size value of the prompt sweep and batch_size
  value of the batch sweep (the grid point with all its repeats) held out in turn, fit on the
  rest, MAPE over all held-out rows: interpolation and extrapolation along each sweep;
- stress (information only): every row with a given prompt_size or batch_size value held out;
  prompt_size 512 then removes the whole batch sweep and batch_size 1 every single prompt.

Targets: random <= 3% (prompt) / 2% (token); leave-one-grid-value-out <= 8% / 3%.
Then: evaluations per second of the tabulated curves for 1e6 queries.

    python bench/perf_model_bench.py
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from hardware_catalog import load_catalog
from simcore.perfcalib import (GROUP, clean_profile, fold_errors, grid_point_folds,
                               held_out_random, prompt_features, read_profile_csv, select_rows,
                               value_folds)
from simcore.perfmodel import default_performance_model

PROFILE = (Path(__file__).resolve().parents[1].parent / "shared" / "profiles"
           / "splitwise_sim_perf_model.csv")
TARGETS = {"random": {"prompt": 3.0, "token": 2.0}, "grid": {"prompt": 8.0, "token": 3.0}}
SEEDS = range(10)


def mark(value: float, limit: float) -> str:
    return f"{value:6.2f} {'pass' if value <= limit else 'FAIL'}"


def accuracy(rows) -> None:
    print(f"{'model':11} {'hardware':10} {'phase':6} {'random':>11} {'10 seeds':>8} "
          f"{'grid LOGO':>11} {'stress':>7}")
    failures = 0
    for (model, hardware, _), group in rows.groupby(GROUP, sort=True):
        splits = [held_out_random(group, seed) for seed in SEEDS]
        grid = fold_errors(group, grid_point_folds(group))
        stress = fold_errors(group, value_folds(group))
        for phase in ("prompt", "token"):
            random0 = splits[0][2][phase].mean()
            seeds = np.mean([s[2][phase].mean() for s in splits])
            logo = grid[phase].mean()
            failures += (random0 > TARGETS["random"][phase]) + (logo > TARGETS["grid"][phase])
            print(f"{model:11} {hardware:10} {phase:6} {mark(random0, TARGETS['random'][phase])} "
                  f"{seeds:8.2f} {mark(logo, TARGETS['grid'][phase])} "
                  f"{stress[phase].mean():7.2f}")
    print(f"targets missed: {failures} of {4 * len(rows.groupby(GROUP))}")


def single_prompt_curve_error(rows) -> None:
    """What the simulator sees: the n = 1 prompt curve at each row's total tokens (all rows)."""
    perf, catalog = default_performance_model(), load_catalog()
    machines = {"a100-80gb": "dgx-a100", "h100-80gb": "dgx-h100"}
    print("\nprompt MAPE of the tabulated curve at total tokens (batched rows read as one prompt),"
          " in-sample:")
    for (model, hardware, _), group in rows.groupby(GROUP, sort=True):
        curves = perf.curves(catalog.model(model), catalog.machine(machines[hardware]))
        tokens, prompts = prompt_features(group)
        measured = group.prompt_time.to_numpy()
        ape = 100 * np.abs(curves.prompt_time(tokens) * 1000 - measured) / measured
        single = prompts == 1
        print(f"  {model:11} {hardware:10} all rows {ape.mean():5.2f}%  single prompts "
              f"{ape[single].mean():5.2f}%  batched prompts {ape[~single].mean():5.2f}%")


def speed() -> None:
    catalog = load_catalog()
    curves = default_performance_model().curves(catalog.model("llama2-70b"),
                                                 catalog.machine("dgx-a100"))
    rng = np.random.default_rng(0)
    n = 1_000_000
    tokens = rng.integers(1, 16384, n).astype(np.float64)
    batch = rng.integers(1, 512, n).astype(np.float64)
    context = batch * rng.integers(100, 4000, n)
    for name, call in (("prompt_time", lambda: curves.prompt_time(tokens)),
                       ("token_time", lambda: curves.token_time(batch, context)),
                       ("mixed_time", lambda: curves.mixed_time(tokens, batch, context))):
        best = min(_timed(call) for _ in range(5))
        print(f"  {name:11} 1e6 queries in {best * 1000:6.1f} ms: {n / best / 1e6:6.1f} M predictions/s "
              f"({len(curves.prompt_tokens)} prompt / {len(curves.decode_batch)} decode knots)")


def _timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> None:
    if not PROFILE.exists():
        sys.exit(f"profile not found: {PROFILE}")
    rows, duplicates, artefacts = clean_profile(
        select_rows(read_profile_csv(PROFILE), 8, ("h100-80gb-pcap",)))
    print(f"{PROFILE.name}: {len(rows)} TP8 rows (pcap excluded; {duplicates} duplicates counted "
          f"once, {artefacts} artefacts dropped)\nMAPE % on held-out rows:")
    accuracy(rows)
    single_prompt_curve_error(rows)
    print("\ncurve evaluation speed (vectorised numpy, llama2-70b on dgx-a100):")
    speed()


if __name__ == "__main__":
    main()
