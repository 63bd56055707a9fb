"""Fast simulator core: the reference semantics (see `simcore.refsim`) on struct-of-arrays state.

Requests and machines are flat numpy arrays; queues are intrusive linked lists threaded through
per-request `next` arrays, so every operation is O(1) except the O(machines) scans for routing
and the next event. The loop is compiled with numba (cached on disk after the first call); with
PROVISION_NO_JIT=1, or without numba, the same code runs as plain Python (slow, but identical).
"""
from __future__ import annotations

import os

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


@njit(cache=True)
def _pl(x, xs, ys, n):
    """Piecewise-linear curve, same rule as simcore.latency.piecewise_linear."""
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


@njit(cache=True)
def _iteration_time(k, tokens, batch, context, px, py, pn, dx, dy, dn, ctx):
    if batch == 0:
        return _pl(float(tokens), px[k], py[k], pn[k])
    decode = _pl(float(batch), dx[k], dy[k], dn[k])
    if tokens == 0:
        return decode + ctx[k] * float(context)
    prompt = _pl(float(tokens + batch), px[k], py[k], pn[k])
    return max(prompt, decode) + ctx[k] * float(context)


@njit(cache=True)
def _heap_push(ht, hr, size, t, r):
    i = size
    ht[i] = t
    hr[i] = r
    while i > 0:
        parent = (i - 1) // 2
        if ht[parent] < ht[i] or (ht[parent] == ht[i] and hr[parent] < hr[i]):
            break
        ht[parent], ht[i] = ht[i], ht[parent]
        hr[parent], hr[i] = hr[i], hr[parent]
        i = parent
    return size + 1


@njit(cache=True)
def _heap_pop(ht, hr, size):
    r = hr[0]
    size -= 1
    ht[0] = ht[size]
    hr[0] = hr[size]
    i = 0
    while True:
        left, right, best = 2 * i + 1, 2 * i + 2, i
        if left < size and (ht[left] < ht[best] or (ht[left] == ht[best] and hr[left] < hr[best])):
            best = left
        if right < size and (ht[right] < ht[best]
                             or (ht[right] == ht[best] and hr[right] < hr[best])):
            best = right
        if best == i:
            break
        ht[best], ht[i] = ht[i], ht[best]
        hr[best], hr[i] = hr[i], hr[best]
        i = best
    return r, size


@njit(cache=True)
def _kv_transfer(prompt, src, dst, link, visible, kv_bytes, layers, layerwise_min):
    size = prompt * kv_bytes
    bandwidth = min(link[src], link[dst])
    if prompt < layerwise_min:
        return size / bandwidth
    return max(visible[src], visible[dst]) + size / (layers * bandwidth)


@njit(cache=True)
def _best(keys1, keys2, eligible):
    """Index minimising (keys1, keys2, index) among eligible machines, or NONE."""
    best = NONE
    for m in range(len(keys1)):
        if not eligible[m]:
            continue
        if (best == NONE or keys1[m] < keys1[best]
                or (keys1[m] == keys1[best] and keys2[m] < keys2[best])):
            best = m
    return best


@njit(cache=True)
def _append_running(r, m, run_head, run_tail, run_next, run_prev):
    """Append request r to machine m's running list (doubly linked, for O(1) removal)."""
    run_next[r] = NONE
    run_prev[r] = run_tail[m]
    if run_tail[m] != NONE:
        run_next[run_tail[m]] = r
    else:
        run_head[m] = r
    run_tail[m] = r


@njit(cache=True)
def _remove_running(r, m, run_head, run_tail, run_next, run_prev):
    if run_prev[r] != NONE:
        run_next[run_prev[r]] = run_next[r]
    else:
        run_head[m] = run_next[r]
    if run_next[r] != NONE:
        run_prev[run_next[r]] = run_prev[r]
    else:
        run_tail[m] = run_prev[r]


@njit(cache=True)
def _leave_mixed_if_done(m, now, role, committed, pending, in_mixed, mixed_since, mixed_s):
    """A mixed-pool machine returns to its pool once it has no work of the other kind."""
    if not in_mixed[m]:
        return
    other = committed[m] if role[m] == ROLE_PROMPT else pending[m]
    if other == 0:
        in_mixed[m] = False
        mixed_s[m] += now - mixed_since[m]


@njit(cache=True)
def _run(arrival, prompt, output, role, kind, capacity, link, visible, kv_bytes, layers,
         mixed_pool, limit, threshold, layerwise_min, px, py, pn, dx, dy, dn, ctx):
    n, M = len(arrival), len(role)
    reservation = prompt + output
    # per request
    pm = np.full(n, NONE, np.int64)
    tm = np.full(n, NONE, np.int64)
    generated = np.zeros(n, np.int64)
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    kvt = np.zeros(n)
    q_next = np.full(n, NONE, np.int64)      # prompt queue or decode-wait queue link
    run_next = np.full(n, NONE, np.int64)    # running list links (doubly linked)
    run_prev = np.full(n, NONE, np.int64)
    batch_next = np.full(n, NONE, np.int64)  # prompts of the current iteration
    # per machine
    pq_head = np.full(M, NONE, np.int64)
    pq_tail = np.full(M, NONE, np.int64)
    pq_len = np.zeros(M, np.int64)
    dw_head = np.full(M, NONE, np.int64)
    dw_tail = np.full(M, NONE, np.int64)
    run_head = np.full(M, NONE, np.int64)
    run_tail = np.full(M, NONE, np.int64)
    run_count = np.zeros(M, np.int64)
    run_context = np.zeros(M, np.int64)
    batch_head = np.full(M, NONE, np.int64)
    busy = np.zeros(M, np.bool_)
    busy_until = np.zeros(M)
    memory = np.zeros(M, np.int64)
    pending = np.zeros(M, np.int64)
    committed = np.zeros(M, np.int64)
    in_mixed = np.zeros(M, np.bool_)
    mixed_since = np.zeros(M)
    eligible = np.zeros(M, np.bool_)
    zeros = np.zeros(M, np.int64)
    load = np.zeros(M, np.int64)
    # statistics
    busy_s = np.zeros(M)
    iterations = np.zeros(M, np.int64)
    batch_sum = np.zeros(M, np.int64)
    max_memory = np.zeros(M, np.int64)
    mixed_s = np.zeros(M)
    # KV arrivals
    ht = np.zeros(n)
    hr = np.zeros(n, np.int64)
    hsize = 0
    next_arrival = 0
    finished = 0
    baseline = role[0] == ROLE_BOTH
    end_time = 0.0

    while finished < n:
        now = INF
        for m in range(M):
            if busy[m] and busy_until[m] < now:
                now = busy_until[m]
        if hsize > 0 and ht[0] < now:
            now = ht[0]
        if next_arrival < n and arrival[next_arrival] < now:
            now = arrival[next_arrival]
        if now == INF:
            return (pm, tm, first, finish, kvt, busy_s, iterations, batch_sum, max_memory,
                    mixed_s, False)
        end_time = now
        # (1) iterations that end
        for m in range(M):
            if not (busy[m] and busy_until[m] == now):
                continue
            # the running list only changes at iteration boundaries: all of it was in this batch
            r = run_head[m]
            while r != NONE:
                nxt = run_next[r]
                generated[r] += 1
                run_context[m] += 1
                if generated[r] == output[r]:
                    finish[r] = now
                    finished += 1
                    committed[m] -= reservation[r]
                    memory[m] -= reservation[r]
                    run_context[m] -= prompt[r] + output[r]
                    run_count[m] -= 1
                    _remove_running(r, m, run_head, run_tail, run_next, run_prev)
                    if pm[r] != m:
                        _leave_mixed_if_done(m, now, role, committed, pending, in_mixed,
                                             mixed_since, mixed_s)
                r = nxt
            r = batch_head[m]
            while r != NONE:
                nxt = batch_next[r]
                generated[r] = 1
                first[r] = now
                pending[m] -= prompt[r]
                t = tm[r]
                if output[r] == 1:
                    if t == m:
                        memory[m] -= reservation[r]
                    finish[r] = now
                    finished += 1
                    committed[t] -= reservation[r]
                    if t != m:
                        _leave_mixed_if_done(t, now, role, committed, pending, in_mixed,
                                             mixed_since, mixed_s)
                elif t == m:
                    _append_running(r, m, run_head, run_tail, run_next, run_prev)
                    run_count[m] += 1
                    run_context[m] += prompt[r] + 1
                else:
                    kvt[r] = _kv_transfer(prompt[r], m, t, link, visible, kv_bytes, layers,
                                          layerwise_min)
                    hsize = _heap_push(ht, hr, hsize, now + kvt[r], r)
                r = nxt
            batch_head[m] = NONE
            busy[m] = False
            _leave_mixed_if_done(m, now, role, committed, pending, in_mixed, mixed_since, mixed_s)
        # (2) KV caches that arrive
        while hsize > 0 and ht[0] == now:
            r, hsize = _heap_pop(ht, hr, hsize)
            t = tm[r]
            q_next[r] = NONE
            if dw_tail[t] != NONE:
                q_next[dw_tail[t]] = r
            else:
                dw_head[t] = r
            dw_tail[t] = r
        # (3) requests that arrive: routing
        while next_arrival < n and arrival[next_arrival] == now:
            r = next_arrival
            next_arrival += 1
            p_choice = NONE
            t_choice = NONE
            moved1 = NONE
            moved2 = NONE
            if not baseline:
                # prompt side
                for m in range(M):
                    eligible[m] = role[m] == ROLE_PROMPT and not in_mixed[m]
                p_choice = _best(pending, zeros, eligible)
                if mixed_pool and (p_choice == NONE or (
                        pq_len[p_choice] > 0 and pending[p_choice] + prompt[r] > threshold)):
                    for m in range(M):
                        eligible[m] = in_mixed[m]
                    p_choice = _best(pending, zeros, eligible)
                    if p_choice == NONE or (pq_len[p_choice] > 0
                                            and pending[p_choice] + prompt[r] > threshold):
                        for m in range(M):
                            eligible[m] = role[m] == ROLE_TOKEN and not in_mixed[m]
                        p_choice = _best(committed, zeros, eligible)
                        if p_choice != NONE:
                            in_mixed[p_choice] = True
                            mixed_since[p_choice] = now
                            moved1 = p_choice
                # token side
                if p_choice != NONE:
                    for m in range(M):
                        eligible[m] = role[m] == ROLE_TOKEN and not in_mixed[m]
                    t_choice = _best(committed, zeros, eligible)
                    if mixed_pool and (t_choice == NONE or
                                       committed[t_choice] + reservation[r] > capacity[t_choice]):
                        for m in range(M):
                            eligible[m] = in_mixed[m]
                        t_choice = _best(committed, zeros, eligible)
                        if t_choice == NONE or (committed[t_choice] + reservation[r]
                                                > capacity[t_choice]):
                            for m in range(M):
                                eligible[m] = (role[m] == ROLE_PROMPT and not in_mixed[m] and
                                               committed[m] + reservation[r] <= capacity[m])
                            t_choice = _best(committed, zeros, eligible)
                            if t_choice != NONE:
                                in_mixed[t_choice] = True
                                mixed_since[t_choice] = now
                                moved2 = t_choice
            if p_choice == NONE or t_choice == NONE:
                for m in range(M):
                    eligible[m] = capacity[m] >= reservation[r]
                    load[m] = pending[m] + committed[m]
                p_choice = _best(load, zeros, eligible)
                t_choice = p_choice
            pm[r] = p_choice
            tm[r] = t_choice
            q_next[r] = NONE
            if pq_tail[p_choice] != NONE:
                q_next[pq_tail[p_choice]] = r
            else:
                pq_head[p_choice] = r
            pq_tail[p_choice] = r
            pq_len[p_choice] += 1
            pending[p_choice] += prompt[r]
            committed[t_choice] += reservation[r]
            for mv in (moved1, moved2):  # a move the fallback made useless is undone at once
                if mv != NONE:
                    _leave_mixed_if_done(mv, now, role, committed, pending, in_mixed,
                                         mixed_since, mixed_s)
        # (4) idle machines start their next iteration
        for m in range(M):
            if busy[m]:
                continue
            while dw_head[m] != NONE and memory[m] + reservation[dw_head[m]] <= capacity[m]:
                r = dw_head[m]
                dw_head[m] = q_next[r]
                if dw_head[m] == NONE:
                    dw_tail[m] = NONE
                memory[m] += reservation[r]
                _append_running(r, m, run_head, run_tail, run_next, run_prev)
                run_count[m] += 1
                run_context[m] += prompt[r] + generated[r]
            tokens = 0
            count = 0
            last = NONE
            while pq_head[m] != NONE:
                r = pq_head[m]
                if count > 0 and tokens + prompt[r] > limit:
                    break
                if tm[r] == m:
                    if memory[m] + reservation[r] > capacity[m]:
                        break
                    memory[m] += reservation[r]
                pq_head[m] = q_next[r]
                if pq_head[m] == NONE:
                    pq_tail[m] = NONE
                pq_len[m] -= 1
                batch_next[r] = NONE
                if last != NONE:
                    batch_next[last] = r
                else:
                    batch_head[m] = r
                last = r
                tokens += prompt[r]
                count += 1
            if count == 0 and run_count[m] == 0:
                continue
            duration = _iteration_time(kind[m], tokens, run_count[m], run_context[m],
                                       px, py, pn, dx, dy, dn, ctx)
            busy[m] = True
            busy_until[m] = now + duration
            busy_s[m] += duration
            iterations[m] += 1
            batch_sum[m] += count + run_count[m]
            if memory[m] > max_memory[m]:
                max_memory[m] = memory[m]

    for m in range(M):
        if in_mixed[m]:
            mixed_s[m] += end_time - mixed_since[m]
    return pm, tm, first, finish, kvt, busy_s, iterations, batch_sum, max_memory, mixed_s, True


def _stack_curves(curves):
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
    return px, py, pn, dx, dy, dn, ctx


def simulate_fast(workload: Workload, m: MachineArrays) -> dict:
    """Run the compiled core; returns the same dictionary as the reference simulator."""
    (pm, tm, first, finish, kvt, busy_s, iterations, batch_sum, max_memory, mixed_s,
     completed) = _run(
        np.ascontiguousarray(workload.arrival_s, dtype=np.float64),
        np.ascontiguousarray(workload.prompt_tokens, dtype=np.int64),
        np.ascontiguousarray(workload.output_tokens, dtype=np.int64),
        m.role, m.kind, m.kv_capacity, m.link_bytes_per_s, m.layerwise_visible_s,
        m.kv_bytes_per_token, m.layers, m.mixed_pool, m.prompt_token_limit, m.queue_threshold,
        m.layerwise_min_prompt_tokens, *_stack_curves(m.curves))
    if not completed:
        raise RuntimeError("simulation stalled with unfinished requests")
    return {"first_token_s": first, "finish_s": finish, "prompt_machine": pm,
            "token_machine": tm, "kv_transfer_s": kvt, "busy_s": busy_s,
            "iterations": iterations, "batch_size_sum": batch_sum,
            "max_memory_tokens": max_memory, "mixed_pool_s": mixed_s}
