"""How sure an optimum is: each SLO percentile on every verification sample, with a bootstrap
95% confidence interval (requests resampled with replacement within the sample).

A P99 over ~8,500 requests rests on ~85 of them, so it moves from one sample of the same
workload to the next; the interval shows by how much, the margin to the limit shows how close
the optimum is to failing, and the binding SLO is the one with the smallest margin.
"""
from __future__ import annotations

import numpy as np

from provisioner.study import SLO_KEYS, DesignResult
from slo_profiles import PERCENTILES, SloProfile

RESAMPLES = 200   # enough for a 95% interval of a tail percentile to +-5% of its width
INTERVAL_SEEDS = 3   # samples given an interval: each needs a run's per-request latencies


def percentile_intervals(result, profile: SloProfile, seed: int) -> dict[str, list[float]]:
    """{slo key: [low, high]} bootstrap 95% intervals of the limited percentiles of one run."""
    slowdown = profile.kind == "slowdown"
    rng = np.random.default_rng(seed)
    intervals = {}
    for metric in ("ttft", "tbt", "e2e"):
        values = getattr(result, f"{metric}_slowdown" if slowdown else f"{metric}_s")
        values = values[~np.isnan(values)]
        if len(values) == 0:
            continue
        scale = 1.0 if slowdown else 1000.0
        picks = rng.integers(0, len(values), size=(RESAMPLES, len(values)))
        pcts = [PERCENTILES[p] for p in ("p50", "p90", "p99")]
        boot = np.percentile(values[picks], pcts, axis=1) * scale   # (3, RESAMPLES)
        for name, row in zip(("p50", "p90", "p99"), boot):
            intervals[f"{metric}_{name}"] = [float(np.percentile(row, 2.5)),
                                             float(np.percentile(row, 97.5))]
    return intervals


def verification(design: DesignResult, evaluator) -> dict | None:
    """Per SLO: the value on every verification sample, its bootstrap interval, the worst
    value, the limit and the margin; plus the binding SLO (smallest margin)."""
    optimum = design.optimum
    if optimum is None or not optimum.samples:
        return None
    profile = evaluator.study.slo
    seeds = [seed for seed, _ in optimum.samples]
    intervals = [percentile_intervals(evaluator.simulate(optimum.point, seed)[0], profile, seed)
                 for seed in seeds[:INTERVAL_SEEDS]]
    intervals += [{}] * (len(seeds) - len(intervals))
    slo = {}
    for i, key in enumerate(SLO_KEYS):
        limit = optimum.outcome.slo[i][2]
        values = [o.slo[i][1] for _, o in optimum.samples]
        worst = None if None in values else max(values)
        slo[key] = {"values": values, "ci95": [iv.get(key) for iv in intervals], "worst": worst,
                    "limit": limit, "margin": None if limit is None or worst is None
                    else 1.0 - worst / limit}
    limited = [(v["margin"], key) for key, v in slo.items() if v["margin"] is not None]
    binding = min(limited)[1] if limited else None
    return {"seeds": seeds, "binding_slo": binding, "slo": slo}
