"""Which hardware to buy (issue 28): every design shape over a set of SKUs, searched in the
order of their capacity bounds, the ones that cannot win never simulated.

`hardware_designs` turns `--hardware all | SKU,SKU,...` into design records: each (prompt
SKU, token SKU) pair disaggregated, each SKU colocated and each SKU with chunked prefill. A
shape the catalog already names keeps the catalog's name (dgx-h100/dgx-h100 is splitwise-hh),
so the paper's designs are recognisable among the generated ones.

`hardware_search` is one search generator (for `frontier.drive`) over all of them: designs go
best capacity bound first; a design whose bound cannot beat the best verified optimum found so
far is pruned (reported with its bound, nothing simulated), and the others search only the
pools that could beat it (`layout_search`'s `beat`). The catalog's own designs are always
searched in full, so the answer's margin over the best of them is exact. One design after
the other, so what is pruned depends on the bounds and the answers alone, never on the job
count or the backend (each design's own batches still run in parallel).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from hardware_catalog import DEFAULT_CHUNK_TOKENS, Catalog, Design, InputError, option_ref
from provisioner.chunked import best_of, goal_amount, goal_key, pruned_phrase
from provisioner.frontier import CANNOT_BEAT, layout_search, objective
from provisioner.study import DesignResult, Goal

ALL = "all"
HARDWARE_PROGRESS = "design shapes, best bound first"   # a hardware search's progress line
UNITS = {"min-cost": "$/h", "min-power": "kW", "max-rate": "req/s"}


def hardware_designs(skus: Sequence[str], catalog: Catalog) -> tuple[Design, ...]:
    """Every design shape over the SKUs (`all`: the catalog's), catalog names kept."""
    if list(skus) == [ALL]:
        machines = list(catalog.machines.values())
    elif ALL in skus:
        raise InputError(f"{option_ref('hardware')} 'all' cannot be combined with SKU names")
    else:
        try:
            machines = [catalog.machine(sku) for sku in dict.fromkeys(skus)]
        except InputError as err:
            raise InputError(f"{option_ref('hardware')}: {err}") from None
    named = {replace(d, name=""): name for name, d in catalog.designs.items()}
    generated = []
    for prompt in machines:
        shapes = [Design(f"colocated-{prompt.name}", prompt),
                  Design(f"chunked-{prompt.name}", prompt, prefill="chunked",
                         chunk_tokens=DEFAULT_CHUNK_TOKENS)]
        shapes += [Design(f"{prompt.name}/{token.name}", prompt, token) for token in machines]
        generated += [replace(d, name=named.get(replace(d, name=""), d.name)) for d in shapes]
    return tuple(generated)


def hardware_search(designs: Sequence[Design], variants: dict[str, Sequence[Any]],
                    goal: Goal, constraints, settings, always: frozenset[str] = frozenset()):
    """Search generator: {design name: DesignResult} for every design with variants (best
    capacity bound first; see the module docstring). `always`: names searched in full."""
    maximise = goal.name == "max-rate"
    better = goal_key(goal.name)
    order = sorted((d for d in designs if variants.get(d.name)),
                   key=lambda d: -variants[d.name][0].bound if maximise
                   else variants[d.name][0].bound)
    best: DesignResult | None = None
    results: dict[str, DesignResult] = {}
    for design in order:
        bound = variants[design.name][0].bound
        value = None if best is None else objective(best.optimum, goal)
        if (design.name not in always and value is not None
                and (bound <= value if maximise else bound >= value)):
            results[design.name] = pruned_result(design, goal, variants[design.name][0],
                                                 best)
            continue
        beat = None if design.name in always or maximise else value
        result = yield from layout_search(variants[design.name], goal, constraints, settings,
                                          beat)
        if beat is not None and not result.feasible and result.reason == CANNOT_BEAT:
            result.pruned = True
            result.pruned_by = {"by": "search", "cannot_beat": float(beat)}
        results[design.name] = result
        if result.feasible and (best is None or better(result) < better(best)):
            best = result
    for result in results.values():   # said against the answer, known only now
        if result.pruned:
            result.pruned_by["answer"] = {"design": best.design.name,
                                          "value": float(objective(best.optimum, goal))}
            result.reason = pruned_reason(result.pruned_by, goal.name)
    return results


def pruned_result(design: Design, goal: Goal, variant, best: DesignResult) -> DesignResult:
    """A design whose best capacity bound cannot beat `best`'s verified optimum."""
    value = objective(best.optimum, goal)
    result = DesignResult(design, goal, None,
                          f"pruned: bound {goal_amount(variant.bound, goal.name)} cannot beat "
                          f"{best.design.name}'s verified {goal_amount(value, goal.name)}", [])
    result.pruned = True
    result.pruned_by = {"by": "capacity_bound", "cannot_beat": float(variant.bound)}
    result.capacity_bound = {"value": float(variant.bound), "pool_floors": list(variant.floors)}
    return result


def pruned_reason(pruned_by: dict, goal_name: str) -> str:
    """Why a design was pruned, against the answer: "pruned: bound $X/h above the answer
    (DESIGN at $Y/h); not simulated" (min-power: kW; max-rate: req/s below), or for one
    searched only where it could win, the pools tried and the answer."""
    floor, answer = pruned_by["cannot_beat"], pruned_by["answer"]
    said = f"({answer['design']} at {goal_amount(answer['value'], goal_name)})"
    if pruned_by["by"] == "capacity_bound":
        return f"{pruned_phrase(floor, answer['value'], goal_name)} {said}; not simulated"
    under = {"min-cost": "cheaper than", "min-power": "drawing less than"}[goal_name]
    return (f"pruned: no pool sizes {under} {goal_amount(floor, goal_name)} meet the SLOs "
            f"(searched only there), so it cannot beat the answer {said}")


def hardware_summary(results: Sequence[DesignResult], goal: Goal,
                     catalog_names: frozenset[str]) -> dict:
    """report.json `summary.hardware`: how many designs were generated, found feasible,
    pruned and infeasible, the best one and its margin over the best catalog design."""
    statuses = [r.status for r in results]
    best = best_of(results, goal.name)
    ours = best_of([r for r in results if r.design.name in catalog_names], goal.name)
    summary = {"designs": len(results), "feasible": statuses.count("feasible"),
               "pruned": statuses.count("pruned"), "infeasible": statuses.count("infeasible"),
               "pruned_before_simulation": sum(1 for r in results
                                               if r.status == "pruned" and not r.points),
               "simulated": sum(1 for r in results if r.points),
               "best": best and best.design.name,
               "best_catalog_design": ours and ours.design.name, "margin": None,
               "comparison": "", "answer": ""}
    if best is None:
        summary["answer"] = "no design over these machines meets the SLOs"
        return summary
    comparison = ("no catalog design meets the SLOs" if ours is None
                  else "a catalog design is the best over these machines")
    if ours is not None and ours is not best:
        mine, theirs = objective(best.optimum, goal), objective(ours.optimum, goal)
        margin = mine / theirs - 1.0 if goal.name == "max-rate" else 1.0 - mine / theirs
        word = {"max-rate": "more req/s", "min-cost": "cheaper",
                "min-power": "less power"}[goal.name]
        comparison = (f"{margin:.0%} {word} than {ours.design.name}, the best of the "
                      "catalog's designs")
        summary["margin"] = round(margin, 6)
    summary["comparison"] = comparison
    summary["answer"] = f"{best.design.name} ({_pools(best)}): {comparison}"
    return summary


def _pools(result: DesignResult) -> str:
    o = result.optimum
    return result.design.pools_text(o.prompt_machines, o.token_machines, "skus")
