"""`provision check REPORT.json`: re-derive the optimum from the inputs the report echoes and say
whether it moved.

The report fixes the *question* (model, workload, SLO profile, goal, budget, constraints, window,
seed, designs); the *answer machinery* is taken as it is now: the current catalog (so an edited
price or power figure shows up), simulator and performance model. A budget stated as "the power
of N machines of SKU" is recomputed from the current catalog. The optimum has moved when any
design's feasibility, machine counts, rate, cost, power or GPUs differ.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hardware_catalog import Design, InputError, load_catalog
from provisioner.config import SearchPlan, SearchRun, budget_like, run_plan
from provisioner.evaluate import (PerfSource, SimulationEvaluator, WorkloadSource, file_sha256,
                                  perf_source, workload_source)
from provisioner.reports import SCHEMA, SCHEMA_VERSION
from provisioner.search import Budget, Constraints, Goal, SearchSettings

COMPARED = ("feasible", "machines", "prompt_machines", "token_machines", "rate_rps",
            "cost_per_hour", "power_kw", "gpus")


@dataclass
class CheckResult:
    changes: list[tuple[str, str, Any, Any]]       # (design, field, old, new)
    notes: list[str] = field(default_factory=list)  # inputs that changed since the report
    run: SearchRun | None = None

    @property
    def unchanged(self) -> bool:
        return not self.changes

    def as_dict(self) -> dict:
        return {"unchanged": self.unchanged,
                "changes": [{"design": d, "field": f, "old": o, "new": n}
                            for d, f, o, n in self.changes],
                "notes": self.notes}


def read_report(path: str | Path) -> dict:
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except OSError as err:
        raise InputError(f"cannot read report: {err.strerror}", source=str(path)) from None
    except ValueError as err:
        raise InputError(f"broken JSON: {err}", source=str(path)) from None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise InputError(f"not a provision search report (schema '{SCHEMA}' expected)",
                         source=str(path), field="schema")
    if document.get("schema_version") != SCHEMA_VERSION:
        raise InputError(f"schema version {document.get('schema_version')!r} is not supported "
                         f"(this provision reads version {SCHEMA_VERSION})", source=str(path),
                         field="schema_version")
    return document


def plan_from_report(document: dict, report_path: Path, *, catalog_dir: str | None = None,
                     jobs: int = 1, backend: str = "loky", address: str | None = None,
                     cache_dir: Path | None = None) -> tuple[SearchPlan, list[str]]:
    """The search plan the report describes, on the current catalog; plus notes on inputs
    (catalog entries, workload or perf model files) that changed since."""
    source = str(report_path)
    try:
        inputs = document["inputs"]
        designs = tuple(Design(d["name"], d["prompt_sku"], d["token_sku"], d["mixed_pool"])
                        for d in inputs["designs"])
        catalog = load_catalog(catalog_dir)
        catalog = catalog.with_designs({d.name: d for d in designs})
        notes = catalog_notes(inputs["catalog"]["machines"], catalog)
        workload, note = _workload(inputs["workload"], report_path.parent)
        notes += note
        perf, note = _perf(inputs["perf_model"], report_path.parent)
        notes += note
        goal_echo = inputs["goal"]
        budget = _budget(goal_echo["budget"], catalog, notes)
        goal = Goal(goal_echo["name"], goal_echo["rate_rps"], budget)
        from slo_profiles import parse_slo_profile
        profile_echo = inputs["slo_profile"]
        profile = parse_slo_profile(profile_echo["name"], {
            "kind": profile_echo["kind"], "limits": profile_echo["limits"],
            "description": profile_echo["description"]}, f"{source} inputs.slo_profile")
        search = inputs["search"]
        settings = SearchSettings(exhaustive=search["exhaustive"],
                                  search_limit=search["search_limit"],
                                  rate_tolerance=search["rate_tolerance"],
                                  start_rate=search["start_rate"],
                                  load_sweep=tuple(search["load_sweep"]))
        model = catalog.model(inputs["model"]["name"])
        if model.as_dict() != inputs["model"]:
            notes.append(f"model {model.name} record changed since the report")
        evaluator = SimulationEvaluator(catalog, model.name, workload, inputs["duration_s"],
                                        inputs["seed"], profile, perf)
        constraints = Constraints(**inputs["constraints"])
    except (KeyError, TypeError) as err:
        raise InputError(f"report inputs incomplete or malformed ({err!r})", source=source,
                         field="inputs") from None
    plan = SearchPlan(catalog, designs, goal, constraints, settings, evaluator,
                      out=report_path.parent, jobs=jobs, backend=backend, address=address,
                      cache_dir=cache_dir)
    return plan, notes


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


def _budget(echo: dict | None, catalog, notes: list[str]) -> Budget | None:
    if echo is None:
        return None
    if not echo.get("like"):
        return Budget(echo["kind"], echo["value"])
    budget = budget_like(f"{echo['kind']}:{echo['like']}", catalog)
    if budget.value != echo["value"]:
        notes.append(f"budget ({echo['kind']} of {echo['like']}): {echo['value']} -> "
                     f"{budget.value} {echo['unit']}")
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


def check_report(path: str | Path, *, catalog_dir: str | None = None, jobs: int = 1,
                 backend: str = "loky", address: str | None = None,
                 cache_dir: Path | None = None, on_batch=None) -> CheckResult:
    path = Path(path)
    old = read_report(path)
    plan, notes = plan_from_report(old, path, catalog_dir=catalog_dir, jobs=jobs,
                                   backend=backend, address=address, cache_dir=cache_dir)
    run = run_plan(plan, on_batch)
    for key, value in old.get("versions", {}).items():
        now = run.document["versions"].get(key)
        if now != value:
            notes.append(f"{key} version: {value} -> {now}")
    return CheckResult(optimum_changes(old, run.document), notes, run)
