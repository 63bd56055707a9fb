"""Everything `--load-curve` does, from the curve to the plan: the one module the rest of
the code calls for a load curve.

It owns reading the curve (`asked_curve`, `read_load_curve`) and cutting it into windows
(`planning_curve`, `windows`); for `provision search`, the searches at every other window rate
(`load_plan`, `other_rates`), the plan (`plan_pools`), what it saves (`curve_report`) and the
check of the static cluster and the plan over the whole curve (`check_whole_curve`, run by
`provisioner.curverun`, its simulation part); writing the plan (`plan_csv`, plan.csv) and
reading one back (`read_plan`); and `provision simulate --load-curve`'s streamed run
(`run_asked_curve`). `provisioner.question` resolves the options with it, `provisioner.api`
calls it and packs the results, `provisioner.reports` writes what it renders.

Sizing for a load curve (issue 29, first part): the static cluster for the busiest
planning window and a per-window autoscaling plan, with what the plan saves.

A curve is a CSV with columns time_s and rate_rps, read by name (`csvschema.LOAD_CURVE`;
time_s in seconds or ISO timestamps), piecewise constant:
each rate holds until the next row's time, the last one for the median step. It is cut into
planning windows (`--window`, default 1 h); a window is sized for the highest rate it holds
(a piecewise-constant curve reaches that rate inside the window). Rates are rounded up to a
grid of `RATE_STEP` relative steps, so windows of nearly equal load share one search.

Each distinct window rate is searched as any `--rate` is (screened, verified on every
verification sample). The plan picks, per window, one of the clusters verified at that
window's rate or above, the cheapest sequence (min-power: the least energy) under three rules
a fleet obeys:
- a floor: no pool below `--min-machines`;
- no flapping: a pool that shrank entering a window does not grow entering the next;
- a provisioning delay (`--scale-up-minutes`): a machine added for a window is paid from that
  long before the window starts (it boots and loads weights meanwhile, serving nothing).
Then both answers are checked over the whole curve, each in one run of every request of the
curve (`provisioner.curverun`): the plan's pools resized at each window's start, machines
failing at fleet rates; the plan is stepped up where a window misses an SLO.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable, Sequence

import numpy as np

from hardware_catalog import Design, InputError, check_path, option_ref
from hardware_catalog.csvschema import LOAD_CURVE, PLAN, read_table
from provisioner.curverun import (curve_sizes, longest_request,  # noqa: F401 (question's)
                                  run_curve, verified_plan)
from simcore import Cluster, evaluate_slos
from simcore.workload import MAX_TRACE_SECONDS

RATE_STEP = 0.02   # window rates are rounded up to powers of (1 + RATE_STEP): the rate tolerance
MAX_WINDOWS = 10_000
PLAN_FILE = "plan.csv"   # each design's pools per window, beside report.json


@dataclass(frozen=True)
class LoadCurve:
    """An arrival rate over time: piecewise constant (rates[i] from times[i] to times[i + 1],
    the last one for `tail_s`) or, `linear`, piecewise linear between the rows (the last rate
    held for `tail_s`)."""
    source: str
    times: tuple[float, ...]
    rates: tuple[float, ...]
    tail_s: float
    linear: bool = False

    @property
    def end_s(self) -> float:
        return self.times[-1] + self.tail_s

    def scaled(self, peak_rps: float | None) -> "LoadCurve":
        """The curve rescaled so its highest rate is `peak_rps` (None: as it is)."""
        if peak_rps is None:
            return self
        factor = peak_rps / max(self.rates)
        return replace(self, rates=tuple(r * factor for r in self.rates))

    def shaped(self, shape: str) -> "LoadCurve":
        """The curve read as `shape` ("step" or "linear") between its rows."""
        return replace(self, linear=shape == "linear")

    def knots(self) -> tuple[np.ndarray, np.ndarray]:
        """A linear curve's (times, rates), the last rate held to its end."""
        return (np.append(np.array(self.times), self.end_s),
                np.append(np.array(self.rates), self.rates[-1]))


@dataclass(frozen=True)
class Window:
    start_s: float
    end_s: float
    peak_rps: float     # the highest rate of the curve inside the window
    mean_rps: float     # its time-weighted mean (what the window's requests average)
    rate_rps: float     # what the window is sized for: the peak, rounded up to the grid


def read_load_curve(path: str) -> LoadCurve:
    """The curve in `path` (columns time_s and rate_rps, by name; `LOAD_CURVE`), checked: one
    line naming the file, row and field when not."""
    table = read_table(LOAD_CURVE, path)
    times, rates = table["time_s"].tolist(), table["rate_rps"].tolist()
    for row in range(1, len(times)):
        if times[row] <= times[row - 1]:
            raise table.error(row, "time_s", f"{times[row]:g} s is not after the row before "
                              f"({times[row - 1]:g} s); sort the curve by time, one row per "
                              "time")
    if max(rates) <= 0:
        raise InputError("every rate is 0: the curve asks for no requests", source=path)
    steps = np.diff(times)
    tail = float(np.median(steps)) if len(steps) else 3600.0
    start = times[0]
    if times[-1] - start + tail > MAX_TRACE_SECONDS:
        raise table.error(len(times) - 1, "time_s",
                          f"the curve spans {(times[-1] - start + tail) / 86400:,.0f} days, past "
                          f"the {MAX_TRACE_SECONDS / 86400:.0f}-day limit of arrival times; cut "
                          "it into parts")
    return LoadCurve(path, tuple(t - start for t in times), tuple(rates), tail)


def asked_curve(path: str, rate: float | None) -> LoadCurve:
    """The `--load-curve` file (search or simulate), refused beside a `--rate`."""
    if rate is not None:
        raise InputError(f"{option_ref('load_curve')} gives the rates: drop "
                         f"{option_ref('rate')}", field="rate")
    check_path(path, "load_curve")
    return read_load_curve(path)


def planning_curve(path: str, rate: float | None, peak_rate: float | None, shape: str,
                   window_s: float, scale_up_minutes: float, min_machines: int):
    """`provision search --load-curve`: (its planning windows, the plan's rules, the curve)."""
    curve = asked_curve(path, rate).scaled(peak_rate).shaped(shape)
    return (tuple(windows(curve, window_s)), PlanRules(scale_up_minutes * 60.0, min_machines),
            curve)


def expected_requests(curve: LoadCurve) -> float:
    """How many requests the curve asks for in all (its rate's integral over its length)."""
    times, rates = curve.knots()
    if curve.linear:
        return float(np.sum((rates[1:] + rates[:-1]) / 2 * np.diff(times)))
    return float(np.sum(rates[:-1] * np.diff(times)))


PLAN_COLUMNS = ("start_s", "prompt_machines", "token_machines")


def read_plan(path: str, design: Design) -> tuple[tuple[float, int, int], ...]:
    """A pool plan: rows start_s, prompt_machines, token_machines by name (`PLAN`: a search's
    plan.csv, whose rows of other designs are skipped by its `design` column, or a planner's
    own), each the pools serving from that time on, by start time. One line naming the file,
    row and field when it is not one."""
    table = read_table(PLAN, path)
    designs = table.values.get("design")
    rows: list[tuple[float, int, int]] = []
    for index in range(len(table)):
        if designs is not None and designs[index] and designs[index] != design.name:
            continue
        start = float(table["start_s"][index])
        pools = [int(table[name][index]) for name in PLAN_COLUMNS[1:]]
        # at least one machine a pool (a colocated design's token column: 0)
        for name, machines, least in zip(PLAN_COLUMNS[1:], pools, design.each_pool(1)):
            if machines < least:
                raise table.error(index, name, f"{machines} is not a whole number of machines "
                                  f">= {least}")
        if rows and start <= rows[-1][0]:
            raise table.error(index, "start_s", f"{start:g} s is not after the row before; "
                              "sort the plan by time, one row per start")
        rows.append((start, pools[0], pools[1]))
    if not rows:
        raise InputError(f"has no rows for design '{design.name}'", source=path)
    return tuple(rows)


def windows(curve: LoadCurve, window_s: float, option: str = "window") -> list[Window]:
    """The planning windows over the curve, each with its peak and mean rate (`option`: the
    option that gave `window_s`, named when it does not fit)."""
    requests = expected_requests(curve)
    if requests < 1:
        raise InputError(f"asks for {requests:.3g} requests over its "
                         f"{curve.end_s:g} s (peak {max(curve.rates):.3g} req/s): fewer than one; "
                         "give rates in requests per second", source=curve.source)
    if window_s > curve.end_s + 1e-9:
        raise InputError(f"{option_ref(option)} {window_s:g} s is longer than the load curve "
                         f"({curve.end_s:g} s); give a shorter window", field=option)
    count = math.ceil(curve.end_s / window_s - 1e-9)
    if count > MAX_WINDOWS:
        raise InputError(f"{option_ref(option)} {window_s:g} s cuts the curve into {count} "
                         f"windows (at most {MAX_WINDOWS}); give a longer window",
                         field=option)
    if curve.linear:
        return _linear_windows(curve, window_s, count)
    edges = np.append(np.array(curve.times), curve.end_s)
    rates = np.array(curve.rates)
    result = []
    for k in range(count):
        start, end = k * window_s, min((k + 1) * window_s, curve.end_s)
        overlap = np.clip(np.minimum(edges[1:], end) - np.maximum(edges[:-1], start), 0, None)
        inside = overlap > 0
        peak = float(rates[inside].max())
        mean = float((rates * overlap).sum() / (end - start))
        result.append(Window(start, end, peak, mean, grid_rate(peak)))
    return result


def _linear_windows(curve: LoadCurve, window_s: float, count: int) -> list[Window]:
    """Windows of a piecewise-linear curve: its peak is at a row or a window's edge, its mean
    the integral (trapezoids between those points) over the window's length."""
    times, rates = curve.knots()
    result = []
    for k in range(count):
        start, end = k * window_s, min((k + 1) * window_s, curve.end_s)
        points = np.concatenate([[start], times[(times > start) & (times < end)], [end]])
        values = np.interp(points, times, rates)
        peak = float(values.max())
        mean = float(np.sum((values[1:] + values[:-1]) / 2 * np.diff(points)) / (end - start))
        result.append(Window(start, end, peak, mean, grid_rate(peak)))
    return result


def grid_rate(rate: float) -> float:
    """`rate` rounded up to the next power of (1 + RATE_STEP), to 4 significant digits."""
    if rate <= 0:
        return 0.0
    step = math.log1p(RATE_STEP)
    return float(f"{math.exp(math.ceil(math.log(rate) / step - 1e-9) * step):.4g}")


# --------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class PlanRules:
    scale_up_s: float     # a machine added for a window is paid from this long before it
    floor: int            # machines per pool at least


def plan_pools(options: Sequence[Sequence[tuple[int, int]]], spans: Sequence[Window],
               unit: tuple[float, float], rules: PlanRules) -> list[tuple[int, int]]:
    """A cheap sequence of (prompt, token) pools, one per window: one of that window's
    `options` (clusters verified at its rate or above; each pool raised to the floor), or
    one with the previous window's machines kept, where a machine added for a window is paid
    `scale_up_s` earlier and no pool flaps (a pool that shrank entering a window may not grow
    entering the next). A dynamic programme over (pools, which pools just shrank): the
    cheapest of those sequences, so never dearer than the best plan of options alone."""
    def floored(c):
        return tuple(max(rules.floor, n) if n else 0 for n in c)

    layers = [sorted({floored(c) for c in window}) for window in options]
    best = {(c, (False, False)): (_running(c, spans[0], unit), None) for c in layers[0]}
    history = [best]
    for k in range(1, len(layers)):
        step = {}
        for (before, shrank), (cost, _) in best.items():
            # an option, or an option with the machines already running kept (more machines
            # never hurt): keeping them is how a pool avoids shrinking and growing back
            for after in {c for o in layers[k]
                          for c in (o, tuple(max(a, b) for a, b in zip(o, before)))}:
                if any(s and a > b for s, a, b in zip(shrank, after, before)):
                    continue   # no flapping: a pool that just shrank does not grow back
                total = (cost + _adding(before, after, unit, rules.scale_up_s)
                         + _running(after, spans[k], unit))
                state = (after, tuple(a < b for a, b in zip(after, before)))
                if state not in step or total < step[state][0] - 1e-12:
                    step[state] = (total, (before, shrank))
        best = step
        history.append(best)
    state = min(best, key=lambda s: (best[s][0], s))
    plan = []
    for layer in reversed(history):
        plan.append(state[0])
        state = layer[state][1]
    return plan[::-1]


def plan_cost(plan: Sequence[tuple[int, int]], spans: Sequence[Window], unit: tuple[float, float],
              scale_up_s: float) -> float:
    """Machine-units (machine-hours x `unit`, per pool) of a plan: each window's pools for its
    span, and every machine added at a window paid `scale_up_s` earlier (from the previous
    window's end)."""
    total = 0.0
    for i, (pools, window) in enumerate(zip(plan, spans)):
        total += _running(pools, window, unit)
        if i > 0:
            total += _adding(plan[i - 1], pools, unit, scale_up_s)
    return total


def _running(pools: tuple[int, ...], window: Window, unit: tuple[float, float]) -> float:
    """What the pools cost (`unit` per machine-hour) over the window."""
    return (window.end_s - window.start_s) / 3600.0 * sum(n * u for n, u in zip(pools, unit))


def _adding(before: tuple[int, ...], after: tuple[int, ...], unit: tuple[float, float],
            scale_up_s: float) -> float:
    """The machines added from `before` to `after`, paid `scale_up_s` before they serve."""
    return scale_up_s / 3600.0 * sum(max(0, a - b) * u for a, b, u in zip(after, before, unit))


def curve_report(study, optima: dict[float, dict[str, object]], verify=None) -> dict:
    """report.json `load_curve`: the windows, the rules and per design its static cluster, its
    plan and what the plan saves. `optima[rate][design name]` is the DesignResult of the
    search at that window rate (the busiest one is the static cluster). `verify(static,
    options, plan, replan)`, when given, checks the static cluster and the plan over the whole
    curve and returns (the plan, stepped up where needed, and the record of the checks)."""
    spans, rules, _ = study.load_curve
    peak = study.goal.rate_rps
    designs = {}
    for name in optima[peak]:
        designs[name] = _design_plan(name, spans, rules, optima, peak, study.goal.name, verify)
    return {"windows": [{"start_s": w.start_s, "end_s": w.end_s, "peak_rps": round(w.peak_rps, 6),
                         "mean_rps": round(w.mean_rps, 6), "rate_rps": w.rate_rps}
                        for w in spans],
            "rules": {"scale_up_s": rules.scale_up_s, "min_machines": rules.floor,
                      "no_flapping": "a pool that shrank entering a window does not grow "
                                     "entering the next"},
            "sized_for": "each window's highest rate, rounded up to a 2% grid; each window "
                         "verified at that rate in steady state, then the static cluster and "
                         "the plan each simulated over the whole curve in one run (pools "
                         "resized at window starts, machines failing at fleet rates)",
            "designs": designs}


def _design_plan(name: str, spans, rules: PlanRules, optima, peak: float,
                 goal_name: str, verify=None) -> dict:
    static = optima[peak][name]
    if not static.feasible:
        return {"feasible": False, "reason": f"no static cluster: {static.reason}"}
    design = static.design
    token = design.token or design.prompt
    units = {"machine_hours": (1.0, 1.0),
             "cost_usd": (design.prompt.cost_per_hour, token.cost_per_hour),
             "energy_kwh": (design.prompt.power_kw, token.power_kw)}
    options = []
    for k, window in enumerate(spans):
        if window.rate_rps == 0:
            options.append([design.each_pool(rules.floor)])
            continue
        # more load never needs fewer machines: a cluster verified at a higher window rate
        # serves this one too (the searches at different rates draw different samples and
        # may split the pools differently), so each is an option for this window
        verified = [optima[rate][name].optimum for rate in optima
                    if rate >= window.rate_rps and optima[rate][name].feasible]
        if not verified:
            return {"feasible": False, "reason": f"window {k} ({window.rate_rps:g} req/s): "
                                                 f"{optima[window.rate_rps][name].reason}"}
        options.append([(o.prompt_machines, o.token_machines) for o in verified])
    goal_unit = units["energy_kwh" if goal_name == "min-power" else "cost_usd"]
    plan = plan_pools(options, spans, goal_unit, rules)
    checked = None
    if verify is not None:   # (steps the options up where the plan missed: the bound too)
        plan, checked = verify(static, options, plan,
                               lambda changed: plan_pools(changed, spans, goal_unit, rules))
    instant = plan_pools(options, spans, goal_unit, PlanRules(0.0, rules.floor))  # lower bound
    flat = [(static.optimum.prompt_machines, static.optimum.token_machines)] * len(spans)
    figures = {}
    for label, unit in units.items():
        figures[label] = {"static": round(plan_cost(flat, spans, unit, 0.0), 6),
                          "plan": round(plan_cost(plan, spans, unit, rules.scale_up_s), 6),
                          "plan_without_delay": round(plan_cost(instant, spans, unit, 0.0),
                                                      6)}
    saved = figures["cost_usd"]
    return {"feasible": True, "static": list(flat[0]), "plan": [list(p) for p in plan],
            "pools_without_delay": [list(p) for p in instant],
            **figures,
            "saves": round(1.0 - saved["plan"] / saved["static"], 6) if saved["static"] else 0.0,
            **({} if checked is None else {"whole_curve": checked})}


# ------------------------------------------------------------- provision search --load-curve
def other_rates(study) -> list[float]:
    """The window rates searched after the busiest (the study's own) rate."""
    rates = {w.rate_rps for w in study.load_curve[0]} - {0.0, study.goal.rate_rps}
    return sorted(rates, reverse=True)


def load_plan(study, search: Callable, results) -> tuple[dict, list]:
    """Every other window rate searched as the busiest one was (`search(study)`: a search's
    SearchResult, the same designs, verification and rules), then each design's plan and
    what it saves, checked over the whole curve: (report.json's `load_curve`, the searches'
    counts)."""
    optima = {study.goal.rate_rps: {r.design.name: r for r in results}}
    runs = []
    for rate in other_rates(study):
        found = search(study.auxiliary(goal=replace(study.goal, rate_rps=rate)))
        optima[rate] = {r.design.name: r for r in found.designs}
        runs.append(found.stats)
    return curve_report(study, optima, partial(check_whole_curve, study)), runs


def check_whole_curve(study, static, options, plan, replan):
    """The static cluster and the plan, each run over the whole curve
    (`provisioner.curverun`); the plan stepped up where a window misses."""
    design, o = static.design, static.optimum
    record = {"static": run_curve(study, Cluster(design, o.prompt_machines, o.token_machines),
                                  None),
              # a Splitwise design's static cluster with its mixed pool: the paper's answer
              # to bursts, beside the plan's
              "static_mixed_pool": design.lends_work}

    def cluster_of(pools):
        return Cluster(design, max(p for p, _ in pools), max(t for _, t in pools))
    plan, record["plan"], stepped = verified_plan(study, cluster_of, options, plan, replan)
    record["stepped_up_windows"] = stepped
    return plan, record


def plan_csv(document: dict) -> str:
    """plan.csv: one row per window and design: its rates, the plan's pools and the
    window's worst SLO margin in the plan's whole-curve run (below 0: missed; empty: no run
    or no request in the window); with prefix caching, the window's hit rate in that run."""
    curve = document["load_curve"]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    plans = {name: (entry.get("whole_curve") or {}).get("plan") or {}
             for name, entry in curve["designs"].items() if entry["feasible"]}
    # prefix caching: each window's hit rate in the plan's run (a column only then)
    cached = any("window_prefix_hit_rates" in run for run in plans.values())
    writer.writerow(("window", "start_s", "end_s", "peak_rps", "mean_rps", "sized_rps", "design",
                     "prompt_machines", "token_machines", "static_prompt", "static_token",
                     "whole_curve_margin") + (("whole_curve_prefix_hit_rate",) if cached else ()))
    for name, run in plans.items():
        entry = curve["designs"][name]
        margins = run.get("window_margins") or [None] * len(entry["plan"])
        rates = run.get("window_prefix_hit_rates") or [None] * len(entry["plan"])
        for k, (window, pools) in enumerate(zip(curve["windows"], entry["plan"])):
            writer.writerow((k, window["start_s"], window["end_s"], window["peak_rps"],
                             window["mean_rps"], window["rate_rps"], name, *pools,
                             *entry["static"], "" if margins[k] is None else margins[k])
                            + (("" if rates[k] is None else rates[k],) if cached else ()))
    return buffer.getvalue()


# ----------------------------------------------------------- provision simulate --load-curve
def run_asked_curve(q):
    """The simulate question's cluster (resized by its plan, if any) over its curve: the
    workload's sizes under arrivals following the curve (`simcore.longrun.curve_chunks`), all
    of it in one streamed run. Returns (the run, the SLOs over the whole curve, each
    --curve-window with its SLOs or None when no request arrived in it, the notes)."""
    from provisioner.curverun import curve_sessions
    from simcore.longrun import simulate_curve
    curve, spans = q.curve, q.windows
    edges = [w.start_s for w in spans] + [spans[-1].end_s]
    run = simulate_curve(q.cluster, q.sizes, curve.times, curve.rates, curve.end_s, edges,
                         q.seed, q.model, q.perf_model, q.reference, q.sim_options,
                         linear=curve.linear, **curve_sessions(q.workload))
    reports = ([(w, evaluate_slos(run.window(k), q.slo) if n else None)
                for k, (w, n) in enumerate(zip(spans, run.window_requests))]
               if run.feasible else [(w, None) for w in spans])
    whole = evaluate_slos(run.latencies if run.feasible else run, q.slo)
    from provisioner.study import SYNTHESIZED
    process = ("poisson arrivals" if q.workload.kind in SYNTHESIZED
               else "arrivals with the trace's gaps")
    if q.workload.prefix_model is not None:
        process = (f"sessions {q.workload.prefix_model} starting at the curve's rate / their "
                   "mean turns (Poisson), cold at its start,")
    notes = (f"{process} following the load curve {q.load_curve} ({len(curve.rates)} "
             f"steps over {curve.end_s:g} s): {run.requests:,} requests (seed {q.seed}), all "
             "in one streamed run",)
    return run, whole, reports, notes
