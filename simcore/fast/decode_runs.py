"""Decode runs: a machine's decode-only iterations up to its next finish as one
event, and the ends of decode iterations.

A machine's running decodes are not walked per iteration: it counts its ended iterations
(`decode_clock`), and each running decode knows the count at which it produces its last token
(`finish_tick`), so an end costs O(finished x log batch) instead of O(batch). A run is cut where
a prompt or KV cache arrives for the machine (`_cut_run`) and ended by the next failure step; its
iteration times are replayed by one formula (`_tick_s`), so the run's busy time, its end and its
inter-token gaps (`_count_gaps`, `_count_silent`) are those of ending the iterations one by one.

Paged KV admission (`simcore.refsim`'s "KV admission"): each machine counts its running
decodes by their context residue modulo the block (`State.residues`), so the blocks a run's
iterations add are known per iteration in O(1) (`_memory_ticks`: the run ends at the iteration
after which memory would run out, as it ends at a finish, so preemption happens at an iteration
boundary exactly as in the reference) and in O(ticks mod block) at its end (`_grow_blocks`);
a KV cache that leaves mid-run counts the memory its iterations so far held (`_peak_before`).
`_preempt` compiles the reference's `_preempt` (O(batch), only when it preempts). With
speculative decoding a step adds 1..k+1 tokens (`structures._kv_tokens`), so the residues do
not tell where blocks start: a run of two or more decodes is one iteration (each start checks,
as the reference's), and the blocks are walked over the running decodes (`_walk_grown`,
O(batch)).

The reference has no decode runs: it ends every iteration as an event (`_end_iteration`'s
decodes, each gaining a token). This module compiles that step for a run of them; its own
equivalence test (tests/test_fast_runs.py) checks runs against the reference, and
tests/test_paged_kv.py with paged KV.
"""
from __future__ import annotations

from .compiler import _compiled, _inlined
from .records import INF, NONE
from .latency import _combined, _decode_time, _host_time, _itl_bin
from .structures import (
    _blocks, _heap_push, _kv_tokens, _meld, _pop_running, _push_prompt, _unlink_running,
    _user_thinks)
from .routing import _leave_mixed_if_done


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
        # (prefill first: prompt-only iterations since the last token at last_end)
        start = machine.last_end if machine.paused else machine.run_start
        gaps[_itl_bin(now - start)] += decodes - machine.fresh_count
    elif machine.paused:
        first_end = _count_paused_run(machine, curves, gaps, decodes)
    else:
        decode = _decode_time(curves, machine.kind, decodes)
        per_token = curves.context_s[machine.kind]
        growth = machine.running_rate  # the context each iteration adds
        host = _host_time(curves, machine.kind, decodes)
        overlap = curves.overlap_host[machine.kind]
        first = _tick_s(machine, decode, per_token, 0, growth, host, overlap)
        first_end = machine.run_start + first
        low = _itl_bin(first)
        gaps[low] -= machine.fresh_count
        if low == _itl_bin(_tick_s(machine, decode, per_token, ticks - 1, growth, host,
                                       overlap)):
            gaps[low] += ticks * decodes
        else:
            for run in range(ticks):
                gaps[_itl_bin(_tick_s(machine, decode, per_token, run, growth, host,
                                      overlap))] += decodes
    r = machine.fresh_head
    while r != NONE:
        if requests[r].emitted <= requests[r].generated:  # (else its first token is silent)
            gaps[_itl_bin(first_end - requests[r].last_token)] += 1
        r = requests[r].queue_next
    machine.fresh_head = NONE
    machine.fresh_count = 0
    if machine.silent_head != NONE:
        _count_silent(requests, machine, curves, gaps, now)


@_inlined
def _without_preempted(requests, head, via_batch):
    """A list of requests (linked through batch_next if `via_batch`, else queue_next) without
    the preempted ones (finish_tick NONE): (its new head, how many were dropped)."""
    dropped, previous, r = 0, NONE, head
    while r != NONE:
        after = requests[r].batch_next if via_batch else requests[r].queue_next
        if requests[r].finish_tick == NONE:
            dropped += 1
            if previous == NONE:
                head = after
            elif via_batch:
                requests[previous].batch_next = after
            else:
                requests[previous].queue_next = after
        else:
            previous = r
        r = after
    return head, dropped


@_compiled
def _count_paused_run(machine, curves, gaps, decodes):
    """`_count_gaps` of a decode run after prompt-only iterations (prefill first): the first
    gap of the decodes that were running is from their last token (last_end); the fresh ones
    count their own in `_count_gaps`. O(ticks), only after such iterations. Returns the end
    of the run's first iteration."""
    decode = _decode_time(curves, machine.kind, decodes)
    per_token = curves.context_s[machine.kind]
    host = _host_time(curves, machine.kind, decodes)
    overlap = curves.overlap_host[machine.kind]
    growth = machine.running_rate  # the context each iteration adds
    first_end = machine.run_start + _tick_s(machine, decode, per_token, 0, growth, host,
                                            overlap)
    gaps[_itl_bin(first_end - machine.last_end)] += decodes - machine.fresh_count
    for run in range(1, machine.run_ticks):
        gaps[_itl_bin(_tick_s(machine, decode, per_token, run, growth, host, overlap))] += \
            decodes
    return first_end


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
    growth = machine.running_rate  # the context each iteration adds
    host = _host_time(curves, machine.kind, decodes)
    overlap = curves.overlap_host[machine.kind]
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
                gap = _tick_s(machine, decode, per_token, tick, growth, host, overlap)
                end = end + gap
            if tick > 0 or not fresh:  # (prefill first: its first gap from its last token)
                gaps[_itl_bin(end - machine.last_end if tick == 0 and machine.paused
                              else gap)] -= 1
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
def _end_decodes(state, m, now):
    """Every running decode was in this batch (the set changes only between iterations) and
    gains a token; those at their last token finish. Returns how many finished."""
    requests, machines, curves, gaps = state.requests, state.machines, state.curves, state.gaps
    settings = state.settings
    machine = machines[m]
    if machine.run_ticks == 0:  # prefill first: prompts ran alone, the decodes gained nothing
        return 0
    _count_gaps(requests, machine, curves, gaps, now)
    machine.paused = False
    if settings.kv_paged and machine.running_count > 0:
        if machine.context_units > 1:  # speculative decoding: steps add 1..k+1 tokens
            _walk_blocks(requests, machine, settings.kv_block)
        else:
            _grow_blocks(state.residues[m], machine, settings.kv_block)
    machine.last_end = now
    machine.running_context += machine.running_rate * machine.run_ticks  # a unit each
    machine.decode_clock += machine.run_ticks
    finished = 0
    while (machine.running_root != NONE
           and requests[machine.running_root].finish_tick == machine.decode_clock):
        r = _pop_running(requests, machine)
        request = requests[r]
        request.finish = now
        finished += 1
        _user_thinks(state.closed, request.number, now)
        machine.committed -= request.reservation
        if settings.kv_paged:
            context = request.prompt + request.output  # (residues count units)
            state.residues[m, (context - machine.decode_clock) % settings.kv_block] -= 1
            _unlink_running(requests, machine, r)
            machine.memory -= _blocks(_kv_tokens(request, request.output), settings.kv_block)
        else:
            machine.memory -= request.reservation
        if request.prompt_machine != m:
            _leave_mixed_if_done(machine, now)
    return finished


@_inlined
def _grown(residues, clock, ticks, block, running):
    """Paged KV: the tokens of the blocks a run's first `ticks` iterations from `clock` add
    (each decode starts a block with its token after a multiple of `block`); `running`: the
    running decodes, the residues' sum.

    The decodes of residue key start a block at the iterations j (from 0) with
    j = -(key + clock) mod block: ticks // block times in all, and once more when the first
    such j is below ticks % block, that is for the keys -clock, -clock - 1, ... (mod block),
    ticks % block of them. O(ticks % block) instead of a pass over every residue."""
    rest = ticks % block
    grown = (ticks // block) * running
    key = (-clock) % block
    for _ in range(rest):
        grown += residues[key]
        key = key - 1 if key > 0 else block - 1
    return grown * block


@_compiled
def _walk_grown(requests, machine, ticks, block):
    """Paged KV with speculative decoding (a step adds 1..k+1 tokens, `_kv_tokens`, so the
    residues do not tell when a block starts): the tokens of the blocks a run's first `ticks`
    iterations add, decode by decode over the running ones. O(batch)."""
    grown = 0
    r = machine.run_first
    while r != NONE:
        request = requests[r]
        g = request.output - (request.finish_tick - machine.decode_clock)  # units so far
        grown += (_blocks(_kv_tokens(request, g + ticks), block)
                  - _blocks(_kv_tokens(request, g), block))
        r = request.prefilled
    return grown


@_compiled
def _walk_blocks(requests, machine, block):
    """`_grow_blocks` with speculative decoding (`_walk_grown`): the blocks the run's
    iterations ending now add, and the memory at the start of its last iteration."""
    ticks = machine.run_ticks
    if ticks > 1:
        peak = machine.memory + _walk_grown(requests, machine, ticks - 1, block)
        if peak > machine.max_memory:
            machine.max_memory = peak
    machine.memory += _walk_grown(requests, machine, ticks, block)


@_compiled
def _grow_blocks(residues, machine, block):
    """Paged KV: the blocks the run's iterations ending now add; the memory at the start of
    its last iteration (the reference's `_begin` sees each start) counts in max_memory."""
    ticks, clock = machine.run_ticks, machine.decode_clock
    grown = _grown(residues, clock, ticks, block, machine.running_count)
    last = residues[(-(clock + ticks - 1)) % block] * block
    if machine.memory + grown - last > machine.max_memory:
        machine.max_memory = machine.memory + grown - last
    machine.memory += grown


@_compiled
def _peak_before(requests, residues, machine, curves, block, now):
    """Paged KV: memory is freed (a KV cache sent from here arrived) during a decode run: the
    run's iterations that started before now saw it held, so the last of them counts in
    max_memory with it (`_grow_blocks` sees the starts after). O(its iterations so far)."""
    decodes = machine.running_count
    decode = _decode_time(curves, machine.kind, decodes)
    per_token = curves.context_s[machine.kind]
    host = _host_time(curves, machine.kind, decodes)
    overlap = curves.overlap_host[machine.kind]
    started = 0  # iterations after the first that started before now
    end = machine.run_start
    for tick in range(machine.run_ticks - 1):
        end = end + _tick_s(machine, decode, per_token, tick, machine.running_rate, host,
                            overlap)
        if end >= now:
            break
        started = tick + 1
    if started > 0:
        if machine.context_units > 1:  # speculative decoding
            peak = machine.memory + _walk_grown(requests, machine, started, block)
        else:
            peak = machine.memory + _grown(residues, machine.decode_clock, started, block,
                                           machine.running_count)
        if peak > machine.max_memory:
            machine.max_memory = peak


@_inlined
def _memory_ticks(residues, machine, ticks, block):
    """Paged KV: how many of a decode run's next `ticks` iterations start without running out
    of blocks (the first always does: its start preempted what did not fit). One decode left
    alone is never preempted. With speculative decoding (a step adds 1..k+1 tokens), only
    the first: each start checks for itself, as the reference's do."""
    if machine.running_count < 2:
        return ticks
    if machine.context_units > 1:
        return 1
    memory, clock = machine.memory, machine.decode_clock
    for tick in range(ticks - 1):
        memory += block * residues[(-(clock + tick)) % block]
        if memory > machine.capacity:
            return tick + 1
    return ticks


@_compiled
def _preempt(state, m):
    """Paged KV (`simcore.refsim._preempt`): while the machine's blocks exceed its memory, its
    most recently joined running decode (never the last one) loses its KV and goes back to
    the front of its prompt queue (behind a partly prefilled prompt) to recompute its prompt
    and generated tokens as one prefill. The fresh and silent lists drop the preempted; the
    running heap is rebuilt from the rest (O(batch), only when some were). Returns how many."""
    requests, machines, settings = state.requests, state.machines, state.settings
    machine = machines[m]
    block = settings.kv_block
    count = 0
    first = last = NONE  # the preempted, in order, chained through heap_child
    while machine.memory > machine.capacity and machine.running_count > 1:
        r = machine.run_last
        request = requests[r]
        _unlink_running(requests, machine, r)
        request.generated = request.output - (request.finish_tick - machine.decode_clock)
        if request.generated > request.emitted:  # it sent tokens here, the latest at the last
            request.emitted = request.generated  # end (made current as in failures._fail)
            request.last_token = machine.last_end
        context = request.prompt + request.generated  # (residues count units)
        state.residues[m, (context - machine.decode_clock) % block] -= 1
        kv = _kv_tokens(request, request.generated)
        machine.memory -= _blocks(kv, block)
        machine.running_count -= 1
        machine.running_context -= (machine.context_units * (request.prompt + 1)
                                    + request.context_rate * (request.generated - 1))
        machine.running_rate -= request.context_rate
        request.finish_tick = NONE  # not running: dropped from the lists below
        request.prefill = kv
        request.heap_child = NONE
        if last == NONE:
            first = r
        else:
            requests[last].heap_child = r
        last = r
        count += 1
    if count == 0:
        return 0
    machine.preemptions += count
    machine.fresh_head, dropped = _without_preempted(requests, machine.fresh_head, False)
    machine.fresh_count -= dropped
    machine.silent_head = _without_preempted(requests, machine.silent_head, True)[0]
    machine.running_root = NONE
    r = machine.run_first
    while r != NONE:
        requests[r].heap_child = requests[r].heap_sibling = NONE
        machine.running_root = r if machine.running_root == NONE else _meld(
            requests, machine.running_root, r)
        r = requests[r].prefilled
    r = first
    while r != NONE:
        after = requests[r].heap_child
        request = requests[r]
        request.prefilled = request.piece = 0
        machine.pending += request.prefill
        head = machine.prompt_head
        if head != NONE and requests[head].prefilled > 0:  # behind the ongoing prompt
            request.queue_next = requests[head].queue_next
            requests[head].queue_next = r
            if machine.prompt_tail == head:
                machine.prompt_tail = r
            machine.prompt_len += 1
        elif head != NONE:
            request.queue_next = head
            machine.prompt_head = r
            machine.prompt_len += 1
        else:
            _push_prompt(requests, machine, r)
        r = after
    return count


@_inlined
def _start_decode_run(requests, machine, curves, now, limit, ticks_cap):
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
    machine.run_ticks = min(ticks_cap,
                            requests[machine.running_root].finish_tick - machine.decode_clock)
    machine.busy_until = _run_iterations(machine, curves, machine.run_ticks, INF, limit)


@_inlined
def _tick_s(machine, decode, per_token, tick, growth, host, overlap):
    """The time of the tick-th iteration of a decode run that started with the machine's
    running context (each iteration adds `growth`, the sum of its decodes' context rates: a
    token each without speculative decoding): the one formula the run's replays
    (`_run_iterations`, `_count_gaps`, `_count_silent`) share, so they agree bit for bit; the
    engine's host time (`host`, the batch's) as `_with_host` adds it."""
    return _combined(decode + per_token * float(machine.running_context + tick * growth),
                     host, overlap)


@_inlined
def _run_iterations(machine, curves, ticks, until, limit):
    """Replay the run from its start for `ticks` iterations or to the first iteration end at or
    after `until`, and after the first iteration none that ends after `limit`, adding each
    iteration's time to busy_s; sets run_ticks, returns the end."""
    decodes = machine.running_count
    decode = _decode_time(curves, machine.kind, decodes)  # the batch is the same throughout
    per_token = curves.context_s[machine.kind]
    growth = machine.running_rate  # the context each iteration adds
    host = _host_time(curves, machine.kind, decodes)
    overlap = curves.overlap_host[machine.kind]
    machine.busy_s = machine.run_busy_s
    end = machine.run_start
    run = 0
    while run < ticks and end < until:  # each as _iteration_time's decode-only case
        duration = _tick_s(machine, decode, per_token, run, growth, host, overlap)
        if run > 0 and end + duration > limit:
            break
        end = end + duration
        machine.busy_s += duration
        run += 1
    machine.run_ticks = run
    return end


@_inlined
def _cut_run(state, m, now):
    """Work arrived for machine m during a run: the run ends with the iteration in flight (its
    end at or after now), where the machine would have taken the work. The heap entry of the
    old end stays until it reaches the top (`_is_current_end`); one per routed prompt or arrived
    KV cache at most, hence the busy heap's room for 2 x requests more entries than machines."""
    machines, curves, busy_heap = state.machines, state.curves, state.busy_heap
    machine = machines[m]
    ticks = machine.run_ticks
    end = _run_iterations(machine, curves, ticks, now, INF)
    if machine.run_ticks < ticks:
        dropped = ticks - machine.run_ticks
        machine.iterations -= dropped
        machine.batch_size_sum -= dropped * machine.running_count
        machine.busy_until = end
        _heap_push(busy_heap, end, m)
