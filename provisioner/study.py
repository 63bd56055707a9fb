"""Records of a study: the question, resolved to records once, and the answers.

The question (`Study`) holds records, never names: the catalog, the design records (with their
machine records), the model, the SLO profile, the workload and performance-model sources. The
answers are plain picklable records: `Point` (one cluster at one load), `Outcome` (what its
simulation said), `Metrics` (outcome plus prices) and `DesignResult` (one design's search).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from hardware_catalog import Catalog, Design, InputError, MachineSku, ModelSpec
from provisioner.files import file_sha256
from provisioner.options import Constraints, SearchSettings
from simcore import SimOptions
from simcore.perfmodel import default_performance_model, load_performance_model
from slo_profiles import METRICS, PERCENTILES, SloProfile

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

    def identity(self) -> dict:
        return {"name": self.name, "kind": self.kind, "sha256": self.sha256}

    def at(self, rate_rps: float | None, duration_s: float, seed: int):
        """The requests: a built-in distribution under Poisson arrivals at `rate_rps`, or the
        trace replayed as it is (rate None) or with its sizes under new arrivals."""
        from simcore.workload import synthesize
        if self.kind == "builtin":
            return synthesize(self.name, rate_rps, duration_s, seed)
        trace = _trace(self.path, self.sha256)
        return trace if rate_rps is None else synthesize(trace, rate_rps, duration_s, seed)


@lru_cache(maxsize=4)
def _trace(path: str, sha256: str):
    from simcore.workload import load_trace
    return load_trace(path)


def workload_source(name: str, base_dir: Path | None = None) -> WorkloadSource:
    """A built-in name wins over a file of the same name in the working directory."""
    from simcore.workload import BUILTIN_TABLES_PATH, builtin_workload_names
    if name in builtin_workload_names():
        return WorkloadSource(name, "builtin", file_sha256(BUILTIN_TABLES_PATH))
    path = Path(name)
    if not path.exists() and base_dir is not None and (base_dir / name).exists():
        path = base_dir / name
    if not path.is_file():
        raise InputError(f"workload '{name}' is neither a built-in workload "
                         f"({', '.join(builtin_workload_names())}) nor an existing file",
                         field="workload")
    return WorkloadSource(name, "trace", file_sha256(path), str(path))


@dataclass(frozen=True)
class PerfSource:
    """The default performance model, or a user's file identified by its content."""
    path: str | None = None     # the file to read
    sha256: str | None = None
    name: str = "default"       # as the user wrote it

    def identity(self) -> dict:
        from simcore.perfmodel import perf_model_version
        return {"name": self.name, "sha256": self.sha256, "version": perf_model_version()}

    def load(self, catalog: Catalog):
        """Built once per process (workers included); the hash makes an edited file new."""
        if self.path is None:
            return default_performance_model()
        # keyed by the names a table is checked against (a Catalog holds dicts: not hashable)
        key = (self.path, self.sha256, tuple(catalog.machines), tuple(catalog.models))
        if key not in _LOADED_MODELS:
            _LOADED_MODELS[key] = load_performance_model(self.path, catalog)
        return _LOADED_MODELS[key]


_LOADED_MODELS: dict = {}  # one load per file and catalog per process (workers included)


def perf_source(path: str | None, base_dir: Path | None = None) -> PerfSource:
    if path is None:
        return PerfSource()
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
    """One evaluated point: its outcome and its prices."""
    point: Point
    outcome: Outcome
    cost_per_hour: float
    power_kw: float
    gpus: int

    @classmethod
    def of(cls, point: Point, outcome: Outcome) -> "Metrics":
        d, p, t = point.design, point.prompt_machines, point.token_machines
        return cls(point, outcome, d.cost_per_hour(p, t), d.power_kw(p, t), d.gpus(p, t))

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

    @property
    def feasible(self) -> bool:
        """An optimum exists: some configuration meets the SLOs within the constraints."""
        return self.optimum is not None
