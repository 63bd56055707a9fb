"""(3) Requests that arrive: both machines picked at once, the prompt side first,
through the mixed pool; the fallback and baselines take the least-loaded machine that can hold
the request. Every choice is the (key, index)-smallest machine of a pool (`pools`): ties go to
the lowest index. Also the mixed pool's moves (`_enter_mixed`, `_leave_mixed_if_done`).

Compiles the reference's `_route`, `_choose_prompt_machine`, `_choose_token_machine`,
`_least_loaded`, `_enter_mixed` and `_maybe_leave_mixed`.
"""
from __future__ import annotations

from simcore.cluster import ROLE_BOTH, ROLE_PROMPT
from .compiler import _compiled, _inlined
from .records import (
    CHANGED_ALL, CHANGED_COMMITTED, CHANGED_PENDING, CHANGED_POOL, KEY_LOAD, NONE,
    TREE_MIXED_COMMITTED, TREE_MIXED_PENDING, TREE_PROMPT_COMMITTED, TREE_PROMPT_PENDING,
    TREE_TOKEN_COMMITTED)
from .structures import _push_prompt, _touch
from .pools import _classes, _key, _refresh, _update_load_trees, _winner
from .prefix import _aware_choice


@_compiled
def _enter_mixed(machine, now):
    machine.in_mixed = True
    machine.mixed_since = now


@_compiled
def _leave_mixed_if_done(machine, now):
    """A mixed-pool machine returns to its pool once it has no work of the other kind."""
    if not machine.in_mixed:
        return
    other_work = machine.committed if machine.role == ROLE_PROMPT else machine.pending
    if other_work == 0:
        machine.in_mixed = False
        machine.mixed_s += now - machine.mixed_since


@_compiled
def _best_prompt_machine_that_holds(machines, pools, reservation):
    """The prompt-pool machine with the fewest committed tokens that can take the request."""
    best = NONE
    for c in range(_classes(pools)):
        m = _winner(pools, TREE_PROMPT_COMMITTED + c)
        if (m != NONE and machines[m].committed + reservation <= machines[m].capacity
                and (best == NONE or machines[m].committed < machines[best].committed
                     or (machines[m].committed == machines[best].committed and m < best))):
            best = m
    return best


@_compiled
def _least_loaded(machines, pools, reservation):
    """Fallback (and baseline): fewest pending + committed tokens among machines that fit."""
    _update_load_trees(pools, machines)
    classes = _classes(pools)
    best = NONE
    for c in range(classes):
        m = _winner(pools, TREE_PROMPT_COMMITTED + classes + c)
        if (m != NONE and machines[m].capacity >= reservation
                and (best == NONE or _key(machines[m], KEY_LOAD) < _key(machines[best], KEY_LOAD)
                     or (_key(machines[m], KEY_LOAD) == _key(machines[best], KEY_LOAD)
                         and m < best))):
            best = m
    return best


@_compiled
def _is_long(machine, settings, prompt):
    return machine.prompt_len > 0 and machine.pending + prompt > settings.queue_threshold


@_compiled
def _is_loaded(machine, reservation):
    return machine.committed + reservation > machine.capacity


@_compiled
def _lend(machines, pools, m, now):
    """Move machine m into the mixed pool (NONE: nothing to move)."""
    if m != NONE:
        _enter_mixed(machines[m], now)
        _refresh(pools, machines, m, CHANGED_POOL)
    return m


@_compiled
def _choose_prompt_machine(machines, settings, pools, prompt, now, own):
    """Own pool (`own`: its choice); with the mixed pool, unless the queue is long: the mixed
    pool's best, else lend the token machine with the fewest committed tokens. Returns (choice,
    lent machine), NONE for none."""
    if not settings.mixed_pool or (own != NONE and not _is_long(machines[own], settings, prompt)):
        return own, NONE
    mixed = _winner(pools, TREE_MIXED_PENDING)
    if mixed != NONE and not _is_long(machines[mixed], settings, prompt):
        return mixed, NONE
    lent = _lend(machines, pools, _winner(pools, TREE_TOKEN_COMMITTED), now)
    return lent, lent


@_compiled
def _choose_token_machine(machines, settings, pools, reservation, now):
    """Own pool; with the mixed pool, unless it is loaded: the mixed pool's best, else lend the
    prompt machine with the fewest committed tokens that can hold the request."""
    own = _winner(pools, TREE_TOKEN_COMMITTED)
    if not settings.mixed_pool or (own != NONE and not _is_loaded(machines[own], reservation)):
        return own, NONE
    mixed = _winner(pools, TREE_MIXED_COMMITTED)
    if mixed != NONE and not _is_loaded(machines[mixed], reservation):
        return mixed, NONE
    lent = _lend(machines, pools,
                 _best_prompt_machine_that_holds(machines, pools, reservation), now)
    return lent, lent


@_inlined
def _route(state, r, now):
    """Pick both machines on arrival (prompt side first) and queue the prompt; False when no
    machine that can hold the request is up."""
    requests, machines, settings = state.requests, state.machines, state.settings
    pools, touched = state.pools, state.touched
    request = requests[r]
    prompt_m, token_m = NONE, NONE
    lent_p, lent_t = NONE, NONE
    if machines[0].role != ROLE_BOTH:
        own = (_aware_choice(machines, state.prefix, request, settings.prefix_block, False)
               if settings.prefix_route else _winner(pools, TREE_PROMPT_PENDING))
        prompt_m, lent_p = _choose_prompt_machine(machines, settings, pools, request.prefill,
                                                  now, own)
        if prompt_m != NONE:
            token_m, lent_t = _choose_token_machine(machines, settings, pools,
                                                    request.reservation, now)
    elif settings.prefix_route:
        prompt_m = token_m = _aware_choice(machines, state.prefix, request,
                                           settings.prefix_block, True)
    if prompt_m == NONE or token_m == NONE:
        prompt_m = token_m = _least_loaded(machines, pools, request.reservation)
    if prompt_m == NONE:
        for m in (lent_p, lent_t):
            if m != NONE:
                _leave_mixed_if_done(machines[m], now)
                _refresh(pools, machines, m, CHANGED_ALL)
        return False
    request.prompt_machine = prompt_m
    request.token_machine = token_m
    request.token_epoch = machines[token_m].epoch
    request.kv_from = prompt_m
    _push_prompt(requests, machines[prompt_m], r)
    machines[prompt_m].pending += request.prefill
    machines[token_m].committed += request.reservation
    # a machine lent for nothing (the fallback took over) returns at once
    for m in (lent_p, lent_t):
        if m != NONE:
            _leave_mixed_if_done(machines[m], now)
            _refresh(pools, machines, m, CHANGED_ALL)
    _refresh(pools, machines, prompt_m, CHANGED_PENDING)
    _refresh(pools, machines, token_m, CHANGED_COMMITTED)
    _touch(touched, machines[prompt_m], prompt_m)
    return True
