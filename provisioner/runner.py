"""Executes batches of points: in-run memo, the disk cache, then the misses in parallel.

`Runner.run(points)` is the "evaluate these points" callable the search algorithm is given. It
always returns results in the order asked, so a search is the same whatever the backend (joblib
local processes, a dask cluster or a ray cluster) or the number of jobs.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from hardware_catalog import InputError
from provisioner.evaluate import Evaluator
from provisioner.files import write_atomically
from provisioner.options import BACKENDS
from provisioner.study import Metrics, Outcome, Point

CACHE_FORMAT = "2"  # bump when the cached record layout or the key's contents change


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "provision"


def default_jobs() -> int:
    """One worker per core: the search batches several designs' steps at a time."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else (os.cpu_count() or 1))


def cache_key(evaluator: Evaluator, point: Point) -> str:
    identity = {"format": CACHE_FORMAT, "study": evaluator.identity(),
                "point": [point.prompt_machines, point.token_machines, point.rate_rps],
                "records": evaluator.point_identity(point)}
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
            return Outcome(data["meets_slos"], data["completed"], data["reason"],
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
    _cluster: Any = field(default=None, repr=False)

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise InputError(f"unknown backend '{self.backend}'; use {', '.join(BACKENDS)}",
                             field="backend")
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

    def run(self, points: Sequence[Point]) -> list[Metrics]:
        outcomes: dict[Point, Outcome] = {}
        keys: dict[Point, str] = {}
        missing: list[Point] = []
        for point in dict.fromkeys(points):  # a point asked twice in a batch is simulated once
            found = self._known(point, keys)
            if found is None:
                missing.append(point)
            else:
                outcomes[point] = found
        for point, outcome in zip(missing, self._evaluate(missing)):
            self.stats.simulated += 1
            outcomes[point] = outcome
            if self.cache is not None:
                self.cache.put(keys[point], outcome)
        self._memo.update(outcomes)
        return [Metrics.of(p, outcomes[p]) for p in points]

    def _known(self, point: Point, keys: dict[Point, str]) -> Outcome | None:
        """The outcome from this run's memo or the disk cache, counted; None if unknown."""
        if point in self._memo:
            self.stats.memo_hits += 1
            return self._memo[point]
        if self.cache is None:
            return None
        keys[point] = cache_key(self.evaluator, point)
        cached = self.cache.get(keys[point])
        if cached is not None:
            self.stats.cache_hits += 1
        return cached

    def _evaluate(self, points: list[Point]) -> list[Outcome]:
        if not points:
            return []
        if self.backend == "loky" and (self.jobs == 1 or len(points) == 1):
            return [_outcome_of(self.evaluator, p) for p in points]
        from joblib import Parallel, delayed, parallel_config  # only parallel runs need joblib
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
