"""Per-request latency metrics and SLO evaluation (the nine percentiles, limits and margins)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from slo_profiles import PERCENTILES, SloProfile
from simcore.cluster import itl_bin_values
from simcore.latency import LatencyCurves


def _per_gap(total, output, per_token: bool = False):
    """Mean time between output tokens: over output - 1 gaps, NaN for 1-token outputs (or, as
    SplitwiseSim divides, over the output tokens)."""
    if per_token:
        return total / output.astype(np.float64)
    gaps = (output - 1).astype(np.float64)
    return np.where(gaps > 0, total / np.where(gaps > 0, gaps, 1.0), np.nan)


def request_latencies(arrival, output, first_token, finish, per_token: bool = False,
                      first_token_s=0.0):
    """TTFT, TBT and E2E in seconds; `first_token_s` (per request, or one value): the engine's
    time before the first token reaches the client beyond the iterations (the curves'
    `first_token_s`), added to TTFT and E2E."""
    return (first_token - arrival + first_token_s,
            _per_gap(finish - first_token, output, per_token),
            finish - arrival + first_token_s)


def first_token_overheads(curves, kinds, machine_of_request):
    """Per request, the `first_token_s` of the curves of the machine that computed its prompt
    (`kinds`: the SKU index of every machine; 0 for a request that never reached one)."""
    per_kind = np.array([c.first_token_s for c in curves])
    if not per_kind.any():
        return 0.0
    # per machine, then 0 last: the entry machine -1 (none) reads; one gather per request
    per_machine = np.append(per_kind[np.asarray(kinds)], 0.0)
    return per_machine[np.asarray(machine_of_request)]


def uncontended_latencies(prompt, output, curves: LatencyCurves, per_token: bool = False):
    """The same requests alone on one machine: no queue, batch of one, no KV transfer.

    The TBT reference is a time per token of the request alone, whichever way the measured TBT
    is averaged. Ours: its mean uncontended gap. SplitwiseSim's (`per_token`; its
    notebooks/plots.ipynb, `add_baseline_perf`): the token curve at x = the prompt size, a
    per-token time that is not divided by the output count as its measured TBT is; its E2E
    reference is then the TTFT reference + (output - 1) x the TBT reference.
    """
    ttft = curves.with_host(curves.prompt_time(prompt), 1) + curves.first_token_s
    gaps = (output - 1).astype(np.float64)
    decode = _decodes_alone(curves, np.asarray(prompt, dtype=np.float64), gaps)
    if not per_token:
        return ttft, _per_gap(decode, output), ttft + decode
    tbt = curves.with_host(curves.reference_token_time(prompt, output), 1)
    return ttft, tbt, ttft + tbt * gaps


def _decodes_alone(curves: LatencyCurves, prompt: np.ndarray, gaps: np.ndarray) -> np.ndarray:
    """Seconds of a request's `gaps` decode iterations alone: decode k (k = 1..gaps) attends
    over prompt + k tokens, GPU time first + c k with first = token_time(1, prompt), c the
    context cost; with the engine's host time h after each (a sum in closed form) or beside it
    (max(first + c k, h): h for the m iterations shorter than it, the series for the rest)."""
    c, h = curves.context_seconds_per_token, curves.host_time(1)
    series = gaps * (gaps + 1) / 2
    if not curves.overlap_host:
        return gaps * (curves.token_time(1, 0) + h) + c * (gaps * prompt + series)
    first = curves.token_time(1, 0) + c * prompt
    if c > 0:
        short = np.clip(np.ceil((h - first) / c) - 1, 0, gaps)
    else:
        short = np.where(first < h, gaps, 0.0)
    return short * h + (gaps - short) * first + c * (series - short * (short + 1) / 2)


@dataclass(frozen=True)
class SloCheck:
    metric: str          # ttft, tbt, e2e
    percentile: str      # p50, p90, p99
    value: float | None  # None when no request has the metric (e.g. TBT with 1-token outputs)
    limit: float
    unit: str            # "x" (slowdown) or "ms"

    @property
    def margin(self) -> float:
        """1 - value/limit: positive when met, the headroom left."""
        return 1.0 if self.value is None else 1.0 - self.value / self.limit

    @property
    def passed(self) -> bool:
        return self.value is None or self.value <= self.limit

    def as_dict(self) -> dict:
        return {"value": self.value, "limit": self.limit, "unit": self.unit,
                "margin": self.margin, "passed": self.passed}


@dataclass(frozen=True)
class SloReport:
    profile: str
    feasible: bool        # the simulation completed (every request finished)
    reason: str
    checks: tuple[SloCheck, ...]

    @property
    def passed(self) -> bool:
        return self.feasible and all(c.passed for c in self.checks)

    @property
    def worst_margin(self) -> float:
        if not self.feasible:
            return float("-inf")
        return min(c.margin for c in self.checks)

    @property
    def failing(self) -> list[SloCheck]:
        return [c for c in self.checks if not c.passed]

    def as_dict(self) -> dict:
        return {"profile": self.profile, "passed": self.passed, "feasible": self.feasible,
                "reason": self.reason, "worst_margin": None if not self.feasible
                else self.worst_margin,
                "slo": {f"{c.metric}_{c.percentile}": c.as_dict() for c in self.checks}}


def percentiles(values: np.ndarray, pcts) -> np.ndarray:
    """np.percentile(values, pcts) of a 1-D float array without NaN, bit for bit (numpy's
    linear rule and its interpolation formula), from one sort: numpy's own also places the
    extremes and, through np.unique, imports numpy.ma (about 12 ms of a `provision
    simulate`). A full sort, not a partition at the ranks needed: on a run's latencies (a
    fresh array each time, partly ordered) np.sort took about half the time of np.partition
    at the six ranks of P50/P90/P99 (80 vs 160 us for 8,500 values), and both give the same
    order statistics."""
    below, above, weight, upper = _interpolation(len(values), tuple(map(float, pcts)))
    ordered = np.sort(values)
    low, high = ordered[below], ordered[above]
    step = high - low
    result = low + step * weight
    np.subtract(high, step * (1 - weight), out=result, where=upper)
    return result


@lru_cache(maxsize=256)
def _interpolation(n: int, pcts: tuple[float, ...]):
    """numpy's linear rule for `pcts` of n values: (the ranks below and above each, its
    weight, whether it is interpolated from above). A search's runs of one sample all have
    the same n (read-only arrays: every call shares them)."""
    virtual = (n - 1) * np.true_divide(np.asarray(pcts, dtype=np.float64), 100)
    below = np.floor(virtual)
    above = below + 1
    last = virtual >= n - 1       # numpy takes the largest value for both neighbours
    below[last] = -1
    above[last] = -1
    below, above = below.astype(np.intp), above.astype(np.intp)
    weight = virtual - below
    upper = weight >= 0.5
    for shared in (below, above, weight, upper):
        shared.flags.writeable = False
    return below, above, weight, upper


def histogram_percentiles(histogram: np.ndarray | None, pcts) -> np.ndarray:
    """Percentiles of the values a histogram of `simcore.cluster.itl_bin` counts, in seconds:
    the value of the bin holding the value of rank ceil(q n) (nearest rank, q = pct / 100), so
    each is within the bins' relative accuracy (0.5%) of that value. NaN for an empty one, or
    none (a run's part, whose gaps are not kept apart)."""
    if histogram is None:
        return np.full(len(pcts), np.nan)
    total = int(histogram.sum())
    if total == 0:
        return np.full(len(pcts), np.nan)
    ranks = np.maximum(1, np.ceil(np.asarray(pcts, dtype=np.float64) / 100.0 * total))
    bins = np.searchsorted(np.cumsum(histogram), ranks)
    return _ITL_BIN_VALUES[bins]


_ITL_BIN_VALUES = itl_bin_values()   # (every run's SLO report reads it: computed once)
_ITL_BIN_VALUES.flags.writeable = False


def upper_confidence_percentiles(values: np.ndarray, pcts, confidence: float) -> np.ndarray:
    """Distribution-free upper confidence bounds of percentiles (one partial sort): for each,
    the order statistic of rank ceil(n q + z sqrt(n q (1 - q))), q = pct / 100, z the one-sided
    normal quantile of `confidence` (the normal approximation of the binomial count of requests
    below the true percentile). At confidence 0.5, the plain (linear-interpolated) percentiles."""
    if confidence <= 0.5:
        return percentiles(values, pcts)
    from statistics import NormalDist
    n, q = len(values), np.asarray(pcts, dtype=np.float64) / 100.0
    z = NormalDist().inv_cdf(confidence)
    ranks = np.minimum(n, np.ceil(n * q + z * np.sqrt(n * q * (1.0 - q))).astype(np.int64))
    return np.partition(values, ranks - 1)[ranks - 1]


def evaluate_slos(result, profile: SloProfile, confidence: float = 0.5,
                  measured: np.ndarray | None = None) -> SloReport:
    """Compare the run's percentiles with the profile's limits (linear-interpolated percentiles;
    with `confidence` > 0.5, each percentile's upper confidence bound instead). `measured`, a
    boolean per request, limits them to those requests (one window of a load curve)."""
    if not result.feasible:
        return SloReport(profile.name, False, result.reason, ())
    wanted: dict[str, list[str]] = {}
    for metric, pct in profile.limits:
        wanted.setdefault(metric, []).append(pct)
    found: dict[tuple[str, str], float | None] = {}
    for metric, pcts in wanted.items():  # one pass over a metric's values for all its limits
        if metric == "itl":  # every gap of the run, in ms whatever the profile's kind; the
            # gaps are binned per run, not per request, so a window (`measured`) has none
            gaps = histogram_percentiles(result.itl_histogram if measured is None else None,
                                         [PERCENTILES[p] for p in pcts])
            for pct, value in zip(pcts, gaps):
                found[metric, pct] = None if np.isnan(value) else float(value) * 1000.0
            continue
        slowdown = profile.slowdown(metric)
        values = getattr(result, f"{metric}_slowdown" if slowdown else f"{metric}_s")
        if measured is not None:
            values = values[measured]
        missing = np.isnan(values)
        if missing.any():   # (a copy only when there is something to drop)
            values = values[~missing]
        bounds = (upper_confidence_percentiles(values, [PERCENTILES[p] for p in pcts], confidence)
                  if len(values) else [None] * len(pcts))
        for pct, value in zip(pcts, bounds):
            found[metric, pct] = None if value is None else (
                float(value) if slowdown else float(value) * 1000.0)
    checks = [SloCheck(metric, pct, found[metric, pct], limit, profile.unit(metric))
              for (metric, pct), limit in profile.limits.items()]
    failing = [f"{c.metric.upper()} {c.percentile.upper()} {c.value:.4g} > {c.limit:g}{c.unit}"
               for c in checks if not c.passed]
    return SloReport(profile.name, True, "; ".join(failing), tuple(checks))
