"""Long runs: a day or a week of a load curve in one simulation, in bounded memory (issue 29).

A week at the shared curves' scale is 17-27 million requests; at 160 bytes a request record,
keeping every record (as `simulate` does) would take 2.7-4.3 GB before any result. A long run
instead streams: the arrivals are drawn step by step of the curve as the run goes
(`curve_chunks`), the compiled core keeps `SLOTS` request records and reuses the slot of a
finished request (`simcore.fastsim.run_streamed`: the same run, instant for instant, as with
one record per request), and each finished request leaves only its latencies and slowdowns
as float32 (24 bytes). A window's percentiles are then exact (over its requests, by arrival),
as `evaluate_slos` computes them for any run.

Memory: 24 bytes per request plus the slots (about 160 MB), so a 27-million-request week
fits in well under 2 GB. ITL is one histogram over the whole run (`simcore.cluster.itl_bin`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterator, Sequence

import numpy as np

from hardware_catalog import InputError, MachineSku, ModelSpec
from simcore.cluster import Cluster, SimOptions, Stalled
from simcore.fastsim import TooManyInFlight, run_streamed
from simcore.metrics import first_token_overheads, request_latencies, uncontended_latencies
from simcore.specdecode import decode_steps, step_plan
from simcore.simulate import (_unservable_reason, machine_statistics, reference_curves,
                              run_machines)
from simcore.sessions import (BLOCK_TOKENS, PrefixModel, _draw_sessions,
                              session_block_ids, session_rate_per_request)
from simcore.workload import Workload, _arrival_times, _size_sampler

SLOTS = 1 << 20            # request records held (a request older than this many arrivals
#                            that has not finished makes the run infeasible: TooManyInFlight)
CHUNK_REQUESTS = 1 << 17   # at most this many requests drawn at a time (< SLOTS / 2)
MAX_CURVE_REQUESTS = 100_000_000   # a longer run is a typo (or months of load): refused
METRICS = ("ttft", "tbt", "e2e")


@dataclass(frozen=True, eq=False)
class RequestLatencies:
    """Per-request latencies of part of a run (what `evaluate_slos` reads): seconds and
    slowdowns, float32, NaN where a request has none (TBT of a 1-token output). ITL is not
    kept per request: a part has `itl_histogram` None (no ITL value), the whole run its own
    (`histogram_percentiles` reads it)."""
    ttft_s: np.ndarray
    tbt_s: np.ndarray
    e2e_s: np.ndarray
    ttft_slowdown: np.ndarray
    tbt_slowdown: np.ndarray
    e2e_slowdown: np.ndarray
    itl_histogram: np.ndarray | None = None
    feasible: bool = True
    reason: str = ""

    def __len__(self) -> int:
        return len(self.ttft_s)


@dataclass(frozen=True, eq=False)
class CurveRun:
    """A whole load curve simulated in one run: `requests` per window (`window_requests`,
    windows as given), each request's latencies (`latencies`, in arrival order), the machine
    statistics and ITL histogram of the run. Infeasible: `reason` says why (no latencies)."""
    feasible: bool
    reason: str
    window_requests: tuple[int, ...]
    latencies: RequestLatencies | None = None
    machine_stats: dict = field(default_factory=dict)
    failure_stats: dict | None = None
    schedule: np.ndarray | None = None
    makespan_s: float = 0.0
    # with prefix caching: per window, the tokens the lookups of its requests (those that
    # arrived in it) found cached and looked up (a recompute looks up again); None: no cache
    window_prefix: np.ndarray | None = None

    @property
    def requests(self) -> int:
        return sum(self.window_requests)

    def window_hit_rate(self, k: int) -> float | None:
        """Window k's prefix hit rate: hit tokens / looked-up tokens of its requests (None:
        no cache, or nothing looked up)."""
        if self.window_prefix is None or not self.window_prefix[k, 1]:
            return None
        return float(self.window_prefix[k, 0] / self.window_prefix[k, 1])

    @property
    def prefix_hit_rate(self) -> float | None:
        """The whole curve's (the windows' sums)."""
        if self.window_prefix is None or not self.window_prefix[:, 1].sum():
            return None
        return float(self.window_prefix[:, 0].sum() / self.window_prefix[:, 1].sum())

    @cached_property
    def _window_starts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.window_requests)]).astype(np.int64)

    def window(self, k: int) -> RequestLatencies:
        """The latencies of the requests that arrived in window k (no ITL: see the module)."""
        start, stop = self._window_starts[k], self._window_starts[k + 1]
        whole = self.latencies
        return RequestLatencies(*(getattr(whole, f"{m}_{unit}")[start:stop]
                                  for unit in ("s", "slowdown") for m in METRICS))

    def __repr__(self) -> str:
        state = "" if self.feasible else f"infeasible: {self.reason}, "
        return (f"CurveRun({state}{self.requests:,} requests in {len(self.window_requests)} "
                "windows)")


def expected_requests(times: Sequence[float], rates: Sequence[float], end_s: float,
                      linear: bool = False) -> float:
    edges = [*times, end_s]
    ends = [*rates[1:], rates[-1]] if linear else rates
    return sum((r + q) / 2 * (b - a) for r, q, a, b in zip(rates, ends, edges, edges[1:]))


def _unit_arrivals(rng: np.random.Generator, total: float, gaps: np.ndarray | None) -> np.ndarray:
    """Arrivals of a unit-rate process over [0, total): Poisson, or (`gaps`: a trace's gaps
    over their mean) a renewal process whose gaps are drawn from the trace's, so its bursts
    keep their shape at any rate."""
    if gaps is None:
        return _arrival_times(rng, 1.0, total, "poisson", 1.0)
    chunk = int(total + 8 * np.sqrt(total) + 16)
    pieces, start = [], 0.0
    while True:
        points = start + np.cumsum(gaps[rng.integers(0, len(gaps), chunk)])
        pieces.append(points[points < total])
        if points[-1] >= total:
            return np.concatenate(pieces)
        start = points[-1]


def trace_gaps(trace: Workload) -> np.ndarray | None:
    """A trace's inter-arrival gaps over their mean (None: fewer than two arrivals, or all at
    once: no shape to keep)."""
    gaps = np.diff(np.sort(trace.arrival_s))
    return gaps / gaps.mean() if len(gaps) and gaps.mean() > 0 else None


def _linear_arrivals(rng: np.random.Generator, first: float, last: float,
                     duration: float, gaps: np.ndarray | None = None) -> np.ndarray:
    """Arrivals over [0, duration) at a rate going linearly from `first` to `last`: a
    unit-rate process (`_unit_arrivals`) over the cumulative rate L(t) = first t +
    (last - first) t^2 / 2d, mapped back through its inverse (exact, no thinning)."""
    total = (first + last) / 2 * duration
    if total <= 0:
        return np.zeros(0)
    units = _unit_arrivals(rng, total, gaps)
    slope = (last - first) / duration
    # t = 2u / (first + sqrt(first^2 + 2 slope u)): the root of L(t) = u, stable for any slope
    times = 2 * units / (first + np.sqrt(np.maximum(first * first + 2 * slope * units, 0.0)))
    return np.minimum(times, np.nextafter(duration, 0))


def curve_chunks(sizes: str | Workload, times: Sequence[float], rates: Sequence[float],
                 end_s: float, seed: int, edges: Sequence[float], counts: list[int],
                 chunk: int = CHUNK_REQUESTS,
                 linear: bool = False) -> Iterator[tuple[np.ndarray, ...]]:
    """Arrivals following the curve (piecewise constant: `rates[i]` from `times[i]` to the next
    time, the last to `end_s`; `linear`: interpolated between the rows, the last rate held to
    `end_s`) with sizes drawn from `sizes`: Poisson for a size table, and for a trace its own
    inter-arrival gaps, rescaled to the curve's rate (`trace_gaps`). Yielded as
    (arrival_s, prompt, output) chunks in arrival order: each piece of the curve between two
    of its steps or window `edges` is drawn in turn from one generator seeded with `seed`
    (arrivals, then sizes), so the same inputs give the same requests; chunks hold at most
    `chunk` requests. Appends to `counts` the requests of each window (edges[k] to
    edges[k + 1]) as they are drawn."""
    sampler, _, _ = _size_sampler(sizes)
    gaps = trace_gaps(sizes) if isinstance(sizes, Workload) else None
    rng = np.random.default_rng(seed)
    counts.extend([0] * (len(edges) - 1))
    for start, arrival in _curve_pieces(rng, times, rates, end_s, edges, gaps, linear):
        prompt, output = sampler(rng, len(arrival))
        _tally(counts, edges, start, len(arrival))
        for first in range(0, len(arrival), chunk):
            part = slice(first, first + chunk)
            yield arrival[part], prompt[part], output[part]


def _tally(counts: list[int], edges: Sequence[float], start: float, requests: int) -> None:
    """Count a piece's requests in the window its start falls in (a piece lies in one)."""
    window = int(np.searchsorted(edges, start, side="right")) - 1
    if 0 <= window < len(counts):
        counts[window] += requests


def _curve_pieces(rng: np.random.Generator, times, rates, end_s: float, edges,
                  gaps: np.ndarray | None = None, linear: bool = False, scale: float = 1.0,
                  empty: bool = False):
    """The curve's pieces between two of its steps or window `edges`, in order, each with the
    arrivals drawn in it (`curve_chunks`: the rates x `scale`); `empty`: pieces without
    arrivals too."""
    steps = [*times, end_s]
    cuts = sorted(set(steps) | set(edges))
    knots = (np.array(steps), np.append(np.array(rates, dtype=np.float64), rates[-1]))
    for start, stop in zip(cuts, cuts[1:]):
        if stop <= start:
            continue
        if linear:
            first, last = np.interp([start, stop], *knots) * scale
            arrival = start + _linear_arrivals(rng, float(first), float(last), stop - start,
                                               gaps)
        else:
            rate = rates[max(0, int(np.searchsorted(steps, start, side="right")) - 1)] * scale
            if rate <= 0:
                arrival = np.zeros(0)
            elif gaps is None:
                arrival = start + _arrival_times(rng, rate, stop - start, "poisson", 1.0)
            else:
                arrival = start + _unit_arrivals(rng, rate * (stop - start), gaps) / rate
        if len(arrival) or empty:
            yield (start, stop) if empty else start, arrival


def curve_session_chunks(sizes, model: PrefixModel, context: int, times: Sequence[float],
                         rates: Sequence[float], end_s: float, seed: int,
                         edges: Sequence[float], counts: list[int],
                         chunk: int = CHUNK_REQUESTS, linear: bool = False):
    """Sessions (`simcore.sessions`, the model stated there) over the curve: sessions start
    as a Poisson process at the curve's rate / E[turns] (`session_rate_per_request`), so the
    turns arrive at about the curve's rate, following it a session's span behind; from the
    curve's start, cold (no warm-up: the first think times ramp up). Each piece of the curve
    (`curve_chunks`) draws its session starts, then their sessions whole (`_draw_sessions`:
    one generator seeded with `seed`); a turn is yielded in the piece its arrival falls in,
    turns in arrival order (ties: by session, then turn), those at or after `end_s` dropped.
    Yielded as (arrival_s, prompt, output, None, block ids, offsets) chunks (`run_streamed`'s
    prefix chunks), the ids global (`session_block_ids`); appends to `counts` each window's
    turns."""
    sampler, _, _ = _size_sampler(sizes)
    per_request = session_rate_per_request(sizes, model, context)
    rng = np.random.default_rng(seed)
    counts.extend([0] * (len(edges) - 1))
    pending = _Turns.empty()
    sessions = requests = 0
    for (start, stop), starts in _curve_pieces(rng, times, rates, end_s, edges, None, linear,
                                               per_request, empty=True):
        if len(starts):
            drawn = _draw_sessions(rng, sampler, model, context, starts)
            pending = pending.joined(_Turns(
                drawn.arrival_s, drawn.prompt, drawn.output,
                drawn.system[drawn.session], drawn.session + sessions))
            sessions += len(starts)
        now, pending = pending.split(stop)
        if not len(now.arrival):
            continue
        _tally(counts, edges, start, len(now.arrival))
        for first in range(0, len(now.arrival), chunk):
            part = slice(first, first + chunk)
            numbers = requests + np.arange(len(now.arrival[part]))
            ids, offsets = session_block_ids(now.system[part], now.session[part], numbers,
                                             now.prompt[part], model.system_tokens)
            requests += len(numbers)
            yield now.arrival[part], now.prompt[part], now.output[part], None, ids, offsets


@dataclass(frozen=True, eq=False)
class _Turns:
    """Session turns drawn, not yet yielded, in (arrival, session, turn) order."""
    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    system: np.ndarray
    session: np.ndarray

    @staticmethod
    def empty() -> "_Turns":
        return _Turns(np.zeros(0), *(np.zeros(0, np.int64) for _ in range(4)))

    def joined(self, other: "_Turns") -> "_Turns":
        """Both, in arrival order (a stable sort: equal arrivals keep session order, and a
        session's turns arrive in order)."""
        columns = [np.concatenate([getattr(self, f), getattr(other, f)])
                   for f in ("arrival", "prompt", "output", "system", "session")]
        order = np.lexsort((columns[4], columns[0]))
        return _Turns(*(c[order] for c in columns))

    def split(self, before: float) -> tuple["_Turns", "_Turns"]:
        """(turns arriving before `before`, the others)."""
        cut = int(np.searchsorted(self.arrival, before, side="left"))
        return (_Turns(*(getattr(self, f)[:cut] for f in self.__dataclass_fields__)),
                _Turns(*(getattr(self, f)[cut:] for f in self.__dataclass_fields__)))


def simulate_curve(cluster: Cluster, sizes: str | Workload, times: Sequence[float],
                   rates: Sequence[float], end_s: float, edges: Sequence[float], seed: int,
                   model: ModelSpec, perf, reference: MachineSku,
                   options: SimOptions = SimOptions(), slots: int = SLOTS,
                   linear: bool = False, sessions: PrefixModel | None = None,
                   context: int = 0) -> CurveRun:
    """Simulate the whole curve on `cluster` (resized by `options.pool_plan`, failing as
    `options` says over the whole curve), streamed in `slots` request records; windows are
    `edges[k]` to `edges[k + 1]` and must cover the curve; `linear`: the rate interpolated
    between the curve's rows (`curve_chunks`). `sessions`: the requests are sessions' turns
    (`curve_session_chunks`, cut at `context` tokens), with prompt blocks for
    `options.prefix_cache`, each machine's cache kept over the whole run (a machine that
    rejoins its pool starts cold)."""
    expected = expected_requests(times, rates, end_s, linear)
    if expected > MAX_CURVE_REQUESTS:
        raise InputError(f"the load curve asks for about {expected:,.0f} requests, more than "
                         f"{MAX_CURVE_REQUESTS:,}; simulate part of it or lower its rates")
    machines, schedule, reason = run_machines(cluster, model, perf, options, end_s)
    counts: list[int] = []
    if reason:
        return CurveRun(False, reason, tuple(counts))
    ref = reference_curves(model, perf, reference, options)
    per_token = machines.tbt_per_output_token
    store = _Store(int(expected + 10 * math.sqrt(expected) + 1024))
    failures = bool(len(machines.failures))

    def checked(chunks):
        for chunk in chunks:
            why = _unservable_reason(cluster, Workload("chunk", *chunk[:3]), model, machines)
            if why:
                raise _Unservable(why)
            yield chunk

    spec = options.spec_decode

    window_prefix = np.zeros((len(edges) - 1, 2), np.int64)

    def harvest(first: int, records, hits=None) -> None:
        store.add(first, records, ref, per_token, failures,
                  first_token_overheads(machines.curves, machines.kind, records.prompt_machine))
        if hits is not None:  # each request's counts into its arrival window's
            ends = np.cumsum(counts)
            window = np.searchsorted(ends, first + np.arange(len(records)), side="right")
            np.add.at(window_prefix, np.minimum(window, len(window_prefix) - 1), hits)

    try:
        size = min(CHUNK_REQUESTS, slots // 4)
        if sessions is None:
            chunks = curve_chunks(sizes, times, rates, end_s, seed, edges, counts, size, linear)
        else:
            chunks = curve_session_chunks(sizes, sessions, context, times, rates, end_s, seed,
                                          edges, counts, size, linear)
        if spec is not None:
            chunks = with_step_plans(chunks, spec, options.spec_seed)
        cached = sessions is not None and options.prefix_cache
        raw = run_streamed(machines, checked(chunks), slots, harvest,
                           BLOCK_TOKENS if cached else 0, -(-context // BLOCK_TOKENS))
    except _Unservable as err:
        return CurveRun(False, str(err), tuple(counts))
    except TooManyInFlight as err:
        return CurveRun(False, f"the cluster falls behind the load for good: {err}",
                        tuple(counts))
    except Stalled:
        return CurveRun(False, "requests were left unserved: every machine that could take "
                        "them is down for the rest of the run", tuple(counts))
    latencies = store.latencies(raw["itl_histogram"])
    return CurveRun(True, "", tuple(counts), latencies,
                    machine_statistics(raw, machines, cluster, raw["end_s"]),
                    store.failure_totals() if failures else None, schedule, raw["end_s"],
                    window_prefix if cached else None)


def with_step_plans(chunks, spec, seed: int):
    """Speculative decoding over a long run: each chunk with its requests' step plan, drawn
    for the chunk alone (`decode_steps`' stream: the number of its first request), so the
    run is the same as one whole run given the chunks' plans end to end."""
    first = 0
    for arrival, prompt, output, *blocks in chunks:
        steps = decode_steps(output, spec, seed, stream=first)
        yield (arrival, prompt, output, step_plan(prompt, output, steps), *blocks[1:])
        first += len(arrival)


class _Unservable(Exception):
    pass


class _Store:
    """The finished requests' latencies, by arrival order, growing as needed."""

    def __init__(self, expected: int):
        self.columns = {f"{m}_{u}": np.empty(expected, np.float32)
                        for u in ("s", "slowdown") for m in METRICS}
        self.size = 0
        self.recoveries = self.recomputed = 0
        self.affected = 0
        self.recovery_s = 0.0
        self.recovery_max = 0.0

    def add(self, first: int, records, ref, per_token: bool, failures: bool,
            first_token_s=0.0) -> None:
        count = len(records)
        if first + count > len(self.columns["ttft_s"]):
            grown = max(first + count, int(len(self.columns["ttft_s"]) * 1.25))
            for key, column in self.columns.items():
                self.columns[key] = np.resize(column, grown)
        # the output tokens (under speculative decoding `output` counts decode steps)
        output = (records.reservation - records.prompt).astype(np.int64)
        ttft, tbt, e2e = request_latencies(records.arrival, output, records.first_token,
                                           records.finish, per_token, first_token_s)
        with np.errstate(invalid="ignore", divide="ignore"):
            ref_ttft, ref_tbt, ref_e2e = uncontended_latencies(
                records.prompt.astype(np.int64), output, ref, per_token)
            values = {"ttft_s": ttft, "tbt_s": tbt, "e2e_s": e2e, "ttft_slowdown": ttft / ref_ttft,
                      "tbt_slowdown": tbt / ref_tbt, "e2e_slowdown": e2e / ref_e2e}
        part = slice(first, first + count)
        for key, value in values.items():
            self.columns[key][part] = value
        self.size = max(self.size, first + count)
        if failures:
            hit = records.recoveries > 0
            self.affected += int(hit.sum())
            self.recoveries += int(records.recoveries.sum())
            self.recomputed += int(records.recomputed.sum())
            self.recovery_s += float(records.recovery_s.sum())
            if hit.any():
                self.recovery_max = max(self.recovery_max, float(records.recovery_s.max()))

    def latencies(self, itl_histogram: np.ndarray) -> RequestLatencies:
        return RequestLatencies(**{key: column[:self.size]
                                   for key, column in self.columns.items()},
                                itl_histogram=itl_histogram)

    def failure_totals(self) -> dict:
        return {"requests_affected": self.affected, "recoveries": self.recoveries,
                "tokens_recomputed": self.recomputed,
                "recovery_s_mean": self.recovery_s / self.affected if self.affected else 0.0,
                "recovery_s_max": self.recovery_max}
