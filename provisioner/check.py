"""`provision check REPORT.json`: re-derive the optimum from the inputs the report echoes and say
whether it moved.

The report fixes the *question* (model, workload, SLO profile, goal, budget, constraints, window,
seed, designs); the *answer machinery* is taken as it is now: the current catalog (so an edited
price or power figure shows up), simulator and performance model. A budget stated as "the power
of N machines of SKU" is recomputed from the current catalog. The optimum has moved when any
design's feasibility, machine counts, rate, cost, power or GPUs differ.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from hardware_catalog import Catalog, Design, InputError, read_json
from provisioner.api import (SLO_REFERENCE_SKU, SearchResult, budget_like, resolve_catalog,
                             run_study)
from provisioner.files import file_sha256
from provisioner.options import (Constraints, Execution, SearchOptions, SearchSettings,
                                 check_value, from_echo, option_fields)
from provisioner.presets import preset_catalog, preset_perf
from provisioner.reports import SCHEMA, SCHEMA_VERSION
from simcore import SimOptions
from provisioner.study import (Budget, Goal, PerfSource, Study, WorkloadSource, perf_source,
                               workload_source)
from simcore.workload import check_request_count
from slo_profiles import parse_slo_profile

COMPARED = ("feasible", "machines", "prompt_machines", "token_machines", "rate_rps",
            "cost_per_hour", "power_kw", "gpus")


@dataclass
class CheckResult:
    changes: list[tuple[str, str, Any, Any]]       # (design, field, old, new)
    notes: list[str] = field(default_factory=list)  # inputs that changed since the report
    run: SearchResult | None = None
    document: dict | None = None   # the re-derived report

    @property
    def unchanged(self) -> bool:
        return not self.changes

    def lines(self) -> list[str]:
        """The verdict for the terminal: changed inputs, then what moved, then a summary."""
        lines = [f"[yellow]input changed:[/] {note}" for note in self.notes]
        for design, key, old, new in self.changes:
            if key == "best_design":
                lines.append(f"[bold red]best design changed:[/] {old} -> {new}")
            else:
                lines.append(f"[red]moved:[/] {design} {key}: {old} -> {new}")
        designs = len(self.document["designs"]) if self.document else 0
        plural = "s" if designs != 1 else ""
        lines.append(f"optimum unchanged for {designs} design{plural}" if self.unchanged else
                     f"[bold red]optimum moved[/] ({len(self.changes)} changes)")
        return lines

    def as_dict(self) -> dict:
        return {"unchanged": self.unchanged,
                "changes": [{"design": d, "field": f, "old": o, "new": n}
                            for d, f, o, n in self.changes],
                "notes": self.notes}


def read_report(path: str | Path) -> dict:
    """A report.json, with the parts `check` reads validated: a hand-edited or truncated report
    is bad input (exit 2, naming the file and the key), never a KeyError."""
    path = Path(path)
    document = read_json(path)
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise InputError(f"not a provision search report (schema '{SCHEMA}' expected); give a "
                         "report.json written by provision search", source=str(path),
                         field="schema")
    if document.get("schema_version") != SCHEMA_VERSION:
        raise InputError(f"schema version {document.get('schema_version')!r} is not supported "
                         f"(this provision reads version {SCHEMA_VERSION}); re-run the search",
                         source=str(path), field="schema_version")
    _validate_answers(document, str(path))
    return document


class _Shape:
    """Typed access to a JSON document: a wrong or missing key names its dotted path."""

    def __init__(self, source: str):
        self.source = source

    def get(self, data: Any, key: str, kind, where: str, *, optional: bool = False) -> Any:
        if not isinstance(data, dict):
            raise self.fail(where, "must be a mapping")
        name = f"{where}.{key}" if where else key
        if key not in data:
            if optional:
                return None
            raise self.fail(name, "missing")
        return self.value(data[key], kind, name, optional=optional)

    def value(self, value: Any, kind, name: str, *, optional: bool = False) -> Any:
        if value is None and optional:
            return None
        if kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and \
                math.isfinite(value)
        elif kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, kind)
        if not ok:
            what = {float: "a finite number", int: "a whole number", str: "a string",
                    bool: "true or false", dict: "a mapping", list: "a list"}.get(kind, "valid")
            raise self.fail(name, f"must be {what}, got {_shown(value)}")
        return value

    def fail(self, name: str, message: str) -> InputError:
        return InputError(f"{message}; the report was edited or damaged: re-run the search",
                          source=self.source, field=name)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _validate_answers(document: dict, source: str) -> None:
    """The answers `check` compares with: designs[].{design, feasible, optimum.*}, summary."""
    shape = _Shape(source)
    for key in ("inputs", "summary"):
        shape.get(document, key, dict, "")
    shape.get(document, "versions", dict, "", optional=True)
    shape.get(document["summary"], "best_design", str, "summary", optional=True)
    designs = shape.get(document, "designs", list, "")
    seen = set()
    for i, entry in enumerate(designs):
        where = f"designs[{i}]"
        name = shape.get(entry, "design", str, where)
        if name in seen:
            raise shape.fail(f"{where}.design", f"design '{name}' is listed twice")
        seen.add(name)
        shape.get(entry, "feasible", bool, where)
        if "optimum" not in entry:   # present, null when infeasible
            raise shape.fail(f"{where}.optimum", "missing")
        optimum = shape.get(entry, "optimum", dict, where, optional=True)
        if optimum is not None:
            for key in COMPARED[1:]:
                shape.get(optimum, key, float, f"{where}.optimum", optional=True)


def study_from_report(document: dict, report_path: Path, *,
                      catalog_dir: str | None = None) -> tuple[Study, list[str]]:
    """The study the report describes, on the current catalog; plus notes on inputs (catalog
    entries, workload or perf model files, budgets) that changed since."""
    source = str(report_path)
    shape = _Shape(source)
    try:
        inputs = shape.get(document, "inputs", dict, "")
        preset = _option(SearchOptions, "assumptions", inputs.get("assumptions", "provision"),
                         source)
        catalog = preset_catalog(preset, resolve_catalog(catalog_dir))
        machines = shape.get(shape.get(inputs, "catalog", dict, "inputs"), "machines", dict,
                             "inputs.catalog")
        for sku, entry in machines.items():
            shape.value(entry, dict, f"inputs.catalog.machines.{sku}")
        notes = catalog_notes(machines, catalog)
        design_echoes = shape.get(inputs, "designs", list, "inputs")
        if not design_echoes:
            raise shape.fail("inputs.designs", "must list at least one design")
        designs = tuple(_design(shape, d, f"inputs.designs[{i}]", catalog)
                        for i, d in enumerate(design_echoes))
        workload_echo = shape.get(inputs, "workload", dict, "inputs")
        for key in ("name", "kind", "sha256"):
            shape.get(workload_echo, key, str, "inputs.workload")
        workload, note = _workload(workload_echo, report_path.parent)
        notes += note
        perf_echo = shape.get(inputs, "perf_model", dict, "inputs")
        shape.get(perf_echo, "name", str, "inputs.perf_model")
        shape.get(perf_echo, "sha256", str, "inputs.perf_model", optional=True)
        perf, note = _perf(perf_echo, report_path.parent)
        perf = preset_perf(preset, perf)
        notes += note
        goal_echo = shape.get(inputs, "goal", dict, "inputs")
        goal_name = _option(SearchOptions, "goal", shape.get(goal_echo, "name", str,
                                                             "inputs.goal"), source)
        rate = _option(SearchOptions, "rate", shape.get(goal_echo, "rate_rps", float,
                                                        "inputs.goal", optional=True), source)
        goal = Goal(goal_name, rate, _budget(shape, goal_echo, catalog, notes))
        if goal_name != "max-rate" and rate is None and workload.kind == "builtin":
            raise shape.fail("inputs.goal.rate_rps", "missing: a built-in workload is "
                                                    "searched at a rate")
        profile_echo = shape.get(inputs, "slo_profile", dict, "inputs")
        profile = parse_slo_profile(
            str(shape.get(profile_echo, "name", str, "inputs.slo_profile")), {
                "kind": shape.get(profile_echo, "kind", str, "inputs.slo_profile"),
                "limits": shape.get(profile_echo, "limits", dict, "inputs.slo_profile"),
                "description": profile_echo.get("description", "")},
            f"{source} inputs.slo_profile")
        model_echo = shape.get(inputs, "model", dict, "inputs")
        model = catalog.model(shape.get(model_echo, "name", str, "inputs.model"))
        if model.as_dict() != model_echo:
            notes.append(f"model {model.name} record changed since the report")
        duration = _option(SearchOptions, "duration",
                           shape.get(inputs, "duration_s", float, "inputs"), source)
        seed = _option(SearchOptions, "seed", shape.get(inputs, "seed", int, "inputs"), source)
        study = Study(catalog=catalog, model=model, workload=workload,
                      duration_s=duration, seed=seed, slo=profile,
                      perf=perf, reference=catalog.machine(SLO_REFERENCE_SKU), designs=designs,
                      goal=goal,
                      constraints=from_echo(Constraints, shape.get(inputs, "constraints", dict,
                                                                   "inputs"), source),
                      settings=from_echo(SearchSettings, shape.get(inputs, "search", dict,
                                                                   "inputs"), source),
                      chunk_tokens=_chunk_tokens(shape.get(inputs, "chunk_tokens", object,
                                                           "inputs", optional=True), source),
                      sim_options=_sim_options(shape.get(inputs, "sim_options", dict, "inputs"),
                                               source),
                      assumptions=preset,
                      survive_failures=_option(SearchOptions, "survive_failures",
                                               inputs.get("survive_failures"), source) or 0)
    except (KeyError, TypeError, AttributeError, IndexError) as err:
        raise InputError(f"report inputs incomplete or malformed ({err!r}); re-run the search",
                         source=source, field="inputs") from None
    except InputError as err:  # a name the report echoes is unknown now: say which report
        if source in str(err):
            raise
        raise InputError(str(err), source=source) from None
    if goal.rate_rps is not None:
        check_request_count(goal.rate_rps, duration)
    return study, notes


def _option(tree: type, name: str, value: Any, source: str) -> Any:
    """A value echoed in the report, checked like the option it came from."""
    return check_value(option_fields(tree)[name], value, name, source=source)


def _sim_options(echo: dict, source: str) -> SimOptions:
    """The simulation options the report ran with (the slowdown reference is not one)."""
    known = {f.name for f in fields(SimOptions)}
    try:
        values = {k: v for k, v in echo.items() if k in known}
        if "failures" in values:  # JSON lists back to the schedule's rows
            values["failures"] = tuple(tuple(row) for row in values["failures"])
        return SimOptions(**values)
    except (TypeError, ValueError) as err:
        raise InputError(f"malformed simulation options ({err}); re-run the search",
                         source=source, field="inputs.sim_options") from None


def _design(shape: _Shape, echo: Any, where: str, catalog: Catalog) -> Design:
    name = shape.get(echo, "name", str, where)
    token_sku = shape.get(echo, "token_sku", str, where, optional=True)
    token = catalog.machine(token_sku) if token_sku is not None else None
    return Design(name, catalog.machine(shape.get(echo, "prompt_sku", str, where)), token,
                  shape.get(echo, "mixed_pool", bool, where),
                  shape.get(echo, "prefill", str, where, optional=True) or "whole",
                  shape.get(echo, "chunk_tokens", int, where, optional=True))


def _chunk_tokens(value: Any, source: str):
    """The echoed --chunk-tokens (absent when it was not given), checked like a spec's."""
    from provisioner.options import check_value, option_fields
    return check_value(option_fields(SearchOptions)["chunk_tokens"], value, "chunk_tokens",
                       source=source)


def catalog_notes(echoed: dict, catalog) -> list[str]:
    notes = []
    for sku, old in echoed.items():
        if sku not in catalog.machines:
            raise InputError(f"machine SKU '{sku}' used by the report is no longer in the catalog")
        new = catalog.machine(sku).as_dict()
        for key in old:
            if new.get(key) != old[key]:
                notes.append(f"catalog {sku} {key}: {old[key]} -> {new.get(key)}")
    return notes


def _workload(echo: dict, report_dir: Path) -> tuple[WorkloadSource, list[str]]:
    source = workload_source(echo["name"], base_dir=report_dir)
    if source.kind != echo["kind"]:
        raise InputError(f"workload '{echo['name']}' was a {echo['kind']} workload and is now "
                         f"a {source.kind} one")
    note = [] if source.sha256 == echo["sha256"] else [
        f"workload {echo['name']} content changed since the report"]
    return source, note


def _perf(echo: dict, report_dir: Path) -> tuple[PerfSource, list[str]]:
    if echo["sha256"] is None:
        return PerfSource(), []
    source = perf_source(echo["name"], base_dir=report_dir)
    note = [] if file_sha256(source.path) == echo["sha256"] else [
        f"performance model file {echo['name']} changed since the report"]
    return source, note


def _budget(shape: _Shape, goal_echo: dict, catalog, notes: list[str]) -> Budget | None:
    echo = shape.get(goal_echo, "budget", dict, "inputs.goal", optional=True)
    if echo is None:
        return None
    kind = shape.get(echo, "kind", str, "inputs.goal.budget")
    if kind not in ("power", "cost"):
        raise shape.fail("inputs.goal.budget.kind", f"must be power or cost, got {kind!r}")
    value = shape.get(echo, "value", float, "inputs.goal.budget")
    like = shape.get(echo, "like", str, "inputs.goal.budget", optional=True)
    if not like:
        return Budget(kind, _option(SearchOptions, "power_budget_kw", value, shape.source))
    budget = budget_like(f"{kind}:{like}", catalog)
    if budget.value != value:
        notes.append(f"budget ({kind} of {like}): {value} -> "
                     f"{budget.value} {echo.get('unit', '')}".rstrip())
    return budget


def optimum_changes(old: dict, new: dict) -> list[tuple[str, str, Any, Any]]:
    """(design, field, old, new) for every compared field that differs."""
    changes = []
    old_designs = {d["design"]: d for d in old["designs"]}
    new_designs = {d["design"]: d for d in new["designs"]}
    for name in list(old_designs) + [n for n in new_designs if n not in old_designs]:
        before, after = old_designs.get(name), new_designs.get(name)
        if before is None or after is None:
            changes.append((name, "design", "present" if before else "absent",
                            "present" if after else "absent"))
            continue
        flat_before, flat_after = _flat(before), _flat(after)
        for key in COMPARED:
            if flat_before.get(key) != flat_after.get(key):
                changes.append((name, key, flat_before.get(key), flat_after.get(key)))
    return changes


def _flat(entry: dict) -> dict:
    return {"feasible": entry["feasible"], **(entry["optimum"] or {})}


def check_report(path: str | Path, execution: Execution = Execution(), *,
                 catalog_dir: str | None = None, on_batch=None) -> CheckResult:
    path = Path(path)
    old = read_report(path)
    study, notes = study_from_report(old, path, catalog_dir=catalog_dir)
    run = run_study(study, execution, on_batch)
    new = run.to_dict()
    for key, value in old.get("versions", {}).items():
        now = new["versions"].get(key)
        if now != value:
            notes.append(f"{key} version: {value} -> {now}")
    changes = optimum_changes(old, new)
    before, after = old.get("summary", {}).get("best_design"), new["summary"]["best_design"]
    if before != after:
        changes.insert(0, ("(summary)", "best_design", before, after))
    return CheckResult(changes, notes, run, new)
