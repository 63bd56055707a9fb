"""How sure an optimum is: each SLO percentile on every verification sample, with a bootstrap
95% confidence interval (requests resampled with replacement within the sample; the resampled
percentiles are drawn from their exact distribution, see `bootstrap_percentiles`).

A P99 over ~8,500 requests rests on ~85 of them, so it moves from one sample of the same
workload to the next; the interval shows by how much, the margin to the limit shows how close
the optimum is to failing, and the binding SLO is the one with the smallest margin.
"""
from __future__ import annotations

import numpy as np

from provisioner.study import SLO_KEYS, DesignResult
from slo_profiles import METRICS, PERCENTILES, SloProfile

RESAMPLES = 2000  # bootstrap resamples per percentile: its 95% interval to about +-1% of its width
INTERVAL_SEEDS = 3   # samples given an interval: each needs a run's per-request latencies


def latency_values(result, profile: SloProfile) -> dict[str, np.ndarray]:
    """A run's per-request values of each metric as the profile limits it (slowdowns or
    seconds), NaN where a request has none."""
    suffix = "slowdown" if profile.kind == "slowdown" else "s"
    return {metric: getattr(result, f"{metric}_{suffix}") for metric in METRICS}


def percentile_intervals(values: dict[str, np.ndarray], profile: SloProfile,
                         seed: int) -> dict[str, list[float]]:
    """{slo key: [low, high]} bootstrap 95% intervals of the limited percentiles of one run
    (`values`: its `latency_values`)."""
    slowdown = profile.kind == "slowdown"
    rng = np.random.default_rng(seed)
    intervals = {}
    for metric in METRICS:
        ordered = np.sort(values[metric][~np.isnan(values[metric])])
        if len(ordered) == 0:
            continue
        scale = 1.0 if slowdown else 1000.0
        for name in ("p50", "p90", "p99"):
            boot = bootstrap_percentiles(ordered, PERCENTILES[name], RESAMPLES, rng) * scale
            intervals[f"{metric}_{name}"] = [float(np.percentile(boot, 2.5)),
                                             float(np.percentile(boot, 97.5))]
    return intervals


def bootstrap_percentiles(ordered: np.ndarray, pct: float, resamples: int,
                          rng: np.random.Generator) -> np.ndarray:
    """The `pct` percentile (numpy's linear rule) of `resamples` bootstrap resamples of the
    sorted `ordered`, drawn without building them: a resample of n requests picks indices
    floor(n U) for n uniforms U, so its k-th smallest value is ordered[floor(n U_(k))], and the
    k-th smallest of n uniforms is Beta(k, n + 1 - k); the next one lies above it as the smallest
    of the other n - k uniforms, U_(k) + (1 - U_(k)) Beta(1, n - k). O(resamples), not
    O(resamples x n): the same distribution as resampling the requests."""
    n = len(ordered)
    position = (n - 1) * pct / 100.0
    below = int(np.floor(position))
    weight = position - below
    first = rng.beta(below + 1, n - below, resamples)
    low = ordered[np.minimum((first * n).astype(np.int64), n - 1)]
    if below + 1 >= n:
        return low
    second = first + (1.0 - first) * rng.beta(1, n - below - 1, resamples)
    high = ordered[np.minimum((second * n).astype(np.int64), n - 1)]
    return low + weight * (high - low)


def interval_samples(design: DesignResult) -> list:
    """The (point, seed) samples whose runs give the optimum's intervals (the first seeds)."""
    optimum = design.optimum
    if optimum is None or not optimum.samples:
        return []
    return [(optimum.point, seed) for seed, _ in optimum.samples[:INTERVAL_SEEDS]]


def intervals_of(evaluator, sample) -> dict[str, list[float]]:
    """`percentile_intervals` of one sample's run (a runner function: runs on the workers)."""
    point, seed = sample
    return percentile_intervals(evaluator.latencies(point, seed), evaluator.study.slo, seed)


def verification(design: DesignResult, intervals: list[dict]) -> dict | None:
    """Per SLO: the value on every verification sample, its bootstrap interval (`intervals`:
    `intervals_of` each of `interval_samples(design)`), the worst value, the limit and the
    margin; plus the binding SLO (smallest margin)."""
    optimum = design.optimum
    if optimum is None or not optimum.samples:
        return None
    seeds = [seed for seed, _ in optimum.samples]
    intervals = list(intervals) + [{}] * (len(seeds) - len(intervals))
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
