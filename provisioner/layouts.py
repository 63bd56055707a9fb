"""Layouts in the search: which layouts each design tries, their capacity bounds, the records.

A design searched without pinned layouts becomes one variant per combination of its pools'
layouts (`simcore.layout.candidate_layouts`: every TP dividing the machine, at the fewest
machines per instance that hold the model). The search runs a design's variants one after the
other, in order of a capacity bound (`capacity_bound`), and skips a variant whose bound cannot
beat the best variant found so far (`provisioner.frontier.layout_search`).

The capacity bound ignores queueing and the SLOs: every prompt token must be prefilled and
every later token decoded, at no better than an instance's best throughput (prefill: its best
tokens per second over the iteration sizes; decode: its best batch within the KV memory the
workload's mean request leaves it). With Splitwise's mixed pool either pool may do either
phase, so each phase is priced on the pool that does it cheaper. A layout whose bound costs
more than a verified optimum of another layout cannot win.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

import numpy as np

from hardware_catalog import Design, InputError, Layout, MachineSku, Pool
from hardware_catalog.errors import option_ref
from provisioner.study import DesignResult, Goal, Study
from simcore import layout as layouts

MAX_DECODE_BATCH = 4096   # the decode curves' last knot
LAYOUT_PINS = ("tp", "tp_prompt", "tp_token", "pp", "ep", "ep_prompt", "ep_token")


@dataclass(frozen=True)
class Variant:
    """One design with its pools' layouts set, the capacity bound of its objective, and the
    pool sizes below which a pool cannot carry its own phase (where the search starts)."""
    design: Design
    bound: float   # min-cost / min-power: lower bound on $/h or kW; max-rate: upper bound, req/s
    floors: tuple[int, int] = (1, 1)   # (prompt or pool, token) machines; (P, 0) for a baseline


@dataclass
class LayoutChoices:
    """A design's variants (in search order) and the layouts skipped, with why."""
    variants: list[Variant]
    skipped: list[dict] = field(default_factory=list)   # {pool, layout, reason}: cannot run
    too_slow: list[dict] = field(default_factory=list)  # {layout, status, reason}: SLOs missed alone


@dataclass(frozen=True, eq=False)
class WorkloadShape:
    """What the bounds and the memory check need from the workload's base sample."""
    rate_rps: float
    mean_prompt: float
    mean_output: float
    longest: int
    prompt: np.ndarray     # the sample's sizes (the latency bound)
    output: np.ndarray

    @classmethod
    def of(cls, study: Study) -> "WorkloadShape":
        from provisioner.samples import study_sample
        rate = study.goal.rate_rps
        if rate is None and study.goal.name == "max-rate":
            rate = study.settings.start_rate   # sizes only: the bound is per unit of rate
        sample = study_sample(study, rate, study.seed)
        need = sample.prompt_tokens + sample.output_tokens
        if study.goal.closed is not None:   # no rate: the one its throughput is proven above
            sized = study.goal.sizing_rate_rps
        else:
            span = study.duration_s if rate is not None else max(
                float(np.max(sample.arrival_s)), 1e-9)
            sized = len(sample) / span
        return cls(sized, float(np.mean(sample.prompt_tokens)),
                   float(np.mean(sample.output_tokens)), int(np.max(need)),
                   sample.prompt_tokens, sample.output_tokens)


def pinned(options, pool: Pool) -> tuple[int | None, int | None]:
    """(tp, pp) the layout options pin for a pool (a colocated pool takes --tp only, a
    Splitwise pool its own --tp-prompt / --tp-token before --tp)."""
    if options is None:
        return None, None
    tp = options.tp if pool.is_mixed else (
        (options.tp_prompt if pool.role == "prompt" else options.tp_token) or options.tp)
    return tp, options.pp


def pinned_ep(options, pool: Pool) -> int | None:
    """The expert parallelism the options pin for a pool (--ep-prompt / --ep-token before
    --ep, as for TP)."""
    if options is None:
        return None
    if pool.is_mixed:
        return options.ep
    return (options.ep_prompt if pool.role == "prompt" else options.ep_token) or options.ep


def pool_choices(study: Study, design: Design, shape: WorkloadShape, perf):
    """Per pool (prompt, then token for Splitwise): (layouts, skipped entries)."""
    reserve = study.sim_options.memory_reserve_fraction
    per_pool = []
    for pool in design.pools:
        if pool.layout is not None:   # a design record that names its layout keeps it
            per_pool.append(([pool.layout], []))
            continue
        tp, pp = pinned(study.layout, pool)
        chosen, skipped = layouts.candidate_layouts(study.model, pool.sku, perf, reserve,
                                                    shape.longest, tp, pp,
                                                    pinned_ep(study.layout, pool))
        per_pool.append((chosen, [{"pool": pool.label, "layout": layout.label,
                                   "reason": reason} for layout, reason in skipped]))
    return per_pool


def choices(study: Study, design: Design, shape: WorkloadShape, perf) -> LayoutChoices:
    per_pool = pool_choices(study, design, shape, perf)
    skipped = [entry for _, entries in per_pool for entry in entries]
    combos = list(itertools.product(*(chosen for chosen, _ in per_pool)))   # one per pool
    variants, slow, slack = [], [], {}
    for v in (design.with_layouts(*combo) for combo in combos):
        problem, slack[v] = latency_floor_problem(study, v, shape, perf)
        if problem:
            slow.append({"layout": " / ".join(layout.label for layout in v.layouts),
                         "status": "too slow", "reason": problem})
        else:
            variants.append(Variant(v, *capacity(study, v, shape, perf)))
    # best bound first; among equal bounds, the layout with the most latency slack (most
    # likely to need the fewest machines), so that pruning bites early
    sign = -1.0 if study.goal.name == "max-rate" else 1.0
    variants.sort(key=lambda v: (sign * round(v.bound, 9), -slack[v.design]))
    return LayoutChoices(variants, skipped, slow)


def layout_choices(study: Study, designs) -> dict[str, LayoutChoices]:
    """Every design's plan (by design name)."""
    shape, perf = WorkloadShape.of(study), study.perf.load(study.catalog)
    return {d.name: choices(study, d, shape, perf) for d in designs}


def check_fits(study: Study, designs) -> None:
    """Before any simulation: InputError when a pinned layout fits no design, or the model
    fits no design's machines at any layout (memory and pricing only: the latencies and
    bounds are the search's, `layout_choices`)."""
    shape, perf = WorkloadShape.of(study), study.perf.load(study.catalog)
    skipped = []
    for design in designs:
        per_pool = pool_choices(study, design, shape, perf)
        if all(chosen for chosen, _ in per_pool):
            return
        skipped += [entry for _, entries in per_pool for entry in entries]
    if not designs:
        return
    first = next(iter(skipped[::-1]), None)   # the largest TP tried first
    pins = study.layout is not None and any(
        getattr(study.layout, name) is not None for name in LAYOUT_PINS)
    what = ("the pinned layout fits none of the designs" if pins
            else f"{study.model.name} fits no design's machines at any layout")
    detail = f"{first['layout']} {first['reason']}" if first else "no layout"
    if shape.longest > 1 and any(   # the model fits, the longest request does not
            all(chosen for chosen, _ in pool_choices(study, design, replace(shape, longest=1),
                                                     perf)) for design in designs):
        blame = request_too_long(study.workload, f"{study.model.name} has room for on any "
                                                 f"design's machines at any layout ({detail})")
        if blame is not None:
            raise blame
    raise InputError(f"{what}: {detail}", field=_first_pin(study) if pins else "model")


def request_too_long(workload, why: str) -> InputError | None:
    """The error for a trace whose longest request (prompt + output tokens: its KV cache) is
    what no layout holds, naming the trace file, the request's row and its prompt column
    (None for a built-in workload: its sizes are no file's)."""
    kind = getattr(workload, "kind", None)
    if getattr(workload, "prefix_model", None) is not None:   # sessions: prompts grow
        return InputError(f"{option_ref('prefix_model')} {workload.prefix_model}: its "
                          f"sessions' turns, which grow up to the model's context "
                          f"({workload.context_tokens:,} tokens), need more KV cache than "
                          f"{why}; ask for shorter sessions (fewer turns, shorter system "
                          "prompts or sizes)")
    if kind == "lengths":   # --isl/--osl: name them
        return InputError(f"{option_ref('isl')} {workload.isl} {option_ref('osl')} "
                          f"{workload.osl}: requests of up to {workload.sizes().longest():,} "
                          f"tokens, more KV cache than {why}; ask for shorter lengths")
    if kind in ("bench", "mooncake"):
        sizes = workload.sizes()
        index = int(np.argmax(sizes.prompt_tokens + sizes.output_tokens))
        return InputError(f"a request of {int(sizes.prompt_tokens[index]):,} prompt + "
                          f"{int(sizes.output_tokens[index]):,} output tokens, more KV cache "
                          f"than {why}", source=workload.path)
    if workload is None or kind != "trace":
        return None
    from hardware_catalog.csvschema import TRACE, read_table
    table = read_table(TRACE, workload.path)
    _, prompt, output = table.schema.names
    index = int(np.argmax(table[prompt] + table[output]))
    return table.error(index, prompt, f"a request of {int(table[prompt][index]):,} prompt + "
                                      f"{int(table[output][index]):,} output tokens, more KV "
                                      f"cache than {why}; shorten or drop it")


def _first_pin(study: Study) -> str:
    return next(name for name in LAYOUT_PINS if getattr(study.layout, name) is not None)


def check_pins(options, catalog, designs) -> None:
    """Before any simulation: a pinned TP must divide the GPUs of some pool it applies to; a
    pinned EP runs without a pipeline, on ranks whose TP divides it."""
    _check_expert_pins(options)
    for name in ("tp", "tp_prompt", "tp_token"):
        tp = getattr(options, name)
        if tp is None:
            continue
        machines = [m for d in designs for m in _pools_of(d, name)]
        if machines and not any(m.gpus % tp == 0 for m in machines):
            gpus = sorted({m.gpus for m in machines})
            raise InputError(f"{option_ref(name)} {tp} does not divide the GPUs of any machine "
                             f"it applies to ({', '.join(map(str, gpus))} GPUs); use a divisor",
                             field=name)


def _check_expert_pins(options) -> None:
    """A pinned EP runs without a pipeline, on attention ranks whose TP divides it (whether
    the model has experts to spread is the layout's fit, `simcore.layout.fit_problem`)."""
    for name in ("ep", "ep_prompt", "ep_token"):
        ep = getattr(options, name, None)
        if ep is None or ep == 1:
            continue
        if options.pp is not None and options.pp > 1:
            raise InputError(f"{option_ref(name)} cannot be used with {option_ref('pp')}: an "
                             "expert-parallel group runs without a pipeline", field=name)
        tp = (getattr(options, name.replace("ep", "tp"), None) or options.tp or 1)
        if ep % tp:
            raise InputError(f"{option_ref(name)} {ep} is not a whole number of TP {tp} "
                             "attention ranks; give an EP that TP divides", field=name)


def _pools_of(design: Design, name: str) -> list[MachineSku]:
    if name == "tp":
        return list(design.machines())
    return [pool.sku for pool in design.pools if f"tp_{pool.role}" == name]


def no_layout_result(design: Design, goal: Goal, chosen: LayoutChoices) -> DesignResult:
    """The result of a design none of whose layouts can run the model (nothing simulated)."""
    reasons = "; ".join(f"{e['pool']} {e['layout']}: {e['reason']}"
                        for e in chosen.skipped[:3])
    slow = "; ".join(f"{e['layout']}: {e['reason']}" for e in chosen.too_slow[:2])
    why = (f"every layout is too slow for the SLOs ({slow})" if chosen.too_slow
           else f"no layout can run {design.name}'s pools ({reasons})")
    return DesignResult(design, goal, None, why, [], layouts=list(chosen.too_slow),
                        layouts_skipped=chosen.skipped)


# ----------------------------------------------------------------------------- the bounds
def latency_floor_problem(study: Study, design: Design, shape: WorkloadShape,
                          perf) -> tuple[str, float]:
    """(why the design misses an SLO at any size, or "" when it may not; the worst margin of
    these lower bounds, the layout's latency slack): every request of the
    base sample run alone, on whichever pool is faster for each phase (no queue, batch of
    one, no transfer), already misses a limit. Contention only adds, so more machines cannot
    help; percentiles of these per-request lower bounds bound the run's percentiles."""
    from simcore.metrics import uncontended_latencies
    per_token = study.sim_options.tbt_per_output_token
    reserve = study.sim_options.memory_reserve_fraction
    alone = [uncontended_latencies(shape.prompt, shape.output,
                                   layouts.curves(perf, study.model, pool.sku, pool.layout),
                                   per_token)
             for pool in design.pools]
    ttft = np.minimum.reduce([a[0] for a in alone])
    tbt = np.fmin.reduce([a[1] for a in alone])
    e2e = ttft + np.minimum.reduce([a[2] - a[0] for a in alone])
    values = {"ttft": ttft, "tbt": tbt, "e2e": e2e}
    if any(study.slo.slowdown(metric) for metric in values):
        reference = layouts.curves(perf, study.model, study.reference, layouts.default_layout(
            study.model, study.reference, reserve))
        ref = uncontended_latencies(shape.prompt, shape.output, reference, per_token)
        with np.errstate(invalid="ignore", divide="ignore"):
            values = {k: v / r if study.slo.slowdown(k) else v
                      for (k, v), r in zip(values.items(), ref)}
    from simcore.metrics import percentiles   # (numpy's own imports numpy.ma: 12 ms)
    from slo_profiles import PERCENTILES
    missed, slack = [], 1.0
    for (metric, pct), limit in study.slo.limits.items():
        if metric not in values:
            continue
        kept = values[metric][~np.isnan(values[metric])]
        if not len(kept):
            continue
        unit = study.slo.unit(metric)
        scale = 1.0 if unit == "x" else 1000.0
        value = float(percentiles(kept, [PERCENTILES[pct]])[0]) * scale
        slack = min(slack, 1.0 - value / limit)
        if value > limit:
            missed.append(f"{metric.upper()} {pct.upper()} {value:.3g} > {limit:g}{unit}")
    if not missed:
        return "", slack
    return "requests alone already miss " + "; ".join(missed[:3]), slack


# ------------------------------------------------------------------------------- capacity
def _prefill_rate(curves) -> float:
    """An instance's best prompt tokens per second over its iteration sizes."""
    tokens = curves.prompt_tokens
    return float(np.max(tokens / curves.prompt_time(tokens)))


def _decode_rate(curves, capacity: int, shape: WorkloadShape) -> float:
    """An instance's best decode tokens per second with its batch held by KV memory: each
    request reserves its prompt and output, and holds half its output on average."""
    batch = max(1, min(MAX_DECODE_BATCH,
                       int(capacity // max(1.0, shape.mean_prompt + shape.mean_output))))
    sizes = np.arange(1, batch + 1, dtype=np.float64)
    context = sizes * (shape.mean_prompt + shape.mean_output / 2.0)
    return float(np.max(sizes / curves.token_time(sizes, context)))


def machine_rates(study: Study, machine: MachineSku, layout: Layout, shape: WorkloadShape,
                  perf) -> tuple[float, float]:
    """(prefill tokens/s, decode tokens/s) of one machine at the layout (at best)."""
    curves = layouts.curves(perf, study.model, machine, layout)
    capacity = layouts.kv_capacity(study.model, machine, layout,
                                   study.sim_options.memory_reserve_fraction)
    per_machine = layout.instances_per_span(machine) / layout.span(machine)
    return (_prefill_rate(curves) * per_machine,
            _decode_rate(curves, capacity, shape) * per_machine)


def capacity(study: Study, design: Design, shape: WorkloadShape,
             perf) -> tuple[float, tuple[int, int]]:
    """(bound, floors). The bound: min-cost / min-power, a lower bound on the objective at the
    goal's rate; max-rate, an upper bound on the rate within the budget (module docstring).
    The floors: machines each pool needs to carry its own phase at the goal's rate at the
    best throughput an instance has (prompt pool: prefill; token pool: decode; a colocated
    pool: both), where the growth starts; not a bound on the answer when the mixed pool
    lends machines across pools (the frontier below the growth's corner is searched from 1
    anyway). max-rate has no rate to size for: floors (1, 1)."""
    goal, unit = study.goal, _unit(study.goal)
    pooled = [(pool.sku, pool.layout) for pool in design.pools]
    rates = [machine_rates(study, m, layout, shape, perf) for m, layout in pooled]
    prompt_load = shape.mean_prompt          # per request per second of rate
    decode_load = max(shape.mean_output - 1.0, 0.0)
    floor = sum(unit(m) * layout.span(m) for m, layout in pooled)   # one group per pool
    if design.is_baseline:
        per_rate = unit(design.prompt) * (prompt_load / rates[0][0] + decode_load / rates[0][1])
        floors = (int(shape.rate_rps * prompt_load / rates[0][0]
                      + shape.rate_rps * decode_load / rates[0][1]), 0)
    else:
        mixed = design.mixed_pool
        prefill = [unit(m) / r[0] for (m, _), r in zip(pooled, rates)]
        decode = [unit(m) / r[1] for (m, _), r in zip(pooled, rates)]
        per_rate = (prompt_load * (min(prefill) if mixed else prefill[0])
                    + decode_load * (min(decode) if mixed else decode[1]))
        floors = (int(shape.rate_rps * prompt_load / rates[0][0]),
                  int(shape.rate_rps * decode_load / rates[1][1]))
    if goal.name == "max-rate":
        bound = goal.budget.value / per_rate if goal.budget.value >= floor else 0.0
        return bound, (1, 0 if design.is_baseline else 1)
    floors = tuple(max(layout.span(m), f) for (m, layout), f in zip(pooled, floors)) + (
        (0,) if design.is_baseline else ())
    return max(floor, per_rate * shape.rate_rps), floors


def _unit(goal: Goal):
    if goal.name == "min-power" or (goal.name == "max-rate" and goal.budget.kind == "power"):
        return lambda machine: machine.power_kw
    return lambda machine: machine.cost_per_hour


# ------------------------------------------------------------------------------ the records
def layout_record(design: Design, model, reserve: float) -> dict:
    """Each pool's layout as reports give it: tp, pp, instances per machine, KV per instance."""
    from simcore.cluster import pool_layouts
    chosen = pool_layouts(design, model, reserve)
    return {pool.label: _pool_layout_record(model, pool.sku, layout, reserve)
            for pool, layout in zip(design.pools, chosen)}


def _pool_layout_record(model, machine: MachineSku, layout: Layout, reserve: float) -> dict:
    record = {"tp": layout.tp, "pp": layout.pp,
              "instances_per_machine": layout.instances_per_machine(machine),
              "kv_tokens_per_instance": layouts.kv_capacity(model, machine, layout, reserve)}
    if layout.ep > 1:   # dense layouts' records stay as they were
        record.update(ep=layout.ep, dp=layout.dp, label=layout.label,
                      machines_per_group=layout.span(machine),
                      instances_per_machine=layout.instances_per_span(machine)
                      // layout.span(machine))
    return record


def pinned_design(design: Design, options, model, reserve_fraction: float, longest: int,
                  machines: tuple[int, int], workload=None) -> Design:
    """`provision simulate`: the design with the layouts its options pin (unpinned pools: the
    whole machine), checked: TP divides the GPUs, the layout holds the model and the longest
    request, the pipeline fits the pool (InputError naming the option otherwise; a request
    of the trace `workload` that the layout holds the model but not: naming its row)."""
    _check_expert_pins(options)
    chosen = []
    for pool, size in zip(design.pools, machines):
        machine = pool.sku
        tp, pp = pinned(options, pool)
        ep = pinned_ep(options, pool)
        expert = ep is not None and ep > 1
        name = "tp" if pool.is_mixed or tp == options.tp else f"tp_{pool.role}"
        if expert:
            rank = tp or 1
            layout = Layout(rank, ep=ep, dp=ep // rank)
            name = "ep" if pool.is_mixed or ep == options.ep else f"ep_{pool.role}"
        elif pp is not None:
            layout = Layout(tp or machine.instance_tp, pp)
        else:   # the fewest machines that hold it at this TP (the whole machine's by default)
            layout = (layouts.fewest_machines(model, machine, tp or machine.instance_tp,
                                              reserve_fraction, longest)
                      or Layout(tp or machine.instance_tp, 1))
        problem = layouts.fit_problem(model, machine, layout, reserve_fraction, longest)
        if problem:
            pinned_by = name if tp is not None or expert else None   # the option to blame
            field_name = pinned_by or ("pp" if pp else "model")
            if longest > 1 and not layouts.fit_problem(
                    model, machine, layout, reserve_fraction, 1):
                blame = request_too_long(workload, f"{model.name} has room for on "
                                                   f"{machine.name} ({layout.label}: {problem})")
                if blame is not None:
                    raise blame
            hint = (f"; pin a smaller layout with {option_ref(name)}"
                    if pinned_by is None and model.heads % layout.tp else "")
            raise InputError(f"{layout.label} on {machine.name}: {problem}{hint}",
                             field=field_name)
        span = layout.span(machine)
        if span > size:
            count, where = pool.size_option, pool.phrase
            if pp:
                raise InputError(f"an instance spans {span} machines, {where} has {size}",
                                 field="pp")
            raise InputError(f"{model.name} at {layout.label} spans {span} {machine.name} "
                             f"machines per {'group' if layout.ep > 1 else 'instance'}, "
                             f"{where} has {size}: give {option_ref(count)} {span} or more",
                             field=count)
        chosen.append(layout)
    return design.with_layouts(*chosen)

