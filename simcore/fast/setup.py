"""A run's State built from a cluster's arrays (`simcore.cluster.MachineArrays`): the
request and machine records, the curves padded into 2-D arrays, the heaps, the routing pools,
the failure schedule, the resizes; the two compiled set-up entry points (`_fill_requests`,
`_fill_pools`) and the one that reads a finished run's results out (`_result_columns`).
`new_state` gives a State ready for `_run(state, until)`.

Compiles the reference's `__init__` (its requests and machines).
"""
from __future__ import annotations

import weakref

import numpy as np

from simcore.cluster import (ITL_BINS, MachineArrays, Stalled, host_cache_blocks,
                             host_link_integers)
from simcore.workload import Workload
from .compiler import AOT, ENTRY_POINTS, _compiled
from .records import (
    CHANGED_ALL, Closed, Curves, EMPTY, FREE, Failures, HOST_BLOCKS, HOST_HITS, HOST_LINK, Heap,
    INF, KV_BYTES, LOAD_TOKENS, INT32_LIMIT, KNOT_BUCKETS, MACHINE,
    MACHINE_MASK, NONE, Pools, Prefix, Progress, REQUEST, RUN_DONE, RUN_STALLED, Resizes, Settings, State,
    TREE_PROMPT_COMMITTED, Touched)
from .pools import _refresh
from .loop import _run


def _stack_curves(curves) -> Curves:
    """Pad every SKU's knots into 2-D arrays (numba wants uniform arrays), with lengths."""
    k = len(curves)
    pmax = max(len(c.prompt_tokens) for c in curves)
    dmax = max(len(c.decode_batch) for c in curves)
    px, py = np.zeros((k, pmax)), np.zeros((k, pmax))
    dx, dy = np.zeros((k, dmax)), np.zeros((k, dmax))
    pn, dn = np.zeros(k, np.int64), np.zeros(k, np.int64)
    ctx, attention, kv_read, mixed = np.zeros(k), np.zeros(k), np.zeros(k), np.ones(k)
    per_iteration, per_sequence, overlap = np.zeros(k), np.zeros(k), np.zeros(k, np.bool_)
    decode_q = np.ones(k, np.int64)
    for i, c in enumerate(curves):
        pn[i], dn[i] = len(c.prompt_tokens), len(c.decode_batch)
        px[i, :pn[i]], py[i, :pn[i]] = c.prompt_tokens, c.prompt_seconds
        dx[i, :dn[i]], dy[i, :dn[i]] = c.decode_batch, c.decode_seconds
        ctx[i] = c.context_seconds_per_token
        attention[i], kv_read[i] = c.chunk_attention_s, c.chunk_kv_read_s
        mixed[i] = c.mixed_prompt_factor
        per_iteration[i], per_sequence[i] = c.iteration_overhead_s, c.sequence_overhead_s
        overlap[i] = c.overlap_host
        decode_q[i] = c.decode_query_tokens
    return Curves(px, py, pn, dx, dy, dn, ctx, attention, kv_read, mixed, _bucket_starts(px, pn),
                  _bucket_starts(dx, dn), _bucket_scales(px, pn), _bucket_scales(dx, dn),
                  per_iteration, per_sequence, overlap, decode_q)


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


def _new_requests(workload: Workload, steps=None) -> np.recarray:
    """Every request of the workload in its own slot; `steps` as `simulate_fast` takes it."""
    requests = np.empty(len(workload), REQUEST).view(np.recarray)
    _fill_requests(requests, 0, *_request_arrays(workload, steps))
    return requests


# A search runs each workload sample on many clusters (32 samples for 176 simulations in a
# 3-design search): the arrays `_fill_requests` reads are checked and built once per sample
# (and speculative decoding plan, the entry holding it), while the sample lives.
_REQUEST_ARRAYS: "weakref.WeakKeyDictionary[Workload, tuple]" = weakref.WeakKeyDictionary()


def _request_arrays(workload: Workload, steps) -> tuple:
    known = _REQUEST_ARRAYS.get(workload)
    if known is None or known[0] is not steps:
        _check_sizes(len(workload), workload.prompt_tokens, workload.output_tokens)
        arrival = workload.arrival_s if workload.closed is None else _closed_arrivals(workload)
        known = _REQUEST_ARRAYS[workload] = (steps, _fill_arrays(
            arrival, workload.prompt_tokens, workload.output_tokens, steps))
    return known[1]


def _fill(requests: np.recarray, first: int, arrival, prompt, output, steps=None) -> None:
    """Requests `first`, `first` + 1, ... (in arrival order) into their slots."""
    _fill_requests(requests, first, *_fill_arrays(arrival, prompt, output, steps))


def _fill_arrays(arrival, prompt, output, steps) -> tuple:
    """`_fill_requests`'s arrays: arrival, prompt, output (decode steps), reservation and
    context rate of each request."""
    prompt = np.ascontiguousarray(prompt, dtype=np.int64)
    output = np.ascontiguousarray(output, dtype=np.int64)
    if steps is None:
        units, reserve, rate = output, prompt + output, np.ones_like(prompt)
    else:
        units, reserve, rate = (np.ascontiguousarray(a, dtype=np.int64) for a in steps[:3])
    return np.ascontiguousarray(arrival, dtype=np.float64), prompt, units, reserve, rate


@_compiled
def _fill_requests(requests, first, arrival, prompt, output, reserve, rate):
    """Every field of requests first, first + 1, ... in their slots, in one pass (numpy's
    field-by-field assignment of a large record array costs more than a tenth of a run)."""
    for i in range(len(arrival)):
        r = (first + i) % len(requests)
        request = requests[r]
        request.number = first + i
        request.arrival, request.prompt, request.output = arrival[i], prompt[i], output[i]
        request.reservation = reserve[i]
        request.context_rate = rate[i]
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


@_compiled
def _result_columns(requests, times, machines_of):
    """A finished run's per-request results, in one pass over the records: times[0], [1],
    [2] its first token, finish and KV transfer; machines_of[0], [1] its prompt and token
    machine. (Five strided copies read every record five times: 0.09 s of a run of 840k
    requests, where a record is 160 bytes.)"""
    for r in range(len(requests)):
        request = requests[r]
        times[0, r] = request.first_token
        times[1, r] = request.finish
        times[2, r] = request.kv_transfer
        machines_of[0, r] = request.prompt_machine
        machines_of[1, r] = request.token_machine


def _new_pools(machines: np.recarray) -> np.ndarray:
    fields = machines.view(np.ndarray)   # (a record array's attributes cost more than fields)
    # the distinct capacities, sorted (np.unique would import numpy.ma: 15-40 ms of start-up)
    capacities = np.array(sorted(set(fields["capacity"].tolist())), dtype=np.int64)
    fields["capacity_class"] = np.searchsorted(capacities, fields["capacity"])
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
    machines = np.zeros(m.count, MACHINE)   # filled by field, then seen as records
    machines["role"], machines["kind"], machines["capacity"] = m.role, m.kind, m.kv_capacity
    machines["context_units"] = 1   # (speculative decoding: `simulate_fast` sets its units)
    machines["link"], machines["visible"] = m.link_bytes_per_s, m.layerwise_visible_s
    machines["watermark"] = m.kv_watermark_tokens()
    for link in ("prompt_head", "prompt_tail", "wait_head", "wait_tail", "running_root",
                 "batch_head", "fresh_head", "silent_head", "run_first", "run_last"):
        machines[link] = NONE
    return machines.view(np.recarray)


def _fresh_machines(m: MachineArrays) -> tuple[np.recarray, Pools]:
    """New machine records and routing pools of `m`, copied from ones built once per `m` (a
    search runs a cluster on up to 20 samples, its arrays the same object: `simcore.simulate`
    keeps them): copying them costs a tenth of filling the records field by field."""
    known = _FRESH_MACHINES.get(m)
    if known is None:
        machines = _new_machines(m)
        known = _FRESH_MACHINES[m] = (machines, _new_pools(machines))
    machines, pools = known
    return machines.copy(), Pools(*(array.copy() for array in pools))


_FRESH_MACHINES: "weakref.WeakKeyDictionary[MachineArrays, tuple]" = weakref.WeakKeyDictionary()


def _new_heap(capacity: int) -> Heap:
    return Heap(np.zeros(capacity), np.zeros(capacity, np.int64), np.zeros(1, np.int64))


def _new_failures(m: MachineArrays, n: int) -> Failures:
    schedule = np.ascontiguousarray(m.failures, dtype=np.float64).reshape(-1, 3)
    repairs = _repairs(schedule) if len(schedule) else np.zeros((0, 2))
    peer = (np.full(m.count, NONE, np.int64) if m.replica_peer is None
            else np.ascontiguousarray(m.replica_peer, dtype=np.int64))
    size = n if len(schedule) else 0
    return Failures(schedule, repairs, peer,
                    _new_heap(size),
                    np.zeros(2, np.int64))


def _repairs(schedule: np.ndarray) -> np.ndarray:
    """Rows (time_s, instance) of the failures' repairs, by time then instance (a failure
    forever has none)."""
    ends = schedule[:, 0] + schedule[:, 2]
    finite = np.isfinite(ends)
    repairs = np.stack([ends[finite], schedule[finite, 1]], axis=1).reshape(-1, 2)
    return np.ascontiguousarray(repairs[np.lexsort((repairs[:, 1], repairs[:, 0]))])


def _new_settings(m: MachineArrays, prefix_block: int = 0) -> Settings:
    # prefix_block > 0: prefix caching on (with blocks); prefix-aware routing only then
    # Each field cast to one type: the install-time build is compiled for exactly these.
    return Settings(int(m.kv_bytes_per_token), int(m.layers), bool(m.mixed_pool),
                    int(m.prompt_token_limit), int(m.queue_threshold),
                    int(m.layerwise_min_prompt_tokens), float(m.detection_s),
                    bool(m.replicate), int(m.chunk_tokens), bool(m.regenerate),
                    bool(m.kv_paged), int(m.kv_block_tokens), bool(m.prefill_first),
                    int(prefix_block), bool(prefix_block > 0 and m.prefix_routing))


def _new_prefix(m: MachineArrays, workload: Workload | None) -> Prefix:
    """The machines' prefix caches, empty: real ones when the option is on and the workload
    carries blocks, else one-slot placeholders (the same types, so one compiled core)."""
    if not prefix_on(m, workload):
        return empty_caches(m, 0, 0)
    offsets = np.ascontiguousarray(workload.prefix_offsets, dtype=np.int64)
    most = int(np.diff(offsets).max()) if len(offsets) > 1 else 0
    caches = empty_caches(m, int(workload.prefix_block_tokens), most, len(offsets) - 1,
                          int(offsets[-1]))
    caches.ids[:offsets[-1]] = workload.prefix_blocks
    caches.offsets[:, 0], caches.offsets[:, 1] = offsets[:-1], offsets[1:]
    return caches


def prefix_on(m: MachineArrays, workload: Workload | None) -> bool:
    return workload is not None and bool(m.prefix_cache) and workload.has_prefix_blocks


def cache_slots(m: MachineArrays, block: int, most: int) -> int:
    """The slots a machine's cache needs: the most blocks it holds after a trim (its whole KV
    capacity's, with nothing held, plus its host tier's), plus one request's blocks (`most`):
    those an insertion or a seed adds before it trims."""
    hbm = int(np.asarray(m.kv_capacity, np.int64).max()) // block if m.count else 0
    return hbm + host_cache_blocks(m, block) + most + 1


def empty_caches(m: MachineArrays, block: int, most: int, rows: int = 1,
                 ids: int = 1) -> Prefix:
    """Every machine's cache, empty, for blocks of `block` tokens and requests of at most
    `most` blocks (`block` 0: the cache is off, one-slot placeholders); room for the block ids
    of `rows` requests (one row per request slot) and a ring of at least `ids` ids
    (records.Prefix), all zero."""
    ring = 1 << max(0, (max(ids, 1) - 1).bit_length())  # a power of two
    count, slots = (m.count, cache_slots(m, block, most)) if block else (1, 1)
    # a power of two >= 4 x slots: a quarter full at most, so probes stay short
    table = 1 << max(1, (4 * slots - 1).bit_length())
    ends = np.full((count, FREE + 1), NONE, np.int64)
    ends[:, 2] = ends[:, 5] = ends[:, LOAD_TOKENS] = ends[:, HOST_HITS] = 0
    ends[:, HOST_BLOCKS], ends[:, KV_BYTES], ends[:, HOST_LINK] = 0, 0, 1
    ends[:, FREE] = 0
    if block and host_cache_blocks(m, block) > 0:
        ends[:, HOST_BLOCKS] = host_cache_blocks(m, block)
        ends[:, KV_BYTES] = m.kv_bytes_per_token
        ends[:, HOST_LINK] = host_link_integers(m)
    chain = np.tile(np.arange(1, slots + 1, dtype=np.int32), (count, 1))
    chain[:, -1] = NONE  # the free list: every slot, in order
    return Prefix(np.zeros(ring, np.int64), np.zeros((max(rows, 1), 4), np.int64),
                  np.full((count, slots), NONE, np.int64),
                  np.full((count, slots), NONE, np.int32), chain,
                  np.zeros((count, slots), np.int8), np.full((count, table), NONE, np.int64),
                  np.full((count, table), NONE, np.int32), ends)


def _new_closed(workload: Workload | None) -> Closed:
    """A closed loop's users, think times and empty heap of pending arrivals; an open loop's
    placeholders (users 0; the same types, so one compiled core)."""
    loop = None if workload is None else workload.closed
    if loop is None:
        return Closed(0, np.zeros(0), _new_heap(0))
    return Closed(int(loop.users), np.ascontiguousarray(loop.think_s, dtype=np.float64),
                  _new_heap(int(loop.users)))


def _closed_arrivals(workload: Workload) -> np.ndarray:
    """A closed loop's arrivals as filled: its first N requests at 0, the others not yet known
    (INF: the loop copies each one's time from the pending users when it is next)."""
    arrival = np.full(len(workload), INF)
    arrival[:workload.closed.users] = 0.0
    return arrival


def new_state(m: MachineArrays, requests: np.recarray, workload: Workload | None = None,
              caches: Prefix | None = None, cache_block: int = 0) -> State:
    """The request records given and fresh structures: a State for `_run(state, until)`.
    `workload`: the run's, for its prompt blocks (prefix caching; None: off) and its closed
    loop (None: open); or, for a streamed run, `caches` (`empty_caches`) for blocks of
    `cache_block` tokens, the blocks filled chunk by chunk."""
    slots, (machines, pools) = len(requests), _fresh_machines(m)
    prefix = _new_prefix(m, workload) if caches is None else caches
    block = (int(workload.prefix_block_tokens) if prefix_on(m, workload) else
             int(cache_block))
    return State(requests, machines, _stacked_curves(m.curves), _new_settings(m, block),
                 _new_heap(slots),
                 _new_heap(m.count + 2 * slots),  # + cut runs' ends (decode_runs._cut_run)
                 pools,
                 Touched(np.zeros(m.count, np.int64), np.zeros(1, np.int64)),
                 _new_failures(m, slots),
                 Resizes(np.ascontiguousarray(m.resizes, dtype=np.float64).reshape(-1, 3),
                         np.zeros(1, np.int64)),
                 np.zeros(ITL_BINS, np.int64),
                 np.zeros((m.count, int(m.kv_block_tokens) if m.kv_paged else 1), np.int64),
                 Progress(np.zeros(3, np.int64), np.zeros(1)), prefix, _new_closed(workload))


def _column(records, name):  # counts and indices as int64, whatever the record holds
    values = records[name]
    return np.ascontiguousarray(values, dtype=np.int64 if values.dtype.kind == "i" else None)


def _fields(records: np.recarray) -> np.ndarray:
    """The records as a plain structured array: the same memory, whose fields read without
    the record array's per-access Python (thirteen columns a run)."""
    return records.view(np.ndarray)


def _machine_results(state: State) -> dict:
    machines = _fields(state.machines)
    return {"busy_s": _column(machines, "busy_s"), "iterations": _column(machines, "iterations"),
            "batch_size_sum": _column(machines, "batch_size_sum"),
            "max_memory_tokens": _column(machines, "max_memory"),
            "mixed_pool_s": _column(machines, "mixed_s"),
            "prompt_chunks": _column(machines, "prompt_chunks"),
            "chunked_prefill_s": _column(machines, "chunked_prefill_s"),
            **({} if not state.settings.kv_paged else {
                "preemptions": _column(machines, "preemptions")}),
            **({} if not state.settings.prefix_block else {
                "prefix_hit_tokens": _column(machines, "prefix_hits"),
                "prefix_tokens": _column(machines, "prefix_tokens")}),
            **({} if not state.prefix.ends[0, HOST_BLOCKS] else {
                "prefix_host_hit_tokens": np.ascontiguousarray(
                    state.prefix.ends[:, HOST_HITS])}),
            "itl_histogram": state.gaps,
            "end_s": np.float64(state.progress.clock[0])}  # the last instant


def simulate_fast(workload: Workload, m: MachineArrays, steps=None) -> dict:
    """Run the compiled core; returns the same dictionary as the reference simulator.
    `steps`: speculative decoding's per-request plan (`simcore.specdecode.step_plan`)."""
    if workload.closed is not None and (len(m.failures) or len(m.resizes)):
        raise ValueError("a closed loop runs without failures or pool resizes")
    state = new_state(m, _new_requests(workload, steps), workload)
    if steps is not None:   # (`_new_machines` gives every machine one unit)
        state.machines["context_units"] = steps[3]
    state.progress.counts[1] = len(workload)
    if _run(state, INF) != RUN_DONE:
        raise Stalled("simulation stalled with unfinished requests")
    return results(state, failures=len(m.failures) > 0)


def results(state: State, failures: bool) -> dict:
    """A finished run's results, as the reference simulator gives them (its failure keys only
    when the cluster had a failure schedule; the arrivals only in a closed loop, where the run
    makes them)."""
    requests = _fields(state.requests)
    times, machines_of = np.empty((3, len(requests))), np.empty((2, len(requests)), np.int64)
    _result_columns(state.requests, times, machines_of)
    return {**({} if state.closed.users == 0 else {"arrival_s": _column(requests, "arrival")}),
            "first_token_s": times[0], "finish_s": times[1],
            "prompt_machine": machines_of[0], "token_machine": machines_of[1],
            "kv_transfer_s": times[2],
            **_machine_results(state),
            **({} if not state.settings.prefix_block else {
                "request_hit_tokens": np.ascontiguousarray(state.prefix.offsets[:, 2]),
                "request_looked_up": np.ascontiguousarray(state.prefix.offsets[:, 3])}),
            **({} if not failures else {
                "recoveries": _column(requests, "recoveries"),
                "recomputed_tokens": _column(requests, "recomputed"),
                "recovery_s": _column(requests, "recovery_s")})}


class TooManyInFlight(RuntimeError):
    """A streamed run needed a slot whose request had not finished."""


def run_streamed(m: MachineArrays, chunks, slots: int, harvest, cache_block: int = 0,
                 cache_most: int = 0) -> dict:
    """Run the compiled core over arrivals given chunk by chunk, keeping `slots` request records
    instead of one per request: the same run as `simulate_fast` on all the chunks' requests
    at once (the same instants, in the same order: requests are ordered by their number, not
    their slot), in memory that does not grow with the run.

    `chunks` yields (arrival_s, prompt_tokens, output_tokens) arrays, arrivals in order across
    chunks, each chunk at most slots // 2 requests; under speculative decoding each chunk also
    carries its requests' step plan (`simcore.specdecode.step_plan`), as `simulate_fast` takes
    `steps` for a whole run (else None there). With prefix caching (`cache_block` > 0: blocks
    of that many tokens, and `m.prefix_cache`) each chunk then carries its requests' block ids
    and their offsets (as `Workload.prefix_blocks`, `prefix_offsets`: ids global to the run,
    at most `cache_most` a request); the caches carry over from chunk to chunk, the ids live
    in a ring that holds those of the requests not yet handed over (grown as needed).
    Request g (numbered in arrival order) lives in slot g % slots; before a slot is filled
    again, its finished request is handed over: `harvest(first, records)` gets requests
    first, first + 1, ... (a record array view, read it before returning) in order, every
    request exactly once (with the cache, also `hits`: per request, the tokens its lookups
    found cached and looked up, a view too). Raises TooManyInFlight when a request still
    holds its slot when it is needed (slots arrivals after it), Stalled when the
    run stalls. Returns the machine statistics and the ITL histogram (`simulate_fast`'s keys
    but the per-request ones)."""
    cached = bool(cache_block > 0 and m.prefix_cache)
    caches = empty_caches(m, cache_block, cache_most, slots) if cached else None
    state = new_state(m, np.empty(slots, REQUEST).view(np.recarray), None, caches,
                      cache_block if cached else 0)
    requests, progress = state.requests, state.progress
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
            if cached:  # and the tokens its lookups found cached and looked up
                harvest(handed, records, state.prefix.offsets[start:stop, 2:])
            else:
                harvest(handed, records)
            handed += stop - start

    pending = None
    for chunk in chunks:
        if pending is not None:
            state = _advance(state, pending, float(chunk[0][0]) if len(chunk[0]) else INF,
                             hand_over, cache_most if cached else -1)
        pending = chunk
    if pending is not None:
        state = _advance(state, pending, INF, hand_over, cache_most if cached else -1)
    hand_over(int(progress.counts[1]))
    return _machine_results(state)


def _advance(state: State, chunk, until: float, hand_over, most: int) -> State:
    """Fill a chunk's requests into their slots (handing over the finished ones they replace;
    `most` >= 0: with their block ids, at most `most` a request), then run up to `until`.
    Returns the state (a new one when the ids' ring grew)."""
    arrival, prompt, output = chunk[:3]
    steps = chunk[3] if len(chunk) > 3 else None   # (speculative decoding's plan)
    if steps is not None:
        state.machines.context_units[:] = steps[3]   # (the plan's units, as simulate_fast)
    slots = len(state.requests)
    if len(arrival) > slots // 2:
        raise ValueError(f"a chunk of {len(arrival):,} requests is more than half the "
                         f"{slots:,} slots")
    progress = state.progress
    filled = int(progress.counts[1])
    _check_sizes(filled + len(arrival), prompt, output)
    hand_over(filled + len(arrival) - slots)
    if most >= 0:
        state = _fill_blocks(state, filled, chunk[4], chunk[5], most)
    _fill(state.requests, filled, arrival, prompt, output, steps)
    progress.counts[1] = filled + len(arrival)
    if _run(state, until) == RUN_STALLED:
        raise Stalled("simulation stalled with unfinished requests")
    return state


def _fill_blocks(state: State, first: int, ids, offsets, most: int) -> State:
    """Requests first, first + 1, ...'s block ids into the ring after the last request's, and
    their rows of offsets. The ring keeps the ids of every request not handed over (they may
    still be looked up): grown, in order, when the new ids would reach them."""
    prefix, slots = state.prefix, len(state.requests)
    offsets = np.asarray(offsets, np.int64)
    if len(offsets) > 1 and int(np.diff(offsets).max()) > most:
        raise ValueError(f"a request of more than {most} prompt blocks")
    end = int(prefix.offsets[(first - 1) % slots, 1]) if first else 0
    live = first + len(offsets) - 1 - slots  # the oldest request not handed over
    oldest = int(prefix.offsets[live % slots, 0]) if live >= 0 else 0
    need = end + int(offsets[-1]) - oldest
    ring = prefix.ids
    if need > len(ring):
        grown = np.zeros(1 << (need - 1).bit_length(), np.int64)
        live = np.arange(oldest, end)
        grown[live & (len(grown) - 1)] = ring[live & (len(ring) - 1)]
        prefix = prefix._replace(ids=grown)
        state = state._replace(prefix=prefix)
    mask = len(prefix.ids) - 1
    prefix.ids[(end + np.arange(offsets[-1])) & mask] = ids
    rows = (first + np.arange(len(offsets) - 1)) % slots
    prefix.offsets[rows, 0], prefix.offsets[rows, 1] = end + offsets[:-1], end + offsets[1:]
    prefix.offsets[rows, 2:] = 0
    return state


if AOT is not None:  # the same entry points, compiled at install (see simcore.aot)
    _fill_requests, _fill_pools, _run, _result_columns = (getattr(AOT, name)
                                                          for name in ENTRY_POINTS)

