"""What moves the answer: each design's optimum re-derived with one assumption changed.

The variants: the rate +-10% (not for a closed loop: it has no rate); the HBM reserve at 0 or
10% (whichever the run did not use); every KV transfer serialized, or every one layer-wise;
burstier arrivals (gamma, CV 2) for synthesized arrivals; and +-15% on every latency for
designs with uncalibrated hardware (the datasheet transfer's typical error). The "as run" row
is the search's own answer, and every variant is searched and verified the same way (same
samples, same guard band), so a row differs from it by its assumption alone.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from provisioner.options import Execution
from provisioner.study import DesignResult, Study

LATENCY_ERROR = 0.15


def variants(study: Study) -> list[tuple[str, Study]]:
    """(label, study with one assumption changed) for every variant that applies."""
    out = []
    rate = study.goal.rate_rps
    if rate is not None:
        for factor, label in ((1.1, "rate +10%"), (0.9, "rate -10%")):
            goal = replace(study.goal, rate_rps=float(f"{rate * factor:.4g}"))
            out.append((label, replace(study, goal=goal)))
    reserve = study.sim_options.memory_reserve_fraction
    other = 0.10 if reserve == 0.0 else 0.0
    out.append((f"HBM reserve {other:.0%}",
                replace(study, sim_options=replace(study.sim_options,
                                                   memory_reserve_fraction=other))))
    for threshold, label in ((1 << 62, "KV transfer always serialized"),
                             (0, "KV transfer always layer-wise")):
        out.append((label, replace(study, sim_options=replace(
            study.sim_options, layerwise_min_prompt_tokens=threshold))))
    # a Mooncake trace's samples are windows of its own timeline (`WorkloadSource.at`): its
    # arrivals are never drawn, so there is no burstier variant to draw
    # (nor for sessions: they start as a Poisson process, their turns follow think times)
    # (nor for a closed loop: its users' requests arrive as the cluster answers them)
    if (rate is not None or not study.workload.timed) and study.workload.kind != "mooncake" \
            and study.workload.prefix_model is None and study.goal.closed is None:
        out.append(("burstier arrivals (gamma CV 2)",
                    replace(study, workload=replace(study.workload, burstiness_cv=2.0))))
    if any(r for r in _uncalibrated_designs(study)):
        for sign, label in ((1, "latencies +15%"), (-1, "latencies -15%")):
            perf = replace(study.perf, latency_factor=1.0 + sign * LATENCY_ERROR)
            out.append((label, replace(study, perf=perf)))
    return out


def _uncalibrated_designs(study: Study) -> list[str]:
    perf = study.perf.load(study.catalog)
    return [d.name for d in study.designs
            if any(not perf.is_calibrated(study.model, m) for m in d.machines())]


def sensitivity(study: Study, execution: Execution, run: Callable[[Study, Execution], object],
                as_run: list[DesignResult]) -> tuple[list[dict], list]:
    """One row per assumption: every design's optimum (machines, cost, power, rate) under it,
    next to the search's own (`as_run`); and the variant searches' run statistics."""
    quiet = study.auxiliary()
    base = {r.design.name: _optimum(r) for r in as_run}
    table = [{"assumption": "as run", "designs": base}]
    stats = []
    for label, variant in variants(quiet):
        result = run(variant, execution)
        stats.append(result.stats)
        optima = {r.design.name: _optimum(r) for r in result.designs}
        table.append({"assumption": label, "designs": {
            name: {**o, **_delta(o, base.get(name))} for name, o in optima.items()}})
    return table, stats


def _optimum(result) -> dict:
    o = result.optimum
    if o is None:
        return {"feasible": False}
    return {"feasible": True, "prompt_machines": o.prompt_machines,
            "token_machines": o.token_machines, "rate_rps": o.rate_rps,
            "cost_per_hour": o.cost_per_hour, "power_kw": o.power_kw}


def _delta(optimum: dict, base: dict | None) -> dict:
    """Relative change of cost (and of rate, for max-rate) against the base run."""
    if not optimum.get("feasible") or not base or not base.get("feasible"):
        return {}
    delta = {"cost_change": optimum["cost_per_hour"] / base["cost_per_hour"] - 1.0}
    if optimum["rate_rps"] and base["rate_rps"]:
        delta["rate_change"] = optimum["rate_rps"] / base["rate_rps"] - 1.0
    return delta
