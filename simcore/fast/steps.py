"""The event loop's steps for one machine: (1) an iteration that ends (its decodes,
then its prompts: first tokens, finishes, KV transfers started), (2) KV caches that arrive at
their token machine, and (4) an idle machine with work starting its next iteration (waiting
decodes admitted, then prompts or chunks; a decode-only iteration as a decode run), visited over
the machines touched at this instant only, in index order.

Paged KV admission: an iteration starts by preempting (`decode_runs._preempt`; one that did
admits nothing and runs one decode iteration), admission counts blocks below the watermark
(`_fits`, `_prompt_hold`, `_decode_hold`), and running decodes keep their order of joining.

Compiles the reference's `_end_iteration`, `_prompt_done`, `_finish`, `_start_iteration` and
`_begin`, and its step (2).
"""
from __future__ import annotations

from simcore.cluster import ROLE_BOTH
from .compiler import _inlined
from .records import CHANGED_COMMITTED, CHANGED_PENDING, CHANGED_POOL, INF, NONE, RETARGET
from .latency import _iteration_time, _kv_transfer, _prompt_time, _with_host
from .structures import (
    _append_running, _blocks, _heap_pop, _kv_tokens, _heap_push, _link_running, _pop_prompt, _pop_wait,
    _push_wait, _touch, _user_thinks)
from .pools import _changes, _refresh
from .routing import _leave_mixed_if_done
from .decode_runs import (
    _cut_run, _end_decodes, _memory_ticks, _peak_before, _preempt, _start_decode_run)
from .chunks import _chunks_now, _start_chunk_run, _take_chunks
from .failures import _lose, _recovered
from .prefix import _host_load, _prefix_insert, _prefix_lookup, _prefix_seed


@_inlined
def _join_running(state, machine, m, r):
    """Request r joins machine m's running decodes (paged KV: also their order of joining and
    the count of their context residues)."""
    requests, settings = state.requests, state.settings
    _append_running(requests, machine, r)
    if settings.kv_paged:
        request = requests[r]
        _link_running(requests, machine, r)
        state.residues[m, (request.prompt + request.generated - machine.decode_clock)
                       % settings.kv_block] += 1


@_inlined
def _prompt_hold(request, m, settings):
    """KV a prompt holds on machine m while computed (`simcore.refsim._prompt_hold`)."""
    if settings.kv_paged:
        return _blocks(request.prefill, settings.kv_block)
    return request.reservation if request.token_machine == m else request.prefill


@_inlined
def _fits(machine, held, settings):
    """Admission: `held` more fits (paged: leaving the watermark free unless it holds
    nothing)."""
    if settings.kv_paged and machine.memory > 0:
        return machine.memory + held <= machine.capacity - machine.watermark
    return machine.memory + held <= machine.capacity


@_inlined
def _end_prompts(state, m, now):
    """Each prompt yields its first token (a re-prefill after a loss yields none; one over the
    prompt only, when restarts regenerate, yields it again silently); its decode
    continues here, or on its token machine once the KV cache has arrived (if that machine
    failed meanwhile, on one chosen at detection). Returns how many requests finished."""
    requests, machines, settings = state.requests, state.machines, state.settings
    kv_arrivals, pools, failures = state.kv_arrivals, state.pools, state.failures
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
        if settings.prefix_block > 0:  # its blocks enter the machine's prefix cache
            _prefix_insert(state.prefix, machine, m, request, settings.prefix_block)
        if request.generated == 0:
            request.generated = 1
            if request.emitted == 0:  # (else regenerated after a loss: silent)
                request.emitted = 1
                request.first_token = request.last_token = now
        t = request.token_machine
        if request.generated == request.output:
            machine.memory -= _prompt_hold(request, m, settings)
            request.finish = now
            finished += 1
            _user_thinks(state.closed, request.number, now)
            _recovered(request, now)
            if machines[t].epoch == request.token_epoch:
                machines[t].committed -= request.reservation
                if t != m:
                    in_mixed = machines[t].in_mixed
                    _leave_mixed_if_done(machines[t], now)
                    _refresh(pools, machines, t, CHANGED_COMMITTED
                             | (CHANGED_POOL if machines[t].in_mixed != in_mixed else 0))
        elif t == m:
            if settings.kv_paged:  # its first token's block
                machine.memory += (_blocks(_kv_tokens(request, request.generated),
                                           settings.kv_block)
                                   - _blocks(request.prefill, settings.kv_block))
            _join_running(state, machine, m, r)
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
def _end_iteration(state, m, now):
    """(1) Machine m's iteration (or decode run) in flight ends now: its decodes, then its
    prompts; it leaves the mixed pool if done there, is re-ranked and visited by step (4).
    Returns how many requests finished."""
    machines, pools, touched = state.machines, state.pools, state.touched
    machine = machines[m]
    pending, committed, in_mixed = machine.pending, machine.committed, machine.in_mixed
    finished = _end_decodes(state, m, now)
    finished += _end_prompts(state, m, now)
    machines[m].busy = False
    _leave_mixed_if_done(machines[m], now)
    _refresh(pools, machines, m, _changes(machine, pending, committed, in_mixed))
    _touch(touched, machines[m], m)
    return finished


@_inlined
def _deliver_kv(state, now):
    """KV caches that arrive now join their token machine's decode wait, by (time, request),
    and leave their prompt machine's memory."""
    requests, machines, kv_arrivals = state.requests, state.machines, state.kv_arrivals
    touched = state.touched
    while kv_arrivals.size[0] > 0 and kv_arrivals.key[0] == now:
        r = _heap_pop(kv_arrivals) % len(requests)
        t, p = requests[r].token_machine, requests[r].kv_from
        if p != NONE:  # (NONE: a replica restored after a failure)
            # transferred: the prompt machine lets go
            if state.settings.kv_paged:
                block = state.settings.kv_block
                if machines[p].busy and machines[p].run_ticks > 1:
                    _peak_before(state.requests, state.residues[p], machines[p], state.curves,
                                 block, now)
                machines[p].memory -= _blocks(requests[r].prefill, block)
            else:
                machines[p].memory -= requests[r].prefill
            _touch(touched, machines[p], p)
        if state.settings.prefix_block > 0:  # its blocks seed the token machine's cache
            _prefix_seed(state.prefix, machines[t], t, requests[r],
                         state.settings.prefix_block)
        _push_wait(requests, machines[t], r)
        _touch(touched, machines[t], t)
        _recovered(requests[r], now)


@_inlined
def _has_work(machine):
    return (machine.wait_head != NONE or machine.prompt_head != NONE
            or machine.running_count > 0)


@_inlined
def _decode_hold(request, settings):
    """KV a running decode holds: its reservation, or (paged) its context's blocks."""
    if settings.kv_paged:
        return _blocks(_kv_tokens(request, request.generated), settings.kv_block)
    return request.reservation


@_inlined
def _admit_decodes(requests, machine):
    """Waiting decodes join FCFS while their reservation fits in memory."""
    while (machine.wait_head != NONE and machine.memory
           + requests[machine.wait_head].reservation <= machine.capacity):
        r = _pop_wait(requests, machine)
        machine.memory += requests[r].reservation
        _append_running(requests, machine, r)


@_inlined
def _admit_paged(state, machine, m):
    """Paged KV: waiting decodes join FCFS while their blocks fit below the watermark."""
    requests, settings = state.requests, state.settings
    while (machine.wait_head != NONE
           and _fits(machine, _decode_hold(requests[machine.wait_head], settings), settings)):
        r = _pop_wait(requests, machine)
        machine.memory += _decode_hold(requests[r], settings)
        _join_running(state, machine, m, r)


@_inlined
def _take_prompts(requests, machine, m, limit, curves, chunked_design, settings, prefix):
    """Queued prompts join from the head within the token limit (the first always does); one
    that decodes here must also fit its reservation, else the queue waits; with prefix
    caching, each computes only the tokens past its cached prefix (`prefix._prefix_lookup`).
    Returns (count, tokens)."""
    tokens = 0
    count = 0
    last = NONE
    while machine.prompt_head != NONE:
        request = requests[machine.prompt_head]
        if count > 0 and tokens + request.prompt > limit:
            break
        # the prompt's KV is held here while it is computed: all of its reservation when it
        # decodes here, its prompt tokens until transferred when it decodes elsewhere
        held = _prompt_hold(request, m, settings)
        if not _fits(machine, held, settings):
            break
        machine.memory += held
        r = _pop_prompt(requests, machine)
        cached = 0
        if settings.prefix_block > 0:
            cached = _prefix_lookup(prefix, machine, m, request, settings.prefix_block)
        request.prefilled = cached
        request.piece = request.prefill - cached
        request.batch_next = NONE
        if last != NONE:
            requests[last].batch_next = r
        else:
            machine.batch_head = r
        last = r
        tokens += request.piece
        count += 1
        if chunked_design:  # a whole prompt is one piece
            machine.prompt_chunks += 1
            machine.chunked_prefill_s += _prompt_time(curves, machine.kind, request.piece)
    return count, tokens


@_inlined
def _take_work(state, machine, m):
    """Waiting decodes admitted, then chunks or prompts taken. Returns (count, tokens, chunk
    extras, whether chunks were taken)."""
    requests, curves, settings = state.requests, state.curves, state.settings
    if settings.kv_paged:
        _admit_paged(state, machine, m)
    else:
        _admit_decodes(requests, machine)
    if _chunks_now(requests, machine, settings):
        # Sarathi-Serve's Algorithm 3: the running decodes' tokens count in the budget first
        # (speculative decoding: each decode verifies decode_q tokens)
        budget = max(0, settings.chunk_tokens
                     - curves.decode_q[machine.kind] * machine.running_count)
        count, tokens, extra = _take_chunks(requests, machine, m, curves, budget, settings,
                                            state.prefix)
        return count, tokens, extra, True
    count, tokens = _take_prompts(requests, machine, m, settings.prompt_token_limit, curves,
                                  settings.chunk_tokens > 0, settings, state.prefix)
    return count, tokens, 0.0, False


@_inlined
def _start_iteration(state, m, now, limit):
    requests, machines, curves = state.requests, state.machines, state.curves
    settings, busy_heap = state.settings, state.busy_heap
    machine = machines[m]
    preempted = settings.kv_paged and _preempt(state, m) > 0
    if preempted:  # (vLLM: an iteration that preempts admits nothing new)
        _refresh(state.pools, machines, m, CHANGED_PENDING)
        count, tokens, extra, chunked = 0, 0, 0.0, False
    else:
        count, tokens, extra, chunked = _take_work(state, machine, m)
        if settings.prefix_block > 0 and count > 0:  # hits lowered its pending tokens
            _refresh(state.pools, machines, m, CHANGED_PENDING)
            # (host tier) the iteration waits for its prompts' cached blocks to load
            extra += _host_load(state.prefix, m)
    decodes = machine.running_count
    if count == 0 and decodes == 0:
        return
    machine.busy = True
    if count == 0:
        ticks = requests[machine.running_root].finish_tick - machine.decode_clock
        if preempted:
            ticks = 1
        elif settings.kv_paged:
            ticks = _memory_ticks(state.residues[m], machine, ticks, settings.kv_block)
        _start_decode_run(requests, machine, curves, now, limit, ticks)
    else:
        paused = settings.prefill_first and not chunked and decodes > 0
        if paused:   # prefill first: the prompts run alone, the running decodes gain no token
            decodes = 0
            machine.paused = True
        duration = _with_host(curves, machine.kind, _iteration_time(
            curves, machine.kind, tokens, decodes, machine.running_context) + extra,
            count + decodes)
        machine.run_ticks = 0 if paused else 1   # (a paused iteration ticks no decode)
        machine.run_start = now
        machine.busy_until = now + duration
        machine.busy_s += duration
        if settings.chunk_tokens > 0 and machine.role == ROLE_BOTH and limit == INF:
            _start_chunk_run(state, m)
    _heap_push(busy_heap, machine.busy_until, m)
    machine.iterations += max(machine.run_ticks, 1)
    machine.batch_size_sum += (count + decodes) * max(machine.run_ticks, 1)
    if machine.memory > machine.max_memory:
        machine.max_memory = machine.memory


@_inlined
def _start_touched(state, now, limit):
    """(4) in machine index order, over the machines touched at this instant only."""
    machines, touched = state.machines, state.touched
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
            _start_iteration(state, m, now, limit)
        elif machines[m].run_ticks > 1 and (machines[m].prompt_head != NONE
                                            or machines[m].wait_head != NONE):
            _cut_run(state, m, now)
        elif machines[m].chunk_left > 0 and machines[m].wait_head != NONE:
            machines[m].chunk_left = 0  # a KV cache to admit (a replica restored after a
            # failure): the chunk run ends with the iteration in flight, as an event
    touched.count[0] = 0
