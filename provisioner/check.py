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

from hardware_catalog import Catalog, Design, InputError
from provisioner.api import (SLO_REFERENCE_SKU, SearchResult, budget_like, resolve_catalog,
                             run_study)
from provisioner.files import file_sha256
from provisioner.options import Constraints, Execution, SearchSettings, from_echo
from provisioner.reports import SCHEMA, SCHEMA_VERSION
from provisioner.study import (Budget, Goal, PerfSource, Study, WorkloadSource, perf_source,
                               workload_source)
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


def study_from_report(document: dict, report_path: Path, *,
                      catalog_dir: str | None = None) -> tuple[Study, list[str]]:
    """The study the report describes, on the current catalog; plus notes on inputs (catalog
    entries, workload or perf model files, budgets) that changed since."""
    source = str(report_path)
    try:
        inputs = document["inputs"]
        catalog = resolve_catalog(catalog_dir)
        notes = catalog_notes(inputs["catalog"]["machines"], catalog)
        designs = tuple(_design(d, catalog) for d in inputs["designs"])
        workload, note = _workload(inputs["workload"], report_path.parent)
        notes += note
        perf, note = _perf(inputs["perf_model"], report_path.parent)
        notes += note
        goal_echo = inputs["goal"]
        goal = Goal(goal_echo["name"], goal_echo["rate_rps"],
                    _budget(goal_echo["budget"], catalog, notes))
        profile_echo = inputs["slo_profile"]
        profile = parse_slo_profile(profile_echo["name"], {
            "kind": profile_echo["kind"], "limits": profile_echo["limits"],
            "description": profile_echo["description"]}, f"{source} inputs.slo_profile")
        model = catalog.model(inputs["model"]["name"])
        if model.as_dict() != inputs["model"]:
            notes.append(f"model {model.name} record changed since the report")
        study = Study(catalog=catalog, model=model, workload=workload,
                      duration_s=inputs["duration_s"], seed=inputs["seed"], slo=profile,
                      perf=perf, reference=catalog.machine(SLO_REFERENCE_SKU), designs=designs,
                      goal=goal, constraints=from_echo(Constraints, inputs["constraints"], source),
                      settings=from_echo(SearchSettings, inputs["search"], source))
    except (KeyError, TypeError, AttributeError) as err:
        raise InputError(f"report inputs incomplete or malformed ({err!r})", source=source,
                         field="inputs") from None
    return study, notes


def _design(echo: dict, catalog: Catalog) -> Design:
    token = catalog.machine(echo["token_sku"]) if echo["token_sku"] is not None else None
    return Design(echo["name"], catalog.machine(echo["prompt_sku"]), token,
                  echo["mixed_pool"])


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
