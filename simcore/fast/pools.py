"""Routing pools as tournament trees over machine indices (see `records.Pools`): each
tree's winner is its (key, index)-smallest member, so the tie rule is the reference's (the lowest
index). A machine is re-ranked only in the trees where its rank can move (`_refresh` with CHANGED_*
bits); the load trees, read only by the fallback route and by baselines, are brought up to date
when read.

Compiles the reference's pool scans (`min(pool, key=...)` in `_route`, `_least_loaded` and the
mixed pool's choices) as O(log machines) updates instead of O(machines) scans.
"""
from __future__ import annotations

from simcore.cluster import ROLE_BOTH, ROLE_PROMPT
from .compiler import _compiled, _inlined
from .records import (
    CHANGED_COMMITTED, CHANGED_PENDING, CHANGED_POOL, EMPTY, KEY_COMMITTED, KEY_LOAD, KEY_PENDING,
    MACHINE_BITS, MACHINE_MASK, NONE, TREE_MIXED_COMMITTED, TREE_MIXED_PENDING,
    TREE_PROMPT_COMMITTED, TREE_PROMPT_PENDING, TREE_TOKEN_COMMITTED)


@_inlined
def _key(machine, key):
    if key == KEY_PENDING:
        return machine.pending
    if key == KEY_COMMITTED:
        return machine.committed
    return machine.pending + machine.committed


@_inlined
def _classes(pools):
    return (len(pools.rank) - TREE_PROMPT_COMMITTED) // 2


@_inlined
def _winner(pools, tree):
    """The tree's (key, index)-smallest machine, NONE if it has no member."""
    top = pools.rank[tree, 1]
    return NONE if top == EMPTY else top & MACHINE_MASK


@_inlined
def _tree_key(tree, classes):
    if tree == TREE_PROMPT_PENDING or tree == TREE_MIXED_PENDING:
        return KEY_PENDING
    return KEY_COMMITTED if tree < TREE_PROMPT_COMMITTED + classes else KEY_LOAD


@_inlined
def _membership(machine, slot, classes):
    """The slot-th tree machine m can belong to (NONE: no such tree) and whether it is in."""
    # a down or retired machine is in no tree: the router never picks it
    up = not machine.down and not machine.retired
    own = not machine.in_mixed and up
    if slot == 0:
        return TREE_PROMPT_COMMITTED + classes + machine.capacity_class, up
    if machine.role == ROLE_BOTH:
        return NONE, False
    if slot == 1:
        return (TREE_PROMPT_PENDING if machine.role == ROLE_PROMPT else TREE_TOKEN_COMMITTED), own
    if slot == 2:
        if machine.role != ROLE_PROMPT:
            return NONE, False
        return TREE_PROMPT_COMMITTED + machine.capacity_class, own
    return ((TREE_MIXED_PENDING if slot == 3 else TREE_MIXED_COMMITTED),
            machine.in_mixed and up)


@_inlined
def _changes(machine, pending, committed, in_mixed):
    """What changed since the machine had these pending and committed tokens and pool."""
    return ((CHANGED_PENDING if machine.pending != pending else 0)
            | (CHANGED_COMMITTED if machine.committed != committed else 0)
            | (CHANGED_POOL if machine.in_mixed != in_mixed else 0))


@_inlined
def _key_changes(key):
    if key == KEY_PENDING:
        return CHANGED_PENDING
    return CHANGED_COMMITTED if key == KEY_COMMITTED else CHANGED_PENDING | CHANGED_COMMITTED


@_compiled
def _refresh(pools, machines, m, changed):
    """Re-rank machine m after `changed` (CHANGED_* bits): in every tree it can belong to if its
    pool changed, else in the trees it is in whose key changed (the load tree: marked stale)."""
    classes = _classes(pools)
    for slot in range(5):
        tree, member = _membership(machines[m], slot, classes)
        if tree == NONE:
            continue
        kind = _tree_key(tree, classes)
        if not (changed & CHANGED_POOL or (member and changed & _key_changes(kind))):
            continue
        if slot == 0:  # the load tree: updated when read (see Pools)
            if not machines[m].load_stale:
                machines[m].load_stale = True
                pools.stale[pools.stale_count[0]] = m
                pools.stale_count[0] += 1
            continue
        _set_leaf(pools.rank[tree], m, member, _key(machines[m], kind))


@_compiled
def _update_load_trees(pools, machines):
    """Bring the stale machines' load-tree leaves (and their paths) up to date."""
    classes = _classes(pools)
    for i in range(pools.stale_count[0]):
        m = pools.stale[i]
        machines[m].load_stale = False
        tree, member = _membership(machines[m], 0, classes)
        _set_leaf(pools.rank[tree], m, member, _key(machines[m], KEY_LOAD))
    pools.stale_count[0] = 0


@_inlined
def _set_leaf(rank, m, member, key):
    """Set machine m's leaf, then replay the matches on its path to the root until a match
    comes out as before."""
    leaf = len(rank) // 2 + m
    rank[leaf] = (key << MACHINE_BITS | m) if member else EMPTY
    i = leaf // 2
    while i >= 1:
        best = min(rank[2 * i], rank[2 * i + 1])
        if rank[i] == best:
            break  # this match and all above it come out as before
        rank[i] = best
        i //= 2
