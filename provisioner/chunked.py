"""Chunked prefill in the search: `--chunk-tokens N|auto` and the disaggregated-vs-chunked view.

- `--chunk-tokens N` sets the budget of every chunked-prefill design (records by value: the
  design record is replaced, other designs keep theirs).
- `--chunk-tokens auto` searches each chunked design once per budget of `CHUNK_BUDGETS` (variant
  design records named `NAME@BUDGET`, searched together with the other designs) and keeps the
  variant that is best for the goal, under the design's own name, with the chosen budget and a
  line per budget tried (`DesignResult.chunk_search`).
- `comparison` answers the question Sarathi-Serve left open ("a quantitative comparison between
  Sarathi-Serve and disaggregation-based solutions"): for the same workload, SLOs and goal, the
  best Splitwise design against the best chunked colocated design, on cost, power, GPUs and
  headroom, with one sentence on which wins and by how much.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Sequence

from hardware_catalog import Design, InputError
from provisioner.options import CHUNK_BUDGETS
from provisioner.select import MILLI
from provisioner.study import Asked, DesignResult, Goal

VARIANT_SEPARATOR = "@"


def with_chunk_tokens(designs: Sequence[Design], chunk_tokens) -> tuple[Design, ...]:
    """A whole-number budget replaces the budget of every chunked design."""
    if not isinstance(chunk_tokens, int) or isinstance(chunk_tokens, bool):
        return tuple(designs)
    return tuple(replace(d, chunk_tokens=chunk_tokens) if d.is_chunked else d for d in designs)


def budget_variants(designs: Sequence[Design], chunk_tokens) -> tuple[list[Design], dict[str, str]]:
    """The designs to search (auto: one record per budget of every chunked design) and the
    design name each one stands for."""
    searched, origin = [], {}
    for d in designs:
        if chunk_tokens == "auto" and d.is_chunked:
            for budget in CHUNK_BUDGETS:
                variant = replace(d, name=f"{d.name}{VARIANT_SEPARATOR}{budget}",
                                  chunk_tokens=budget)
                searched.append(variant)
                origin[variant.name] = d.name
        else:
            searched.append(d)
            origin[d.name] = d.name
    if len(origin) < len(searched):   # a record named like a variant would replace it
        names = [d.name for d in searched]
        clash = next(n for n in names if names.count(n) > 1)
        raise InputError(f"design '{clash}' has the name of a budget variant that "
                         "--chunk-tokens auto searches; rename it", field="designs")
    return searched, origin


def progress_by_design(on_batch: Callable[[dict[str, int]], None] | None,
                       origin: dict[str, str]):
    """Progress counts of the variants summed under the design they stand for (finished when
    all of its variants are)."""
    if on_batch is None:
        return None

    def update(asked: dict[str, int]) -> None:
        totals: dict[str, int] = {}
        for name, count in asked.items():
            totals[origin[name]] = totals.get(origin[name], 0) + count
        finished = getattr(asked, "finished", frozenset())
        done = set(totals) - {origin[name] for name in asked if name not in finished}
        on_batch(Asked(totals, done, getattr(asked, "search", None)))
    return update


def goal_key(goal_name: str):
    """Order of design results for a goal: the best first (ties: cheaper)."""
    key = metrics_key(goal_name)
    return lambda r: key(r.optimum)


def metrics_key(goal_name: str):
    """`goal_key` of a result whose optimum would be these metrics: in the milli-units the
    selection ranks in (`select.MILLI`), so that sums of the same machines' figures in another
    order (6 x 5.6 + 5.6 kW against 5 x 5.6 + 2 x 5.6) tie, as they do there."""
    def milli(value: float) -> int:
        return round(value * MILLI)

    return {"min-cost": lambda m: (milli(m.cost_per_hour), milli(m.power_kw)),
            "min-power": lambda m: (milli(m.power_kw), milli(m.cost_per_hour)),
            "max-rate": lambda m: (-milli(m.rate_rps), milli(m.cost_per_hour))}[goal_name]


def best_of(results: Sequence[DesignResult], goal_name: str) -> DesignResult | None:
    feasible = [r for r in results if r.feasible]
    return min(feasible, key=goal_key(goal_name)) if feasible else None


def collapse_variants(designs: Sequence[Design], results: Sequence[DesignResult],
                      origin: dict[str, str], goal: Goal) -> list[DesignResult]:
    """One result per design asked for: an auto design's best budget (or, when no budget is
    feasible, its largest budget's result), under the design's own name, with every budget's
    optimum in `chunk_search`."""
    groups: dict[str, list[DesignResult]] = {}
    for r in results:
        groups.setdefault(origin[r.design.name], []).append(r)
    merged = []
    for d in designs:
        group = groups[d.name]
        if len(group) == 1 and group[0].design.name == d.name:
            merged.append(group[0])
            continue
        chosen = best_of(group, goal.name) or group[-1]
        merged.append(replace(chosen, design=replace(chosen.design, name=d.name),
                              chunk_search=[_budget_line(r) for r in group]))
    return merged


def _budget_line(r: DesignResult) -> dict:
    o = r.optimum
    line = {"chunk_tokens": r.design.chunk_tokens, "feasible": r.feasible}
    if o is None:
        return {**line, "reason": r.reason}
    line.update(machines=o.prompt_machines, rate_rps=o.rate_rps, cost_per_hour=o.cost_per_hour,
                power_kw=o.power_kw, gpus=o.gpus)
    headroom = getattr(r, "headroom_rps", None)
    if headroom is not None:
        line["headroom_rps"] = headroom
    return line


# ---------------------------------------------------------------- disaggregated vs chunked
def comparison(results: Sequence[DesignResult], goal_name: str,
               rate_rps: float | None = None, mixed_pool: bool | None = None) -> dict | None:
    """The best disaggregated (Splitwise) design against the best chunked colocated design for
    the goal (`rate_rps`: the goal's load, for the sentence), or None when the study does not
    hold both kinds. Headroom is shown when the results carry it. `mixed_pool`: the search's
    --mixed-pool / --no-mixed-pool, said in the sentence when given (None: each design's own)."""
    split = [r for r in results if not r.design.is_baseline]
    chunked = [r for r in results if r.design.is_baseline and r.design.is_chunked]
    if not split or not chunked:
        return None
    a, b = best_of(split, goal_name), best_of(chunked, goal_name)
    view = {"goal": goal_name, "disaggregated": _side(a), "chunked": _side(b)}
    # --hardware prunes designs that cannot beat the answer: the sides are the best of the
    # designs searched, and the pruned ones are named with what bounds them
    pruned = {kind: sorted((r for r in group if r.pruned and r.pruned_by),
                           key=lambda r: (_signed(r.pruned_by["cannot_beat"], goal_name),
                                          r.design.name))
              for kind, group in (("disaggregated", split), ("chunked", chunked))}
    winner, sentence = _verdict(a, b, goal_name, rate_rps,
                                {kind for kind, group in pruned.items() if group})
    if any(pruned.values()):
        sentence += _pruned_note(pruned, a, b, winner, goal_name)
        view["pruned"] = {kind: [{"design": r.design.name, "by": r.pruned_by["by"],
                                  "cannot_beat": r.pruned_by["cannot_beat"]} for r in group]
                          for kind, group in pruned.items()}
    if mixed_pool is not None:
        sentence += " " + MIXED_POOL_SENTENCE[mixed_pool]
    return {**view, "winner": winner, "sentence": sentence}


# what the disaggregated side ran with, when the search said (like is compared with like)
MIXED_POOL_SENTENCE = {
    True: ("The disaggregated designs ran with the mixed pool (--mixed-pool): prompt machines "
           "decode and token machines prefill when their own pool is loaded."),
    False: ("The disaggregated designs ran without the mixed pool (--no-mixed-pool): pure "
            "prefill and decode pools, as Dynamo and llm-d run them."),
}


KINDS = {"disaggregated": "disaggregated", "chunked": "chunked colocated"}
PRUNED_SHOWN = 3   # pruned designs named in the comparison sentence, best bound first


def _signed(value: float, goal_name: str) -> float:
    """An objective as a sort key, the best first."""
    return -value if goal_name == "max-rate" else value


def _pruned_note(pruned: dict, a, b, winner: str | None, goal_name: str) -> str:
    """The sentence on the pruned designs of the side that did not win (of both on a tie or
    when neither side has a design that meets the SLOs): what bounds them, and the margin
    over every design of that kind that the bounds guarantee."""
    kinds = ([k for k in KINDS if k != winner and pruned[k]] if winner in KINDS
             else [k for k in KINDS if pruned[k]])
    notes = []
    for kind in kinds:
        group = pruned[kind]
        answer = group[0].pruned_by["answer"]
        named = ", ".join(f"{r.design.name} ({_pruned_limit(r.pruned_by, goal_name)})"
                          for r in group[:PRUNED_SHOWN])
        more = f" and {len(group) - PRUNED_SHOWN} more" if len(group) > PRUNED_SHOWN else ""
        what = "design" if len(group) == 1 else "designs"
        note = (f" Not searched to the end: {len(group)} {KINDS[kind]} {what}, pruned as "
                f"unable to beat the answer ({answer['design']} at "
                f"{goal_amount(answer['value'], goal_name)}): {named}{more}")
        if winner in KINDS:
            won = (a if winner == "disaggregated" else b).optimum
            lost = b if winner == "disaggregated" else a
            limits = [r.pruned_by["cannot_beat"] for r in group]
            if lost is not None:
                limits.append(_objective(lost.optimum, goal_name))
            note += "; " + _guaranteed(_objective(won, goal_name), limits, KINDS[kind],
                                       goal_name)
        notes.append(note + ".")
    return "".join(notes)


def _pruned_limit(pruned_by: dict, goal_name: str) -> str:
    if pruned_by["by"] == "capacity_bound":
        return f"bound {goal_amount(pruned_by['cannot_beat'], goal_name)}"
    under = {"min-cost": "cheaper than", "min-power": "drawing less than"}.get(goal_name, "")
    return f"no pool sizes {under} {goal_amount(pruned_by['cannot_beat'], goal_name)} met the SLOs"


def _guaranteed(value: float, limits: list[float], kind: str, goal_name: str) -> str:
    """What the bounds settle: the winner's least margin over every design of `kind`."""
    higher_wins = goal_name == "max-rate"
    limit = max(limits) if higher_wins else min(limits)
    if (value < limit) if higher_wins else (value > limit):
        return (f"a bound of {goal_amount(limit, goal_name)} leaves open whether a {kind} "
                "design searched in full would win")
    if higher_wins:
        margin = value / limit - 1 if limit > 0 else None
    else:
        margin = 1 - value / limit if limit > 0 else None
    better = {"max-rate": "more req/s", "min-power": "less power"}.get(goal_name, "cheaper")
    if margin is None or same_value(value, limit):
        beats = {"max-rate": "sustains more", "min-power": "draws less power"}.get(
            goal_name, "costs less")
        return f"so no {kind} design {beats}"
    return f"so it is at least {_percent(margin)} {better} than every {kind} design"


def _objective(o, goal_name: str) -> float:
    return {"min-cost": o.cost_per_hour, "min-power": o.power_kw,
            "max-rate": o.rate_rps}[goal_name]


def goal_amount(value: float, goal_name: str) -> str:
    """A value of the goal's objective with its unit: $472.40/h, 58.4 kW, 70 req/s."""
    return _value(value, {"min-cost": "$/h", "min-power": "kW", "max-rate": "req/s"}[goal_name])


def pruned_phrase(limit: float, answer: float, goal_name: str) -> str:
    """A design pruned by its capacity bound, said against the answer: "pruned: bound
    $480.00/h above the answer" (min-power: kW; max-rate: req/s below it)."""
    if same_value(limit, answer):
        where = "equal to"
    elif goal_name == "max-rate":
        where = "below"
    else:
        where = "above"
    return f"pruned: bound {goal_amount(limit, goal_name)} {where} the answer"


def _side(r: DesignResult | None) -> dict | None:
    if r is None:
        return None
    o, d = r.optimum, r.design
    side = {"design": d.name}
    side.update(d.pool_sizes(o.prompt_machines, o.token_machines))
    if d.is_chunked:
        side["chunk_tokens"] = d.chunk_tokens
    side.update(rate_rps=o.rate_rps, cost_per_hour=o.cost_per_hour, power_kw=o.power_kw,
                gpus=o.gpus)
    headroom = getattr(r, "headroom_rps", None)
    if headroom is not None:
        side["headroom_rps"] = headroom
    return side


def _label(r: DesignResult) -> str:
    d = r.design
    if d.is_chunked:
        return f"chunked colocated {d.name} (chunk {d.chunk_tokens}, {r.optimum.prompt_machines} machines)"
    return (f"disaggregated {d.name} ({r.optimum.prompt_machines} prompt + "
            f"{r.optimum.token_machines} token machines)")


def _verdict(a: DesignResult | None, b: DesignResult | None, goal_name: str,
             rate_rps: float | None, pruned: set[str] = frozenset()) -> tuple[str | None, str]:
    """The verdict sentence; `pruned`: the kinds some of whose designs were pruned (their
    side is then the best design searched, said so)."""
    searched = " searched" if pruned else ""
    if a is None and b is None:
        return None, (f"Neither a disaggregated nor a chunked colocated design{searched} meets "
                      "the SLOs.")
    if a is None or b is None:
        only = b if a is None else a
        other = "disaggregated" if a is None else "chunked"
        searched = " searched" if other in pruned else ""
        return ("chunked" if a is None else "disaggregated",
                f"Only {_label(only)} meets the SLOs; no {KINDS[other]} design{searched} "
                "does within the limits.")
    oa, ob = a.optimum, b.optimum
    if goal_name == "max-rate":
        va, vb, unit, better = oa.rate_rps, ob.rate_rps, "req/s", "more"
        what = "sustains"
    elif goal_name == "min-power":
        va, vb, unit, better, what = oa.power_kw, ob.power_kw, "kW", "less power", "draws"
    else:
        va, vb, unit, better, what = oa.cost_per_hour, ob.cost_per_hour, "$/h", "cheaper", "costs"
    higher_wins = goal_name == "max-rate"
    if same_value(va, vb):
        winner, w, lo = "tie", a, b
    elif (va > vb) == higher_wins:
        winner, w, lo = "disaggregated", a, b
    else:
        winner, w, lo = "chunked", b, a
    wv = va if w is a else vb
    lv = vb if w is a else va
    rate = f" at {rate_rps:g} req/s" if rate_rps is not None and goal_name != "max-rate" else ""
    others = [f"{oa.gpus} vs {ob.gpus} GPUs"]
    if goal_name != "min-power":
        others.append(f"{oa.power_kw:,.1f} vs {ob.power_kw:,.1f} kW")
    if goal_name != "min-cost":
        others.append(f"${oa.cost_per_hour:,.2f} vs ${ob.cost_per_hour:,.2f}/h")
    ha, hb = getattr(a, "headroom_rps", None), getattr(b, "headroom_rps", None)
    if ha is not None and hb is not None:
        others.append(f"headroom {ha:.4g} vs {hb:.4g} req/s")
    extras = f" ({', '.join(others)}, disaggregated vs chunked)."
    if winner == "tie":
        both = {"sustains": "sustain", "draws": "draw", "costs": "cost"}[what]
        return winner, (f"Tie: {_label(a)} and {_label(b)} both {both} {_value(va, unit)}"
                        f"{rate}{extras}")
    if higher_wins:
        margin = f"{_percent(wv / lv - 1)} {better}" if lv > 0 else better
    else:
        margin = f"{_percent(1 - wv / lv)} {better}"
    side = "Disaggregated" if winner == "disaggregated" else "Chunked colocated"
    loser = "chunked" if winner == "disaggregated" else "disaggregated"
    best = f", the best {KINDS[loser]} design searched," if loser in pruned else ""
    return winner, (f"{side} wins: {_label(w)} {what} {_value(wv, unit)}, {margin} than "
                    f"{_label(lo)}{best} at {_value(lv, unit)}{rate} under the same SLOs"
                    f"{extras}")


def same_value(a: float, b: float) -> bool:
    """Equal up to the rounding of sums of prices (14 x $17.60 against 7 x $35.20 differ in
    the last bits): a tie, not a 0% win."""
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def _percent(fraction: float) -> str:
    """A margin that never reads 0%: one decimal below 1%."""
    return f"{fraction:.0%}" if fraction >= 0.01 else f"{fraction:.1%}"


def _value(value: float, unit: str) -> str:
    if unit == "$/h":
        return f"${value:,.2f}/h"
    return f"{value:,.4g} {unit}" if unit == "req/s" else f"{value:,.1f} {unit}"
