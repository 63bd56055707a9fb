"""`provision check REPORT.json`: re-derive the report from the inputs it echoes and say
whether any of it moved.

The report fixes the *question* (its `inputs.options`, read back by
`provisioner.question.from_echo` through the command line's checks); the *answer machinery* is
taken as it is now: the current catalog (so an edited price or power figure shows up), simulator
and performance model. A budget stated as "the power of N machines of SKU" is recomputed from
the current catalog. The notes list what the question's names resolve to now and did not then.

Every section the report carries is compared with the re-derived report (everything but
`schema`, `versions` and `inputs`, whose differences are notes): the optimum per design first
(feasibility, machine counts, rate, cost, power, GPUs, layout), a load curve's static pools and
plan, then every other value, each named by its path. A section the question implies (a load
curve's windows and its plan per design, `--sensitivity`'s table, a hardware search's summary,
`--survive-failures auto`'s choice) that the report lacks is bad input, refused before any
simulation: a report cannot pass by leaving out what it was asked to compute.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hardware_catalog import InputError, read_json
from provisioner.api import SearchResult, run_study
from provisioner.options import Execution
from provisioner.question import changed_inputs, from_echo
from provisioner.reports import SCHEMA, SCHEMA_VERSION, json_text
from provisioner.tables import layout_label

COMPARED = ("feasible", "machines", "prompt_machines", "token_machines", "rate_rps",
            "cost_per_hour", "power_kw", "gpus", "layout")   # a changed layout is a changed optimum
NOT_SECTIONS = ("schema", "schema_version", "versions", "inputs")   # checked, or notes
SHOWN_CHANGES = 40   # the terminal lists this many changes (--json: all of them)


@dataclass
class CheckResult:
    changes: list[tuple[str, str, Any, Any]]       # (design, field, old, new): the answers
    notes: list[str] = field(default_factory=list)  # inputs that changed since the report
    run: SearchResult | None = None
    document: dict | None = None   # the re-derived report
    # every other value of the report's sections that differs: (design or section, path, ...)
    details: list[tuple[str, str, Any, Any]] = field(default_factory=list)

    @property
    def unchanged(self) -> bool:
        return not self.changes and not self.details

    def lines(self) -> list[str]:
        """The verdict for the terminal: changed inputs, then what moved, then a summary."""
        lines = [f"[yellow]input changed:[/] {note}" for note in self.notes]
        for design, key, old, new in self.changes:
            if key == "best_design":
                lines.append(f"[bold red]best design changed:[/] {old} -> {new}")
            else:
                lines.append(f"[red]moved:[/] {design} {key}: {old} -> {new}")
        for design, key, old, new in self.details[:SHOWN_CHANGES]:
            owner = "" if design.startswith("(") else f"{design} "   # a section: in the key
            lines.append(f"[red]differs:[/] {owner}{key}: {_text(old)} -> {_text(new)}")
        if len(self.details) > SHOWN_CHANGES:
            lines.append(f"... and {len(self.details) - SHOWN_CHANGES} more differences "
                         "(provision check --json lists them all)")
        designs = len(self.document["designs"]) if self.document else 0
        plural = "s" if designs != 1 else ""
        if self.unchanged:
            sections = ", ".join(k for k in (self.document or {}) if k not in NOT_SECTIONS)
            lines.append(f"optimum unchanged for {designs} design{plural} (every section "
                         f"re-derived: {sections})")
        elif self.changes:
            more = f", {len(self.details)} other differences" if self.details else ""
            lines.append(f"[bold red]optimum moved[/] ({len(self.changes)} changes{more})")
        else:
            lines.append(f"[bold red]report differs from its re-derivation[/] "
                         f"({len(self.details)} differences; the optimum did not move)")
        return lines

    def as_dict(self) -> dict:
        return {"unchanged": self.unchanged,
                "changes": [{"design": d, "field": f, "old": o, "new": n}
                            for d, f, o, n in self.changes + self.details],
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

    def get(self, data: Any, key: str, kind, where: str, *, optional: bool = False,
            why: str | None = None) -> Any:
        """data[key] checked as `kind`; `why`: the search option that implies the key."""
        if not isinstance(data, dict):
            raise self.fail(where, "must be a mapping")
        name = f"{where}.{key}" if where else key
        if key not in data:
            if optional:
                return None
            raise self.fail(name, f"missing, though the report's own inputs ({why}) imply it"
                            if why else "missing")
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


def _text(value: Any) -> str:
    """A compared value for the terminal: "absent" as it is, a list of records by its
    length, anything else shortened."""
    if value == "absent":
        return value
    if isinstance(value, list) and value and isinstance(value[0], (dict, list)):
        return f"[{len(value)} item{'s' if len(value) != 1 else ''}]"
    return _shown(value)


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


def implied_sections(document: dict, study, source: str) -> None:
    """Refuse (InputError naming the key) a report that lacks a section its own question
    implies: `--load-curve` its windows and a plan entry for every design it lists,
    `--sensitivity` its table, `--hardware` the hardware summary, `--survive-failures auto`
    the choice of k. Checked before anything is simulated; the values are compared after."""
    shape = _Shape(source)
    if study.load_curve is not None:
        curve = shape.get(document, "load_curve", dict, "", why="--load-curve")
        shape.get(curve, "windows", list, "load_curve", why="--load-curve")
        plans = shape.get(curve, "designs", dict, "load_curve", why="--load-curve")
        listed = [entry["design"] for entry in document["designs"]]
        for name in listed + [n for n in plans if n not in listed]:
            where = f"load_curve.designs.{name}"
            plan = shape.get(plans, name, dict, "load_curve.designs",
                             why=f"--load-curve and the design {name}")
            if shape.get(plan, "feasible", bool, where):
                shape.get(plan, "static", list, where)
                shape.get(plan, "plan", list, where)
            whole = shape.get(plan, "whole_curve", dict, where, optional=True)
            if whole is not None:
                for key in ("static", "plan"):
                    shape.get(whole, key, dict, f"{where}.whole_curve", optional=True)
    if study.settings.sensitivity:
        shape.get(document, "sensitivity", list, "", why="--sensitivity")
    if study.hardware:
        shape.get(document["summary"], "hardware", dict, "summary", why="--hardware")
    if study.survive_auto:
        shape.get(document["summary"], "survive_failures_auto", dict, "summary",
                  why="--survive-failures auto")


def section_changes(old: dict, new: dict) -> list[tuple[str, str, Any, Any]]:
    """Every value of every section (all but `schema`, `versions` and `inputs`) that differs
    between the report and its re-derivation, as (design or section, path, old, new); a
    design's values are matched by its name, and the answers `optimum_changes`,
    `plan_changes` and the best design already name are left out."""
    changes: list[tuple[str, str, Any, Any]] = []
    for key in list(old) + [k for k in new if k not in old]:
        if key in NOT_SECTIONS:
            continue
        if key == "designs" and isinstance(old.get(key), list):
            before = {d.get("design"): d for d in old[key] if isinstance(d, dict)}
            after = {d["design"]: d for d in new[key]}
            for name in before.keys() & after.keys():   # one absent: optimum_changes says so
                for path, a, b in _diff(before[name], after[name], ""):
                    if not _answer(path):
                        changes.append((name, path, a, b))
            continue
        for path, a, b in _diff(old.get(key, _ABSENT), new.get(key, _ABSENT), key):
            design, path = _owner(path)
            if not _planned(path):
                changes.append((design, path, a, b))
    return [(d, p, _value(a), _value(b)) for d, p, a, b in changes]


_ABSENT = object()


def _diff(old: Any, new: Any, path: str):
    """(path, old, new) for each differing leaf; a list of another length differs whole."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in list(old) + [k for k in new if k not in old]:
            yield from _diff(old.get(key, _ABSENT), new.get(key, _ABSENT),
                             f"{path}.{key}" if path else str(key))
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            yield from _diff(a, b, f"{path}[{i}]")
    elif old is _ABSENT or new is _ABSENT or type(old) is not type(new) or old != new:
        if not (isinstance(old, (int, float)) and isinstance(new, (int, float))
                and not isinstance(old, bool) and not isinstance(new, bool) and old == new):
            yield path, old, new


def _value(value: Any) -> Any:
    return "absent" if value is _ABSENT else value


def _answer(path: str) -> bool:
    """A design's value `optimum_changes` compares (its feasibility, its optimum's pools, rate,
    cost, power, GPUs, layout)."""
    if path in ("feasible", "design", "optimum"):
        return True
    head, _, rest = path.partition(".")
    return head == "optimum" and rest.split(".")[0].split("[")[0] in COMPARED


def _owner(path: str) -> tuple[str, str]:
    """load_curve.designs.NAME.rest belongs to the design NAME (as `load_curve.rest`); any
    other path to its section, in parentheses."""
    parts = path.split(".")
    if len(parts) >= 3 and parts[:2] == ["load_curve", "designs"]:
        return parts[2], ".".join(["load_curve", *parts[3:]])
    return f"({parts[0].split('[')[0]})", path


def _planned(path: str) -> bool:
    """A load curve's value `plan_changes` compares (static pools, plan, the windows its
    whole-curve run met), or the best design."""
    return (path in ("summary.best_design", "load_curve.static", "load_curve.plan",
                     "load_curve.whole_curve.plan.windows_met")
            or path.startswith(("load_curve.static[", "load_curve.plan[")))


def check_report(path: str | Path, execution: Execution = Execution(), *,
                 catalog_dir: str | None = None, on_batch=None) -> CheckResult:
    """Read the report, re-run the question it echoes, diff every section."""
    path = Path(path)
    old = read_report(path)
    study = from_echo(old["inputs"], str(path), path.parent, catalog_dir)
    implied_sections(old, study, str(path))
    run = run_study(study, execution, on_batch)
    new = json.loads(json_text(run.to_dict()))   # as report.json holds it (lists, str keys)
    notes = changed_inputs(old["inputs"], new["inputs"])
    for key, value in old.get("versions", {}).items():
        now = new["versions"].get(key)
        if now != value:
            notes.append(f"{key} version: {value} -> {now}")
    changes = optimum_changes(old, new)
    if study.load_curve is not None:   # (its shape checked by implied_sections)
        changes += plan_changes(old, new)
    before, after = old.get("summary", {}).get("best_design"), new["summary"]["best_design"]
    if before != after:
        changes.insert(0, ("(summary)", "best_design", before, after))
    return CheckResult(changes, notes, run, new, section_changes(old, new))
