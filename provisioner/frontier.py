"""The search algorithm: the cheapest, least-power or highest-throughput cluster of every design.

Feasibility (all SLOs met) is assumed (nearly) monotone: more machines never hurt, a higher rate
never helps. So instead of the full (P, T) grid the search
- grows a feasible corner by doubling both pools, then walks the staircase of the feasibility
  frontier from the fewest token machines up, resolving only the corners that cost (min-power:
  draw) no more than the cheapest point found so far (`budget_walk`);
- for max-rate, lists the budget's maximal (P, T) candidates and finds the best one by a pattern
  search over them, each candidate tested first at just above the best rate so far (one
  simulation to rule it out), with galloping + bisection on the rate;
- picks the optimum among the evaluated feasible points with OR-Tools CP-SAT, which also applies
  the extra linear constraints (machines, GPUs, per-pool limits, budget). The optimum is always a
  simulated point.
`exhaustive` evaluates every grid point instead and reports non-monotone cells.

Each design's search is a generator that yields the points it needs and receives their metrics;
`drive` runs the generators of all designs in lockstep, so a batch holds one step of every design
and is evaluated in parallel, in a fixed order; on local worker processes each design instead
asks on its own as soon as its last answer is in. Either way results never depend on the
backend or job count.
"""
from __future__ import annotations

import bisect
import math
import threading
from types import SimpleNamespace
from typing import Any, Callable, Generator, Iterable, NamedTuple, Sequence

import numpy as np

from hardware_catalog import Design
from provisioner.chunked import goal_key, metrics_key
from provisioner.options import Constraints, SearchSettings
from provisioner.select import MILLI, select_optimum
from provisioner.study import Asked, Budget, DesignResult, Goal, Metrics, Point
from provisioner.verify import QUICK_SAMPLES, Verify

Search = Generator[list[Point], list[Metrics], Any]
RunBatch = Callable[[list[Point]], list[Metrics]]  # "evaluate these points", in order


# ------------------------------------------------------------------------------------ probing
def round_rate(rate: float) -> float:
    """Rates are kept to 4 significant digits: readable reports, stable cache keys."""
    return float(f"{rate:.4g}")


def _rate_covers(known: float | None, asked: float | None) -> bool:
    """Is `known` >= `asked` (None = the trace's own rate, equal only to itself)?"""
    if known is None or asked is None:
        return known is asked
    return known >= asked


class Probe:
    """Asks for evaluations by yielding points; remembers answers and infers by monotonicity."""

    def __init__(self, design: Design, infer: bool = True):
        self.design = design
        self.infer = infer
        self.seen: dict[Point, Metrics] = {}

    def point(self, prompt: int, token: int, rate: float | None) -> Point:
        return Point(self.design, prompt, token, rate)

    def measure_all(self, points: Sequence[Point]):
        todo = list(dict.fromkeys(p for p in points if p not in self.seen))
        if todo:
            answers = yield todo
            self.seen.update(zip(todo, answers))
        return [self.seen[p] for p in points]

    def measure(self, prompt: int, token: int, rate: float | None):
        (metrics,) = yield from self.measure_all([self.point(prompt, token, rate)])
        return metrics

    def meets_slos(self, prompt: int, token: int, rate: float | None):
        known = self.inferred(prompt, token, rate)
        if known is not None:
            return known
        return (yield from self.measure(prompt, token, rate)).meets_slos

    def inferred(self, prompt: int, token: int, rate: float | None) -> bool | None:
        exact = self.seen.get(self.point(prompt, token, rate))
        if exact is not None:
            return exact.meets_slos
        if not self.infer:
            return None
        for point, m in self.seen.items():
            if (m.meets_slos and point.prompt_machines <= prompt and point.token_machines <= token
                    and _rate_covers(point.rate_rps, rate)):
                return True   # a smaller cluster already held a higher load
            if (not m.meets_slos and point.prompt_machines >= prompt
                    and point.token_machines >= token and _rate_covers(rate, point.rate_rps)):
                return False  # a larger cluster already failed a lower load
        return None


def lowest(pred, lo: int, hi: int):
    """Smallest x in [lo, hi] with pred(x), given pred(hi) and monotone pred: bisection."""
    while lo < hi:
        mid = (lo + hi) // 2
        if (yield from pred(mid)):
            hi = mid
        else:
            lo = mid + 1
    return hi


def lowest_galloping(pred, lo: int, hi: int):
    """As `lowest`, probing lo, lo+1, lo+3, lo+7, ... first: cheap when the answer is near lo."""
    offset, failed = 0, lo - 1
    while lo + offset < hi:
        if (yield from pred(lo + offset)):
            hi = lo + offset
            break
        failed = lo + offset
        offset = 2 * offset + 1
    return (yield from lowest(pred, failed + 1, hi))


# ---------------------------------------------------------------------- fixed rate: frontier
def _pool_caps(design: Design, constraints: Constraints, limit: int) -> tuple[int, int]:
    """Largest prompt and token pools any allowed configuration can have (baseline: (N, 0))."""
    c = constraints
    if design.is_baseline:
        cap = min(limit, c.max_machines or limit)
        if c.max_gpus:
            cap = min(cap, c.max_gpus // design.prompt.gpus)
        return cap, 0
    p_cap = min(limit, c.max_prompt or limit, (c.max_machines or limit + 1) - 1)
    t_cap = min(limit, c.max_token or limit, (c.max_machines or limit + 1) - 1)
    if c.max_gpus:
        p_cap = min(p_cap, (c.max_gpus - design.token.gpus) // design.prompt.gpus)
        t_cap = min(t_cap, (c.max_gpus - design.prompt.gpus) // design.token.gpus)
    return p_cap, t_cap


CANNOT_BEAT = "cannot beat the best layout: no pool sizes that cost less meet the SLOs"
GROWTH_CHECKED = 256   # up to here pools double blindly; beyond, only while margins improve


def _grow(probe: Probe, rate, p_cap: int, t_cap: int, baseline: bool,
          start: tuple[int, int] = (1, 1)):
    """Double the pools from `start` ((1, 1), or pool sizes a capacity bound says are needed)
    until feasible: ((P, T), "") or (None, why not).

    Beyond GROWTH_CHECKED machines it stops early when doubling both pools no longer improves
    the worst SLO margin: the SLOs are then out of reach at any size (e.g. one long prompt
    alone misses its TTFT), and simulating ever larger fleets would only cost time."""
    p, t, before = min(start[0], p_cap), 0 if baseline else min(max(start[1], 1), t_cap), None
    while True:
        m = yield from probe.measure(p, t, rate)
        if m.meets_slos:
            return (p, t), ""
        margin = m.outcome.worst_margin
        if p >= p_cap and t >= t_cap:
            why = f": {m.outcome.reason}" if m.outcome.reason else ""
            return None, (f"infeasible even with {_describe(p, t, baseline)}{why} (the search "
                          "grows pools up to --search-limit; raise it or the --max-* limits)")
        if (p + t > GROWTH_CHECKED and before is not None and margin is not None
                and margin <= before + 1e-9):
            return None, (f"infeasible at any size: doubling to {_describe(p, t, baseline)} "
                          f"no longer improves the SLOs ({m.outcome.reason})")
        before = margin
        p, t = min(2 * p, p_cap), (0 if baseline else min(2 * t, t_cap))


WALK_CORNERS = 32   # past this many token pools the staircase is searched, not walked
STAIRCASE_NEIGHBOURS = 16   # token pools either side of the cheapest one found, looked at too


def budget_walk(probe: Probe, rate, p_hi: int, t_hi: int,
                objective: Callable[[int, int], float], budget: float = math.inf):
    """The corners of the feasibility staircase below (p_hi, t_hi) that cost no more than
    `budget` (the objective of a feasible point already found, e.g. the growth's corner),
    walked from the fewest token machines up; past WALK_CORNERS token pools the rest is
    searched for its cheapest point (`cheapest_on_staircase`), up to the last token pool that
    could still hold a corner within the budget (`_tightened_floor`).

    With g(T) the smallest feasible prompt pool at T (non-increasing), a corner at T needs
    g(T) below the previous corner's prompt pool and, to matter, objective(g(T), T) <= the
    cheapest corner so far. The largest such prompt pool is arithmetic, so a token pool costs
    one simulation there (infeasible: no corner worth having at T) and a descent only where a
    cheaper corner is. The first such miss fixes a floor: g at the largest token pool that
    could still hold a cheap enough corner (no later corner has fewer prompt machines); the
    walk ends where the floor itself costs more than the cheapest corner. So the expensive
    corners (few prompt machines, many token machines), which a walk from that end resolves
    first, are never resolved."""
    def at_token(t):
        return lambda p: probe.meets_slos(p, t, rate)

    t_min = yield from lowest(lambda t: probe.meets_slos(p_hi, t, rate), 1, t_hi)
    corners: list[tuple[int, int]] = []
    floor, floor_known = 1, False   # g(T) >= floor for every T walked
    high = p_hi   # g(t_min) <= p_hi
    for t in range(t_min, t_hi + 1):
        if _none_left(objective, budget, (floor, high), t):
            break
        if t - t_min >= WALK_CORNERS:
            floor, t_top = yield from _tightened_floor(probe, rate, objective, budget,
                                                       (floor, high), (t, t_hi), p_hi)
            if t_top is None:
                break   # no corner left that costs no more than the cheapest one
            rest = yield from cheapest_on_staircase(probe, rate, (t, t_top), (floor, high),
                                                    objective)
            return [*rest, *reversed(corners)]
        cap = _largest(lambda p, t=t: objective(p, t), budget, floor, high)
        if not (yield from probe.meets_slos(cap, t, rate)):
            if not floor_known:   # past the cheap corners: bound the walk's end
                last = _largest(lambda u, p=floor: objective(p, u), budget, t, t_hi)
                floor = yield from lowest(at_token(last), floor, p_hi)
                floor_known = True
            continue   # g(t) > cap: a corner here would cost more than the cheapest one
        # the first corner is bisected (the growth's corner may be far above it); the next
        # ones are usually a step or two below their neighbour
        p = yield from (_lowest_from_top if corners else lowest)(at_token(t), floor, cap)
        corners.append((p, t))
        budget = min(budget, objective(p, t))
        high = p - 1   # the next corner has fewer prompt machines
    return list(reversed(corners))


def _tightened_floor(probe: Probe, rate, objective: Callable[[int, int], float],
                     budget: float, prompts: tuple[int, int], tokens: tuple[int, int],
                     p_hi: int):
    """Before the staircase is searched over the token pools `tokens` for corners with a
    prompt pool in `prompts` (floor, high): (floor, t_top), t_top the last token pool that
    could still hold a corner costing no more than `budget` and floor a lower bound on the
    smallest feasible prompt pool g up to it; (floor, None) when no token pool can.

    g is non-increasing, so one infeasible point (p, t_top) puts g above p at every token
    pool up to t_top. Each step asks the point that, infeasible, rules out the upper half
    of the token pools left (its p is the largest prompt pool at which a corner there would
    still cost no more than `budget`), and stops at the first feasible one: one simulation
    a halving, one when nothing can be cut. Without it, a staircase whose costs only rise
    past the walk was searched to the end of the box."""
    floor, high = prompts
    low, t_top = tokens
    top = min(high + 1, p_hi)   # feasible at every token pool searched
    while True:
        t_top = _largest(lambda u, p=floor: objective(p, u), budget, low, t_top)
        if t_top <= low:
            return floor, t_top
        half = (low + t_top) // 2
        cut = _largest(lambda p, t=half + 1: objective(p, t), budget, floor, high)
        if cut >= top or (yield from probe.meets_slos(cut, t_top, rate)):
            return floor, t_top
        floor = cut + 1   # g > cut up to t_top: every corner past `half` costs more
        if _none_left(objective, budget, (floor, high), low):
            return floor, None


def _none_left(objective: Callable[[int, int], float], budget: float,
               prompts: tuple[int, int], token: int) -> bool:
    """No corner left to find: none has a prompt pool in `prompts` (floor, high), or even the
    floor at `token` (the fewest token machines still to look at) costs more than `budget`."""
    floor, high = prompts
    return high < floor or objective(floor, token) > budget + _slack(budget)


def _slack(budget: float) -> float:
    """Equal objectives qualify (ties are the optimum's too): a float's rounding apart."""
    return 1e-9 * max(1.0, abs(budget)) if math.isfinite(budget) else 0.0


def _largest(cost: Callable[[int], float], budget: float, low: int, high: int) -> int:
    """The largest x in [low, high] with cost(x) <= budget, given cost(low) is (cost grows
    with x)."""
    limit = budget + _slack(budget)
    while low < high:
        mid = (low + high + 1) // 2
        if cost(mid) <= limit:
            low = mid
        else:
            high = mid - 1
    return low


def _lowest_from_top(pred, lo: int, hi: int):
    """As `lowest`, given pred(hi), probing hi - 1, hi - 2, hi - 4, ... first: cheap when the
    answer is near hi (the next corner of a staircase is usually a step or two down)."""
    step = 1
    while hi - step >= lo:
        if not (yield from pred(hi - step)):
            return (yield from lowest(pred, hi - step + 1, hi))
        hi -= step
        step *= 2
    return (yield from lowest(pred, lo, hi))


def cheapest_on_staircase(probe: Probe, rate, tokens: tuple[int, int],
                          prompts: tuple[int, int], objective: Callable[[int, int], float]):
    """The staircase's points (f(T), T) at the token pools a ternary search visits for the
    cheapest one, T in `tokens`, f(T) (the smallest feasible prompt pool) in `prompts`.

    Along the staircase the objective first falls (a token machine saves more than a prompt
    machine costs) and then rises; a ternary search over T finds its minimum in O(log T)
    points, each bisected within the prompt pools its known neighbours allow (f is
    non-increasing), so O(log T x log P) simulations instead of O(T log P) for the walk.
    A plateau (equal costs) keeps its smaller token pool."""
    known: dict[int, int] = {}

    def f(t: int):
        if t not in known:
            low = max([known[u] for u in known if u > t] + [prompts[0]])
            high = min([known[u] for u in known if u < t] + [prompts[1]])
            known[t] = yield from lowest(lambda p: probe.meets_slos(p, t, rate), low, high)
        return known[t]

    def cost(t: int):
        return objective((yield from f(t)), t)

    low, high = tokens
    while high - low > 2:
        third = (high - low) // 3
        left, right = low + third, high - third
        if (yield from cost(left)) <= (yield from cost(right)):
            high = right
        else:
            low = left
    # the staircase's steps make the cost jagged near its minimum: every token pool within
    # STAIRCASE_NEIGHBOURS of the best one found is looked at too (cheap: f is known on
    # both sides, so each bisects a few prompt pools)
    best = min(range(low, high + 1),   # unvisited pools rank last; their turn comes below
               key=lambda t: (objective(known[t], t) if t in known else math.inf, t))
    for t in range(max(tokens[0], best - STAIRCASE_NEIGHBOURS),
                   min(tokens[1], best + STAIRCASE_NEIGHBOURS) + 1):
        yield from f(t)
    return sorted(((p, t) for t, p in known.items()), key=lambda c: -c[1])


def _beaten_caps(design: Design, goal: Goal, beat: float, p_cap: int,
                 t_cap: int) -> tuple[int, int]:
    """The pools within which a point costs (min-power: draws) no more than `beat` with at
    least one machine in the other pool: a feasible point there is the only way to beat it
    (at equal cost, by drawing less: results are ranked by cost, then power)."""
    def unit(machine):
        return machine.power_kw if goal.name == "min-power" else machine.cost_per_hour

    def most(own, other) -> int:
        return math.floor((beat - other) / unit(own) + 1e-9)

    if design.is_baseline:
        return min(p_cap, most(design.prompt, 0.0)), 0
    return (min(p_cap, most(design.prompt, unit(design.token))),
            min(t_cap, most(design.token, unit(design.prompt))))


def _min_search(probe: Probe, design: Design, goal: Goal, constraints: Constraints,
                settings: SearchSettings, beat: float | None = None,
                start: tuple[int, int] = (1, 1), rival: Metrics | None = None):
    """min-cost / min-power at the goal's rate; returns (candidates, frontier, box, reason).

    `beat` (another layout's verified optimum, `rival` when it is this design's) bounds the
    pools tried (`_cheap_corner`, or the growth): when none of them meets the SLOs, this
    design cannot beat it and its search ends there."""
    rate, baseline = goal.rate_rps, design.is_baseline
    p_cap, t_cap = _pool_caps(design, constraints, settings.search_limit)
    if p_cap < 1 or (not baseline and t_cap < 1):
        return [], [], None, "the constraints leave no room for a machine in every pool"
    corner = None
    if beat is not None:
        p_cap, t_cap = _beaten_caps(design, goal, beat, p_cap, t_cap)
        if p_cap < 1 or (not baseline and t_cap < 1):
            return [], [], None, CANNOT_BEAT
        if not settings.exhaustive:
            corner = yield from _cheap_corner(probe, design, goal, constraints, settings, beat,
                                              rival, (p_cap, t_cap))
            if corner is False:
                return [], [], (p_cap, t_cap), CANNOT_BEAT
    cheap = corner is not None
    if corner is None:
        corner, reason = yield from _grow(probe, rate, p_cap, t_cap, baseline, start)
    if corner is None:
        return [], [], (p_cap, t_cap), CANNOT_BEAT if beat is not None else reason
    p_hi, t_hi = corner if baseline else _search_box(design, corner, constraints, p_cap, t_cap)
    if settings.exhaustive:
        grid = [probe.point(p, t, rate) for p in range(1, p_hi + 1)
                for t in ([0] if baseline else range(1, t_hi + 1))]
        measured = yield from probe.measure_all(grid)
        frontier = _frontier_of([m for m in measured if m.meets_slos])
    elif baseline:   # (a grown corner's half failed; a cheap corner's may not have)
        low = 1 if cheap else corner[0] // 2 + 1
        n = yield from lowest(lambda k: probe.meets_slos(k, 0, rate), low, corner[0])
        frontier = [(n, 0)]
    else:
        budget = (objective_at(design, goal, *corner)
                  if _allowed(design, *corner, constraints) else math.inf)
        if beat is not None:   # corners dearer than `beat` are not verified (`_searched`)
            budget = min(budget, beat)
        frontier = yield from budget_walk(probe, rate, p_hi, t_hi,
                                          lambda p, t: objective_at(design, goal, p, t), budget)
    yield from probe.measure_all([probe.point(p, t, rate) for p, t in frontier])
    at_rate = [m for m in probe.seen.values() if m.rate_rps == rate]
    return at_rate, frontier, (p_hi, t_hi), ""


BEAT_CHECKS = 8   # beyond this many largest pools that could win, grow from the floors


def _cheap_corner(probe: Probe, design: Design, goal: Goal, constraints: Constraints,
                  settings: SearchSettings, beat: float, rival: Metrics | None,
                  caps: tuple[int, int]):
    """Another layout or design costs (min-power: draws) `beat`: can this one undercut it?
    The pool sizes that could win cost no more than `beat` and, with `rival` (the best
    layout's optimum), rank strictly before it (a tie keeps the earlier layout). Every one
    lies below `caps` (`_beaten_caps`: the largest pools within `beat`), so when that box
    corner fails, none meets the SLOs: False after one simulation (a hopeless design). Every
    one also lies below one of the largest of them (`_winning_cells`), so when all of these
    fail, none meets the SLOs: False, in as many simulations (one batch) as there are such
    cells. Otherwise the cheapest feasible one, the corner the staircase is walked below.
    None when there are more than BEAT_CHECKS of them: the growth from the floors costs less
    then (its doubling steps past `beat`, and its walk proves in more simulations what these
    do)."""
    cells = _winning_cells(design, goal, constraints, settings, beat, rival)
    if len(cells) > BEAT_CHECKS:
        return None
    if not design.is_baseline and cells and caps not in cells:
        if not (yield from probe.meets_slos(*caps, goal.rate_rps)):
            return False
    measured = yield from probe.measure_all([probe.point(p, t, goal.rate_rps) for p, t in cells])
    feasible = [(objective_at(design, goal, p, t), t, p) for (p, t), m in zip(cells, measured)
                if m.meets_slos]
    if not feasible:
        return False
    _, t, p = min(feasible)
    return p, t


def _winning_cells(design: Design, goal: Goal, constraints: Constraints,
                   settings: SearchSettings, beat: float,
                   rival: Metrics | None) -> list[tuple[int, int]]:
    """The largest pool sizes that cost (min-power: draw) no more than `beat` and rank
    strictly before `rival` (None: no such condition): for each prompt pool, the most token
    machines (a baseline: the most machines)."""
    kind = "power" if goal.name == "min-power" else "cost"
    cells = budget_candidates(design, Budget(kind, beat), constraints, settings.search_limit)
    if rival is None:
        return cells
    key, limit = metrics_key(goal.name), metrics_key(goal.name)(rival)

    def before(p: int, t: int) -> bool:
        return key(_cell_figures(design, p, t)) < limit

    kept = []
    for p, t in cells:
        while (p if design.is_baseline else t) >= 1 and not before(p, t):
            p, t = (p - 1, t) if design.is_baseline else (p, t - 1)
        if (p if design.is_baseline else t) >= 1:
            kept.append((p, t))
    return _maximal(kept)


def _search_box(design: Design, corner: tuple[int, int], constraints: Constraints, p_cap: int,
                t_cap: int) -> tuple[int, int]:
    """The (P, T) box that holds every configuration worth considering.

    The frontier can reach beyond the feasible corner the growth found (fewer prompt machines
    with more token machines). Beyond the largest pools that still cost or draw no more than the
    corner (with one machine in the other pool), every point is worse than the corner in both
    cost and power, so the box ends there; when the corner breaks a constraint it is no such
    witness and the box is the constraints' caps.
    """
    p, t = corner
    if not _allowed(design, p, t, constraints):
        return p_cap, t_cap
    cost, power = design.cost_per_hour(p, t), design.power_kw(p, t)

    def widest(own, other) -> int:
        by_cost = (cost - other.cost_per_hour) / own.cost_per_hour
        by_power = (power - other.power_kw) / own.power_kw
        return math.floor(max(by_cost, by_power) + 1e-9)

    return (min(p_cap, widest(design.prompt, design.token)),
            min(t_cap, widest(design.token, design.prompt)))


def _allowed(design: Design, prompt: int, token: int, c: Constraints) -> bool:
    return ((c.max_machines is None or prompt + token <= c.max_machines)
            and (c.max_gpus is None or design.gpus(prompt, token) <= c.max_gpus)
            and (c.max_prompt is None or prompt <= c.max_prompt)
            and (c.max_token is None or token <= c.max_token))


def _frontier_of(feasible: Iterable[Metrics]) -> list[tuple[int, int]]:
    """Minimal (P, T) pairs: those no other feasible pair is below-left of."""
    cells = sorted({(m.prompt_machines, m.token_machines) for m in feasible})
    frontier, best_t = [], math.inf
    for p, t in cells:
        if t < best_t:
            frontier.append((p, t))
            best_t = t
    return frontier


def _describe(p: int, t: int, baseline: bool) -> str:
    return f"{p} machines" if baseline else f"{p} prompt + {t} token machines"


# ------------------------------------------------------------------------- budget: max rate
def budget_candidates(design: Design, budget: Budget, constraints: Constraints,
                      limit: int) -> list[tuple[int, int]]:
    """The maximal allowed configurations: for each prompt pool, the largest token pool."""
    p_cap, t_cap = _pool_caps(design, constraints, limit)
    def unit(m):
        return budget.of(m.cost_per_hour, m.power_kw)

    slack = 1e-9 * max(1.0, budget.value)  # 40 x 5.6 kW is 224 kW, not 223.99999
    if design.is_baseline:
        n = min(p_cap, math.floor((budget.value + slack) / unit(design.prompt)))
        return [(n, 0)] if n >= 1 else []
    candidates = []
    for p in range(1, p_cap + 1):
        room = budget.value - p * unit(design.prompt) + slack
        t = min(t_cap, math.floor(room / unit(design.token)))
        if constraints.max_machines:
            t = min(t, constraints.max_machines - p)
        if constraints.max_gpus:
            t = min(t, (constraints.max_gpus - p * design.prompt.gpus) // design.token.gpus)
        if t < 1:
            break
        candidates.append((p, t))
    return _maximal(candidates)


def _maximal(cells: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Cells (P, T) by growing P with non-increasing T, without those below the next one:
    (p, t) is below (p + 1, t) when the extra prompt machine still leaves t."""
    return [c for i, c in enumerate(cells) if i + 1 == len(cells) or cells[i + 1][1] < c[1]]


class RateSearch:
    """Rate galloping and bisection for one design (feasibility falls as the rate grows)."""

    def __init__(self, probe: Probe, settings: SearchSettings):
        self.probe, self.s = probe, settings

    def ok(self, cell, rate):
        return self.probe.meets_slos(cell[0], cell[1], rate)

    def above(self, rate: float) -> float:
        up = round_rate(rate * (1 + self.s.rate_tolerance))
        return up if up > rate else round_rate(rate * (1 + 2 * self.s.rate_tolerance))

    def limit(self, cell, start: float):
        """Highest feasible rate of `cell` (to the tolerance) starting from `start`; None if
        even the minimum rate fails."""
        start = round_rate(start)
        if (yield from self.ok(cell, start)):
            return (yield from self.climb(cell, start, factor=1.0))
        hi = start
        while True:
            lo = round_rate(hi / 2)
            if lo < self.s.min_rate:
                return None
            if (yield from self.ok(cell, lo)):
                return (yield from self.refine(cell, lo, hi))
            hi = lo

    def climb(self, cell, lo: float, factor: float):
        """From a feasible `lo`, gallop up by growing factors until a rate fails, then refine."""
        while True:
            rate = round_rate(lo * (1 + factor))
            if rate > self.s.max_rate:
                return lo
            if not (yield from self.ok(cell, rate)):
                return (yield from self.refine(cell, lo, rate))
            lo, factor = rate, factor * 2

    def refine(self, cell, lo: float, hi: float):
        """`bisect_rate` of `cell` (screened) between a feasible lo and an infeasible hi."""
        return (yield from bisect_rate(lambda rate: self.ok(cell, rate), lo, hi,
                                       self.s.rate_tolerance))

    def beat(self, cell, best: float | None):
        """`cell`'s rate if it beats `best` (one simulation when it does not), else None."""
        target = self.s.min_rate if best is None else self.above(best)
        if not (yield from self.ok(cell, target)):
            return None
        return (yield from self.climb(cell, target, factor=2 * self.s.rate_tolerance))


def bisect_rate(ok, lo: float, hi: float, tolerance: float):
    """Geometric bisection: `ok(lo)` holds, `ok(hi)` does not (`ok`: a generator of the search),
    until hi <= lo x (1 + tolerance); returns the highest rate found to hold."""
    while hi > lo * (1 + tolerance):
        mid = round_rate(math.sqrt(lo * hi))
        if not lo < mid < hi:
            break
        if (yield from ok(mid)):
            lo = mid
        else:
            hi = mid
    return lo


def _max_rate_search(probe: Probe, design: Design, goal: Goal, constraints: Constraints,
                     settings: SearchSettings):
    """max-rate under the goal's budget; returns (candidates, frontier, box, reason)."""
    cells = budget_candidates(design, goal.budget, constraints, settings.search_limit)
    if not cells:
        return [], [], None, "the budget and constraints leave no room for a machine in every pool"
    box = (max(p for p, _ in cells), max(t for _, t in cells))
    rates = RateSearch(probe, settings)
    if settings.exhaustive:
        best_i, best = yield from _every_candidate(rates, cells, settings)
    else:
        best_i, best = yield from _pattern_search(rates, cells, settings)
    if best is None:
        reason = (f"infeasible at {settings.min_rate:g} req/s for every configuration "
                  "within the budget")
        return [], cells, box, reason
    yield from probe.measure(*cells[best_i], best)
    if settings.exhaustive:
        yield from _audit_budget_grid(probe, design, goal, constraints, settings, best)
    return list(probe.seen.values()), cells, box, ""


def _pattern_search(rates: RateSearch, cells, settings: SearchSettings):
    """Start mid-way along the budget line, then probe +-step neighbours, halving the step."""
    best_i = len(cells) // 2
    best = yield from rates.limit(cells[best_i], settings.start_rate)
    step = max(1, len(cells) // 4)
    while True:
        for j in (best_i - step, best_i + step):
            if 0 <= j < len(cells):
                rate = yield from rates.beat(cells[j], best)
                if rate is not None:
                    best_i, best = j, rate
                    break
        else:
            if step == 1:
                return best_i, best
            step //= 2


def _every_candidate(rates: RateSearch, cells, settings: SearchSettings):
    best_i, best = 0, None
    for i, cell in enumerate(cells):
        rate = yield from rates.limit(cell, best or settings.start_rate)
        if rate is not None and (best is None or rate > best):
            best_i, best = i, rate
    return best_i, best


def _audit_budget_grid(probe: Probe, design: Design, goal: Goal, constraints: Constraints,
                       settings: SearchSettings, rate: float):
    """Exhaustive mode: every allowed cell at the optimum rate, for the monotonicity audit."""
    cells = budget_candidates(design, goal.budget, constraints, settings.search_limit)
    grid = [probe.point(p, t, rate) for cp, ct in cells for p, t in _cells_below(cp, ct)]
    yield from probe.measure_all(list(dict.fromkeys(grid)))


def _cells_below(p_max: int, t_max: int):
    if t_max == 0:
        return [(p, 0) for p in range(1, p_max + 1)]
    return [(p, t) for p in range(1, p_max + 1) for t in range(1, t_max + 1)]


# ------------------------------------------------------------------------------ the driver
def drive(searches: dict[str, Search], run_batch: Callable[[list[Point]], list[Metrics]],
          on_batch: Callable[[dict[str, int]], None] | None = None,
          concurrent: bool = False) -> dict[str, Any]:
    """Run the search generators; returns {name: result}.

    In lockstep by default: each round batches every search's next request. With `concurrent`
    (a thread-safe `run_batch` whose work runs elsewhere, e.g. in worker processes), each
    search runs in its own thread and asks again as soon as its own answer is in, so no round
    waits for the slowest design. Either way each search receives exactly the answers to what
    it asked, so results never depend on the timing, the backend or the job count.
    """
    if concurrent and len(searches) > 1:
        return _drive_concurrently(searches, run_batch, on_batch)
    pending: dict[str, list[Point]] = {}
    results: dict[str, Any] = {}
    asked = {name: 0 for name in searches}
    search = object()   # this search, for `Asked.search`

    def advance(name: str, answer) -> None:
        try:
            pending[name] = searches[name].send(answer)
            asked[name] += len(pending[name])
        except StopIteration as stop:
            pending.pop(name, None)
            results[name] = stop.value

    for name in searches:
        advance(name, None)
    while pending:
        order = [name for name in searches if name in pending]
        sizes = [len(pending[name]) for name in order]
        answers = run_batch([p for name in order for p in pending[name]])
        start = 0
        for name, size in zip(order, sizes):
            advance(name, answers[start:start + size])
            start += size
        if on_batch is not None:
            on_batch(Asked(asked, results, search))
    return results


def _drive_concurrently(searches: dict[str, Search], run_batch: RunBatch,
                        on_batch: Callable[[dict[str, int]], None] | None) -> dict[str, Any]:
    """`drive` with one thread per search; the first error stops the others and is raised."""
    results: dict[str, Any] = {}
    asked = {name: 0 for name in searches}
    lock, stop, errors = threading.Lock(), threading.Event(), []
    token = object()   # this search, for `Asked.search`

    def run(name: str, search: Search) -> None:
        try:
            answer = None
            while not stop.is_set():
                try:
                    points = search.send(answer)
                except StopIteration as done:
                    with lock:
                        results[name] = done.value
                        if on_batch is not None:
                            on_batch(Asked(asked, results, token))
                    return
                with lock:
                    asked[name] += len(points)
                answer = run_batch(points)
                if on_batch is not None:
                    with lock:
                        on_batch(Asked(asked, results, token))
        except BaseException as error:  # noqa: BLE001 - handed to the main thread
            errors.append(error)
            stop.set()

    threads = [threading.Thread(target=run, args=item, name=f"search {item[0]}", daemon=True)
               for item in searches.items()]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(0.1)   # a timed join keeps Ctrl-C deliverable to this thread
    finally:
        stop.set()
    if errors:
        raise errors[0]
    return {name: results[name] for name in searches}


def design_search(design: Design, goal: Goal, constraints: Constraints,
                  settings: SearchSettings, beat: float | None = None,
                  start: tuple[int, int] = (1, 1)):
    """One design's whole search (a generator for `drive`); returns a DesignResult. `beat`:
    min-cost / min-power, an objective value the design must undercut (see `_min_search`);
    `start`: the pool sizes the growth starts from."""
    result, probe = yield from _searched(design, goal, constraints, settings, beat, start)
    return (yield from _completed(result, probe, settings))


def _searched(design: Design, goal: Goal, constraints: Constraints, settings: SearchSettings,
              beat: float | None, start: tuple[int, int], rival: Metrics | None = None,
              probe: Probe | None = None):
    """A design's optimum, screened and verified, without the headroom and load sweep that
    only the answer needs (`_completed`); returns (DesignResult, its Probe).

    With `beat`, only candidates that cost (min-power: draw) no more than it are verified:
    a verified point dearer than `beat` could not win (results are ranked by the objective
    first), so a design whose every such candidate fails cannot beat it (CANNOT_BEAT). With
    `rival` (the best layout's verified optimum so far), the verification stops at the first
    candidate it would take that does not rank strictly before it (`metrics_key`: a tie keeps
    the earlier layout): neither that one nor any after it (dearer) could win. `probe`: one
    that already holds some of the design's points (they are not simulated again)."""
    probe = probe or Probe(design, infer=not settings.exhaustive)
    found = yield from _screened(probe, goal, constraints, settings, beat, start, rival)
    return (yield from _settled(probe, found, goal, constraints, settings, beat, rival)), probe


def _screened(probe: Probe, goal: Goal, constraints: Constraints, settings: SearchSettings,
              beat: float | None, start: tuple[int, int], rival: Metrics | None = None):
    """A design's screening (its points on the base sample): (candidates, frontier, box,
    reason), as `_searched` takes them to verify."""
    if goal.name == "max-rate":
        return (yield from _max_rate_search(probe, probe.design, goal, constraints, settings))
    return (yield from _min_search(probe, probe.design, goal, constraints, settings, beat=beat,
                                   start=start, rival=rival))


def _settled(probe: Probe, found: tuple, goal: Goal, constraints: Constraints,
             settings: SearchSettings, beat: float | None, rival: Metrics | None = None):
    """The verified optimum of a screening (`_screened`'s `found`) and the DesignResult that
    reports it (`_searched`)."""
    design = probe.design
    candidates, frontier, box, reason = found
    affordable = _within(beat, goal)
    candidates = [c for c in candidates if affordable(c)]
    optimum = select_optimum(candidates, goal, constraints, design) if candidates else None
    optimum, rejected, exhausted = yield from _verified(probe, optimum, candidates, goal,
                                                        constraints, design, settings,
                                                        affordable, _within(beat, goal, rival))
    if optimum is None and not reason:
        if beat is not None:   # nothing that costs no more than `beat` passed
            reason = CANNOT_BEAT
        else:
            reason = "no evaluated configuration meets the SLOs within the constraints"
            if rejected:
                reason += " on every verification sample: " + _gave_up(rejected, exhausted)
    points = sorted(probe.seen.values(), key=_point_order)
    return DesignResult(design, goal, optimum, reason, points, frontier,
                        non_monotone_cells(points), box, None,
                        rejected=[_rejection(m) for m in rejected])


def _within(beat: float | None, goal: Goal,
            rival: Metrics | None = None) -> Callable[[Metrics], bool]:
    """Could a candidate win: does it cost (min-power: draw) no more than `beat`, and rank
    before `rival` (None: no such condition)?"""
    key = metrics_key(goal.name)

    def within(m: Metrics) -> bool:
        return ((beat is None or objective(m, goal) <= beat + _slack(beat))
                and (rival is None or key(m) < key(rival)))
    return within


def _completed(result: DesignResult, probe: Probe, settings: SearchSettings):
    """The answer's headroom (the highest rate its optimum sustains) and load sweep, with
    their points added to the result's. The sweep goes first: its rates above the optimum's
    settle the headroom climb's steps beyond them by monotonicity (`Probe.inferred`: a
    failing 1.25x makes any higher rate fail, a passing one any lower rate pass), so they are
    not simulated again; the climb asks the same rates and finds the same headroom."""
    optimum, goal = result.optimum, result.goal
    if optimum is None or optimum.rate_rps is None:
        return result
    if settings.load_sweep:
        sweep = [probe.point(optimum.prompt_machines, optimum.token_machines,
                             round_rate(optimum.rate_rps * f)) for f in settings.load_sweep]
        yield from probe.measure_all(sweep)
    result.headroom_rps = yield from _headroom(probe, optimum, goal, settings)
    result.points = sorted(probe.seen.values(), key=_point_order)
    result.non_monotone = non_monotone_cells(result.points)
    return result


MAX_VERIFY_STEPS = 64   # complete verifications before a design is reported infeasible
MAX_REJECTIONS = 1024   # candidates dropped (most after a quick check) before giving up
GALLOP_AFTER = 16       # rejections before the step-up grows (x2 every GALLOP_AFTER more)


def _verified(probe: Probe, optimum: Metrics | None, candidates: list[Metrics], goal: Goal,
              constraints: Constraints, design: Design, settings: SearchSettings,
              affordable: Callable[[Metrics], bool] = lambda m: True,
              could_win: Callable[[Metrics], bool] = lambda m: True, quick_only: bool = False):
    """The best candidate that meets every SLO on every verification sample (`quick_only`:
    the best that passes a quick check, with no complete verification).

    The search screened its points on a few samples; the best candidate is now quick-checked
    on the hardest samples (`Verify(point, QUICK_SAMPLES)`: a sample that failed before comes
    first) and, when it passes, verified on all of them. A candidate that fails is dropped
    with everything below it and its next-larger neighbours are screened; the best remaining
    candidate that is still `affordable` goes next, until one that `could_win` no longer
    (see `_searched`). So a frontier whose corners all fail one hard sample costs about one
    simulation per corner, not a complete verification each. After GALLOP_AFTER rejections
    the step up doubles every GALLOP_AFTER more (a large fleet whose screened frontier sits
    far below what the hard samples need). A two-pool design's min-cost / min-power search
    first tries its cells best first without stepping up (`_cheapest_cells`: exact, and no
    neighbours screened), and steps up only after EXACT_REJECTIONS rejections. Returns
    (verified optimum or None, the verified Metrics of the candidates dropped, whether a
    limit ran out with candidates left).
    """
    if goal.name == "max-rate" and optimum is not None:
        return (*(yield from _verified_rate(probe, optimum, settings)), False)
    rejected: list[Metrics] = []
    complete = 0
    if optimum is not None and not design.is_baseline and not settings.exhaustive:
        optimum, complete, done = yield from _cheapest_cells(
            probe, candidates, goal, constraints, design, settings, affordable, could_win,
            rejected, quick_only)
        if done is not None:
            return optimum, rejected, done
        candidates = [optimum]   # (screened) too many rejections: gallop up from here
    while optimum is not None and could_win(optimum):
        if complete >= MAX_VERIFY_STEPS or len(rejected) >= MAX_REJECTIONS:
            return None, rejected, True
        checked, ran_fully = yield from _quick_then_full(optimum.point, quick_only)
        complete += ran_fully
        if checked.meets_slos:
            if len(rejected) >= GALLOP_AFTER:   # the steps galloped: come back down
                checked = yield from _descend(probe, checked, rejected, quick_only)
            return checked, rejected, False
        rejected.append(checked)
        step = 2 ** (len(rejected) // GALLOP_AFTER)
        ups = [point for point in _step_up(probe, checked, goal, settings, step)
               if max(point.prompt_machines, point.token_machines) <= settings.search_limit]
        neighbours = yield from probe.measure_all(ups)
        # more machines never hurt: whatever is below a rejected point at its rate is out too
        # (the candidates kept are above every earlier rejection: only the new one can drop
        # them; the neighbours are new, so they face every rejection)
        kept = [c for c in candidates if c.meets_slos and not _below(c, checked)]
        fresh = [c for c in neighbours if c.meets_slos and affordable(c)
                 and not any(_below(c, r) for r in rejected)]
        candidates = list(dict.fromkeys([*kept, *fresh]))
        optimum = select_optimum(candidates, goal, constraints, design) if candidates else None
    return None, rejected, False


EXACT_REJECTIONS = 64    # rejections before `_cheapest_cells` hands over to the step up


def _cheapest_cells(probe: Probe, candidates: list[Metrics], goal: Goal,
                    constraints: Constraints, design: Design, settings: SearchSettings,
                    affordable: Callable[[Metrics], bool], could_win: Callable[[Metrics], bool],
                    rejected: list[Metrics], quick_only: bool = False):
    """min-cost / min-power of a two-pool design: the candidates in turn, best first, among
    the cells above a screened feasible one (`candidates`) and below no rejected one (more
    machines never hurt), the best of them quick-checked and, when it passes, verified.
    Every cell is ranked by arithmetic, so a rejection costs one quick check: no neighbours
    are screened, and equal-cost cells are tried once each, without stepping up from each.
    Rejections are appended to `rejected`. Returns (verified Metrics or None, complete
    verifications run, None to go on stepping up from the screened Metrics returned
    (EXACT_REJECTIONS reached) else whether a limit ran out)."""
    rate, complete = goal.rate_rps, 0
    minimal = _frontier_of(c for c in candidates if c.meets_slos)
    while True:
        cell = _best_cell(minimal, rejected, rate, design, goal, constraints,
                          settings.search_limit)
        if cell is None:
            return None, complete, False
        figures = _cell_figures(design, *cell, rate)
        if not (affordable(figures) and could_win(figures)):
            return None, complete, False
        if complete >= MAX_VERIFY_STEPS or len(rejected) >= MAX_REJECTIONS:
            return None, complete, True
        if len(rejected) >= EXACT_REJECTIONS:
            return (yield from probe.measure(*cell, rate)), complete, None
        checked, ran_fully = yield from _quick_then_full(probe.point(*cell, rate), quick_only)
        complete += ran_fully
        if checked.meets_slos:
            # the answer is an evaluated point too (its base sample already ran: no simulation)
            yield from probe.measure(*cell, rate)
            return checked, complete, False
        rejected.append(checked)


def _best_cell(minimal: list[tuple[int, int]], rejected: list[Metrics], rate, design: Design,
               goal: Goal, constraints: Constraints, limit: int) -> tuple[int, int] | None:
    """The best allowed cell (P, T) above one of `minimal` and below none of `rejected`,
    ranked as `select_optimum` ranks points: at each token pool T, the fewest prompt machines
    that qualify."""
    if not minimal:
        return None
    ruled_out = _ruled_out(rejected, rate)
    key = metrics_key(goal.name)

    def rank(p: int, t: int):
        return (key(_cell_figures(design, p, t)), design.gpus(p, t), p + t, p, t)

    corners = sorted(minimal, key=lambda c: c[1])
    floor = min(p for p, _ in minimal)
    best, best_rank, value, fewest, i = None, None, math.inf, math.inf, 0
    for t in range(corners[0][1], limit + 1):
        if objective_at(design, goal, floor, t) > value + _slack(value):
            break   # every cell from here on costs more
        while i < len(corners) and corners[i][1] <= t:
            fewest = min(fewest, corners[i][0])
            i += 1
        p = max(fewest, ruled_out(t) + 1)
        if p <= limit and _allowed(design, p, t, constraints):
            cell_rank = rank(p, t)
            if best is None or cell_rank < best_rank:
                best, best_rank, value = (p, t), cell_rank, objective_at(design, goal, p, t)
    return best


def _ruled_out(rejected: list[Metrics], rate) -> Callable[[int], int]:
    """At token pool T, the most prompt machines of a rejection at `rate` with T or more token
    machines (more machines never hurt: every cell at or below it fails). A lookup among the
    rejections' token pools, not a table up to the search limit (16,384 entries a call)."""
    blocked: dict[int, int] = {}   # token pool -> most prompt machines ruled out there
    for r in rejected:
        if _rate_covers(rate, r.rate_rps):
            blocked[r.token_machines] = max(blocked.get(r.token_machines, 0), r.prompt_machines)
    pools = sorted(blocked)
    most = [blocked[t] for t in pools]
    for i in range(len(most) - 2, -1, -1):   # most prompt machines at >= pools[i]
        most[i] = max(most[i], most[i + 1])

    def at(token: int) -> int:
        i = bisect.bisect_left(pools, token)
        return most[i] if i < len(most) else 0
    return at


def _quick_then_full(point: Point, quick_only: bool = False):
    """(Metrics, whether the complete verification ran): the point quick-checked on the
    hardest samples and, when it passes (and not `quick_only`), verified on all of them."""
    (quick,) = yield [Verify(point, QUICK_SAMPLES)]
    if not quick.meets_slos or quick_only:
        return quick, False
    (full,) = yield [Verify(point)]
    return full, True


def _descend(probe: Probe, best: Metrics, rejected: list[Metrics], quick_only: bool = False):
    """After galloping steps, the verified point may sit well above the cheapest one: bisect
    each pool down (the other fixed) to the smallest size still verified on every sample:
    screened, quick-checked, then verified. Sizes at or below a rejected point are skipped
    (more machines never hurt)."""
    rate = best.rate_rps
    for pool in ((0, 1) if best.token_machines else (0,)):
        sizes = [best.prompt_machines, best.token_machines]
        low, high = 0, sizes[pool]     # low fails (or is nothing), high passes
        while high - low > 1:
            sizes[pool] = (low + high) // 2
            found = None
            if (not any(_cell_below(*sizes, rate, r) for r in rejected)
                    and (yield from probe.meets_slos(*sizes, rate))):
                checked, _ = yield from _quick_then_full(probe.point(*sizes, rate), quick_only)
                found = checked if checked.meets_slos else None
            if found is None:
                low = sizes[pool]
            else:
                high, best = sizes[pool], found
        sizes[pool] = high
    return best


def _verified_rate(probe: Probe, optimum: Metrics, settings: SearchSettings):
    """max-rate: the highest rate the best cell sustains on every verification sample.

    The screened optimum is verified first (most pass at once). When it fails, the rate is
    bracketed again below the failure by quick checks (the hardest QUICK_SAMPLES samples: a
    rate that fails one fails, one that passes them likely passes the rest): step down by
    growing factors (2%, 4%, 8%, ...) until a rate passes, then bisect to the tolerance. Only
    the bracket's lower end is verified on every sample; if it fails, it becomes the new top
    and the bracketing goes on below it. The answer is a verified rate within the tolerance of
    a rate that failed, as when every step is verified, for one complete verification where
    each passing step took one.
    """
    cell = (optimum.prompt_machines, optimum.token_machines)
    rejected: list[Metrics] = []

    def check(rate: float, samples: int | None = None):
        (checked,) = yield [Verify(probe.point(*cell, rate), samples)]
        if not checked.meets_slos:
            rejected.append(checked)
        return checked

    verified = yield from check(optimum.rate_rps)
    failed = optimum.rate_rps
    while not verified.meets_slos:
        rate = yield from _quick_bracket(check, failed, settings)
        if rate is None:
            return None, rejected
        verified = yield from check(rate)
        failed = rate
    return verified, rejected


def _quick_bracket(check, failed: float, settings: SearchSettings):
    """The highest rate below `failed` that passes a quick check, to the rate tolerance (None
    below the minimum rate); `check(rate, samples)` as in `_verified_rate`."""
    def quick(rate: float):
        return (yield from check(rate, QUICK_SAMPLES)).meets_slos

    step = settings.rate_tolerance
    while True:
        rate = round_rate(failed / (1 + step))
        if rate < settings.min_rate:
            return None
        if (yield from quick(rate)):
            return (yield from bisect_rate(quick, rate, failed, settings.rate_tolerance))
        failed, step = rate, 2 * step


def _below(candidate: Metrics, rejected: Metrics) -> bool:
    """Is `candidate` no larger than `rejected`, at a rate no lower (so it cannot do better)?"""
    return _cell_below(candidate.prompt_machines, candidate.token_machines, candidate.rate_rps,
                       rejected)


def _cell_below(prompt: int, token: int, rate, rejected: Metrics) -> bool:
    return (prompt <= rejected.prompt_machines and token <= rejected.token_machines
            and _rate_covers(rate, rejected.rate_rps))


def _step_up(probe: Probe, optimum: Metrics, goal: Goal, settings: SearchSettings,
             step: int = 1) -> list[Point]:
    p, t, rate = optimum.prompt_machines, optimum.token_machines, optimum.rate_rps
    if goal.name == "max-rate":
        lower = round_rate(rate / (1 + settings.rate_tolerance))
        return [probe.point(p, t, lower if lower < rate else round_rate(rate * 0.98))]
    if t == 0:
        return [probe.point(p + step, 0, rate)]
    return [probe.point(p + step, t, rate), probe.point(p, t + step, rate)]


def _gave_up(rejected: list[Metrics], exhausted: bool = False) -> str:
    """How many candidates failed verification, whether the limit on complete verifications
    stopped the search, and by how much the closest one missed (its worst SLO margin over the
    samples it ran)."""
    limit = (f" (a limit per design: {MAX_VERIFY_STEPS} complete verifications or "
             f"{MAX_REJECTIONS} candidates)" if exhausted else "")
    text = f"{len(rejected)} candidate(s) failed one{limit}"
    margins = [m for m in rejected if m.outcome.worst_margin is not None]
    if not margins:
        return text
    closest = max(margins, key=lambda m: m.outcome.worst_margin)
    rate = "" if closest.rate_rps is None else f" at {closest.rate_rps:g} req/s"
    return (f"{text}; the closest, {closest.prompt_machines}P+{closest.token_machines}T{rate}, "
            f"had a worst SLO margin of {closest.outcome.worst_margin:+.1%} "
            f"({closest.outcome.reason})")


def _rejection(m: Metrics) -> dict:
    return {"machines": [m.prompt_machines, m.token_machines], "rate_rps": m.rate_rps,
            "reason": m.outcome.reason}


def _headroom(probe: Probe, optimum: Metrics, goal: Goal, settings: SearchSettings):
    """The highest rate the optimum sustains, to the rate tolerance: max-rate already bisected
    it; for min-cost/min-power gallop up from the goal's rate, then bisect."""
    if goal.name == "max-rate":
        return optimum.rate_rps
    cell = (optimum.prompt_machines, optimum.token_machines)
    rates = RateSearch(probe, settings)
    return (yield from rates.climb(cell, optimum.rate_rps, factor=2 * settings.rate_tolerance))


def _point_order(m: Metrics):
    return (m.rate_rps if m.rate_rps is not None else -1.0, m.prompt_machines, m.token_machines)


def non_monotone_cells(points: Sequence[Metrics]) -> list[dict]:
    """Infeasible points with a feasible point below-left of them at the same rate."""
    found = []
    by_rate: dict[Any, list[Metrics]] = {}
    for m in points:
        by_rate.setdefault(m.rate_rps, []).append(m)
    for rate, group in by_rate.items():
        ok = sorted((m.prompt_machines, m.token_machines) for m in group if m.meets_slos)
        if not ok:
            continue
        ok_p, ok_t = np.array(ok).T
        for m in sorted(group, key=_point_order):
            if m.meets_slos:
                continue
            below = np.flatnonzero((ok_p <= m.prompt_machines) & (ok_t <= m.token_machines))
            if len(below):
                p, t = ok[below[0]]
                found.append({"rate_rps": rate,
                              "infeasible": [m.prompt_machines, m.token_machines],
                              "feasible_below": [int(p), int(t)]})
    return found


# ------------------------------------------------------------------------------ layouts
def _cell_figures(design: Design, prompt: int, token: int,
                  rate: float | None = None) -> SimpleNamespace:
    """What `metrics_key`, `objective` and `_within` read of a point, for P + T machines not
    simulated: their cost, power and the rate."""
    return SimpleNamespace(cost_per_hour=design.cost_per_hour(prompt, token),
                           power_kw=design.power_kw(prompt, token), rate_rps=rate)


def objective_at(design: Design, goal: Goal, prompt: int, token: int) -> float:
    """min-cost / min-power: the objective of P + T machines of the design."""
    if goal.name == "min-power":
        return design.power_kw(prompt, token)
    return design.cost_per_hour(prompt, token)


def objective(metrics: Metrics, goal: Goal) -> float:
    return {"min-cost": metrics.cost_per_hour, "min-power": metrics.power_kw,
            "max-rate": metrics.rate_rps}[goal.name]


def layout_search(variants: Sequence[Any], goal: Goal, constraints: Constraints,
                  settings: SearchSettings, beat: float | None = None):
    """A design's layout variants (records with `design`, a capacity `bound` and the pool
    `floors` the growth starts from; best bound first): a variant whose bound cannot beat the
    best so far is not simulated, and the others must undercut it (`beat`; given, another
    design's min-cost / min-power optimum to undercut too, whose bound the first variant's
    beats). Returns the best variant's DesignResult (the earlier variant on a tie) with every
    variant's fate in `layouts`. Sequential within a design, so what is pruned does not
    depend on jobs or batching. min-cost / min-power: `_layouts_cheapest_first`; max-rate:
    one variant after the other, each verified before the next."""
    if goal.name == "max-rate":
        searched = yield from _layouts_in_turn(variants, goal, constraints, settings)
    else:
        searched = yield from _layouts_cheapest_first(variants, goal, constraints, settings,
                                                      beat)
    return (yield from _chosen_layout(variants, searched, goal, settings))


def _layouts_in_turn(variants: Sequence[Any], goal: Goal, constraints: Constraints,
                     settings: SearchSettings):
    """max-rate: each variant searched and verified in turn, pruned when its bound cannot
    beat the best verified rate so far. Returns {variant index: (DesignResult, Probe)}."""
    better = goal_key(goal.name)
    best, searched = None, {}
    for i, variant in enumerate(variants):
        target = _to_beat(goal, None, best and best.optimum)
        if target is not None and variant.bound <= target:
            continue
        result, probe = yield from _searched(variant.design, goal, constraints, settings, None,
                                             variant.floors)
        searched[i] = (result, probe)
        if result.feasible and (best is None or better(result) < better(best)):
            best = result
    return searched


class _Screening(NamedTuple):
    """A layout variant's screening, kept for its verification (`_layouts_cheapest_first`)."""
    probe: Probe
    found: tuple                 # `_screened`'s (candidates, frontier, box, reason)
    target: float | None         # the objective its screening had to beat
    lead: Metrics | None         # the earlier variants' lead it had to rank before
    top: Metrics | None          # its own best candidate (`_quick_lead`): its rank


def _layouts_cheapest_first(variants: Sequence[Any], goal: Goal, constraints: Constraints,
                            settings: SearchSettings, beat: float | None):
    """min-cost / min-power: every variant screened first, in turn, each capped by the best
    candidate screened so far (`lead`: only pool sizes that could rank strictly before it are
    tried), then verified cheapest screened candidate first, each capped also by the best
    verified optimum so far. So a variant whose screened optimum cannot beat a later
    variant's verified one is never verified (a variant verified first used to be, only to
    lose). A variant screened against a lead that then failed verification is searched again
    against the answer (its points are not simulated again). Returns {variant index:
    (DesignResult, Probe)}."""
    key = metrics_key(goal.name)
    screened, lead = {}, None
    for i, variant in enumerate(variants):
        target = _to_beat(goal, beat, lead)
        if target is not None and variant.bound >= target:
            continue
        probe = Probe(variant.design, infer=not settings.exhaustive)
        found = yield from _screened(probe, goal, constraints, settings, target, variant.floors,
                                     lead)
        # the last variant caps no other: its best screened candidate only ranks it
        top = yield from _quick_lead(probe, found, goal, constraints, settings, target, lead,
                                     quick=i < len(variants) - 1)
        screened[i] = _Screening(probe, found, target, lead, top)
        lead = top or lead
    searched, best_index = {}, None

    def best():
        return None if best_index is None else searched[best_index][0].optimum

    def rival(i, cap):
        """What variant i's candidates must rank strictly before: its screening's lead (an
        earlier variant's), and the best verified optimum (a later variant's: so that i takes
        a tie with it)."""
        rivals = [cap] if cap is not None else []
        if best_index is not None:
            rivals.append(best() if best_index < i else _taking_ties(best(), goal))
        return min(rivals, key=key, default=None)

    def settle(i, result, probe):
        nonlocal best_index
        searched[i] = (result, probe)
        if result.feasible and (best_index is None or (key(result.optimum), i)
                                < (key(best()), best_index)):
            best_index = i

    order = sorted(screened, key=lambda i: (screened[i].top is None,
                                            key(screened[i].top) if screened[i].top else (), i))
    for i in order:
        s = screened[i]   # (its target already holds `beat`)
        result = yield from _settled(s.probe, s.found, goal, constraints, settings,
                                     _to_beat(goal, s.target, best()), rival(i, s.lead))
        settle(i, result, s.probe)
    for i in sorted(screened):   # screened against a lead that did not hold: search again
        cap = screened[i].lead
        if cap is None or (best_index is not None and (key(cap), i) > (key(best()), best_index)):
            continue
        variant = variants[i]
        result, probe = yield from _searched(variant.design, goal, constraints, settings,
                                             _to_beat(goal, beat, best()), variant.floors,
                                             rival(i, None), searched[i][1])
        settle(i, result, probe)
    return searched


def _taking_ties(rival: Metrics, goal: Goal) -> SimpleNamespace:
    """A stand-in for `rival` that ranks one milli-unit after it (`metrics_key` ranks in
    milli-units), so that a candidate that ties `rival` ranks strictly before it: an earlier
    layout takes a tie with a later one."""
    if goal.name == "min-power":
        return SimpleNamespace(cost_per_hour=rival.cost_per_hour + 1.0 / MILLI,
                               power_kw=rival.power_kw, rate_rps=rival.rate_rps)
    return SimpleNamespace(cost_per_hour=rival.cost_per_hour,
                           power_kw=rival.power_kw + 1.0 / MILLI, rate_rps=rival.rate_rps)


def _quick_lead(probe: Probe, found: tuple, goal: Goal, constraints: Constraints,
                settings: SearchSettings, target: float | None, lead: Metrics | None,
                quick: bool = True):
    """The best of a screening's candidates (`_screened`'s `found`) that could beat `lead`
    and passes a quick check (as `_verified` walks them, without the complete verification):
    a cap the next variants' screening can trust more than a screened point (None: none).
    Not `quick`: the best screened one that could beat `lead`, with no simulation."""
    affordable, could_win = _within(target, goal), _within(target, goal, lead)
    candidates = [c for c in found[0] if affordable(c)]
    if not quick:
        tops = [c for c in candidates if c.meets_slos and could_win(c)]
        return select_optimum(tops, goal, constraints, probe.design) if tops else None
    optimum = (select_optimum(candidates, goal, constraints, probe.design)
               if candidates else None)
    top, _, _ = yield from _verified(probe, optimum, candidates, goal, constraints,
                                     probe.design, settings, affordable, could_win,
                                     quick_only=True)
    return top


def _chosen_layout(variants: Sequence[Any], searched: dict, goal: Goal,
                   settings: SearchSettings):
    """The best variant's DesignResult (the earlier one on a tie), its headroom and load
    sweep run, with every variant's fate in `layouts` (in the variants' order)."""
    key = metrics_key(goal.name)
    feasible = [i for i in searched if searched[i][0].feasible]
    chosen_index = min(feasible, key=lambda i: (key(searched[i][0].optimum), i), default=None)
    lines = []
    for i, variant in enumerate(variants):
        line = {"layout": _layout_label(variant.design), "bound": float(variant.bound)}
        if i not in searched:
            lines.append({**line, "status": "pruned",
                          "reason": "its capacity bound cannot beat the best layout"})
            continue
        result = searched[i][0]
        if result.feasible:
            o = result.optimum
            line.update(status="chosen" if i == chosen_index else "lost",
                        cost_per_hour=o.cost_per_hour, power_kw=o.power_kw,
                        rate_rps=o.rate_rps, gpus=o.gpus, prompt_machines=o.prompt_machines,
                        token_machines=o.token_machines)
        else:
            line.update(status="infeasible", reason=result.reason)
        line["evaluations"] = len(result.points)
        lines.append(line)
    if chosen_index is None:
        chosen, ours = searched[max(searched)][0], variants[max(searched)]
    else:   # the headroom and load sweep of the answer alone
        result, probe = searched[chosen_index]
        chosen, ours = (yield from _completed(result, probe, settings)), variants[chosen_index]
        lines[chosen_index]["evaluations"] = len(chosen.points)
    chosen.capacity_bound = {"value": float(ours.bound), "pool_floors": list(ours.floors)}
    chosen.layouts = lines
    return chosen


def _to_beat(goal: Goal, beat: float | None, best: Metrics | None) -> float | None:
    """The objective a layout must beat: the best layout's optimum so far (`best`) and
    another design's (`beat`)."""
    values = [v for v in (beat, best and objective(best, goal)) if v is not None]
    if not values:
        return None
    return max(values) if goal.name == "max-rate" else min(values)


def _layout_label(design: Design) -> str:
    return " / ".join(layout.label for layout in design.layouts)


def search_designs(designs: Sequence[Design], goal: Goal, constraints: Constraints,
                   settings: SearchSettings, run_batch: RunBatch,
                   on_batch: Callable[[dict[str, int]], None] | None = None,
                   concurrent: bool = False,
                   variants: dict[str, Sequence[Any]] | None = None) -> list[DesignResult]:
    """Search every design at once (their steps batched together, or with `concurrent` each
    design asking on its own); results in design order. `variants` maps a design's name to
    its layout variants (`layout_search`); a design without searches its record as it is.

    `run_batch` evaluates a list of points and returns their metrics in the same order; the
    algorithm knows nothing else about how (processes, clusters, caches) that happens.
    """
    variants = variants or {}
    searches = {d.name: (layout_search(variants[d.name], goal, constraints, settings)
                         if variants.get(d.name) else design_search(d, goal, constraints,
                                                                    settings))
                for d in designs}
    results = drive(searches, run_batch, on_batch, concurrent)
    return [results[d.name] for d in designs]
