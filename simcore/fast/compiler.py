"""Which build of the fast core runs, and how numba compiles and caches it.

`CORE`: "aot", the entry points compiled at install by `simcore.aot` into `simcore/_core*.so`,
used only if built from these very sources (no numba import, no compiling in a fresh process);
otherwise "jit", numba compiling on first call and caching on disk, keyed by the digest of every
source the core compiles (`CORE_SOURCES`: this package and cluster.py), so that an edit to any
of them is seen; with PROVISION_NO_JIT=1, or without numba, "python": the same code as plain
Python (slow, but identical). PROVISION_NO_AOT=1 skips the install-time build.

The decorators every part of the core uses: `_compiled` (a function of its own) and `_inlined`
(inlined into its callers). Compiles no reference step.
"""
from __future__ import annotations

import hashlib
import importlib
import os
from pathlib import Path


# The functions Python calls (simcore.fast.setup holds them); everything else is compiled into
# them.
ENTRY_POINTS = ("_fill_requests", "_fill_pools", "_run", "_result_columns")
# Every file the core compiles code from: the modules of this package (tests/test_aot.py checks
# that none is missing), and cluster.py (`itl_bin`, the role and ITL constants).
PACKAGE_SOURCES = ("__init__.py", "compiler.py", "records.py", "latency.py", "structures.py",
                   "pools.py", "routing.py", "decode_runs.py", "chunks.py", "failures.py",
                   "resizes.py", "steps.py", "loop.py", "setup.py", "prefix.py")
CORE_SOURCES = tuple(f"fast/{name}" for name in PACKAGE_SOURCES) + ("cluster.py",)


def source_paths() -> list[Path]:
    here = Path(__file__).resolve().parent
    cluster = importlib.import_module("simcore.cluster")
    return [here / name for name in PACKAGE_SOURCES] + [Path(cluster.__file__).resolve()]


def source_digest() -> int:
    """60 bits of the SHA-256 of the core's sources: the install-time build records it, and is
    used only while the sources still match; the JIT cache is kept in a folder named after it."""
    digest = hashlib.sha256()
    for path in source_paths():
        digest.update(path.read_bytes())
    return int(digest.hexdigest()[:15], 16)


def _ahead_of_time_build():
    if os.environ.get("PROVISION_NO_JIT") or os.environ.get("PROVISION_NO_AOT"):
        return None
    try:
        from simcore import _core
    except ImportError:  # not built here (no compiler at install, or a checkout)
        _core = _installed_build()
        if _core is None:  # numba compiles
            return None
    return _core if _core.source_digest() == source_digest() else None


def installed_builds() -> list[Path]:
    """The install-time builds of the core in the other `simcore` folders on sys.path (an
    installed package's, seen from a checkout)."""
    import sys
    here = Path(__file__).resolve().parents[1]  # this simcore
    found = []
    for entry in sys.path:
        folder = Path(entry or ".").resolve() / "simcore"
        if folder != here and folder.is_dir():
            found += sorted(p for p in folder.glob("_core.*") if p.is_file())
    return found


def _installed_build():
    """Python started inside a checkout imports the checkout's sources (the current folder
    comes first on sys.path), which hold no build: the installed package's build serves them
    too while it was built from the same sources (the digest check above), so running in the
    checkout never compiles the core again. None when provision is not installed, or was
    installed without a build. (Found on sys.path, not through the package's metadata: a
    build from the checkout leaves an egg-info there that lists no build.)"""
    import importlib.util
    for path in installed_builds():
        spec = importlib.util.spec_from_file_location("simcore._core", path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except ImportError:  # built for another interpreter
            continue
        if module.source_digest() == source_digest():
            return module
    return None


def _key_the_cache_by_every_source() -> None:
    """numba's on-disk cache (cache=True) checks only the file a function is written in: a
    compiled caller keeps the machine code of what it compiled in from another file (`itl_bin`
    and the constants of cluster.py), so after an edit there it would load stale code. The
    core's functions are cached instead in a folder named after the digest of all its sources
    (`core-` + 15 hex digits, inside the folder numba would have used: NUMBA_CACHE_DIR, else
    __pycache__ next to the source, else the user-wide cache), with that digest in their
    source stamp too: an edit to any of them starts an empty cache. Other code is cached by
    numba as usual. (A folder per digest also keeps two versions of the sources, switched
    between, from overwriting each other's cache.)"""
    from numba.core import caching
    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl
    folder = f"core-{source_digest():015x}"
    files = {os.path.normcase(str(path)) for path in source_paths()}

    class CoreSourcesLocator(caching._CacheLocator):
        provision_core = True

        def __init__(self, inner):
            self._inner = inner
            self._path = os.path.join(inner.get_cache_path(), folder)

        def get_cache_path(self):
            return self._path

        def get_source_stamp(self):
            return folder, self._inner.get_source_stamp()

        def get_disambiguator(self):
            return self._inner.get_disambiguator()

        @classmethod
        def from_function(cls, py_func, py_file):
            if os.path.normcase(os.path.realpath(py_file)) not in files:
                return None
            for other in impl._locator_classes:
                if getattr(other, "provision_core", False):
                    continue
                inner = other.from_function(py_func, py_file)
                if inner is None:
                    continue
                locator = cls(inner)
                try:
                    locator.ensure_cache_path()
                except OSError:  # not writable: numba's next choice
                    continue
                return locator
            return None

    # one locator of ours, first (the module is reloaded by simcore.aot)
    impl._locator_classes[:] = [CoreSourcesLocator] + [
        c for c in impl._locator_classes if not getattr(c, "provision_core", False)]


AOT = _ahead_of_time_build()
try:
    if AOT is not None or os.environ.get("PROVISION_NO_JIT"):
        raise ImportError
    from numba import njit
    _key_the_cache_by_every_source()
    CORE = "jit"
except ImportError:  # the install-time build, or plain Python (PROVISION_NO_JIT=1)
    CORE = "aot" if AOT is not None else "python"

    def njit(*args, **kwargs):
        if args and callable(args[0]):
            return args[0]
        return lambda f: f


def _import_numba_arrays_without_blas_probe() -> None:
    """numba's array library checks for scipy's BLAS when it is first imported, which the first
    call of the cached core does: that imports scipy.linalg, 0.2-0.3 s of every process start
    (each CLI run, each worker), for BLAS the core never calls. The check is answered 'absent'
    for that import only (numba then computes the few inner products it would hand to BLAS with
    its own loop); np.dot and numpy.linalg in other numba code find BLAS as usual."""
    import sys
    try:
        from numba.np import linalg
    except ImportError:  # pragma: no cover - another numba layout: nothing to skip
        return
    probe = getattr(linalg, "ensure_blas", None)
    if probe is None or "numba.np.arraymath" in sys.modules:
        return

    def absent():
        raise ImportError("BLAS is not needed by the provision core")
    linalg.ensure_blas = absent
    try:
        import numba.np.arraymath  # noqa: F401  (runs the check once, now)
    finally:
        linalg.ensure_blas = probe


if CORE == "jit":
    _import_numba_arrays_without_blas_probe()

# The core allocates nothing, so it runs without numba's runtime (_nrt=False): with the runtime,
# every call reference-counts each array argument, which cost 1.5-3x. Steps are inlined into the
# event loop. It touches no Python object, so it releases the GIL (nogil; the install-time build
# too, see simcore.aot): simulations on several threads run in parallel.
_compiled = njit(cache=True, _nrt=False, nogil=True)
_inlined = njit(cache=True, _nrt=False, inline="always")
