"""Verification: is a candidate feasible for the workload, not just for one sample of it?

Every searched point is screened on the base sample (`SCREEN_SEEDS`); a candidate for the
optimum is verified on all `--verify-seeds` samples (seeds `--seed`, `--seed`+1, ...): it must
meet every SLO on each with the `--verify-margin` guard band, and each SLO's mean + 2 sd over
the samples must stay under its limit (`combine_samples`). `Verifier` runs those checks lazily,
hardest samples first, one at a time; the frontier only asks (`Verify(point)`) and steps.

Sequential verification: a candidate is verified sample by sample (in that order, one at a time)
and stops as soon as the samples so far decide it, up to all of them when they do not.
- Fail: any sample fails or falls inside the guard band (a failure is a failure): no other
  sample of that candidate runs.
- Pass early: looked at every VERIFY_STEP samples (`step_ends`), after at least MIN_SAMPLES
  samples (n of N), when for every limited SLO the
  margins m = 1 - value/limit seen so far (mean m̄, sd s) satisfy both
  (1) m̄ - t(1 - EARLY_ALPHA/(N - n), n - 1) * s * sqrt(1 + 1/n) >= band: the one-sided
      prediction bound (Student t, Bonferroni over the N - n samples not run) puts every
      remaining sample outside the guard band, and
  (2) m̄ - t(0.95, n - 1) * s / sqrt(n) - 2 * s * sqrt((n - 1) / chi2(0.05, n - 1)) >= 0: the
      mean + 2 sd rule of `combine_samples` holds with the mean at its 95% lower bound and the
      sd at its 95% upper bound (the small-sample correction).
  With n = 5 of 20 samples, (1) asks m̄ >= band + 13.3 s (band + 29.7 standard errors of the
  mean, s / sqrt(n)), (2) m̄ >= 5.7 s; with n = 9, band + 6.2 s and 4.0 s. EARLY_ALPHA is
  this small because the margins' tails are heavier than normal and the rule looks after
  every step (n = 5, 7, ..., 19 of 20).
- History guard (`Verifier._must_run`): an early pass also needs every sample the design's
  history marks hard to have run. The history is each sample's binding margin when the
  design's latest verification ran it (quick checks included); hard are the samples it has
  no margin for (so a design's first complete verification runs them all), the HARD_SEEDS
  lowest recorded, and any recorded within HARD_WITHIN of the guard band. The hardest-first
  order runs the recorded ones first, so a rare hard sample, once seen, runs before any
  early pass. Without it, a sample 10% weaker than nine equal ones, run last, was skipped
  (tests/test_search.py::test_max_rate_verifies_one_rate_on_every_sample: 138 req/s where
  it sustains 125.6): equal early margins make the prediction bound overconfident.
- Otherwise: all N samples, and today's rule decides (`combine_samples`).
Its error rate (the rule alone: the guard only runs more samples), measured by
tests/test_sequential_verify.py on synthetic candidates (normal,
heavy-tailed and skewed margins, 0.5-12% spreads, centres from hopeless to safe) whose verdict
under the N-sample rule is known (N = 20, 12,150 candidates): 0.55% wrong verdicts in all
(normal 0.05%, heavy-tailed 0.6%, skewed 1.0%; the worst single kind of candidate 4.0%, a
skewed one 3 sds above the band), while clear candidates stop after 6 samples on average and
early passes are 39% of all verdicts. A failing sample that is run always rejects, so every
wrong verdict is an early pass of a candidate a later sample would have failed.
After the search, each optimum gets per-sample SLO values and bootstrap intervals
(`attach_verification`), and an optimum whose samples came from the disk cache is simulated
again before it is reported (`recheck_cached_optimum`): the cache can slow a search, never
change its answer.

Every seed count of the search is here, once.
"""
from __future__ import annotations

import functools
import math
import statistics
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from provisioner.study import SLO_KEYS, DesignResult, Metrics, Outcome, Point
from simcore.metrics import histogram_percentiles, percentiles
from slo_profiles import PERCENTILES, REQUEST_METRICS, SloProfile

SCREEN_SEEDS = 1     # samples every searched point is checked on; candidates are verified on all
VERIFY_STEP = 2      # samples between two looks for an early pass, after the screening seed
QUICK_SAMPLES = 3    # a quick check: the 2 hardest samples, then the screening seed
INTERVAL_SEEDS = 3   # samples given an interval: each needs a run's per-request latencies
PASS_RATE_Z = 2.0    # one-sided normal quantile (97.7%): margin over the 95% fresh-sample target
MIN_SAMPLES = 5      # samples a candidate needs before it may pass early (sequential rule)
EARLY_ALPHA = 0.002  # per look, normal model: chance a remaining sample falls inside the band
HARD_SEEDS = 3       # history guard: the samples with the lowest recorded margins always run
HARD_WITHIN = 0.02   # history guard: so does any whose recorded margin was within this of the band


def verification_seeds(seed: int, count: int) -> tuple[int, ...]:
    """The verification samples: `seed`, `seed` + 1, ... (`provision simulate --seed S`
    reproduces each); the first SCREEN_SEEDS also screen every searched point."""
    return tuple(seed + k for k in range(count))


# ------------------------------------------------------------------ the verdict
@dataclass(frozen=True)
class Verify:
    """A request to check a candidate on every verification sample, not just the screening
    ones (an item of a batch, like a Point). With `samples`, a quick check instead: only that
    many samples, the hardest first (a failure is a failure; a pass is not a verification)."""
    point: Point
    samples: int | None = None


def combine_samples(samples: list[tuple[int, Outcome]], predict: bool = False,
                    margin: float = 0.0) -> Outcome:
    """One verdict over several samples: the SLOs hold only if they hold on every sample; each
    SLO value is its worst over the samples, so margins are the smallest seen.

    With `predict`, each SLO must also keep mean + 2 sd of its per-sample values under the
    limit (the normal fitted to the samples puts a fresh sample under it with ~97.7%
    probability) and every sample must beat every limit by `margin` (a guard band: the tails
    are heavier than normal, a rare sample fails by 10% or more; bench/RESULTS.md measures
    the fresh-sample pass rates these rules give).
    """
    first = samples[0][1]
    if len(samples) == 1 and not (margin and first.meets_slos):
        return first
    outcomes = [o for _, o in samples]
    failing = next(((seed, o) for seed, o in samples if not o.meets_slos), None)
    reason = "" if failing is None else f"seed {failing[0]}: {failing[1].reason}"
    if failing is None:
        reason = _guard_band_failure(samples, margin)
    if not reason and predict:
        reason = _prediction_failure(outcomes)
    slo = []
    for i, (key, _, limit) in enumerate(first.slo):
        values = [o.slo[i][1] for o in outcomes]
        slo.append((key, None if None in values else max(values), limit))
    margins = [o.worst_margin for o in outcomes]
    return Outcome(not reason, all(o.completed for o in outcomes), reason, tuple(slo),
                   None if None in margins else min(margins), first.requests)


def inside_guard_band(outcome: Outcome, margin: float) -> bool:
    """Does a sample miss some limit by less than `margin` (or miss it)?"""
    return outcome.worst_margin is not None and outcome.worst_margin < margin


def _guard_band_failure(samples: list[tuple[int, Outcome]], margin: float) -> str:
    """'' when every sample beats every limit by `margin`, else the first sample that does not."""
    for seed, outcome in samples:
        if inside_guard_band(outcome, margin):
            return (f"seed {seed}: worst SLO margin {outcome.worst_margin:+.1%} is inside the "
                    f"{margin:.0%} guard band")
    return ""


def _prediction_failure(outcomes: list[Outcome]) -> str:
    """'' when every SLO's prediction bound holds, else the SLOs whose bound exceeds the limit."""
    failing = []
    for i, (key, _, limit) in enumerate(outcomes[0].slo):
        values = [o.slo[i][1] for o in outcomes]
        if limit is None or math.isinf(limit) or None in values:
            continue
        bound = statistics.fmean(values) + PASS_RATE_Z * statistics.stdev(values)
        if bound > limit:
            metric, pct = key.split("_")
            failing.append(f"{metric.upper()} {pct.upper()} mean + {PASS_RATE_Z:g} sd "
                           f"{bound:.4g} > {limit:g} over {len(values)} samples")
    return "; ".join(failing)


# ------------------------------------------------------------ sequential verification
def early_pass(margins: Sequence[Sequence[float]], total: int, band: float) -> bool:
    """Do the samples so far decide a pass (the module docstring's rule)? `margins`: for each
    limited SLO, its margin 1 - value/limit on each sample so far (every sample already
    outside the guard band `band`); `total`: the samples a complete verification runs."""
    if not margins:
        return False
    n = len(margins[0])
    if n < MIN_SAMPLES or n >= total:
        return False
    spread = math.sqrt(1.0 + 1.0 / n)
    every_sample = _t_quantile(1.0 - EARLY_ALPHA / (total - n), n - 1) * spread
    mean_low = _t_quantile(0.95, n - 1) / math.sqrt(n)
    sd_high = PASS_RATE_Z * math.sqrt((n - 1) / _chi2_quantile(0.05, n - 1))
    for values in margins:
        mean, sd = statistics.fmean(values), statistics.stdev(values)
        if mean - every_sample * sd < band or mean - (mean_low + sd_high) * sd < 0.0:
            return False
    return True


def sample_margins(samples: Sequence[tuple[int, Outcome]]) -> list[list[float]] | None:
    """For each SLO with a finite limit, its margin 1 - value/limit on each sample; None when
    a sample has no value for one (the samples then cannot decide early)."""
    margins = []
    for i, (_, _, limit) in enumerate(samples[0][1].slo):
        if limit is None or math.isinf(limit) or limit <= 0:
            continue
        values = [o.slo[i][1] for _, o in samples]
        if None in values:
            return None
        margins.append([1.0 - v / limit for v in values])
    return margins


@functools.lru_cache(maxsize=None)
def step_ends(total: int, screen: int = SCREEN_SEEDS) -> tuple[int, ...]:
    """The sample counts after which a verification of `total` samples looks at its samples
    for an early pass: the screening seeds, then every VERIFY_STEP more (the Verifier's
    schedule; it runs them one at a time, so that a failing sample stops its point)."""
    ends, done = [], min(screen, total)
    while True:
        ends.append(done)
        if done >= total:
            return tuple(ends)
        done = min(done + VERIFY_STEP, total)


@functools.lru_cache(maxsize=None)
def _t_quantile(p: float, df: int) -> float:
    """Student t quantile for an integer `df` >= 1 (bisection on its closed-form CDF; scipy's
    import would cost the search half a second)."""
    return _bisect(lambda x: _t_cdf(x, df), p, 0.0, 1e6) if p > 0.5 else \
        -_t_quantile(1.0 - p, df)


@functools.lru_cache(maxsize=None)
def _chi2_quantile(p: float, df: int) -> float:
    """Chi-square quantile for an integer `df` >= 1 (bisection on its closed-form CDF)."""
    return _bisect(lambda x: _chi2_cdf(x, df), p, 0.0, 1e4)


def _bisect(cdf, p: float, low: float, high: float) -> float:
    for _ in range(200):
        mid = 0.5 * (low + high)
        if cdf(mid) < p:
            low = mid
        else:
            high = mid
        if high - low <= 1e-12 * max(1.0, high):
            break
    return 0.5 * (low + high)


def _t_cdf(x: float, df: int) -> float:
    """P(T <= x), x >= 0, integer df (Abramowitz & Stegun 26.7.3-4)."""
    theta = math.atan(x / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2:
        term, total = c, c if df > 1 else 0.0
        for k in range(3, df - 1, 2):
            term *= (k - 1) / k * c * c
            total += term
        inside = 2.0 / math.pi * (theta + s * total)
    else:
        term, total = 1.0, 1.0
        for k in range(2, df - 1, 2):
            term *= (k - 1) / k * c * c
            total += term
        inside = s * total
    return 0.5 * (1.0 + inside)


def _chi2_cdf(x: float, df: int) -> float:
    """P(X <= x) for chi-square with an integer df (closed-form sums)."""
    if x <= 0.0:
        return 0.0
    half = x / 2.0
    if df % 2 == 0:
        term, upper = 1.0, 1.0
        for i in range(1, df // 2):
            term *= half / i
            upper += term
        return 1.0 - math.exp(-half) * upper
    root = math.sqrt(x)
    upper = math.erfc(root / math.sqrt(2.0))
    term = math.sqrt(2.0 * x / math.pi) * math.exp(-half)
    for i in range(1, (df + 1) // 2):
        upper += term
        term *= x / (2 * i + 1)
    return 1.0 - upper


# ---------------------------------------------------------------- the verifier
def _margin(outcome: Outcome) -> float:
    """A sample's worst SLO margin: -inf when it failed outright (the hardest), inf when no SLO
    has a limit."""
    if not outcome.meets_slos:
        return -math.inf
    return math.inf if outcome.worst_margin is None else outcome.worst_margin


@dataclass
class Verifier:
    """Feasibility on several workload samples, evaluated lazily. A `Point` is checked on the
    screening seeds; a `Verify(point)` on every verification seed. Seeds are simulated one
    at a time and a point stops at its first failing sample:
    it is infeasible, whatever the other samples say. `run` is the "evaluate these points"
    callable the search algorithm is given. A sample inside the guard band (`margin`) also
    stops its point: the verdict would reject it whatever the other samples say. A
    `Verify(point, samples=k)` is a quick check on the k hardest of them (defined below),
    without the prediction bound of a complete verification.

    A design's verifications try its hardest samples first: after the screening seeds, the
    seeds by the worst SLO margin the design's latest verification of each saw on them, then
    the unseen ones, largest sample first (the evaluator's `sample_size`; the sample with
    the most requests is the hardest for nearly every design). A rejected candidate's neighbour
    usually fails on the same sample, so it stops after a few simulations instead of up to
    twenty; the samples are kept in seed order.

    A complete verification is sequential (`sequential`): after each step, once at least
    MIN_SAMPLES samples all pass and `early_pass` says they decide the candidate, it stops
    there, passed on those samples (its `samples` hold exactly the ones run), but only once
    the samples its design's history marks hard have run (`_must_run`; none recorded: all of
    them). The order decides which samples an early pass saw, never a failure: a failing
    sample always rejects."""
    runner: Any   # provisioner.runner.Runner: outcomes(samples), evaluator
    seeds: tuple[int, ...]
    screen: int = SCREEN_SEEDS
    margin: float = 0.0   # guard band a verified candidate must keep on every sample
    sequential: bool = True   # a complete verification may pass early (`early_pass`)
    # design name -> {seed: its worst SLO margin when last verified}; each design's search
    # is sequential, so the order it gives is the same whatever the timing
    _margins: dict = field(default_factory=dict, repr=False)
    _sizes: dict = field(default_factory=dict, repr=False)   # (rate, seed) -> sample size
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def run(self, items: Sequence[Point | Verify]) -> list[Metrics]:
        wanted = [(item.point, self._order(item)) if isinstance(item, Verify)
                  else (item, self.seeds[:self.screen]) for item in items]
        samples: list[list[tuple[int, Outcome]]] = [[] for _ in wanted]
        complete = [isinstance(item, Verify) and item.samples is None for item in items]
        # the samples each complete verification must run before it may pass early (the
        # history guard, `_must_run`); the batch's items read the history as it was before it
        first = [self._must_run(point, seeds) if self.sequential and full else None
                 for full, (point, seeds) in zip(complete, wanted)]
        done = 0
        while True:
            alive = [i for i, (_, seeds) in enumerate(wanted) if done < len(seeds)
                     and all(self._passes(o) for _, o in samples[i])
                     and not (first[i] is not None
                              and self._decided(samples[i], len(seeds), first[i]))]
            if not alive:
                break
            # one sample per point and round, whatever the job count: the samples taken decide
            # the reasons and the order of later verifications, so must not depend on it, and
            # a point stops at its first failing sample. With several workers a complete
            # verification's samples up to its next look are simulated ahead in the same
            # batch (`_ahead`), so that they run side by side; they are only taken in turn
            asked = [(i, wanted[i][1][done]) for i in alive]
            ahead = [(i, seed) for i in alive if complete[i]
                     for seed in self._ahead(wanted[i][1], done)]
            outcomes = self.runner.outcomes([(wanted[i][0], seed) for i, seed in asked + ahead])
            for (i, seed), outcome in zip(asked, outcomes):
                samples[i].append((seed, outcome))
            done += 1
        results = []
        for item, (point, seeds), got, must, full in zip(items, wanted, samples, first,
                                                         complete):
            if isinstance(item, Verify):
                self._margins.setdefault(point.design.name, {}).update(
                    (seed, _margin(o)) for seed, o in got)
            got.sort(key=lambda sample: self.seeds.index(sample[0]))
            early = must is not None and self._decided(got, len(seeds), must)
            asked = len(got) if early else len(seeds)
            results.append(Metrics.of(point, self._verdict(got, asked, full,
                                                          named=isinstance(item, Verify)),
                                      tuple(got)))
        return results

    def _ahead(self, seeds: Sequence[int], done: int) -> Sequence[int]:
        """With several workers, the samples of a complete verification (`seeds`, in order)
        after the one it takes next (`seeds[done]`) up to its next look for an early pass
        (`step_ends`): simulated in the same batch, as they were when samples went two at a
        time; a failing sample before them wastes them (none with one worker)."""
        if getattr(self.runner, "jobs", 1) <= 1:
            return ()
        look = next(n for n in step_ends(len(seeds), self.screen) if n > done)
        return seeds[done + 1:look]

    def _order(self, item: Verify) -> tuple[int, ...]:
        """The samples a verification runs, in order: the screening seeds, then the others
        hardest first; a quick check runs its hardest ones before the screening seeds, which
        a candidate new to screening rarely fails, so that a hard sample failing it stops it
        before the easy one runs (the same samples, so the same verdict when all pass)."""
        order = self._hardest_first(item.point)
        if item.samples is None:
            return order
        picked = order[:item.samples]
        return (*picked[self.screen:], *picked[:self.screen])

    def _hardest_first(self, point: Point) -> tuple[int, ...]:
        seen = self._margins.get(point.design.name, {})
        rest = sorted(self.seeds[self.screen:], key=lambda s: (
            seen.get(s, math.inf), -self._sample_size(point.rate_rps, s), s))
        return (*self.seeds[:self.screen], *rest)

    def _sample_size(self, rate_rps: float | None, seed: int) -> int:
        """The evaluator's size of a sample (0 if it has none), asked once per rate and seed
        (design searches ask from several threads)."""
        sized = getattr(self.runner.evaluator, "sample_size", None)
        if sized is None:
            return 0
        with self._lock:
            if (rate_rps, seed) not in self._sizes:
                self._sizes[rate_rps, seed] = sized(rate_rps, seed)
            return self._sizes[rate_rps, seed]

    def _must_run(self, point: Point, order: Sequence[int]) -> int:
        """How many of a complete verification's samples (`order`, hardest first) must run
        before it may pass early: the history guard. Every sample the design's history has
        no margin for (all of them when it has none), the HARD_SEEDS with the lowest recorded
        margins, and every one whose recorded margin was within HARD_WITHIN of the guard band
        must have run; `_hardest_first` puts them first (the unseen ones last: then all run).
        The history is the design's own (its search is sequential), so the count is the same
        whatever the jobs or the backend."""
        seen = self._margins.get(point.design.name, {})
        if any(seed not in seen for seed in order):
            return len(order)
        lowest = sorted(order, key=lambda seed: seen[seed])[:HARD_SEEDS]
        hard = [i for i, seed in enumerate(order)
                if seed in lowest or seen[seed] < self.margin + HARD_WITHIN]
        return max(hard, default=-1) + 1

    def _decided(self, samples: list[tuple[int, Outcome]], total: int,
                 must: int = 0) -> bool:
        """Have the samples so far (every one passing, at least `must` of them: the history
        guard) decided a pass early (the sequential rule, `early_pass`)? A complete
        verification then stops there."""
        if not self.sequential or not samples or len(samples) >= total \
                or len(samples) < must or len(samples) not in step_ends(total, self.screen) \
                or not all(self._passes(o) for _, o in samples):
            return False
        margins = sample_margins(samples)
        return margins is not None and early_pass(margins, total, self.margin)

    def _passes(self, outcome: Outcome) -> bool:
        """Meets every SLO, outside the guard band (as `combine_samples` judges a sample)."""
        return outcome.meets_slos and not inside_guard_band(outcome, self.margin)

    def _verdict(self, samples: list[tuple[int, Outcome]], asked: int,
                 full: bool = True, named: bool = False) -> Outcome:
        """Every sample must pass; a complete verification on every seed must also pass the
        prediction bound (`combine_samples`). `named`: a verification's reason names the
        sample that failed it, also when it is the only one that ran (`combine_samples`
        returns a single sample's outcome as it is)."""
        complete = len(samples) == asked and all(o.meets_slos for _, o in samples)
        verified = complete and asked > self.screen and full
        verdict = combine_samples(samples, predict=verified, margin=self.margin)
        if named and len(samples) == 1 and not samples[0][1].meets_slos:
            verdict = replace(verdict, reason=f"seed {samples[0][0]}: {verdict.reason}")
        return verdict


# ----------------------------------------------------------- how sure an optimum is
RESAMPLES = 2000  # bootstrap resamples per percentile: its 95% interval to about +-1% of its width


def latency_values(result, profile: SloProfile) -> dict[str, np.ndarray]:
    """A run's per-request values of each metric as the profile limits it (slowdowns or
    seconds), NaN where a request has none."""
    return {metric: getattr(result, f"{metric}_slowdown" if profile.slowdown(metric)
                            else f"{metric}_s") for metric in REQUEST_METRICS}


def percentile_intervals(values: dict[str, np.ndarray], profile: SloProfile,
                         seed: int) -> dict[str, list[float]]:
    """{slo key: [low, high]} bootstrap 95% intervals of the limited percentiles of one run
    (`values`: its `latency_values`)."""
    rng = np.random.default_rng(seed)
    intervals = {}  # (ITL: its gaps are binned per run, not kept per request to resample)
    for metric in REQUEST_METRICS:
        ordered = np.sort(values[metric][~np.isnan(values[metric])])
        if len(ordered) == 0:
            continue
        scale = 1.0 if profile.slowdown(metric) else 1000.0
        for name in ("p50", "p90", "p99"):
            boot = bootstrap_percentiles(ordered, PERCENTILES[name], RESAMPLES, rng) * scale
            low, high = percentiles(boot, [2.5, 97.5])
            intervals[f"{metric}_{name}"] = [float(low), float(high)]
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


def intervals_of(evaluator, sample) -> dict:
    """{"ci": `percentile_intervals` of one sample's run, "ms": its percentiles in
    milliseconds when it was simulated for this (the base sample: the others' runs are kept
    as SLO values only)} (a runner function: runs on the workers)."""
    point, seed = sample
    values, seconds, hit_rate, loop = evaluator.run_latencies(point, seed)
    return {"ci": percentile_intervals(values, evaluator.study.slo, seed),
            "ms": milliseconds(seconds) if seconds is not None else None,
            "prefix_hit_rate": hit_rate, "closed_loop": loop}


def milliseconds(seconds: dict[str, np.ndarray]) -> dict[str, dict[str, float | None]]:
    """P50 / P90 / P99 in ms of each of TTFT, TPOT (a request's mean gap between tokens, the
    simulator's TBT), E2E and ITL (every inter-token gap: `seconds["itl"]` is the run's
    histogram of them); None where no request has the metric."""
    names = ("p50", "p90", "p99")
    pcts = [PERCENTILES[name] for name in names]
    out = {}
    for metric, values in seconds.items():
        if metric == "itl":
            gaps = histogram_percentiles(values, pcts)
            out[metric] = {name: None if np.isnan(v) else float(v) * 1000.0
                           for name, v in zip(names, gaps)}
            continue
        kept = values[~np.isnan(values)]
        found = percentiles(kept, pcts) if len(kept) else [None] * len(names)   # one sort
        out[metric] = {name: None if v is None else float(v) * 1000.0
                       for name, v in zip(names, found)}
    return out


def verification(design: DesignResult, intervals: list[dict]) -> dict | None:
    """Per SLO: the value on every verification sample, its bootstrap interval (`intervals`:
    `intervals_of` each of `interval_samples(design)`), the worst value, the limit and the
    margin; plus the binding SLO (smallest margin)."""
    optimum = design.optimum
    if optimum is None or not optimum.samples:
        return None
    seeds = [seed for seed, _ in optimum.samples]
    runs = list(intervals)
    # what only a run simulated for the report has: the base sample's
    latency_ms, hit_rate, loop = (next((run[key] for run in runs if run.get(key) is not None),
                                       None) for key in ("ms", "prefix_hit_rate", "closed_loop"))
    intervals = [run["ci"] for run in runs] + [{}] * (len(seeds) - len(runs))
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
    return {"seeds": seeds, "binding_slo": binding, "slo": slo, "latency_ms": latency_ms,
            **({} if hit_rate is None else {"prefix_hit_rate": hit_rate}),
            **({} if loop is None else {"closed_loop": loop})}


def attach_verification(results: Sequence[DesignResult], runner: Any) -> None:
    """Each optimum's per-sample SLO values, bootstrap intervals and binding SLO
    (`DesignResult.verification`), the intervals' runs simulated by `runner`."""
    wanted = [interval_samples(result) for result in results]
    intervals = iter(runner.map(intervals_of, [s for samples in wanted for s in samples]))
    for result, samples in zip(results, wanted):
        result.verification = verification(result, [next(intervals) for _ in samples])


def recheck_cached_optimum(results: Sequence[DesignResult], runner: Any) -> list[str]:
    """Simulate again every optimum's verification samples whose outcome came from the disk
    cache (cheap: the optimum's samples only), and rewrite their entries. Returns one line per
    sample whose fresh outcome differs from the cached one: then an entry written by other
    code or by hand steered the search, and its answer cannot be trusted."""
    samples = [(r.optimum.point, seed) for r in results if r.optimum is not None
               for seed, _ in r.optimum.samples if runner.from_cache((r.optimum.point, seed))]
    if not samples:
        return []
    cached = runner.outcomes(samples)   # from this run's memo
    fresh = runner.simulate_again(samples)
    return [f"{point.design.name} {point.prompt_machines}P+{point.token_machines}T seed "
            f"{seed}: the cache said {'pass' if old.meets_slos else 'fail'}, the simulator "
            f"says {'pass' if new.meets_slos else 'fail'}"
            for (point, seed), old, new in zip(samples, cached, fresh) if old != new]
