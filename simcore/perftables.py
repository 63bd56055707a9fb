"""User piecewise-linear latency tables (YAML or CSV) -> `LatencyCurves` per (machine, model).

YAML (or JSON of the same shape)::

    tables:
      - machine: dgx-a100          # a catalog machine SKU name
        model: llama2-70b          # optional: omit to cover every model on this machine
        prefill:                   # prompt iteration latency against TOTAL prompt tokens
          tokens: [128, 512, 2048, 8192]
          ms: [60, 95, 275, 1550]
        decode:                    # decode iteration latency against batch size (requests)
          batch: [1, 8, 32, 64]
          ms: [45, 46.5, 53, 71]
        context_ms_per_token: 0.0003   # optional (default 0): added per context token in the batch

CSV (a header, then one knot per row; a curve's rows in increasing x)::

    machine,model,phase,x,ms
    dgx-a100,llama2-70b,prefill,128,60
    dgx-a100,llama2-70b,decode,1,45
    dgx-a100,llama2-70b,context,,0.0003

`model` may be empty (every model on the machine); `phase` is prefill (x = total prompt tokens),
decode (x = batch size) or context (no x; ms per context token, at most one row per table).

Curves are evaluated as `simcore.latency` states: below the first knot the first value holds,
beyond the last knot the last segment continues. Give the machine's uncapped latencies; the
catalog's power-cap `prompt_slowdown` is applied on top. Rules (each violation is a one-line
InputError naming file, row or entry, and field): a known machine SKU and model, >= 2 knots per
curve, positive and strictly increasing knots, latencies > 0 that never decrease, a context cost
>= 0, one table per (machine, model).
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import numpy as np

from hardware_catalog import Catalog, InputError
from hardware_catalog.checks import Invalid, Number
from hardware_catalog.csvschema import PERF_TABLE, read_table
from simcore.latency import LatencyCurves

__all__ = ["parse_table_document", "read_table_csv"]

Key = tuple[str, "str | None"]
# fail(index of the offending knot or None, field, message) -> raises InputError
Fail = Callable[[Any, str, str], None]

_PHASES = {"prefill": "tokens", "decode": "batch"}
# Sane ranges: beyond them a table is a typo (or not a latency table at all).
MAX_KNOT_X = 1e8       # total prompt tokens of an iteration, or requests in a batch
MAX_KNOT_MS = 1e7      # milliseconds of one iteration
MAX_CONTEXT_MS = 1e3   # milliseconds per context token
MAX_KNOTS = 100_000


def parse_table_document(document: Any, source: str,
                         catalog: Catalog) -> dict[Key, LatencyCurves]:
    """Validate a YAML/JSON table document into curves keyed by (machine, model or None); the
    machine and model names must be in `catalog` (the caller's, never a packaged default)."""
    tables = document.get("tables") if isinstance(document, dict) else None
    if not isinstance(tables, list) or not tables:
        raise InputError("'tables' must be a non-empty list of tables", source=source,
                         field="tables")
    curves: dict[Key, LatencyCurves] = {}
    for index, entry in enumerate(tables, 1):
        where = f"entry {index}"
        if not isinstance(entry, dict):
            raise InputError(f"{where}: must be a mapping", source=source)
        unknown = sorted(set(entry) - {"machine", "model", "prefill", "decode",
                                       "context_ms_per_token"})
        if unknown:
            raise InputError(f"{where}: unknown field", source=source, field=unknown[0])
        key = _names(entry.get("machine"), entry.get("model"), catalog,
                     lambda f, m, where=where: _raise(f"{where}: {m}", source, field=f))
        prefill = _yaml_curve(entry, "prefill", _yaml_fail(where, "prefill", source))
        decode = _yaml_curve(entry, "decode", _yaml_fail(where, "decode", source))
        context = _context(entry.get("context_ms_per_token", 0.0),
                           lambda m, where=where: _raise(f"{where}: {m}", source,
                                                         field="context_ms_per_token"))
        _store(curves, key, _curves(prefill, decode, context),
               lambda m, where=where: _raise(f"{where}: {m}", source, field="machine"))
    return curves


def read_table_csv(path: str | Path, catalog: Catalog) -> dict[Key, LatencyCurves]:
    """Read a long-form CSV table (machine, model, phase, x, ms) into curves."""
    source = str(path)
    points: dict[Key, dict[str, list]] = defaultdict(lambda: {"prefill": [], "decode": [],
                                                             "context": []})
    table = read_table(PERF_TABLE, path)   # columns by name, each cell typed and bounded
    models = table.values.get("model")
    for index, row in enumerate(table.rows.tolist()):
        def fail(field: str, message: str, row: int = row) -> None:
            raise InputError(message, source=source, row=row, field=field)

        key = _names(table["machine"][index], (models[index] or None) if models is not None
                     else None, catalog, fail)
        phase, x = table["phase"][index], float(table["x"][index])
        if phase != "context" and math.isnan(x):
            fail("x", "must be a number (only a context row leaves x empty)")
        points[key][phase].append((None if phase == "context" else x,
                                   float(table["ms"][index]), row))
    if not points:
        raise InputError("no table rows after the header", source=source)
    curves: dict[Key, LatencyCurves] = {}
    for key, phases in points.items():
        label = f"table {key[0]}/{key[1] or '*'}"
        prefill, decode = (_csv_curve(phases[p], p, label, source) for p in ("prefill", "decode"))
        context = _csv_context(phases["context"], label, source)
        curves[key] = _curves(prefill, decode, context)
    return curves


def _curves(prefill, decode, context_ms: float) -> LatencyCurves:
    return LatencyCurves(prefill[0], prefill[1] / 1000.0, decode[0], decode[1] / 1000.0,
                         context_ms / 1000.0)


def _names(machine: Any, model: Any, catalog: Catalog, fail: Callable[[str, str], None]) -> Key:
    if not isinstance(machine, str) or not machine.strip():
        fail("machine", "must name a machine SKU")
    if machine not in catalog.machines:
        fail("machine", f"unknown machine SKU '{machine}'; known: {', '.join(sorted(catalog.machines))}")
    if model is not None:
        if not isinstance(model, str) or model not in catalog.models:
            fail("model", f"unknown model {model!r}; known: {', '.join(sorted(catalog.models))}")
    return machine, model


def _store(curves: dict, key: Key, value: LatencyCurves, fail: Callable[[str], None]) -> None:
    if key in curves:
        fail(f"a second table for {key[0]}/{key[1] or '*'}")
    curves[key] = value


def _raise(message: str, source: str, **where) -> None:
    raise InputError(message, source=source, **where)


def checked_curve(xs: list, ys: list, fail: Fail) -> tuple[np.ndarray, np.ndarray]:
    """Enforce the knot rules on one curve; `fail` places the error (row or entry, field)."""
    if len(xs) < 2:
        fail(None, "ms", f"needs at least 2 knots, got {len(xs)}")
    if len(xs) > MAX_KNOTS:
        fail(None, "ms", f"has {len(xs)} knots; at most {MAX_KNOTS}")
    for i, (x, y) in enumerate(zip(xs, ys)):
        if x <= 0:
            fail(i, "x", f"knot must be > 0, got {x:g}")
        if x > MAX_KNOT_X:
            fail(i, "x", f"knot must be <= {MAX_KNOT_X:g} (tokens or requests), got {x:g}")
        if y > MAX_KNOT_MS:
            fail(i, "ms", f"latency must be <= {MAX_KNOT_MS:g} ms, got {y:g}")
        if i and x <= xs[i - 1]:
            fail(i, "x", f"knots must increase: {x:g} after {xs[i - 1]:g}")
        if y <= 0:
            fail(i, "ms", f"latency must be > 0, got {y:g}")
        if i and y < ys[i - 1]:
            fail(i, "ms", f"latency must not decrease with more work: {y:g} after {ys[i - 1]:g}")
    return np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)


# ----------------------------------------------------------------------------- YAML helpers
def _yaml_fail(where: str, phase: str, source: str) -> Fail:
    def fail(index, field, message):
        knot = f" knot {index + 1}" if index is not None else ""
        name = {"x": f"{phase}.{_PHASES[phase]}", "ms": f"{phase}.ms"}.get(field, field)
        raise InputError(f"{where} {phase}{knot}: {message}", source=source, field=name)
    return fail


def _yaml_curve(entry: dict, phase: str, fail: Fail):
    curve = entry.get(phase)
    x_key = _PHASES[phase]
    if not isinstance(curve, dict) or x_key not in curve or "ms" not in curve:
        fail(None, phase, f"missing: give {phase}: {{{x_key}: [...], ms: [...]}}")
    unknown = sorted(set(curve) - {x_key, "ms"})
    if unknown:
        fail(None, f"{phase}.{unknown[0]}", "unknown field")
    xs, ys = curve[x_key], curve["ms"]
    for values, field in ((xs, "x"), (ys, "ms")):
        if not isinstance(values, list):
            fail(None, field, "must be a list of numbers")
        for i, v in enumerate(values):
            try:
                Number()(v)
            except Invalid as err:
                fail(i, field, str(err))
    if len(xs) != len(ys):
        fail(None, "ms", f"{len(xs)} {x_key} knots but {len(ys)} latencies")
    return checked_curve([float(v) for v in xs], [float(v) for v in ys], fail)


def _context(value: Any, fail: Callable[[str], None]) -> float:
    try:
        return Number(0, MAX_CONTEXT_MS)(value)
    except Invalid as err:
        fail(str(err))


# ------------------------------------------------------------------------------ CSV helpers
def _csv_curve(points: list, phase: str, label: str, source: str):
    rows = [p[2] for p in points]

    def fail(index, field, message):
        row = rows[index] if index is not None else None
        raise InputError(f"{label} {phase}: {message}", source=source, row=row, field=field)

    return checked_curve([p[0] for p in points], [p[1] for p in points], fail)


def _csv_context(points: list, label: str, source: str) -> float:
    if len(points) > 1:
        raise InputError(f"{label}: more than one context row", source=source, row=points[1][2],
                         field="phase")
    if not points:
        return 0.0
    _, ms, row = points[0]
    if not 0 <= ms <= MAX_CONTEXT_MS:
        raise InputError(f"{label} context: must be >= 0 and <= {MAX_CONTEXT_MS:g}, got {ms:g}",
                         source=source, row=row, field="ms")
    return ms
