"""`provision check REPORT.json`: re-derive the optimum from the inputs the report echoes and say
whether it moved.

The report fixes the *question* (its `inputs.options`, read back by
`provisioner.question.from_echo` through the command line's checks); the *answer machinery* is
taken as it is now: the current catalog (so an edited price or power figure shows up), simulator
and performance model. A budget stated as "the power of N machines of SKU" is recomputed from
the current catalog. The notes list what the question's names resolve to now and did not then;
the optimum has moved when any design's feasibility, machine counts, rate, cost, power or GPUs
differ.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hardware_catalog import InputError, read_json
from provisioner.api import SearchResult, run_study
from provisioner.options import Execution
from provisioner.question import changed_inputs, from_echo
from provisioner.reports import SCHEMA, SCHEMA_VERSION
from provisioner.tables import layout_label

COMPARED = ("feasible", "machines", "prompt_machines", "token_machines", "rate_rps",
            "cost_per_hour", "power_kw", "gpus", "layout")   # a changed layout is a changed optimum


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
            for key in COMPARED[1:-1]:
                shape.get(optimum, key, float, f"{where}.optimum", optional=True)
            layout = shape.get(optimum, "layout", dict, f"{where}.optimum", optional=True)
            for pool, entry in (layout or {}).items():
                for key in ("tp", "pp", "instances_per_machine"):
                    shape.get(entry, key, int, f"{where}.optimum.layout.{pool}")


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


def plan_changes(old: dict, new: dict) -> list[tuple[str, str, Any, Any]]:
    """--load-curve: (design, field, old, new) where a design's static pools, or its plan at
    some window (the first that moved), or its plan's verdict over the whole curve moved."""
    before = (old.get("load_curve") or {}).get("designs") or {}
    after = (new.get("load_curve") or {}).get("designs") or {}
    changes = []
    for name, entry in before.items():
        other = after.get(name) or {}
        if entry.get("static") != other.get("static"):
            changes.append((name, "load_curve.static", entry.get("static"), other.get("static")))
        plans = entry.get("plan") or [], other.get("plan") or []
        moved = next((k for k, (a, b) in enumerate(zip(*plans)) if a != b), None)
        if moved is None and len(plans[0]) != len(plans[1]):
            moved = min(map(len, plans))
        if moved is not None:
            changes.append((name, f"load_curve.plan at window {moved}",
                            _at(plans[0], moved), _at(plans[1], moved)))
        met = [((e.get("whole_curve") or {}).get("plan") or {}).get("windows_met")
               for e in (entry, other)]
        if met[0] != met[1]:
            changes.append((name, "load_curve.whole_curve.plan.windows_met", *met))
    return changes


def _at(values: list, index: int):
    return values[index] if index < len(values) else None


def _flat(entry: dict) -> dict:
    optimum = entry["optimum"] or {}
    return {"feasible": entry["feasible"], **optimum,
            "layout": layout_label(optimum.get("layout"))}


def check_report(path: str | Path, execution: Execution = Execution(), *,
                 catalog_dir: str | None = None, on_batch=None) -> CheckResult:
    """Read the report, re-run the question it echoes, diff the answers."""
    path = Path(path)
    old = read_report(path)
    study = from_echo(old["inputs"], str(path), path.parent, catalog_dir)
    run = run_study(study, execution, on_batch)
    new = run.to_dict()
    notes = changed_inputs(old["inputs"], new["inputs"])
    for key, value in old.get("versions", {}).items():
        now = new["versions"].get(key)
        if now != value:
            notes.append(f"{key} version: {value} -> {now}")
    changes = optimum_changes(old, new) + plan_changes(old, new)
    before, after = old.get("summary", {}).get("best_design"), new["summary"]["best_design"]
    if before != after:
        changes.insert(0, ("(summary)", "best_design", before, after))
    return CheckResult(changes, notes, run, new)
