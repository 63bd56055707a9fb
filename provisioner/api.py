"""The Python API, and the edge where options become records.

    import provisioner
    result = provisioner.search(designs="splitwise-hh", rate=70, goal="min-cost")
    result.designs[0].optimum          # typed per-design results
    result.to_dict()                   # exactly report.json
    result.write("my-report")          # report.json, evaluations.csv, report.html

Keywords are the command-line option names with underscores. Names (designs, model, SLO profile,
workload, performance model) are resolved to records here, once; everything after this module
takes records. Nothing is written unless asked: from Python the evaluation cache is used only
when `cache_dir` is given.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

from hardware_catalog import (Catalog, Design, InputError, check_path, load_catalog,
                              parse_design)
from provisioner.confidence import interval_samples, intervals_of, verification
from provisioner.evaluate import SimulationEvaluator, sim_options_echo
from provisioner import __version__
from provisioner.options import (DEFAULT_RATE, Execution, FailureOptions, SearchOptions,
                                 SimulateOptions, StudyOptions, build,
                                 echo, from_keywords, read_spec)
from provisioner.files import check_output_dir
from provisioner.reports import (REPORT_FILES, machines_of, render_reports, report_document,
                                 sensitivity_dict, summary_dict, write_reports)
from provisioner.presets import preset_catalog, preset_sim_options
from provisioner.sensitivity import sensitivity
from provisioner.runner import (DiskCache, Runner, RunStats, Verifier, default_cache_dir,
                                default_jobs)
from provisioner.frontier import search_designs
from provisioner.chunked import (budget_variants, collapse_variants, progress_by_design,
                                 with_chunk_tokens)
from provisioner.study import (SCREEN_SEEDS, Budget, DesignResult, Goal, PerfSource, Study,
                               WorkloadSource, perf_source, workload_source)
from simcore import SIMULATOR_VERSION, Cluster, SimOptions, evaluate_slos
from simcore.cluster import kv_capacity_tokens
from simcore import simulate as run_simulation
from simcore.perfmodel import perf_model_version
from simcore.workload import MAX_REQUESTS, check_request_count
from slo_profiles import load_slo_profile

SLO_REFERENCE_SKU = "dgx-a100"  # the Splitwise SLOs are slowdowns against an uncontended DGX-A100
OnBatch = Callable[[dict[str, int]], None]


# ------------------------------------------------------------------------ options -> records
def merge_options(tree: type, given: dict[str, Any], spec_path: str | Path | None = None):
    """Declared defaults < spec file < given options (already checked), as a typed tree."""
    spec = read_spec(spec_path, tree) if spec_path is not None else {}
    return build(tree, {**spec, **given})


def input_files(options: SearchOptions | SimulateOptions,
                spec: str | Path | None = None) -> dict[str, Path]:
    """Every file the run reads, labelled as the user gave it (for `check_not_an_input`):
    spec, trace, SLO profile, performance model, failure schedule, catalog files. Built-in
    names (a workload, an SLO profile) are not files."""
    from simcore.workload import builtin_workload_names
    from slo_profiles import builtin_slo_profiles
    s = options.study
    files: dict[str, Path] = {}
    if spec is not None:
        files["--spec file"] = Path(spec)
    if s.workload not in builtin_workload_names():
        files["--workload trace"] = Path(s.workload)
    if s.slo not in builtin_slo_profiles():
        files["--slo profile"] = Path(s.slo)
    if s.perf_model is not None:
        files["--perf-model file"] = Path(s.perf_model)
    failures = getattr(getattr(options, "cluster", None), "failures", None)
    if failures is not None:
        files["--failures schedule"] = Path(failures)
    if s.catalog is not None:
        for name in ("machines", "models", "designs"):
            files[f"catalog file ({name})"] = Path(s.catalog) / f"{name}.yaml"
    return files


def resolve_catalog(directory: str | None) -> Catalog:
    if directory is not None:
        check_path(directory, "catalog")
    if directory is not None and not Path(directory).is_dir():
        raise InputError("not a directory (machines.yaml, models.yaml, designs.yaml expected)",
                         source=directory, field="catalog")
    return load_catalog(directory)


def resolve_design(item: str | Design, catalog: Catalog) -> Design:
    """A design record as it is, a catalog design by name, or PROMPT_SKU/TOKEN_SKU (ad hoc)."""
    if isinstance(item, Design):
        return item
    if "/" in item:
        prompt_sku, _, token_sku = item.partition("/")
        return Design(item, catalog.machine(prompt_sku), catalog.machine(token_sku))
    return catalog.design(item)


def resolve_designs(items: Sequence[str | Design], catalog: Catalog) -> tuple[Design, ...]:
    """'all' (catalog designs, then the spec's own) or names and records."""
    if list(items) == ["all"]:
        return tuple(catalog.designs.values())
    chosen: list[Design] = []
    for item in items:
        if item == "all":
            raise InputError("--designs 'all' cannot be combined with design names",
                             field="designs")
        design = resolve_design(item, catalog)
        if design in chosen:
            raise InputError(f"design '{design.name}' is listed twice", field="designs")
        chosen.append(design)
    return tuple(chosen)


def with_custom_designs(catalog: Catalog, entries: dict | None) -> Catalog:
    designs = {name: parse_design(name, entry, "spec custom_designs", catalog.machines)
               for name, entry in (entries or {}).items()}   # names: strings (read_spec)
    return catalog.with_designs(designs)


def resolve_goal(options: SearchOptions, workload: WorkloadSource, catalog: Catalog) -> Goal:
    name, rate = options.question.goal, options.study.rate
    if name == "max-rate" and rate is not None:
        raise InputError("--goal max-rate searches the rate: drop --rate", field="rate")
    if name != "max-rate" and rate is None and workload.kind == "builtin":
        rate = DEFAULT_RATE
    return Goal(name, rate, resolve_budget(options, catalog))


def resolve_budget(options: SearchOptions, catalog: Catalog) -> Budget | None:
    q = options.question
    given = [k for k in ("power_budget_kw", "cost_budget_per_hour", "budget_like")
             if getattr(q, k) is not None]
    if len(given) > 1:
        raise InputError("give one budget: " + " or ".join(f"--{k.replace('_', '-')}"
                                                          for k in given), field=given[1])
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
        raise InputError(f"--budget-like must be [power:|cost:]SKU:N with 1 <= N <= 100000, "
                         f"got {text!r}", field="budget_like")
    machine, count = catalog.machine(parts[0]), int(parts[1])
    per_machine = machine.power_kw if kind == "power" else machine.cost_per_hour
    return Budget(kind, float(f"{count * per_machine:.10g}"), like=f"{machine.name}:{count}")


def resolve_study(options: SearchOptions) -> Study:
    """The search's question as records: every name looked up once, here."""
    s = options.study
    catalog = with_custom_designs(preset_catalog(s.assumptions, resolve_catalog(s.catalog)),
                                  options.question.custom_designs)
    workload = workload_source(s.workload)
    perf = perf_source(s.perf_model)
    perf.load(catalog)  # a broken file fails here, before any simulation
    goal = resolve_goal(options, workload, catalog)
    check_workload_size(workload, goal.rate_rps, s.duration, s.seed)
    check_resilience(options.resilience, options.question.survive_failures is not None,
                     "--survive-failures K")
    settings = options.settings
    if settings.max_rate * s.duration > MAX_REQUESTS:  # max-rate never asks for an unreachable run
        settings = replace(settings, max_rate=MAX_REQUESTS / s.duration)
    return Study(catalog=catalog, model=catalog.model(s.model), workload=workload,
                 duration_s=s.duration, seed=s.seed, slo=load_slo_profile(s.slo), perf=perf,
                 reference=catalog.machine(SLO_REFERENCE_SKU),
                 designs=with_chunk_tokens(resolve_designs(options.question.designs, catalog),
                                           s.chunk_tokens),
                 goal=goal, constraints=options.constraints, settings=settings,
                 chunk_tokens=s.chunk_tokens,
                 sim_options=sim_options(options.study, options.resilience),
                 assumptions=s.assumptions,
                 survive_failures=options.question.survive_failures or 0)


def check_workload_size(workload: WorkloadSource, rate: float | None, duration: float,
                        seed: int) -> None:
    """Before any simulation: a trace is read (and checked) once, and a synthesized window is
    within MAX_REQUESTS requests."""
    if rate is not None:
        check_request_count(rate, duration)
    if workload.kind == "trace":
        workload.at(None, duration, seed)


def check_resilience(resilience: FailureOptions, configured: bool, how: str) -> None:
    """Recovery options without failures to recover from are a mistake, not a no-op."""
    if resilience.mtbf_hours is not None or configured:
        if resilience.repair_minutes != FailureOptions.repair_minutes \
                and resilience.mtbf_hours is None:
            raise InputError("--repair-minutes applies to random failures: give --mtbf-hours "
                             "too", field="repair_minutes")
        return
    for name in ("recovery", "replica_target", "detection_s", "repair_minutes"):
        if getattr(resilience, name) != getattr(FailureOptions, name):
            raise InputError(f"--{name.replace('_', '-')} applies when machines fail: give "
                             f"{how} or --mtbf-hours H", field=name)


def sim_options(study: StudyOptions, resilience: FailureOptions | None = None,
                failures: tuple = ()) -> SimOptions:
    """The preset's simulation options; with failure options, those too (explicit schedule
    rows `failures`, random failures, recovery), seeded by --seed."""
    options = preset_sim_options(study.assumptions, study.memory_reserve)
    if resilience is None:
        return options
    return replace(options, failures=failures, mtbf_hours=resilience.mtbf_hours or 0.0,
                   repair_s=resilience.repair_minutes * 60.0, failure_seed=study.seed,
                   detection_s=resilience.detection_s, recovery=resilience.recovery,
                   replica_target=resilience.replica_target)


# ----------------------------------------------------------------------------- the results
def versions() -> dict:
    return {"provision": __version__, "simulator": SIMULATOR_VERSION,
            "perf_model": perf_model_version()}


def inputs_echo(study: Study) -> dict:
    """The report's inputs: everything needed to re-derive the optimum, no machine paths."""
    skus = {m.name: m for d in study.designs for m in d.machines()}
    return {
        "model": study.model.as_dict(), "workload": study.workload.identity(),
        "duration_s": study.duration_s, "seed": study.seed, "slo_profile": study.slo.as_dict(),
        "perf_model": study.perf.identity(), "goal": study.goal.as_dict(),
        "constraints": echo(study.constraints), "search": echo(study.settings),
        "designs": [d.as_dict() for d in study.designs],
        "catalog": {"machines": {name: m.as_dict() for name, m in skus.items()}},
        "sim_options": sim_options_echo(study),
        **({"chunk_tokens": study.chunk_tokens} if study.chunk_tokens is not None else {}),
        **({"survive_failures": study.survive_failures} if study.survive_failures else {}),
        "kv_capacity_tokens": kv_capacities(study),
    }


def kv_capacities(study: Study) -> dict[str, int]:
    """KV tokens one machine of each SKU holds beside the weights (what admission checks)."""
    skus = {m.name: m for d in study.designs for m in d.machines()}
    return {name: kv_capacity_tokens(m, study.model, study.sim_options.memory_reserve_fraction)
            for name, m in skus.items()}


def uncalibrated(design: Design, study: Study) -> list[str]:
    """The design's SKUs whose latencies for this model are scaled from datasheets."""
    perf = study.perf.load(study.catalog)
    return [m.name for m in design.machines() if not perf.is_calibrated(study.model, m)]


CALIBRATION_HINT = ("latencies scaled from datasheets (uncalibrated: expect 15-30% error); "
                    "measure one prompt and one batch-1 decode latency per GPU, run `provision "
                    "calibrate PROFILE.csv --out coeffs.json`, then search with `--perf-model "
                    "coeffs.json`")


def assumptions(study: Study) -> list[dict]:
    """Every modelling assumption that moves the answer, with its value in this run."""
    o = study.sim_options
    serialized = o.layerwise_min_prompt_tokens >= 1 << 62
    return [
        {"name": "preset", "value": study.assumptions},
        {"name": "memory", "value": f"HBM as the catalog states it (GiB-class figures, as "
                                    f"nvidia-smi reports); {o.memory_reserve_fraction:.0%} "
                                    "reserved; KV capacity = GPUs x HBM x (1 - reserve) - "
                                    "weights; a prompt's KV is held on its prompt machine "
                                    "until transferred"},
        {"name": "kv_admission", "value": "a decode is admitted when the KV of its prompt plus "
                                          "its full output fits (reserved up front, FCFS)"},
        {"name": "kv_transfer", "value": "serialized after the prompt" if serialized else
         f"serialized below {o.layerwise_min_prompt_tokens} prompt tokens, layer-wise (only "
         "the last layer and the link's fixed time visible) from there"},
        {"name": "tbt", "value": "(E2E - TTFT) / output tokens" if o.tbt_per_output_token else
         "a request's mean gap between output tokens: (E2E - TTFT) / (output tokens - 1)"},
        {"name": "mixed_batch_cost", "value": "max(prompt curve at prompt + decode tokens, "
                                              "decode curve at the batch) + context term"},
        {"name": "prompt_batching", "value": f"FCFS batches of up to {o.prompt_token_limit} "
                                             "prompt tokens (a longer prompt runs alone)"},
        {"name": "routing", "value": "prompt machine: fewest pending prompt tokens; token "
                                     "machine: fewest committed KV tokens; ties to the lowest "
                                     "index; mixed pool above "
                                     f"{o.mixed_pool_queue_threshold} queued tokens"},
        {"name": "verification", "value": f"every SLO on {study.settings.verify_seeds} workload "
                                          f"sample(s), seeds {list(study.seeds)}"},
        *failure_assumptions(study),
    ]


def failure_assumptions(study: Study) -> list[dict]:
    """With failures configured: how they are placed and recovered (none otherwise)."""
    o, k = study.sim_options, study.survive_failures
    if not (o.has_failures or k):
        return []
    placed = []
    if k:
        placed.append(f"N+{k}: {k} machine(s) fail 10% into the window and stay down, as "
                      f"{k} prompt, {k} token" + (" and half and half" if k > 1 else "")
                      + " (baselines: any); a point passes only in every placement")
    if o.mtbf_hours:
        placed.append(f"random failures per machine, MTBF {o.mtbf_hours:g} h, repaired after "
                      f"{o.repair_s:g} s, drawn per sample seed")
    recovery = ("restart: re-prefill prompt + generated tokens" if o.recovery == "restart" else
                f"replicate: KV streamed to {o.replica_target} memory as generated (not charged "
                "to iterations), restored at the link bandwidth")
    return [{"name": "failures", "value": "; ".join(placed) + f"; detected after "
             f"{o.detection_s:g} s; {recovery}; a failed machine loses its work and KV"}]


@dataclass
class SearchResult:
    """What a search found: typed per-design results, run statistics and the report."""
    study: Study
    designs: list[DesignResult]
    stats: RunStats = field(default_factory=RunStats)
    sensitivity: list[dict] | None = None   # with --sensitivity: what moves each optimum

    def to_dict(self) -> dict:
        """Exactly the content of report.json (and of `provision search --json`)."""
        document = report_document(inputs_echo(self.study), self.designs, versions(),
                                   assumptions(self.study), CALIBRATION_HINT)
        if self.sensitivity is not None:
            document["sensitivity"] = sensitivity_dict(self.sensitivity)
        return document

    def write(self, out_dir: str | Path) -> list[Path]:
        """Write report.json, evaluations.csv and report.html atomically; returns the paths."""
        return write_reports(Path(out_dir), render_reports(self.to_dict(), self.designs))

    @property
    def best(self) -> DesignResult | None:
        best = summary_dict(self.designs, self.study.goal.name)["best_design"]
        return next((r for r in self.designs if r.design.name == best), None)


def run_study(study: Study, execution: Execution, on_batch: OnBatch | None = None,
              resilience: bool = True) -> SearchResult:
    cache_dir = None if execution.no_cache else Path(execution.cache_dir or default_cache_dir())
    cache = DiskCache(cache_dir) if cache_dir is not None else None
    evaluator = SimulationEvaluator(study)
    runner = Runner(evaluator, execution.jobs or default_jobs(), execution.backend,
                    execution.address, cache)
    searched, origin = budget_variants(study.designs, study.chunk_tokens)
    with runner:
        results = search_designs(searched, study.goal, study.constraints, study.settings,
                                 Verifier(runner, study.seeds, SCREEN_SEEDS,
                                          study.settings.verify_margin).run,
                                 progress_by_design(on_batch, origin), runner.concurrent)
        results = collapse_variants(study.designs, results, origin, study.goal)
        wanted = [interval_samples(result) for result in results]
        intervals = iter(runner.map(intervals_of, [s for samples in wanted for s in samples]))
    for result, samples in zip(results, wanted):
        result.verification = verification(result, [next(intervals) for _ in samples])
        result.uncalibrated = uncalibrated(result.design, study)
    if study.survive_failures and resilience:
        price_of_resilience(study, execution, results)
    moved = (sensitivity(study, execution, partial(run_study, resilience=False))
             if study.settings.sensitivity else None)
    return SearchResult(study, results, runner.stats, moved)


def price_of_resilience(study: Study, execution: Execution, results: list[DesignResult]) -> None:
    """--survive-failures: each design's plain optimum (no failures) and its failure-aware
    optimum under restart and under replicate, with their costs and powers (one extra search
    without failures and one with the other recovery policy)."""
    plain = replace(study, survive_failures=0, settings=replace(study.settings, sensitivity=False,
                                                                load_sweep=()),
                    sim_options=replace(study.sim_options, mtbf_hours=0.0, failures=()))
    runs = {"plain": plain}
    for policy in ("restart", "replicate"):
        if policy != study.sim_options.recovery:
            runs[policy] = replace(plain, survive_failures=study.survive_failures,
                                   sim_options=replace(study.sim_options, recovery=policy))
    optima = {name: {r.design.name: r.optimum
                     for r in run_study(variant, execution, resilience=False).designs}
              for name, variant in runs.items()}
    optima[study.sim_options.recovery] = {r.design.name: r.optimum for r in results}
    for result in results:
        name = result.design.name
        base = optima["plain"].get(name)
        entry = {"survive_failures": study.survive_failures,
                 "replica_target": study.sim_options.replica_target}
        for label in ("plain", "restart", "replicate"):
            o = optima[label].get(name)
            entry[label] = None if o is None else {
                **machines_of(o, result.design.is_baseline), "rate_rps": o.rate_rps,
                "cost_per_hour": o.cost_per_hour, "power_kw": o.power_kw}
            if label != "plain" and o is not None and base is not None:
                entry[label]["cost_ratio"] = o.cost_per_hour / base.cost_per_hour
                entry[label]["power_ratio"] = o.power_kw / base.power_kw
                if study.goal.name == "max-rate":  # same budget: the rate given up
                    entry[label]["rate_ratio"] = o.rate_rps / base.rate_rps
        result.resilience = entry


def check_writable_dir(path: str | Path, field_name: str) -> None:
    """Fail before any simulation when `path` cannot become a directory we can write (with the
    report files in it, for --out)."""
    check_output_dir(path, field_name, REPORT_FILES if field_name == "out" else ())


def search(*, spec: str | Path | None = None, on_batch: OnBatch | None = None,
           **options) -> SearchResult:
    """Run a provisioning search; keywords are the CLI options (`rate=70`, `goal="min-cost"`,
    `designs="splitwise-hh,splitwise-aa"` or a list of names and `Design` records, ...)."""
    given = from_keywords(SearchOptions, options)
    if "cache_dir" not in given:
        given.setdefault("no_cache", True)  # from Python, nothing is written unless asked
    merged = merge_options(SearchOptions, given, spec)
    return run_study(resolve_study(merged), merged.execution, on_batch)


# --------------------------------------------------------------------------- one cluster
@dataclass
class SimulationRun:
    """One cluster simulated on one workload, with everything the summary needs."""
    cluster: Any
    model: Any
    workload: Any
    result: Any
    report: Any   # simcore.SloReport
    uncalibrated: list[str] = field(default_factory=list)  # SKUs with datasheet-scaled latencies
    profile: Any = None   # the SLO profile (goodput counts requests within its limits)


def simulate(*, spec: str | Path | None = None, **options) -> SimulationRun:
    """Simulate one cluster; keywords are `provision simulate`'s options with underscores."""
    given = from_keywords(SimulateOptions, options)
    return simulate_options(merge_options(SimulateOptions, given, spec))


def simulate_options(options: SimulateOptions) -> SimulationRun:
    s, c = options.study, options.cluster
    catalog = preset_catalog(s.assumptions, resolve_catalog(s.catalog))
    if c.design is None:
        raise InputError("--design is required", field="design")
    cluster = cluster_from_counts(design_with_budget(resolve_design(c.design, catalog),
                                                     s.chunk_tokens),
                                  c.prompt, c.token, c.machines)
    model, profile = catalog.model(s.model), load_slo_profile(s.slo)
    perf = perf_source(s.perf_model).load(catalog)
    source = workload_source(s.workload)
    rate = DEFAULT_RATE if s.rate is None and source.kind == "builtin" else s.rate
    requests = source.at(rate, s.duration, s.seed, base_seed=0)  # a replayed trace: seed 0 is itself
    check_resilience(options.resilience, c.failures is not None, "--failures CSV")
    rows = ()
    if c.failures is not None:
        from simcore.failures import check_schedule, read_failure_csv
        rows = read_failure_csv(c.failures)
        check_schedule(rows, cluster.prompt_machines, cluster.token_machines,
                       cluster.design.is_baseline, source=c.failures)
    result = run_simulation(cluster, requests, model, perf, catalog.machine(SLO_REFERENCE_SKU),
                            replace(sim_options(s, options.resilience, rows),
                                    mixed_pool=c.mixed_pool))
    uncal = [m.name for m in cluster.design.machines() if not perf.is_calibrated(model, m)]
    return SimulationRun(cluster, model, requests, result, evaluate_slos(result, profile), uncal,
                         profile)


def design_with_budget(design: Design, chunk_tokens) -> Design:
    """`provision simulate --chunk-tokens N`: the chunked design's budget set to N."""
    if chunk_tokens is None:
        return design
    if chunk_tokens == "auto":
        raise InputError("--chunk-tokens auto searches budgets: use it with `provision search`; "
                         "give simulate a number", field="chunk_tokens")
    if not design.is_chunked:
        raise InputError(f"design '{design.name}' runs whole prompts: --chunk-tokens applies to "
                         "chunked-prefill designs (sarathi-a100, sarathi-h100, or a design with "
                         "prefill: chunked)", field="chunk_tokens")
    return replace(design, chunk_tokens=chunk_tokens)


def cluster_from_counts(design: Design, prompt: int | None, token: int | None,
                        machines: int | None) -> Cluster:
    if design.is_baseline:
        if prompt is not None or token is not None:
            raise InputError(f"design '{design.name}' is a baseline: give --machines N, "
                             "not --prompt/--token")
        if machines is None:
            raise InputError(f"design '{design.name}' needs --machines N")
        return Cluster(design, machines)
    if machines is not None:
        raise InputError(f"design '{design.name}' splits the phases: give --prompt N --token M, "
                         "not --machines")
    if prompt is None or token is None:
        raise InputError(f"design '{design.name}' needs --prompt N and --token M")
    return Cluster(design, prompt, token)


__all__ = ["search", "SearchResult", "simulate", "SimulationRun", "resolve_study", "run_study",
           "merge_options", "budget_like", "inputs_echo", "versions", "Study", "PerfSource",
           "WorkloadSource"]
