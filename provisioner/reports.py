"""Search reports: report.json, evaluations.csv, report.html (plotly) (SPEC section 6).

Every file is a pure function of the search inputs and results: no timestamps, wall times or
cache paths, floats rounded to 6 significant digits, keys in a fixed order. All three texts are
rendered before anything is written, and each file is replaced atomically.
"""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any, Sequence

from provisioner.files import write_files_atomically
from provisioner.chunked import best_of, comparison
from provisioner.loadcurve import PLAN_FILE, plan_csv   # --load-curve: its plan.csv
from provisioner.study import SLO_KEYS, DesignResult, Metrics

SCHEMA = "provision.search-report"
SCHEMA_VERSION = 5  # 2: verification, headroom, assumptions, warnings, sensitivity;
#                       3: inputs.options, the question as asked (what `check` reads);
#                       4: layouts (optimum.layout, designs[].layouts, layouts_skipped);
#                       5: optimum.unit_costs (tokens/s, $ and kWh per million tokens)
REPORT_FILES = ("report.json", "evaluations.csv", "report.html")
WRITTEN_FILES = REPORT_FILES + (PLAN_FILE,)   # every file a search may write in --out


def num(value: Any) -> Any:
    """Floats to 6 significant digits (None for NaN/inf); everything else unchanged."""
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    value = float(value)
    if not math.isfinite(value):
        return None
    return float(f"{value:.6g}")


# --------------------------------------------------------------------------------- report.json
def machines_of(m: Metrics) -> dict:
    """Its pools' sizes, keyed by pool: {"machines": N} colocated, else prompt and token."""
    return m.point.design.pool_sizes(m.prompt_machines, m.token_machines)


def optimum_dict(m: Metrics) -> dict:
    return {**machines_of(m), "rate_rps": num(m.rate_rps),
            "cost_per_hour": num(m.cost_per_hour), "power_kw": num(m.power_kw), "gpus": m.gpus,
            "worst_margin": num(m.outcome.worst_margin),
            "slo": {key: {"value": num(value), "limit": num(limit)}
                    for key, value, limit in m.outcome.slo}}


def point_dict(m: Metrics) -> dict:
    o = m.outcome
    return {**machines_of(m), "rate_rps": num(m.rate_rps), "feasible": o.meets_slos,
            "completed": o.completed, "cost_per_hour": num(m.cost_per_hour),
            "power_kw": num(m.power_kw), "gpus": m.gpus, "worst_margin": num(o.worst_margin),
            "slo": {key: num(value) for key, value, _ in o.slo}, "reason": o.reason}


def design_dict(result: DesignResult) -> dict:
    d = result.design
    optimum = None
    if result.optimum:
        optimum = {**optimum_dict(result.optimum),
                   **({"layout": result.layout} if result.layout else {}),
                   "headroom_rps": num(result.headroom_rps),
                   **verification_dict(result.verification),
                   "unit_costs": _rounded_tree(result.unit_costs)}
    chunked = {}
    if d.is_chunked:  # whole-prompt designs keep the keys they always had
        chunked = {"prefill": d.prefill, "chunk_tokens": d.chunk_tokens,
                   "chunk_search": [_rounded(line) for line in result.chunk_search]}
    return {"design": d.name, "prompt_sku": d.prompt_sku, "token_sku": d.token_sku, **chunked,
            "feasible": result.feasible, "status": result.status, "reason": result.reason,
            **({"pruned": _rounded_tree(result.pruned_by)} if result.pruned_by else {}),
            "uncalibrated_skus": list(result.uncalibrated), "optimum": optimum,
            "search_box": list(result.box) if result.box else None,
            "capacity_bound": (None if result.capacity_bound is None else
                               {"value": num(result.capacity_bound["value"]),
                                "pool_floors": result.capacity_bound["pool_floors"]}),
            "layouts": [_rounded(line) for line in result.layouts],
            "layouts_skipped": list(result.layouts_skipped),
            "rejected_candidates": [{**r, "rate_rps": num(r["rate_rps"])}
                                    for r in result.rejected],
            "frontier": [list(cell) for cell in result.frontier],
            "non_monotone": [{**cell, "rate_rps": num(cell["rate_rps"])}
                             for cell in result.non_monotone],
            **({"resilience": _rounded_tree(result.resilience)}
               if result.resilience is not None else {}),
            **({"prefix_cache_savings": _rounded_tree(result.prefix_savings)}
               if result.prefix_savings is not None else {}),
            "evaluations": len(result.points),
            "evaluated": [point_dict(m) for m in result.points]}


def _rounded_tree(value):
    if isinstance(value, dict):
        return {k: _rounded_tree(v) for k, v in value.items()}
    return num(value) if isinstance(value, float) else value


def verification_dict(verification: dict | None) -> dict:
    """The optimum's confidence: binding SLO, and per SLO every sample's value and interval."""
    if verification is None:
        return {}
    slo = {key: {"values": [num(v) for v in entry["values"]],
                 "ci95": [None if ci is None else [num(ci[0]), num(ci[1])]
                          for ci in entry["ci95"]],
                 "worst": num(entry["worst"]), "limit": num(entry["limit"]),
                 "margin": num(entry["margin"])}
           for key, entry in verification["slo"].items()}
    binding = verification["binding_slo"]
    latency_ms = verification.get("latency_ms")
    return {"latency_ms": None if latency_ms is None else {
                metric: {name: num(value) for name, value in percentiles.items()}
                for metric, percentiles in latency_ms.items()},
            "binding_slo": binding,
            "binding_margin": slo[binding]["margin"] if binding else None,
            # --prefix-cache on|aware: prefill tokens found cached on the base sample
            **({"prefix_hit_rate": num(verification["prefix_hit_rate"])}
               if "prefix_hit_rate" in verification else {}),
            # --concurrency: the users, their think time and the throughput they achieved on
            # the base sample (where an open loop's optimum has its rate)
            **({"closed_loop": _rounded_tree(verification["closed_loop"])}
               if "closed_loop" in verification else {}),
            "verification": {"seeds": verification["seeds"], "slo": slo}}


def uncalibrated_warnings(results: Sequence[DesignResult], hint: str) -> list[str]:
    """A warning per set of uncalibrated SKUs, naming the designs that use it (a hardware
    search has a dozen designs with the same SKU: one warning, not a dozen)."""
    designs: dict[tuple[str, ...], list[str]] = {}
    for r in results:
        if r.uncalibrated:
            designs.setdefault(tuple(r.uncalibrated), []).append(r.design.name)
    warnings = []
    for skus, names in designs.items():
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        warnings.append(f"{shown}: {', '.join(skus)}: {hint}")
    return warnings


def report_document(inputs: dict, results: Sequence[DesignResult], versions: dict,
                    assumptions: list[dict] | None = None, calibration_hint: str = "") -> dict:
    """The report.json content: schema, versions, echoed inputs, the modelling assumptions,
    per-design results, warnings and the summary."""
    warnings = uncalibrated_warnings(results, calibration_hint)
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "versions": versions,
            "inputs": inputs, "assumptions": assumptions or [],
            "designs": [design_dict(r) for r in results], "warnings": warnings,
            "summary": with_comparison(summary_dict(results, inputs["goal"]["name"]), results,
                                       inputs["goal"],
                                       inputs.get("options", {}).get("mixed_pool"))}


def _rounded(record: dict) -> dict:
    return {k: num(v) if isinstance(v, float) else v for k, v in record.items()}


def with_comparison(summary: dict, results: Sequence[DesignResult], goal: dict,
                    mixed_pool: bool | None = None) -> dict:
    """The summary plus the disaggregated-vs-chunked view when the study holds both kinds
    (`mixed_pool`: the search's --mixed-pool / --no-mixed-pool, said in its verdict)."""
    view = comparison(results, goal["name"], goal.get("rate_rps"), mixed_pool)
    if view is None:
        return summary
    rounded = {key: (_rounded(value) if isinstance(value, dict) else value)
               for key, value in view.items() if key != "pruned"}
    if "pruned" in view:   # (--hardware: the designs of each kind pruned, with their bounds)
        rounded = {**rounded, "pruned": {kind: [_rounded(r) for r in group]
                                         for kind, group in view["pruned"].items()}}
    return {**summary, "disaggregated_vs_chunked": rounded}


def sensitivity_dict(rows: list[dict]) -> list[dict]:
    return [{"assumption": row["assumption"],
             "designs": {name: {k: num(v) for k, v in entry.items()}
                         for name, entry in row["designs"].items()}} for row in rows]


def summary_dict(results: Sequence[DesignResult], goal: str) -> dict:
    feasible = [r for r in results if r.feasible]
    best = best_of(results, goal)
    return {"best_design": best and best.design.name, "feasible_designs": len(feasible),
            "designs": len(results),
            "evaluations": sum(len(r.points) for r in results),
            "non_monotone_cells": sum(len(r.non_monotone) for r in results)}


def json_text(document: dict) -> str:
    return json.dumps(document, indent=2, allow_nan=False) + "\n"


# ----------------------------------------------------------------------------- evaluations.csv
CSV_COLUMNS = ("design", "layout", "prompt_machines", "token_machines", "machines", "rate_rps", "feasible",
               "completed", "cost_per_hour", "power_kw", "gpus", *SLO_KEYS, "worst_margin",
               "reason")


def csv_text(results: Sequence[DesignResult]) -> str:
    """One row per simulated (design, P, T, rate) of each design's chosen layout (prompt /
    token); baselines put their pool in prompt_machines."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for result in results:
        for m in result.points:
            values = {key: value for key, value, _ in m.outcome.slo}
            layout = " / ".join(layout.label for layout in result.design.layouts
                                if layout is not None)
            writer.writerow([result.design.name, layout, m.prompt_machines, m.token_machines,
                             m.prompt_machines + m.token_machines, _cell(m.rate_rps),
                             m.outcome.meets_slos, m.outcome.completed, _cell(m.cost_per_hour),
                             _cell(m.power_kw), m.gpus, *(_cell(values[k]) for k in SLO_KEYS),
                             _cell(m.outcome.worst_margin), m.outcome.reason])
    return buffer.getvalue()


def _cell(value) -> str:
    value = num(value)
    return "" if value is None else repr(value)


# -------------------------------------------------------------------------------- writing
def render_reports(document: dict, results: Sequence[DesignResult]) -> dict[str, str]:
    """All three files as text; nothing is written until every one of them rendered."""
    from provisioner.figures import html_report
    texts = {"report.json": json_text(document), "evaluations.csv": csv_text(results),
             "report.html": html_report(document, results)}
    if document.get("load_curve") is not None:
        texts[PLAN_FILE] = plan_csv(document)
    return texts


def write_reports(out_dir: Path, texts: dict[str, str]) -> list[Path]:
    """All report files at once: the previous reports (or none) stay if anything fails."""
    written = write_files_atomically(Path(out_dir), dict(texts))
    stale = Path(out_dir) / PLAN_FILE   # a plan of an earlier search would read as this one's
    if PLAN_FILE not in texts and stale.is_file():
        stale.unlink()
    return written


def non_monotone_lines(document: dict) -> list[str]:
    lines = []
    for entry in document["designs"]:
        for cell in entry["non_monotone"]:
            rate = "trace rate" if cell["rate_rps"] is None else f"{cell['rate_rps']:g} req/s"
            lines.append(f"{entry['design']}: {tuple(cell['infeasible'])} is infeasible although "
                         f"{tuple(cell['feasible_below'])} is feasible at {rate}")
    return lines
