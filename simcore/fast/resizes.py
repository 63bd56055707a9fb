"""(2r) Pools resized mid-run (a load-curve plan): machines leave and join their
pools, by index. A machine that leaves takes no new request (it leaves every routing tree) but
finishes what it holds.

Compiles the reference's resize step (`run`, after (2)).
"""
from __future__ import annotations

from .compiler import _compiled
from .records import CHANGED_ALL
from .pools import _refresh


@_compiled
def _resize_steps(state, now):
    """(2r) machines leave and join their pools, by index (see simcore.refsim)."""
    machines, pools, resizes = state.machines, state.pools, state.resizes
    rows = resizes.rows
    while resizes.next[0] < len(rows) and rows[resizes.next[0], 0] == now:
        m = int(rows[resizes.next[0], 1])
        machines[m].retired = rows[resizes.next[0], 2] < 0
        _refresh(pools, machines, m, CHANGED_ALL)
        resizes.next[0] += 1
