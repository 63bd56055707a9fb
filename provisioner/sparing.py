"""--survive-failures auto (issue 29): how many spare machines a pool needs, from how often
machines fail and how long they stay down.

A machine is down a fraction q = repair / (MTBF + repair) of the time; with failures
independent, the machines of an n-machine pool down at once are Binomial(n, q). k is the
smallest number for which more than k are down at once with probability below
SPARE_TARGET (1e-4: about 53 minutes a year), over every pool of every design's optimum
without spares. The search is then N+k sized with that k (`--survive-failures k`) and the
pools grown by it are checked again (a larger pool may need a larger k).

Without --mtbf-hours the rate is the published fleet figure FLEET_MTBF_HOURS; the window's
simulations then draw no random failures (at 6,000 hours none would fall in it anyway).
"""
from __future__ import annotations

from typing import Iterable

# The Llama 3 paper (Meta, 2024, Section 3.3.4): 419 unexpected interruptions in 54 days of
# pre-training on 16,384 H100 GPUs, i.e. 2,048 8-GPU servers: 2,048 x 54 x 24 / 419 = 6,335
# hours between interruptions per server (78% of them hardware); rounded down.
FLEET_MTBF_HOURS = 6000.0
SPARE_TARGET = 1e-4
MAX_SPARES = 64   # --survive-failures' own bound


def down_fraction(mtbf_hours: float, repair_hours: float) -> float:
    return repair_hours / (mtbf_hours + repair_hours)


def more_than(k: int, n: int, q: float) -> float:
    """P(more than k of n machines down at once), each down with probability q."""
    if k >= n:
        return 0.0
    term = (1.0 - q) ** n          # P(none down)
    at_most = term
    for i in range(k):
        term *= (n - i) / (i + 1) * q / (1.0 - q)
        at_most += term
    return max(0.0, 1.0 - at_most)


def spares_for(pools: Iterable[int], q: float, target: float = SPARE_TARGET) -> int:
    """The smallest k for which no pool has more than k machines down at once with
    probability `target` or more."""
    k = 0
    for n in pools:
        while k < MAX_SPARES and more_than(k, n, q) >= target:
            k += 1
    return k


def spare_record(k: int, pools: list[int], mtbf_hours: float, repair_hours: float,
                 given_mtbf: bool) -> dict:
    """report.json `summary.survive_failures_auto`: the choice and why."""
    q = down_fraction(mtbf_hours, repair_hours)
    largest = max(pools) if pools else 0
    return {"k": k, "mtbf_hours": mtbf_hours,
            "mtbf_source": "--mtbf-hours" if given_mtbf else
            "the Llama 3 paper's fleet (419 interruptions in 54 days on 2,048 8-GPU servers)",
            "repair_hours": repair_hours, "down_fraction": q, "target": SPARE_TARGET,
            "largest_pool": largest,
            "p_more_than_k_down": more_than(k, largest, q) if largest else 0.0}
