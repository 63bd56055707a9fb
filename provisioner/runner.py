"""Executes batches of points: in-run memo, the disk cache, then the misses in parallel.

`Runner.run(points)` is the "evaluate these points" callable the search algorithm is given. It
always returns results in the order asked, so a search is the same whatever the backend (joblib
local processes, a dask cluster or a ray cluster) or the number of jobs.
"""
from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import signal
import socket
import stat
import sys
import threading
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from hardware_catalog import InputError
from provisioner.evaluate import Evaluator, code_fingerprint
from provisioner.files import warn, write_atomically
from provisioner.options import BACKENDS, LOCAL_BACKENDS
from provisioner.study import Outcome, Point

CACHE_FORMAT = "4"  # bump when the cached record layout or the key's contents change


PROJECT_MARKERS = (".git", "pyproject.toml", "provision.yaml")


def project_root(start: Path | None = None) -> Path:
    """The project a run belongs to: the nearest folder from the current one up that holds a
    repository, a pyproject.toml or a provision.yaml; the current folder when none does."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if any((folder / marker).exists() for marker in PROJECT_MARKERS):
            return folder
    return here


def default_cache_dir(start: Path | None = None) -> Path:
    """The platform's user cache folder (XDG_CACHE_HOME or ~/.cache on Linux, ~/Library/Caches
    on macOS, %LOCALAPPDATA% on Windows), one subfolder per project (its folder's name and a
    digest of its path), so that projects neither share nor clear each other's evaluations."""
    from platformdirs import user_cache_dir
    root = project_root(start)
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:10]
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in root.name) or "root"
    return Path(user_cache_dir("provision", appauthor=False)) / "projects" / f"{name}-{digest}"


def default_jobs() -> int:
    """One worker per core: the search batches several designs' steps at a time."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else (os.cpu_count() or 1))


Sample = tuple[Point, int]   # a point on the workload sample drawn with a seed


def cache_key(evaluator: Evaluator, sample: Sample, study_json: str | None = None,
              records_json: str | None = None) -> str:
    """sha256 of the canonical JSON of everything that changes a sample's outcome. A runner
    passes the study's and the design's parts already encoded (they are the same for every
    sample of a run, and encoding them was most of the key's cost); the blob is the same."""
    point, seed = sample
    study_json = study_json or canonical_json(evaluator.identity())
    records_json = records_json or canonical_json(evaluator.point_identity(point))
    place = canonical_json([point.prompt_machines, point.token_machines, point.rate_rps])
    # the keys in sorted order, as json.dumps(..., sort_keys=True) of the whole record writes
    blob = (f'{{"format":{canonical_json(CACHE_FORMAT)},"point":{place},'
            f'"records":{records_json},"seed":{canonical_json(seed)},"study":{study_json}}}')
    return hashlib.sha256(blob.encode()).hexdigest()


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


@dataclass
class DiskCache:
    """One small JSON file per outcome under <dir>/<key[:2]>/<key>.json, written atomically.

    An entry names what it answers: the key it was written under (the hash of the whole
    question: study, design records, point and seed), the code that computed it
    (`code_fingerprint`) and, readably, the design, point and seed. One read under another
    key (two entries swapped, copied or linked) is ignored, re-simulated and overwritten, like
    a damaged one. Only regular files inside the folder are read: a symbolic link (file or
    subfolder), a FIFO or a device is never opened as an entry."""
    directory: Path

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    damaged: int = 0          # entries ignored (re-simulated and overwritten) in this run
    read: bool = True         # False: entries are written, never read (a run that distrusts them)
    writable: bool = True     # False after a write failed: the run goes on uncached
    _made: set = field(default_factory=set, repr=False)   # subdirectories known to exist
    _warned: set = field(default_factory=set, repr=False)  # the kinds of entry warned about

    def __post_init__(self):
        run = _CACHE_RUN.get()   # inside a search: its nested searches share the warnings
        if run is not None:
            self._warned = run.setdefault(str(self.directory), self._warned)

    def get(self, key: str) -> Outcome | None:
        """The cached outcome, or None when absent, damaged, not a regular file inside the
        folder, or recorded for another key (then it is re-simulated and overwritten; the first
        entry of each kind ignored in a run is named in one warning)."""
        if not self.read:
            return None
        path = self._path(key)
        inside = self._subfolder(key[:2])
        if inside is None:
            return None
        if not inside:
            return self._damaged(path, "its folder is a symbolic link or not a folder; the "
                                 "cache reads only regular files inside its folder", "outside")
        try:
            text = _read_regular_file(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as err:
            if err.errno == errno.ELOOP:   # O_NOFOLLOW: the entry is a symbolic link
                return self._damaged(path, "a symbolic link; the cache reads only regular "
                                     "files inside its folder", "outside")
            return self._damaged(path, "unreadable")
        except ValueError:   # not UTF-8, or far too large
            return self._damaged(path, "unreadable")
        if text is None:
            return self._damaged(path, "not a regular file")
        try:
            data = json.loads(text, parse_constant=_reject_constant)
            recorded = entry_key(data)
        except (ValueError, KeyError, TypeError, IndexError, RecursionError) as err:
            return self._damaged(path, str(err) or type(err).__name__)
        if recorded != key or data["code"] != code_version():
            return self._damaged(path, f"it answers another question (key {recorded[:12]}..., "
                                 f"code {str(data['code'])[:12]})", "another question")
        try:
            return outcome_from_json(data["outcome"])
        except (ValueError, KeyError, TypeError, IndexError, RecursionError) as err:
            return self._damaged(path, str(err) or type(err).__name__)

    def _subfolder(self, name: str) -> bool | None:
        """Is <dir>/<name> a real folder of this cache (True), absent (None), or a symbolic
        link or something else (False)? Checked once per run when present."""
        if name in self._made:
            return True
        try:
            mode = os.lstat(self.directory / name).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError:
            return False
        if stat.S_ISDIR(mode):
            self._made.add(name)
            return True
        return False

    def _damaged(self, path: Path, why: str, kind: str = "damaged") -> None:
        self.damaged += 1
        if kind not in self._warned:
            self._warned.add(kind)
            what = {"another question": "an evaluation cache entry recorded for another "
                                        "question",
                    "outside": "an evaluation cache entry that is not a regular file inside "
                               "the cache folder"}.get(kind, "a damaged evaluation cache entry")
            warn(f"ignoring {what} ({' '.join(why.split())[:120]}): {path}; it is "
                 "re-simulated and overwritten")
        return None

    def put(self, key: str, outcome: Outcome, question: dict | None = None) -> None:
        """Write the outcome under `key`, recording the key, the code version and `question`
        (what the key hashes, readably: design, point and seed)."""
        if not self.writable:
            return
        path = self._path(key)
        try:
            inside = self._subfolder(key[:2])
            if inside is None:   # one mkdir per directory and run
                path.parent.mkdir(parents=True, exist_ok=True)
                self._made.add(path.parent.name)
            elif not inside:     # never written through a link into another folder
                return
            record = {"format": CACHE_FORMAT, "key": key, "code": code_version(),
                      "question": question,
                      "outcome": {name: getattr(outcome, name)
                                  for name in Outcome.__dataclass_fields__}}
            write_atomically(path, json.dumps(record))
        except (OSError, ValueError) as err:
            self.writable = False
            why = getattr(err, "strerror", None) or str(err)
            warn(f"cannot write the evaluation cache {self.directory} ({why}); running "
                 "uncached (choose another with --cache-dir, or --no-cache)")


_CACHE_RUN: ContextVar[dict | None] = ContextVar("provision_cache_run", default=None)


@contextmanager
def cache_run():
    """One search with the searches it runs inside it (a load curve's windows, a sensitivity's
    variants, the trials of --survive-failures auto): each kind of ignored cache entry is
    warned about once in all of them, not once per nested search."""
    if _CACHE_RUN.get() is not None:
        yield
        return
    token = _CACHE_RUN.set({})
    try:
        yield
    finally:
        _CACHE_RUN.reset(token)


def code_version() -> str:
    """The version of the code that turns a point into an outcome (package versions and a hash
    of the simulator's sources and data): recorded in every cache entry."""
    return code_fingerprint()


def entry_key(data: Any) -> str:
    """The key a cache entry records, its layout checked (ValueError/TypeError if not one)."""
    if not isinstance(data, dict) or set(data) != {"format", "key", "code", "question",
                                                   "outcome"}:
        raise ValueError("not a cache entry of this version")
    if data["format"] != CACHE_FORMAT:
        raise ValueError(f"cache format {data['format']!r}, not {CACHE_FORMAT}")
    if not isinstance(data["key"], str) or not isinstance(data["code"], str):
        raise TypeError("key or code is not a string")
    return data["key"]


MAX_ENTRY_BYTES = 1 << 20   # an outcome record is ~1 kB; anything far larger is not one


def _read_regular_file(path: Path) -> str | None:
    """The text of `path`, or None when it is not a regular file (a FIFO would block open() and
    read() forever, a device never ends): opened without blocking and without following a
    symbolic link (OSError ELOOP), checked with fstat before any read, and read up to
    MAX_ENTRY_BYTES."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) |
                 getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = handle.read(MAX_ENTRY_BYTES + 1)
    if len(data) > MAX_ENTRY_BYTES:
        raise ValueError("larger than an outcome record")
    return data.decode("utf-8")


def _reject_constant(name: str):
    if name == "NaN":
        raise ValueError("NaN is not a result")
    return float(name)  # Infinity: an unlimited SLO's limit


def outcome_from_json(data: Any) -> Outcome:
    """An Outcome from a cache entry, every field checked against the record's schema (a NaN,
    a wrong type or a missing key raises ValueError/KeyError/TypeError)."""
    def number(value, *, optional=False, infinite=False):
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                math.isnan(value) or (math.isinf(value) and not infinite):
            raise ValueError(f"not a finite number: {value!r}")
        return value

    if not isinstance(data, dict) or set(data) != {f for f in Outcome.__dataclass_fields__}:
        raise ValueError("not an outcome record")
    for key in ("meets_slos", "completed"):
        if not isinstance(data[key], bool):
            raise TypeError(f"{key} is not true/false")
    if not isinstance(data["reason"], str):
        raise TypeError("reason is not a string")
    if not isinstance(data["slo"], list):
        raise TypeError("slo is not a list")
    slo = []
    for item in data["slo"]:
        key, value, limit = item
        if not isinstance(key, str):
            raise TypeError("slo key is not a string")
        slo.append((key, number(value, optional=True),
                    number(limit, optional=True, infinite=True)))
    requests = data["requests"]
    if isinstance(requests, bool) or not isinstance(requests, int) or requests < 0:
        raise TypeError("requests is not a whole number >= 0")
    return Outcome(data["meets_slos"], data["completed"], data["reason"], tuple(slo),
                   number(data["worst_margin"], optional=True), requests)


def _question(sample: Sample) -> dict:
    """What a cache entry answers, readably (its key hashes this with the study's identity)."""
    point, seed = sample
    return {"design": point.design.name, "prompt_machines": point.prompt_machines,
            "token_machines": point.token_machines, "rate_rps": point.rate_rps, "seed": seed}


def _outcome_of(evaluator: Evaluator, sample: Sample) -> Outcome:
    return evaluator.outcome(*sample)


def _in_worker(function: Callable, evaluator: Evaluator, sample: Sample, parent: int | None):
    """`function(evaluator, sample)` in a worker process of this machine: Ctrl-C is the
    parent's to handle (the worker ignores SIGINT, so no worker prints a traceback), and the
    worker exits when the parent is gone (killed with -9, say) instead of idling for minutes."""
    if parent is not None and os.getpid() != parent:
        _adopt_worker(parent)
    return function(evaluator, sample)


_WATCHED_PARENT: list[int] = []


def _adopt_worker(parent: int) -> None:
    if _WATCHED_PARENT:
        return
    _WATCHED_PARENT.append(parent)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    direct_child = os.getppid() == parent

    def parent_gone() -> bool:
        if direct_child:  # re-parented the moment the parent exits, even before it is reaped
            return os.getppid() != parent
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        return False

    def watch() -> None:
        while not parent_gone():
            threading.Event().wait(1.0)
        os._exit(1)
    threading.Thread(target=watch, name="provision-parent-watch", daemon=True).start()


def shutdown_workers() -> None:
    """Stop the local worker processes loky keeps for reuse (they idle for minutes). loky's
    own shutdown kills them from a helper thread that may not run before this process exits,
    and the workers ignore SIGINT, so each one is also killed here and waited for."""
    if "joblib" not in sys.modules:
        return
    try:
        from joblib.externals.loky import reusable_executor
        executor = reusable_executor._executor  # the pool, if one was started (never a new one)
        if executor is None:
            return
        workers = list(getattr(executor, "_processes", {}).values())
        executor.shutdown(wait=False, kill_workers=True)
        for worker in workers:
            if worker.is_alive():
                worker.kill()
        for worker in workers:
            worker.join(timeout=2.0)
    except Exception:  # pragma: no cover - best effort at exit
        pass


_QUIET_TRACKER: list[bool] = []


def _start_quiet_resource_tracker() -> None:
    """Start loky's resource tracker (the process that unlinks the workers' semaphores) with
    its shutdown warnings off. After Ctrl-C it may find a semaphore already unlinked and warn
    about it on our stderr after "provision: interrupted"; what it cleans is gone either way,
    so the warning tells a user nothing. The setting reaches only the tracker's environment."""
    from joblib.externals.loky.backend import resource_tracker
    if _QUIET_TRACKER:   # once per process: not on every submission
        return
    _QUIET_TRACKER.append(True)
    previous = os.environ.get("PYTHONWARNINGS")
    quiet = "ignore:resource_tracker:UserWarning"
    os.environ["PYTHONWARNINGS"] = f"{previous},{quiet}" if previous else quiet
    try:
        resource_tracker.ensure_running()
    finally:
        if previous is None:
            del os.environ["PYTHONWARNINGS"]
        else:
            os.environ["PYTHONWARNINGS"] = previous


def check_backend(backend: str, address: str | None, timeout: float = 3.0) -> None:
    """Before any simulation: the backend is known and installed, and a cluster address is
    reachable (a TCP connect within `timeout` seconds), naming the address when not."""
    if backend not in BACKENDS:
        raise InputError(f"unknown backend '{backend}'; use {', '.join(BACKENDS)}",
                         field="backend")
    if address and backend in LOCAL_BACKENDS:
        raise InputError(f"--address needs --backend dask or ray (got --address {address} with "
                         f"{backend}); add --backend dask", field="address")
    module = {"dask": "distributed", "ray": "ray"}.get(backend)
    if module is not None:
        import importlib.util
        if importlib.util.find_spec(module) is None:
            hint = "'dask[distributed]'" if backend == "dask" else "'ray[default]'"
            raise InputError(f"backend '{backend}' is not installed: pip install {hint}",
                             field="backend")
    if address and not (backend == "ray" and address in ("auto", "local")):
        host, port = parse_address(address, 8786 if backend == "dask" else 6379)
        try:
            with socket.create_connection((host, port), timeout=timeout):
                pass
        except OSError as err:
            why = "timed out" if isinstance(err, socket.timeout) else (err.strerror or str(err))
            raise InputError(f"cannot reach the {backend} scheduler at {host}:{port} ({why} "
                             f"within {timeout:g} s); start it, or check the address",
                             field="address") from None


def check_execution(execution: Any) -> None:
    """Every execution option checked before the first simulation: the backend and its cluster
    address (reachable within seconds), and the cache directory (unwritable: a warning, and the
    run goes on uncached)."""
    check_backend(execution.backend, execution.address)


def parse_address(address: str, default_port: int) -> tuple[str, int]:
    """(host, port) of `tcp://host:port`, `ray://host:port`, `host:port` or `host`."""
    rest = address.split("://", 1)[1] if "://" in address else address
    rest = rest.rstrip("/")
    if rest.startswith("["):  # [ipv6]:port
        host, _, tail = rest[1:].partition("]")
        port_text = tail[1:] if tail.startswith(":") else ""
    else:
        host, _, port_text = rest.rpartition(":") if ":" in rest else (rest, "", "")
    if not host or (port_text and not port_text.isdigit()):
        raise InputError(f"--address must be [SCHEME://]HOST[:PORT], got {address!r}",
                         field="address")
    port = int(port_text) if port_text else default_port
    if not 1 <= port <= 65535:
        raise InputError(f"--address port must be 1-65535, got {port}", field="address")
    return host, port


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
    backend: str = "threads"
    address: str | None = None
    cache: DiskCache | None = None
    stats: RunStats = field(default_factory=RunStats)
    _memo: dict = field(default_factory=dict, repr=False)
    _cached: set = field(default_factory=set, repr=False)   # samples read from the disk cache
    _study_json: str | None = field(default=None, repr=False)      # cache keys' constant parts
    _records_json: dict = field(default_factory=dict, repr=False)  # design -> its records
    _cluster: Any = field(default=None, repr=False)
    _threads: Any = field(default=None, repr=False)   # backend threads: the pool, once needed
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _closed: bool = field(default=False, repr=False)
    # At most two samples per worker are submitted at a time (one running, one queued next):
    # the rest wait here rather than in loky's queue, which its shutdown on Ctrl-C does not
    # empty cleanly (a KeyError in its manager thread) when concurrent searches queued many,
    # or in the thread pool's, which Ctrl-C would otherwise have to wait for.
    _slots: threading.Semaphore = field(init=False, repr=False)

    def __post_init__(self):
        check_backend(self.backend, self.address)
        self._slots = threading.Semaphore(2 * self.jobs)

    @property
    def concurrent(self) -> bool:
        """May several searches call `outcomes` at once? Yes on local threads or processes:
        each call waits only for its own futures (the memo, cache and counts are locked)."""
        return self.backend in LOCAL_BACKENDS and self.jobs > 1

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, kind, *exc) -> None:
        self.close()
        if kind is not None and issubclass(kind, (KeyboardInterrupt, SystemExit)):
            shutdown_workers()  # interrupted: stop the loky workers now, not in minutes

    def close(self) -> None:
        with self._lock:   # no search thread submits work to the workers after this
            self._closed = True
        if self._threads is not None:   # queued samples are dropped, running ones finish
            self._threads.shutdown(wait=False, cancel_futures=True)
            self._threads = None
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None

    def outcomes(self, samples: Sequence[Sample]) -> list[Outcome]:
        """The outcome of every (point, seed), in the order asked."""
        found: dict[Sample, Outcome] = {}
        keys: dict[Sample, str] = {}
        missing: list[Sample] = []
        with self._lock:
            for sample in dict.fromkeys(samples):  # asked twice in a batch: simulated once
                known = self._known(sample, keys)
                if known is None:
                    missing.append(sample)
                else:
                    found[sample] = known
        evaluated = self._evaluate(missing)
        with self._lock:
            for sample, outcome in zip(missing, evaluated):
                self.stats.simulated += 1
                found[sample] = outcome
                if self.cache is not None:
                    self.cache.put(keys[sample], outcome, _question(sample))
            self._memo.update(found)
        return [found[s] for s in samples]

    def _known(self, sample: Sample, keys: dict[Sample, str]) -> Outcome | None:
        """The outcome from this run's memo or the disk cache, counted; None if unknown."""
        if sample in self._memo:
            self.stats.memo_hits += 1
            return self._memo[sample]
        if self.cache is None:
            return None
        keys[sample] = self._cache_key(sample)
        cached = self.cache.get(keys[sample])
        if cached is not None:
            self.stats.cache_hits += 1
            self._cached.add(sample)
        return cached

    def from_cache(self, sample: Sample) -> bool:
        """Did this run take the sample's outcome from the disk cache?"""
        return sample in self._cached

    def simulate_again(self, samples: Sequence[Sample]) -> list[Outcome]:
        """The samples simulated now, whatever the memo or the cache hold; the fresh outcomes
        replace both."""
        fresh = self._evaluate(list(samples))
        with self._lock:
            for sample, outcome in zip(samples, fresh):
                self.stats.simulated += 1
                self._memo[sample] = outcome
                self._cached.discard(sample)
                if self.cache is not None:
                    self.cache.put(self._cache_key(sample), outcome, _question(sample))
        return fresh

    def _cache_key(self, sample: Sample) -> str:
        """`cache_key`, the study's and each design's identity encoded once per run."""
        if self._study_json is None:
            self._study_json = canonical_json(self.evaluator.identity())
        design = sample[0].design
        if design not in self._records_json:
            self._records_json[design] = canonical_json(self.evaluator.point_identity(sample[0]))
        return cache_key(self.evaluator, sample, self._study_json, self._records_json[design])

    def _evaluate(self, samples: list[Sample]) -> list[Outcome]:
        return self.map(_outcome_of, samples)

    def map(self, function: Callable[[Evaluator, Sample], Any], samples: Sequence[Sample]) -> list:
        """`function(evaluator, sample)` of every sample, in order, where the simulations run
        (here with one job, else the workers); uncached. `function` must be importable."""
        if not samples:
            return []
        if self.backend in LOCAL_BACKENDS and self.jobs == 1:
            return [function(self.evaluator, s) for s in samples]
        if self.backend in LOCAL_BACKENDS:
            return self._map_locally(function, samples)
        from joblib import Parallel, delayed, parallel_config  # only parallel runs need joblib
        self._connect()
        parent = None if self.address else os.getpid()
        tasks = (delayed(_in_worker)(function, self.evaluator, s, parent) for s in samples)
        with parallel_config(backend=self.backend):
            return Parallel(n_jobs=-1 if self.backend == "ray" else self.jobs)(tasks)

    def _map_locally(self, function: Callable, samples: Sequence[Sample]) -> list:
        """On this machine: threads of this process (the compiled core releases the GIL, so
        they simulate in parallel, with no worker to start and nothing to pickle) or loky's
        worker processes (kept for the whole run), submitted directly: a search asks for a few
        points at a time, and a joblib.Parallel call costs about 11 ms of set-up per batch
        where a submission costs about 0.2 ms."""
        futures = []
        for sample in samples:
            self._slots.acquire()
            with self._lock:
                if self._closed:   # interrupted: the other searches stop here
                    self._slots.release()
                    raise RuntimeError("the runner is closed")
                if self.backend == "threads":
                    future = self._thread_pool().submit(function, self.evaluator, sample)
                else:
                    from joblib.externals.loky import get_reusable_executor
                    _start_quiet_resource_tracker()
                    future = get_reusable_executor(max_workers=self.jobs).submit(
                        _in_worker, function, self.evaluator, sample, os.getpid())
            future.add_done_callback(lambda _: self._slots.release())
            futures.append(future)
        return [future.result() for future in futures]

    def _thread_pool(self):
        if self._threads is None:
            from concurrent.futures import ThreadPoolExecutor
            self._threads = ThreadPoolExecutor(self.jobs, thread_name_prefix="provision-sim")
        return self._threads

    def _connect(self) -> None:
        """Start or join the distributed cluster once per runner."""
        if self._cluster is not None or self.backend in LOCAL_BACKENDS:
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
        return Client(address, timeout=10)
    import logging
    # the worker processes start with SIGINT ignored (it is inherited): Ctrl-C is the parent's
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) \
        if threading.current_thread() is threading.main_thread() else None
    try:
        cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True,
                               silence_logs=logging.CRITICAL, dashboard_address=None)
        client = Client(cluster)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)

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
