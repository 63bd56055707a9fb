"""Prefix caching: each machine's LRU cache of prompt block ids, in memory bounded by what the
caches can hold, whatever the run's length or its distinct blocks (`Prefix`, records.py): per
machine a pool of S slots (its HBM room with nothing held, its host tier's capacity, and one
request's blocks: the most a cache holds between two trims), each slot a block id, its tier
and its LRU links, an intrusive doubly linked list per tier (HBM, host: a block is in one tier
at most), the free slots on a list of their own; and an open-addressing hash table per machine
from block id (any id from 0 to 2**63 - 1, not remapped per run; each entry keeps its id
beside its slot, so a probe reads one array) to slot, linear probing, deletions by
backward shift (no tombstones: a probe stays short however long the run). A lookup, an
insertion and an eviction are O(1) a block.

Compiles the reference's `_trim_cache`, `_prefix_lookup`, `_prefix_insert` and `_prefix_seed`
(simcore.refsim, "Prefix caching", its host tier and seeding: the rules, stated there once),
and prefix-aware routing's choice (`_cached_prefix`, `_aware_choice`). Used only when
`Settings.prefix_block` > 0 (the option is on and the workload carries blocks); otherwise its
arrays are placeholders.
"""
from __future__ import annotations

from simcore.cluster import ROLE_PROMPT
from .compiler import _compiled, _inlined
from .records import (FREE, HBM, HOST, HOST_BLOCKS, HOST_HITS, HOST_LINK, KV_BYTES, LOAD_TOKENS,
                      NONE)

HASH_MULTIPLIER = 0x5851F42D4C957F2D  # odd, below 2**63: int64 products wrap alike everywhere


@_inlined
def _home(prefix, b):
    """Block id b's first probe in a machine's table: a multiplicative hash of its folded bits
    (the product's bits 20 up, the same in compiled int64 arithmetic and in plain Python)."""
    x = int(b)
    return ((x ^ (x >> 32)) * HASH_MULTIPLIER >> 20) & (prefix.table.shape[1] - 1)


@_inlined
def _probe(prefix, m, b):
    """Where block b is in machine m's table, or the empty entry where it would go."""
    mask = prefix.table.shape[1] - 1
    i = _home(prefix, b)
    while True:
        key = prefix.keys[m, i]
        if key == b or key == NONE:
            return i
        i = (i + 1) & mask


@_inlined
def _slot_of(prefix, m, b):
    """The slot holding block b in machine m's cache (NONE: not cached)."""
    return prefix.table[m, _probe(prefix, m, b)]


@_inlined
def _tier(prefix, m, b):
    """Where machine m caches block b: HBM, HOST or 0 (nowhere)."""
    s = _slot_of(prefix, m, b)
    return 0 if s == NONE else prefix.tier[m, s]


@_inlined
def _table_remove(prefix, m, b):
    """Block b leaves machine m's table; the entries after it in its probe run shift back
    into the gap when their home allows (so every entry stays reachable from its home)."""
    mask = prefix.table.shape[1] - 1
    i = _probe(prefix, m, b)
    j = i
    while True:
        j = (j + 1) & mask
        key = prefix.keys[m, j]
        if key == NONE:
            break
        home = _home(prefix, key)
        # the entry at j may fill the gap at i unless its home lies cyclically in (i, j]
        if (j > i and (home <= i or home > j)) or (j < i and home <= i and home > j):
            prefix.keys[m, i] = key
            prefix.table[m, i] = prefix.table[m, j]
            i = j
    prefix.keys[m, i] = NONE
    prefix.table[m, i] = NONE


@_inlined
def _unlink(prefix, m, s):
    """Slot s leaves machine m's tier list that holds it."""
    end = 3 * (prefix.tier[m, s] - HBM)  # its tier's columns of `ends`
    before, after = prefix.prev[m, s], prefix.next[m, s]
    if before != NONE:
        prefix.next[m, before] = after
    else:
        prefix.ends[m, end] = after
    if after != NONE:
        prefix.prev[m, after] = before
    else:
        prefix.ends[m, end + 1] = before
    prefix.ends[m, end + 2] -= 1


@_inlined
def _drop(prefix, m, s):
    """The block in slot s leaves machine m's cache; the slot goes back to the free list."""
    _unlink(prefix, m, s)
    _table_remove(prefix, m, prefix.block[m, s])
    prefix.tier[m, s] = 0
    prefix.block[m, s] = NONE
    prefix.next[m, s] = prefix.ends[m, FREE]
    prefix.ends[m, FREE] = s


@_inlined
def _link_last(prefix, m, s, tier):
    """Slot s becomes the most recently used of machine m's tier (HBM or HOST)."""
    end = 3 * (tier - HBM)
    last = prefix.ends[m, end + 1]
    prefix.prev[m, s] = last
    prefix.next[m, s] = NONE
    if last != NONE:
        prefix.next[m, last] = s
    else:
        prefix.ends[m, end] = s
    prefix.ends[m, end + 1] = s
    prefix.tier[m, s] = tier
    prefix.ends[m, end + 2] += 1


@_inlined
def _move_to_front(prefix, m, s, tier):
    """The block in slot s becomes the most recently used of machine m's tier, leaving the
    other tier if it was there."""
    if prefix.tier[m, s] == tier and prefix.ends[m, 3 * (tier - HBM) + 1] == s:
        return
    _unlink(prefix, m, s)
    _link_last(prefix, m, s, tier)


@_inlined
def _to_hbm(prefix, m, b):
    """Block b becomes the most recently used of machine m's HBM list, leaving the host tier
    or entering the cache (in a free slot: the pool is sized so that one is left)."""
    i = _probe(prefix, m, b)
    s = prefix.table[m, i]
    if s == NONE:
        s = prefix.ends[m, FREE]
        if s == NONE:
            raise RuntimeError("prefix cache slot pool exhausted")
        prefix.ends[m, FREE] = prefix.next[m, s]
        prefix.block[m, s] = b
        prefix.keys[m, i] = b
        prefix.table[m, i] = s
        _link_last(prefix, m, s, HBM)
    else:
        _move_to_front(prefix, m, s, HBM)


@_compiled
def _evict_to(prefix, m, room):
    """Evict machine m's least recently used blocks until at most `room` are left in HBM; with
    a host tier each becomes the host's most recently used, and the host evicts its least
    recently used beyond its capacity."""
    host = prefix.ends[m, HOST_BLOCKS]
    while prefix.ends[m, 2] > room:
        if host > 0:
            _move_to_front(prefix, m, prefix.ends[m, 0], HOST)
        else:
            _drop(prefix, m, prefix.ends[m, 0])
    while prefix.ends[m, 5] > host:
        _drop(prefix, m, prefix.ends[m, 3])


@_compiled
def _trim_cache(prefix, machine, m, block):
    """Evict least recently used blocks down to the room its free KV memory leaves."""
    _evict_to(prefix, m, max(0, machine.capacity - machine.memory) // block)


@_compiled
def _clear_cache(prefix, m):
    """Machine m failed (or left the cluster): its cache is lost, its host tier with it."""
    while prefix.ends[m, 2] > 0:
        _drop(prefix, m, prefix.ends[m, 0])
    while prefix.ends[m, 5] > 0:
        _drop(prefix, m, prefix.ends[m, 3])


@_inlined
def _span(prefix, request):
    """Where the request's block ids lie in `ids`: positions start to stop (a ring: position p
    is ids[p & (len(ids) - 1)]), from its row of `offsets` (request number g: row g mod rows)."""
    row = request.number % prefix.offsets.shape[0]
    return prefix.offsets[row, 0], prefix.offsets[row, 1]


@_inlined
def _id_at(prefix, p):
    return prefix.ids[p & (len(prefix.ids) - 1)]


@_compiled
def _matched_blocks(prefix, m, request):
    """How many of the request's leading blocks machine m's cache holds in HBM, and how many of
    the blocks after those its host tier holds (a run; 0 without the tier)."""
    start, stop = _span(prefix, request)
    k = 0
    while start + k < stop and _tier(prefix, m, _id_at(prefix, start + k)) == HBM:
        k += 1
    h = k
    while start + h < stop and _tier(prefix, m, _id_at(prefix, start + h)) == HOST:
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
    start = _span(prefix, request)[0]
    k, h = _matched_blocks(prefix, m, request)
    for i in range(start + k + h - 1, start - 1, -1):
        _to_hbm(prefix, m, _id_at(prefix, i))
    hit = min((k + h) * block, request.prefill - 1)
    loaded = hit - min(k * block, hit)  # its host part
    machine.prefix_hits += hit
    prefix.ends[m, HOST_HITS] += loaded
    machine.prefix_tokens += request.prefill
    row = request.number % prefix.offsets.shape[0]
    prefix.offsets[row, 2] += hit  # the request's own counts, over its lookups
    prefix.offsets[row, 3] += request.prefill
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
    _enter(prefix, m, request)
    _trim_cache(prefix, machine, m, block)


@_compiled
def _enter(prefix, m, request):
    """The request's blocks enter machine m's cache (or are refreshed, leaving the host tier),
    the last first, so its first block is the most recently used."""
    start, stop = _span(prefix, request)
    for i in range(stop - 1, start - 1, -1):
        _to_hbm(prefix, m, _id_at(prefix, i))


@_compiled
def _prefix_seed(prefix, machine, m, request, block):
    """Request's KV arrived at its token machine m: its blocks enter the cache (or are
    refreshed) as `_prefix_insert` does, then the cache is trimmed to the machine's whole KV
    capacity (not to its free memory: that count may lag in a decode run, `decode_runs`; its
    next lookup or insertion trims to it)."""
    _enter(prefix, m, request)
    _evict_to(prefix, m, machine.capacity // block)


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
