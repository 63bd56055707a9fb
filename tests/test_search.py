"""Search engine against synthetic feasibility oracles (no simulator): the frontier walk finds
the same optimum as exhaustive enumeration, constraints hold, rate search meets its tolerance."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
import math
import threading
import time

import pytest
from hypothesis import given, settings as hyp_settings, strategies as st

import oracles  # tests/oracles.py: a plain helper module (pytest puts tests/ on sys.path)
from oracles import OracleEvaluator

from hardware_catalog import InputError, load_catalog
from provisioner.options import (Constraints, SearchOptions, SearchSettings,
                                 from_keywords)
from provisioner.runner import Runner
from provisioner.verify import Verifier, Verify
from provisioner.frontier import budget_candidates, drive, search_designs
from provisioner.select import select_optimum
from provisioner.study import SLO_KEYS, Budget, Goal, Metrics, Outcome, Point

CATALOG = load_catalog()
DESIGNS = [CATALOG.design(n) for n in ("baseline-a100", "splitwise-aa", "splitwise-ha",
                                       "splitwise-hhcap")]
NO_SWEEP = dict(load_sweep=(), search_limit=48)


def run(rule, goal, constraints=Constraints(), designs=DESIGNS, jobs=1, **settings):
    runner = Runner(OracleEvaluator(CATALOG, rule, rule.__name__), jobs=jobs)
    results = search_designs(designs, goal, constraints, SearchSettings(**{**NO_SWEEP,
                                                                           **settings}),
                             Verifier(runner, (0,)).run, concurrent=runner.concurrent)
    return results, runner.stats


def optima(results):
    return {r.design.name: None if r.optimum is None else
            (r.optimum.prompt_machines, r.optimum.token_machines, r.optimum.rate_rps)
            for r in results}


def brute_force_min(rule, design, rate, objective, constraints=Constraints(), limit=48):
    """The optimum by plain enumeration of the grid (independent of the engine)."""
    pools = design
    tokens = [0] if design.is_baseline else range(1, limit + 1)
    best = None
    for p, t in itertools.product(range(1, limit + 1), tokens):
        if not rule(design.name, p, t, rate) or not _allowed(pools, p, t, constraints):
            continue
        key = (objective(pools, p, t), )
        if best is None or key < best[0]:
            best = (key, (p, t))
    return None if best is None else best[1]


def _allowed(pools, p, t, c: Constraints) -> bool:
    baseline = pools.is_baseline
    return ((c.max_machines is None or p + t <= c.max_machines)
            and (c.max_gpus is None or pools.gpus(p, t) <= c.max_gpus)
            and (baseline or c.max_prompt is None or p <= c.max_prompt)
            and (baseline or c.max_token is None or t <= c.max_token))


def COST(pools, p, t):
    return round(pools.cost_per_hour(p, t), 6)


def POWER(pools, p, t):
    return round(pools.power_kw(p, t), 6)


@pytest.mark.parametrize("rule", [oracles.l_shape, oracles.diagonal, oracles.hyperbola])
@pytest.mark.parametrize("goal", ["min-cost", "min-power"])
def test_frontier_walk_matches_exhaustive_grid(rule, goal):
    frontier, walked = run(rule, Goal(goal, 10.0))
    grid, enumerated = run(rule, Goal(goal, 10.0), exhaustive=True)
    assert optima(frontier) == optima(grid)
    objective = COST if goal == "min-cost" else POWER
    for result in frontier:
        pools = result.design
        expected = brute_force_min(rule, result.design, 10.0, objective)
        got = (result.optimum.prompt_machines, result.optimum.token_machines)
        assert objective(pools, *got) == objective(pools, *expected)
    assert walked.simulated < enumerated.simulated / 2


@pytest.mark.parametrize("goal", ["min-cost", "min-power"])
def test_a_fleet_scale_staircase_costs_log_simulations(goal):
    """Hundreds of corners: past the first WALK_CORNERS the cheapest point is searched, not
    walked; it is the cheapest point of the whole staircase, for far fewer simulations than
    the corners."""
    results, stats = run(oracles.fleet_hyperbola, Goal(goal, 10.0), designs=DESIGNS[1:3],
                         search_limit=4096)
    objective = COST if goal == "min-cost" else POWER
    for result in results:
        pools = result.design
        staircase = [(math.ceil(40_000 / t), t) for t in range(10, 4097)]
        best = min(objective(pools, p, t) for p, t in staircase if p <= 4096)
        o = result.optimum
        assert objective(pools, o.prompt_machines, o.token_machines) == best
    assert stats.simulated < 1200   # walking every corner: 4,093 simulations


def test_optimum_on_the_edge_of_the_grid():
    """Feasible only with the full prompt pool the search may use: found, not missed."""
    def edge(design, p, t, rate):
        return p >= 16 and t >= 2 if t else p >= 16
    results, _ = run(edge, Goal("min-cost", 10.0), search_limit=16)
    assert optima(results) == {"baseline-a100": (16, 0, 10.0), "splitwise-aa": (16, 2, 10.0),
                               "splitwise-ha": (16, 2, 10.0), "splitwise-hhcap": (16, 2, 10.0)}


def test_no_feasible_point_says_so():
    results, stats = run(oracles.never, Goal("min-cost", 10.0), search_limit=8)
    assert all(r.optimum is None for r in results)
    assert all("infeasible even with 8" in r.reason for r in results)
    assert stats.simulated > 0


def test_exhaustive_reports_the_non_monotone_cell():
    results, _ = run(oracles.hole, Goal("min-cost", 10.0), designs=DESIGNS[1:2], exhaustive=True)
    (aa,) = results
    assert [c["infeasible"] for c in aa.non_monotone] == [[6, 8]]
    below = aa.non_monotone[0]["feasible_below"]
    assert below[0] <= 6 and below[1] <= 8 and oracles.hole("x", *below, 10.0)


@pytest.mark.parametrize("constraints", [
    Constraints(max_prompt=4), Constraints(max_token=5), Constraints(max_machines=13),
    Constraints(max_gpus=104), Constraints(max_prompt=6, max_token=7)])
def test_constraints_are_respected(constraints):
    results, _ = run(oracles.hyperbola, Goal("min-cost", 10.0), constraints)
    for result in results:
        expected = brute_force_min(oracles.hyperbola, result.design, 10.0, COST, constraints)
        if expected is None:
            assert result.optimum is None
            continue
        o = result.optimum
        pools = result.design
        assert _allowed(pools, o.prompt_machines, o.token_machines, constraints)
        assert COST(pools, o.prompt_machines, o.token_machines) == COST(pools, *expected)


def test_constraint_that_excludes_everything():
    results, _ = run(oracles.hyperbola, Goal("min-cost", 10.0), Constraints(max_machines=5))
    assert all(r.optimum is None for r in results)


def test_select_optimum_breaks_ties_by_power_then_size():
    design = CATALOG.design("splitwise-hh")
    pools = design
    runner = Runner(OracleEvaluator(CATALOG, oracles.diagonal, "diagonal"))
    points = Verifier(runner, (0,)).run([Point(design, p, 12 - p, 10.0) for p in range(2, 11)])
    best = select_optimum(points, Goal("min-cost", 10.0), Constraints(), pools)
    assert (best.prompt_machines, best.token_machines) == (2, 10)  # all cost the same


@hyp_settings(max_examples=60, deadline=None)
@given(st.data())
def test_select_optimum_is_the_best_allowed_point_by_enumeration(data):
    """CP-SAT's pick equals a plain enumeration: the allowed point (SLOs met, every extra
    constraint and the budget) with the best objective, ties broken by the other resource,
    GPUs, machines, P, T."""
    design = CATALOG.design(data.draw(st.sampled_from(["splitwise-ha", "baseline-h100"])))
    goal = data.draw(st.sampled_from([Goal("min-cost", 10.0), Goal("min-power", 10.0),
                                      Goal("max-rate", budget=Budget("cost", 600.0)),
                                      Goal("max-rate", budget=Budget("power", 90.0))]))
    cells = data.draw(st.lists(st.tuples(st.integers(1, 30), st.integers(1, 20), st.booleans(),
                                         st.sampled_from([5.0, 7.5, 10.0, 12.5])),
                               min_size=1, max_size=25, unique_by=lambda c: c[:2]))
    limits = Constraints(**{name: data.draw(st.none() | st.integers(low, high)) for name, low, high
                            in (("max_machines", 2, 50), ("max_gpus", 8, 400),
                                ("max_prompt", 1, 30), ("max_token", 1, 20))})
    points = []
    for p, t, ok, rate in cells:
        t = 0 if design.is_baseline else t
        slo = tuple((key, 0.5 if ok else 2.0, 1.0) for key in SLO_KEYS)
        outcome = Outcome(ok, True, "", slo, 0.5 if ok else -1.0, 100)
        point = Point(design, p, t, rate if goal.name == "max-rate" else 10.0)
        points.append(Metrics.of(point, outcome))
    points = list({m.point: m for m in points}.values())

    def allowed(m):
        size = m.prompt_machines + m.token_machines
        pools_ok = design.is_baseline or (
            (not limits.max_prompt or m.prompt_machines <= limits.max_prompt)
            and (not limits.max_token or m.token_machines <= limits.max_token))
        budget_ok = goal.budget is None or round(1000 * (
            m.cost_per_hour if goal.budget.kind == "cost" else m.power_kw)) <= 1000 * goal.budget.value
        return (m.meets_slos and pools_ok and budget_ok
                and (not limits.max_machines or size <= limits.max_machines)
                and (not limits.max_gpus or m.gpus <= limits.max_gpus))

    def rank(m):
        cost, power = round(1000 * m.cost_per_hour), round(1000 * m.power_kw)
        first, second = {"min-cost": (cost, power), "min-power": (power, cost)}.get(
            goal.name, (-round(1000 * m.rate_rps), cost if goal.budget and
                        goal.budget.kind == "cost" else power))
        return (first, second, m.gpus, m.prompt_machines + m.token_machines,
                m.prompt_machines, m.token_machines, m.rate_rps)

    expected = min(filter(allowed, points), key=rank, default=None)
    best = select_optimum(points, goal, limits, design)
    assert (best and best.point) == (expected and expected.point)


@dataclass(frozen=True)
class MarginBySeed:
    """Every point meets its SLOs with a worst margin that depends on the seed only."""
    margins: dict
    asked: list = field(default_factory=list)

    def outcome(self, point, seed):
        self.asked.append(seed)
        margin = self.margins.get(seed, 0.5)
        slo = tuple((key, 1.0 - margin if key == "ttft_p99" else 0.1, 1.0) for key in SLO_KEYS)
        return Outcome(True, True, "", slo, margin, 100)

    def identity(self):
        return {"oracle": "margin by seed"}

    def point_identity(self, point):
        return {}


@pytest.mark.parametrize("margins, asked, reason", [
    ({}, list(range(10)), ""),                                       # verified on every seed
    ({3: 0.01}, [0, 1, 2, 3], "seed 3: worst SLO margin +1.0% is inside the 5% guard band"),
    ({3: 0.01, 7: -0.2}, [0, 1, 2, 3], "seed 3: worst SLO margin"),  # stops at the first
])
def test_verification_stops_at_the_first_sample_inside_the_guard_band(margins, asked, reason):
    """Seeds go one at a time: seed 3 inside the band stops its point, seed 4 never runs."""
    oracle = MarginBySeed(margins)
    verifier = Verifier(Runner(oracle), tuple(range(10)), margin=0.05)
    (verified,) = verifier.run([Verify(Point(CATALOG.design("splitwise-hh"), 2, 2, 10.0))])
    assert oracle.asked == asked
    assert verified.meets_slos == (reason == "")
    assert verified.outcome.reason.startswith(reason)


def test_verification_tries_the_samples_that_failed_a_neighbour_first():
    """Seed 7 fails every point: the first candidate finds it at its 8th sample, the next
    candidate of the same design at its 2nd (seed 0 from screening, then 7), another design's
    candidate at its 8th again; a failing sample stops its candidate; a passing candidate
    keeps its samples in seed order."""
    oracle = MarginBySeed({7: -0.5, 4: 0.2})
    verifier = Verifier(Runner(oracle), tuple(range(10)), margin=0.05)
    hh, aa = CATALOG.design("splitwise-hh"), CATALOG.design("splitwise-aa")
    first = verifier.run([Verify(Point(hh, 2, 2, 10.0))])[0]
    assert oracle.asked == list(range(8)) and not first.meets_slos
    oracle.asked.clear()
    second = verifier.run([Verify(Point(hh, 3, 2, 10.0))])[0]
    assert oracle.asked == [0, 7] and not second.meets_slos
    assert second.outcome.reason.startswith("seed 7: ")
    oracle.asked.clear()
    verifier.run([Verify(Point(aa, 2, 2, 10.0))])
    assert oracle.asked == list(range(8))
    oracle.margins.pop(7)
    passing = verifier.run([Verify(Point(hh, 4, 2, 10.0))])[0]
    assert passing.meets_slos and [seed for seed, _ in passing.samples] == list(range(10))


def _after_one_verification(oracle):
    """A verifier of 10 samples (5% band) whose splitwise-hh history holds one complete, passing
    verification (2P + 2T at 10 req/s), and the design; the oracle's record of samples asked
    is cleared."""
    verifier = Verifier(Runner(oracle), tuple(range(10)), margin=0.05)
    hh = CATALOG.design("splitwise-hh")
    assert verifier.run([Verify(Point(hh, 2, 2, 10.0))])[0].meets_slos
    oracle.asked.clear()
    return verifier, hh


def test_a_quick_check_runs_only_the_hardest_samples_without_the_prediction_bound():
    """Seeds 4 and 7 came closest to failing: a quick check of 3 samples runs those two, then
    the screening seed, and passes them though their spread would fail the mean + 2 sd bound
    a complete verification applies."""
    oracle = MarginBySeed({4: 0.06, 7: 0.06})
    verifier, hh = _after_one_verification(oracle)
    quick = verifier.run([Verify(Point(hh, 3, 2, 10.0), samples=3)])[0]
    assert oracle.asked == [4, 7, 0]
    assert quick.meets_slos and [seed for seed, _ in quick.samples] == [0, 4, 7]
    spread = verifier._verdict(list(quick.samples), 3, full=True)
    assert not spread.meets_slos and "mean + 2 sd" in spread.reason


@dataclass(frozen=True)
class FailingSeeds(MarginBySeed):
    """As MarginBySeed, but the seeds in `failing` miss an SLO outright (a simulation's own
    reason, which names no seed)."""
    failing: set = field(default_factory=set)

    def outcome(self, point, seed):
        outcome = super().outcome(point, seed)
        if seed in self.failing:
            return replace(outcome, meets_slos=False, reason="TTFT P99 2 > 1s")
        return outcome


@pytest.mark.parametrize("outright", [False, True])
def test_a_quick_check_that_fails_its_hardest_sample_runs_no_other(outright):
    """The hardest sample runs first: when it fails (inside the guard band, or outright),
    neither the next-hardest nor the screening seed of that candidate is simulated, and the
    reason names the sample."""
    oracle = FailingSeeds({4: 0.06, 7: 0.07})
    verifier, hh = _after_one_verification(oracle)
    if outright:
        oracle.failing.add(4)
    else:
        oracle.margins[4] = 0.01
    quick = verifier.run([Verify(Point(hh, 3, 2, 10.0), samples=3)])[0]
    assert oracle.asked == [4] and not quick.meets_slos
    assert quick.outcome.reason == ("seed 4: TTFT P99 2 > 1s" if outright else
                                    "seed 4: worst SLO margin +1.0% is inside the 5% guard band")


@pytest.mark.parametrize("jobs", [3, 4, 8])
def test_verification_takes_the_same_samples_whatever_the_job_count(jobs):
    """The samples a verification takes decide its reason and the order of the design's
    later verifications (and so a max-rate quick check's verdict): they must not depend on
    how many workers there are. With several, a complete verification simulates the samples
    up to its next look side by side; it still takes them one at a time, so one after a
    failing sample is simulated and not taken."""
    def verify_three(jobs):
        oracle = MarginBySeed({2: -0.1, 4: -0.3, 5: 0.02})
        verifier = Verifier(Runner(oracle, jobs=jobs), tuple(range(10)), margin=0.05)
        hh = CATALOG.design("splitwise-hh")
        verdicts = [verifier.run([Verify(Point(hh, p, 2, 10.0), samples)])[0]
                    for p, samples in ((2, None), (3, 3), (4, None))]
        taken = [[seed for seed, _ in v.samples] for v in verdicts]
        return taken, [v.outcome.reason for v in verdicts], verifier._margins, oracle.asked
    *taken, simulated = verify_three(jobs)
    *alone, one_at_a_time = verify_three(1)
    assert taken == alone
    assert sorted(one_at_a_time) == sorted(seed for seeds in taken[0] for seed in seeds)
    assert set(one_at_a_time) <= set(simulated) and len(simulated) > len(one_at_a_time)


@dataclass(frozen=True)
class MarginBySeedSized(MarginBySeed):
    """The same, with a size (its number of requests) for each workload sample."""
    sizes: dict = field(default_factory=dict)

    def sample_size(self, rate_rps, seed):
        return self.sizes.get(seed, 1000)


def test_a_first_verification_tries_the_largest_samples_first():
    """With no history, the samples after screening go largest first (ties in seed order):
    seed 7, the largest, fails and stops the candidate at its 2nd sample instead of its 8th;
    a passing candidate keeps its samples in seed order."""
    oracle = MarginBySeedSized({7: -0.5}, sizes={7: 1500, 3: 1200, 5: 1200})
    verifier = Verifier(Runner(oracle), tuple(range(10)), margin=0.05)
    hh = CATALOG.design("splitwise-hh")
    first = verifier.run([Verify(Point(hh, 2, 2, 10.0))])[0]
    assert oracle.asked == [0, 7] and not first.meets_slos
    assert first.outcome.reason.startswith("seed 7: ")
    oracle.asked.clear()
    oracle.margins.pop(7)
    passing = verifier.run([Verify(Point(CATALOG.design("splitwise-aa"), 2, 2, 10.0))])[0]
    assert oracle.asked == [0, 7, 3, 5, 1, 2, 4, 6, 8, 9]
    assert passing.meets_slos and [seed for seed, _ in passing.samples] == list(range(10))


@pytest.mark.parametrize("workload, rate, burstiness", [
    ("coding", 5.0, 1.0), ("conversation", 70.0, 1.0), ("coding", 3.0, 2.5)])
def test_sample_size_is_the_length_of_the_sample_simulated(workload, rate, burstiness):
    from provisioner.api import merge_options, resolve_study
    from provisioner.evaluate import SimulationEvaluator
    from provisioner.options import SearchOptions
    study = resolve_study(merge_options(SearchOptions, {
        "workload": workload, "rate": rate, "duration": 10, "no_cache": True}))
    study = replace(study, workload=replace(study.workload, burstiness_cv=burstiness))
    evaluator = SimulationEvaluator(study)
    sizes = set()
    for seed in range(6):
        size = evaluator.sample_size(rate, seed)
        assert size == len(study.workload.at(rate, 10, seed, base_seed=study.seed))
        sizes.add(size)
    assert len(sizes) > 1   # the samples differ, so the order means something


@hyp_settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 12)), max_size=40))
def test_latest_requests_keeps_the_newest_entries_within_the_limit(puts):
    """The running total gives what a plain LRU that sums its entries at every put keeps."""
    from collections import OrderedDict
    from provisioner.samples import LatestRequests
    cache, model = LatestRequests(20, len), OrderedDict()
    for key, size in puts:
        cache.put(key, "x" * size)
        model.pop(key, None)
        model[key] = "x" * size
        while sum(map(len, model.values())) > 20:
            model.popitem(last=False)
        assert len(cache) == len(model)
        assert all(cache.get(k) == v for k, v in list(model.items()))   # get refreshes: in order
        assert all(cache.get(k) is None for k in range(6) if k not in model)


def true_max_rate(design, budget, constraints=Constraints()):
    pools = design
    cells = budget_candidates(pools, budget, constraints, 256)
    return max(4.5 * p if t == 0 else min(10.0 * p, 7.0 * t) for p, t in cells)


@pytest.mark.parametrize("budget", [Budget("power", 224.0, "dgx-h100:40"), Budget("cost", 1520.0)])
def test_rate_search_finds_the_max_rate_within_tolerance(budget):
    tolerance = 0.02
    results, stats = run(oracles.capacity, Goal("max-rate", budget=budget),
                         rate_tolerance=tolerance, search_limit=256)
    for result in results:
        best = true_max_rate(result.design, budget)
        o = result.optimum
        assert best / (1 + tolerance) ** 2 <= o.rate_rps <= best
        assert o.meets_slos
        assert budget.of(o.cost_per_hour, o.power_kw) <= budget.value + 1e-9
    # far fewer than a bisection of every budget candidate (about 7 each)
    candidates = sum(len(budget_candidates(d, budget, Constraints(), 256))
                     for d in DESIGNS)
    assert stats.simulated < 7 * candidates / 2


def test_max_rate_exhaustive_agrees_with_pattern_search():
    budget = Budget("power", 100.0)
    fast, _ = run(oracles.capacity, Goal("max-rate", budget=budget), search_limit=256)
    full, _ = run(oracles.capacity, Goal("max-rate", budget=budget), search_limit=256,
                  exhaustive=True)
    for a, b in zip(fast, full):
        assert a.optimum.rate_rps == pytest.approx(b.optimum.rate_rps, rel=0.045)


def _load_outcome(load: float) -> Outcome:
    """An oracle's outcome at `load` (demand over capacity): TTFT P99 is the load against a
    1x limit, the other SLOs pass with room."""
    slo = tuple((key, load if key == "ttft_p99" else 0.5, 1.0) for key in SLO_KEYS)
    return Outcome(load <= 1.0, True, "" if load <= 1.0 else f"TTFT P99 {load:.4g} > 1x",
                   slo, 1.0 - load, 100)


@dataclass(frozen=True)
class CapacityBySeed:
    """A baseline of N machines sustains 4.5 N req/s x the sample's factor: the screening
    sample (seed 0, factor 1) overstates what the harder samples sustain."""
    factors: dict
    asked: list = field(default_factory=list)

    def outcome(self, point, seed):
        self.asked.append((point.rate_rps, seed))
        load = point.rate_rps / (4.5 * point.prompt_machines * self.factors.get(seed, 1.0))
        return _load_outcome(load)

    def identity(self):
        return {"oracle": "capacity by seed"}

    def point_identity(self, point):
        return {}


@pytest.mark.parametrize("factors", [{1: 0.965, 2: 0.99, 5: 0.975}, {7: 0.9, 8: 0.93},
                                     {3: 0.97}, {}])
def test_max_rate_verifies_one_rate_on_every_sample(factors):
    """The rate is bracketed below a failed verification by quick checks on the hardest
    samples; only the answer is simulated on every sample, and it is within the tolerance of
    what the hardest sample sustains."""
    seeds = tuple(range(10))
    oracle = CapacityBySeed(factors)
    design = CATALOG.design("baseline-a100")
    (result,) = search_designs([design], Goal("max-rate", budget=Budget("power", 100.0)),
                               Constraints(), SearchSettings(load_sweep=(), search_limit=256),
                               Verifier(Runner(oracle), seeds).run)
    o = result.optimum
    hardest = 4.5 * o.prompt_machines * min([1.0, *factors.values()])
    assert hardest / 1.02 ** 2 <= o.rate_rps <= hardest
    assert o.meets_slos and [seed for seed, _ in o.samples] == list(seeds)
    on_every_sample = [rate for rate in dict.fromkeys(r for r, _ in oracle.asked)
                       if {s for r, s in oracle.asked if r == rate} == set(seeds)]
    assert on_every_sample == [o.rate_rps]
    assert all("TTFT P99" in r["reason"] for r in result.rejected)


def test_budget_candidates_are_maximal_and_within_budget():
    pools = CATALOG.design("splitwise-ha")
    budget = Budget("power", 224.0)
    cells = budget_candidates(pools, budget, Constraints(max_token=30), 256)
    for p, t in cells:
        assert pools.power_kw(p, t) <= 224.0 + 1e-9 and t <= 30
        assert pools.power_kw(p, t + 1) > 224.0 or t + 1 > 30     # no room for one more token machine
    assert [t for _, t in cells] == sorted({t for _, t in cells}, reverse=True)


@hyp_settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=14), st.integers(1, 6),
       st.sampled_from(["min-cost", "min-power"]))
def test_random_staircases(drops, start, goal):
    """Any monotone staircase: the walk's optimum costs what brute force finds."""
    need = {}  # smallest feasible T for each P (non-increasing), infeasible below p0
    t = start + sum(drops)
    for i, drop in enumerate(drops):
        need[start + i] = t
        t -= drop
    rule = _Staircase(tuple(sorted(need.items())))
    design = CATALOG.design("splitwise-ha")
    results, _ = run(rule, Goal(goal, 10.0), designs=[design], search_limit=32)
    objective = COST if goal == "min-cost" else POWER
    expected = brute_force_min(rule, design, 10.0, objective, limit=32)
    got = results[0].optimum
    pools = design
    assert objective(pools, got.prompt_machines, got.token_machines) == objective(pools, *expected)


class _Staircase:
    def __init__(self, need):
        self.need = dict(need)
        self.__name__ = f"staircase{need}"

    def __call__(self, design, p, t, rate):
        known = [q for q in self.need if q <= p]
        return bool(known) and t >= self.need[max(known)]


def one_point_a_step(name, steps):
    """A stand-in search: `steps` requests of one point each; returns its name."""
    for i in range(steps):
        yield [Point(name, i + 1, 1, 1.0)]
    return name


def test_driver_batches_every_design_step_in_a_fixed_order():
    batches = []

    def run_batch(points):
        batches.append([p.design for p in points])
        return [None] * len(points)

    results = drive({"a": one_point_a_step("a", 2), "b": one_point_a_step("b", 3)}, run_batch)
    assert batches == [["a", "b"], ["a", "b"], ["b"]]
    assert results == {"a": "a", "b": "b"}


def test_concurrent_driver_lets_each_search_go_on_without_the_others():
    """The slow search's first answer waits until the fast one has finished all three of its
    steps: in lockstep that would never happen (the wait times out and the test fails)."""
    fast_done = threading.Event()

    def search(name, steps):
        answers = []
        for i in range(steps):
            answers += (yield [Point(name, i + 1, 1, 1.0)])
        return answers

    def run_batch(points):
        if points[0].design == "slow" and not fast_done.wait(timeout=10):
            raise AssertionError("the fast search was held back by the slow one")
        if points[0].design == "fast" and points[0].prompt_machines == 3:
            fast_done.set()
        return [(p.design, p.prompt_machines) for p in points]

    results = drive({"slow": search("slow", 2), "fast": search("fast", 3)}, run_batch,
                    concurrent=True)
    assert results == {"slow": [("slow", 1), ("slow", 2)],
                       "fast": [("fast", 1), ("fast", 2), ("fast", 3)]}


def test_concurrent_driver_raises_the_first_error_and_stops_the_others():
    asked = []

    def run_batch(points):
        asked.append(points[0].design)
        if points[0].design == "bad":
            raise ValueError("broken evaluation")
        time.sleep(0.01)
        return [None] * len(points)

    with pytest.raises(ValueError, match="broken evaluation"):
        drive({"bad": one_point_a_step("bad", 1), "long": one_point_a_step("long", 10_000)},
              run_batch, concurrent=True)
    assert asked.count("long") < 10_000


def test_parallel_jobs_give_the_same_results():
    goal = Goal("min-cost", 10.0)
    serial, _ = run(oracles.hyperbola, goal, jobs=1)
    parallel, _ = run(oracles.hyperbola, goal, jobs=2)
    assert optima(serial) == optima(parallel)
    assert [[m.point for m in r.points] for r in serial] == \
        [[m.point for m in r.points] for r in parallel]


def test_goal_and_budget_must_match():
    with pytest.raises(InputError, match="needs a budget"):
        Goal("max-rate")
    with pytest.raises(InputError, match="applies to --goal max-rate"):
        Goal("min-cost", 10.0, Budget("power", 10.0))
    with pytest.raises(InputError, match="goal= must be one of min-cost, min-power, max-rate"):
        from_keywords(SearchOptions, {"goal": "fastest"})
    with pytest.raises(InputError, match="max_gpus= must be a whole number >= 1"):
        from_keywords(SearchOptions, {"max_gpus": 0})
    assert math.isfinite(true_max_rate(DESIGNS[0], Budget("power", 224.0)))


def test_non_monotone_cells_reach_the_terminal_and_the_html():
    from provisioner.figures import html_report
    from provisioner.reports import non_monotone_lines, report_document
    results, _ = run(oracles.hole, Goal("min-cost", 10.0), designs=DESIGNS[1:2], exhaustive=True)
    options = {"duration": 1.0, "seed": 0, "max_machines": None, "max_gpus": None,
               "max_prompt": None, "max_token": None}
    inputs = {"model": {"name": "m"}, "workload": {"name": "w"}, "options": options,
              "goal": {"name": "min-cost", "paper_name": "p", "rate_rps": 10.0, "budget": None},
              "perf_model": {"name": "default"},
              "slo_profile": {"name": "oracle", "kind": "slowdown"}}
    document = report_document(inputs, results, {})
    assert document["summary"]["non_monotone_cells"] == 1
    (line,) = non_monotone_lines(document)
    assert line.startswith("splitwise-aa: (6, 8) is infeasible although") and "10 req/s" in line
    assert "Non-monotone cells" in html_report(document, results)


def test_growth_stops_when_more_machines_no_longer_help():
    """Pools double up to the search limit, but past 256 machines only while the SLO margins
    still improve: an SLO out of reach at any size does not simulate ever larger fleets."""
    results, stats = run(oracles.never, Goal("min-cost", 10.0), designs=DESIGNS[1:2],
                         search_limit=100_000)
    (aa,) = results
    assert aa.optimum is None and "infeasible at any size" in aa.reason
    assert stats.simulated <= 12
    results, _ = run(oracles.never, Goal("min-cost", 10.0), designs=DESIGNS[1:2], search_limit=8)
    assert "--search-limit" in results[0].reason


class HardSample:
    """The screening sample (seed 0) passes from P + T >= 4; every other sample needs
    P + T >= `need` (1,000 by default: out of the verification's reach, so each candidate
    fails on seed 1)."""
    asked: list

    def __init__(self, need: int = 1000):
        self.asked, self.need = [], need

    def outcome(self, point, seed):
        self.asked.append((point.prompt_machines, point.token_machines, seed))
        load = (4 if seed == 0 else self.need) / (point.prompt_machines + point.token_machines)
        return _load_outcome(load)

    def identity(self):
        return {"oracle": "hard sample"}

    def point_identity(self, point):
        return {}


def test_verification_climbs_to_what_the_hard_sample_needs():
    """The screened frontier (P + T = 4) is 25x below what the other sample needs: the
    verification steps up, galloping, and answers instead of giving up; rejected candidates
    cost a quick check each, not a complete verification."""
    design = CATALOG.design("splitwise-hh")
    oracle = HardSample(need=100)
    (result,) = search_designs([design], Goal("min-cost", 10.0), Constraints(),
                               SearchSettings(load_sweep=(), search_limit=512),
                               Verifier(Runner(oracle), (0, 1, 2)).run)
    assert result.optimum is not None
    found = result.optimum.prompt_machines + result.optimum.token_machines
    assert len(oracle.asked) < 1000   # (quick checks: about 2 simulations per rejection)
    # the cheapest size a complete verification accepts (its prediction bound needs more than
    # P + T = 100 when the samples disagree this much), by brute force
    verify = Verifier(Runner(HardSample(need=100)), (0, 1, 2)).run
    smallest = next(n for n in range(100, 400)
                    if verify([Verify(Point(design, 1, n - 1, 10.0))])[0].meets_slos)
    assert smallest <= found <= 1.05 * smallest


def test_a_search_that_gives_up_says_why_and_by_how_much():
    """When verification rejects candidates until the limit, the reason says the limit bound
    and how far the closest candidate was from passing."""
    from provisioner.frontier import MAX_VERIFY_STEPS
    (result,) = search_designs([CATALOG.design("splitwise-hh")], Goal("min-cost", 10.0),
                               Constraints(), SearchSettings(load_sweep=(), search_limit=64),
                               Verifier(Runner(HardSample()), (0, 1)).run)
    assert result.optimum is None and len(result.rejected) >= MAX_VERIFY_STEPS
    assert "candidate(s) failed one" in result.reason
    sizes = [sum(r["machines"]) for r in result.rejected]
    closest = [r for r in result.rejected if sum(r["machines"]) == max(sizes)][0]
    p, t = closest["machines"]
    margin = 1.0 - 1000 / (p + t)
    assert f"the closest, {p}P+{t}T at 10 req/s, had a worst SLO margin of {margin:+.1%}" \
        in result.reason


# ----------------------------------------------------------------- the walk within a budget
@dataclass(frozen=True)
class _Seen:
    meets_slos: bool


def _walk(walk, rule, design, rate=10.0):
    """Run a staircase walk generator against `rule`; (its corners, the points it asked)."""
    asked = []
    answer = None
    while True:
        try:
            points = walk.send(answer)
        except StopIteration as done:
            return done.value, asked
        asked.extend(points)
        answer = [_Seen(bool(rule(design.name, p.prompt_machines, p.token_machines, rate)))
                  for p in points]


def knee(design, p, t, rate):
    """A staircase with a long, expensive arm of few prompt and many token machines."""
    return p * t >= 60 and p >= 3


def _staircase(rule, design, limit=48):
    """Every corner (g(T), T) of the rule's feasibility staircase, by enumeration."""
    corners, previous = [], math.inf
    for t in range(1, limit + 1):
        g = next((p for p in range(1, limit + 1) if rule(design.name, p, t, 10.0)), math.inf)
        if g < previous:
            corners.append((g, t))
            previous = g
    return corners


@pytest.mark.parametrize("rule", [oracles.l_shape, oracles.diagonal, oracles.hyperbola, knee])
@pytest.mark.parametrize("design_name", ["splitwise-aa", "splitwise-ha"])
def test_budget_walk_finds_the_cheapest_corners_and_skips_dear_ones(rule, design_name):
    """The walk within a budget returns every corner of the cheapest cost (ties too), and
    resolves no corner that costs more than the feasible point it started from: on these
    staircases it asks 14-52 points where walking every corner asked 17-71."""
    from provisioner.frontier import Probe, budget_walk
    design = CATALOG.design(design_name)

    def objective(p, t):
        return design.cost_per_hour(p, t)

    corner, box = (32, 32), (48, 48)
    assert rule(design.name, *corner, 10.0)
    walked, asked = _walk(budget_walk(Probe(design), 10.0, *box, objective,
                                      objective(*corner)), rule, design)
    staircase = _staircase(rule, design)
    cheapest = min(objective(p, t) for p, t in staircase)
    assert {c for c in staircase if objective(*c) == cheapest} <= set(walked) <= set(staircase)
    assert all(objective(*c) <= objective(*corner) for c in walked)
    dear = [c for c in staircase if objective(*c) > objective(*corner)]
    assert not set(dear) & {(p.prompt_machines, p.token_machines) for p in asked}


def test_past_the_walk_the_staircase_is_searched_only_where_it_could_be_cheapest():
    """Forty corners of one cost (a prompt machine fewer for each token machine: equal
    prices), then a prompt pool that falls no further, so every later corner is dearer. Past
    WALK_CORNERS the cheapest corner is searched only up to about the last token pool that
    could still hold one within the cheapest cost (`_tightened_floor`: one infeasible point
    a halving of the token pools left): every tied corner is found, and no corner past
    token pool 45 is resolved (searching to the end of the box resolved them up to 182, in
    124 points)."""
    from provisioner.frontier import WALK_CORNERS, Probe, budget_walk
    design = CATALOG.design("splitwise-hh")   # both pools dgx-h100: equal prices

    def rising(name, p, t, rate):
        return p >= max(200 - t, 160)

    def objective(p, t):
        return design.cost_per_hour(p, t)

    corners, asked = _walk(budget_walk(Probe(design), 10.0, 256, 256, objective,
                                       objective(256, 1)), rising, design)
    assert WALK_CORNERS < 40
    tied = [(200 - t, t) for t in range(1, 41)]
    assert set(tied) <= set(corners)
    assert all(p == max(200 - t, 160) for p, t in corners)   # each the least feasible pool
    assert max(t for _, t in corners) <= 45
    assert len(asked) <= 110


@dataclass(frozen=True)
class _Variant:
    """A layout variant as `layout_search` reads one: a design, its capacity bound, floors."""
    design: object
    bound: float
    floors: tuple = (1, 1)


def _pooled(design, p, t, rate):
    """baseline-h100 holds 10 req/s with 4 machines ($152/h, 22.4 kW); splitwise-hh with
    `_pooled.need` prompt and token machines each (3: $228/h; 2: $152/h and 22.4 kW, a tie;
    1: $76/h); both scale with the rate (so a headroom climb ends)."""
    scale = (rate or 10.0) / 10.0
    if t == 0:
        return p >= 4 * scale
    return p >= _pooled.need * scale and t >= _pooled.need * scale


@pytest.mark.parametrize("need", [3, 2, 1])
def test_layouts_verify_only_what_could_win_and_finish_only_the_answer(need, monkeypatch):
    """Variants are screened first and verified cheapest screened candidate first: a
    variant whose candidates cost more than the best verified optimum, or tie it with a
    later variant's (a tie keeps the earlier variant), is not verified: it cannot beat it;
    the headroom and load sweep are the answer's alone. The answer is the variant the
    exhaustive enumeration finds cheapest, the earlier one on a tie."""
    from provisioner.frontier import CANNOT_BEAT, layout_search
    monkeypatch.setattr(_pooled, "need", need, raising=False)
    dear = need > 1
    from hardware_catalog import Layout
    base = CATALOG.design("baseline-h100").with_layouts(Layout(8))
    split = CATALOG.design("splitwise-hh").with_layouts(Layout(8), Layout(8))
    runner = Runner(OracleEvaluator(CATALOG, _pooled, "pooled"))
    verifier = Verifier(runner, (0, 1, 2))
    verified = []

    def run_batch(items):
        verified.extend((i.point, i.samples) for i in items if isinstance(i, Verify))
        return verifier.run(items)

    settings = SearchSettings(load_sweep=(0.5,), search_limit=48)
    search = layout_search([_Variant(base, 100.0), _Variant(split, 120.0)],
                           Goal("min-cost", 10.0), Constraints(), settings)
    result = drive({"design": search}, run_batch)["design"]
    cheapest = {d.name: d.cost_per_hour(*brute_force_min(
        _pooled, d, 10.0, lambda pools, p, t: pools.cost_per_hour(p, t))) for d in (base, split)}
    winner = min(cheapest, key=cheapest.get)   # (the baseline, first, on a tie)
    assert result.design.name == winner and result.optimum.cost_per_hour == cheapest[winner]
    lines = {line["layout"]: line for line in result.layouts}
    if dear:   # splitwise-hh's cheapest corner costs more than baseline's $152, or as much
        assert lines["TP8 / TP8"]["status"] == "infeasible"
        assert lines["TP8 / TP8"]["reason"] == CANNOT_BEAT
        assert not [p for p, _ in verified if p.design.name == "splitwise-hh"]
    else:      # splitwise-hh wins, verified first: the baseline's dearer optimum is only
        #        quick-checked (to cap splitwise-hh's screening), never verified in full
        assert lines["TP8"]["status"] == "infeasible" and lines["TP8"]["reason"] == CANNOT_BEAT
        assert not [p for p, samples in verified
                    if p.design.name == "baseline-h100" and samples is None]
    finishing = [m for m in result.points if m.rate_rps != 10.0]   # headroom and sweep
    assert finishing and result.headroom_rps >= 10.0
    assert {m.point.design.name for m in finishing} == {winner}
    assert lines[[k for k in lines if lines[k]["status"] == "chosen"][0]]["evaluations"] == len(
        result.points)


@dataclass(frozen=True)
class _LeadFailsOnSeven:
    """As `_pooled` (need 2), but baseline-h100's 4 machines fail sample 7, which needs 5
    ($190/h): its screened and quick-checked optimum, $152/h, fails its verification."""
    def outcome(self, point, seed):
        p, t, scale = point.prompt_machines, point.token_machines, point.rate_rps / 10.0
        ok = (p >= (5 if seed == 7 else 4) * scale if t == 0
              else p >= 2 * scale and t >= 2 * scale)
        value = 3.0 if ok else 9.0
        slo = tuple((key, value if key == "ttft_p99" else 1.0,
                     6.0 if key == "ttft_p99" else 10.0) for key in SLO_KEYS)
        return Outcome(ok, True, "" if ok else "TTFT P99 9 > 6x", slo, 1.0 - value / 6.0, 100)

    def identity(self):
        return {"oracle": "lead fails on seven"}

    def point_identity(self, point):
        return {"design": point.design.as_dict()}


def test_a_layout_screened_against_a_lead_that_fails_is_searched_again():
    """The first variant's cheapest candidate ($152/h) passes screening and its quick check,
    so the second variant's screening looks only below it (its $152/h tie goes to the first);
    the candidate then fails verification on sample 7 and the first variant's optimum is
    $190/h: the second is searched again against that and wins with its $152/h."""
    from hardware_catalog import Layout
    from provisioner.frontier import layout_search
    base = CATALOG.design("baseline-h100").with_layouts(Layout(8))
    split = CATALOG.design("splitwise-hh").with_layouts(Layout(8), Layout(8))
    verifier = Verifier(Runner(_LeadFailsOnSeven()), tuple(range(10)))
    search = layout_search([_Variant(base, 100.0), _Variant(split, 120.0)],
                           Goal("min-cost", 10.0), Constraints(),
                           SearchSettings(load_sweep=(), search_limit=48))
    result = drive({"design": search}, verifier.run)["design"]
    assert result.design.name == "splitwise-hh" and result.optimum.cost_per_hour == 152.0
    assert (result.optimum.prompt_machines, result.optimum.token_machines) == (2, 2)
    lines = {line["layout"]: line for line in result.layouts}
    assert lines["TP8"]["status"] == "lost" and lines["TP8"]["cost_per_hour"] == 190.0
    assert lines["TP8 / TP8"]["status"] == "chosen"


@pytest.mark.parametrize("need", [4, 3, 2])
def test_a_layout_that_cannot_win_is_ruled_out_on_its_largest_winning_pools(need, monkeypatch):
    """Once a layout's optimum is verified ($152/h), a later one could only win with pool
    sizes that cost no more and rank strictly before it (a tie keeps the earlier layout).
    Every such cell lies below the largest pools within $152/h (3 + 3 machines): when that
    box corner fails (need 4), one simulation rules the layout out; else below one of the
    largest winning cells, so those few, in one batch, are all it simulates more when they
    fail (need 3: $228 and need 2: a $152 tie)."""
    from provisioner.frontier import CANNOT_BEAT, _winning_cells, layout_search
    from hardware_catalog import Layout
    monkeypatch.setattr(_pooled, "need", need, raising=False)
    base = CATALOG.design("baseline-h100").with_layouts(Layout(8))
    split = CATALOG.design("splitwise-hh").with_layouts(Layout(8), Layout(8))
    verifier = Verifier(Runner(OracleEvaluator(CATALOG, _pooled, "pooled")), (0, 1, 2))
    batches = []

    def run_batch(items):
        batches.append([i.point if isinstance(i, Verify) else i for i in items])
        return verifier.run(items)

    settings, goal = SearchSettings(load_sweep=(0.5,), search_limit=48), Goal("min-cost", 10.0)
    search = layout_search([_Variant(base, 100.0), _Variant(split, 120.0)], goal,
                           Constraints(), settings)
    result = drive({"design": search}, run_batch)["design"]
    assert result.design.name == "baseline-h100" and result.optimum.cost_per_hour == 152.0
    cells = _winning_cells(split, goal, Constraints(), settings, 152.0, result.optimum)
    assert cells == [(1, 2), (2, 1)]
    asked = [[(p.prompt_machines, p.token_machines) for p in batch] for batch in batches
             if any(p.design.name == "splitwise-hh" for p in batch)]
    assert asked == ([[(3, 3)]] if need > 3 else [[(3, 3)], cells])
    (line,) = [line for line in result.layouts if line["layout"] == "TP8 / TP8"]
    assert line["reason"] == CANNOT_BEAT and line["evaluations"] == sum(map(len, asked))


@pytest.mark.parametrize("goal_name", ["min-cost", "min-power"])
def test_a_stand_in_that_takes_ties_ranks_one_milli_unit_after_its_rival(goal_name):
    """An earlier layout verified after a later one's optimum takes a tie with it: ranked
    against `_taking_ties`, a candidate that ties the optimum ranks before, one that draws a
    watt more (costs a tenth of a cent more) does not."""
    from types import SimpleNamespace
    from provisioner.chunked import metrics_key
    from provisioner.frontier import _taking_ties
    key = metrics_key(goal_name)
    for cost, power in [(266.0, 39.2), (228.0, 33.6), (1444.0, 212.8), (7443.6, 1030.4)]:
        rival = SimpleNamespace(cost_per_hour=cost, power_kw=power, rate_rps=70.0)
        stand_in = _taking_ties(rival, Goal(goal_name, 70.0))
        assert key(rival) < key(stand_in)
        worse = (SimpleNamespace(cost_per_hour=cost, power_kw=power + 0.001, rate_rps=70.0)
                 if goal_name == "min-cost" else
                 SimpleNamespace(cost_per_hour=cost + 0.001, power_kw=power, rate_rps=70.0))
        assert not key(worse) < key(stand_in)


@pytest.mark.parametrize("goal_name", ["min-cost", "min-power"])
def test_winning_cells_are_the_largest_that_undercut_and_rank_before_the_rival(goal_name):
    """Every pool size that costs (min-power: draws) no more than the budget and ranks
    strictly before the rival lies below one of `_winning_cells`, and each of those does
    both (splitwise-ha: its pools' machines differ in price and power)."""
    from types import SimpleNamespace
    from provisioner.chunked import metrics_key
    from provisioner.frontier import _winning_cells, objective_at
    design, goal = CATALOG.design("splitwise-ha"), Goal(goal_name, 10.0)
    key = metrics_key(goal_name)

    def ranks(p, t):
        return key(SimpleNamespace(cost_per_hour=design.cost_per_hour(p, t),
                                   power_kw=design.power_kw(p, t)))

    settings = SearchSettings(search_limit=40)
    for rival_cell in [(6, 3), (4, 7), (9, 2)]:
        rival = SimpleNamespace(cost_per_hour=design.cost_per_hour(*rival_cell),
                                power_kw=design.power_kw(*rival_cell))
        beat = objective_at(design, goal, *rival_cell)
        cells = _winning_cells(design, goal, Constraints(), settings, beat, rival)
        within = beat * (1 + 1e-9)   # (equal sums in another order: a float's rounding apart)
        winning = {(p, t) for p in range(1, 41) for t in range(1, 41)
                   if objective_at(design, goal, p, t) <= within and ranks(p, t) < key(rival)}
        assert set(cells) <= winning
        assert all(any(p <= q and t <= u for q, u in cells) for p, t in winning)
        assert rival_cell not in cells


def test_equal_sums_of_the_same_machines_rank_as_ties():
    """6 x 5.6 + 5.6 kW and 5 x 5.6 + 2 x 5.6 kW differ as floats; ranked in the selection's
    milli-units they tie, so a tie between layouts keeps the earlier one, not a rounding
    error's pick."""
    from types import SimpleNamespace
    from provisioner.chunked import metrics_key
    design = CATALOG.design("splitwise-hh")
    six, five = ((design.cost_per_hour(p, t), design.power_kw(p, t)) for p, t in ((6, 1), (5, 2)))
    assert six != five   # the floats' order is an accident of the sums
    key = metrics_key("min-cost")
    assert key(SimpleNamespace(cost_per_hour=six[0], power_kw=six[1])) == key(
        SimpleNamespace(cost_per_hour=five[0], power_kw=five[1]))


class HardProduct:
    """Capacity grows with P x T: the screening sample (seed 0) passes from P x T >= 300,
    every other sample fails outright below P x T = `need` and is the screening one above
    (the hard samples decide, not the prediction bound): the screened staircase lies below
    the one verification needs, with many equal-cost cells between them."""

    def __init__(self, need: int = 600):
        self.asked, self.need = [], need

    def outcome(self, point, seed):
        self.asked.append((point.prompt_machines, point.token_machines, seed))
        size = point.prompt_machines * point.token_machines
        return _load_outcome(2.0 if seed and size < self.need else 300 / size)

    def identity(self):
        return {"oracle": "hard product"}

    def point_identity(self, point):
        return {}


@pytest.mark.parametrize("goal_name", ["min-cost", "min-power"])
def test_rejected_candidates_give_way_to_the_cheapest_cell_left(goal_name):
    """Candidates that fail verification rule out the cells below them; the next candidate
    is the cheapest cell above a screened feasible one that none rules out (`_best_cell`),
    so the optimum is the brute-force one, with no neighbours screened. Stepping up from
    each rejection to its neighbours, galloping after 16, took 264 simulations here and
    answered 16P+25T ($1558/h) where 20P+20T ($1520/h) verifies."""
    design = CATALOG.design("splitwise-hh")
    oracle = HardProduct(need=400)
    seeds = (0, 1, 2, 3)
    (result,) = search_designs([design], Goal(goal_name, 10.0), Constraints(),
                               SearchSettings(load_sweep=(), search_limit=64),
                               Verifier(Runner(oracle), seeds).run)
    assert len(result.rejected) > 16
    verify = Verifier(Runner(HardProduct(need=400)), seeds).run
    value = COST if goal_name == "min-cost" else POWER
    cells = sorted(itertools.product(range(1, 65), range(1, 65)),
                   key=lambda c: value(design, *c))
    best = next(c for c in cells if c[0] * c[1] >= 300
                and verify([Verify(Point(design, *c, 10.0))])[0].meets_slos)
    found = (result.optimum.prompt_machines, result.optimum.token_machines)
    assert value(design, *found) == pytest.approx(value(design, *best))
    assert len(oracle.asked) < 264
    # the answer is among the evaluated points (evaluations.csv), though never screened alone
    assert result.optimum.point in {m.point for m in result.points}
