"""Prefix caching: each machine's LRU cache of prompt block ids, an intrusive doubly linked
list per machine over the dense block ids (`Prefix`: prev and next per (machine, block), the
list's ends and length per machine), so a lookup, an insertion and an eviction are O(1) a block.

Compiles the reference's `_trim_cache`, `_prefix_lookup` and `_prefix_insert` (simcore.refsim,
"Prefix caching": the rule, stated there once), and prefix-aware routing's choice
(`_cached_prefix`, `_aware_choice`). Used only when `Settings.prefix_block` > 0 (the
option is on and the workload carries blocks); otherwise its arrays are placeholders.
"""
from __future__ import annotations

from simcore.cluster import ROLE_PROMPT
from .compiler import _compiled
from .records import NONE


@_compiled
def _lru_unlink(prefix, m, b):
    """Block b leaves machine m's cache."""
    before, after = prefix.prev[m, b], prefix.next[m, b]
    if before != NONE:
        prefix.next[m, before] = after
    else:
        prefix.ends[m, 0] = after
    if after != NONE:
        prefix.prev[m, after] = before
    else:
        prefix.ends[m, 1] = before
    prefix.member[m, b] = False
    prefix.ends[m, 2] -= 1


@_compiled
def _lru_to_front(prefix, m, b):
    """Block b becomes machine m's most recently used (entering the cache if absent)."""
    if prefix.member[m, b]:
        if prefix.ends[m, 1] == b:
            return
        _lru_unlink(prefix, m, b)
    last = prefix.ends[m, 1]
    prefix.prev[m, b] = last
    prefix.next[m, b] = NONE
    if last != NONE:
        prefix.next[m, last] = b
    else:
        prefix.ends[m, 0] = b
    prefix.ends[m, 1] = b
    prefix.member[m, b] = True
    prefix.ends[m, 2] += 1


@_compiled
def _evict_to(prefix, m, room):
    """Evict machine m's least recently used blocks until at most `room` are left."""
    while prefix.ends[m, 2] > room:
        _lru_unlink(prefix, m, prefix.ends[m, 0])


@_compiled
def _trim_cache(prefix, machine, m, block):
    """Evict least recently used blocks down to the room its free KV memory leaves."""
    _evict_to(prefix, m, max(0, machine.capacity - machine.memory) // block)


@_compiled
def _clear_cache(prefix, m):
    """Machine m failed: its cache is lost."""
    _evict_to(prefix, m, 0)


@_compiled
def _matched_blocks(prefix, m, request):
    """How many of the request's leading blocks machine m's cache holds."""
    start, stop = prefix.offsets[request.number], prefix.offsets[request.number + 1]
    k = 0
    while start + k < stop and prefix.member[m, prefix.ids[start + k]]:
        k += 1
    return k


@_compiled
def _prefix_lookup(prefix, machine, m, request, block):
    """Request's prefill starts on machine m: the longest run of its leading blocks cached there
    is a hit of at most its prefill - 1 tokens; those blocks become most recently used (the
    first one last); its pending tokens fall by the hit. Returns the hit in tokens."""
    _trim_cache(prefix, machine, m, block)
    start = prefix.offsets[request.number]
    k = _matched_blocks(prefix, m, request)
    for i in range(start + k - 1, start - 1, -1):
        _lru_to_front(prefix, m, prefix.ids[i])
    hit = min(k * block, request.prefill - 1)
    machine.prefix_hits += hit
    machine.prefix_tokens += request.prefill
    machine.pending -= hit
    return hit


@_compiled
def _prefix_insert(prefix, machine, m, request, block):
    """Request's prefill ended on machine m: its blocks enter the cache (or are refreshed), the
    last first, so its first block is the most recently used; then the cache is trimmed."""
    start, stop = prefix.offsets[request.number], prefix.offsets[request.number + 1]
    for i in range(stop - 1, start - 1, -1):
        _lru_to_front(prefix, m, prefix.ids[i])
    _trim_cache(prefix, machine, m, block)


@_compiled
def _cached_prefix(prefix, m, request, block):
    """Prefix-aware routing: the hit a lookup on machine m would find now (nothing changed)."""
    return min(_matched_blocks(prefix, m, request) * block, request.prefill - 1)


@_compiled
def _aware_choice(machines, prefix, request, block, baseline):
    """Prefix-aware routing (the reference's `_least_loaded_aware` and its own prompt pool's
    choice): among the machines up and in their pool (a baseline: those that can hold the
    request; Splitwise: the prompt pool outside the mixed pool), the smallest load (baseline:
    pending + committed; Splitwise: pending) minus the request's cached prefix there, ties to
    the lowest index. A scan of the machines: O(machines x matched blocks) a route."""
    best, best_key = NONE, 0
    for m in range(len(machines)):
        machine = machines[m]
        if machine.down or machine.retired:
            continue
        if baseline:
            if machine.capacity < request.reservation:
                continue
            key = machine.pending + machine.committed
        else:
            if machine.role != ROLE_PROMPT or machine.in_mixed:
                continue
            key = machine.pending
        key -= _cached_prefix(prefix, m, request, block)
        if best == NONE or key < best_key:
            best, best_key = m, key
    return best
