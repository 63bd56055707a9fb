"""The closed loop's search goal: the rate its capacity bounds may size for.

`provision search --concurrency N` looks for the cheapest (min-power: least-power) cluster of
each design that holds N users within the SLOs. Its samples have no rate: the users' requests
arrive as fast as the cluster answers them. But the search's capacity bounds and pool floors
(`provisioner.layouts.capacity`) size a cluster for a rate, and a rate too HIGH there would
skip clusters that are cheaper and feasible. So they get a rate every cluster that meets the
SLOs on the base sample is proven to process (`safe_rate`; docs/closed-loop.md states the
argument), or none (they then size for no load: the pools grow from one machine).

The argument, for one way the SLOs bound a request's E2E (`_bounds`): an E2E limit at
percentile q, or a TTFT limit at q1 with a TBT limit at q2 (E2E = TTFT + TBT x the request's
gaps), each in milliseconds or as a slowdown against the request alone on the SLO reference
machine (so a per-request bound b_k, known from its sizes). Over M requests a percentile
that meets its limit (the linear-interpolated one, or its upper confidence bound, never lower)
leaves at most s = M - floor((M - 1) q) - 1 requests above it; with two limits, their sum.
1. At most s users ever wait on a request above its bound, so at least N - s users ("good")
   only send requests within theirs.
2. A good user that sent its last request before the M-th arrival a_M was thinking or
   waiting all along: a_M <= the sum of its requests' E2E and think times (else it would have
   sent another). Summed over the good users: (N - s) a_M <= sum of b_k + sum of think_k
   over all M requests (the think times are drawn before the run). With N >= M all arrive at 0.
3. The at least M - s requests within their bounds arrive by a_M and so finish by
   a_M + max b_k: the cluster did their work (at least the M - s smallest prompts, and
   outputs) within that time.
That is a rate of the sample's mean-sized requests the cluster sustained: M x the smaller of
those work shares / (a_M + max b_k). The largest rate over the ways is kept; a way with
s >= N proves nothing (every user may wait on a slow request), and when none proves anything
(only ITL limited, say, or a loose P50 over few requests per user) there is no rate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from simcore.metrics import uncontended_latencies
from slo_profiles import PERCENTILES, SloProfile


def slow_allowed(pct: str, count: int) -> int:
    """How many of `count` values may exceed a limit that their `pct` percentile meets: the
    sorted values' index floor((count - 1) q) is at most the percentile (numpy's linear
    rule; an upper confidence bound is a later order statistic), so that many + 1 are within
    (rounded towards more: safe)."""
    q = PERCENTILES[pct] / 100.0
    return count - (math.floor((count - 1) * q - 1e-9) + 1)


def _bounds(slo: SloProfile, reference, output: np.ndarray, per_token: bool):
    """(label, each request's E2E bound in seconds, requests allowed above it) of every way
    the SLOs bound a request's E2E."""
    ttft_ref, tbt_ref, e2e_ref = reference
    count = len(output)

    def seconds(metric: str, pct: str, alone: np.ndarray) -> np.ndarray:
        limit = slo.limits[metric, pct]
        return limit * alone if slo.slowdown(metric) else np.full(count, limit / 1000.0)

    def limited(metric: str) -> list[str]:
        return [pct for (m, pct) in slo.limits if m == metric]

    ways = [(f"E2E {pct.upper()}", seconds("e2e", pct, e2e_ref), slow_allowed(pct, count))
            for pct in limited("e2e")]
    gaps = (output if per_token else output - 1).astype(np.float64)   # TBT's divisor
    for first in limited("ttft"):
        for gap in limited("tbt"):
            decode = np.nan_to_num(seconds("tbt", gap, tbt_ref) * gaps)  # 1 token: no gap
            ways.append((f"TTFT {first.upper()} + TBT {gap.upper()}",
                         seconds("ttft", first, ttft_ref) + decode,
                         slow_allowed(first, count) + slow_allowed(gap, count)))
    return ways


def _smallest_share(work: np.ndarray, kept: int) -> float:
    """The share of the total work the `kept` smallest requests hold (1 with no work)."""
    total = float(np.sum(work))
    return 1.0 if total <= 0 else float(np.sum(np.sort(work)[:kept])) / total


def _way_rate(bound: np.ndarray, slow: int, users: int, think: np.ndarray,
              prompt: np.ndarray, decode: np.ndarray):
    """(rate, a_M bound, finish bound) one way proves (module docstring), or None."""
    count = len(bound)
    if slow >= count:
        return None
    if users >= count:
        arrive_by = 0.0   # every request is a user's first: all arrive at 0
    elif users - slow < 1:
        return None       # every user may wait on a slow request
    else:
        arrive_by = (float(np.sum(bound)) + float(np.sum(think))) / (users - slow)
    done_by = arrive_by + float(np.max(bound))
    kept = count - slow
    share = min(_smallest_share(prompt, kept), _smallest_share(decode, kept))
    return count * share / done_by, arrive_by, done_by


def _round_down(rate: float) -> float:
    """To 4 significant digits, never up (the rate must stay a lower bound)."""
    step = 10.0 ** (math.floor(math.log10(rate)) - 3)
    return float(f"{math.floor(rate / step) * step:.4g}")


@dataclass(frozen=True)
class Proof:
    """The way that proves the highest rate, with its steps' figures (module docstring)."""
    label: str          # which limits: "E2E P99", "TTFT P99 + TBT P99"
    slow: int           # requests that may exceed their bound
    arrive_by: float    # every request has arrived by then (s)
    done_by: float      # the others have finished by then (s)
    rate: float         # the rate of the sample's mean work that proves (req/s)


def proof(sample, slo: SloProfile, reference_curves, per_token: bool) -> Proof | None:
    """The best `Proof` the base sample's closed loop (`sample`: a closed-loop Workload) and
    the SLOs give, or None."""
    loop = sample.closed
    prompt, output = sample.prompt_tokens, sample.output_tokens
    reference = uncontended_latencies(prompt, output, reference_curves, per_token)
    best = None
    for label, bound, slow in _bounds(slo, reference, output, per_token):
        found = _way_rate(bound, slow, loop.users, loop.think_s, prompt.astype(np.float64),
                          (output - 1).astype(np.float64))
        if found is not None and found[0] > 0 and (best is None or found[0] > best.rate):
            rate, arrive_by, done_by = found
            best = Proof(label, slow, arrive_by, done_by, rate)
    return best


def safe_rate(sample, slo: SloProfile, reference_curves, per_token: bool):
    """(rate, why) the base sample's closed loop proves every SLO-meeting cluster processes
    (`proof`, rounded down), or (None, why not)."""
    best = proof(sample, slo, reference_curves, per_token)
    if best is None:
        return None, ("no SLO bounds a request's E2E for enough requests (an E2E limit, or "
                      "TTFT and TBT limits, leaving fewer slow requests than users): the "
                      "pools grow from one machine")
    label, slow, arrive_by, done_by = best.label, best.slow, best.arrive_by, best.done_by
    rate = _round_down(best.rate)
    return rate, (f"{label}: at most {slow:,} of the {len(sample):,} requests above their "
                  f"limit, so every request arrives by {arrive_by:.4g} s and those within it "
                  f"finish by {done_by:.4g} s: at least {rate:g} req/s of the sample's "
                  "mean work on any cluster that meets the SLOs")


def with_safe_rate(load, sample, slo: SloProfile, reference_curves, per_token: bool):
    """The closed load with its bounds' rate (`safe_rate` of its base sample) and why."""
    rate, why = safe_rate(sample, slo, reference_curves, per_token)
    return replace(load, bound_rps=rate, bound_why=why)
