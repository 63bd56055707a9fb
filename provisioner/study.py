"""Records of a study: the question, resolved to records once, and the answers.

The question (`Study`) holds records, never names: the catalog, the design records (with their
machine records), the model, the SLO profile, the workload and performance-model sources. The
answers are plain picklable records: `Point` (one cluster at one load), `Outcome` (what its
simulation said), `Metrics` (outcome plus prices) and `DesignResult` (one design's search).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from hardware_catalog import Catalog, Design, InputError, MachineSku, ModelSpec, check_path
from provisioner.files import file_sha256
from provisioner.options import Constraints, SearchSettings
from simcore import SimOptions
from simcore.perfmodel import (default_performance_model, load_performance_model,
                               perf_model_version)
from simcore.workload import (BUILTIN_TABLES_PATH, arrival_count, builtin_workload_names,
                              check_trace_size, load_trace, resample_sizes, synthesize)
from slo_profiles import METRICS, PERCENTILES, SloProfile

SCREEN_SEEDS = 1   # samples the search checks every point on; candidates are verified on all
SLO_KEYS = tuple(f"{m}_{p}" for m in METRICS for p in PERCENTILES)  # the nine, in report order
BUDGET_UNITS = {"power": "kW", "cost": "$/h"}


# ------------------------------------------------------------------------------ the question
@dataclass(frozen=True)
class Budget:
    """A power (kW) or cost ($/h) budget, optionally stated as the draw of N machines of a SKU."""
    kind: str
    value: float
    like: str | None = None   # e.g. "dgx-h100:40"

    def of(self, cost_per_hour: float, power_kw: float) -> float:
        return power_kw if self.kind == "power" else cost_per_hour

    def as_dict(self) -> dict:
        return {"kind": self.kind, "value": self.value, "unit": BUDGET_UNITS[self.kind],
                "like": self.like}


@dataclass(frozen=True)
class Goal:
    name: str                       # min-cost, min-power or max-rate
    rate_rps: float | None = None   # min-cost / min-power (None: replay a trace as it is)
    budget: Budget | None = None    # max-rate

    def __post_init__(self):
        if self.name == "max-rate" and self.budget is None:
            raise InputError("--goal max-rate needs a budget: --power-budget-kw, "
                             "--cost-budget-per-hour or --budget-like SKU:N", field="goal")
        if self.name != "max-rate" and self.budget is not None:
            raise InputError(f"a budget applies to --goal max-rate, not {self.name}; limit "
                             "min-cost/min-power with --max-machines/--max-gpus", field="goal")

    @property
    def paper_name(self) -> str:
        if self.name == "max-rate":
            return f"iso-{self.budget.kind} throughput-optimized"
        return f"iso-throughput {self.name.split('-')[1]}-optimized"

    def as_dict(self) -> dict:
        return {"name": self.name, "paper_name": self.paper_name, "rate_rps": self.rate_rps,
                "budget": self.budget.as_dict() if self.budget else None}


@dataclass(frozen=True)
class WorkloadSource:
    """A built-in size distribution by name, or a CSV trace (identified by its content)."""
    name: str                 # as the user wrote it
    kind: str                 # "builtin" or "trace"
    sha256: str               # of the built-in tables file or of the trace file
    path: str | None = None   # the file to read (trace only)
    burstiness_cv: float = 1.0  # synthesized arrivals: Poisson (1) or gamma with this CV

    def identity(self) -> dict:
        identity = {"name": self.name, "kind": self.kind, "sha256": self.sha256}
        if self.burstiness_cv != 1.0:
            identity["burstiness_cv"] = self.burstiness_cv
        return identity

    def requests_at(self, rate_rps: float | None, duration_s: float, seed: int) -> int:
        """How many requests `at` gives, without drawing their sizes."""
        if rate_rps is None:
            return len(_trace(self.path, self.sha256))
        return arrival_count(rate_rps, duration_s, seed, **self._arrival())

    def _arrival(self) -> dict:
        return {} if self.burstiness_cv == 1.0 else {"arrival": "gamma",
                                                     "burstiness_cv": self.burstiness_cv}

    def at(self, rate_rps: float | None, duration_s: float, seed: int, base_seed: int | None = None):
        """One sample of the workload: a built-in distribution under Poisson arrivals at
        `rate_rps`, or the trace with its sizes under new arrivals. A trace replayed as it is
        (rate None) is itself for the base seed; any other seed keeps its arrival times and
        redraws its (prompt, output) pairs, so the burstiness of the real trace is kept while
        the sizes vary as they would on another day."""
        arrival = self._arrival()
        if self.kind == "builtin":
            return synthesize(self.name, rate_rps, duration_s, seed, **arrival)
        trace = _trace(self.path, self.sha256)
        if rate_rps is not None:
            return synthesize(trace, rate_rps, duration_s, seed, **arrival)
        return trace if seed == (base_seed if base_seed is not None else seed) else \
            resample_sizes(trace, seed)


@lru_cache(maxsize=4)
def _trace(path: str, sha256: str):
    return load_trace(path)


def workload_source(name: str, base_dir: Path | None = None) -> WorkloadSource:
    """A built-in name wins over a file of the same name in the working directory."""
    if name in builtin_workload_names():
        return WorkloadSource(name, "builtin", file_sha256(BUILTIN_TABLES_PATH))
    check_path(name, "workload")
    path = Path(name)
    if not path.exists() and base_dir is not None and (base_dir / name).exists():
        path = base_dir / name
    if not path.is_file():
        raise InputError(f"workload '{name}' is neither a built-in workload "
                         f"({', '.join(builtin_workload_names())}) nor an existing file",
                         field="workload")
    check_trace_size(path)   # before hashing it
    return WorkloadSource(name, "trace", file_sha256(path), str(path))


@dataclass(frozen=True)
class PerfSource:
    """The default performance model, or a user's file identified by its content."""
    path: str | None = None     # the file to read
    sha256: str | None = None
    name: str = "default"       # as the user wrote it
    latency_factor: float = 1.0   # every latency scaled (sensitivity to a model error)

    def identity(self) -> dict:
        identity = {"name": self.name, "sha256": self.sha256, "version": perf_model_version()}
        if self.latency_factor != 1.0:
            identity["latency_factor"] = self.latency_factor
        return identity

    def load(self, catalog: Catalog):
        """Built once per process (workers included); the hash makes an edited file new."""
        model = self._load(catalog)
        return model if self.latency_factor == 1.0 else _Scaled(model, self.latency_factor)

    def _load(self, catalog: Catalog):
        if self.path is None:
            return default_performance_model()
        # keyed by the names a table is checked against (a Catalog holds dicts: not hashable)
        key = (self.path, self.sha256, tuple(catalog.machines), tuple(catalog.models))
        if key not in _LOADED_MODELS:
            _LOADED_MODELS[key] = load_performance_model(self.path, catalog)
        return _LOADED_MODELS[key]


_LOADED_MODELS: dict = {}  # one load per file and catalog per process (workers included)


@dataclass(frozen=True)
class _Scaled:
    """A performance model whose every latency is `factor` times the model's."""
    model: object
    factor: float

    def curves(self, model, machine):
        return self.model.curves(model, machine).scaled(self.factor, self.factor)

    def is_calibrated(self, model, machine) -> bool:
        return self.model.is_calibrated(model, machine)


def perf_source(path: str | None, base_dir: Path | None = None) -> PerfSource:
    if path is None:
        return PerfSource()
    check_path(path, "perf_model")
    resolved = Path(path)
    if not resolved.exists() and base_dir is not None and (base_dir / path).exists():
        resolved = base_dir / path
    if not resolved.is_file():
        raise InputError(f"performance model file not found: {path}", field="perf_model")
    return PerfSource(str(resolved), file_sha256(resolved), name=path)


@dataclass(frozen=True)
class Study:
    """Everything a search simulates and optimises, as records."""
    catalog: Catalog
    model: ModelSpec
    workload: WorkloadSource
    duration_s: float
    seed: int
    slo: SloProfile
    perf: PerfSource
    reference: MachineSku          # slowdowns are against this machine, uncontended
    designs: tuple[Design, ...]
    goal: Goal
    constraints: Constraints
    settings: SearchSettings
    sim_options: SimOptions = SimOptions()
    chunk_tokens: int | str | None = None   # --chunk-tokens as given ("auto": searched)
    assumptions: str = "provision"   # the preset the catalog and options were resolved under
    survive_failures: int = 0        # N+k: every point must also pass with k machines failed

    @property
    def seeds(self) -> tuple[int, ...]:
        """The verification samples: --seed, --seed + 1, ... (`provision simulate --seed S`
        reproduces each)."""
        return tuple(self.seed + k for k in range(self.settings.verify_seeds))

    @property
    def screen_seeds(self) -> tuple[int, ...]:
        """The samples every searched point is checked on (the rest verify candidates only)."""
        return self.seeds[:SCREEN_SEEDS]


# ------------------------------------------------------------------------------- the answers
@dataclass(frozen=True, order=True)
class Point:
    """One cluster at one load: P prompt + T token machines (baselines: P machines, T = 0).

    rate_rps None replays a trace as it is (no resampling).
    """
    design: Design   # the record itself; points are only ordered within one design
    prompt_machines: int
    token_machines: int
    rate_rps: float | None


@dataclass(frozen=True)
class Verify:
    """A request to check a candidate on every verification sample, not just the screening
    ones (an item of a batch, like a Point). With `samples`, a quick check instead: only that
    many samples, the hardest first (a failure is a failure; a pass is not a verification)."""
    point: Point
    samples: int | None = None


@dataclass(frozen=True)
class Outcome:
    """What a simulation says about a point (the cacheable part of `Metrics`)."""
    meets_slos: bool               # every request finished and every SLO held
    completed: bool                # every request finished
    reason: str
    slo: tuple[tuple[str, float | None, float | None], ...]  # (key, value, limit) for the nine
    worst_margin: float | None     # min over the limited SLOs of 1 - value/limit
    requests: int


@dataclass(frozen=True)
class Metrics:
    """One evaluated point: its outcome over the samples evaluated, and its prices."""
    point: Point
    outcome: Outcome
    cost_per_hour: float
    power_kw: float
    gpus: int
    samples: tuple[tuple[int, Outcome], ...] = ()   # (seed, outcome) of each sample evaluated

    @classmethod
    def of(cls, point: Point, outcome: Outcome,
           samples: tuple[tuple[int, Outcome], ...] = ()) -> "Metrics":
        d, p, t = point.design, point.prompt_machines, point.token_machines
        return cls(point, outcome, d.cost_per_hour(p, t), d.power_kw(p, t), d.gpus(p, t),
                   samples)

    @property
    def meets_slos(self) -> bool:
        return self.outcome.meets_slos

    @property
    def prompt_machines(self) -> int:
        return self.point.prompt_machines

    @property
    def token_machines(self) -> int:
        return self.point.token_machines

    @property
    def rate_rps(self) -> float | None:
        return self.point.rate_rps


@dataclass
class DesignResult:
    design: Design
    goal: Goal
    optimum: Metrics | None
    reason: str                                  # why nothing is feasible (optimum None)
    points: list[Metrics]                        # every point this search evaluated
    frontier: list[tuple[int, int]] = field(default_factory=list)  # corners or budget candidates
    non_monotone: list[dict] = field(default_factory=list)
    box: tuple[int, int] | None = None          # largest (P, T) the search considered
    headroom_rps: float | None = None           # highest rate the optimum sustains (verified)
    chunk_search: list[dict] = field(default_factory=list)  # --chunk-tokens auto: every budget
    verification: dict | None = None            # per-sample SLO values, intervals, binding SLO
    uncalibrated: list[str] = field(default_factory=list)  # SKUs with datasheet-scaled latencies
    rejected: list[dict] = field(default_factory=list)  # candidates that failed a verification seed
    resilience: dict | None = None   # --survive-failures: the plain and failure-aware optima

    @property
    def feasible(self) -> bool:
        """An optimum exists: some configuration meets the SLOs within the constraints."""
        return self.optimum is not None


PASS_RATE_Z = 2.0   # one-sided normal quantile (97.7%): margin over the 95% fresh-sample target


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
