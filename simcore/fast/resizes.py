"""(2r) Pools resized mid-run (a load-curve plan): machines leave and join their
pools, by index. A machine that leaves takes no new request (it leaves every routing tree) but
finishes what it holds; one that joins starts with an empty prefix cache.

Compiles the reference's resize step (`run`, after (2)).
"""
from __future__ import annotations

from .compiler import _compiled
from .records import CHANGED_ALL
from .pools import _refresh
from .prefix import _clear_cache


@_compiled
def _resize_steps(state, now):
    """(2r) machines leave and join their pools, by index (see simcore.refsim)."""
    machines, pools, resizes = state.machines, state.pools, state.resizes
    rows = resizes.rows
    while resizes.next[0] < len(rows) and rows[resizes.next[0], 0] == now:
        m = int(rows[resizes.next[0], 1])
        machines[m].retired = rows[resizes.next[0], 2] < 0
        if rows[resizes.next[0], 2] > 0 and state.settings.prefix_block > 0:
            _clear_cache(state.prefix, m)  # it joins cold
        _refresh(pools, machines, m, CHANGED_ALL)
        resizes.next[0] += 1
