"""Fast simulator core: the reference semantics (see `simcore.refsim`) compiled with numba.

The state is one record per request and one per machine (numpy record arrays of `REQUEST` and
`MACHINE`), so a helper takes a machine and reads `machine.pending`, as the reference simulator
does. Queues are intrusive linked lists threaded through the request records, so every queue
operation is O(1). A machine's running decodes are not walked per iteration: the machine counts
its ended iterations (`decode_clock`), and each running decode knows the count at which it
produces its last token (`finish_tick`) and sits in the machine's pairing heap keyed (finish
tick, request) (intrusive: `heap_child`, `heap_sibling`), so an iteration's end costs
O(finished x log batch) instead of O(batch); a decode's generated tokens are materialized when
it finishes or is lost. (Only the decodes that regenerate tokens already sent, after a failure
when restarts regenerate, are walked per run, for their inter-token gaps: `_count_silent`.)
A machine's decode-only iterations up to its next finish are one event
(a run, cut where a prompt or KV cache arrives for it, and ended by the next failure step), so a
machine with a small batch costs one event per finish or arrival, not per token. Likewise a
colocated chunked machine's full-budget pieces of one prompt are one event (a chunk run): the
ends in between are applied from the busy heap without an instant of their own, before any
route reads the routing keys they change.

Which build runs (`CORE`): "aot", the entry points compiled at install by `simcore.aot` into
`simcore/_core*.so`, used only if built from these very sources (no numba import, no compiling
in a fresh process); otherwise "jit", numba compiling on first call and caching on disk (keyed
by the digest of every source it compiles, so an edit to cluster.py is seen too); with
PROVISION_NO_JIT=1, or without numba, "python": the same code as plain Python (slow, but
identical). PROVISION_NO_AOT=1 skips the install-time build.

Each event time runs the reference simulator's steps in its order: (1) iterations that end, by
machine index; (2) KV caches that arrive, by (time, request), then (2r) pool resizes and
(2a-c) failures; (3) requests that arrive, routed at once; (4) idle machines with work start
their next iteration, by machine index.

Requests are numbered in arrival order and request g lives in slot g % slots of the record
array: one slot per request in a plain run; in a long run (`run_streamed`) fewer, each reused
once its request has finished and been handed over, the loop pausing before the first arrival
not yet filled in. Every order between requests (the KV-arrival and lost-request heaps) is by
number, never by slot, so a streamed run is the same run.

No step scans all machines, so a run costs O(events x log machines): iteration ends come from a
heap keyed (time, machine), which yields the machines ending now by index; step (4) visits only
the machines that something touched at this instant (an ended iteration, an arrived KV cache, a
routed prompt), sorted by index, since any other idle machine was idle with nothing startable
before and nothing it depends on has changed; routing reads the winner of tournament trees
keyed (pending tokens, index), (committed tokens, index) or (load, index), one per pool, so the
tie rule is the reference's: the lowest index.

Chunked prefill (see `simcore.refsim`): a request record carries the tokens of its prefill
already computed and the piece of the iteration in flight; a partially prefilled prompt stays at
the head of its queue, so "the ongoing prompt first" is the queue order. A whole prompt is a
piece of its full length, so both policies end an iteration the same way.
"""
from __future__ import annotations

import hashlib
import os
from collections import namedtuple
from pathlib import Path

import numpy as np

from simcore.cluster import ITL_BINS, ROLE_BOTH, ROLE_PROMPT, MachineArrays, Stalled, itl_bin
from simcore.workload import Workload

# The functions Python calls; everything else is compiled into them.
ENTRY_POINTS = ("_fill_requests", "_fill_pools", "_run")
CORE_SOURCES = ("fastsim.py", "cluster.py")  # cluster.py: the role constants compiled in


def source_digest() -> int:
    """60 bits of the SHA-256 of the core's sources: the install-time build records it, and is
    used only while the sources still match."""
    digest = hashlib.sha256()
    for name in CORE_SOURCES:
        digest.update((Path(__file__).parent / name).read_bytes())
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
    here = Path(__file__).resolve().parent
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
    files = {os.path.normcase(str(Path(__file__).parent.resolve() / name))
             for name in CORE_SOURCES}

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


_AOT = _ahead_of_time_build()
try:
    if _AOT is not None or os.environ.get("PROVISION_NO_JIT"):
        raise ImportError
    from numba import njit
    _key_the_cache_by_every_source()
    CORE = "jit"
except ImportError:  # the install-time build, or plain Python (PROVISION_NO_JIT=1)
    CORE = "aot" if _AOT is not None else "python"

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
_itl_bin = _inlined(itl_bin)

NONE = -1
INF = np.inf

# Counts and indices are int32 (tokens of one request, request and machine indices and numbers,
# epochs: all far below 2**31, checked on entry) and times float64: 152 bytes a request instead
# of 232, so the records of an 840k-request run take 128 MB instead of 195 and more of them
# stay in cache. Arithmetic on them is int64 in numba, so nothing overflows in between.
REQUEST = np.dtype([
    # the fields a finishing decode touches (the first cache line)
    ("prompt", np.int32), ("output", np.int32), ("generated", np.int32),
    ("emitted", np.int32),          # tokens already sent (regenerated ones are not sent again):
    #                                 the most it generated, made current as generated is
    ("reservation", np.int32),      # KV tokens held while it decodes: prompt + output
    ("finish_tick", np.int32),      # running: its machine's decode_clock at its last token
    ("heap_child", np.int32), ("heap_sibling", np.int32),  # the running decodes' pairing heap
    ("prompt_machine", np.int32), ("token_machine", np.int32),
    ("queue_next", np.int32),       # prompt queue, later (remote decode) the decode wait
    ("batch_next", np.int32),       # prompts of the iteration in flight; running: silent decodes
    # chunked prefill
    ("prefilled", np.int32),        # tokens of its prefill computed by ended iterations
    ("piece", np.int32),            # tokens of its prefill in the iteration in flight
    # failures (see simcore.refsim)
    ("prefill", np.int32),          # tokens its next prefill computes
    ("kv_from", np.int32),          # machine holding its KV until delivered (NONE: a replica)
    ("from_epoch", np.int32), ("token_epoch", np.int32), ("recover_kind", np.int32),
    ("recoveries", np.int32), ("recomputed", np.int32),
    ("number", np.int32),           # its arrival order (its index in the run; see run_streamed)
    ("arrival", np.float64), ("first_token", np.float64), ("finish", np.float64),
    ("kv_transfer", np.float64),
    ("last_token", np.float64),     # its latest output token (made current as generated is)
    ("lost_at", np.float64), ("ready_at", np.float64), ("recovery_s", np.float64),
], align=True)
INT32_LIMIT = 2**31 - 1

# The fields routing and every iteration read come first (two cache lines); indices and counts
# of requests are int32 as in REQUEST; token sums that can grow with the run stay int64.
MACHINE = np.dtype([
    ("pending", np.int64),          # prompt tokens routed here, not yet done (routing key)
    ("committed", np.int64),        # reservations of unfinished requests decoding here (key)
    ("memory", np.int64),           # KV tokens reserved by admitted requests
    ("capacity", np.int64),         # KV tokens it can hold
    ("running_context", np.int64),  # context tokens of the running decodes
    ("decode_clock", np.int64),     # iterations ended; every running decode is in each
    ("run_ticks", np.int64),        # iterations in flight (a run of decode-only ones; see (4))
    ("chunk_left", np.int64),       # a chunk run's iteration ends not yet applied (see (4))
    ("role", np.int32), ("kind", np.int32),  # kind: index into curves
    ("capacity_class", np.int32),   # index of its capacity among the cluster's distinct ones
    ("epoch", np.int32),            # failures so far (a request's machine choice is per epoch)
    # list heads and tails
    ("prompt_head", np.int32), ("prompt_tail", np.int32), ("prompt_len", np.int32),
    ("wait_head", np.int32), ("wait_tail", np.int32),  # decodes waiting for memory
    ("running_root", np.int32),     # running decodes: root of their pairing heap
    ("running_count", np.int32),    # running decodes (the decode batch)
    ("batch_head", np.int32),       # prompts of the iteration in flight
    ("fresh_head", np.int32), ("fresh_count", np.int32),  # decodes joined since the last start
    ("silent_head", np.int32),      # running decodes with tokens to regenerate (`_count_silent`)
    ("busy", np.bool_),             # an iteration is in flight
    ("in_mixed", np.bool_),         # lent to the mixed pool
    ("touched", np.bool_),          # on the list of machines step (4) visits at this instant
    ("down", np.bool_),             # failed, not yet repaired
    ("retired", np.bool_),          # out of its pool (a plan's resize): takes no new request
    ("load_stale", np.bool_),       # its leaf in the load tree awaits the next read
    ("busy_until", np.float64), ("mixed_since", np.float64),
    ("run_start", np.float64), ("run_busy_s", np.float64),  # a run's start, busy_s before it
    ("chunk_base", np.float64),     # its iterations' time without context and chunk extra
    ("chunk_piece_s", np.float64),  # the prompt time of its piece alone
    ("chunk_prev_s", np.float64),   # the prompt time of the tokens prefilled before the next
    ("link", np.float64), ("visible", np.float64),  # KV link bytes/s, layer-wise visible s
    ("detect_at", np.float64), ("up_since", np.float64),  # failures
    ("last_end", np.float64),       # when its latest iteration ended
    # statistics
    ("busy_s", np.float64), ("iterations", np.int64), ("batch_size_sum", np.int64),
    ("max_memory", np.int64), ("mixed_s", np.float64),
    # chunked designs: prompt pieces run (a whole prompt is one) and their cost priced alone
    ("prompt_chunks", np.int64), ("chunked_prefill_s", np.float64),
], align=True)

Curves = namedtuple("Curves", [  # knots padded into 2-D arrays (one row per SKU), with lengths
    "prompt_x", "prompt_y", "prompt_n", "decode_x", "decode_y", "decode_n", "context_s",
    "chunk_attention", "chunk_kv_read", "mixed_factor",  # mixed_factor: x the prompt curve
    "prompt_index", "decode_index",  # per SKU, where each of KNOT_BUCKETS buckets starts
    "prompt_scale", "decode_scale"])  # per SKU, KNOT_BUCKETS / the knots' range

# Knots are near-uniform grids (every 16 prompt tokens; every batch size, then every 8), so a
# query's bucket of the range gives its knot within a few steps instead of a binary search.
# 2048 buckets: one per 16 prompt tokens of a 32k-token curve, so the step after the bucket is
# rarely taken (512 cost 2-5% more per run; 4096 gained nothing more); 16 KB a curve.
KNOT_BUCKETS = 2048

Settings = namedtuple("Settings", [
    "kv_bytes", "layers", "mixed_pool", "prompt_token_limit", "queue_threshold",
    "layerwise_min", "detection", "replicate", "chunk_tokens", "regenerate"])

# failures: the schedule's rows (time, machine, down) and repairs (time, machine), both sorted,
# the replica peer of every machine (NONE: host memory), and the heap of lost requests to act
# on, keyed (time, request); next: [next failure, next repair]
Failures = namedtuple("Failures", ["schedule", "repairs", "peer", "recover", "next"])
# pools resized mid-run: rows (time, machine, +1 joins | -1 leaves) sorted; next: [next row]
Resizes = namedtuple("Resizes", ["rows", "next"])
RESTART, RETARGET, RESTORE = 0, 1, 2
RUN_PAUSED, RUN_DONE, RUN_STALLED = 0, 1, 2

# where the event loop stands: counts [next arrival, requests filled, requests finished] (in
# arrival order) and clock [the last instant run]
Progress = namedtuple("Progress", ["counts", "clock"])

Heap = namedtuple("Heap", ["key", "item", "size"])  # binary min-heap on (key, item); size: [n]

Touched = namedtuple("Touched", ["machine", "count"])  # machines step (4) visits; count: [n]

# Routing pools are tournament trees over machine indices, one row per tree: rank[tree, node] is
# the smallest (key, index) below the node, packed as key << MACHINE_BITS | index so that one
# integer comparison ranks two machines (EMPTY: no member); leaves at width/2 + machine index,
# the root at 1. The capacity-class trees make "the best machine that can hold the request"
# exact: within a class all capacities are equal, so a class's winner fits if any of its
# members does.
# The load trees are read only by the fallback route (and by every route of a baseline), so a
# change marks the machine stale and the trees are brought up to date when read: a tree is a
# function of its leaves, so the answer is the same, and most Splitwise runs never read them.
Pools = namedtuple("Pools", ["rank", "stale", "stale_count"])
MACHINE_BITS = 20                  # up to 1,048,575 machines; keys (tokens) below 2**43
MACHINE_MASK = (1 << MACHINE_BITS) - 1
EMPTY = np.iinfo(np.int64).max
TREE_PROMPT_PENDING, TREE_MIXED_PENDING, TREE_MIXED_COMMITTED, TREE_TOKEN_COMMITTED = 0, 1, 2, 3
TREE_PROMPT_COMMITTED = 4  # + capacity class: own-pool prompt machines by committed tokens
# then TREE_PROMPT_COMMITTED + classes + capacity class: every machine by load
KEY_PENDING, KEY_COMMITTED, KEY_LOAD = 0, 1, 2
# what changed about a machine, to re-rank it only in the trees where its rank can move
CHANGED_PENDING, CHANGED_COMMITTED, CHANGED_POOL = 1, 2, 4
CHANGED_ALL = CHANGED_PENDING | CHANGED_COMMITTED | CHANGED_POOL


# ---------------------------------------------------------------------------- latency

@_compiled
def _first_knot_at_or_above(x, xs, n, index, scale):
    """np.searchsorted(xs[:n], x) for xs[0] < x <= xs[n - 1]: the knot is between the starts of
    x's bucket and of the next one (checked, so rounding at a bucket edge cannot mislead it;
    `scale`, buckets per unit of x, is multiplied: a division would cost more than the rest)."""
    b = min(int((x - xs[0]) * scale), KNOT_BUCKETS - 1)
    lo, hi = index[b], index[b + 1]
    if (lo > 0 and xs[lo - 1] >= x) or xs[hi] < x:
        return np.searchsorted(xs[:n], x)
    while xs[lo] < x:
        lo += 1
    return lo


@_compiled
def _piecewise_linear(x, xs, ys, n, index, scale):
    """Same rule as simcore.latency.piecewise_linear, on the first n knots."""
    if x <= xs[0]:
        return ys[0]
    if x > xs[n - 1]:
        slope = (ys[n - 1] - ys[n - 2]) / (xs[n - 1] - xs[n - 2])
        return ys[n - 1] + slope * (x - xs[n - 1])
    j = _first_knot_at_or_above(x, xs, n, index, scale)
    if xs[j] == x:
        return ys[j]
    slope = (ys[j] - ys[j - 1]) / (xs[j] - xs[j - 1])
    return slope * (x - xs[j - 1]) + ys[j - 1]


@_inlined
def _prompt_time(curves, kind, tokens):
    return _piecewise_linear(float(tokens), curves.prompt_x[kind], curves.prompt_y[kind],
                             curves.prompt_n[kind], curves.prompt_index[kind],
                             curves.prompt_scale[kind])


@_inlined
def _decode_time(curves, kind, batch):
    """A decode iteration of `batch` requests at zero context."""
    return _piecewise_linear(float(batch), curves.decode_x[kind], curves.decode_y[kind],
                             curves.decode_n[kind], curves.decode_index[kind],
                             curves.decode_scale[kind])


@_inlined
def _chunk_extra(curves, kind, piece, before):
    """LatencyCurves.chunk_extra: attention over the `before` tokens already prefilled."""
    if before <= 0:
        return 0.0
    c, c0 = float(piece), float(before)
    attention = c0 * max(curves.chunk_attention[kind] * c, curves.chunk_kv_read[kind])
    knee = (_prompt_time(curves, kind, c0 + c) - _prompt_time(curves, kind, c0)
            - _prompt_time(curves, kind, c))
    return max(attention, knee)


@_inlined
def _iteration_time(curves, kind, tokens, batch, context):
    """LatencyCurves' prompt_time, token_time or mixed_time for SKU `kind`."""
    c = curves
    if batch == 0:
        return _piecewise_linear(float(tokens), c.prompt_x[kind], c.prompt_y[kind],
                                 c.prompt_n[kind], c.prompt_index[kind], c.prompt_scale[kind])
    decode = _decode_time(curves, kind, batch)
    if tokens == 0:
        return decode + c.context_s[kind] * float(context)
    prompt = c.mixed_factor[kind] * _piecewise_linear(
        float(tokens + batch), c.prompt_x[kind], c.prompt_y[kind], c.prompt_n[kind],
        c.prompt_index[kind], c.prompt_scale[kind])
    return max(prompt, decode) + c.context_s[kind] * float(context)


@_compiled
def _kv_transfer(settings, prompt, src, dst):
    """Same rule as simcore.cluster.kv_transfer_seconds, between machine records."""
    size = np.int64(prompt) * settings.kv_bytes  # (an int32 record field: 64-bit product)
    bandwidth = min(src.link, dst.link)
    if prompt < settings.layerwise_min:
        return size / bandwidth
    return max(src.visible, dst.visible) + size / (settings.layers * bandwidth)


# ---------------------------------------------------------------------------- containers

@_compiled
def _heap_push(heap, key, item):
    i = heap.size[0]
    heap.size[0] += 1
    keys, items = heap.key, heap.item
    keys[i] = key
    items[i] = item
    while i > 0:
        parent = (i - 1) // 2
        if keys[parent] < keys[i] or (keys[parent] == keys[i] and items[parent] < items[i]):
            break
        keys[parent], keys[i] = keys[i], keys[parent]
        items[parent], items[i] = items[i], items[parent]
        i = parent


@_compiled
def _sift_down(heap, i):
    keys, items, size = heap.key, heap.item, heap.size[0]
    while True:
        left, right, best = 2 * i + 1, 2 * i + 2, i
        if left < size and (keys[left] < keys[best]
                            or (keys[left] == keys[best] and items[left] < items[best])):
            best = left
        if right < size and (keys[right] < keys[best]
                             or (keys[right] == keys[best] and items[right] < items[best])):
            best = right
        if best == i:
            break
        keys[best], keys[i] = keys[i], keys[best]
        items[best], items[i] = items[i], items[best]
        i = best


@_compiled
def _heap_pop(heap):
    """Remove and return the (key, item)-minimal item."""
    keys, items = heap.key, heap.item
    top = items[0]
    heap.size[0] -= 1
    size = heap.size[0]
    keys[0] = keys[size]
    items[0] = items[size]
    _sift_down(heap, 0)
    return top


@_compiled
def _heapify(heap, size):
    """Keep the first `size` entries (compacted by the caller) as a heap."""
    heap.size[0] = size
    for i in range(size // 2 - 1, -1, -1):
        _sift_down(heap, i)


@_compiled
def _push_prompt(requests, machine, r):
    requests[r].queue_next = NONE
    if machine.prompt_tail != NONE:
        requests[machine.prompt_tail].queue_next = r
    else:
        machine.prompt_head = r
    machine.prompt_tail = r
    machine.prompt_len += 1


@_compiled
def _pop_prompt(requests, machine):
    r = machine.prompt_head
    machine.prompt_head = requests[r].queue_next
    if machine.prompt_head == NONE:
        machine.prompt_tail = NONE
    machine.prompt_len -= 1
    return r


@_compiled
def _push_wait(requests, machine, r):
    requests[r].queue_next = NONE
    if machine.wait_tail != NONE:
        requests[machine.wait_tail].queue_next = r
    else:
        machine.wait_head = r
    machine.wait_tail = r


@_compiled
def _pop_wait(requests, machine):
    r = machine.wait_head
    machine.wait_head = requests[r].queue_next
    if machine.wait_head == NONE:
        machine.wait_tail = NONE
    return r


@_inlined
def _before(requests, a, b):
    """Pairing-heap order: (finish tick, request)."""
    ta, tb = requests[a].finish_tick, requests[b].finish_tick
    return ta < tb or (ta == tb and a < b)


@_compiled
def _meld(requests, a, b):
    """Meld two heap roots (neither has siblings): the later becomes the earlier's first child."""
    if _before(requests, b, a):
        a, b = b, a
    requests[b].heap_sibling = requests[a].heap_child
    requests[a].heap_child = b
    return a


@_compiled
def _pop_root(requests, root):
    """The heap left when `root` is removed: its children melded in pairs left to right, then
    the pairs melded right to left (the two-pass pairing heap, O(log n) amortized)."""
    pairs = NONE  # melded pairs, last first, linked through heap_sibling
    x = requests[root].heap_child
    while x != NONE:
        y = requests[x].heap_sibling
        requests[x].heap_sibling = NONE
        if y == NONE:
            requests[x].heap_sibling = pairs
            pairs = x
            break
        after = requests[y].heap_sibling
        requests[y].heap_sibling = NONE
        x = _meld(requests, x, y)
        requests[x].heap_sibling = pairs
        pairs = x
        x = after
    heap = NONE
    while pairs != NONE:
        after = requests[pairs].heap_sibling
        requests[pairs].heap_sibling = NONE
        heap = pairs if heap == NONE else _meld(requests, heap, pairs)
        pairs = after
    return heap


@_compiled
def _append_running(requests, machine, r):
    """Admit request r to the machine's running decodes: its last token comes after as many
    more iterations as it has tokens left. One with tokens to regenerate (already sent before
    a loss) also joins the machine's silent decodes."""
    request = requests[r]
    request.finish_tick = machine.decode_clock + request.output - request.generated
    request.heap_child = request.heap_sibling = NONE
    machine.running_root = r if machine.running_root == NONE else _meld(
        requests, machine.running_root, r)
    request.queue_next = machine.fresh_head  # free while it decodes (see `_count_gaps`)
    machine.fresh_head = r
    machine.fresh_count += 1
    if request.emitted > request.generated:  # it regenerates tokens already sent first
        request.batch_next = machine.silent_head  # (free while it decodes)
        machine.silent_head = r
    machine.running_count += 1
    machine.running_context += request.prompt + request.generated


@_compiled
def _pop_running(requests, machine):
    """Remove the running decode that finishes first; its generated tokens made current."""
    r = machine.running_root
    request = requests[r]
    machine.running_root = _pop_root(requests, r)
    request.generated = request.output - (request.finish_tick - machine.decode_clock)
    machine.running_count -= 1
    machine.running_context -= request.prompt + request.generated
    return r


# ---------------------------------------------------------------------------- mixed pool

@_compiled
def _enter_mixed(machine, now):
    machine.in_mixed = True
    machine.mixed_since = now


@_compiled
def _leave_mixed_if_done(machine, now):
    """A mixed-pool machine returns to its pool once it has no work of the other kind."""
    if not machine.in_mixed:
        return
    other_work = machine.committed if machine.role == ROLE_PROMPT else machine.pending
    if other_work == 0:
        machine.in_mixed = False
        machine.mixed_s += now - machine.mixed_since


# ---------------------------------------------------------------------------- routing pools

@_inlined
def _key(machine, key):
    if key == KEY_PENDING:
        return machine.pending
    if key == KEY_COMMITTED:
        return machine.committed
    return machine.pending + machine.committed


@_inlined
def _classes(pools):
    return (len(pools.rank) - TREE_PROMPT_COMMITTED) // 2


@_inlined
def _winner(pools, tree):
    """The tree's (key, index)-smallest machine, NONE if it has no member."""
    top = pools.rank[tree, 1]
    return NONE if top == EMPTY else top & MACHINE_MASK


@_inlined
def _tree_key(tree, classes):
    if tree == TREE_PROMPT_PENDING or tree == TREE_MIXED_PENDING:
        return KEY_PENDING
    return KEY_COMMITTED if tree < TREE_PROMPT_COMMITTED + classes else KEY_LOAD


@_inlined
def _membership(machine, slot, classes):
    """The slot-th tree machine m can belong to (NONE: no such tree) and whether it is in."""
    # a down or retired machine is in no tree: the router never picks it
    up = not machine.down and not machine.retired
    own = not machine.in_mixed and up
    if slot == 0:
        return TREE_PROMPT_COMMITTED + classes + machine.capacity_class, up
    if machine.role == ROLE_BOTH:
        return NONE, False
    if slot == 1:
        return (TREE_PROMPT_PENDING if machine.role == ROLE_PROMPT else TREE_TOKEN_COMMITTED), own
    if slot == 2:
        if machine.role != ROLE_PROMPT:
            return NONE, False
        return TREE_PROMPT_COMMITTED + machine.capacity_class, own
    return ((TREE_MIXED_PENDING if slot == 3 else TREE_MIXED_COMMITTED),
            machine.in_mixed and up)


@_inlined
def _changes(machine, pending, committed, in_mixed):
    """What changed since the machine had these pending and committed tokens and pool."""
    return ((CHANGED_PENDING if machine.pending != pending else 0)
            | (CHANGED_COMMITTED if machine.committed != committed else 0)
            | (CHANGED_POOL if machine.in_mixed != in_mixed else 0))


@_inlined
def _key_changes(key):
    if key == KEY_PENDING:
        return CHANGED_PENDING
    return CHANGED_COMMITTED if key == KEY_COMMITTED else CHANGED_PENDING | CHANGED_COMMITTED


@_compiled
def _refresh(pools, machines, m, changed):
    """Re-rank machine m after `changed` (CHANGED_* bits): in every tree it can belong to if its
    pool changed, else in the trees it is in whose key changed (the load tree: marked stale)."""
    classes = _classes(pools)
    for slot in range(5):
        tree, member = _membership(machines[m], slot, classes)
        if tree == NONE:
            continue
        kind = _tree_key(tree, classes)
        if not (changed & CHANGED_POOL or (member and changed & _key_changes(kind))):
            continue
        if slot == 0:  # the load tree: updated when read (see Pools)
            if not machines[m].load_stale:
                machines[m].load_stale = True
                pools.stale[pools.stale_count[0]] = m
                pools.stale_count[0] += 1
            continue
        _set_leaf(pools.rank[tree], m, member, _key(machines[m], kind))


@_compiled
def _update_load_trees(pools, machines):
    """Bring the stale machines' load-tree leaves (and their paths) up to date."""
    classes = _classes(pools)
    for i in range(pools.stale_count[0]):
        m = pools.stale[i]
        machines[m].load_stale = False
        tree, member = _membership(machines[m], 0, classes)
        _set_leaf(pools.rank[tree], m, member, _key(machines[m], KEY_LOAD))
    pools.stale_count[0] = 0


@_inlined
def _set_leaf(rank, m, member, key):
    """Set machine m's leaf, then replay the matches on its path to the root until a match
    comes out as before."""
    leaf = len(rank) // 2 + m
    rank[leaf] = (key << MACHINE_BITS | m) if member else EMPTY
    i = leaf // 2
    while i >= 1:
        best = min(rank[2 * i], rank[2 * i + 1])
        if rank[i] == best:
            break  # this match and all above it come out as before
        rank[i] = best
        i //= 2


@_inlined
def _touch(touched, machine, m):
    if not machine.touched:
        machine.touched = True
        touched.machine[touched.count[0]] = m
        touched.count[0] += 1


# ---------------------------------------------------------------------------- (1) iterations end

@_inlined
def _count_gaps(requests, machine, curves, gaps, now):
    """ITL: the inter-token gaps the iteration or decode run ending now closes, binned. A
    decode that was in the iteration before waited one iteration time; one that joined at the
    start (on the fresh list) waited from its previous token to the first iteration's end.
    A run's iteration times grow with the context (`_run_iterations`), so when its first and
    last fall in one bin every one does, and they are counted at once."""
    decodes = machine.running_count
    if decodes == 0:
        return
    first_end = now
    ticks = machine.run_ticks
    if ticks == 1:
        gaps[_itl_bin(now - machine.run_start)] += decodes - machine.fresh_count
    else:
        decode = _decode_time(curves, machine.kind, decodes)
        per_token = curves.context_s[machine.kind]
        first = _tick_s(machine, decode, per_token, 0, decodes)
        first_end = machine.run_start + first
        low = _itl_bin(first)
        gaps[low] -= machine.fresh_count
        if low == _itl_bin(_tick_s(machine, decode, per_token, ticks - 1, decodes)):
            gaps[low] += ticks * decodes
        else:
            for run in range(ticks):
                gaps[_itl_bin(_tick_s(machine, decode, per_token, run, decodes))] += decodes
    r = machine.fresh_head
    while r != NONE:
        if requests[r].emitted <= requests[r].generated:  # (else its first token is silent)
            gaps[_itl_bin(first_end - requests[r].last_token)] += 1
        r = requests[r].queue_next
    machine.fresh_head = NONE
    machine.fresh_count = 0
    if machine.silent_head != NONE:
        _count_silent(requests, machine, curves, gaps, now)


@_compiled
def _count_silent(requests, machine, curves, gaps, now):
    """ITL of the silent decodes (tokens regenerated after a restart that regenerates are not
    sent again; see simcore.refsim): `_count_gaps` gave every running decode a gap per tick of
    the run, so each silent decode takes back those of its silent ticks (a fresh one's first
    was not counted), and its first token beyond those sent ends the gap from its last token
    sent instead; then it leaves the machine's silent list (chained through batch_next). They
    are rare (only after failures): O(their ticks in the run)."""
    ticks, clock, decodes = machine.run_ticks, machine.decode_clock, machine.running_count
    decode = _decode_time(curves, machine.kind, decodes)
    per_token = curves.context_s[machine.kind]
    previous = NONE
    r = machine.silent_head
    while r != NONE:
        request = requests[r]
        after = request.batch_next
        start = request.finish_tick - request.output  # the clock when it had 0 tokens
        silent = start + request.emitted - clock      # its silent ticks from this run's start
        fresh = start + request.generated == clock    # (generated: as when it joined)
        end = machine.run_start
        for tick in range(min(silent + 1, ticks)):    # its silent ticks here, and the next
            if ticks == 1:
                gap, end = now - machine.run_start, now
            else:
                gap = _tick_s(machine, decode, per_token, tick, decodes)
                end = end + gap
            if tick > 0 or not fresh:
                gaps[_itl_bin(gap)] -= 1
            if tick == silent - 1 and request.lost_at >= 0:  # it regenerated the last token
                request.recovery_s += end - request.lost_at  # sent: back where it was lost
                request.lost_at = -1.0
        if silent < ticks:  # its first token beyond those sent: a gap from the last one sent
            gaps[_itl_bin(end - request.last_token)] += 1
            if previous == NONE:
                machine.silent_head = after
            else:
                requests[previous].batch_next = after
        else:
            previous = r
        r = after


@_inlined
def _end_decodes(requests, machines, curves, gaps, m, now):
    """Every running decode was in this batch (the set changes only between iterations) and
    gains a token; those at their last token finish. Returns how many finished."""
    machine = machines[m]
    _count_gaps(requests, machine, curves, gaps, now)
    machine.last_end = now
    machine.running_context += machine.running_count * machine.run_ticks  # a token each
    machine.decode_clock += machine.run_ticks
    finished = 0
    while (machine.running_root != NONE
           and requests[machine.running_root].finish_tick == machine.decode_clock):
        r = _pop_running(requests, machine)
        request = requests[r]
        request.finish = now
        finished += 1
        machine.committed -= request.reservation
        machine.memory -= request.reservation
        if request.prompt_machine != m:
            _leave_mixed_if_done(machine, now)
    return finished


@_inlined
def _end_prompts(requests, machines, settings, kv_arrivals, pools, failures, m, now):
    """Each prompt yields its first token (a re-prefill after a loss yields none; one over the
    prompt only, when restarts regenerate, yields it again silently); its decode
    continues here, or on its token machine once the KV cache has arrived (if that machine
    failed meanwhile, on one chosen at detection). Returns how many requests finished."""
    machine = machines[m]
    finished = 0
    r = machine.batch_head
    while r != NONE:
        request = requests[r]
        after = request.batch_next
        request.prefilled += request.piece
        machine.pending -= request.piece
        if request.prefilled < request.prefill:  # more pieces to come
            r = after
            continue
        if request.generated == 0:
            request.generated = 1
            if request.emitted == 0:  # (else regenerated after a loss: silent)
                request.emitted = 1
                request.first_token = request.last_token = now
        t = request.token_machine
        if request.generated == request.output:
            machine.memory -= request.reservation if t == m else request.prefill
            request.finish = now
            finished += 1
            _recovered(request, now)
            if machines[t].epoch == request.token_epoch:
                machines[t].committed -= request.reservation
                if t != m:
                    in_mixed = machines[t].in_mixed
                    _leave_mixed_if_done(machines[t], now)
                    _refresh(pools, machines, t, CHANGED_COMMITTED
                             | (CHANGED_POOL if machines[t].in_mixed != in_mixed else 0))
        elif t == m:
            _append_running(requests, machine, r)
            _recovered(request, now)
        elif machines[t].epoch != request.token_epoch:
            request.from_epoch = machine.epoch
            _lose(requests, failures, r, RETARGET, now, max(now, machines[t].detect_at))
        else:
            request.kv_transfer = _kv_transfer(settings, request.prefill, machine, machines[t])
            _heap_push(kv_arrivals, now + request.kv_transfer, request.number)
        r = after
    machine.batch_head = NONE
    return finished


@_inlined
def _end_iteration(requests, machines, curves, settings, kv_arrivals, pools, touched, failures,
                   gaps, m, now):
    machine = machines[m]
    pending, committed, in_mixed = machine.pending, machine.committed, machine.in_mixed
    finished = _end_decodes(requests, machines, curves, gaps, m, now)
    finished += _end_prompts(requests, machines, settings, kv_arrivals, pools, failures, m,
                             now)
    machines[m].busy = False
    _leave_mixed_if_done(machines[m], now)
    _refresh(pools, machines, m, _changes(machine, pending, committed, in_mixed))
    _touch(touched, machines[m], m)
    return finished


# ---------------------------------------------------------------------------- (2) KV arrives

@_inlined
def _deliver_kv(requests, machines, kv_arrivals, touched, now):
    """KV caches that arrive now join their token machine's decode wait, by (time, request),
    and leave their prompt machine's memory."""
    while kv_arrivals.size[0] > 0 and kv_arrivals.key[0] == now:
        r = _heap_pop(kv_arrivals) % len(requests)
        t, p = requests[r].token_machine, requests[r].kv_from
        if p != NONE:  # (NONE: a replica restored after a failure)
            machines[p].memory -= requests[r].prefill   # transferred: the prompt machine lets go
            _touch(touched, machines[p], p)
        _push_wait(requests, machines[t], r)
        _touch(touched, machines[t], t)
        _recovered(requests[r], now)


# ---------------------------------------------------------------------------- (3) routing
# Every choice is the (key, index)-smallest machine of a pool: ties go to the lowest index.

@_compiled
def _best_prompt_machine_that_holds(machines, pools, reservation):
    """The prompt-pool machine with the fewest committed tokens that can take the request."""
    best = NONE
    for c in range(_classes(pools)):
        m = _winner(pools, TREE_PROMPT_COMMITTED + c)
        if (m != NONE and machines[m].committed + reservation <= machines[m].capacity
                and (best == NONE or machines[m].committed < machines[best].committed
                     or (machines[m].committed == machines[best].committed and m < best))):
            best = m
    return best


@_compiled
def _least_loaded(machines, pools, reservation):
    """Fallback (and baseline): fewest pending + committed tokens among machines that fit."""
    _update_load_trees(pools, machines)
    classes = _classes(pools)
    best = NONE
    for c in range(classes):
        m = _winner(pools, TREE_PROMPT_COMMITTED + classes + c)
        if (m != NONE and machines[m].capacity >= reservation
                and (best == NONE or _key(machines[m], KEY_LOAD) < _key(machines[best], KEY_LOAD)
                     or (_key(machines[m], KEY_LOAD) == _key(machines[best], KEY_LOAD)
                         and m < best))):
            best = m
    return best


@_compiled
def _is_long(machine, settings, prompt):
    return machine.prompt_len > 0 and machine.pending + prompt > settings.queue_threshold


@_compiled
def _is_loaded(machine, reservation):
    return machine.committed + reservation > machine.capacity


@_compiled
def _lend(machines, pools, m, now):
    """Move machine m into the mixed pool (NONE: nothing to move)."""
    if m != NONE:
        _enter_mixed(machines[m], now)
        _refresh(pools, machines, m, CHANGED_POOL)
    return m


@_compiled
def _choose_prompt_machine(machines, settings, pools, prompt, now):
    """Own pool; with the mixed pool, unless the queue is long: the mixed pool's best, else lend
    the token machine with the fewest committed tokens. Returns (choice, lent machine), NONE
    for none."""
    own = _winner(pools, TREE_PROMPT_PENDING)
    if not settings.mixed_pool or (own != NONE and not _is_long(machines[own], settings, prompt)):
        return own, NONE
    mixed = _winner(pools, TREE_MIXED_PENDING)
    if mixed != NONE and not _is_long(machines[mixed], settings, prompt):
        return mixed, NONE
    lent = _lend(machines, pools, _winner(pools, TREE_TOKEN_COMMITTED), now)
    return lent, lent


@_compiled
def _choose_token_machine(machines, settings, pools, reservation, now):
    """Own pool; with the mixed pool, unless it is loaded: the mixed pool's best, else lend the
    prompt machine with the fewest committed tokens that can hold the request."""
    own = _winner(pools, TREE_TOKEN_COMMITTED)
    if not settings.mixed_pool or (own != NONE and not _is_loaded(machines[own], reservation)):
        return own, NONE
    mixed = _winner(pools, TREE_MIXED_COMMITTED)
    if mixed != NONE and not _is_loaded(machines[mixed], reservation):
        return mixed, NONE
    lent = _lend(machines, pools,
                 _best_prompt_machine_that_holds(machines, pools, reservation), now)
    return lent, lent


@_compiled
def _route(requests, machines, settings, pools, touched, r, now):
    """Pick both machines on arrival (prompt side first) and queue the prompt; False when no
    machine that can hold the request is up."""
    request = requests[r]
    prompt_m, token_m = NONE, NONE
    lent_p, lent_t = NONE, NONE
    if machines[0].role != ROLE_BOTH:
        prompt_m, lent_p = _choose_prompt_machine(machines, settings, pools, request.prefill,
                                                  now)
        if prompt_m != NONE:
            token_m, lent_t = _choose_token_machine(machines, settings, pools,
                                                    request.reservation, now)
    if prompt_m == NONE or token_m == NONE:
        prompt_m = token_m = _least_loaded(machines, pools, request.reservation)
    if prompt_m == NONE:
        for m in (lent_p, lent_t):
            if m != NONE:
                _leave_mixed_if_done(machines[m], now)
                _refresh(pools, machines, m, CHANGED_ALL)
        return False
    request.prompt_machine = prompt_m
    request.token_machine = token_m
    request.token_epoch = machines[token_m].epoch
    request.kv_from = prompt_m
    _push_prompt(requests, machines[prompt_m], r)
    machines[prompt_m].pending += request.prefill
    machines[token_m].committed += request.reservation
    # a machine lent for nothing (the fallback took over) returns at once
    for m in (lent_p, lent_t):
        if m != NONE:
            _leave_mixed_if_done(machines[m], now)
            _refresh(pools, machines, m, CHANGED_ALL)
    _refresh(pools, machines, prompt_m, CHANGED_PENDING)
    _refresh(pools, machines, token_m, CHANGED_COMMITTED)
    _touch(touched, machines[prompt_m], prompt_m)
    return True


# ---------------------------------------------------------------------------- (4) iterations start

@_inlined
def _has_work(machine):
    return (machine.wait_head != NONE or machine.prompt_head != NONE
            or machine.running_count > 0)


@_inlined
def _admit_decodes(requests, machine):
    """Waiting decodes join FCFS while their reservation fits in memory."""
    while (machine.wait_head != NONE and machine.memory
           + requests[machine.wait_head].reservation <= machine.capacity):
        r = _pop_wait(requests, machine)
        machine.memory += requests[r].reservation
        _append_running(requests, machine, r)


@_inlined
def _take_prompts(requests, machine, m, limit, curves, chunked_design):
    """Queued prompts join from the head within the token limit (the first always does); one
    that decodes here must also fit its reservation, else the queue waits. Returns (count,
    tokens)."""
    tokens = 0
    count = 0
    last = NONE
    while machine.prompt_head != NONE:
        request = requests[machine.prompt_head]
        if count > 0 and tokens + request.prompt > limit:
            break
        # the prompt's KV is held here while it is computed: all of its reservation when it
        # decodes here, its prompt tokens until transferred when it decodes elsewhere
        held = request.reservation if request.token_machine == m else request.prefill
        if machine.memory + held > machine.capacity:
            break
        machine.memory += held
        r = _pop_prompt(requests, machine)
        request.piece = request.prefill
        request.batch_next = NONE
        if last != NONE:
            requests[last].batch_next = r
        else:
            machine.batch_head = r
        last = r
        tokens += request.prefill
        count += 1
        if chunked_design:  # a whole prompt is one piece
            machine.prompt_chunks += 1
            machine.chunked_prefill_s += _prompt_time(curves, machine.kind, request.prefill)
    return count, tokens


@_inlined
def _chunks_now(requests, machine, settings):
    """Chunked designs: baseline machines always; Splitwise machines while they decode or
    finish a partially prefilled prompt."""
    if settings.chunk_tokens <= 0:
        return False
    return (machine.role == ROLE_BOTH or machine.running_count > 0
            or (machine.prompt_head != NONE and requests[machine.prompt_head].prefilled > 0))


@_inlined
def _take_chunks(requests, machine, m, curves, budget):
    """Stall-free batching: prefill work from the head (the ongoing prompt first) within the
    budget, each prompt with the largest piece that fits; a prompt's KV is held from its first
    piece (as in `_take_prompts`). A prompt not finished stays at the head. Returns (count,
    tokens, chunk extras)."""
    tokens = 0
    count = 0
    last = NONE
    extra = 0.0
    while machine.prompt_head != NONE and budget > 0:
        r = machine.prompt_head
        request = requests[r]
        if request.prefilled == 0:
            held = request.reservation if request.token_machine == m else request.prefill
            if machine.memory + held > machine.capacity:
                break
            machine.memory += held
        piece = min(request.prefill - request.prefilled, budget)
        request.piece = piece
        request.batch_next = NONE
        if last != NONE:
            requests[last].batch_next = r
        else:
            machine.batch_head = r
        last = r
        tokens += piece
        count += 1
        budget -= piece
        piece_extra = _chunk_extra(curves, machine.kind, piece, request.prefilled)
        extra += piece_extra
        machine.chunked_prefill_s += _prompt_time(curves, machine.kind, piece) + piece_extra
        if request.prefilled + piece < request.prefill:
            break
        _pop_prompt(requests, machine)
    machine.prompt_chunks += count
    return count, tokens, extra


@_inlined
def _start_iteration(requests, machines, curves, settings, busy_heap, m, now, limit):
    machine = machines[m]
    _admit_decodes(requests, machine)
    extra = 0.0
    if _chunks_now(requests, machine, settings):
        # Sarathi-Serve's Algorithm 3: the running decodes' tokens count in the budget first
        budget = max(0, settings.chunk_tokens - machine.running_count)
        count, tokens, extra = _take_chunks(requests, machine, m, curves, budget)
    else:
        count, tokens = _take_prompts(requests, machine, m, settings.prompt_token_limit, curves,
                                      settings.chunk_tokens > 0)
    decodes = machine.running_count
    if count == 0 and decodes == 0:
        return
    machine.busy = True
    if count == 0:
        _start_decode_run(requests, machine, curves, now, limit)
    else:
        duration = _iteration_time(curves, machine.kind, tokens, decodes,
                                   machine.running_context) + extra
        machine.run_ticks = 1
        machine.run_start = now
        machine.busy_until = now + duration
        machine.busy_s += duration
        if settings.chunk_tokens > 0 and machine.role == ROLE_BOTH and limit == INF:
            _start_chunk_run(requests, machines, curves, settings, m)
    _heap_push(busy_heap, machine.busy_until, m)
    machine.iterations += machine.run_ticks
    machine.batch_size_sum += (count + decodes) * machine.run_ticks
    if machine.memory > machine.max_memory:
        machine.max_memory = machine.memory


@_inlined
def _start_decode_run(requests, machine, curves, now, limit):
    """A machine's decode-only iterations up to the one where its first decode finishes, as one
    event. With failures, only those ending by `limit`, the next failure step (but at least
    one): when a machine fails, or a failure acts on requests, every machine is between
    iterations or in a single one, as `_fail` expects. Only new work changes a run: a prompt
    routed to the machine or a KV cache arriving for it cuts the run at the iteration in flight
    (`_cut_run`). Nothing else an iteration end does can change meanwhile: its routing keys
    and pool move only with finishes and new work (a mixed-pool machine has work of the other
    kind until it leaves; tokens committed to it or memory it frees change no decode), so each
    iteration's time is the one it would have had alone (same terms, same order) and the
    results are those of ending the iterations one by one."""
    machine.run_start, machine.run_busy_s = now, machine.busy_s
    machine.run_ticks = requests[machine.running_root].finish_tick - machine.decode_clock
    machine.busy_until = _run_iterations(machine, curves, machine.run_ticks, INF, limit)


@_inlined
def _tick_s(machine, decode, per_token, tick, decodes):
    """The time of the tick-th iteration of a decode run that started with the machine's
    running context (each iteration adds a token per decode): the one formula the run's
    replays (`_run_iterations`, `_count_gaps`, `_count_silent`) share, so they agree bit for
    bit."""
    return decode + per_token * float(machine.running_context + tick * decodes)


@_inlined
def _run_iterations(machine, curves, ticks, until, limit):
    """Replay the run from its start for `ticks` iterations or to the first iteration end at or
    after `until`, and after the first iteration none that ends after `limit`, adding each
    iteration's time to busy_s; sets run_ticks, returns the end."""
    decodes = machine.running_count
    decode = _decode_time(curves, machine.kind, decodes)  # the batch is the same throughout
    per_token = curves.context_s[machine.kind]
    machine.busy_s = machine.run_busy_s
    end = machine.run_start
    run = 0
    while run < ticks and end < until:  # each as _iteration_time's decode-only case
        duration = _tick_s(machine, decode, per_token, run, decodes)
        if run > 0 and end + duration > limit:
            break
        end = end + duration
        machine.busy_s += duration
        run += 1
    machine.run_ticks = run
    return end


@_inlined
def _cut_run(machines, curves, busy_heap, m, now):
    """Work arrived for machine m during a run: the run ends with the iteration in flight (its
    end at or after now), where the machine would have taken the work. The heap entry of the
    old end stays until it reaches the top (`_is_current_end`); one per routed prompt or arrived
    KV cache at most, hence the busy heap's room for 2 x requests more entries than machines."""
    machine = machines[m]
    ticks = machine.run_ticks
    end = _run_iterations(machine, curves, ticks, now, INF)
    if machine.run_ticks < ticks:
        dropped = ticks - machine.run_ticks
        machine.iterations -= dropped
        machine.batch_size_sum -= dropped * machine.running_count
        machine.busy_until = end
        _heap_push(busy_heap, end, m)


@_inlined
def _chunk_step(curves, machine, piece, before, before_s):
    """The next iteration of a chunk run, as `_start_iteration` computes it (`_take_chunks`'
    chunk extra, `_iteration_time`), from the run's constants: a piece after `before` prefilled
    tokens, whose prompt time `before_s` the previous step gave. Returns (its time, its chunk
    extra, the prompt time of before + piece)."""
    kind = machine.kind
    c, c0 = float(piece), float(before)
    after_s = _prompt_time(curves, kind, c0 + c)
    attention = c0 * max(curves.chunk_attention[kind] * c, curves.chunk_kv_read[kind])
    piece_extra = max(attention, after_s - before_s - machine.chunk_piece_s)
    extra = 0.0
    extra += piece_extra
    iteration = machine.chunk_base
    if machine.running_count > 0:
        iteration = iteration + curves.context_s[kind] * float(machine.running_context)
    return iteration + extra, piece_extra, after_s


@_inlined
def _start_chunk_run(requests, machines, curves, settings, m):
    """A colocated chunked machine that just started a full-budget piece of a prompt that goes
    on after it (so with no running decode: they would take part of the budget): its next
    iterations are the next full-budget pieces of that prompt, up to the last full piece that
    leaves some of the prompt. Nothing
    routed meanwhile changes them (a new prompt queues behind this one; decodes only leave as
    they finish, and none waits to join: a colocated machine receives a KV cache only as a
    replica restored after a failure, which cuts the run at the iteration in flight), and
    their ends change only the machine's own state and its routing keys (pending and
    committed tokens). So those ends make no instant: each is applied when it reaches the top
    of the busy heap (`_apply_chunk_end`), before any instant at or after its time, and only
    the run's last iteration ends as an event. Each iteration's time is the one it would have
    had alone (same terms, same order; the batch's lookups are made once per batch size)."""
    machine = machines[m]
    request = requests[machine.batch_head]
    piece = request.piece
    if (piece != settings.chunk_tokens or request.batch_next != NONE
            or machine.wait_head != NONE):
        return
    length = (request.prefill - request.prefilled - 1) // piece  # full pieces leaving some
    if length < 2:
        return
    machine.chunk_piece_s = _prompt_time(curves, machine.kind, piece)
    _set_chunk_base(curves, machine, piece)
    machine.chunk_prev_s = _prompt_time(curves, machine.kind, request.prefilled + piece)
    machine.chunk_left = length - 1


@_inlined
def _set_chunk_base(curves, machine, piece):
    """`_iteration_time` of a piece beside the running decodes, without the context term. Its
    two lookups are written out: calling `_iteration_time(..., 0)` here gives the same values
    but made Sarathi-A100 runs 13% slower (numba's inlining), measured in fresh processes."""
    kind, decodes = machine.kind, machine.running_count
    machine.chunk_base = machine.chunk_piece_s
    if decodes > 0:
        machine.chunk_base = max(curves.mixed_factor[kind] * _piecewise_linear(
            float(piece + decodes), curves.prompt_x[kind], curves.prompt_y[kind],
            curves.prompt_n[kind], curves.prompt_index[kind], curves.prompt_scale[kind]),
            _decode_time(curves, kind, decodes))


@_inlined
def _apply_chunk_end(requests, machines, curves, pools, busy_heap, gaps, m):
    """The end of one of machine m's chunk-run iterations and the start of the next, as
    `_end_iteration` and `_start_iteration` would apply them (see `_start_chunk_run`).
    Returns how many requests finished."""
    machine = machines[m]
    request = requests[machine.batch_head]
    piece = request.piece
    decodes = machine.running_count
    finished = _end_decodes(requests, machines, curves, gaps, m, machine.busy_until)  # a token each
    request.prefilled += piece                          # and a piece prefilled
    machine.pending -= piece
    _refresh(pools, machines, m, CHANGED_PENDING | (CHANGED_COMMITTED if finished else 0))
    if machine.running_count != decodes:
        _set_chunk_base(curves, machine, piece)
    duration, piece_extra, machine.chunk_prev_s = _chunk_step(
        curves, machine, piece, request.prefilled, machine.chunk_prev_s)
    machine.chunked_prefill_s += machine.chunk_piece_s + piece_extra
    machine.prompt_chunks += 1                          # the start: the next piece
    machine.run_start = machine.busy_until
    machine.busy_until = machine.busy_until + duration
    machine.busy_s += duration
    machine.iterations += 1
    machine.batch_size_sum += 1 + machine.running_count
    machine.chunk_left -= 1
    _heap_push(busy_heap, machine.busy_until, m)
    return finished


# ---------------------------------------------------------------------------- failures
# Only run when the schedule has rows; the semantics are the reference's (simcore.refsim).

@_inlined
def _recovered(request, now):
    """Its KV reached its token machine; it has recovered unless it still regenerates tokens
    already sent (then when it has regenerated them: `_count_silent`)."""
    request.ready_at = now
    if request.lost_at >= 0 and request.generated >= request.emitted:
        request.recovery_s += now - request.lost_at
        request.lost_at = -1.0


@_compiled
def _lose(requests, failures, r, kind, now, at):
    """Request r lost its work or KV: act on it at `at` (INF: never, the run stalls)."""
    request = requests[r]
    request.recover_kind = kind
    request.prefilled = 0           # its prefilled pieces are lost with it
    request.lost_at = now
    request.recoveries += 1
    if at < INF:
        _heap_push(failures.recover, at, request.number)


@_compiled
def _next_repair(failures):
    i = failures.next[1]
    return failures.repairs[i, 0] if i < len(failures.repairs) else INF


@_compiled
def _fail(requests, machines, settings, kv_arrivals, busy_heap, pools, failures, m, now):
    """Machine m fails: its iteration in flight and every request whose work or KV it held are
    lost (acted on at detection); it leaves every routing tree."""
    machine = machines[m]
    machine.down = True
    machine.epoch += 1
    machine.detect_at = now + settings.detection
    at = machine.detect_at
    if machine.busy:
        machine.busy_s -= machine.busy_until - now
        machine.busy = False
        kept = 0
        for i in range(busy_heap.size[0]):
            if busy_heap.item[i] != m:
                busy_heap.key[kept], busy_heap.item[kept] = busy_heap.key[i], busy_heap.item[i]
                kept += 1
        _heapify(busy_heap, kept)
    if machine.in_mixed:
        machine.in_mixed = False
        machine.mixed_s += now - machine.mixed_since
    decoding = RESTORE if settings.replicate else RESTART
    partial = NONE  # a prompt whose piece in flight is not its last: also still queued
    r = machine.batch_head
    while r != NONE:
        after = requests[r].batch_next
        if requests[r].prefilled + requests[r].piece < requests[r].prefill:
            partial = r
        _lose(requests, failures, r, RESTART, now, at)
        r = after
    r = machine.prompt_head
    while r != NONE:
        after = requests[r].queue_next
        if r != partial:
            _lose(requests, failures, r, RESTART, now, at)
        r = after
    while machine.running_root != NONE:
        r = machine.running_root
        _pop_running(requests, machine)
        if requests[r].generated > requests[r].emitted:  # it sent tokens from here, the latest
            requests[r].emitted = requests[r].generated  # at the last end (else it was silent)
            requests[r].last_token = machine.last_end
        _lose(requests, failures, r, decoding, now, at)
    machine.fresh_head = machine.silent_head = NONE
    machine.fresh_count = 0
    r = machine.wait_head
    while r != NONE:
        after = requests[r].queue_next
        _lose(requests, failures, r, decoding, now, at)
        r = after
    kept = 0
    for i in range(kv_arrivals.size[0]):
        r = kv_arrivals.item[i] % len(requests)
        if requests[r].kv_from == m:             # sent from here: the KV is gone
            _lose(requests, failures, r, RESTART, now, at)
        elif requests[r].token_machine == m:     # sent here: resend from where it is
            _lose(requests, failures, r,
                  RETARGET if requests[r].kv_from != NONE else RESTORE, now, at)
        else:
            kv_arrivals.key[kept], kv_arrivals.item[kept] = kv_arrivals.key[i], kv_arrivals.item[i]
            kept += 1
    _heapify(kv_arrivals, kept)
    machine.prompt_head = machine.prompt_tail = machine.wait_head = machine.wait_tail = NONE
    machine.running_root = machine.batch_head = NONE
    machine.prompt_len = machine.running_count = machine.running_context = 0
    machine.memory = machine.pending = machine.committed = 0
    _refresh(pools, machines, m, CHANGED_ALL)


@_compiled
def _repair(machines, pools, m, now):
    machines[m].down = False
    machines[m].up_since = now
    _refresh(pools, machines, m, CHANGED_ALL)


@_compiled
def _defer(failures, number):
    """Nothing can take it now: wait for the next repair (none: the run stalls)."""
    at = _next_repair(failures)
    if at < INF:
        _heap_push(failures.recover, at, number)


@_compiled
def _recover(requests, machines, settings, pools, touched, kv_arrivals, failures, r, now):
    """Act on a lost request at its detection: restart it through the router, or send its KV
    (held on its prompt machine, or a replica) to a token machine chosen as on arrival."""
    request = requests[r]
    kind = request.recover_kind
    peers = failures.peer
    if kind == RETARGET and machines[request.kv_from].epoch != request.from_epoch:
        kind = RESTART
    if kind == RESTORE and peers[request.token_machine] != NONE:
        peer = machines[peers[request.token_machine]]
        if peer.down or peer.up_since > request.ready_at:
            kind = RESTART
    if kind == RESTART:
        request.recover_kind = RESTART
        t = request.token_machine
        if t != NONE and machines[t].epoch == request.token_epoch:
            machines[t].committed -= request.reservation
            _leave_mixed_if_done(machines[t], now)
            _refresh(pools, machines, t, CHANGED_ALL)
        if request.prompt_machine != NONE and settings.regenerate:  # the prompt only, then
            request.prefill = request.prompt  # the tokens already sent decoded again, silently
            request.recomputed += request.prompt + max(request.emitted - 1, 0)
            request.generated = 0
        elif request.prompt_machine != NONE:
            request.prefill = request.prompt + request.generated
            request.recomputed += request.prefill
        request.prompt_machine = request.token_machine = NONE
        if not _route(requests, machines, settings, pools, touched, r, now):
            _defer(failures, request.number)
        return
    token = NONE
    if machines[0].role != ROLE_BOTH:
        token, lent = _choose_token_machine(machines, settings, pools, request.reservation, now)
    if token == NONE:
        token = _least_loaded(machines, pools, request.reservation)
    if token == NONE:
        _defer(failures, request.number)
        return
    source = peers[request.token_machine]
    request.token_machine = token
    request.token_epoch = machines[token].epoch
    machines[token].committed += request.reservation
    _refresh(pools, machines, token, CHANGED_COMMITTED)
    if kind == RETARGET:
        request.kv_transfer = _kv_transfer(settings, request.prefill, machines[request.kv_from],
                                           machines[token])
        due = now + request.kv_transfer
    else:
        request.kv_from = NONE
        link = machines[token].link
        if source != NONE:
            link = min(link, machines[source].link)
        due = now + (request.prompt + request.generated) * settings.kv_bytes / link
    _heap_push(kv_arrivals, due, request.number)


@_inlined
def _failure_due(failures, now):
    """A repair, a failure or a lost request is due now (checked inline: most instants have
    none, and the call below costs more than these comparisons)."""
    nxt = failures.next
    return ((nxt[0] < len(failures.schedule) and failures.schedule[nxt[0], 0] == now)
            or (nxt[1] < len(failures.repairs) and failures.repairs[nxt[1], 0] == now)
            or (failures.recover.size[0] > 0 and failures.recover.key[0] == now))


@_compiled
def _failure_steps(requests, machines, settings, kv_arrivals, busy_heap, pools, touched,
                   failures, now):
    """(2a) repairs, (2b) failures, by machine index; (2c) lost requests, by request."""
    nxt = failures.next
    while nxt[1] < len(failures.repairs) and failures.repairs[nxt[1], 0] == now:
        _repair(machines, pools, int(failures.repairs[nxt[1], 1]), now)
        nxt[1] += 1
    while nxt[0] < len(failures.schedule) and failures.schedule[nxt[0], 0] == now:
        _fail(requests, machines, settings, kv_arrivals, busy_heap, pools, failures,
              int(failures.schedule[nxt[0], 1]), now)
        nxt[0] += 1
    recover = failures.recover
    while recover.size[0] > 0 and recover.key[0] == now:
        r = _heap_pop(recover) % len(requests)
        _recover(requests, machines, settings, pools, touched, kv_arrivals, failures, r, now)


# ---------------------------------------------------------------------------- event loop

@_compiled
def _resize_steps(machines, pools, resizes, now):
    """(2r) machines leave and join their pools, by index (see simcore.refsim)."""
    rows = resizes.rows
    while resizes.next[0] < len(rows) and rows[resizes.next[0], 0] == now:
        m = int(rows[resizes.next[0], 1])
        machines[m].retired = rows[resizes.next[0], 2] < 0
        _refresh(pools, machines, m, CHANGED_ALL)
        resizes.next[0] += 1


@_inlined
def _next_other_event(requests, kv_arrivals, failures, resizes, next_arrival, next_slot,
                      filled):
    """Earliest KV arrival, request arrival, pool resize, failure, repair or lost request to
    act on; INF when nothing is left."""
    now = INF
    if resizes.next[0] < len(resizes.rows) and resizes.rows[resizes.next[0], 0] < now:
        now = resizes.rows[resizes.next[0], 0]
    if kv_arrivals.size[0] > 0 and kv_arrivals.key[0] < now:
        now = kv_arrivals.key[0]
    if next_arrival < filled and requests[next_slot].arrival < now:
        now = requests[next_slot].arrival
    if len(failures.schedule):
        now = min(now, _next_failure_step(failures))
    return now


@_inlined
def _is_current_end(machine, at):
    """A busy-heap entry (at, machine) ends the iteration or run in flight, not a cut run (nor
    one already ended at this instant) nor an iteration of a chunk run before its last."""
    return machine.busy and machine.busy_until == at and machine.chunk_left == 0


@_inlined
def _is_chunk_end(machine, at):
    """A busy-heap entry (at, machine) ends an iteration of a chunk run before its last."""
    return machine.busy and machine.busy_until == at and machine.chunk_left > 0


@_inlined
def _settle_busy_heap(requests, machines, curves, pools, busy_heap, gaps, until):
    """Before the next instant: pop the old ends of cut runs off the top of the busy heap, and
    apply the chunk-run ends at its top up to `until`, the next other event, so that neither
    makes an instant of its own (an instant where nothing happens, at the cost of all four
    steps). Returns how many requests finished."""
    finished = 0
    while busy_heap.size[0] > 0:
        m, at = busy_heap.item[0], busy_heap.key[0]
        chunk_end = _is_chunk_end(machines[m], at)
        if _is_current_end(machines[m], at) or (chunk_end and at > until):
            break
        _heap_pop(busy_heap)
        if chunk_end:
            finished += _apply_chunk_end(requests, machines, curves, pools, busy_heap, gaps, m)
    return finished


@_inlined
def _next_failure_step(failures):
    """The time of the next failure, repair or lost request to act on (INF: none left)."""
    nxt = failures.next
    at = INF
    if nxt[0] < len(failures.schedule):
        at = failures.schedule[nxt[0], 0]
    if nxt[1] < len(failures.repairs) and failures.repairs[nxt[1], 0] < at:
        at = failures.repairs[nxt[1], 0]
    if failures.recover.size[0] > 0 and failures.recover.key[0] < at:
        at = failures.recover.key[0]
    return at


@_inlined
def _start_touched(requests, machines, curves, settings, busy_heap, touched, now, limit):
    """(4) in machine index order, over the machines touched at this instant only."""
    visit = touched.machine
    count = touched.count[0]
    for i in range(1, count):  # insertion sort: a handful of machines per instant
        m, j = visit[i], i
        while j > 0 and visit[j - 1] > m:
            visit[j] = visit[j - 1]
            j -= 1
        visit[j] = m
    for i in range(count):
        m = visit[i]
        machines[m].touched = False
        if not machines[m].busy and _has_work(machines[m]):
            _start_iteration(requests, machines, curves, settings, busy_heap, m, now, limit)
        elif machines[m].run_ticks > 1 and (machines[m].prompt_head != NONE
                                            or machines[m].wait_head != NONE):
            _cut_run(machines, curves, busy_heap, m, now)
        elif machines[m].chunk_left > 0 and machines[m].wait_head != NONE:
            machines[m].chunk_left = 0  # a KV cache to admit (a replica restored after a
            # failure): the chunk run ends with the iteration in flight, as an event
    touched.count[0] = 0


@_compiled
def _run(requests, machines, curves, settings, kv_arrivals, busy_heap, pools, touched,
         failures, resizes, gaps, progress, until):
    """The event loop, from where `progress` left it, over every instant before `until` (INF:
    to the end). Requests are numbered in arrival order; request g is in slot g % slots of
    `requests` (all of them in one run; see `run_streamed` for fewer). Returns RUN_PAUSED (the
    next instant is at or after `until`), RUN_DONE (every request filled has finished) or
    RUN_STALLED (unfinished requests, nothing left to happen)."""
    slots = len(requests)
    counts = progress.counts   # [next arrival, requests filled, requests finished]
    next_arrival, filled, finished = counts[0], counts[1], counts[2]
    next_slot = next_arrival % slots   # its slot, kept in step (no division per event)
    end_time = progress.clock[0]
    failing = len(failures.schedule) > 0
    status = RUN_DONE
    while True:
        if finished == filled and until == INF:
            break
        now = _next_other_event(requests, kv_arrivals, failures, resizes, next_arrival, next_slot,
                                filled)
        if until < now:  # (chunk ends are applied up to the next instant only: see _settle)
            now = until
        finished += _settle_busy_heap(requests, machines, curves, pools, busy_heap, gaps, now)
        if busy_heap.size[0] > 0 and busy_heap.key[0] < now:
            now = busy_heap.key[0]
        if now == INF:
            status = RUN_STALLED
            break
        if now >= until:
            status = RUN_PAUSED
            break
        end_time = now
        while busy_heap.size[0] > 0 and busy_heap.key[0] == now:  # (1), by machine index
            m = _heap_pop(busy_heap)
            if _is_chunk_end(machines[m], now):  # below a current end, so not applied yet
                finished += _apply_chunk_end(requests, machines, curves, pools, busy_heap,
                                             gaps, m)
            elif _is_current_end(machines[m], now):
                finished += _end_iteration(requests, machines, curves, settings, kv_arrivals,
                                           pools, touched, failures, gaps, m, now)
        _deliver_kv(requests, machines, kv_arrivals, touched, now)  # (2)
        if resizes.next[0] < len(resizes.rows) and resizes.rows[resizes.next[0], 0] == now:
            _resize_steps(machines, pools, resizes, now)
        if failing and _failure_due(failures, now):
            _failure_steps(requests, machines, settings, kv_arrivals, busy_heap, pools,
                           touched, failures, now)
        while next_arrival < filled and requests[next_slot].arrival == now:  # (3)
            r = next_slot
            if not _route(requests, machines, settings, pools, touched, r, now):
                _lose(requests, failures, r, RESTART, now, _next_repair(failures))
            next_arrival += 1
            next_slot = 0 if next_slot + 1 == slots else next_slot + 1
        # (4); a decode-only run ends by the next failure step (see _start_decode_run)
        _start_touched(requests, machines, curves, settings, busy_heap, touched, now,
                       _next_failure_step(failures) if failing else INF)
    counts[0], counts[2] = next_arrival, finished
    progress.clock[0] = end_time
    if status == RUN_DONE:
        for m in range(len(machines)):  # close the mixed-pool stays still open
            if machines[m].in_mixed:
                machines[m].mixed_s += end_time - machines[m].mixed_since
    return status


# ---------------------------------------------------------------------------- setup

def _stack_curves(curves) -> Curves:
    """Pad every SKU's knots into 2-D arrays (numba wants uniform arrays), with lengths."""
    k = len(curves)
    pmax = max(len(c.prompt_tokens) for c in curves)
    dmax = max(len(c.decode_batch) for c in curves)
    px, py = np.zeros((k, pmax)), np.zeros((k, pmax))
    dx, dy = np.zeros((k, dmax)), np.zeros((k, dmax))
    pn, dn = np.zeros(k, np.int64), np.zeros(k, np.int64)
    ctx, attention, kv_read, mixed = np.zeros(k), np.zeros(k), np.zeros(k), np.ones(k)
    for i, c in enumerate(curves):
        pn[i], dn[i] = len(c.prompt_tokens), len(c.decode_batch)
        px[i, :pn[i]], py[i, :pn[i]] = c.prompt_tokens, c.prompt_seconds
        dx[i, :dn[i]], dy[i, :dn[i]] = c.decode_batch, c.decode_seconds
        ctx[i] = c.context_seconds_per_token
        attention[i], kv_read[i] = c.chunk_attention_s, c.chunk_kv_read_s
        mixed[i] = c.mixed_prompt_factor
    return Curves(px, py, pn, dx, dy, dn, ctx, attention, kv_read, mixed, _bucket_starts(px, pn),
                  _bucket_starts(dx, dn), _bucket_scales(px, pn), _bucket_scales(dx, dn))


_STACKED: dict = {}   # ids of a tuple of curves -> (those curves, kept alive; their stack)


def _stacked_curves(curves) -> Curves:
    """`_stack_curves`, once per tuple of curve objects: a search runs a design's few SKUs,
    whose curves the performance model caches, hundreds of times."""
    key = tuple(map(id, curves))
    known = _STACKED.get(key)
    if known is None or any(a is not b for a, b in zip(known[0], curves)):
        if len(_STACKED) >= 64:
            _STACKED.clear()
        known = _STACKED[key] = (curves, _stack_curves(curves))
    return known[1]


def _bucket_starts(xs: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Per row, the first knot at or above each bucket's lower edge (KNOT_BUCKETS + 1 edges over
    the row's range; the last is its final knot)."""
    starts = np.zeros((len(xs), KNOT_BUCKETS + 1), np.int64)
    for i, (row, count) in enumerate(zip(xs, n)):
        knots = row[:count]
        edges = np.linspace(knots[0], knots[-1], KNOT_BUCKETS + 1)
        starts[i] = np.minimum(np.searchsorted(knots, edges), count - 1)
    return starts


def _bucket_scales(xs: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Per row, buckets per unit of x (KNOT_BUCKETS over the row's range)."""
    return np.array([KNOT_BUCKETS / (row[count - 1] - row[0]) for row, count in zip(xs, n)])


def _check_sizes(count: int, prompt: np.ndarray, output: np.ndarray) -> None:
    if count > INT32_LIMIT or (len(prompt) and 2 * int(np.max(prompt + output)) > INT32_LIMIT):
        # 2x: recomputed tokens too
        raise ValueError("the compiled core holds request indices and token counts in 32 bits")


def _new_requests(workload: Workload) -> np.recarray:
    """Every request of the workload in its own slot."""
    _check_sizes(len(workload), workload.prompt_tokens, workload.output_tokens)
    requests = np.empty(len(workload), REQUEST).view(np.recarray)
    _fill(requests, 0, workload.arrival_s, workload.prompt_tokens, workload.output_tokens)
    return requests


def _fill(requests: np.recarray, first: int, arrival, prompt, output) -> None:
    """Requests `first`, `first` + 1, ... (in arrival order) into their slots."""
    _fill_requests(requests, first, np.ascontiguousarray(arrival, dtype=np.float64),
                   np.ascontiguousarray(prompt, dtype=np.int64),
                   np.ascontiguousarray(output, dtype=np.int64))


@_compiled
def _fill_requests(requests, first, arrival, prompt, output):
    """Every field of requests first, first + 1, ... in their slots, in one pass (numpy's
    field-by-field assignment of a large record array costs more than a tenth of a run)."""
    for i in range(len(arrival)):
        r = (first + i) % len(requests)
        request = requests[r]
        request.number = first + i
        request.arrival, request.prompt, request.output = arrival[i], prompt[i], output[i]
        request.reservation = prompt[i] + output[i]
        request.generated = 0
        request.prompt_machine = request.token_machine = NONE
        request.queue_next = request.batch_next = NONE
        request.finish_tick = 0
        request.heap_child = request.heap_sibling = NONE
        request.first_token = request.finish = request.last_token = np.nan
        request.kv_transfer = 0.0
        request.prefill = prompt[i]
        request.kv_from = NONE
        request.from_epoch = request.token_epoch = request.recover_kind = 0
        request.lost_at = -1.0
        request.ready_at = 0.0
        request.recoveries = request.recomputed = request.emitted = 0
        request.recovery_s = 0.0
        request.prefilled = request.piece = 0


def _new_pools(machines: np.recarray) -> np.ndarray:
    # the distinct capacities, sorted (np.unique would import numpy.ma: 15-40 ms of start-up)
    capacities = np.array(sorted(set(machines.capacity.tolist())), dtype=np.int64)
    machines.capacity_class = np.searchsorted(capacities, machines.capacity)
    trees = TREE_PROMPT_COMMITTED + 2 * len(capacities)
    leaves = 1 << max(0, int(len(machines) - 1).bit_length())
    if len(machines) > MACHINE_MASK:
        raise ValueError(f"the compiled core ranks at most {MACHINE_MASK} machines")
    pools = Pools(np.full((trees, 2 * leaves), EMPTY, np.int64),
                  np.zeros(len(machines), np.int64), np.zeros(1, np.int64))
    _fill_pools(pools, machines)
    return pools


@_compiled
def _fill_pools(pools, machines):
    for m in range(len(machines)):
        _refresh(pools, machines, m, CHANGED_ALL)


def _new_machines(m: MachineArrays) -> np.recarray:
    machines = np.zeros(m.count, MACHINE).view(np.recarray)
    machines.role, machines.kind, machines.capacity = m.role, m.kind, m.kv_capacity
    machines.link, machines.visible = m.link_bytes_per_s, m.layerwise_visible_s
    for link in ("prompt_head", "prompt_tail", "wait_head", "wait_tail", "running_root",
                 "batch_head", "fresh_head", "silent_head"):
        machines[link] = NONE
    return machines


def _new_heap(capacity: int) -> Heap:
    return Heap(np.zeros(capacity), np.zeros(capacity, np.int64), np.zeros(1, np.int64))


def _new_failures(m: MachineArrays, n: int) -> Failures:
    schedule = np.ascontiguousarray(m.failures, dtype=np.float64).reshape(-1, 3)
    ends = schedule[:, 0] + schedule[:, 2]
    finite = np.isfinite(ends)
    repairs = np.stack([ends[finite], schedule[finite, 1]], axis=1).reshape(-1, 2)
    repairs = np.ascontiguousarray(repairs[np.lexsort((repairs[:, 1], repairs[:, 0]))])
    peer = (np.full(m.count, NONE, np.int64) if m.replica_peer is None
            else np.ascontiguousarray(m.replica_peer, dtype=np.int64))
    size = n if len(schedule) else 0
    return Failures(schedule, repairs, peer,
                    _new_heap(size),
                    np.zeros(2, np.int64))


def _new_settings(m: MachineArrays) -> Settings:
    # Each field cast to one type: the install-time build is compiled for exactly these.
    return Settings(int(m.kv_bytes_per_token), int(m.layers), bool(m.mixed_pool),
                    int(m.prompt_token_limit), int(m.queue_threshold),
                    int(m.layerwise_min_prompt_tokens), float(m.detection_s),
                    bool(m.replicate), int(m.chunk_tokens), bool(m.regenerate))


def run_arguments(m: MachineArrays, requests: np.recarray) -> tuple:
    """The event loop's arguments: the request records given and fresh structures (running
    to the end: `until` INF)."""
    slots, machines = len(requests), _new_machines(m)
    return (requests, machines, _stacked_curves(m.curves), _new_settings(m), _new_heap(slots),
            _new_heap(m.count + 2 * slots), _new_pools(machines),  # + cut runs' ends (_cut_run)
            Touched(np.zeros(m.count, np.int64), np.zeros(1, np.int64)),
            _new_failures(m, slots),
            Resizes(np.ascontiguousarray(m.resizes, dtype=np.float64).reshape(-1, 3),
                    np.zeros(1, np.int64)),
            np.zeros(ITL_BINS, np.int64),
            Progress(np.zeros(3, np.int64), np.zeros(1)), INF)


def _column(records, name):  # counts and indices as int64, whatever the record holds
    values = records[name]
    return np.ascontiguousarray(values, dtype=np.int64 if values.dtype.kind == "i" else None)


def _machine_results(arguments: tuple) -> dict:
    machines = arguments[1]
    return {"busy_s": _column(machines, "busy_s"), "iterations": _column(machines, "iterations"),
            "batch_size_sum": _column(machines, "batch_size_sum"),
            "max_memory_tokens": _column(machines, "max_memory"),
            "mixed_pool_s": _column(machines, "mixed_s"),
            "prompt_chunks": _column(machines, "prompt_chunks"),
            "chunked_prefill_s": _column(machines, "chunked_prefill_s"),
            "itl_histogram": arguments[ARGUMENT_GAPS],
            "end_s": np.float64(arguments[ARGUMENT_PROGRESS].clock[0])}  # the last instant


ARGUMENT_GAPS, ARGUMENT_PROGRESS, ARGUMENT_UNTIL = 10, 11, 12


def simulate_fast(workload: Workload, m: MachineArrays) -> dict:
    """Run the compiled core; returns the same dictionary as the reference simulator."""
    arguments = run_arguments(m, _new_requests(workload))
    arguments[ARGUMENT_PROGRESS].counts[1] = len(workload)
    if _run(*arguments) != RUN_DONE:
        raise Stalled("simulation stalled with unfinished requests")
    requests = arguments[0]
    return {"first_token_s": _column(requests, "first_token"),
            "finish_s": _column(requests, "finish"),
            "prompt_machine": _column(requests, "prompt_machine"),
            "token_machine": _column(requests, "token_machine"),
            "kv_transfer_s": _column(requests, "kv_transfer"),
            **_machine_results(arguments),
            **({} if not len(m.failures) else {
                "recoveries": _column(requests, "recoveries"),
                "recomputed_tokens": _column(requests, "recomputed"),
                "recovery_s": _column(requests, "recovery_s")})}


class TooManyInFlight(RuntimeError):
    """A streamed run needed a slot whose request had not finished."""


def run_streamed(m: MachineArrays, chunks, slots: int, harvest) -> dict:
    """Run the compiled core over arrivals given chunk by chunk, keeping `slots` request records
    instead of one per request: the same run as `simulate_fast` on all the chunks' requests
    at once (the same instants, in the same order: requests are ordered by their number, not
    their slot), in memory that does not grow with the run.

    `chunks` yields (arrival_s, prompt_tokens, output_tokens) arrays, arrivals in order across
    chunks, each chunk at most slots // 2 requests. Request g (numbered in arrival order) lives
    in slot g % slots; before a slot is filled again, its finished request is handed over:
    `harvest(first, records)` gets requests first, first + 1, ... (a record array view, read
    it before returning) in order, every request exactly once. Raises TooManyInFlight when a
    request still holds its slot when it is needed (slots arrivals after it), Stalled when the
    run stalls. Returns the machine statistics and the ITL histogram (`simulate_fast`'s keys
    but the per-request ones)."""
    arguments = list(run_arguments(m, np.empty(slots, REQUEST).view(np.recarray)))
    requests, progress = arguments[0], arguments[ARGUMENT_PROGRESS]
    handed = 0

    def hand_over(upto: int) -> None:
        nonlocal handed
        while handed < upto:
            start = handed % slots
            stop = min(slots, start + upto - handed)
            records = requests[start:stop]
            if np.isnan(records.finish).any():
                raise TooManyInFlight(
                    f"a request was still in flight {slots:,} arrivals after it arrived")
            harvest(handed, records)
            handed += stop - start

    pending = None
    for chunk in chunks:
        if pending is not None:
            arguments[ARGUMENT_UNTIL] = float(chunk[0][0]) if len(chunk[0]) else INF
            _advance(arguments, pending, hand_over, slots)
        pending = chunk
    if pending is not None:
        arguments[ARGUMENT_UNTIL] = INF
        _advance(arguments, pending, hand_over, slots)
    hand_over(int(progress.counts[1]))
    return _machine_results(arguments)


def _advance(arguments: list, chunk, hand_over, slots: int) -> None:
    """Fill a chunk's requests into their slots (handing over the finished ones they replace),
    then run up to `until`."""
    arrival, prompt, output = chunk
    if len(arrival) > slots // 2:
        raise ValueError(f"a chunk of {len(arrival):,} requests is more than half the "
                         f"{slots:,} slots")
    progress = arguments[ARGUMENT_PROGRESS]
    filled = int(progress.counts[1])
    _check_sizes(filled + len(arrival), prompt, output)
    hand_over(filled + len(arrival) - slots)
    _fill(arguments[0], filled, arrival, prompt, output)
    progress.counts[1] = filled + len(arrival)
    if _run(*arguments) == RUN_STALLED:
        raise Stalled("simulation stalled with unfinished requests")


if _AOT is not None:  # the same entry points, compiled at install
    _fill_requests, _fill_pools, _run = (getattr(_AOT, name) for name in ENTRY_POINTS)
