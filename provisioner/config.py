"""From options (embedded default < --spec file < command line) to a validated search plan, and
from a plan to the report document. A Python user can call `plan_search` and `run_plan` directly.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from hardware_catalog import Catalog, Design, InputError, load_catalog, parse_design, read_yaml
from provisioner.evaluate import (DiskCache, PerfSource, Runner, RunStats, SimulationEvaluator,
                                  WorkloadSource, default_cache_dir, perf_source, workload_source)
from provisioner.search import (GOALS, Budget, Constraints, DesignResult, Goal, SearchSettings,
                                search_designs)

DEFAULT_SPEC = Path(__file__).resolve().parent / "data" / "default_search.yaml"
DEFAULT_OUT = "provision-report"

# option -> (kind, description of valid values). Spec files use the same names (- or _).
OPTIONS: dict[str, str] = {
    "model": "text", "workload": "text", "designs": "designs", "goal": "text", "rate": "positive",
    "power_budget_kw": "positive", "cost_budget_per_hour": "positive", "budget_like": "text",
    "slo": "text", "perf_model": "text", "duration": "positive", "seed": "count0",
    "out": "text", "jobs": "count1", "backend": "text", "address": "text", "exhaustive": "flag",
    "max_machines": "count1", "max_gpus": "count1", "max_prompt": "count1", "max_token": "count1",
    "search_limit": "count1", "rate_tolerance": "fraction", "cache_dir": "text",
    "no_cache": "flag", "catalog": "text", "custom_designs": "mapping",
}
PATH_OPTIONS = ("workload", "perf_model", "slo")  # resolved against the spec file's folder


@dataclass(frozen=True)
class SearchPlan:
    """Everything a search needs, validated."""
    catalog: Catalog
    designs: tuple[Design, ...]
    goal: Goal
    constraints: Constraints
    settings: SearchSettings
    evaluator: SimulationEvaluator
    out: Path
    jobs: int
    backend: str
    address: str | None
    cache_dir: Path | None   # None: no cache


# ---------------------------------------------------------------------------- options layers
def read_spec(path: str | Path) -> dict[str, Any]:
    """A spec file's options (keys as on the command line, with - or _), validated."""
    data = read_yaml(Path(path))
    if not isinstance(data, dict):
        raise InputError("a spec file must be a mapping of option names to values",
                         source=str(path))
    options = {}
    for raw_key, value in data.items():
        key = str(raw_key).replace("-", "_")
        if key not in OPTIONS:
            raise InputError(f"unknown option; expected one of {', '.join(sorted(OPTIONS))}",
                             source=str(path), field=str(raw_key))
        options[key] = check_option(key, value, source=str(path))
    return options


def check_option(key: str, value: Any, source: str | None = None) -> Any:
    kind = OPTIONS[key]
    flag = f"--{key.replace('_', '-')}" if source is None else None

    def bad(message: str) -> InputError:
        where = flag or key
        return InputError(f"{where} {message}, got {value!r}", source=source,
                          field=None if flag else key)

    if value is None:
        return None
    if kind == "text":
        if not isinstance(value, str) or not value.strip():
            raise bad("must be a non-empty string")
    elif kind in ("positive", "fraction"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise bad("must be a number > 0")
        if kind == "fraction" and not value < 1:
            raise bad("must be between 0 and 1")
        value = float(value)
    elif kind in ("count0", "count1"):
        if isinstance(value, bool) or not isinstance(value, int) or value < int(kind[-1]):
            raise bad(f"must be a whole number >= {kind[-1]}")
    elif kind == "flag":
        if not isinstance(value, bool):
            raise bad("must be true or false")
    elif kind == "designs":
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise bad("must be 'all' or a list of design names")
    elif kind == "mapping" and not isinstance(value, dict):
        raise bad("must map design names to {prompt_sku, token_sku}")
    return value


def merge_options(cli: dict[str, Any], spec_path: str | Path | None = None) -> dict[str, Any]:
    """Embedded default < spec file < command line (only the options given).

    The default's rate belongs to the default question: it is dropped for max-rate (which
    searches the rate) and for a CSV trace (replayed as it is unless a rate is asked for).
    """
    defaults = read_spec(DEFAULT_SPEC)
    spec = read_spec(spec_path) if spec_path is not None else {}
    given = {k: check_option(k, v) for k, v in cli.items() if v is not None}
    base_dir = Path(spec_path).resolve().parent if spec_path is not None else None
    for key in PATH_OPTIONS:
        if key in spec and key not in given:
            spec[key] = _relative_to(spec[key], base_dir)
    options = {**defaults, **spec, **given}
    if "rate" not in spec and "rate" not in given:
        from simcore.workload import builtin_workload_names
        if options["goal"] == "max-rate" or options["workload"] not in builtin_workload_names():
            options.pop("rate", None)
    return options


def _relative_to(value: str, base_dir: Path | None) -> str:
    """A spec's file names are relative to the spec file (built-in names stay as they are)."""
    if base_dir is None or Path(value).is_absolute() or not (base_dir / value).exists():
        return value
    return os.path.relpath(base_dir / value)


# ------------------------------------------------------------------------------- the plan
def plan_search(options: dict[str, Any]) -> SearchPlan:
    from slo_profiles import load_slo_profile

    catalog = load_catalog(options.get("catalog"))
    catalog = catalog.with_designs(parse_custom_designs(options.get("custom_designs") or {}))
    designs = resolve_designs(options.get("designs", ["all"]), catalog)
    catalog = catalog.with_designs({d.name: d for d in designs if d.name not in catalog.designs})
    goal_name = options.get("goal", "min-cost")
    if goal_name not in GOALS:
        raise InputError(f"unknown goal '{goal_name}'; use {', '.join(GOALS)}", field="goal")
    workload = workload_source(options["workload"])
    rate = options.get("rate")
    if goal_name != "max-rate" and rate is None and workload.kind == "builtin":
        raise InputError(f"workload '{workload.name}' is a distribution; give --rate",
                         field="rate")
    if goal_name == "max-rate" and rate is not None:
        raise InputError("--goal max-rate searches the rate: drop --rate", field="rate")
    goal = Goal(goal_name, rate if goal_name != "max-rate" else None,
                parse_budget(options, catalog))
    model = catalog.model(options["model"])
    evaluator = SimulationEvaluator(
        catalog=catalog, model=model.name, workload=workload,
        duration_s=options.get("duration", 120.0), seed=options.get("seed", 0),
        slo=load_slo_profile(options.get("slo", "splitwise")),
        perf=perf_source(options.get("perf_model")))
    constraints = Constraints(*(options.get(k) for k in ("max_machines", "max_gpus",
                                                          "max_prompt", "max_token")))
    settings = SearchSettings(exhaustive=options.get("exhaustive", False),
                              search_limit=options.get("search_limit", 256),
                              rate_tolerance=options.get("rate_tolerance", 0.02))
    backend = options.get("backend", "loky")
    cache_dir = None if options.get("no_cache") else Path(options.get("cache_dir")
                                                          or default_cache_dir())
    return SearchPlan(catalog, designs, goal, constraints, settings, evaluator,
                      Path(options.get("out", DEFAULT_OUT)), options.get("jobs") or default_jobs(),
                      backend, options.get("address"), cache_dir)


def default_jobs() -> int:
    """One worker per core: the search batches several designs' steps at a time."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else (os.cpu_count() or 1))


def parse_custom_designs(entries: dict) -> dict[str, Design]:
    return {str(name): parse_design(str(name), entry, "spec custom_designs")
            for name, entry in entries.items()}


def resolve_designs(names: Sequence[str], catalog: Catalog) -> tuple[Design, ...]:
    """'all' (catalog designs, then the spec's own) or names; PROMPT_SKU/TOKEN_SKU is ad hoc."""
    from provisioner.inputs import resolve_design
    if list(names) == ["all"]:
        return tuple(catalog.designs.values())
    chosen = []
    for name in names:
        if name == "all":
            raise InputError("--designs 'all' cannot be combined with design names",
                             field="designs")
        design = resolve_design(name, catalog)
        if design in chosen:
            raise InputError(f"design '{name}' is listed twice", field="designs")
        chosen.append(design)
    return tuple(chosen)


def parse_budget(options: dict[str, Any], catalog: Catalog) -> Budget | None:
    given = [k for k in ("power_budget_kw", "cost_budget_per_hour", "budget_like")
             if options.get(k) is not None]
    if len(given) > 1:
        raise InputError("give one budget: " + " or ".join(f"--{k.replace('_', '-')}"
                                                          for k in given), field=given[1])
    if not given:
        return None
    if given[0] == "power_budget_kw":
        return Budget("power", options["power_budget_kw"])
    if given[0] == "cost_budget_per_hour":
        return Budget("cost", options["cost_budget_per_hour"])
    return budget_like(options["budget_like"], catalog)


def budget_like(text: str, catalog: Catalog) -> Budget:
    """`[power:|cost:]SKU:N`: the provisioned power (default) or hourly cost of N machines."""
    parts = text.split(":")
    kind = "power"
    if len(parts) == 3 and parts[0] in ("power", "cost"):
        kind, parts = parts[0], parts[1:]
    if len(parts) != 2 or not parts[1].isdigit() or int(parts[1]) < 1:
        raise InputError(f"--budget-like must be [power:|cost:]SKU:N with N >= 1, got {text!r}",
                         field="budget_like")
    machine, count = catalog.machine(parts[0]), int(parts[1])
    per_machine = machine.power_kw if kind == "power" else machine.cost_per_hour
    return Budget(kind, float(f"{count * per_machine:.10g}"), like=f"{machine.name}:{count}")


# --------------------------------------------------------------------------------- running
def inputs_echo(plan: SearchPlan) -> dict:
    """The report's inputs: everything needed to re-derive the optimum, no machine paths."""
    from simcore import SimOptions
    ev = plan.evaluator
    skus = dict.fromkeys(s for d in plan.designs for s in (d.prompt_sku, d.token_sku) if s)
    goal = plan.goal
    return {
        "model": plan.catalog.model(ev.model).as_dict(),
        "workload": ev.workload.identity(),
        "duration_s": ev.duration_s, "seed": ev.seed,
        "slo_profile": ev.slo.as_dict(),
        "perf_model": ev.perf.identity(),
        "goal": {"name": goal.name, "paper_name": goal.paper_name, "rate_rps": goal.rate_rps,
                 "budget": goal.budget.as_dict() if goal.budget else None},
        "constraints": plan.constraints.as_dict(),
        "search": plan.settings.as_dict(),
        "designs": [d.as_dict() for d in plan.designs],
        "catalog": {"machines": {s: plan.catalog.machine(s).as_dict() for s in skus}},
        "sim_options": asdict(ev.options or SimOptions()),
    }


def versions() -> dict:
    from provisioner import __version__
    from simcore import SIMULATOR_VERSION
    from simcore.perfmodel import PERF_MODEL_VERSION
    return {"provision": __version__, "simulator": SIMULATOR_VERSION,
            "perf_model": PERF_MODEL_VERSION}


@dataclass
class SearchRun:
    document: dict
    results: list[DesignResult]
    stats: RunStats


def run_plan(plan: SearchPlan,
             on_batch: Callable[[dict[str, int]], None] | None = None) -> SearchRun:
    from provisioner.reports import report_document
    cache = DiskCache(plan.cache_dir) if plan.cache_dir is not None else None
    with Runner(plan.evaluator, plan.jobs, plan.backend, plan.address, cache) as runner:
        results = search_designs(plan.designs, plan.goal, plan.constraints, plan.settings,
                                 runner, on_batch)
    document = report_document(inputs_echo(plan), results, versions())
    return SearchRun(document, results, runner.stats)


__all__ = ["SearchPlan", "SearchRun", "read_spec", "merge_options", "plan_search", "run_plan",
           "inputs_echo", "budget_like", "WorkloadSource", "PerfSource"]
