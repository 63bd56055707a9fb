"""The question a search answers: built from options once, serialized once.

- `asked(...)` merges the declared defaults, a spec file and the caller's options into one
  checked `SearchOptions` tree, and spells the options errors name as the caller wrote them.
- `resolve_study(options)` looks every name up once and returns the `Study` record; everything
  downstream takes records.
- `to_echo(study)` is report.json's `inputs`: `options` is the question as asked (every option
  the declarations echo), the other keys are what the names resolved to (records, content
  hashes), for people and for `check`'s notes.
- `from_echo(inputs, ...)` is its inverse: the echoed options go through the same checks and
  the same `resolve_study` as the command line's, so a report is re-derived exactly as a search
  with those options would run.
- `identity(study)` keys the evaluation cache: the `Study` fields declared `outcome` (for the
  search settings, the options declared `outcome=True`), each as its record's identity; the
  evaluator adds a fingerprint of the simulator's code. Nothing is listed by hand.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from hardware_catalog import (Catalog, Design, InputError, Layout, MachineSku, ModelSpec,
                              check_path, load_catalog, parse_design)
from hardware_catalog.errors import cli_flag, naming, option_ref
from provisioner.chunked import with_chunk_tokens
from provisioner.closedloop import with_safe_rate
from provisioner.layouts import check_fits, check_pins, pinned_design
from provisioner.options import (CLOSED_REQUESTS_PER_USER, DEFAULT_CLOSED_REQUESTS,
                                 DEFAULT_RATE, LEGACY_ENGINE, MAX_DURATION, WINDOW_FLOOR_S,
                                 ms_limits,
                                 WINDOW_LIFETIMES, WINDOW_QUANTILE, ClusterOptions,
                                 FailureOptions, QuestionOptions, SearchOptions, SimulateOptions,
                                 StudyOptions,
                                 build, check_value, flag_of, leaves, option_fields, read_spec)
from provisioner.presets import preset_catalog, preset_perf, preset_sim_options
from provisioner.study import (BOUND_SAMPLE_RATE, BOUND_SAMPLE_S, ENGINE_NAMES, Budget,
                               ClosedLoad, Goal, PerfSource, Study,
                               Window, WorkloadSource, kv_dtype_of, lengths_source,
                               model_in_dtype, perf_source, workload_source)
from simcore import Cluster, SimOptions, Workload
from simcore import layout as layouts
from simcore.cluster import kv_capacity_tokens
from simcore.engine_overheads import NO_OVERHEADS, EngineOverheads, fitted_overheads
from simcore.metrics import uncontended_latencies
from simcore.simulate import reference_curves
from simcore.workload import MAX_REQUESTS, builtin_size_table, check_request_count
from slo_profiles import SloProfile, load_slo_profile, with_ms_limits

SLO_REFERENCE_SKU = "dgx-a100"  # the Splitwise SLOs are slowdowns against an uncontended DGX-A100


# --------------------------------------------------------------------- options, as asked
def spelling(tree: type, style: Callable[[str], str], spec_keys=()) -> Callable[[str], str]:
    """How errors spell an option: as its spec key when it came from the spec file (and was
    not given directly), else in the entry point's `style`."""
    known = option_fields(tree)

    def spell(name: str) -> str:
        if name in spec_keys:
            return name
        return style(name) if name in known else cli_flag(name)
    return spell


def cli_style(tree: type) -> Callable[[str], str]:
    known = option_fields(tree)
    return lambda name: flag_of(known[name])


def python_style(name: str) -> str:
    return f"{name}="


@contextmanager
def asked(tree: type, given: dict[str, Any], spec_path: str | Path | None,
          style: Callable[[str], str]) -> Iterator[Any]:
    """Declared defaults < spec file < given options (already checked), as a typed tree; inside
    the block, errors name each option the way the caller wrote it."""
    options, spec_keys = _merged(tree, given, spec_path)
    with naming(spelling(tree, style, spec_keys)):
        refuse_lengths_beside_workload(set(given) | spec_keys)
        yield options


def refuse_lengths_beside_workload(names: set[str]) -> None:
    """--isl/--osl make the workload: with --workload too, which one is meant is unclear."""
    lengths = [name for name in ("isl", "osl") if name in names]
    if lengths and "workload" in names:
        raise InputError(f"give {option_ref('workload')} or {option_ref(lengths[0])}/"
                         f"{option_ref('osl' if lengths[0] == 'isl' else 'isl')}, not both: "
                         "the lengths make a workload of their own")


def asked_workload(s: StudyOptions) -> WorkloadSource:
    """--isl and --osl (both, or neither), else --workload; with --prefix-model, sessions over
    its sizes (cut at the model's context: `WorkloadSource.with_context`)."""
    source = asked_sizes(s)
    if s.prefix_model is None:
        return source
    if source.kind == "mooncake":
        raise InputError(f"{option_ref('prefix_model')} draws sessions over a workload's sizes: "
                         f"a Mooncake trace carries its own prompt blocks; drop one of them")
    return replace(source, prefix_model=s.prefix_model)


def asked_sizes(s: StudyOptions) -> WorkloadSource:
    if s.isl is None and s.osl is None:
        return workload_source(s.workload)
    if s.isl is None or s.osl is None:
        given, missing = ("isl", "osl") if s.osl is None else ("osl", "isl")
        raise InputError(f"{option_ref(given)} needs {option_ref(missing)} too: a workload of "
                         "given lengths has both (a number or a distribution each)")
    return lengths_source(s.isl, s.osl)


def refuse_trace_blocks_on_a_curve(workload: WorkloadSource, prefix_cache: str) -> None:
    """A load curve draws a Mooncake trace's sizes, not its prompt blocks: its cache would
    find nothing (sessions, --prefix-model, carry blocks over a curve)."""
    if workload.kind == "mooncake" and prefix_cache != "off":
        raise InputError(f"{option_ref('prefix_cache')} cannot be used with a Mooncake trace "
                         f"and {option_ref('load_curve')}: a curve draws the trace's sizes, "
                         f"not its prompt blocks; use {option_ref('prefix_model')} over other "
                         "sizes, or a --rate")


def merge_options(tree: type, given: dict[str, Any], spec_path: str | Path | None = None):
    """`asked` without the naming block: the merged, typed options."""
    return _merged(tree, given, spec_path)[0]


def _merged(tree: type, given: dict[str, Any], spec_path: str | Path | None):
    """(the options tree, the names that came from the spec file and were not given)."""
    spec = read_spec(spec_path, tree) if spec_path is not None else {}
    return build(tree, {**spec, **given}), {name for name in spec if name not in given}


# --------------------------------------------------------------------- options -> records
def input_files(options: Any, spec: str | Path | None = None) -> dict[str, Path]:
    """Every file the run reads, labelled as the user gave it (for `check_not_an_input`):
    spec, trace, SLO profile, performance model, failure schedule, catalog files. Built-in
    names (a workload, an SLO profile) are not files."""
    s = options.study
    files: dict[str, Path] = {}
    if spec is not None:
        files["--spec file"] = Path(spec)
    if _is_file_name("workload", s.workload):
        files["--workload trace"] = Path(s.workload)
    if _is_file_name("slo", s.slo):
        files["--slo profile"] = Path(s.slo)
    if s.perf_model is not None:
        files["--perf-model file"] = Path(s.perf_model)
    if s.model_config is not None:
        files["--model-config file"] = Path(s.model_config)
    failures = getattr(getattr(options, "cluster", None), "failures", None)
    if failures is not None:
        files["--failures schedule"] = Path(failures)
    if s.catalog is not None:
        for name in ("machines", "models", "designs"):
            files[f"catalog file ({name})"] = Path(s.catalog) / f"{name}.yaml"
    return files


def resolve_model(study: StudyOptions, catalog: Catalog) -> ModelSpec:
    """--model-config's config.json when given, else the model --model names: a catalog
    name, or a Hugging Face id or snapshot folder (`provisioner.hfmodels`)."""
    if study.model_config is not None:
        from hardware_catalog.hf_config import model_from_hf_config
        check_path(study.model_config, "model_config")
        if not Path(study.model_config).is_file():
            raise InputError(f"model config file not found: {study.model_config}",
                             field="model_config")
        return model_from_hf_config(study.model_config)
    if study.model not in catalog.models:  # a Hugging Face id or a snapshot folder?
        from provisioner.hfmodels import looks_like_hf_id, resolve_hf_model
        if looks_like_hf_id(study.model) or Path(study.model).is_dir():
            return resolve_hf_model(study.model, catalog)
    return catalog.model(study.model)


def resolve_catalog(directory: str | None) -> Catalog:
    if directory is not None:
        check_path(directory, "catalog")
    if directory is not None and not Path(directory).is_dir():
        raise InputError("not a directory (one or more of machines.yaml, models.yaml, "
                         "designs.yaml expected)",
                         source=directory, field="catalog")
    return load_catalog(directory)


def study_catalog(s: StudyOptions) -> Catalog:
    """The catalog a question runs on: the overlay (--catalog), the preset's figures, the
    prices (--price)."""
    return preset_catalog(s.assumptions, resolve_catalog(s.catalog)).with_prices(s.price)


def resolve_design(item: str | Design | dict, catalog: Catalog) -> Design:
    """A design record as it is, a catalog design by name, PROMPT_SKU/TOKEN_SKU (ad hoc), or a
    design's echo ({name, prompt_sku, token_sku, mixed_pool, prefill, chunk_tokens})."""
    if isinstance(item, Design):
        return item
    if isinstance(item, dict):
        entry = {k: v for k, v in item.items() if k != "name" and v is not None}
        return parse_design(str(item.get("name")), entry, "designs", catalog.machines)
    if "/" in item:
        prompt_sku, _, token_sku = item.partition("/")
        return Design(item, catalog.machine(prompt_sku), catalog.machine(token_sku))
    return catalog.design(item)


def asked_designs(question, catalog: Catalog) -> tuple[Design, ...]:
    """--designs, or with --hardware every design shape over those SKUs."""
    if question.hardware is None:
        return resolve_designs(question.designs, catalog)
    if tuple(question.designs) != ("all",):
        raise InputError(f"give {option_ref('designs')} or {option_ref('hardware')}, not both: "
                         f"--hardware searches every design shape over its SKUs")
    from provisioner.hardware import hardware_designs
    return hardware_designs(question.hardware, catalog)


def resolve_designs(items: Sequence[str | Design | dict], catalog: Catalog) -> tuple[Design, ...]:
    """'all' (catalog designs, then the spec's own) or names and records."""
    if list(items) == ["all"]:
        return tuple(catalog.designs.values())
    chosen: list[Design] = []
    for item in items:
        if item == "all":
            raise InputError(f"{option_ref('designs')} 'all' cannot be combined with design "
                             "names", field="designs")
        design = resolve_design(item, catalog)
        if design in chosen:
            raise InputError(f"design '{design.name}' is listed twice", field="designs")
        chosen.append(design)
    return tuple(chosen)


def with_custom_designs(catalog: Catalog, entries: dict | None) -> Catalog:
    designs = {str(name): parse_design(str(name), entry, "spec custom_designs", catalog.machines)
               for name, entry in (entries or {}).items()}
    return catalog.with_designs(designs)


def resolve_load_curve(options: SearchOptions):
    """--load-curve: (its planning windows, the plan's rules, the curve), checked against the
    other options; None without a curve."""
    q = options.question
    if q.load_curve is None:
        refuse_curve_options(q, QuestionOptions(),
                             ("window", "peak_rate", "scale_up_minutes", "min_machines",
                              "curve_shape"))
        return None
    from provisioner.loadcurve import planning_curve
    if q.goal == "max-rate":
        raise InputError(f"{option_ref('load_curve')} sizes for the curve's load: use "
                         f"{option_ref('goal')} min-cost or min-power", field="goal")
    return planning_curve(q.load_curve, options.study.rate, q.peak_rate, q.curve_shape,
                          q.window, q.scale_up_minutes, q.min_machines)


def refuse_curve_options(given, defaults, names: tuple[str, ...]) -> None:
    """Options that shape a load curve's use, given without `--load-curve`: a mistake."""
    for name in names:
        if getattr(given, name) != getattr(defaults, name):
            raise InputError(f"{option_ref(name)} applies to a load curve: add "
                             f"{option_ref('load_curve')} FILE, or drop it", field=name)


def refuse_beside(option: str, why: str, given, defaults, names: tuple[str, ...]) -> None:
    """Options that cannot apply beside `option` (given away from their declared defaults):
    one line naming both, instead of a value silently ignored."""
    for name in names:
        if getattr(given, name) != getattr(defaults, name):
            raise InputError(f"{option_ref(name)} cannot be used with {option_ref(option)}: "
                             f"{why}", field=name)


SEPARATE_POOL_PINS = {"tp_prompt": ("prompt", "tp"), "tp_token": ("token", "tp"),
                      "ep_prompt": ("prompt", "ep"), "ep_token": ("token", "ep")}


def refuse_unused_pins(layout, designs: Sequence[Design], designs_option: str) -> None:
    """--tp-prompt / --tp-token (--ep-prompt / --ep-token) pin a Splitwise design's own pool:
    refused when no design of the question has one (colocated and chunked designs have one
    pool, which --tp / --ep pins). With
    several designs, a pin that applies to some of them is kept (the others ignore it, as its
    help says)."""
    if layout is None or not designs:
        return
    for name, (pool, every_pool) in SEPARATE_POOL_PINS.items():
        if getattr(layout, name) is not None and not any(d.pool(pool) for d in designs):
            which = ", ".join(d.name for d in designs)
            raise InputError(f"{option_ref(name)} cannot be used with "
                             f"{option_ref(designs_option)} {which}: "
                             f"{'a colocated design has' if len(designs) == 1 else 'each has'} "
                             f"one pool, no separate {pool} pool; pin "
                             f"{'it' if len(designs) == 1 else 'them'} with "
                             f"{option_ref(every_pool)}", field=name)


def with_mixed_pool(designs: Sequence[Design], mixed_pool: bool | None,
                    designs_option: str) -> tuple[Design, ...]:
    """--mixed-pool / --no-mixed-pool: every Splitwise design's record with that setting (the
    capacity bounds and the simulations read it there; colocated designs have none), or the
    designs as they are (None: each its own). Refused when no design has separate pools."""
    if mixed_pool is None:
        return tuple(designs)
    if designs and not any(d.pool("token") for d in designs):
        which = ", ".join(d.name for d in designs)
        raise InputError(f"{option_ref('mixed_pool')} cannot be used with "
                         f"{option_ref(designs_option)} {which}: "
                         f"{'a colocated design has' if len(designs) == 1 else 'each has'} "
                         f"one pool, no separate prompt and token pools to lend each other "
                         f"work (the Splitwise mixed pool); drop {option_ref('mixed_pool')}",
                         field="mixed_pool")
    return tuple(replace(d, mixed_pool=mixed_pool) if d.pool("token") else d for d in designs)


def resolve_goal(options: SearchOptions, workload: WorkloadSource, catalog: Catalog,
                 load_curve=None, closed: ClosedLoad | None = None) -> Goal:
    name, rate = options.question.goal, options.study.rate
    if closed is not None:   # the users are the load: sized for, never searched
        if name == "max-rate":
            raise InputError(f"{option_ref('goal')} max-rate searches a rate; a closed loop's "
                             f"load is its users: use {option_ref('goal')} min-cost or "
                             f"min-power with {option_ref('concurrency')}", field="goal")
        return Goal(name, None, resolve_budget(options, catalog), closed)
    if load_curve is not None:   # the static cluster: sized for the busiest window
        rate = max(window.rate_rps for window in load_curve[0])
    if name == "max-rate" and rate is not None:
        raise InputError(f"{option_ref('goal')} max-rate searches the rate: drop "
                         f"{option_ref('rate')}", field="rate")
    if name != "max-rate" and rate is None and not workload.timed:
        rate = DEFAULT_RATE
    return Goal(name, rate, resolve_budget(options, catalog))


BUDGET_OPTIONS = ("power_budget_kw", "cost_budget_per_hour", "budget_like")


def resolve_budget(options: SearchOptions, catalog: Catalog) -> Budget | None:
    q = options.question
    given = [k for k in BUDGET_OPTIONS if getattr(q, k) is not None]
    if len(given) > 1:
        raise InputError("give one budget: " + " or ".join(option_ref(k) for k in given),
                         field=given[1])
    if not given:
        return None
    if given[0] == "power_budget_kw":
        return Budget("power", q.power_budget_kw)
    if given[0] == "cost_budget_per_hour":
        return Budget("cost", q.cost_budget_per_hour)
    return budget_like(q.budget_like, catalog)


def budget_like(text: str, catalog: Catalog) -> Budget:
    """`[power:|cost:]SKU:N`: the provisioned power (default) or hourly cost of N machines."""
    parts = text.split(":")
    kind = "power"
    if len(parts) == 3 and parts[0] in ("power", "cost"):
        kind, parts = parts[0], parts[1:]
    if len(parts) != 2 or not parts[1].isdigit() or not 1 <= int(parts[1]) <= 100_000:
        raise InputError(f"{option_ref('budget_like')} must be [power:|cost:]SKU:N with "
                         f"1 <= N <= 100000, got {text!r}", field="budget_like")
    machine, count = catalog.machine(parts[0]), int(parts[1])
    per_machine = machine.power_kw if kind == "power" else machine.cost_per_hour
    return Budget(kind, float(f"{count * per_machine:.10g}"), like=f"{machine.name}:{count}")


def asked_slo(s: StudyOptions, limits) -> SloProfile:
    """--slo's profile, with the limits given in milliseconds (--ttft-p99-ms ...) over it."""
    return with_ms_limits(load_slo_profile(s.slo), ms_limits(limits))


MIN_WINDOW_REQUESTS = 20


def resolve_study(options: SearchOptions) -> Study:
    """The search's question as records: every name looked up once, here."""
    s = options.study
    closed = closed_load(s)
    if closed is not None:
        refuse_beside_search_closed_loop(options)
    catalog = with_custom_designs(study_catalog(s), options.question.custom_designs)
    workload = asked_workload(s)
    perf = resolve_perf(s)
    loaded = perf.load(catalog)  # a broken file fails here, before any simulation
    load_curve = resolve_load_curve(options)
    if load_curve is not None:
        refuse_trace_blocks_on_a_curve(workload, s.prefix_cache)
    goal = resolve_goal(options, workload, catalog, load_curve, closed)
    model = model_in_dtype(resolve_model(s, catalog), s.dtype, perf.kv_dtype)
    workload = workload.with_context(model)
    used = sim_options(options.study, options.resilience)
    slo = asked_slo(s, options.slo_limits)
    if closed is None:
        window = resolve_window(s, workload, model, loaded, catalog.machine(SLO_REFERENCE_SKU),
                                used, goal.rate_rps)
        duration = window.duration_s
    else:   # the requests set the run's length: no window; the bounds' rate, proven
        window, duration = None, 0.0
        goal = replace(goal, closed=with_safe_rate(
            closed, closed.sample(workload, s.seed), slo,
            reference_curves(model, loaded, catalog.machine(SLO_REFERENCE_SKU), used),
            used.tbt_per_output_token))
    check_workload_size(workload, goal.rate_rps, duration, s.seed)
    auto_spares = options.question.survive_failures == "auto"
    check_resilience(options.resilience, options.question.survive_failures is not None,
                     "survive_failures", auto_spares)
    designs = with_chunk_tokens(asked_designs(options.question, catalog), s.chunk_tokens)
    check_engine_coverage(perf, loaded, model, designs)
    designs_option = "hardware" if options.question.hardware is not None else "designs"
    designs = with_mixed_pool(designs, options.question.mixed_pool, designs_option)
    refuse_unused_pins(options.layout, designs, designs_option)
    check_pins(options.layout, catalog, designs)
    settings = options.settings
    if closed is not None:   # no rate to sweep around the optimum (the figure's load sweep)
        settings = replace(settings, load_sweep=())
    if settings.max_rate * duration > MAX_REQUESTS:  # max-rate never asks for an unreachable run
        settings = replace(settings, max_rate=MAX_REQUESTS / duration)
    if duration > 0 and settings.min_rate * duration < MIN_WINDOW_REQUESTS:
        # nor a window so thin that a sample may hold no request at all (percentiles of a
        # handful of requests say nothing): max-rate's floor holds 20 expected requests
        settings = replace(settings, min_rate=MIN_WINDOW_REQUESTS / duration)
    study = Study(catalog=catalog, model=model, workload=workload, window=window,
                  duration_s=duration, seed=s.seed, slo=slo, perf=perf,
                  reference=catalog.machine(SLO_REFERENCE_SKU),
                  designs=designs,
                  goal=goal, constraints=options.constraints, settings=settings,
                  chunk_tokens=s.chunk_tokens,
                  sim_options=replace(used, mixed_pool=options.question.mixed_pool),
                  assumptions=s.assumptions,
                  survive_failures=(0 if auto_spares
                                    else options.question.survive_failures or 0),
                  survive_auto=auto_spares,
                  layout=options.layout, options=options,
                  hardware=options.question.hardware is not None, load_curve=load_curve)
    check_fits(study, designs)   # a model or pinned layout that fits no design fails here
    return study


def refuse_beside_search_closed_loop(options: SearchOptions) -> None:
    """search --concurrency: what needs a rate or failures is refused in one line (the max-rate
    goal is `resolve_goal`'s)."""
    refuse_beside("concurrency", "a curve is a rate over time; a closed loop's load is its "
                  "users", options.question, QuestionOptions(), ("load_curve",))
    refuse_beside("concurrency", "a closed loop is sized without failures", options.question,
                  QuestionOptions(), ("survive_failures",))
    refuse_beside("concurrency", "a closed loop is sized without failures", options.resilience,
                  FailureOptions(), ("mtbf_hours",))


# ------------------------------------------------------------------------------ the window
def resolve_window(s: StudyOptions, workload: WorkloadSource, model: ModelSpec, perf: Any,
                   reference: MachineSku, used: SimOptions, rate: float | None) -> Window:
    """--duration as given, or the window derived from the workload (`derived_window`)."""
    if s.duration is not None:
        return Window(s.duration, "given", "--duration")
    return derived_window(workload, model, perf, reference, used, rate)


def tail_lengths(workload: WorkloadSource) -> tuple[int, int]:
    """The workload's P99 prompt and output tokens (WINDOW_QUANTILE): a built-in's quantile
    tables, the given lengths' distributions, a trace's or result file's own requests."""
    if workload.prefix_model is not None:   # sessions' prompts grow: a sample's own
        sample = workload.at(BOUND_SAMPLE_RATE, BOUND_SAMPLE_S, 0)
        sizes = [np.quantile(tokens, WINDOW_QUANTILE)
                 for tokens in (sample.prompt_tokens, sample.output_tokens)]
    elif workload.kind == "builtin":
        table = builtin_size_table(workload.name)
        sizes = [np.interp(WINDOW_QUANTILE, table.quantile_probs, q)
                 for q in (table.prompt_quantiles, table.output_quantiles)]
    elif workload.kind == "lengths":
        given = workload.sizes()
        sizes = [given.prompt.quantile(WINDOW_QUANTILE), given.output.quantile(WINDOW_QUANTILE)]
    else:
        trace = workload.sizes()
        sizes = [np.quantile(tokens, WINDOW_QUANTILE)
                 for tokens in (trace.prompt_tokens, trace.output_tokens)]
    prompt, output = (max(int(np.ceil(size)), 1) for size in sizes)
    return prompt, output


def derived_window(workload: WorkloadSource, model: ModelSpec, perf: Any,
                   reference: MachineSku, used: SimOptions, rate: float | None) -> Window:
    """The window when --duration is left out (options.WINDOW_RULE), from the workload alone,
    before any simulation: the larger of WINDOW_FLOOR_S and WINDOW_LIFETIMES x the time a
    request at the workload's P99 lengths takes alone (batch of one, no queue) on the SLO
    reference machine, rounded up to a whole minute; within MAX_DURATION and, at a given
    rate, MAX_REQUESTS. A window starts empty: a short one holding few lifetimes of the long
    requests is a cluster that never filled, and overstates what it sustains."""
    prompt, output = tail_lengths(workload)
    curves = layouts.curves(perf, model, reference, layouts.default_layout(
        model, reference, used.memory_reserve_fraction))
    alone = float(uncontended_latencies(np.array([prompt]), np.array([output]), curves,
                                        used.tbt_per_output_token)[2][0])
    lifetimes = WINDOW_LIFETIMES * alone
    wanted = max(WINDOW_FLOOR_S, 60.0 * float(np.ceil(lifetimes / 60.0)))
    # never past the longest window, nor (at a given rate) a run of more than MAX_REQUESTS
    room = min(MAX_DURATION, MAX_REQUESTS / rate if rate is not None else MAX_DURATION)
    duration = wanted if wanted <= room else max(WINDOW_FLOOR_S, float(np.floor(room)))
    why = (f"derived: a request at the workload's P99 lengths ({prompt:,} prompt + {output:,} "
           f"output tokens) takes {alone:.3g} s alone on {reference.name}; "
           f"{WINDOW_LIFETIMES} x that is {lifetimes:.3g} s"
           + (f", under the {WINDOW_FLOOR_S:g} s floor" if lifetimes <= WINDOW_FLOOR_S else "")
           + (f"; capped at {duration:g} s (at most {MAX_REQUESTS:,} requests)"
              if duration < wanted else ""))
    return Window(float(duration), "derived", why, alone_s=alone, tail_prompt=prompt,
                  tail_output=output)


# ------------------------------------------------------------------ the simulate question
@dataclass(frozen=True)
class SimulateQuestion:
    """`provision simulate`'s question as records, every name looked up once
    (`resolve_simulate`), beside the search's `Study`: one cluster (its design's layouts pinned
    for the workload), what it runs on, and either a workload sample (`requests`) or a load
    curve (`curve`, its `windows`, a `plan` resizing the pools). Running it is
    `provisioner.api.simulate_question`; `to_dict()` is the question in plain values."""
    catalog: Catalog
    cluster: Cluster
    model: ModelSpec
    perf: PerfSource
    perf_model: Any                # `perf` loaded (a simcore.performance.PerformanceModel)
    slo: SloProfile
    workload: WorkloadSource
    reference: MachineSku          # the SLO reference machine
    sim_options: SimOptions        # failure rows, mixed pool and a curve's plan applied
    seed: int
    rate_rps: float | None = None  # None: a trace's own arrivals, or a load curve
    duration_s: float = 0.0
    requests: Workload | None = None   # the sample simulated (None: a load curve's run)
    window_s: float = 0.0          # its arrival window (--duration; a replayed trace: its span)
    load_curve: str | None = None  # the --load-curve file as given
    curve: Any = None              # it read, shaped (--curve-shape)
    windows: tuple = ()            # its --curve-window spans
    sizes: Any = None              # what the curve's requests draw their sizes from
    plan: tuple = ()               # --plan rows (start_s, prompt, token)
    window: Window | None = None   # the window used (--duration or derived) and why

    def to_dict(self) -> dict:
        c = self.cluster
        question = {"design": c.design.name, "prompt_machines": c.prompt_machines,
                    "token_machines": c.token_machines, "model": self.model.name,
                    "workload": self.workload.identity(), "rate_rps": self.rate_rps,
                    "duration_s": self.duration_s,
                    "window": None if self.window is None else self.window.as_dict(),
                    "seed": self.seed,
                    "requests": None if self.requests is None else len(self.requests),
                    "slo_profile": self.slo.name, "perf_model": self.perf.identity(),
                    "sim_options": _plain(asdict(self.sim_options))}
        loop = None if self.requests is None else self.requests.closed
        if loop is not None:
            question.update(concurrency=loop.users, think_time_s=loop.think_mean_s)
        if self.curve is not None:
            question.update(load_curve=self.load_curve,
                            windows=[[w.start_s, w.end_s] for w in self.windows],
                            plan=[list(row) for row in self.plan])
        return question


def resolve_simulate(options: SimulateOptions) -> SimulateQuestion:
    """`provision simulate`'s question as records: every name looked up, every file read and
    every refusal made once, here, before any simulation."""
    s, c = options.study, options.cluster
    catalog = study_catalog(s)
    if c.design is None:
        raise InputError(f"{option_ref('design')} is required", field="design")
    design = design_with_budget(resolve_design(c.design, catalog), s.chunk_tokens)
    plan = _asked_plan(c, design)
    if plan and c.prompt is None and c.token is None and c.machines is None:
        largest = (max(p for _, p, _ in plan), max(t for _, _, t in plan))
        counts = (None, None, largest[0]) if design.is_baseline else (*largest, None)
    else:
        counts = (c.prompt, c.token, c.machines)
    cluster = cluster_from_counts(design, *counts)
    source = resolve_perf(s)
    model = model_in_dtype(resolve_model(s, catalog), s.dtype, source.kv_dtype)
    profile = asked_slo(s, options.slo_limits)
    perf = source.load(catalog)
    check_engine_coverage(source, perf, model, [cluster.design])
    workload = asked_workload(s).with_context(model)
    rate = DEFAULT_RATE if s.rate is None and not workload.timed else s.rate
    check_resilience(options.resilience, c.failures is not None, "failures")
    common = {"catalog": catalog, "model": model, "perf": source, "perf_model": perf,
              "slo": profile, "workload": workload, "seed": s.seed,
              "reference": catalog.machine(SLO_REFERENCE_SKU)}
    if s.concurrency is not None:
        return _closed_question(options, cluster, common)
    refuse_closed_options(s)
    if c.load_curve is None:
        window = resolve_window(s, workload, model, perf, catalog.machine(SLO_REFERENCE_SKU),
                                sim_options(s, options.resilience), rate)
    refuse_unused_pins(options.layout, [cluster.design], "design")
    pools = (cluster.prompt_machines, cluster.token_machines)
    if c.load_curve is not None:
        from provisioner.loadcurve import asked_curve, curve_sizes, longest_request, windows
        refuse_trace_blocks_on_a_curve(workload, s.prefix_cache)
        refuse_beside("load_curve", "the curve sets the run's length", s, StudyOptions(),
                      ("duration",))
        if c.requests_csv is not None:
            raise InputError(f"{option_ref('requests_csv')} writes one row per request: a load "
                             "curve's run keeps no per-request rows; drop it",
                             field="requests_csv")
        curve = asked_curve(c.load_curve, s.rate).shaped(c.curve_shape)
        spans = windows(curve, c.curve_window, "curve_window")
        used = replace(sim_options(s, options.resilience, _failure_rows(c, cluster)),
                       mixed_pool=c.mixed_pool, pool_plan=plan)
        sizes = curve_sizes(workload)
        cluster = replace(cluster, design=pinned_design(
            cluster.design, options.layout, model, used.memory_reserve_fraction,
            longest_request(sizes), pools, workload))
        # (a plan that does not fit the cluster is refused, one line, before any simulation)
        return SimulateQuestion(cluster=cluster, sim_options=used, load_curve=c.load_curve,
                                curve=curve, windows=tuple(spans), sizes=sizes, plan=plan,
                                **common)
    refuse_curve_options(c, ClusterOptions(), ("curve_window", "curve_shape"))
    requests = workload.at(rate, window.duration_s, s.seed, base_seed=0)  # a trace: seed 0 is itself
    reserve = sim_options(s, options.resilience).memory_reserve_fraction
    longest = int(np.max(requests.prompt_tokens + requests.output_tokens))
    cluster = replace(cluster, design=pinned_design(cluster.design, options.layout, model,
                                                    reserve, longest, pools, workload))
    used = replace(sim_options(s, options.resilience, _failure_rows(c, cluster)),
                   mixed_pool=c.mixed_pool)
    span = window.duration_s if rate is not None else float(np.max(requests.arrival_s))
    return SimulateQuestion(cluster=cluster, sim_options=used, rate_rps=rate,
                            duration_s=window.duration_s, requests=requests, window_s=span,
                            window=window, **common)


CLOSED_OPTIONS = ("think_time", "requests")   # shape a closed loop (--concurrency)


def refuse_closed_options(s: StudyOptions) -> None:
    """Options that shape a closed loop, given without `--concurrency`: a mistake."""
    for name in CLOSED_OPTIONS:
        if getattr(s, name) is not None:
            raise InputError(f"{option_ref(name)} applies to a closed loop: add "
                             f"{option_ref('concurrency')} N, or drop it", field=name)


def refuse_beside_closed_loop(s: StudyOptions) -> None:
    """What a closed loop cannot run beside, in either command: a rate (it is its own load),
    a window (its requests set its length) and sessions (they arrive open-loop)."""
    refuse_beside("concurrency", "a closed loop is its own load: give one or the other", s,
                  StudyOptions(), ("rate",))
    refuse_beside("concurrency", "--requests sets a closed loop's length", s, StudyOptions(),
                  ("duration",))
    refuse_beside("concurrency", "sessions arrive open-loop, at their own think times", s,
                  StudyOptions(), ("prefix_model",))


def closed_load(s: StudyOptions) -> ClosedLoad | None:
    """--concurrency's users, mean think time and requests in all (None: no closed loop); its
    options without it are refused."""
    if s.concurrency is None:
        refuse_closed_options(s)
        return None
    refuse_beside_closed_loop(s)
    count = (max(DEFAULT_CLOSED_REQUESTS, CLOSED_REQUESTS_PER_USER * s.concurrency)
             if s.requests is None else s.requests)
    return ClosedLoad(s.concurrency, 0.0 if s.think_time is None else s.think_time, count)


def _closed_question(options: SimulateOptions, cluster: Cluster, common: dict):
    """simulate --concurrency N: the users send --requests requests in a closed loop (their
    arrivals made by the run), instead of arrivals at a rate; not with a load curve, failures
    or a window (--duration: the requests set the run's length)."""
    s, c = options.study, options.cluster
    load = closed_load(s)
    refuse_beside("concurrency", "a closed loop runs its requests on one cluster, without "
                  "failures", c, ClusterOptions(), ("load_curve", "plan", "failures"))
    used = replace(sim_options(s, options.resilience), mixed_pool=c.mixed_pool)
    if used.has_failures:
        raise InputError(f"{option_ref('concurrency')} runs without failures: drop the "
                         "failure options", field="concurrency")
    requests = load.sample(common["workload"], s.seed)
    longest = int(np.max(requests.prompt_tokens + requests.output_tokens))
    cluster = replace(cluster, design=pinned_design(
        cluster.design, options.layout, common["model"], used.memory_reserve_fraction, longest,
        (cluster.prompt_machines, cluster.token_machines), common["workload"]))
    return SimulateQuestion(cluster=cluster, sim_options=used, requests=requests, **common)


def _asked_plan(c: ClusterOptions, design: Design):
    """--plan: its rows for the design (only beside --load-curve)."""
    if c.plan is None:
        return ()
    if c.load_curve is None:
        raise InputError(f"{option_ref('plan')} resizes the pools over a load curve: add "
                         f"{option_ref('load_curve')} FILE, or drop it", field="plan")
    from provisioner.loadcurve import read_plan
    check_path(c.plan, "plan")
    return read_plan(c.plan, design)


def _failure_rows(c: ClusterOptions, cluster: Cluster) -> tuple:
    if c.failures is None:
        return ()
    from simcore.failures import check_schedule, read_failure_csv
    rows = read_failure_csv(c.failures)
    check_schedule(rows, cluster.prompt_machines, cluster.token_machines,
                   cluster.design.is_baseline, source=c.failures)
    return rows


def design_with_budget(design: Design, chunk_tokens) -> Design:
    """`provision simulate --chunk-tokens N`: the chunked design's budget set to N."""
    if chunk_tokens is None:
        return design
    if chunk_tokens == "auto":
        raise InputError(f"{option_ref('chunk_tokens')} auto searches budgets: use it with "
                         "`provision search`; give simulate a number", field="chunk_tokens")
    if not design.is_chunked:
        raise InputError(f"design '{design.name}' runs whole prompts: "
                         f"{option_ref('chunk_tokens')} applies to "
                         "chunked-prefill designs (sarathi-a100, sarathi-h100, or a design with "
                         "prefill: chunked)", field="chunk_tokens")
    return replace(design, chunk_tokens=chunk_tokens)


def cluster_from_counts(design: Design, prompt: int | None, token: int | None,
                        machines: int | None) -> Cluster:
    if design.is_baseline:
        if prompt is not None or token is not None:
            raise InputError(f"design '{design.name}' is a baseline: give "
                             f"{option_ref('machines')} N, not {option_ref('prompt')}/"
                             f"{option_ref('token')}")
        if machines is None:
            raise InputError(f"design '{design.name}' needs {option_ref('machines')} N")
        return Cluster(design, machines)
    if machines is not None:
        raise InputError(f"design '{design.name}' splits the phases: give "
                         f"{option_ref('prompt')} N {option_ref('token')} M, not "
                         f"{option_ref('machines')}")
    if prompt is None or token is None:
        raise InputError(f"design '{design.name}' needs {option_ref('prompt')} N and "
                         f"{option_ref('token')} M")
    return Cluster(design, prompt, token)


def resolve_perf(study: StudyOptions) -> PerfSource:
    """Whose latencies: a --perf-model file, else the preset's (splitwise-sim pins the 2023
    model), else --engine's kernel tables in --dtype. fp8 needs an engine's fp8 tables."""
    perf = preset_perf(study.assumptions, perf_source(study.perf_model, engine=study.engine,
                                                      dtype=study.dtype))
    perf = replace(perf, kv_dtype=kv_dtype_of(perf.engine, perf.dtype, study.kv_dtype))
    check_calibration(perf)
    perf = replace(perf, overheads=engine_overheads(study, perf))
    for name, value in (("dtype", perf.dtype), ("kv_dtype", perf.kv_dtype)):
        if value != "bf16" and perf.engine == LEGACY_ENGINE:
            why = (f"{option_ref('assumptions')} splitwise-sim uses"
                   if study.engine != LEGACY_ENGINE else f"{option_ref('engine')} {LEGACY_ENGINE} uses")
            raise InputError(f"{option_ref(name)} {value} needs an engine's kernel tables: "
                             f"{why} the 2023 Splitwise profiles, measured in bf16 only; use "
                             f"{option_ref('engine')} vllm", field=name)
    return perf


def check_calibration(perf: PerfSource) -> None:
    """An engine calibration (`provision calibrate RESULTS.json`) is the kernel model of its
    engine and data types: the search's --engine, --dtype and --kv-dtype must be those."""
    if perf.path is None or Path(perf.path).suffix.lower() == ".csv":
        return
    from simcore.enginecalib import calibration_header
    header = calibration_header(perf.path)
    if header is None:
        return
    for name, value in (("engine", perf.engine), ("dtype", perf.dtype),
                        ("kv_dtype", perf.kv_dtype)):
        if header.get(name) != value:
            raise InputError(f"{option_ref('perf_model')} {perf.name} is an engine calibration "
                             f"of {option_ref('engine')} {header.get('engine')} "
                             f"{option_ref('dtype')} {header.get('dtype')} "
                             f"{option_ref('kv_dtype')} {header.get('kv_dtype')}; this search "
                             f"asks {option_ref(name)} {value}: give the file's", field=name)


OVERHEAD_OPTIONS = ("iteration_overhead_ms", "sequence_overhead_us", "first_token_overhead_ms",
                    "host_overlap")


def engine_overheads(study: StudyOptions, perf: PerfSource) -> EngineOverheads:
    """The engine's time around its kernels: its fitted terms, with those the user gave. Only
    kernel-composed latencies take them: a measured model (the 2023 profiles, SplitwiseSim's
    curves, a --perf-model file) refuses them in one line."""
    given = [name for name in OVERHEAD_OPTIONS if getattr(study, name) is not None]
    if not perf.uses_kernels:
        if given:
            whose = (f"{option_ref('perf_model')} {perf.name}" if perf.path is not None
                     else f"the {LEGACY_ENGINE} model")
            raise InputError(f"{option_ref(given[0])} applies to latencies composed from kernel "
                             f"tables; {whose} holds measured iteration times or calibrated "
                             f"overheads: drop {option_ref(given[0])}", field=given[0])
        return NO_OVERHEADS
    ms = None if study.first_token_overhead_ms is None else study.first_token_overhead_ms / 1e3
    return fitted_overheads(perf.engine).overridden(
        None if study.iteration_overhead_ms is None else study.iteration_overhead_ms / 1e3,
        None if study.sequence_overhead_us is None else study.sequence_overhead_us / 1e6,
        ms, study.host_overlap)


def kernel_data_summary() -> str:
    """What the shipped kernel tables hold, per GPU: engines with their weight data types (and
    fp8 KV where measured), e.g. 'A100: vLLM bf16; H100: vLLM bf16/fp8 (KV fp8), ...'."""
    from simcore.kernels import GPU_NAMES, coverage
    parts = []
    for gpu, engines in sorted(coverage().items(), key=lambda kv: list(GPU_NAMES).index(kv[0])
                               if kv[0] in GPU_NAMES else 99):
        listed = [f"{ENGINE_NAMES.get(e, e)} {'/'.join(sorted(c['dtypes']))}"
                  + (" (KV fp8)" if "fp8" in c["kv_dtypes"] else "")
                  for e, c in sorted(engines.items())]
        parts.append(f"{GPU_NAMES.get(gpu, gpu)}: {', '.join(listed)}")
    return "; ".join(parts)


def check_engine_coverage(perf: PerfSource, loaded: Any, model: ModelSpec,
                          designs: Sequence[Design]) -> None:
    """A warning, not an error, when the engine's kernel tables cover no machine of the
    designs for this model: every latency then comes from the 2023 model."""
    if not perf.uses_kernels:
        return
    machines = {m.name: m for d in designs for m in d.machines()}
    if (perf.dtype, perf.kv_dtype) != ("bf16", "bf16"):
        # the 2023 model has no fp8 (weights or KV): an uncovered machine is refused, never
        # simulated with another source
        refuse_uncovered(perf, loaded, model, machines)
        return
    if machines and not any(loaded.covers(model, m) for m in machines.values()):
        from provisioner.files import warn
        warn(f"--engine {perf.engine} --dtype {perf.dtype} has no kernel data for "
             f"{model.name} on {', '.join(machines)}: their latencies come from the "
             f"{LEGACY_ENGINE} model (marked uncalibrated)")


def refuse_uncovered(perf: PerfSource, loaded: Any, model: ModelSpec, machines: dict) -> None:
    """One line for the first machine whose GPU has no kernel tables for the engine and data
    types (naming what the tables hold per GPU), or whose model the tables cannot size."""
    from simcore.kernels import GPU_OF_MACHINE, covers
    asked = f"{option_ref('dtype')} {perf.dtype} {option_ref('kv_dtype')} {perf.kv_dtype}"
    engine = ENGINE_NAMES.get(perf.engine, perf.engine)
    field = "dtype" if perf.dtype != "bf16" else "kv_dtype"
    for m in machines.values():
        if loaded.covers(model, m):
            continue
        if not covers(m, perf.engine, perf.dtype, perf.kv_dtype):
            gpu = GPU_OF_MACHINE.get(m.gpu)
            what = (f"{perf.dtype} kernel" if not covers(m, perf.engine, perf.dtype)
                    else "fp8-KV attention")
            raise InputError(
                f"{option_ref('engine')} {perf.engine} {asked}: no {engine} {what} data for "
                f"'{m.name}' ({m.gpu}), and the {LEGACY_ENGINE} model has no {perf.dtype}; "
                f"kernel data ({'none for this GPU; ' if gpu is None else ''}aiconfigurator-core): "
                f"{kernel_data_summary()}; choose designs on those GPUs or another "
                f"{option_ref('engine')}/{option_ref(field)}", field=field)
        raise InputError(
            f"{option_ref('engine')} {perf.engine} {asked}: the kernel tables cannot size "
            f"model '{model.name}' on '{m.name}' (it lacks intermediate_size or vocab_size, or "
            f"its {model.heads} heads do not split over {m.gpus} GPUs), and the "
            f"{LEGACY_ENGINE} model has no {perf.dtype}; use {option_ref('dtype')} bf16 "
            f"{option_ref('kv_dtype')} bf16", field=field)


def check_workload_size(workload: WorkloadSource, rate: float | None, duration: float,
                        seed: int) -> None:
    """Before any simulation: a trace is read (and checked) once, and a synthesized window is
    within MAX_REQUESTS requests."""
    if rate is not None:
        check_request_count(rate, duration)
    if workload.kind in ("trace", "bench", "mooncake"):
        workload.sizes()


def check_resilience(resilience: FailureOptions, configured: bool, how: str,
                     auto_spares: bool = False) -> None:
    """Recovery options without failures to recover from are a mistake, not a no-op. `how`:
    the option that configures failures besides mtbf_hours. With --survive-failures auto the
    repair time sizes the spares even without --mtbf-hours."""
    if resilience.mtbf_hours is not None or configured:
        if resilience.repair_minutes != FailureOptions.repair_minutes \
                and resilience.mtbf_hours is None and not auto_spares:
            raise InputError(f"{option_ref('repair_minutes')} applies to random failures: give "
                             f"{option_ref('mtbf_hours')} too", field="repair_minutes")
        return
    for name in ("recovery", "restart", "replica_target", "detection_s", "repair_minutes"):
        if getattr(resilience, name) != getattr(FailureOptions, name):
            raise InputError(f"{option_ref(name)} applies when machines fail: give "
                             f"{option_ref(how)} or {option_ref('mtbf_hours')}", field=name)


def spec_decode(study: StudyOptions):
    """--spec-decode's `simcore.specdecode.SpecDecode` (None: none), with --spec-tokens and
    --acceptance, which apply only with it."""
    if study.spec_decode == "none":
        for name in ("spec_tokens", "acceptance"):
            if getattr(study, name) is not None:
                raise InputError(f"{option_ref(name)} applies with {option_ref('spec_decode')} "
                                 "mtp, eagle or draft:MODEL", field=name)
        return None
    from simcore.specdecode import resolve
    catalog = study_catalog(study)
    model = resolve_model(study, catalog)
    method, _, draft_name = study.spec_decode.partition(":")
    draft = None
    if method == "draft":
        try:
            draft = catalog.model(draft_name)
        except InputError:
            raise InputError(f"{option_ref('spec_decode')} {study.spec_decode}: no catalog "
                             f"model {draft_name!r} to draft with (see `provision catalog`)",
                             field="spec_decode") from None
    try:
        return resolve(method, study.spec_tokens, study.acceptance, model, draft)
    except InputError as error:
        raise InputError(f"{option_ref('acceptance')}: {error}", field="acceptance") from None


def sim_options(study: StudyOptions, resilience: FailureOptions | None = None,
                failures: tuple = ()) -> SimOptions:
    """The preset's simulation options; with failure options, those too (explicit schedule
    rows `failures`, random failures, recovery), seeded by --seed."""
    options = preset_sim_options(study.assumptions, study.memory_reserve, study.kv_admission,
                                 study.batching, study.engine)
    if study.prefix_cache != "off":
        options = replace(options, prefix_cache=True,
                          prefix_routing=study.prefix_cache == "aware",
                          prefix_host_gb=study.prefix_host_memory)
    elif study.prefix_host_memory > 0:
        raise InputError(f"{option_ref('prefix_host_memory')} applies with "
                         f"{option_ref('prefix_cache')} on or aware", field="prefix_host_memory")
    spec = spec_decode(study)
    if spec is not None:  # (paged KV counts the tokens the steps accepted: simcore.refsim)
        options = replace(options, spec_decode=spec, spec_seed=study.seed)
    if resilience is None:
        return options
    return replace(options, failures=failures, mtbf_hours=resilience.mtbf_hours or 0.0,
                   repair_s=resilience.repair_minutes * 60.0, failure_seed=study.seed,
                   detection_s=resilience.detection_s, recovery=resilience.recovery,
                   replica_target=resilience.replica_target, restart=resilience.restart)


# ------------------------------------------------------------------------------ the echo
def echoed_options() -> dict[str, Any]:
    """name -> field of every option a report echoes (the question; not its execution)."""
    return {path[-1]: f for path, f in leaves(SearchOptions) if f.metadata["echo"]}


def to_echo(study: Study) -> dict:
    """report.json's `inputs`: the options as asked, and what they resolved to."""
    options = study.options if study.options is not None else SearchOptions()
    groups = {f.name: getattr(options, f.name) for f in fields(options)}
    echoed = {}
    for path, f in leaves(SearchOptions):
        if f.metadata["echo"]:
            echoed[f.name] = _plain(getattr(groups[path[0]], f.name))
    skus = {m.name: m for d in study.designs for m in d.machines()}
    return {
        "options": echoed,
        "model": study.model.as_dict(), "workload": study.workload.echo(),
        "slo_profile": study.slo.as_dict(), "perf_model": study.perf.identity(),
        "goal": study.goal.as_dict(), "designs": [d.as_dict() for d in study.designs],
        "catalog": {"machines": {name: m.as_dict() for name, m in skus.items()}},
        "sim_options": sim_options_echo(study),
        "kv_capacity_tokens": kv_capacities(study),
        "window": study.window.as_dict() if study.window is not None else
        None if study.goal.closed is not None else   # a closed loop runs its requests
        Window(study.duration_s, "given", "--duration").as_dict(),
    }


def _plain(value: Any) -> Any:
    """An option's value as JSON: tuples as lists, design records as their echo."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Design):
        return value.as_dict()
    return value


FAILURE_FIELDS = ("failures", "mtbf_hours", "repair_s", "failure_seed", "detection_s",
                  "recovery", "replica_target", "restart")


def sim_options_echo(study: Study) -> dict:
    """The simulation options as report.json echoes them (with the slowdown reference). The
    failure options appear only when failures are simulated, so other reports do not change;
    the failure seed is each sample's seed, not an option."""
    echoed = asdict(study.sim_options)
    echoed.pop("pool_plan")
    echoed.pop("spec_seed")  # each sample's seed
    if study.sim_options.spec_decode is None:  # off: reports as before
        echoed.pop("spec_decode")
    else:
        echoed["spec_decode"] = study.sim_options.spec_decode.as_dict()  # a run's resizing (a load curve's plan), never a study's option
    for key in ("prefix_cache", "prefix_routing", "prefix_host_gb"):
        if not echoed[key]:  # off: reports as before
            echoed.pop(key)
    failing = study.sim_options.has_failures or study.survive_failures
    for key in FAILURE_FIELDS:
        if not failing or key == "failure_seed" or (key == "failures" and not echoed[key]):
            echoed.pop(key)
    return {**echoed, "reference_sku": study.reference.name}


def kv_capacities(study: Study) -> dict[str, int]:
    """KV tokens one machine of each SKU holds beside the weights (what admission checks) at
    its whole-machine layout: one instance, or the TP8 instances of a rack-scale machine."""
    skus = {m.name: m for d in study.designs for m in d.machines()}
    return {name: kv_capacity_tokens(m, study.model, study.sim_options.memory_reserve_fraction)
            * Layout(m.instance_tp).instances_per_machine(m) for name, m in skus.items()}


# ---------------------------------------------------------------------------- its inverse
FILE_READERS = {   # option -> what the file is (read by `_read_named_file`)
    "catalog": "catalog directory", "workload": "workload trace", "slo": "SLO profile",
    "perf_model": "performance model", "model_config": "model config.json",
}


def from_echo(inputs: Any, source: str, base_dir: Path | None = None,
              catalog_dir: str | None = None) -> Study:
    """The study a report's `inputs` describe, re-resolved now (current catalog, simulator and
    performance model). The options are checked as the command line checks them and errors
    name them `inputs.options.NAME`; file names are resolved against the report's folder (then
    the working directory), and a file that cannot be used is named, never quoted."""
    options = options_from_echo(inputs, source, base_dir)
    if catalog_dir is not None:
        options = replace(options, study=replace(options.study, catalog=catalog_dir))
    with naming(lambda name: f"inputs.options.{name}"):
        _check_named_files(options, source)
        try:
            return resolve_study(options)
        except InputError as err:   # a name the catalog no longer has, say: no file content
            raise InputError(str(err), source=source) from None


def options_from_echo(inputs: Any, source: str, base_dir: Path | None = None) -> SearchOptions:
    """The echoed options, checked (an edited report is bad input, naming the key)."""
    if not isinstance(inputs, dict) or not isinstance(inputs.get("options"), dict):
        raise InputError("missing; the report was edited or damaged: re-run the search",
                         source=source, field="inputs.options")
    echo, known = inputs["options"], echoed_options()
    for key in echo:
        if key not in known:
            raise InputError("unknown option; the report was edited, or written by another "
                             "version of provision: re-run the search", source=source,
                             field=f"inputs.options.{key}")
    values = {}
    for name, f in known.items():
        if name not in echo:
            raise InputError("missing; the report was edited or damaged: re-run the search",
                             source=source, field=f"inputs.options.{name}")
        value = echo[name]
        if isinstance(f.default, tuple) and isinstance(value, list):
            value = tuple(value)
        if name == "designs" and isinstance(value, tuple) and any(isinstance(v, dict)
                                                                   for v in value):
            value = _designs_echo(f, value, source)   # Python-built records, echoed
        else:
            value = check_value(f, value, f"inputs.options.{name}", source=source)
        if f.metadata["path"] and value is not None:
            value = _beside_report(value, base_dir)
        values[name] = value
    _check_not_null(values, source)
    return build(SearchOptions, values)


def _designs_echo(f, items: tuple, source: str) -> tuple:
    """Design names checked as names; design records (a Python caller's, echoed as mappings)
    kept for `resolve_design`, which checks them against the catalog."""
    names = [item for item in items if not isinstance(item, dict)]
    if names:
        check_value(f, names, "inputs.options.designs", source=source)
    return items


def _check_not_null(values: dict, source: str) -> None:
    """Options whose declaration has a value by default cannot be echoed as null."""
    for name, f in echoed_options().items():
        if values[name] is None and f.default is not None:
            raise InputError(f"must not be null (default {f.default!r}); the report was edited: "
                             "re-run the search", source=source, field=f"inputs.options.{name}")


def _beside_report(value: str, base_dir: Path | None) -> str:
    """A file name the report echoes: beside the report if it is there, else as written
    (relative to the working directory); a built-in name stays as it is."""
    if base_dir is None or Path(value).is_absolute():
        return value
    beside = base_dir / value
    return str(beside) if beside.exists() else value


def _check_named_files(options: SearchOptions, source: str) -> None:
    """Each file the report names is readable as what it should be; if not, the error names
    the option and the file, and says nothing of its content."""
    for name, what in FILE_READERS.items():
        value = getattr(options.study, name)
        if value is None or not _is_file_name(name, value):
            continue
        try:
            _read_named_file(name, value, options.study)
        except InputError:
            raise InputError(f"the {what} this report names ({value}) cannot be read as one; "
                             f"run `provision search` with it to see why", source=source,
                             field=f"inputs.options.{name}") from None


def _read_named_file(name: str, value: str, study: StudyOptions) -> None:
    if name == "catalog":
        resolve_catalog(value)
    elif name == "workload":
        workload_source(value).sizes()
    elif name == "slo":
        load_slo_profile(value)
    elif name == "model_config":
        resolve_model(replace(study, model_config=value), None)
    else:
        catalog = preset_catalog(study.assumptions, resolve_catalog(study.catalog))
        perf_source(value).load(catalog)


def _is_file_name(name: str, value: str) -> bool:
    """Does the option's value name a file (not a built-in workload or SLO profile)?"""
    from simcore.workload import builtin_workload_names
    from slo_profiles import builtin_slo_profiles
    if name == "workload":
        return value not in builtin_workload_names()
    if name == "slo":
        return value not in builtin_slo_profiles()
    return True


def changed_inputs(old: dict, new: dict) -> list[str]:
    """What the names of a report resolve to now and did not then (catalog entries, records,
    file contents, budgets): one line each, `catalog dgx-h100 cost_per_hour: 38.0 -> 30.0`."""
    lines: list[str] = []
    for key in new:
        if key != "options" and key in old:
            _diff(old[key], new[key], [key], lines)
    return lines


def _diff(old: Any, new: Any, path: list[str], lines: list[str]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in list(old) + [k for k in new if k not in old]:
            _diff(old.get(key), new.get(key), [*path, str(key)], lines)
        return
    if old != new:
        where = " ".join(p for p in path if p != "machines")
        lines.append(f"{where}: {old} -> {new}")


# --------------------------------------------------------------------------- the identity
def identity(study: Study) -> dict:
    """Everything of the question but the point and the sample's seed that changes a simulated
    outcome: the study fields declared `outcome`, each as its record's identity (the evaluator
    adds its code's fingerprint, `provisioner.evaluate.code_fingerprint`)."""
    key = {}
    for f in fields(study):
        if f.metadata.get("outcome"):
            value = _identity_of(getattr(study, f.name))
            if value is not None:   # (an open-loop goal has none: the key of before)
                key[f.name] = value
    return key


def _identity_of(value: Any) -> Any:
    if hasattr(value, "identity"):
        return value.identity()
    if hasattr(value, "as_dict"):
        return value.as_dict()
    if isinstance(value, SimOptions):
        record = asdict(value)
        record.pop("failure_seed")   # each sample's own seed (part of the key already)
        record.pop("spec_seed")
        if value.spec_decode is None:  # off: the key of before
            record.pop("spec_decode")
        for key in ("prefix_cache", "prefix_routing", "prefix_host_gb"):
            if not record[key]:  # off: the key of before
                record.pop(key)
        return record
    if is_dataclass(value):          # an options group: the fields declared outcome=True
        return {f.name: getattr(value, f.name) for f in fields(value)
                if f.metadata.get("outcome")}
    return value
