"""The optimum among evaluated points, chosen by OR-Tools CP-SAT under every linear constraint.

CP-SAT works on integers: cost ($/h), power (kW) and rates (req/s) are scaled to thousandths
(`MILLI`), so milli-dollars, watts and milli-requests per second; the catalog and rates carry at
most 4 significant decimals, so nothing is lost.
"""
from __future__ import annotations

import math
from typing import Sequence

from hardware_catalog import Design
from provisioner.options import Constraints
from provisioner.study import Goal, Metrics

MILLI = 1000  # CP-SAT needs integers: $/h -> m$/h, kW -> W, req/s -> mreq/s


def select_optimum(points: Sequence[Metrics], goal: Goal, constraints: Constraints,
                   design: Design) -> Metrics | None:
    """The best point that meets the SLOs under the goal and every constraint, or None.

    CP-SAT picks exactly one evaluated point; ties on the objective are broken by a fixed rank
    (the other resource, GPUs, machines, P, T), so the choice is deterministic.
    """
    from ortools.sat.python import cp_model  # ortools takes ~0.3 s to import: only when selecting

    candidates = sorted((m for m in points if m.meets_slos), key=lambda m: m.point)
    if not candidates:
        return None
    model = cp_model.CpModel()
    chosen = [model.NewBoolVar(f"x{i}") for i in range(len(candidates))]
    model.AddExactlyOne(chosen)

    def total(values):
        return cp_model.LinearExpr.WeightedSum(chosen, [int(v) for v in values])

    milli_cost = [round(m.cost_per_hour * MILLI) for m in candidates]
    watts = [round(m.power_kw * MILLI) for m in candidates]
    _add_constraints(model, total, candidates, constraints, design)
    if goal.budget is not None:
        scaled = milli_cost if goal.budget.kind == "cost" else watts
        model.Add(total(scaled) <= math.floor(goal.budget.value * MILLI + 1e-6))
    primary, secondary = _objectives(goal, candidates, milli_cost, watts)
    solved = _solve(model, total(primary), chosen)
    if solved is None:
        return None
    model.Add(total(primary) == solved[0])
    _, pick = _solve(model, total(_tie_break_ranks(candidates, secondary)), chosen)
    return candidates[pick]


def _add_constraints(model, total, candidates, c: Constraints, design: Design) -> None:
    prompt = total(m.prompt_machines for m in candidates)
    token = total(m.token_machines for m in candidates)
    if c.max_machines:
        model.Add(prompt + token <= c.max_machines)
    if c.max_gpus:
        model.Add(total(m.gpus for m in candidates) <= c.max_gpus)
    if not design.is_baseline and c.max_prompt:
        model.Add(prompt <= c.max_prompt)
    if not design.is_baseline and c.max_token:
        model.Add(token <= c.max_token)


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


def _solve(model, objective, chosen) -> tuple[int, int] | None:
    """(objective value, index of the chosen point), or None when nothing is allowed."""
    from ortools.sat.python import cp_model
    model.ClearObjective()
    model.Minimize(objective)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1     # single-threaded search is deterministic
    solver.parameters.random_seed = 0
    # CP-SAT would otherwise replace Python's SIGINT handler with the default one for good:
    # a later Ctrl-C would kill the process outright, leaving its workers behind
    solver.parameters.catch_sigint_signal = False
    if solver.Solve(model) != cp_model.OPTIMAL:
        return None
    pick = next(i for i, x in enumerate(chosen) if solver.BooleanValue(x))
    return round(solver.ObjectiveValue()), pick
