"""Chunked prefill (Sarathi-Serve's stall-free batching) and chunk runs.

`_take_chunks` compiles the reference's `_start_chunked_iteration`: the budget left by the
running decodes filled from the head of the queue, the ongoing prompt first. A chunk run: a
colocated chunked machine's next full-budget pieces of one prompt are one event; the ends in
between are applied from the busy heap without an instant of their own (`_apply_chunk_end`),
before any route reads the routing keys they change, each iteration priced as it would have been
alone (`_chunk_step`).

The reference has no chunk runs: it ends and starts every chunked iteration as events. Their
own equivalence test (tests/test_fast_runs.py) checks them against the reference.
"""
from __future__ import annotations

from simcore.cluster import ROLE_BOTH
from .compiler import _inlined
from .records import CHANGED_COMMITTED, CHANGED_PENDING, NONE
from .latency import _chunk_extra, _decode_time, _piecewise_linear, _prompt_time, _with_host
from .structures import _heap_push, _pop_prompt
from .pools import _refresh
from .decode_runs import _end_decodes
from .prefix import _prefix_lookup


@_inlined
def _chunks_now(requests, machine, settings):
    """Chunked designs: baseline machines always; Splitwise machines while they decode or
    finish a partially prefilled prompt."""
    if settings.chunk_tokens <= 0:
        return False
    return (machine.role == ROLE_BOTH or machine.running_count > 0
            or (machine.prompt_head != NONE and requests[machine.prompt_head].prefilled > 0))


@_inlined
def _take_chunks(requests, machine, m, curves, budget, settings, prefix):
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
            if settings.kv_paged:  # as steps._prompt_hold and steps._fits
                held = (request.prefill + settings.kv_block - 1) // settings.kv_block \
                    * settings.kv_block
                if machine.memory + held > machine.capacity - (
                        machine.watermark if machine.memory > 0 else 0):
                    break
            else:
                held = request.reservation if request.token_machine == m else request.prefill
                if machine.memory + held > machine.capacity:
                    break
            machine.memory += held
            if settings.prefix_block > 0:  # its pieces start after its cached prefix
                request.prefilled = _prefix_lookup(prefix, machine, m, request,
                                                   settings.prefix_block)
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
def _start_chunk_run(state, m):
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
    requests, machines, curves = state.requests, state.machines, state.curves
    settings = state.settings
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
            float(piece + decodes * curves.decode_q[kind]), curves.prompt_x[kind], curves.prompt_y[kind],
            curves.prompt_n[kind], curves.prompt_index[kind], curves.prompt_scale[kind]),
            _decode_time(curves, kind, decodes))


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
    # one piece per iteration of a chunk run, beside the running decodes
    return (_with_host(curves, kind, iteration + extra, 1 + machine.running_count),
            piece_extra, after_s)


@_inlined
def _is_chunk_end(machine, at):
    """A busy-heap entry (at, machine) ends an iteration of a chunk run before its last."""
    return machine.busy and machine.busy_until == at and machine.chunk_left > 0


@_inlined
def _apply_chunk_end(state, m):
    """The end of one of machine m's chunk-run iterations and the start of the next, as
    `_end_iteration` and `_start_iteration` would apply them (see `_start_chunk_run`).
    Returns how many requests finished."""
    requests, machines, curves = state.requests, state.machines, state.curves
    busy_heap, pools = state.busy_heap, state.pools
    machine = machines[m]
    request = requests[machine.batch_head]
    piece = request.piece
    decodes = machine.running_count
    finished = _end_decodes(state, m, machine.busy_until)  # a token each
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
