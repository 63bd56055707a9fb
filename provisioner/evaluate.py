"""The one interface between the search engine and the simulator, plus caching and parallelism.

`SimulationEvaluator.evaluate(point)` builds the workload at the point's rate, runs `simulate`
and `evaluate_slos`, and returns a plain, picklable `Metrics` record. `Runner` evaluates batches
of points: in-run memo, then the on-disk cache, then the misses in parallel (joblib: local
processes, a dask cluster or a ray cluster), always returning results in the order asked, so a
search is the same whatever the backend or the number of jobs.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, Sequence

from hardware_catalog import Catalog, Design, InputError, MachineSku
from slo_profiles import METRICS, PERCENTILES, SloProfile

SLO_KEYS = tuple(f"{m}_{p}" for m in METRICS for p in PERCENTILES)  # the nine, in report order
CACHE_FORMAT = "1"  # bump when the cached record layout changes
BACKENDS = ("loky", "dask", "ray")


@dataclass(frozen=True, order=True)
class Point:
    """One cluster at one load: P prompt + T token machines (baselines: P machines, T = 0).

    rate_rps None replays a trace as it is (no resampling).
    """
    design: str
    prompt_machines: int
    token_machines: int
    rate_rps: float | None


@dataclass(frozen=True)
class Outcome:
    """What a simulation says about a point: the cacheable part of `Metrics`."""
    feasible: bool                 # every request finished and every SLO held
    completed: bool                # every request finished
    reason: str
    slo: tuple[tuple[str, float | None, float | None], ...]  # (key, value, limit) for the nine
    worst_margin: float | None     # min over the limited SLOs of 1 - value/limit
    requests: int


@dataclass(frozen=True)
class Metrics:
    """A plain record of one evaluated point: SLO values and limits, verdict and prices."""
    point: Point
    outcome: Outcome
    cost_per_hour: float
    power_kw: float
    gpus: int

    @property
    def feasible(self) -> bool:
        return self.outcome.feasible

    @property
    def prompt_machines(self) -> int:
        return self.point.prompt_machines

    @property
    def token_machines(self) -> int:
        return self.point.token_machines

    @property
    def rate_rps(self) -> float | None:
        return self.point.rate_rps


@dataclass(frozen=True)
class Pools:
    """Per-machine prices of a design's pools (token None for a baseline)."""
    design: Design
    prompt: MachineSku
    token: MachineSku | None

    @classmethod
    def of(cls, design: Design, catalog: Catalog) -> "Pools":
        token = catalog.machine(design.token_sku) if design.token_sku else None
        return cls(design, catalog.machine(design.prompt_sku), token)

    def _sum(self, attr: str, prompt: int, token: int) -> float:
        total = prompt * getattr(self.prompt, attr)
        return total + (token * getattr(self.token, attr) if self.token else 0)

    def cost(self, prompt: int, token: int) -> float:
        return self._sum("cost_per_hour", prompt, token)

    def power(self, prompt: int, token: int) -> float:
        return self._sum("power_kw", prompt, token)

    def gpus(self, prompt: int, token: int) -> int:
        return int(self._sum("gpus", prompt, token))

    def metrics(self, point: Point, outcome: Outcome) -> Metrics:
        p, t = point.prompt_machines, point.token_machines
        return Metrics(point, outcome, self.cost(p, t), self.power(p, t), self.gpus(p, t))


class Evaluator(Protocol):
    """Anything the runner can evaluate: a simulator binding or a test oracle."""
    catalog: Catalog

    def outcome(self, point: Point) -> Outcome: ...

    def identity(self) -> dict: ...


# ------------------------------------------------------------------------- the simulator side
@dataclass(frozen=True)
class WorkloadSource:
    """A built-in size distribution by name, or a CSV trace (identified by its content)."""
    name: str                 # as the user wrote it
    kind: str                 # "builtin" or "trace"
    sha256: str               # of the built-in tables file or of the trace file
    path: str | None = None   # the file to read (trace only)

    def identity(self) -> dict:
        return {"name": self.name, "kind": self.kind, "sha256": self.sha256}


def workload_source(name: str, base_dir: Path | None = None) -> WorkloadSource:
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
        from simcore.perfmodel import PERF_MODEL_VERSION
        return {"name": self.name, "sha256": self.sha256, "version": PERF_MODEL_VERSION}


def perf_source(path: str | None, base_dir: Path | None = None) -> PerfSource:
    if path is None:
        return PerfSource()
    resolved = Path(path)
    if not resolved.exists() and base_dir is not None and (base_dir / path).exists():
        resolved = base_dir / path
    if not resolved.is_file():
        raise InputError(f"performance model file not found: {path}", field="perf_model")
    return PerfSource(str(resolved), file_sha256(resolved), name=path)


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@lru_cache(maxsize=8)
def _performance_model(path: str | None, sha256: str | None):
    """Built once per process (workers included); the hash makes an edited file a new entry."""
    from provisioner.inputs import resolve_perf_model
    return resolve_perf_model(path)


@lru_cache(maxsize=4)
def _trace(path: str, sha256: str):
    from simcore.workload import load_trace
    return load_trace(path)


@dataclass(frozen=True)
class SimulationEvaluator:
    """Binds the simulator to one study: catalog, model, workload, window, seed, SLOs and
    performance model."""
    catalog: Catalog
    model: str
    workload: WorkloadSource
    duration_s: float
    seed: int
    slo: SloProfile
    perf: PerfSource = PerfSource()
    options: Any = None  # simcore.SimOptions; None means the simulator's defaults

    def workload_at(self, rate_rps: float | None):
        from simcore.workload import synthesize
        if self.workload.kind == "builtin":
            return synthesize(self.workload.name, rate_rps, self.duration_s, self.seed)
        trace = _trace(self.workload.path, self.workload.sha256)
        if rate_rps is None:
            return trace
        return synthesize(trace, rate_rps, self.duration_s, self.seed)

    def outcome(self, point: Point) -> Outcome:
        from simcore import Cluster, SimOptions, evaluate_slos, simulate
        design = self.catalog.design(point.design)
        cluster = Cluster(design, point.prompt_machines, point.token_machines)
        requests = self.workload_at(point.rate_rps)
        perf = _performance_model(self.perf.path, self.perf.sha256)
        result = simulate(cluster, requests, self.catalog.model(self.model), perf, self.catalog,
                          self.options or SimOptions())
        return outcome_from_slo_report(evaluate_slos(result, _all_nine(self.slo)), self.slo,
                                       len(requests))

    def identity(self) -> dict:
        from simcore import SIMULATOR_VERSION, SimOptions
        return {"model": self.catalog.model(self.model).as_dict(),
                "workload": self.workload.identity(), "duration_s": self.duration_s,
                "seed": self.seed, "slo": self.slo.as_dict(), "perf_model": self.perf.identity(),
                "simulator": SIMULATOR_VERSION,
                "sim_options": asdict(self.options or SimOptions())}

    def point_identity(self, point: Point) -> dict:
        """The catalog records the point simulates on. Cost is left out on purpose: it does not
        change a simulation, and prices are recomputed from the current catalog on every read."""
        design = self.catalog.design(point.design)
        skus = [design.prompt_sku] + ([design.token_sku] if design.token_sku else [])
        machines = {}
        for sku in skus:
            record = self.catalog.machine(sku).as_dict()
            record.pop("cost_per_hour")
            machines[sku] = record
        return {"design": design.as_dict(), "machines": machines}


def _all_nine(profile: SloProfile) -> SloProfile:
    """The profile with unlimited (inf) entries added, so every report carries all nine values;
    an inf limit always passes and has margin 1, so verdicts and worst margins are unchanged."""
    limits = {(m, p): profile.limits.get((m, p), math.inf) for m in METRICS for p in PERCENTILES}
    return replace(profile, limits=limits)


def outcome_from_slo_report(report, profile: SloProfile, requests: int) -> Outcome:
    if not report.feasible:
        slo = tuple((key, None, _limit(profile, key)) for key in SLO_KEYS)
        return Outcome(False, False, report.reason or "simulation did not complete", slo, None,
                       requests)
    values = {f"{c.metric}_{c.percentile}": c.value for c in report.checks}
    slo = tuple((key, values.get(key), _limit(profile, key)) for key in SLO_KEYS)
    margins = [1.0 - v / lim for _, v, lim in slo if lim is not None and v is not None]
    return Outcome(report.passed, True, report.reason, slo, min(margins) if margins else None,
                   requests)


def _limit(profile: SloProfile, key: str) -> float | None:
    metric, pct = key.split("_")
    return profile.limits.get((metric, pct))


# ------------------------------------------------------------------------------------- cache
def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "provision"


def cache_key(evaluator: Evaluator, point: Point) -> str:
    identity = {"format": CACHE_FORMAT, "study": evaluator.identity(),
                "point": asdict(point)}
    point_identity = getattr(evaluator, "point_identity", None)
    if point_identity is not None:
        identity["records"] = point_identity(point)
    blob = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class DiskCache:
    """One small JSON file per outcome under <dir>/<key[:2]>/<key>.json, written atomically."""
    directory: Path

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> Outcome | None:
        try:
            data = json.loads(self._path(key).read_text())
            return Outcome(data["feasible"], data["completed"], data["reason"],
                           tuple((k, v, lim) for k, v, lim in data["slo"]),
                           data["worst_margin"], data["requests"])
        except (OSError, ValueError, KeyError, TypeError):
            return None  # a missing or damaged entry is simply re-simulated

    def put(self, key: str, outcome: Outcome) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, json.dumps(asdict(outcome)))
        except OSError as err:
            raise InputError(f"cannot write the evaluation cache: {err.strerror}",
                             source=str(self.directory), field="cache_dir") from None


_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read the process umask (the only portable way is to set and restore it)


def stage_file(path: Path, text: str) -> Path:
    """Write `text` to a temp file in `path`'s directory (same file system, so os.replace onto
    `path` is atomic) and return the temp file's path."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the usual file mode
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def write_atomically(path: Path, text: str) -> None:
    """Temp file in the same directory + os.replace: readers see the old file or the new one."""
    tmp = stage_file(path, text)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# -------------------------------------------------------------------------------- execution
def _outcome_of(evaluator: Evaluator, point: Point) -> Outcome:
    return evaluator.outcome(point)


@dataclass
class RunStats:
    simulated: int = 0
    cache_hits: int = 0
    memo_hits: int = 0

    @property
    def requested(self) -> int:
        return self.simulated + self.cache_hits + self.memo_hits


@dataclass
class Runner:
    """Evaluates batches of points: memo, disk cache, then the misses in parallel, in order."""
    evaluator: Evaluator
    jobs: int = 1
    backend: str = "loky"
    address: str | None = None
    cache: DiskCache | None = None
    stats: RunStats = field(default_factory=RunStats)
    _memo: dict = field(default_factory=dict, repr=False)
    _pools: dict = field(default_factory=dict, repr=False)
    _cluster: Any = field(default=None, repr=False)

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise InputError(f"unknown backend '{self.backend}'; use {', '.join(BACKENDS)}",
                             field="backend")
        if self.jobs < 1:
            raise InputError(f"--jobs must be >= 1, got {self.jobs}", field="jobs")
        if self.address and self.backend == "loky":
            raise InputError("--address needs --backend dask or ray", field="address")

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None

    def pools(self, design: str) -> Pools:
        if design not in self._pools:
            self._pools[design] = Pools.of(self.evaluator.catalog.design(design),
                                           self.evaluator.catalog)
        return self._pools[design]

    def run(self, points: Sequence[Point]) -> list[Metrics]:
        outcomes: dict[Point, Outcome] = {}
        keys: dict[Point, str] = {}
        missing: list[Point] = []
        for point in dict.fromkeys(points):  # a point asked twice in a batch is simulated once
            if point in self._memo:
                self.stats.memo_hits += 1
                outcomes[point] = self._memo[point]
                continue
            cached = None
            if self.cache is not None:
                keys[point] = cache_key(self.evaluator, point)
                cached = self.cache.get(keys[point])
            if cached is not None:
                self.stats.cache_hits += 1
                outcomes[point] = cached
            else:
                missing.append(point)
        for point, outcome in zip(missing, self._evaluate(missing)):
            self.stats.simulated += 1
            outcomes[point] = outcome
            if self.cache is not None:
                self.cache.put(keys[point], outcome)
        self._memo.update(outcomes)
        return [self.pools(p.design).metrics(p, outcomes[p]) for p in points]

    def _evaluate(self, points: list[Point]) -> list[Outcome]:
        if not points:
            return []
        if self.backend == "loky" and (self.jobs == 1 or len(points) == 1):
            return [_outcome_of(self.evaluator, p) for p in points]
        from joblib import Parallel, delayed, parallel_config
        self._connect()
        tasks = (delayed(_outcome_of)(self.evaluator, p) for p in points)
        if self.backend == "loky":
            return Parallel(n_jobs=min(self.jobs, len(points)), backend="loky")(tasks)
        with parallel_config(backend=self.backend):
            return Parallel(n_jobs=-1 if self.backend == "ray" else self.jobs)(tasks)

    def _connect(self) -> None:
        """Start or join the distributed cluster once per runner."""
        if self._cluster is not None or self.backend == "loky":
            return
        if self.backend == "dask":
            self._cluster = _dask_client(self.address, self.jobs)
        else:
            self._cluster = _ray_session(self.address)


def _dask_client(address: str | None, jobs: int):
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise InputError("backend 'dask' needs dask.distributed: pip install 'provision[dask]' "
                         "(or pip install 'dask[distributed]')", field="backend") from None
    if address:
        return Client(address)
    cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True,
                           dashboard_address=None)
    client = Client(cluster)

    class _Session:  # closing the client alone would leave the local cluster running
        def close(self):
            client.close()
            cluster.close()
    return _Session()


def _ray_session(address: str | None):
    try:
        import ray
        from ray.util.joblib import register_ray
    except ImportError:
        raise InputError("backend 'ray' needs ray: pip install 'ray[default]'",
                         field="backend") from None
    ray.init(address=address or None, ignore_reinit_error=True, log_to_driver=False)
    register_ray()

    class _Session:
        def close(self):
            ray.shutdown()
    return _Session()
