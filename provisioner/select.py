"""The optimum among evaluated points, chosen by OR-Tools CP-SAT under every linear constraint.

The model is stated through OR-Tools' linear-solver wrapper (pywraplp) with CP-SAT as its
backend: the same solver as `ortools.sat.python.cp_model`, without that module's import of
pandas (about 0.25 s of every search's CPU; the wrapper loads in about 0.05 s).

CP-SAT works on integers: cost ($/h), power (kW) and rates (req/s) are scaled to thousandths
(`MILLI`), so milli-dollars, watts and milli-requests per second; the catalog and rates carry at
most 4 significant decimals, so nothing is lost, and every coefficient and bound is a whole
number, which the wrapper hands to CP-SAT unscaled.
"""
from __future__ import annotations

import math
from typing import Sequence

from hardware_catalog import Design
from provisioner.options import Constraints
from provisioner.study import Goal, Metrics

MILLI = 1000  # CP-SAT needs integers: $/h -> m$/h, kW -> W, req/s -> mreq/s
# single-threaded search is deterministic; CP-SAT would otherwise replace Python's SIGINT
# handler with the default one for good: a later Ctrl-C would kill the process outright,
# leaving its workers behind
CP_SAT_PARAMETERS = "num_workers:1 random_seed:0 catch_sigint_signal:false"


def select_optimum(points: Sequence[Metrics], goal: Goal, constraints: Constraints,
                   design: Design) -> Metrics | None:
    """The best point that meets the SLOs under the goal and every constraint, or None.

    CP-SAT picks exactly one evaluated point; ties on the objective are broken by a fixed rank
    (the other resource, GPUs, machines, P, T), so the choice is deterministic.
    """
    from ortools.linear_solver import pywraplp  # only when selecting

    candidates = sorted((m for m in points if m.meets_slos), key=lambda m: m.point)
    if not candidates:
        return None
    solver = pywraplp.Solver.CreateSolver("CP_SAT")
    if solver is None or not solver.SetSolverSpecificParametersAsString(CP_SAT_PARAMETERS):
        raise RuntimeError("this OR-Tools build has no usable CP-SAT backend; reinstall ortools")
    chosen = [solver.BoolVar(f"x{i}") for i in range(len(candidates))]

    def bound(values, low: float, high: float) -> None:   # low <= sum(values x chosen) <= high
        constraint = solver.Constraint(low, high)
        for x, value in zip(chosen, values):
            constraint.SetCoefficient(x, int(value))

    unlimited = solver.infinity()
    bound([1] * len(candidates), 1, 1)   # exactly one point
    milli_cost = [round(m.cost_per_hour * MILLI) for m in candidates]
    watts = [round(m.power_kw * MILLI) for m in candidates]
    for values, limit in _limits(candidates, constraints, design):
        bound(values, -unlimited, limit)
    if goal.budget is not None:
        scaled = milli_cost if goal.budget.kind == "cost" else watts
        bound(scaled, -unlimited, math.floor(goal.budget.value * MILLI + 1e-6))
    primary, secondary = _objectives(goal, candidates, milli_cost, watts)
    solved = _solve(solver, primary, chosen)
    if solved is None:
        return None
    bound(primary, solved[0], solved[0])
    _, pick = _solve(solver, _tie_break_ranks(candidates, secondary), chosen)
    return candidates[pick]


def _limits(candidates, c: Constraints, design: Design) -> list[tuple[list[int], int]]:
    """(per-candidate values, the most allowed) of every extra constraint that applies."""
    limits = []
    if c.max_machines:
        limits.append(([m.prompt_machines + m.token_machines for m in candidates], c.max_machines))
    if c.max_gpus:
        limits.append(([m.gpus for m in candidates], c.max_gpus))
    if c.max_prompt and design.pool("prompt"):
        limits.append(([m.prompt_machines for m in candidates], c.max_prompt))
    if c.max_token and design.pool("token"):
        limits.append(([m.token_machines for m in candidates], c.max_token))
    return limits


def _objectives(goal: Goal, points, milli_cost, watts):
    """(values to minimise, secondary key) for the goal."""
    if goal.name == "min-cost":
        return milli_cost, watts
    if goal.name == "min-power":
        return watts, milli_cost
    rate = [-round(m.rate_rps * MILLI) for m in points]
    return rate, (milli_cost if goal.budget.kind == "cost" else watts)


def _tie_break_ranks(points, secondary) -> list[int]:
    order = sorted(range(len(points)), key=lambda i: (
        secondary[i], points[i].gpus, points[i].prompt_machines + points[i].token_machines,
        points[i].prompt_machines, points[i].token_machines, points[i].rate_rps or 0.0))
    ranks = [0] * len(points)
    for rank, i in enumerate(order):
        ranks[i] = rank
    return ranks


def _solve(solver, values, chosen) -> tuple[int, int] | None:
    """(objective value, index of the chosen point) minimising sum(values x chosen), or None
    when nothing is allowed."""
    from ortools.linear_solver import pywraplp
    objective = solver.Objective()
    objective.Clear()
    for x, value in zip(chosen, values):
        objective.SetCoefficient(x, int(value))
    objective.SetMinimization()
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return None
    pick = next(i for i, x in enumerate(chosen) if x.solution_value() > 0.5)
    return round(objective.Value()), pick
