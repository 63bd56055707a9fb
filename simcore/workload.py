"""Workloads: requests as arrays (arrival time, prompt tokens, output tokens).

Two ways to get one:
- `load_trace(path)` reads a CSV trace (Azure 2023, SplitwiseSim or plain columns);
- `synthesize(sizes, rate_rps, duration_s, seed)` draws Poisson (or gamma) arrivals and samples
  request sizes from a built-in distribution or from another workload.
Which of them a name means (built-in or file, replayed or resampled) is decided at the edge
(`provisioner.study.WorkloadSource`), not here.
"""
from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from hardware_catalog.checks import Invalid, Number
from hardware_catalog.errors import InputError
from hardware_catalog import read_text
from hardware_catalog.csvschema import (MAX_REQUEST_TOKENS,
                                        MAX_TRACE_REQUESTS as MAX_REQUESTS, TRACE,
                                        TRACE_BYTES_PER_ROW, YEAR_S, read_table)
from simcore.interp import KnotIndex, PiecewiseLinear

BUILTIN_TABLES_PATH = Path(__file__).resolve().parent / "data" / "builtin_workloads.json"
ARRIVAL_KINDS = ("poisson", "gamma")
# Sane ranges (issue: bad input), checked where a workload enters: beyond them a run is a typo,
# or out of reach of one machine's memory and time. The trace file's own bounds (requests,
# tokens, arrival times, bytes per row) are declared with its schema (`csvschema.TRACE`).
MAX_SYNTHESIZED_REQUESTS = MAX_REQUESTS   # requests in a trace, or synthesized (rate x duration)
MAX_TRACE_SECONDS = YEAR_S  # arrival times (and a timestamped trace's span): one year
# A trace file's size bound: MAX_REQUESTS rows of at most TRACE_BYTES_PER_ROW bytes; a larger
# file cannot be a trace we could simulate, and is refused before it is read (or hashed),
# instead of being parsed until memory runs out.
MAX_TRACE_BYTES = MAX_REQUESTS * TRACE_BYTES_PER_ROW


@dataclass(frozen=True, eq=False)
class Workload:
    """Requests sorted by arrival. Times in seconds from the first arrival window's start."""
    name: str
    arrival_s: np.ndarray       # float64, non-decreasing
    prompt_tokens: np.ndarray   # int64, >= 1
    output_tokens: np.ndarray   # int64, >= 1 (the first output token comes from the prompt phase)
    notes: tuple[str, ...] = field(default=())
    # prefix caching (SimOptions.prefix_cache): each request's prompt blocks, one dense id
    # (0..B-1) per `prefix_block_tokens` tokens of its prompt, an id standing for the whole
    # prefix up to its block (Mooncake's hash_ids): request i's ids are
    # prefix_blocks[prefix_offsets[i]:prefix_offsets[i + 1]]. None: no blocks (no cache hits)
    prefix_blocks: np.ndarray | None = None    # int64, flat
    prefix_offsets: np.ndarray | None = None   # int64, len(self) + 1
    prefix_block_tokens: int = 512
    # closed-loop load (`ClosedLoop`): arrival_s is then what the run gave (zeros before it)
    closed: "ClosedLoop | None" = None

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def has_prefix_blocks(self) -> bool:
        return self.prefix_offsets is not None

    def request_blocks(self, i: int) -> np.ndarray:
        """Request i's prompt block ids (empty without blocks)."""
        if self.prefix_offsets is None:
            return np.zeros(0, np.int64)
        return self.prefix_blocks[self.prefix_offsets[i]:self.prefix_offsets[i + 1]]

    def head(self, n: int) -> "Workload":
        """Its first n requests (their blocks too, ids kept as they are)."""
        offsets = None if self.prefix_offsets is None else self.prefix_offsets[:n + 1]
        blocks = None if offsets is None else self.prefix_blocks[:offsets[-1]]
        return Workload(f"{self.name}[:{n}]", self.arrival_s[:n], self.prompt_tokens[:n],
                        self.output_tokens[:n], self.notes, blocks, offsets,
                        self.prefix_block_tokens)


@dataclass(frozen=True, eq=False)
class ClosedLoop:
    """Closed-loop load: `users` users, each sending a request, waiting for its last token,
    thinking, then sending the next. The first `users` requests arrive at time 0; when request
    k finishes at t, its user's next request arrives at t + think_s[k]. Requests are numbered
    in arrival order, so the k-th arrival takes the workload's k-th sizes, whichever user
    sends it; the run ends when all of them have arrived and finished (users still thinking
    then send nothing more). At most `users` requests are ever in the system at once."""
    users: int
    think_s: np.ndarray      # float64 >= 0, one per request: the think time after it finishes
    think_mean_s: float      # the mean they were drawn with (exponential; 0: back to back)


def closed_loop(workload: Workload, users: int, think_mean_s: float, seed: int) -> Workload:
    """`workload`'s requests (sizes and prompt blocks, in order) sent by `users` users in a
    closed loop, with exponential think times of mean `think_mean_s` drawn from `seed` (a
    stream of their own: the sizes are the same as without them). Arrival times are zeros
    until a simulator runs it (`with_arrivals`)."""
    if users < 1:
        raise InputError(f"a closed loop needs at least one user, got {users}")
    if not think_mean_s >= 0 or not np.isfinite(think_mean_s):
        raise InputError(f"the think time must be a finite number >= 0 s, got {think_mean_s}")
    n = len(workload)
    think = (np.zeros(n) if think_mean_s == 0 else
             np.random.default_rng([seed, _THINK_STREAM]).exponential(think_mean_s, n))
    note = (f"closed loop: {users} users, think time "
            + ("0 s (back to back)" if think_mean_s == 0 else
               f"exponential, mean {think_mean_s:g} s") + f", {n} requests")
    return replace(workload, name=f"{workload.name}/closed-{users}users-think{think_mean_s:g}s",
                   arrival_s=np.zeros(n), notes=(*workload.notes, note),
                   closed=ClosedLoop(int(users), think, float(think_mean_s)))


_THINK_STREAM = 0x7417   # the think times' own random stream beside the seed's


def draw_requests(sizes: str | Workload, count: int, seed: int) -> Workload:
    """`count` requests with sizes drawn from `sizes` (as `synthesize` draws them, from the
    seed) and no arrival times yet (zeros): a closed loop's requests."""
    sampler, base_name, size_note = _size_sampler(sizes)
    prompt, output = sampler(np.random.default_rng(seed), count)
    return Workload(f"{base_name}/{count}req/seed{seed}", np.zeros(count), prompt, output,
                    (size_note,))


def with_arrivals(workload: Workload, arrival_s: np.ndarray) -> Workload:
    """A closed-loop workload with the arrival times a run gave it."""
    return replace(workload, arrival_s=np.asarray(arrival_s, dtype=np.float64))


# ------------------------------------------------------------------------------ trace loading
def load_trace(path: str | Path) -> Workload:
    """Read a CSV trace (`csvschema.TRACE`): the header decides the layout (Azure 2023,
    SplitwiseSim or plain columns, by name); other columns are not read (the notes name them),
    blank lines are skipped.

    Azure timestamps become seconds after the earliest request; the other formats' seconds are
    kept as they are. Unsorted arrivals are sorted (stably) and say so in `notes`.
    """
    table = read_table(TRACE, path, text=_trace_text(path))
    arrival, prompt, output = table.schema.names
    notes = []
    if arrival in table.origins:
        notes.append(f"arrival times are seconds after the first request at "
                     f"{table.origins[arrival]}")
    if table.unread:
        notes.append(f"columns not read: {', '.join(table.unread)}")
    return _sorted_workload(Path(path).name, table[arrival], table[prompt].astype(np.int64),
                            table[output].astype(np.int64), notes)


def check_trace_size(path: str | Path) -> None:
    """Refuse a trace file larger than MAX_TRACE_BYTES by its size, before reading it (other
    kinds of file are left to `read_text`, which names what they are)."""
    try:
        info = os.stat(path)
    except OSError:
        return
    if stat.S_ISREG(info.st_mode) and info.st_size > MAX_TRACE_BYTES:
        raise InputError(f"trace is too large ({info.st_size} bytes; at most {MAX_TRACE_BYTES} "
                         f"bytes: {MAX_REQUESTS} requests of up to {TRACE_BYTES_PER_ROW} bytes "
                         "per row); replay a shorter window of the trace", source=str(path))


def _trace_text(path: str | Path) -> str:
    """The trace's text, refused by its size, or by its count of rows before pandas builds
    millions of strings."""
    check_trace_size(path)
    text = read_text(path, max_bytes=MAX_TRACE_BYTES)
    if text.count("\n") > MAX_REQUESTS + 1:
        rows = sum(1 for line in text.splitlines()[1:] if line.strip())
        if rows > MAX_REQUESTS:
            raise InputError(f"{rows} requests; at most {MAX_REQUESTS} can be simulated: "
                             "replay a shorter window of the trace", source=str(path))
    return text


def _sorted_workload(name: str, arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray,
                     notes: list[str]) -> Workload:
    if np.any(np.diff(arrival_s) < 0):
        order = np.argsort(arrival_s, kind="stable")
        arrival_s, prompt, output = arrival_s[order], prompt[order], output[order]
        notes = [*notes, f"arrivals were not sorted; sorted {len(order)} requests by arrival time"]
    return Workload(name, arrival_s.astype(np.float64), prompt, output, tuple(notes))


# ------------------------------------------------------------------------ built-in size tables
@dataclass(frozen=True, eq=False)
class SizeTable:
    """A compact joint distribution of (prompt tokens, output tokens) derived from a trace.

    Why this shape: the simulator's tail latencies depend on the tails of both marginals, and the
    relation between the sizes is not captured by one coefficient: the conversation trace's rank
    correlation is only 0.07, yet its rank cells show strong structure (the shortest prompts get
    mid-length answers, mid-length prompts the longest, long prompts short ones), which a rank
    correlation plus a Gaussian copula would erase. So the table keeps
    - each marginal as a quantile function on a probability grid that is dense in the tail
      (every 1% to P90, every 0.25% to P99, every 0.05% to the maximum), so the median, P90 and
      P99 of the trace are knots and reproduced exactly, and
    - the dependence as the empirical copula: request counts in a grid of rank cells (deciles,
      refined to 90-95-99-100% in the tail), so any relation between the sizes, including one that
      shows only among the largest requests, survives at that resolution.
    Sampling picks a cell by its count, a uniform rank pair inside it, and maps each rank through
    its marginal quantile function (linear between knots, rounded to whole tokens).
    """
    name: str
    source: str
    quantile_probs: np.ndarray
    prompt_quantiles: np.ndarray
    output_quantiles: np.ndarray
    rank_bin_edges: np.ndarray
    rank_cell_counts: np.ndarray   # [prompt rank bin, output rank bin]
    native_rate_rps: float

    def sample(self, rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
        """`count` (prompt, output) pairs, both int64 >= 1.

        The same draws as `rng.choice(cells, count, p=cell weights)` followed by `np.interp`
        through the quantile functions (the same uniforms, the same arithmetic), through
        bucketed look-ups that cost a third as much."""
        bins = len(self.rank_bin_edges) - 1
        cells = self._cell_cdf.count_le(rng.random(count))
        prompt_rank = self._uniform_in_bins(rng, cells // bins)
        output_rank = self._uniform_in_bins(rng, cells % bins)
        return (_to_tokens(self._prompt_quantile(prompt_rank)),
                _to_tokens(self._output_quantile(output_rank)))

    @cached_property
    def _cell_cdf(self) -> KnotIndex:
        """The cells' cumulative weights, computed as Generator.choice computes them."""
        weights = self.rank_cell_counts.ravel() / self.rank_cell_counts.sum()
        cdf = weights.cumsum()
        cdf /= cdf[-1]
        return KnotIndex(cdf)

    @cached_property
    def _prompt_quantile(self) -> PiecewiseLinear:
        return PiecewiseLinear(self.quantile_probs, self.prompt_quantiles)

    @cached_property
    def _output_quantile(self) -> PiecewiseLinear:
        return PiecewiseLinear(self.quantile_probs, self.output_quantiles)

    def _uniform_in_bins(self, rng: np.random.Generator, bins: np.ndarray) -> np.ndarray:
        low, high = self.rank_bin_edges[bins], self.rank_bin_edges[bins + 1]
        return low + (high - low) * rng.random(len(bins))


def _to_tokens(values: np.ndarray) -> np.ndarray:
    return np.maximum(np.rint(values), 1).astype(np.int64)


def builtin_workload_names() -> tuple[str, ...]:
    return tuple(_builtin_tables())


def builtin_size_table(name: str) -> SizeTable:
    tables = _builtin_tables()
    if name not in tables:
        raise InputError(f"unknown built-in workload '{name}'; known: {', '.join(tables)}")
    return tables[name]


@lru_cache(maxsize=1)
def _builtin_tables() -> dict[str, SizeTable]:
    document = json.loads(BUILTIN_TABLES_PATH.read_text())
    return {name: _size_table(name, entry) for name, entry in document["workloads"].items()}


def _size_table(name: str, entry: dict[str, Any]) -> SizeTable:
    source = entry["source"]
    return SizeTable(
        name=name, source=f"{source['dataset']}, {source['file']} ({source['licence']})",
        quantile_probs=np.asarray(entry["quantile_probs"], dtype=np.float64),
        prompt_quantiles=np.asarray(entry["prompt_tokens_quantiles"], dtype=np.float64),
        output_quantiles=np.asarray(entry["output_tokens_quantiles"], dtype=np.float64),
        rank_bin_edges=np.asarray(entry["rank_bin_edges"], dtype=np.float64),
        rank_cell_counts=np.asarray(entry["rank_cell_counts"], dtype=np.int64),
        native_rate_rps=float(entry["native_rate_rps"]))


# ------------------------------------------------------------- lengths given as numbers (--isl)
LENGTH_GRAMMAR = ("N (every request N tokens), uniform:LOW-HIGH (whole numbers, both "
                  "included) or lognormal:MEDIAN,SIGMA (median tokens, sigma of the log)")
MAX_LENGTH_SIGMA = 3.0   # a lognormal wider than this has a P99 over 1000x its median: a typo


@dataclass(frozen=True)
class Lengths:
    """A distribution of token counts: fixed, uniform (integers) or lognormal (rounded, at
    least 1, at most MAX_REQUEST_TOKENS). `text` is its canonical spelling."""
    kind: str          # "fixed", "uniform", "lognormal"
    a: float           # the count; the low end; the median
    b: float = 0.0     # -; the high end; sigma

    @property
    def text(self) -> str:
        if self.kind == "fixed":
            return f"{int(self.a)}"
        if self.kind == "uniform":
            return f"uniform:{int(self.a)}-{int(self.b)}"
        return f"lognormal:{self.a:g},{self.b:g}"

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(count, int(self.a), dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(int(self.a), int(self.b) + 1, size=count).astype(np.int64)
        values = self.a * np.exp(self.b * rng.standard_normal(count))
        return np.clip(np.rint(values), 1, MAX_REQUEST_TOKENS).astype(np.int64)

    def quantile(self, q: float) -> float:
        if self.kind == "fixed":
            return float(self.a)
        if self.kind == "uniform":
            return float(self.a + q * (self.b - self.a))
        from statistics import NormalDist
        q = min(max(q, 1e-9), 1 - 1e-9)
        return float(min(self.a * math.exp(self.b * NormalDist().inv_cdf(q)),
                         MAX_REQUEST_TOKENS))

    def mean(self) -> float:
        if self.kind == "fixed":
            return float(self.a)
        if self.kind == "uniform":
            return (self.a + self.b) / 2.0
        return self.a * math.exp(self.b ** 2 / 2.0)


def parse_lengths(value: Any) -> Lengths:
    """`2000`, `uniform:1000-3000` or `lognormal:2000,0.5` (LENGTH_GRAMMAR); Invalid otherwise."""
    text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) \
        else None
    if not text or "\n" in text:
        raise Invalid(f"must be {LENGTH_GRAMMAR}, got {value!r}"[:200])
    kind, _, args = text.partition(":")
    try:
        if not args and kind.isdigit():
            lengths = Lengths("fixed", _tokens(kind))
        elif kind == "uniform":
            low, high = args.split("-")
            lengths = Lengths("uniform", _tokens(low), _tokens(high))
            if lengths.b < lengths.a:
                raise Invalid(f"uniform:{low}-{high}: LOW must not exceed HIGH")
        elif kind == "lognormal":
            median, sigma = args.split(",")
            sigma_value = float(sigma)
            if not 0 < sigma_value <= MAX_LENGTH_SIGMA:
                raise Invalid(f"lognormal sigma must be > 0 and <= {MAX_LENGTH_SIGMA:g}, "
                              f"got {sigma}")
            lengths = Lengths("lognormal", _tokens(median), sigma_value)
        else:
            raise ValueError
    except Invalid:
        raise
    except ValueError:
        raise Invalid(f"must be {LENGTH_GRAMMAR}, got {value!r}"[:200]) from None
    return lengths


def _tokens(text: str) -> int:
    text = text.strip()
    if not text.isdigit() or not 1 <= int(text) <= MAX_REQUEST_TOKENS:
        raise Invalid(f"token counts must be whole numbers from 1 to {MAX_REQUEST_TOKENS:,}, "
                      f"got {text!r}")
    return int(text)


@dataclass(frozen=True, eq=False)
class SyntheticSizes:
    """Prompt and output lengths drawn independently from two `Lengths` (--isl, --osl)."""
    prompt: Lengths
    output: Lengths

    @property
    def name(self) -> str:
        return f"isl={self.prompt.text},osl={self.output.text}"

    def sample(self, rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
        return self.prompt.sample(rng, count), self.output.sample(rng, count)

    def longest(self) -> int:
        """The most tokens a request may hold (a lognormal's at its 1 - 1e-6 quantile)."""
        return int(math.ceil(self.prompt.quantile(1 - 1e-6))
                   + math.ceil(self.output.quantile(1 - 1e-6)))


@dataclass(frozen=True, eq=False)
class ResampledSizes:
    """A workload's (prompt, output) pairs, resampled with replacement, whatever its arrival
    times (a result file's lengths under a load curve: Poisson arrivals, never its gaps)."""
    workload: Workload

    @property
    def name(self) -> str:
        return self.workload.name

    def sample(self, rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
        picks = rng.integers(0, len(self.workload), size=count)
        return self.workload.prompt_tokens[picks], self.workload.output_tokens[picks]

    def longest(self) -> int:
        return int((self.workload.prompt_tokens + self.workload.output_tokens).max())


# ------------------------------------------------------------------------------------ synthesis
def synthesize(sizes: str | Workload, rate_rps: float, duration_s: float, seed: int,
               arrival: str = "poisson", burstiness_cv: float = 1.0) -> Workload:
    """Arrivals at `rate_rps` over [0, duration_s) with sizes drawn from `sizes`.

    `sizes` is a built-in name (sampled from its table) or a workload (its (prompt, output)
    pairs resampled with replacement). `arrival="poisson"` has exponential gaps (cv 1);
    `arrival="gamma"` has gamma gaps with coefficient of variation `burstiness_cv` (> 1 is
    burstier). The same inputs give identical arrays.
    """
    _check_synthesis_options(rate_rps, duration_s, seed, arrival, burstiness_cv)
    sampler, base_name, size_note = _size_sampler(sizes)
    rng = np.random.default_rng(seed)
    arrival_s = _arrival_times(rng, rate_rps, duration_s, arrival, burstiness_cv)
    if len(arrival_s) == 0:
        raise InputError(f"rate x duration ({rate_rps:g} req/s x {duration_s:g} s) is too small: "
                         f"the arrival process produced no request with seed {seed}")
    prompt, output = sampler(rng, len(arrival_s))
    process = "poisson" if arrival == "poisson" else f"gamma-cv{burstiness_cv:g}"
    name = f"{base_name}@{rate_rps:g}rps/{duration_s:g}s/" + \
        (f"seed{seed}" if arrival == "poisson" else f"{process}/seed{seed}")
    notes = (size_note, f"{process} arrivals at {rate_rps:g} req/s over {duration_s:g} s: "
                        f"{len(arrival_s)} requests (seed {seed})")
    return Workload(name, arrival_s, prompt, output, notes)


def synthesize_curve(sizes: str | Workload, times: Sequence[float], rates: Sequence[float],
                     end_s: float, seed: int) -> Workload:
    """Poisson arrivals following a piecewise-constant rate (`rates[i]` from `times[i]` to the
    next time, the last to `end_s`): a non-homogeneous process, each segment drawn as
    `synthesize` draws a window, with sizes drawn from `sizes`. The same inputs give
    identical arrays."""
    edges = [*times, end_s]
    expected = sum(r * (b - a) for r, a, b in zip(rates, edges, edges[1:]))
    if expected > MAX_SYNTHESIZED_REQUESTS:
        raise InputError(f"the load curve asks for about {expected:,.0f} requests, more than "
                         f"{MAX_SYNTHESIZED_REQUESTS}; simulate part of it or lower its rates")
    sampler, base_name, size_note = _size_sampler(sizes)
    rng = np.random.default_rng(seed)
    pieces = [start + _arrival_times(rng, rate, end - start, "poisson", 1.0)
              for rate, start, end in zip(rates, edges, edges[1:]) if rate > 0 and end > start]
    arrival_s = np.concatenate(pieces) if pieces else np.zeros(0)
    if len(arrival_s) == 0:
        raise InputError(f"the load curve produced no request with seed {seed}")
    prompt, output = sampler(rng, len(arrival_s))
    note = (f"poisson arrivals following a load curve of {len(rates)} steps over "
            f"{end_s:g} s: {len(arrival_s)} requests (seed {seed})")
    return Workload(f"{base_name}@curve/seed{seed}", arrival_s, prompt, output,
                    (size_note, note))


def arrival_count(rate_rps: float, duration_s: float, seed: int, arrival: str = "poisson",
                  burstiness_cv: float = 1.0) -> int:
    """How many requests `synthesize` draws with these arguments: its arrival process alone,
    about 15x cheaper than drawing the sample (no sizes)."""
    _check_synthesis_options(rate_rps, duration_s, seed, arrival, burstiness_cv)
    return len(_arrival_times(np.random.default_rng(seed), rate_rps, duration_s, arrival,
                              burstiness_cv))


def _check_synthesis_options(rate_rps: float, duration_s: float, seed: int, arrival: str,
                             burstiness_cv: float) -> None:
    for label, value in (("rate", rate_rps), ("duration", duration_s), ("burstiness cv",
                                                                        burstiness_cv)):
        try:
            Number(0, low_open=True)(value)
        except Invalid as err:
            raise InputError(f"{label} {err}") from None
    if arrival not in ARRIVAL_KINDS:
        raise InputError(f"unknown arrival process '{arrival}'; known: {', '.join(ARRIVAL_KINDS)}")
    if arrival == "poisson" and burstiness_cv != 1.0:
        raise InputError(f"poisson arrivals have cv 1; use the gamma arrival process for "
                         f"cv {burstiness_cv:g}")
    if (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))
            or not 0 <= seed <= 2**63 - 1):
        raise InputError(f"seed must be a whole number >= 0 and < 2**63, got {seed!r}")
    check_request_count(rate_rps, duration_s)


def check_request_count(rate_rps: float, duration_s: float) -> None:
    """Refuse a window whose expected request count is out of reach, before drawing it."""
    if rate_rps * duration_s > MAX_SYNTHESIZED_REQUESTS:
        raise InputError(f"rate x duration ({rate_rps:g} req/s x {duration_s:g} s) asks for more "
                         f"than {MAX_SYNTHESIZED_REQUESTS} requests; lower the rate or the duration")


def _size_sampler(sizes: str | Workload):
    """(sampler(rng, count) -> (prompt, output), base name, note) for a built-in name or workload."""
    if isinstance(sizes, Workload):
        if len(sizes) == 0:
            raise InputError(f"workload '{sizes.name}' has no requests to sample sizes from")
        sizes = ResampledSizes(sizes)
    if isinstance(sizes, ResampledSizes):
        return sizes.sample, sizes.name, (f"sizes resampled from the {len(sizes.workload)} "
                                          f"requests of {sizes.name}")
    if isinstance(sizes, SyntheticSizes):
        return sizes.sample, sizes.name, (f"prompt lengths {sizes.prompt.text}, output lengths "
                                          f"{sizes.output.text} tokens, drawn independently")
    table = builtin_size_table(sizes)
    return table.sample, table.name, f"sizes sampled from built-in '{table.name}': {table.source}"


def _arrival_times(rng: np.random.Generator, rate_rps: float, duration_s: float, arrival: str,
                   cv: float) -> np.ndarray:
    """Cumulative gaps drawn in chunks (sized for the expected count) until the window is passed."""
    expected = rate_rps * duration_s
    chunk = int(expected + 8 * max(cv, 1.0) * math.sqrt(expected) + 16)
    pieces, start = [], 0.0
    while True:
        if arrival == "poisson":
            gaps = rng.exponential(1.0 / rate_rps, size=chunk)
        else:  # gamma with mean 1/rate and the given cv: shape 1/cv^2, scale cv^2/rate
            gaps = rng.gamma(1.0 / cv**2, cv**2 / rate_rps, size=chunk)
        times = start + np.cumsum(gaps)
        pieces.append(times[times < duration_s])
        if times[-1] >= duration_s:
            return np.concatenate(pieces)
        start = times[-1]


def resample_sizes(trace: Workload, seed: int) -> Workload:
    """The trace's own arrival times with its (prompt, output) pairs redrawn with replacement:
    another day of the same service, keeping the real arrival burstiness."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(trace), size=len(trace))
    note = f"sizes of {trace.name} redrawn with replacement (seed {seed}), arrival times kept"
    return Workload(f"{trace.name}/sizes-seed{seed}", trace.arrival_s,
                    trace.prompt_tokens[picks], trace.output_tokens[picks],
                    (*trace.notes, note))


# ------------------------------------------------------------------------------ trace windows
def cyclic_span(trace: Workload) -> float:
    """The period of a trace repeated end to end: its span from the first to the last arrival
    plus one mean gap (so the step from its last request to the first of the next round is a
    typical one, and its rate, requests / period, is exact over rounds); 1 s for a trace of
    one request or one instant."""
    n = len(trace)
    span = float(trace.arrival_s[-1] - trace.arrival_s[0]) if n else 0.0
    return span * n / (n - 1) if n > 1 and span > 0 else 1.0


def cyclic_window(trace: Workload, seed: int | None, rate_rps: float | None = None,
                  duration_s: float | None = None) -> Workload:
    """Real requests of the trace, blocks and all, in a window of its timeline repeated end to
    end (period `cyclic_span`): another order of the same traffic, for a trace whose requests
    cannot be redrawn one by one (their prefix blocks tie them to each other).

    - `rate_rps` None: the whole period from an offset: the requests from the offset on first,
      the earlier ones after them, one period later; every request once.
    - `rate_rps` R: the timeline is scaled by (the trace's rate / R), so that it runs at R, and
      the sample is its window [offset, offset + duration_s): about R x duration_s requests.
      A request appears at most once: a window longer than the scaled period (R x duration_s >
      the trace's requests) is shortened to that period, and its note says so.

    The offset is uniform in the (scaled) period, drawn from `seed`; seed None is offset 0.
    Arrivals are seconds from the window's start. The same inputs give identical arrays."""
    n = len(trace)
    if n == 0:
        raise InputError("an empty trace has no window")
    if rate_rps is not None:
        _check_synthesis_options(rate_rps, duration_s, 0 if seed is None else seed, "poisson", 1.0)
    period = cyclic_span(trace)
    scale = 1.0 if rate_rps is None else (n / period) / rate_rps
    period *= scale
    offset = 0.0 if seed is None else float(np.random.default_rng(seed).uniform(0.0, period))
    length = period if duration_s is None or rate_rps is None else min(float(duration_s), period)
    at = np.mod((trace.arrival_s - trace.arrival_s[0]) * scale - offset, period)
    at = np.where(at >= period, at - period, at)        # rounding: keep it within the period
    inside = np.flatnonzero(at < length)
    if len(inside) == 0:
        raise InputError(f"rate x duration ({rate_rps:g} req/s x {duration_s:g} s) is too small: "
                         f"the window of {trace.name} from {offset:.3f} s holds no request "
                         f"(seed {seed})")
    picks = inside[np.argsort(at[inside], kind="stable")]
    blocks = offsets = None
    if trace.prefix_offsets is not None:
        starts, ends = trace.prefix_offsets[picks], trace.prefix_offsets[picks + 1]
        offsets = np.zeros(len(picks) + 1, np.int64)
        np.cumsum(ends - starts, out=offsets[1:])
        take = np.repeat(starts - offsets[:-1], ends - starts) + np.arange(offsets[-1])
        blocks = trace.prefix_blocks[take]
    if rate_rps is None:
        name = f"{trace.name}/shift-seed{seed}"
        note = (f"{trace.name} shifted cyclically by {offset:.1f} s of its {period:.1f} s "
                f"(seed {seed}): the same {n} requests, the later ones first")
    else:
        drawn = "from the start" if seed is None else f"seed {seed}"
        name = f"{trace.name}@{rate_rps:g}rps/{duration_s:g}s/" + \
            ("window" if seed is None else f"window-seed{seed}")
        note = (f"{trace.name} scaled to {rate_rps:g} req/s (x{scale:.4g} in time) and repeated "
                f"end to end, window [{offset:.1f}, {offset + length:.1f}) s: {len(picks)} of "
                f"its requests ({drawn})")
        if length < duration_s:
            note += (f"; the window is shortened from {duration_s:g} s to the scaled span "
                     f"({length:.1f} s) so that no request appears twice")
    return Workload(name, at[picks], trace.prompt_tokens[picks], trace.output_tokens[picks],
                    (*trace.notes, note), blocks, offsets, trace.prefix_block_tokens)

