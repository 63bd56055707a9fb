"""Prefix caching: each machine's LRU cache of prompt block ids, an intrusive doubly linked
list per machine over the dense block ids (`Prefix`: prev and next per (machine, block), the
list's ends and length per machine), so a lookup, an insertion and an eviction are O(1) a block.
With a host tier, a second list per machine over the same links (a block is in one tier at
most: `member` says which), its ends in the next three columns.

Compiles the reference's `_trim_cache`, `_prefix_lookup`, `_prefix_insert` and `_prefix_seed`
(simcore.refsim, "Prefix caching", its host tier and seeding: the rules, stated there once),
and prefix-aware routing's choice (`_cached_prefix`, `_aware_choice`). Used only when
`Settings.prefix_block` > 0 (the option is on and the workload carries blocks); otherwise its
arrays are placeholders.
"""
from __future__ import annotations

from simcore.cluster import ROLE_PROMPT
from .compiler import _compiled
from .records import HBM, HOST, HOST_BLOCKS, HOST_HITS, HOST_LINK, KV_BYTES, LOAD_TOKENS, NONE


@_compiled
def _lru_unlink(prefix, m, b):
    """Block b leaves machine m's tier that holds it."""
    end = 3 * (prefix.member[m, b] - HBM)  # its tier's columns of `ends`
    before, after = prefix.prev[m, b], prefix.next[m, b]
    if before != NONE:
        prefix.next[m, before] = after
    else:
        prefix.ends[m, end] = after
    if after != NONE:
        prefix.prev[m, after] = before
    else:
        prefix.ends[m, end + 1] = before
    prefix.member[m, b] = 0
    prefix.ends[m, end + 2] -= 1


@_compiled
def _lru_to_front(prefix, m, b, tier):
    """Block b becomes the most recently used of machine m's tier (HBM or HOST), leaving the
    other tier or entering the cache."""
    end = 3 * (tier - HBM)
    if prefix.member[m, b] != 0:
        if prefix.member[m, b] == tier and prefix.ends[m, end + 1] == b:
            return
        _lru_unlink(prefix, m, b)
    last = prefix.ends[m, end + 1]
    prefix.prev[m, b] = last
    prefix.next[m, b] = NONE
    if last != NONE:
        prefix.next[m, last] = b
    else:
        prefix.ends[m, end] = b
    prefix.ends[m, end + 1] = b
    prefix.member[m, b] = tier
    prefix.ends[m, end + 2] += 1


@_compiled
def _evict_to(prefix, m, room):
    """Evict machine m's least recently used blocks until at most `room` are left in HBM; with
    a host tier each becomes the host's most recently used, and the host evicts its least
    recently used beyond its capacity."""
    host = prefix.ends[m, HOST_BLOCKS]
    while prefix.ends[m, 2] > room:
        if host > 0:
            _lru_to_front(prefix, m, prefix.ends[m, 0], HOST)
        else:
            _lru_unlink(prefix, m, prefix.ends[m, 0])
    while prefix.ends[m, 5] > host:
        _lru_unlink(prefix, m, prefix.ends[m, 3])


@_compiled
def _trim_cache(prefix, machine, m, block):
    """Evict least recently used blocks down to the room its free KV memory leaves."""
    _evict_to(prefix, m, max(0, machine.capacity - machine.memory) // block)


@_compiled
def _clear_cache(prefix, m):
    """Machine m failed: its cache is lost, its host tier with it."""
    while prefix.ends[m, 2] > 0:
        _lru_unlink(prefix, m, prefix.ends[m, 0])
    while prefix.ends[m, 5] > 0:
        _lru_unlink(prefix, m, prefix.ends[m, 3])


@_compiled
def _matched_blocks(prefix, m, request):
    """How many of the request's leading blocks machine m's cache holds in HBM, and how many of
    the blocks after those its host tier holds (a run; 0 without the tier)."""
    start, stop = prefix.offsets[request.number], prefix.offsets[request.number + 1]
    k = 0
    while start + k < stop and prefix.member[m, prefix.ids[start + k]] == HBM:
        k += 1
    h = k
    while start + h < stop and prefix.member[m, prefix.ids[start + h]] == HOST:
        h += 1
    return k, h - k


@_compiled
def _prefix_lookup(prefix, machine, m, request, block):
    """Request's prefill starts on machine m: the longest run of its leading blocks cached there
    (in HBM, then in the host tier) is a hit of at most its prefill - 1 tokens; those blocks
    become most recently used in HBM (the first one last); its pending tokens fall by the hit;
    its host part adds to the tokens the machine's next iteration waits to load. Returns the
    hit in tokens."""
    _trim_cache(prefix, machine, m, block)
    start = prefix.offsets[request.number]
    k, h = _matched_blocks(prefix, m, request)
    for i in range(start + k + h - 1, start - 1, -1):
        _lru_to_front(prefix, m, prefix.ids[i], HBM)
    hit = min((k + h) * block, request.prefill - 1)
    loaded = hit - min(k * block, hit)  # its host part
    machine.prefix_hits += hit
    prefix.ends[m, HOST_HITS] += loaded
    machine.prefix_tokens += request.prefill
    machine.pending -= hit
    if h > 0:
        _trim_cache(prefix, machine, m, block)  # the loaded blocks may push others out
        prefix.ends[m, LOAD_TOKENS] += loaded
    return hit


@_compiled
def _host_load(prefix, m):
    """The seconds the host blocks of machine m's lookups since the last call take to load:
    their tokens x KV bytes per token / the host link (added to the iteration that starts
    their prefills); resets the count."""
    tokens = prefix.ends[m, LOAD_TOKENS]
    prefix.ends[m, LOAD_TOKENS] = 0
    return tokens * prefix.ends[m, KV_BYTES] / prefix.ends[m, HOST_LINK]


@_compiled
def _prefix_insert(prefix, machine, m, request, block):
    """Request's prefill ended on machine m: its blocks enter the cache (or are refreshed;
    leaving the host tier), the last first, so its first block is the most recently used;
    then the cache is trimmed."""
    start, stop = prefix.offsets[request.number], prefix.offsets[request.number + 1]
    for i in range(stop - 1, start - 1, -1):
        _lru_to_front(prefix, m, prefix.ids[i], HBM)
    _trim_cache(prefix, machine, m, block)


@_compiled
def _prefix_seed(prefix, m, request):
    """Request's KV arrived at its token machine m: its blocks enter the cache (or are
    refreshed) as `_prefix_insert` does, but untrimmed: the machine's memory count may lag in
    a decode run (`decode_runs`), and its next lookup or insertion trims anyway."""
    start, stop = prefix.offsets[request.number], prefix.offsets[request.number + 1]
    for i in range(stop - 1, start - 1, -1):
        _lru_to_front(prefix, m, prefix.ids[i], HBM)


@_compiled
def _cached_prefix(prefix, m, request, block):
    """Prefix-aware routing: the hit a lookup on machine m would find now (nothing changed)."""
    k, h = _matched_blocks(prefix, m, request)
    return min((k + h) * block, request.prefill - 1)


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
