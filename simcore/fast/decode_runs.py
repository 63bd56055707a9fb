"""Decode runs: a machine's decode-only iterations up to its next finish as one
event, and the ends of decode iterations.

A machine's running decodes are not walked per iteration: it counts its ended iterations
(`decode_clock`), and each running decode knows the count at which it produces its last token
(`finish_tick`), so an end costs O(finished x log batch) instead of O(batch). A run is cut where
a prompt or KV cache arrives for the machine (`_cut_run`) and ended by the next failure step; its
iteration times are replayed by one formula (`_tick_s`), so the run's busy time, its end and its
inter-token gaps (`_count_gaps`, `_count_silent`) are those of ending the iterations one by one.

The reference has no decode runs: it ends every iteration as an event (`_end_iteration`'s
decodes, each gaining a token). This module compiles that step for a run of them; its own
equivalence test (tests/test_fast_runs.py) checks runs against the reference.
"""
from __future__ import annotations

from .compiler import _compiled, _inlined
from .records import INF, NONE
from .latency import _combined, _decode_time, _host_time, _itl_bin
from .structures import _heap_push, _pop_running
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
        gaps[_itl_bin(now - machine.run_start)] += decodes - machine.fresh_count
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
def _end_decodes(state, m, now):
    """Every running decode was in this batch (the set changes only between iterations) and
    gains a token; those at their last token finish. Returns how many finished."""
    requests, machines, curves, gaps = state.requests, state.machines, state.curves, state.gaps
    machine = machines[m]
    _count_gaps(requests, machine, curves, gaps, now)
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
        machine.committed -= request.reservation
        machine.memory -= request.reservation
        if request.prompt_machine != m:
            _leave_mixed_if_done(machine, now)
    return finished


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
