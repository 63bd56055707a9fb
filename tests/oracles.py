"""Synthetic feasibility oracles: pure functions of (design, P, T, rate) standing in for the
simulator, so the search engine can be checked against exhaustive enumeration exactly."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hardware_catalog import Catalog
from provisioner.study import SLO_KEYS, Outcome, Point

Rule = Callable[[str, int, int, float | None], bool]


@dataclass(frozen=True)
class OracleEvaluator:
    """Feasible iff rule(design, P, T, rate); SLO values say so (TTFT P99 over or under 6x)."""
    catalog: Catalog
    rule: Rule
    name: str

    def outcome(self, point: Point, seed: int) -> Outcome:
        ok = bool(self.rule(point.design.name, point.prompt_machines, point.token_machines,
                            point.rate_rps))
        value = 3.0 if ok else 9.0
        slo = tuple((key, value if key == "ttft_p99" else 1.0, 6.0 if key == "ttft_p99" else 10.0)
                    for key in SLO_KEYS)
        return Outcome(ok, True, "" if ok else "TTFT P99 9 > 6x", slo, 1.0 - value / 6.0, 100)

    def identity(self) -> dict:
        return {"oracle": self.name}

    def point_identity(self, point: Point) -> dict:
        return {"design": point.design.as_dict()}


# Top-level rules (picklable for process pools). P, T are the pool sizes; T is 0 for baselines.
def l_shape(design, p, t, rate):
    """Independent pools: 5 prompt and 3 token machines per 10 req/s (baselines: 7)."""
    scale = (rate or 10.0) / 10.0
    if t == 0:
        return p >= 7 * scale
    return p >= 5 * scale and t >= 3 * scale


def diagonal(design, p, t, rate):
    if t == 0:
        return p >= 11
    return p + t >= 12 and p >= 2


def hyperbola(design, p, t, rate):
    if t == 0:
        return p >= 9
    return p * t >= 40


def fleet_hyperbola(design, p, t, rate):
    """A fleet-scale staircase: hundreds of corners (P x T >= 40,000; baselines: 300)."""
    if t == 0:
        return p >= 300
    return p * t >= 40_000


def capacity(design, p, t, rate):
    """Sustainable rate min(10 P, 7 T) (baselines 4.5 N): monotone in P, T and rate."""
    limit = 4.5 * p if t == 0 else min(10.0 * p, 7.0 * t)
    return (rate or 0.0) <= limit


def never(design, p, t, rate):
    return False


def hole(design, p, t, rate):
    """Diagonal with one infeasible cell above the frontier (non-monotone)."""
    if (p, t) == (6, 8):
        return False
    return diagonal(design, p, t, rate)
