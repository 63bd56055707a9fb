"""A load curve's answers checked over the whole curve (issue 29): the static cluster and the
autoscaling plan, each simulated in one streamed run of every request of the curve
(`simcore.longrun`), the plan's pools resized mid-run at each window's start, machines failing
at fleet rates throughout; the SLOs are checked per planning window and over the whole curve.
Where a window of the plan misses an SLO, the plan is stepped up there (that window, then also
the one before it, since a backlog carries over) and checked again.

The simulation part of `provisioner.loadcurve`, which owns the load-curve glue and is the only
caller outside the tests.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

from provisioner.sparing import FLEET_MTBF_HOURS
from simcore import Cluster, SimOptions, evaluate_slos
from simcore.longrun import CurveRun, simulate_curve

STEP_UP_ROUNDS = 4        # whole-curve runs of a plan at most (the first, then step-ups)
DEFAULT_REPAIR_S = 1800.0  # a failed server back after 30 minutes (--repair-minutes)


def curve_options(study) -> SimOptions:
    """The study's simulation options over a whole curve: machines fail at the study's MTBF
    or, without one, at the fleet rate (the Llama 3 paper: about 6,000 hours per 8-GPU
    server), repaired after --repair-minutes; each run draws the failures from --seed."""
    o = study.sim_options
    return replace(o, mtbf_hours=o.mtbf_hours or FLEET_MTBF_HOURS,
                   repair_s=o.repair_s or DEFAULT_REPAIR_S, failure_seed=study.seed)


def curve_sizes(workload):
    """What the curve's requests draw their sizes from: a built-in table, the given lengths, a
    trace or a result file's lengths."""
    if workload.kind == "bench":   # its lengths under Poisson arrivals, never its gaps
        from simcore.workload import ResampledSizes
        return ResampledSizes(workload.sizes())
    return workload.sizes()


def curve_sessions(workload) -> dict:
    """simulate_curve's session arguments: with --prefix-model, the session model and the
    context that cuts its sessions (`WorkloadSource.with_context`); else none."""
    if workload.prefix_model is None:
        return {}
    from simcore.sessions import parse_prefix_model
    return {"sessions": parse_prefix_model(workload.prefix_model),
            "context": int(workload.context_tokens)}


def longest_request(sizes) -> int:
    """The most tokens (prompt + output) a request drawn from `sizes` can hold."""
    if isinstance(sizes, str):
        from simcore.workload import builtin_size_table
        table = builtin_size_table(sizes)
        return int(table.prompt_quantiles[-1] + table.output_quantiles[-1])
    if hasattr(sizes, "longest"):    # --isl/--osl
        return sizes.longest()
    return int((sizes.prompt_tokens + sizes.output_tokens).max())


def run_curve(study, cluster: Cluster, plan: Sequence[tuple[int, int]] | None) -> dict:
    """One whole-curve run of `cluster` (resized window by window by `plan`): per window, met
    or the SLOs missed; over the whole curve; and the failures drawn."""
    spans, _, curve = study.load_curve
    options = curve_options(study)
    if plan is not None:
        options = replace(options, pool_plan=tuple(
            (w.start_s, p, t) for w, (p, t) in zip(spans, plan)))
    edges = [w.start_s for w in spans] + [spans[-1].end_s]
    run = simulate_curve(cluster, curve_sizes(study.workload), curve.times, curve.rates,
                         curve.end_s, edges, study.seed, study.model,
                         study.perf.load(study.catalog),
                         study.reference, options, linear=curve.linear,
                         **curve_sessions(study.workload))
    return curve_record(run, study.slo, options)


def curve_record(run: CurveRun, profile, options: SimOptions) -> dict:
    """report.json's record of a whole-curve run."""
    if not run.feasible:
        return {"feasible": False, "reason": run.reason, "requests": run.requests,
                "windows_met": 0, "failing_windows": list(range(len(run.window_requests)))}
    reports = [evaluate_slos(run.window(k), profile) if n else None
               for k, n in enumerate(run.window_requests)]
    failing = [k for k, r in enumerate(reports) if r is not None and not r.passed]
    whole = evaluate_slos(run.latencies, profile)
    margins = [r.worst_margin for r in reports if r is not None and r.checks]
    failures = run.failure_stats or {}
    return {"feasible": True, "requests": run.requests,
            "windows_met": len(reports) - len(failing), "failing_windows": failing,
            "worst_window_margin": round(min(margins), 6) if margins else None,
            "window_margins": [None if r is None or not r.checks else round(r.worst_margin, 6)
                               for r in reports],
            "first_miss": (None if not failing else
                           {"window": failing[0], "reason": reports[failing[0]].reason}),
            "whole_curve": {"passed": whole.passed, "reason": whole.reason,
                            "worst_margin": round(whole.worst_margin, 6)},
            **_prefix_fields(run),
            "failures": {"mtbf_hours": options.mtbf_hours, "repair_s": options.repair_s,
                         "machine_failures": 0 if run.schedule is None else len(run.schedule),
                         "requests_affected": failures.get("requests_affected", 0)}}


def _prefix_fields(run: CurveRun) -> dict:
    """With prefix caching: the whole curve's hit rate and each window's (its requests'
    hit tokens / looked-up tokens; None: none looked up); nothing without the cache."""
    if run.window_prefix is None:
        return {}
    rates = [run.window_hit_rate(k) for k in range(len(run.window_requests))]
    whole = run.prefix_hit_rate
    return {"prefix_hit_rate": None if whole is None else round(whole, 4),
            "window_prefix_hit_rates": [None if r is None else round(r, 4) for r in rates]}


def step_up(options: list[list[tuple[int, int]]], plan: Sequence[tuple[int, int]],
            failing: Sequence[int], missed_before: set[int]) -> list[int]:
    """Remove from the failing windows' options every cluster no larger in both pools than
    the one the plan gave them (and from the window before, for a window that failed before:
    its backlog carries over). Returns the windows whose options changed."""
    changed = []
    for k in failing:
        for j in ([k - 1, k] if k in missed_before and k > 0 else [k]):
            chosen = plan[j]
            kept = [c for c in options[j] if not (c[0] <= chosen[0] and c[1] <= chosen[1])]
            if kept and kept != options[j]:
                options[j] = kept
                changed.append(j)
    return changed


def verified_plan(study, cluster_of: Callable[[Sequence[tuple[int, int]]], Cluster],
                  options: list[list[tuple[int, int]]], plan: list[tuple[int, int]],
                  replan: Callable[[list[list[tuple[int, int]]]], list[tuple[int, int]]]):
    """The plan checked over the whole curve, stepped up where windows fail (at most
    STEP_UP_ROUNDS runs). Returns (plan, its last run's record, windows stepped up)."""
    stepped: list[int] = []
    missed: set[int] = set()
    record = {}
    for _ in range(STEP_UP_ROUNDS):
        record = run_curve(study, cluster_of(plan), plan)
        failing = record["failing_windows"]
        if not failing or not record["feasible"]:
            break
        changed = step_up(options, plan, failing, missed)
        missed.update(failing)
        if not changed:
            break
        stepped.extend(k for k in changed if k not in stepped)
        plan = replan(options)
    return plan, record, sorted(stepped)
