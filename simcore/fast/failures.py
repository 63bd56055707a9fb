"""Failures: (2a) repairs, (2b) failures, by machine index, (2c) lost requests acted
on at their detection, by request; and the requests' losses and recoveries (restart through the
router, or the KV cache resent from its prompt machine or restored from a replica). Only run when
the schedule has rows; the semantics are the reference's (`simcore.refsim`).

Compiles the reference's `_failure_steps`, `_fail`, `_lose`, `_recovered`, `_recover`, `_defer`
and `_next_repair`.
"""
from __future__ import annotations

from simcore.cluster import ROLE_BOTH
from .compiler import _compiled, _inlined
from .records import CHANGED_ALL, CHANGED_COMMITTED, INF, NONE, RESTART, RESTORE, RETARGET
from .latency import _kv_transfer
from .structures import _heap_pop, _heap_push, _heapify, _kv_tokens, _pop_running
from .pools import _refresh
from .routing import _choose_token_machine, _least_loaded, _leave_mixed_if_done, _route
from .prefix import _clear_cache


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
def _failure_due(failures, now):
    """A repair, a failure or a lost request is due now (checked inline: most instants have
    none, and the call below costs more than these comparisons)."""
    nxt = failures.next
    return ((nxt[0] < len(failures.schedule) and failures.schedule[nxt[0], 0] == now)
            or (nxt[1] < len(failures.repairs) and failures.repairs[nxt[1], 0] == now)
            or (failures.recover.size[0] > 0 and failures.recover.key[0] == now))


@_compiled
def _fail(state, m, now):
    """Machine m fails: its iteration in flight and every request whose work or KV it held are
    lost (acted on at detection); it leaves every routing tree."""
    requests, machines, settings = state.requests, state.machines, state.settings
    kv_arrivals, busy_heap, pools = state.kv_arrivals, state.busy_heap, state.pools
    failures = state.failures
    machine = machines[m]
    machine.down = True
    machine.epoch += 1
    machine.detect_at = now + settings.detection
    at = machine.detect_at
    if settings.prefix_block > 0:  # its prefix cache is lost with its memory
        _clear_cache(state.prefix, m)
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
    machine.run_first = machine.run_last = NONE  # (paged KV: their order, residues)
    state.residues[m, :] = 0
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
    machine.running_rate = 0
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
def _recover(state, r, now):
    """Act on a lost request at its detection: restart it through the router, or send its KV
    (held on its prompt machine, or a replica) to a token machine chosen as on arrival."""
    requests, machines, settings = state.requests, state.machines, state.settings
    kv_arrivals, pools, failures = state.kv_arrivals, state.pools, state.failures
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
            request.recomputed += max(_kv_tokens(request, request.emitted) - 1,
                                      request.prompt)  # (its tokens, steps accepted)
            request.generated = 0
        elif request.prompt_machine != NONE:
            request.prefill = _kv_tokens(request, request.generated)
            request.recomputed += request.prefill
        request.prompt_machine = request.token_machine = NONE
        if not _route(state, r, now):
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
        due = now + _kv_tokens(request, request.generated) * settings.kv_bytes / link
    _heap_push(kv_arrivals, due, request.number)


@_compiled
def _failure_steps(state, now):
    """(2a) repairs, (2b) failures, by machine index; (2c) lost requests, by request."""
    requests, machines, pools = state.requests, state.machines, state.pools
    failures = state.failures
    nxt = failures.next
    while nxt[1] < len(failures.repairs) and failures.repairs[nxt[1], 0] == now:
        _repair(machines, pools, int(failures.repairs[nxt[1], 1]), now)
        nxt[1] += 1
    while nxt[0] < len(failures.schedule) and failures.schedule[nxt[0], 0] == now:
        _fail(state, int(failures.schedule[nxt[0], 1]), now)
        nxt[0] += 1
    recover = failures.recover
    while recover.size[0] > 0 and recover.key[0] == now:
        r = _heap_pop(recover) % len(requests)
        _recover(state, r, now)
