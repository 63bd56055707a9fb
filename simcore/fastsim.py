"""Fast simulator core: the reference semantics (see `simcore.refsim`) compiled with numba.

The state is one record per request and one per machine (numpy record arrays of `REQUEST` and
`MACHINE`), so a helper takes a machine and reads `machine.pending`, as the reference simulator
does. Records rather than namedtuples of arrays: numba reference-counts every array a compiled
function receives, which made helpers that take a dozen arrays 3-28x slower. Queues are
intrusive linked lists threaded through the request records, so every queue operation is O(1);
the running decodes' forward links live in their own array, `running_next`, because every decode
iteration walks them and 8 bytes per request keep that walk in cache (about 15% on conversation).
The steps of the event loop are inlined into it (inline='always': a call costs reference counting
of its array arguments, about 20% here). The loop is cached on disk after the first call; with
PROVISION_NO_JIT=1, or without numba, the same code runs as plain Python (slow, but identical).

Each event time runs the reference simulator's steps in its order: (1) iterations that end, by
machine index; (2) KV caches that arrive, by (time, request); (3) requests that arrive, routed at
once; (4) idle machines with work start their next iteration, by machine index. The next event
time and routing scan all machines.
"""
from __future__ import annotations

import os
from collections import namedtuple

import numpy as np

from simcore.cluster import ROLE_BOTH, ROLE_PROMPT, ROLE_TOKEN, MachineArrays
from simcore.workload import Workload

try:
    if os.environ.get("PROVISION_NO_JIT"):
        raise ImportError
    from numba import njit
    JIT = True
except ImportError:  # pragma: no cover - exercised with PROVISION_NO_JIT=1
    JIT = False

    def njit(*args, **kwargs):
        if args and callable(args[0]):
            return args[0]
        return lambda f: f

NONE = -1
INF = np.inf

REQUEST = np.dtype([
    # the fields a decode step touches first (one cache line)
    ("prompt", np.int64), ("output", np.int64), ("generated", np.int64),
    ("running_prev", np.int64),     # running decodes, doubly linked (next: `running_next`)
    ("reservation", np.int64),      # KV tokens held while it decodes: prompt + output
    ("prompt_machine", np.int64), ("token_machine", np.int64),
    ("arrival", np.float64), ("first_token", np.float64), ("finish", np.float64),
    ("kv_transfer", np.float64),
    ("queue_next", np.int64),       # prompt queue, later (remote decode) the decode wait
    ("batch_next", np.int64),       # prompts of the iteration in flight
], align=True)

MACHINE = np.dtype([
    ("role", np.int64), ("kind", np.int64), ("capacity", np.int64),  # kind: index into curves
    ("link", np.float64), ("visible", np.float64),  # KV link bytes/s, layer-wise visible s
    ("busy", np.bool_), ("busy_until", np.float64),  # the iteration in flight
    ("memory", np.int64),           # KV tokens reserved by admitted requests
    ("pending", np.int64),          # prompt tokens routed here, not yet done (routing key)
    ("committed", np.int64),        # reservations of unfinished requests decoding here (key)
    ("in_mixed", np.bool_), ("mixed_since", np.float64),  # lent to the mixed pool
    # list heads and tails
    ("prompt_head", np.int64), ("prompt_tail", np.int64), ("prompt_len", np.int64),
    ("wait_head", np.int64), ("wait_tail", np.int64),  # decodes waiting for memory
    ("running_head", np.int64), ("running_tail", np.int64),
    ("running_count", np.int64), ("running_context", np.int64),  # batch and context tokens
    ("batch_head", np.int64),       # prompts of the iteration in flight
    # statistics
    ("busy_s", np.float64), ("iterations", np.int64), ("batch_size_sum", np.int64),
    ("max_memory", np.int64), ("mixed_s", np.float64),
], align=True)

Curves = namedtuple("Curves", [  # knots padded into 2-D arrays (one row per SKU), with lengths
    "prompt_x", "prompt_y", "prompt_n", "decode_x", "decode_y", "decode_n", "context_s"])

Settings = namedtuple("Settings", [
    "kv_bytes", "layers", "mixed_pool", "prompt_token_limit", "queue_threshold",
    "layerwise_min"])

Heap = namedtuple("Heap", ["key", "item", "size"])  # binary min-heap on (key, item); size: [n]


# ---------------------------------------------------------------------------- latency

@njit(cache=True)
def _piecewise_linear(x, xs, ys, n):
    """Same rule as simcore.latency.piecewise_linear, on the first n knots."""
    if x <= xs[0]:
        return ys[0]
    if x > xs[n - 1]:
        slope = (ys[n - 1] - ys[n - 2]) / (xs[n - 1] - xs[n - 2])
        return ys[n - 1] + slope * (x - xs[n - 1])
    j = np.searchsorted(xs[:n], x)
    if xs[j] == x:
        return ys[j]
    slope = (ys[j] - ys[j - 1]) / (xs[j] - xs[j - 1])
    return slope * (x - xs[j - 1]) + ys[j - 1]


@njit(cache=True, inline='always')
def _iteration_time(curves, kind, tokens, batch, context):
    """LatencyCurves' prompt_time, token_time or mixed_time for SKU `kind`."""
    c = curves
    if batch == 0:
        return _piecewise_linear(float(tokens), c.prompt_x[kind], c.prompt_y[kind],
                                 c.prompt_n[kind])
    decode = _piecewise_linear(float(batch), c.decode_x[kind], c.decode_y[kind],
                               c.decode_n[kind])
    if tokens == 0:
        return decode + c.context_s[kind] * float(context)
    prompt = _piecewise_linear(float(tokens + batch), c.prompt_x[kind], c.prompt_y[kind],
                               c.prompt_n[kind])
    return max(prompt, decode) + c.context_s[kind] * float(context)


@njit(cache=True)
def _kv_transfer(settings, prompt, src, dst):
    """Same rule as simcore.cluster.kv_transfer_seconds, between machine records."""
    size = prompt * settings.kv_bytes
    bandwidth = min(src.link, dst.link)
    if prompt < settings.layerwise_min:
        return size / bandwidth
    return max(src.visible, dst.visible) + size / (settings.layers * bandwidth)


# ---------------------------------------------------------------------------- containers

@njit(cache=True)
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


@njit(cache=True)
def _heap_pop(heap):
    """Remove and return the (key, item)-minimal item."""
    keys, items = heap.key, heap.item
    top = items[0]
    heap.size[0] -= 1
    size = heap.size[0]
    keys[0] = keys[size]
    items[0] = items[size]
    i = 0
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
    return top


@njit(cache=True)
def _push_prompt(requests, machine, r):
    requests[r].queue_next = NONE
    if machine.prompt_tail != NONE:
        requests[machine.prompt_tail].queue_next = r
    else:
        machine.prompt_head = r
    machine.prompt_tail = r
    machine.prompt_len += 1


@njit(cache=True)
def _pop_prompt(requests, machine):
    r = machine.prompt_head
    machine.prompt_head = requests[r].queue_next
    if machine.prompt_head == NONE:
        machine.prompt_tail = NONE
    machine.prompt_len -= 1
    return r


@njit(cache=True)
def _push_wait(requests, machine, r):
    requests[r].queue_next = NONE
    if machine.wait_tail != NONE:
        requests[machine.wait_tail].queue_next = r
    else:
        machine.wait_head = r
    machine.wait_tail = r


@njit(cache=True)
def _pop_wait(requests, machine):
    r = machine.wait_head
    machine.wait_head = requests[r].queue_next
    if machine.wait_head == NONE:
        machine.wait_tail = NONE
    return r


@njit(cache=True)
def _append_running(requests, running_next, machine, r):
    """Admit request r to the machine's running decodes (doubly linked, for O(1) removal)."""
    request = requests[r]
    running_next[r] = NONE
    request.running_prev = machine.running_tail
    if machine.running_tail != NONE:
        running_next[machine.running_tail] = r
    else:
        machine.running_head = r
    machine.running_tail = r
    machine.running_count += 1
    machine.running_context += request.prompt + request.generated


@njit(cache=True)
def _remove_running(requests, running_next, machine, r):
    request = requests[r]
    if request.running_prev != NONE:
        running_next[request.running_prev] = running_next[r]
    else:
        machine.running_head = running_next[r]
    if running_next[r] != NONE:
        requests[running_next[r]].running_prev = request.running_prev
    else:
        machine.running_tail = request.running_prev
    machine.running_count -= 1
    machine.running_context -= request.prompt + request.generated


# ---------------------------------------------------------------------------- mixed pool

@njit(cache=True)
def _enter_mixed(machine, now):
    machine.in_mixed = True
    machine.mixed_since = now


@njit(cache=True)
def _leave_mixed_if_done(machine, now):
    """A mixed-pool machine returns to its pool once it has no work of the other kind."""
    if not machine.in_mixed:
        return
    other_work = machine.committed if machine.role == ROLE_PROMPT else machine.pending
    if other_work == 0:
        machine.in_mixed = False
        machine.mixed_s += now - machine.mixed_since


# ---------------------------------------------------------------------------- (1) iterations end

@njit(cache=True, inline='always')
def _end_decodes(requests, running_next, machines, m, now):
    """Every running decode was in this batch (the list changes only between iterations), and
    each gains a token. Returns how many requests finished."""
    machine = machines[m]
    machine.running_context += machine.running_count  # one more token of context each
    finished = 0
    r = machine.running_head
    while r != NONE:
        request = requests[r]
        after = running_next[r]
        request.generated += 1
        if request.generated == request.output:
            request.finish = now
            finished += 1
            machine.committed -= request.reservation
            machine.memory -= request.reservation
            _remove_running(requests, running_next, machine, r)
            if request.prompt_machine != m:
                _leave_mixed_if_done(machine, now)
        r = after
    return finished


@njit(cache=True, inline='always')
def _end_prompts(requests, running_next, machines, settings, kv_arrivals, m, now):
    """Each prompt yields its first token; its decode continues here, or on its token machine
    once the KV cache has arrived. Returns how many requests finished (one-token outputs)."""
    machine = machines[m]
    finished = 0
    r = machine.batch_head
    while r != NONE:
        request = requests[r]
        after = request.batch_next
        request.generated = 1
        request.first_token = now
        machine.pending -= request.prompt
        t = request.token_machine
        if request.output == 1:
            if t == m:
                machine.memory -= request.reservation
            request.finish = now
            finished += 1
            machines[t].committed -= request.reservation
            if t != m:
                _leave_mixed_if_done(machines[t], now)
        elif t == m:
            _append_running(requests, running_next, machine, r)
        else:
            request.kv_transfer = _kv_transfer(settings, request.prompt, machine, machines[t])
            _heap_push(kv_arrivals, now + request.kv_transfer, r)
        r = after
    machine.batch_head = NONE
    return finished


@njit(cache=True, inline='always')
def _end_iteration(requests, running_next, machines, settings, kv_arrivals, m, now):
    finished = _end_decodes(requests, running_next, machines, m, now)
    finished += _end_prompts(requests, running_next, machines, settings, kv_arrivals, m, now)
    machines[m].busy = False
    _leave_mixed_if_done(machines[m], now)
    return finished


# ---------------------------------------------------------------------------- (2) KV arrives

@njit(cache=True, inline='always')
def _deliver_kv(requests, machines, kv_arrivals, now):
    """KV caches that arrive now join their token machine's decode wait, by (time, request)."""
    while kv_arrivals.size[0] > 0 and kv_arrivals.key[0] == now:
        r = _heap_pop(kv_arrivals)
        _push_wait(requests, machines[requests[r].token_machine], r)


# ---------------------------------------------------------------------------- (3) routing
# Every choice is the (key, index)-smallest machine of a pool: ties go to the lowest index.

POOL_PROMPT, POOL_TOKEN, POOL_MIXED = 0, 1, 2
KEY_PENDING, KEY_COMMITTED = 0, 1


@njit(cache=True)
def _best_in_pool(machines, pool, key):
    """The pool's machine with the fewest pending (or committed) tokens; NONE if it is empty.
    The prompt and token pools exclude the machines lent to the mixed pool."""
    role = ROLE_PROMPT if pool == POOL_PROMPT else ROLE_TOKEN
    best, best_key = NONE, 0
    for m in range(len(machines)):
        machine = machines[m]
        if machine.in_mixed if pool == POOL_MIXED else (machine.role == role
                                                        and not machine.in_mixed):
            k = machine.pending if key == KEY_PENDING else machine.committed
            if best == NONE or k < best_key:
                best, best_key = m, k
    return best


@njit(cache=True)
def _best_prompt_machine_that_holds(machines, reservation):
    """The prompt-pool machine with the fewest committed tokens that can take the request."""
    best, best_key = NONE, 0
    for m in range(len(machines)):
        machine = machines[m]
        if (machine.role == ROLE_PROMPT and not machine.in_mixed
                and machine.committed + reservation <= machine.capacity
                and (best == NONE or machine.committed < best_key)):
            best, best_key = m, machine.committed
    return best


@njit(cache=True)
def _least_loaded(machines, reservation):
    """Fallback (and baseline): fewest pending + committed tokens among machines that fit."""
    best, best_key = NONE, 0
    for m in range(len(machines)):
        machine = machines[m]
        load = machine.pending + machine.committed
        if machine.capacity >= reservation and (best == NONE or load < best_key):
            best, best_key = m, load
    return best


@njit(cache=True)
def _is_long(machine, settings, prompt):
    return machine.prompt_len > 0 and machine.pending + prompt > settings.queue_threshold


@njit(cache=True)
def _is_loaded(machine, reservation):
    return machine.committed + reservation > machine.capacity


@njit(cache=True)
def _choose_prompt_machine(machines, settings, prompt, now):
    """Own pool; with the mixed pool, unless the queue is long: the mixed pool's best, else lend
    the token machine with the fewest committed tokens. Returns (choice, lent machine), NONE
    for none."""
    own = _best_in_pool(machines, POOL_PROMPT, KEY_PENDING)
    if not settings.mixed_pool or (own != NONE and not _is_long(machines[own], settings, prompt)):
        return own, NONE
    mixed = _best_in_pool(machines, POOL_MIXED, KEY_PENDING)
    if mixed != NONE and not _is_long(machines[mixed], settings, prompt):
        return mixed, NONE
    lent = _best_in_pool(machines, POOL_TOKEN, KEY_COMMITTED)
    if lent != NONE:
        _enter_mixed(machines[lent], now)
    return lent, lent


@njit(cache=True)
def _choose_token_machine(machines, settings, reservation, now):
    """Own pool; with the mixed pool, unless it is loaded: the mixed pool's best, else lend the
    prompt machine with the fewest committed tokens that can hold the request."""
    own = _best_in_pool(machines, POOL_TOKEN, KEY_COMMITTED)
    if not settings.mixed_pool or (own != NONE and not _is_loaded(machines[own], reservation)):
        return own, NONE
    mixed = _best_in_pool(machines, POOL_MIXED, KEY_COMMITTED)
    if mixed != NONE and not _is_loaded(machines[mixed], reservation):
        return mixed, NONE
    lent = _best_prompt_machine_that_holds(machines, reservation)
    if lent != NONE:
        _enter_mixed(machines[lent], now)
    return lent, lent


@njit(cache=True)
def _route(requests, machines, settings, r, now):
    """Pick both machines on arrival (prompt side first) and queue the prompt."""
    request = requests[r]
    prompt_m, token_m = NONE, NONE
    lent_p, lent_t = NONE, NONE
    if machines[0].role != ROLE_BOTH:
        prompt_m, lent_p = _choose_prompt_machine(machines, settings, request.prompt, now)
        if prompt_m != NONE:
            token_m, lent_t = _choose_token_machine(machines, settings, request.reservation,
                                                    now)
    if prompt_m == NONE or token_m == NONE:
        prompt_m = token_m = _least_loaded(machines, request.reservation)
    request.prompt_machine = prompt_m
    request.token_machine = token_m
    _push_prompt(requests, machines[prompt_m], r)
    machines[prompt_m].pending += request.prompt
    machines[token_m].committed += request.reservation
    # a machine lent for nothing (the fallback took over) returns at once
    if lent_p != NONE:
        _leave_mixed_if_done(machines[lent_p], now)
    if lent_t != NONE:
        _leave_mixed_if_done(machines[lent_t], now)


# ---------------------------------------------------------------------------- (4) iterations start

@njit(cache=True, inline='always')
def _has_work(machine):
    return (machine.wait_head != NONE or machine.prompt_head != NONE
            or machine.running_count > 0)


@njit(cache=True, inline='always')
def _admit_decodes(requests, running_next, machine):
    """Waiting decodes join FCFS while their reservation fits in memory."""
    while (machine.wait_head != NONE and machine.memory
           + requests[machine.wait_head].reservation <= machine.capacity):
        r = _pop_wait(requests, machine)
        machine.memory += requests[r].reservation
        _append_running(requests, running_next, machine, r)


@njit(cache=True, inline='always')
def _take_prompts(requests, machine, m, limit):
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
        if request.token_machine == m:
            if machine.memory + request.reservation > machine.capacity:
                break
            machine.memory += request.reservation
        r = _pop_prompt(requests, machine)
        request.batch_next = NONE
        if last != NONE:
            requests[last].batch_next = r
        else:
            machine.batch_head = r
        last = r
        tokens += request.prompt
        count += 1
    return count, tokens


@njit(cache=True, inline='always')
def _start_iteration(requests, running_next, machines, curves, settings, m, now):
    machine = machines[m]
    _admit_decodes(requests, running_next, machine)
    count, tokens = _take_prompts(requests, machine, m, settings.prompt_token_limit)
    decodes = machine.running_count
    if count == 0 and decodes == 0:
        return
    duration = _iteration_time(curves, machine.kind, tokens, decodes, machine.running_context)
    machine.busy = True
    machine.busy_until = now + duration
    machine.busy_s += duration
    machine.iterations += 1
    machine.batch_size_sum += count + decodes
    if machine.memory > machine.max_memory:
        machine.max_memory = machine.memory


# ---------------------------------------------------------------------------- event loop

@njit(cache=True, inline='always')
def _next_event_time(requests, machines, kv_arrivals, next_arrival):
    """Earliest iteration end, KV arrival or request arrival; INF when nothing is left."""
    now = INF
    for m in range(len(machines)):
        if machines[m].busy and machines[m].busy_until < now:
            now = machines[m].busy_until
    if kv_arrivals.size[0] > 0 and kv_arrivals.key[0] < now:
        now = kv_arrivals.key[0]
    if next_arrival < len(requests) and requests[next_arrival].arrival < now:
        now = requests[next_arrival].arrival
    return now


@njit(cache=True)
def _run(requests, running_next, machines, curves, settings, kv_arrivals):
    """The event loop; returns False if it stalls with unfinished requests."""
    n = len(requests)
    next_arrival = 0
    finished = 0
    end_time = 0.0
    while finished < n:
        now = _next_event_time(requests, machines, kv_arrivals, next_arrival)
        if now == INF:
            return False
        end_time = now
        for m in range(len(machines)):  # (1)
            if machines[m].busy and machines[m].busy_until == now:
                finished += _end_iteration(requests, running_next, machines, settings,
                                           kv_arrivals, m, now)
        _deliver_kv(requests, machines, kv_arrivals, now)  # (2)
        while next_arrival < n and requests[next_arrival].arrival == now:  # (3)
            _route(requests, machines, settings, next_arrival, now)
            next_arrival += 1
        for m in range(len(machines)):  # (4)
            if not machines[m].busy and _has_work(machines[m]):
                _start_iteration(requests, running_next, machines, curves, settings, m, now)
    for m in range(len(machines)):  # close the mixed-pool stays still open
        if machines[m].in_mixed:
            machines[m].mixed_s += end_time - machines[m].mixed_since
    return True


# ---------------------------------------------------------------------------- setup

def _stack_curves(curves) -> Curves:
    """Pad every SKU's knots into 2-D arrays (numba wants uniform arrays), with lengths."""
    k = len(curves)
    pmax = max(len(c.prompt_tokens) for c in curves)
    dmax = max(len(c.decode_batch) for c in curves)
    px, py = np.zeros((k, pmax)), np.zeros((k, pmax))
    dx, dy = np.zeros((k, dmax)), np.zeros((k, dmax))
    pn, dn = np.zeros(k, np.int64), np.zeros(k, np.int64)
    ctx = np.zeros(k)
    for i, c in enumerate(curves):
        pn[i], dn[i] = len(c.prompt_tokens), len(c.decode_batch)
        px[i, :pn[i]], py[i, :pn[i]] = c.prompt_tokens, c.prompt_seconds
        dx[i, :dn[i]], dy[i, :dn[i]] = c.decode_batch, c.decode_seconds
        ctx[i] = c.context_seconds_per_token
    return Curves(px, py, pn, dx, dy, dn, ctx)


def _new_requests(workload: Workload) -> np.recarray:
    requests = np.zeros(len(workload), REQUEST).view(np.recarray)
    requests.arrival = workload.arrival_s
    requests.prompt = workload.prompt_tokens
    requests.output = workload.output_tokens
    requests.reservation = requests.prompt + requests.output
    for link in ("prompt_machine", "token_machine", "queue_next",
                 "running_prev", "batch_next"):
        requests[link] = NONE
    requests.first_token = requests.finish = np.nan
    return requests


def _new_machines(m: MachineArrays) -> np.recarray:
    machines = np.zeros(m.count, MACHINE).view(np.recarray)
    machines.role, machines.kind, machines.capacity = m.role, m.kind, m.kv_capacity
    machines.link, machines.visible = m.link_bytes_per_s, m.layerwise_visible_s
    for link in ("prompt_head", "prompt_tail", "wait_head", "wait_tail", "running_head",
                 "running_tail", "batch_head"):
        machines[link] = NONE
    return machines


def simulate_fast(workload: Workload, m: MachineArrays) -> dict:
    """Run the compiled core; returns the same dictionary as the reference simulator."""
    requests, machines = _new_requests(workload), _new_machines(m)
    n = len(workload)
    kv_arrivals = Heap(np.zeros(n), np.zeros(n, np.int64), np.zeros(1, np.int64))
    settings = Settings(m.kv_bytes_per_token, m.layers, m.mixed_pool, m.prompt_token_limit,
                        m.queue_threshold, m.layerwise_min_prompt_tokens)
    running_next = np.full(n, NONE, np.int64)
    if not _run(requests, running_next, machines, _stack_curves(m.curves), settings, kv_arrivals):
        raise RuntimeError("simulation stalled with unfinished requests")

    def column(records, name):
        return np.ascontiguousarray(records[name])

    return {"first_token_s": column(requests, "first_token"),
            "finish_s": column(requests, "finish"),
            "prompt_machine": column(requests, "prompt_machine"),
            "token_machine": column(requests, "token_machine"),
            "kv_transfer_s": column(requests, "kv_transfer"),
            "busy_s": column(machines, "busy_s"), "iterations": column(machines, "iterations"),
            "batch_size_sum": column(machines, "batch_size_sum"),
            "max_memory_tokens": column(machines, "max_memory"),
            "mixed_pool_s": column(machines, "mixed_s")}
