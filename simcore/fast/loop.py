"""The event loop: `_run(state, until)` over every instant before `until`.

Each event time runs the reference simulator's steps in its order: (1) iterations that end, by
machine index (from the busy heap keyed (time, machine)); (2) KV caches that arrive, by (time,
request), then (2r) pool resizes and (2a-c) failures; (3) requests that arrive, routed at once;
(4) idle machines with work start their next iteration, by machine index. Chunk-run ends and
the stale ends of cut decode runs are settled off the busy heap before the next instant, so they
make no instant of their own.

Compiles the reference's `run` and `_next_event_time`.
"""
from __future__ import annotations

from .compiler import _compiled, _inlined
from .records import INF, RESTART, RUN_DONE, RUN_PAUSED, RUN_STALLED
from .structures import _heap_pop
from .routing import _route
from .chunks import _apply_chunk_end, _is_chunk_end
from .failures import _failure_due, _failure_steps, _lose, _next_failure_step, _next_repair
from .resizes import _resize_steps
from .steps import _deliver_kv, _end_iteration, _start_touched


@_inlined
def _next_other_event(state, next_arrival, next_slot, filled):
    """Earliest KV arrival, request arrival, pool resize, failure, repair or lost request to
    act on; INF when nothing is left."""
    requests, kv_arrivals, failures = state.requests, state.kv_arrivals, state.failures
    resizes = state.resizes
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
def _next_user_arrival(state, next_arrival, next_slot, filled):
    """Closed loop: the next request to arrive, past the users' first ones, comes when the
    earliest pending user sends it; its record's arrival is made that time (INF: no user
    pending), so the loop reads arrivals as in an open loop. Only requests finish in (1) send
    users (a chunk-run end finishes none: `_settle_busy_heap`), so this is called before (3)
    and after each arrival."""
    closed = state.closed
    if closed.users <= next_arrival < filled:
        pending = closed.pending
        state.requests[next_slot].arrival = pending.key[0] if pending.size[0] > 0 else INF


@_inlined
def _is_current_end(machine, at):
    """A busy-heap entry (at, machine) ends the iteration or run in flight, not a cut run (nor
    one already ended at this instant) nor an iteration of a chunk run before its last."""
    return machine.busy and machine.busy_until == at and machine.chunk_left == 0


@_inlined
def _settle_busy_heap(state, until):
    """Before the next instant: pop the old ends of cut runs off the top of the busy heap, and
    apply the chunk-run ends at its top up to `until`, the next other event, so that neither
    makes an instant of its own (an instant where nothing happens, at the cost of all four
    steps). Returns how many requests finished. (None, in fact: a chunk run has no running
    decode, `_start_chunk_run`; so in a closed loop no user is sent here, before `until`.)"""
    machines, busy_heap = state.machines, state.busy_heap
    finished = 0
    while busy_heap.size[0] > 0:
        m, at = busy_heap.item[0], busy_heap.key[0]
        chunk_end = _is_chunk_end(machines[m], at)
        if _is_current_end(machines[m], at) or (chunk_end and at > until):
            break
        _heap_pop(busy_heap)
        if chunk_end:
            finished += _apply_chunk_end(state, m)
    return finished


@_compiled
def _run(state, until):
    """The event loop, from where `progress` left it, over every instant before `until` (INF:
    to the end). Requests are numbered in arrival order; request g is in slot g % slots of
    `requests` (all of them in one run; see `run_streamed` for fewer). Returns RUN_PAUSED (the
    next instant is at or after `until`), RUN_DONE (every request filled has finished) or
    RUN_STALLED (unfinished requests, nothing left to happen)."""
    requests, machines, busy_heap = state.requests, state.machines, state.busy_heap
    failures, resizes, progress = state.failures, state.resizes, state.progress
    slots = len(requests)
    counts = progress.counts   # [next arrival, requests filled, requests finished]
    next_arrival, filled, finished = counts[0], counts[1], counts[2]
    next_slot = next_arrival % slots   # its slot, kept in step (no division per event)
    end_time = progress.clock[0]
    failing = len(failures.schedule) > 0
    users = state.closed.users
    closed = users > 0   # a closed loop: see _next_user_arrival
    status = RUN_DONE
    while True:
        if finished == filled and until == INF:
            break
        now = _next_other_event(state, next_arrival, next_slot, filled)
        if until < now:  # (chunk ends are applied up to the next instant only: see _settle)
            now = until
        finished += _settle_busy_heap(state, now)
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
                finished += _apply_chunk_end(state, m)
            elif _is_current_end(machines[m], now):
                finished += _end_iteration(state, m, now)
        _deliver_kv(state, now)  # (2)
        if resizes.next[0] < len(resizes.rows) and resizes.rows[resizes.next[0], 0] == now:
            _resize_steps(state, now)
        if failing and _failure_due(failures, now):
            _failure_steps(state, now)
        if closed:  # (requests that finished in (1) may have sent users' requests now)
            _next_user_arrival(state, next_arrival, next_slot, filled)
        while next_arrival < filled and requests[next_slot].arrival == now:  # (3)
            r = next_slot
            if closed and next_arrival >= users:  # its user is no longer pending
                _heap_pop(state.closed.pending)
            if not _route(state, r, now):
                _lose(requests, failures, r, RESTART, now, _next_repair(failures))
            next_arrival += 1
            next_slot = 0 if next_slot + 1 == slots else next_slot + 1
            if closed:
                _next_user_arrival(state, next_arrival, next_slot, filled)
        # (4); a decode-only run ends by the next failure step (see _start_decode_run)
        _start_touched(state, now, _next_failure_step(failures) if failing else INF)
    counts[0], counts[2] = next_arrival, finished
    progress.clock[0] = end_time
    if status == RUN_DONE:
        for m in range(len(machines)):  # close the mixed-pool stays still open
            if machines[m].in_mixed:
                machines[m].mixed_s += end_time - machines[m].mixed_since
    return status
