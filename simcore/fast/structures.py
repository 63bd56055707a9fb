"""The core's containers, all without allocation: a binary min-heap on (key, item)
(the busy heap of iteration ends, KV arrivals, lost requests), the intrusive FIFO queues threaded
through the request records (a machine's prompt queue and decode wait: `queue_next`), the running
decodes' pairing heap keyed (finish tick, request) (`heap_child`, `heap_sibling`), and the list of
machines touched at this instant; with paged KV, the running decodes in the order they joined
(`_link_running`, through two fields free while a request decodes).

Compiles the reference's lists (`queue`, `waiting`, `running`) and its order of events with equal
times: every heap breaks ties by item (machine index or request number), as the reference does.
"""
from __future__ import annotations

from .compiler import _compiled, _inlined
from .records import NONE


@_inlined
def _precedes(key_a, item_a, key_b, item_b):
    """The heaps' order: by key, then by item."""
    return key_a < key_b or (key_a == key_b and item_a < item_b)


@_compiled
def _heap_push(heap, key, item):
    """Add (key, item) at the bottom and let it rise (`_rise`)."""
    i = heap.size[0]
    heap.size[0] += 1
    _rise(heap.key, heap.item, i, key, item)


@_inlined
def _rise(keys, items, i, key, item):
    """Place (key, item) at the hole i or above it: the parents it precedes move down into the
    hole (one store a level instead of a swap)."""
    while i > 0:
        parent = (i - 1) // 2
        if _precedes(keys[parent], items[parent], key, item):
            break
        keys[i] = keys[parent]
        items[i] = items[parent]
        i = parent
    keys[i] = key
    items[i] = item


@_compiled
def _sift_down(heap, i):
    keys, items, size = heap.key, heap.item, heap.size[0]
    while True:
        left, right, best = 2 * i + 1, 2 * i + 2, i
        if left < size and _precedes(keys[left], items[left], keys[best], items[best]):
            best = left
        if right < size and _precedes(keys[right], items[right], keys[best], items[best]):
            best = right
        if best == i:
            break
        keys[best], keys[i] = keys[i], keys[best]
        items[best], items[i] = items[i], items[best]
        i = best


@_compiled
def _heap_pop(heap):
    """Remove and return the (key, item)-minimal item. Bottom-up (Floyd): the hole at the top
    takes its smaller child all the way down, one comparison a level, and the last entry,
    usually among the largest, rises from the bottom into it, a level or two. Which entry
    comes out is the same as with the usual sift-down: (key, item) pairs order totally."""
    keys, items = heap.key, heap.item
    top = items[0]
    size = heap.size[0] - 1
    heap.size[0] = size
    key, item = keys[size], items[size]
    i = 0
    child = 1
    while child < size:
        right = child + 1
        if right < size and _precedes(keys[right], items[right], keys[child], items[child]):
            child = right
        keys[i] = keys[child]
        items[i] = items[child]
        i = child
        child = 2 * i + 1
    _rise(keys, items, i, key, item)
    return top


@_compiled
def _heapify(heap, size):
    """Keep the first `size` entries (compacted by the caller) as a heap."""
    heap.size[0] = size
    for i in range(size // 2 - 1, -1, -1):
        _sift_down(heap, i)


@_inlined
def _user_thinks(closed, number, now):
    """Closed loop: request `number` finished now; its user sends the next one after its think
    time (pending until then; `loop._next_user_arrival`)."""
    if closed.users > 0:
        _heap_push(closed.pending, now + closed.think[number], number)


@_compiled
def _push_prompt(requests, machine, r):
    requests[r].queue_next = NONE
    if machine.prompt_tail != NONE:
        requests[machine.prompt_tail].queue_next = r
    else:
        machine.prompt_head = r
    machine.prompt_tail = r
    machine.prompt_len += 1


@_compiled
def _pop_prompt(requests, machine):
    r = machine.prompt_head
    machine.prompt_head = requests[r].queue_next
    if machine.prompt_head == NONE:
        machine.prompt_tail = NONE
    machine.prompt_len -= 1
    return r


@_compiled
def _push_wait(requests, machine, r):
    requests[r].queue_next = NONE
    if machine.wait_tail != NONE:
        requests[machine.wait_tail].queue_next = r
    else:
        machine.wait_head = r
    machine.wait_tail = r


@_compiled
def _pop_wait(requests, machine):
    r = machine.wait_head
    machine.wait_head = requests[r].queue_next
    if machine.wait_head == NONE:
        machine.wait_tail = NONE
    return r


@_inlined
def _before(requests, a, b):
    """Pairing-heap order: (finish tick, request)."""
    ta, tb = requests[a].finish_tick, requests[b].finish_tick
    return ta < tb or (ta == tb and a < b)


@_compiled
def _meld(requests, a, b):
    """Meld two heap roots (neither has siblings): the later becomes the earlier's first child."""
    if _before(requests, b, a):
        a, b = b, a
    requests[b].heap_sibling = requests[a].heap_child
    requests[a].heap_child = b
    return a


@_compiled
def _pop_root(requests, root):
    """The heap left when `root` is removed: its children melded in pairs left to right, then
    the pairs melded right to left (the two-pass pairing heap, O(log n) amortized)."""
    pairs = NONE  # melded pairs, last first, linked through heap_sibling
    x = requests[root].heap_child
    while x != NONE:
        y = requests[x].heap_sibling
        requests[x].heap_sibling = NONE
        if y == NONE:
            requests[x].heap_sibling = pairs
            pairs = x
            break
        after = requests[y].heap_sibling
        requests[y].heap_sibling = NONE
        x = _meld(requests, x, y)
        requests[x].heap_sibling = pairs
        pairs = x
        x = after
    heap = NONE
    while pairs != NONE:
        after = requests[pairs].heap_sibling
        requests[pairs].heap_sibling = NONE
        heap = pairs if heap == NONE else _meld(requests, heap, pairs)
        pairs = after
    return heap


@_compiled
def _append_running(requests, machine, r):
    """Admit request r to the machine's running decodes: its last token comes after as many
    more iterations as it has tokens left. One with tokens to regenerate (already sent before
    a loss) also joins the machine's silent decodes."""
    request = requests[r]
    request.finish_tick = machine.decode_clock + request.output - request.generated
    request.heap_child = request.heap_sibling = NONE
    machine.running_root = r if machine.running_root == NONE else _meld(
        requests, machine.running_root, r)
    request.queue_next = machine.fresh_head  # free while it decodes (see `_count_gaps`)
    machine.fresh_head = r
    machine.fresh_count += 1
    if request.emitted > request.generated:  # it regenerates tokens already sent first
        request.batch_next = machine.silent_head  # (free while it decodes)
        machine.silent_head = r
    machine.running_count += 1
    machine.running_context += (machine.context_units * (request.prompt + 1)
                                + request.context_rate * (request.generated - 1))
    machine.running_rate += request.context_rate


@_compiled
def _pop_running(requests, machine):
    """Remove the running decode that finishes first; its generated tokens made current."""
    r = machine.running_root
    request = requests[r]
    machine.running_root = _pop_root(requests, r)
    request.generated = request.output - (request.finish_tick - machine.decode_clock)
    machine.running_count -= 1
    machine.running_context -= (machine.context_units * (request.prompt + 1)
                                + request.context_rate * (request.generated - 1))
    machine.running_rate -= request.context_rate
    return r


@_inlined
def _touch(touched, machine, m):
    if not machine.touched:
        machine.touched = True
        touched.machine[touched.count[0]] = m
        touched.count[0] += 1


@_inlined
def _blocks(tokens, block):
    """Paged KV: tokens rounded up to whole blocks."""
    return (tokens + block - 1) // block * block


@_inlined
def _kv_tokens(request, generated):
    """Paged KV: the tokens of a request's KV after `generated` decode units
    (`simcore.refsim._Request.kv_tokens`): prompt + generated; speculative decoding: prompt +
    1 + floor((L - 1) (g - 1) / S) for g >= 1, its L - 1 tokens after the first over S steps."""
    steps = request.output - 1
    if generated <= 1 or steps <= 0:
        return request.prompt + generated
    return (request.prompt + 1
            + (request.reservation - request.prompt - 1) * (generated - 1) // steps)


@_compiled
def _link_running(requests, machine, r):
    """Paged KV: request r joins the end of the machine's running decodes in the order they
    joined (`piece` links to the one before, `prefilled` to the one after: both free while it
    decodes)."""
    request = requests[r]
    request.piece = machine.run_last
    request.prefilled = NONE
    if machine.run_last != NONE:
        requests[machine.run_last].prefilled = r
    else:
        machine.run_first = r
    machine.run_last = r


@_compiled
def _unlink_running(requests, machine, r):
    request = requests[r]
    before, after = request.piece, request.prefilled
    if before != NONE:
        requests[before].prefilled = after
    else:
        machine.run_first = after
    if after != NONE:
        requests[after].piece = before
    else:
        machine.run_last = before
    request.piece = request.prefilled = 0
