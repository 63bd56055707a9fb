"""The fast core's records: what a run holds, and nothing that runs.

One numpy record per request (`REQUEST`) and per machine (`MACHINE`), the reference simulator's
`_Request` and `_Machine` (`simcore.refsim`) as fixed fields, so a compiled helper takes a
machine and reads `machine.pending` as the reference does; the named tuples of the other arrays
(curves, settings, heaps, routing pools, failures, resizes, progress); and `State`, the one named
tuple of all of them that the compiled steps take whole (`_run(state, until)`,
`_fail(state, m, now)`). Named tuples, not a jitclass: numba caches them on disk and the
install-time build (`simcore.aot`) exports functions that take them. Also the constants every
part shares (NONE, INF, the routing trees' layout, the recovery kinds, the loop's statuses).

Compiles no reference step.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np


NONE = -1
INF = np.inf

# Counts and indices are int32 (tokens of one request, request and machine indices and numbers,
# epochs: all far below 2**31, checked on entry) and times float64: 160 bytes a request instead
# of 240, so the records of an 840k-request run take 134 MB instead of 202 and more of them
# stay in cache. Arithmetic on them is int64 in numba, so nothing overflows in between.
REQUEST = np.dtype([
    # the fields a finishing decode touches (the first cache line)
    ("prompt", np.int32), ("output", np.int32), ("generated", np.int32),
    ("emitted", np.int32),          # tokens already sent (regenerated ones are not sent again):
    #                                 the most it generated, made current as generated is
    ("reservation", np.int32),      # KV tokens held while it decodes: prompt + output
    ("finish_tick", np.int32),      # running: its machine's decode_clock at its last token
    ("heap_child", np.int32), ("heap_sibling", np.int32),  # the running decodes' pairing heap
    ("prompt_machine", np.int32), ("token_machine", np.int32),
    ("queue_next", np.int32),       # prompt queue, later (remote decode) the decode wait
    ("batch_next", np.int32),       # prompts of the iteration in flight; running: silent decodes
    # its context after g >= 1 decode units: units x (prompt + 1) + context_rate x (g - 1),
    # units its machine's context_units (1: prompt + g tokens; speculative decoding: units are
    # steps, context in 1/CONTEXT_UNITS tokens, simcore.specdecode)
    ("context_rate", np.int32),
    # chunked prefill
    ("prefilled", np.int32),        # tokens of its prefill computed by ended iterations
    ("piece", np.int32),            # tokens of its prefill in the iteration in flight
    #   (paged KV, while it decodes, both are free and link the running decodes in the order
    #   they joined, `_link_running`: piece the one before, prefilled the one after)
    # failures (see simcore.refsim)
    ("prefill", np.int32),          # tokens its next prefill computes
    ("kv_from", np.int32),          # machine holding its KV until delivered (NONE: a replica)
    ("from_epoch", np.int32), ("token_epoch", np.int32), ("recover_kind", np.int32),
    ("recoveries", np.int32), ("recomputed", np.int32),
    ("number", np.int32),           # its arrival order (its index in the run; see run_streamed)
    ("arrival", np.float64), ("first_token", np.float64), ("finish", np.float64),
    ("kv_transfer", np.float64),
    ("last_token", np.float64),     # its latest output token (made current as generated is)
    ("lost_at", np.float64), ("ready_at", np.float64), ("recovery_s", np.float64),
], align=True)

INT32_LIMIT = 2**31 - 1

# The fields routing and every iteration read come first (two cache lines); indices and counts
# of requests are int32 as in REQUEST; token sums that can grow with the run stay int64.
MACHINE = np.dtype([
    ("pending", np.int64),          # prompt tokens routed here, not yet done (routing key)
    ("committed", np.int64),        # reservations of unfinished requests decoding here (key)
    ("memory", np.int64),           # KV tokens reserved by admitted requests
    ("capacity", np.int64),         # KV tokens it can hold
    ("running_context", np.int64),  # context tokens of the running decodes
    ("running_rate", np.int64),     # what their context grows by per iteration (their rates)
    ("context_units", np.int64),    # context units per token (1; speculative decoding: 256)
    ("decode_clock", np.int64),     # iterations ended; every running decode is in each
    ("run_ticks", np.int64),        # iterations in flight (a run of decode-only ones; see (4))
    ("chunk_left", np.int64),       # a chunk run's iteration ends not yet applied (see (4))
    ("role", np.int32), ("kind", np.int32),  # kind: index into curves
    ("capacity_class", np.int32),   # index of its capacity among the cluster's distinct ones
    ("epoch", np.int32),            # failures so far (a request's machine choice is per epoch)
    # list heads and tails
    ("prompt_head", np.int32), ("prompt_tail", np.int32), ("prompt_len", np.int32),
    ("wait_head", np.int32), ("wait_tail", np.int32),  # decodes waiting for memory
    ("running_root", np.int32),     # running decodes: root of their pairing heap
    ("running_count", np.int32),    # running decodes (the decode batch)
    ("batch_head", np.int32),       # prompts of the iteration in flight
    ("fresh_head", np.int32), ("fresh_count", np.int32),  # decodes joined since the last start
    ("silent_head", np.int32),      # running decodes with tokens to regenerate (`_count_silent`)
    ("busy", np.bool_),             # an iteration is in flight
    ("in_mixed", np.bool_),         # lent to the mixed pool
    ("touched", np.bool_),          # on the list of machines step (4) visits at this instant
    ("down", np.bool_),             # failed, not yet repaired
    ("retired", np.bool_),          # out of its pool (a plan's resize): takes no new request
    ("paused", np.bool_),           # prefill first: its decodes waited an iteration of prompts
    #                                 since their last token (at last_end)
    ("load_stale", np.bool_),       # its leaf in the load tree awaits the next read
    ("busy_until", np.float64), ("mixed_since", np.float64),
    ("run_start", np.float64), ("run_busy_s", np.float64),  # a run's start, busy_s before it
    ("chunk_base", np.float64),     # its iterations' time without context and chunk extra
    ("chunk_piece_s", np.float64),  # the prompt time of its piece alone
    ("chunk_prev_s", np.float64),   # the prompt time of the tokens prefilled before the next
    ("link", np.float64), ("visible", np.float64),  # KV link bytes/s, layer-wise visible s
    ("detect_at", np.float64), ("up_since", np.float64),  # failures
    ("last_end", np.float64),       # when its latest iteration ended
    # statistics
    ("busy_s", np.float64), ("iterations", np.int64), ("batch_size_sum", np.int64),
    ("max_memory", np.int64), ("mixed_s", np.float64),
    # chunked designs: prompt pieces run (a whole prompt is one) and their cost priced alone
    ("prompt_chunks", np.int64), ("chunked_prefill_s", np.float64),
    # paged KV: tokens admission leaves free, running decodes preempted, and the running
    # decodes in the order they joined (the last one is preempted first)
    ("watermark", np.int64), ("preemptions", np.int64),
    ("run_first", np.int32), ("run_last", np.int32),
    # prefix caching: tokens its lookups found cached, prefill tokens it looked up
    ("prefix_hits", np.int64), ("prefix_tokens", np.int64),
], align=True)

Curves = namedtuple("Curves", [  # knots padded into 2-D arrays (one row per SKU), with lengths
    "prompt_x", "prompt_y", "prompt_n", "decode_x", "decode_y", "decode_n", "context_s",
    "chunk_attention", "chunk_kv_read", "mixed_factor",  # mixed_factor: x the prompt curve
    "prompt_index", "decode_index",  # per SKU, where each of KNOT_BUCKETS buckets starts
    "prompt_scale", "decode_scale",  # per SKU, KNOT_BUCKETS / the knots' range
    # per SKU, the engine's host time (LatencyCurves.with_host) and whether it overlaps
    "iteration_overhead", "sequence_overhead", "overlap_host",
    "decode_q"])  # per SKU, each decode's tokens in a forward pass (speculative: k + 1)

# Knots are near-uniform grids (every 16 prompt tokens; every batch size, then every 8), so a
# query's bucket of the range gives its knot within a few steps instead of a binary search.
# 2048 buckets: one per 16 prompt tokens of a 32k-token curve, so the step after the bucket is
# rarely taken (512 cost 2-5% more per run; 4096 gained nothing more); 16 KB a curve.
KNOT_BUCKETS = 2048

Settings = namedtuple("Settings", [
    "kv_bytes", "layers", "mixed_pool", "prompt_token_limit", "queue_threshold",
    "layerwise_min", "detection", "replicate", "chunk_tokens", "regenerate",
    "kv_paged", "kv_block",  # paged KV admission, its block in tokens
    "prefill_first",  # whole-prompt iterations pause the running decodes
    "prefix_block",  # prefix caching: tokens per block (0: off)
    "prefix_route"])  # prefix-aware routing (with prefix_block > 0)

# prefix caching (`simcore.fast.prefix`): request number g's block ids (any ids >= 0) are at
# positions offsets[g mod rows, 0] to offsets[g mod rows, 1] of the ring `ids` (position p:
# ids[p & (len(ids) - 1)], a power of two; a whole run's ids in order, a streamed run's those
# of the requests not handed over); offsets[row, 2:4]: the tokens its lookups found cached and
# looked up; per machine m a pool of slots: slot s holds block id block[m, s] (NONE: free),
# its tier (0 free, HBM, HOST) and its LRU list links prev/next (a free slot's next: the next
# free one); keys[m], table[m]: open addressing from block id to slot (key NONE: empty), a
# power of two at least four times the slots; ends: per machine [least
# recently used, most recently used, count] of its HBM list, then of its host list, then the
# host tier's columns below, then the first free slot (in `ends`: with three arrays of their
# own and a MACHINE field instead, chunked runs measured about 10% slower with the cache off)
Prefix = namedtuple("Prefix", ["ids", "offsets", "block", "prev", "next", "tier", "keys",
                               "table", "ends"])

HBM, HOST = 1, 2  # Prefix.tier: the tier that holds a slot's block

# Prefix.ends's host tier columns: its capacity in blocks (0: none), the KV bytes per token, the
# host-to-GPU link in whole bytes/s, the host tokens the lookups since the machine's last
# iteration start loaded (that iteration waits for them), its hits' host tokens in all; then
# the head of the free slots' list
HOST_BLOCKS, KV_BYTES, HOST_LINK, LOAD_TOKENS, HOST_HITS, FREE = 6, 7, 8, 9, 10, 11

# failures: the schedule's rows (time, machine, down) and repairs (time, machine), both sorted,
# the replica peer of every machine (NONE: host memory), and the heap of lost requests to act
# on, keyed (time, request); next: [next failure, next repair]
Failures = namedtuple("Failures", ["schedule", "repairs", "peer", "recover", "next"])

# pools resized mid-run: rows (time, machine, +1 joins | -1 leaves) sorted; next: [next row]
Resizes = namedtuple("Resizes", ["rows", "next"])

# closed loop (`simcore.workload.ClosedLoop`): users N (0: an open loop, arrivals as filled),
# think: each request's think time by number, and pending: the heap of the users' next
# arrivals, keyed (time, the number of the request whose finish sent it); at most N entries
Closed = namedtuple("Closed", ["users", "think", "pending"])

RESTART, RETARGET, RESTORE = 0, 1, 2

RUN_PAUSED, RUN_DONE, RUN_STALLED = 0, 1, 2

# where the event loop stands: counts [next arrival, requests filled, requests finished] (in
# arrival order) and clock [the last instant run]
Progress = namedtuple("Progress", ["counts", "clock"])

Heap = namedtuple("Heap", ["key", "item", "size"])  # binary min-heap on (key, item); size: [n]

Touched = namedtuple("Touched", ["machine", "count"])  # machines step (4) visits; count: [n]

# Routing pools are tournament trees over machine indices, one row per tree: rank[tree, node] is
# the smallest (key, index) below the node, packed as key << MACHINE_BITS | index so that one
# integer comparison ranks two machines (EMPTY: no member); leaves at width/2 + machine index,
# the root at 1. The capacity-class trees make "the best machine that can hold the request"
# exact: within a class all capacities are equal, so a class's winner fits if any of its
# members does.
# The load trees are read only by the fallback route (and by every route of a baseline), so a
# change marks the machine stale and the trees are brought up to date when read: a tree is a
# function of its leaves, so the answer is the same, and most Splitwise runs never read them.
Pools = namedtuple("Pools", ["rank", "stale", "stale_count"])

MACHINE_BITS = 20                  # up to 1,048,575 machines; keys (tokens) below 2**43

MACHINE_MASK = (1 << MACHINE_BITS) - 1

EMPTY = np.iinfo(np.int64).max

TREE_PROMPT_PENDING, TREE_MIXED_PENDING, TREE_MIXED_COMMITTED, TREE_TOKEN_COMMITTED = 0, 1, 2, 3

TREE_PROMPT_COMMITTED = 4  # + capacity class: own-pool prompt machines by committed tokens

# then TREE_PROMPT_COMMITTED + classes + capacity class: every machine by load
KEY_PENDING, KEY_COMMITTED, KEY_LOAD = 0, 1, 2

# what changed about a machine, to re-rank it only in the trees where its rank can move
CHANGED_PENDING, CHANGED_COMMITTED, CHANGED_POOL = 1, 2, 4

CHANGED_ALL = CHANGED_PENDING | CHANGED_COMMITTED | CHANGED_POOL

# Everything a run holds, passed whole to the steps that touch several parts of it (the small
# helpers take the one record or tree they work on). The loop's position is in `progress`;
# where to stop is `_run`'s other argument.
State = namedtuple("State", [
    "requests",     # REQUEST records, request g in slot g % len(requests)
    "machines",     # MACHINE records, by machine index
    "curves",       # Curves: every SKU's latency curves, padded
    "settings",     # Settings: the cluster's scalars
    "kv_arrivals",  # Heap of KV caches in flight, keyed (arrival time, request number)
    "busy_heap",    # Heap of iteration ends, keyed (time, machine)
    "pools",        # Pools: the routing trees
    "touched",      # Touched: the machines step (4) visits at this instant
    "failures",     # Failures: the schedule, repairs, replica peers, lost requests
    "resizes",      # Resizes: a plan's pool changes
    "gaps",         # the ITL histogram (simcore.cluster.ITL_BINS counts)
    "residues",     # paged KV: per machine, its running decodes by (context - decode_clock)
    #                 mod kv_block (a row of one unused column when not paged)
    "progress",     # Progress: next arrival, requests filled and finished, the last instant
    "prefix",       # Prefix: the machines' prefix caches (placeholders when off)
    "closed",       # Closed: a closed loop's users and think times (users 0: open loop)
])

