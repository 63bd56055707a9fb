"""report.html: the search report as one offline page (plotly.js inlined) with three figures:
the (P, T) design space of each Splitwise design coloured by feasibility and cost with the
optimum starred (the paper's Figure 12), latency percentiles of each optimum against load, and a
summary bar chart of the designs. Figure div ids are fixed so the page is byte-identical."""
from __future__ import annotations

import html
import math
from typing import Sequence

import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from provisioner.tables import (RESILIENCE_COLUMNS, resilience_rows, resilience_title,
                                sensitivity_cells)
from provisioner.study import DesignResult, Metrics

PERCENTILE_STYLE = {"p50": "solid", "p90": "dash", "p99": "dot"}
METRIC_TITLES = {"ttft": "TTFT", "tbt": "TBT", "e2e": "E2E"}
FEASIBLE_LEGEND_COLOUR = "#21918c"          # Viridis' midpoint: the design-space legend symbol


def html_report(document: dict, results: Sequence[DesignResult]) -> str:
    inputs = document["inputs"]
    figures = [("fig-design-space", design_space_figure(results, inputs)),
               ("fig-latency-load", latency_load_figure(results, inputs)),
               ("fig-summary", summary_figure(results))]
    parts = []
    first = True
    for div_id, figure in figures:
        if figure is None:
            continue
        parts.append(pio.to_html(figure, full_html=False, include_plotlyjs=first,
                                 div_id=div_id, config={"displaylogo": False}))
        first = False
    title = (f"provision search — {inputs['model']['name']}, {inputs['workload']['name']}, "
             f"{inputs['goal']['name']}")
    return "\n".join([
        "<!DOCTYPE html>", "<html lang=\"en\">", "<head>", "<meta charset=\"utf-8\">",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;margin:1.5em;max-width:1400px}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
        "padding:3px 8px;text-align:right}td:first-child,th:first-child{text-align:left}"
        ".warn{color:#a15c00}</style>",
        "</head>", "<body>", f"<h1>{html.escape(title)}</h1>",
        _inputs_html(inputs), _optimum_html(document), _comparison_html(document), _non_monotone_html(document),
        *parts, "</body>", "</html>", ""])


# ------------------------------------------------------------------------------- text parts
def _inputs_html(inputs: dict) -> str:
    goal = inputs["goal"]
    load = (f"{goal['rate_rps']:g} req/s" if goal["rate_rps"] is not None else
            "budget " + _budget_text(goal["budget"]) if goal["budget"] else "trace rate")
    constraints = ", ".join(f"{k} {v}" for k, v in inputs["constraints"].items() if v) or "none"
    rows = [("goal", f"{goal['name']} ({goal['paper_name']})"), ("load", load),
            ("model", inputs["model"]["name"]), ("workload", inputs["workload"]["name"]),
            ("window", f"{inputs['duration_s']:g} s, seed {inputs['seed']}"),
            ("SLO profile", inputs["slo_profile"]["name"]), ("constraints", constraints),
            ("performance model", inputs["perf_model"]["name"])]
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
                   for k, v in rows)
    return f"<h2>Inputs</h2><table>{body}</table>"


def _budget_text(budget: dict) -> str:
    like = f" (the {budget['kind']} of {budget['like']})" if budget.get("like") else ""
    return f"{budget['value']:g} {budget['unit']}{like}"


def _comparison_html(document: dict) -> str:
    """Disaggregated vs chunked colocated: the best design of each kind and the verdict."""
    view = document["summary"].get("disaggregated_vs_chunked")
    if view is None:
        return ""
    head = "".join(f"<th>{h}</th>" for h in ("", "design", "machines", "cost $/h", "power kW",
                                               "GPUs", "headroom req/s"))
    rows = []
    for kind, label in (("disaggregated", "disaggregated"), ("chunked", "chunked colocated")):
        side = view[kind]
        if side is None:
            rows.append(f"<tr><td>{label}</td><td colspan=\"6\">none feasible</td></tr>")
            continue
        machines = (f"{side['machines']} (chunk {side['chunk_tokens']})" if "machines" in side
                    else f"{side['prompt_machines']} P + {side['token_machines']} T")
        headroom = side.get("headroom_rps")
        cells = (label, side["design"], machines, f"{side['cost_per_hour']:,.2f}",
                 f"{side['power_kw']:,.1f}", str(side["gpus"]),
                 "-" if headroom is None else f"{headroom:.4g}")
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return (f"<h2>Disaggregated vs chunked colocated ({html.escape(view['goal'])})</h2>"
            f"<p>{html.escape(view['sentence'])}</p>"
            f"<table><tr>{head}</tr>{''.join(rows)}</table>")


def _optimum_html(document: dict) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("design", "P", "T", "rate req/s", "cost $/h",
                                               "power kW", "GPUs", "binding SLO / margin",
                                               "headroom req/s"))
    rows = []
    for entry in document["designs"]:
        o = entry["optimum"]
        name = html.escape(entry["design"])
        if entry["design"] == document["summary"]["best_design"]:
            name = f"<b>{name}</b> ★"
        if entry.get("uncalibrated_skus"):
            name += ' <span class="warn">(uncalibrated)</span>'
        if o is None:
            rows.append(f"<tr><td>{name}</td><td colspan=\"8\">infeasible: "
                        f"{html.escape(entry['reason'])}</td></tr>")
            continue
        p = o.get("machines", o.get("prompt_machines"))
        t = "-" if "machines" in o else o["token_machines"]
        margin = "" if o["worst_margin"] is None else f"{o['worst_margin']:+.1%}"
        if o.get("binding_slo"):
            margin = (f"{o['binding_slo'].replace('_', ' ').upper()} "
                      f"{o['binding_margin']:+.1%}")
        rate = "trace" if o["rate_rps"] is None else f"{o['rate_rps']:g}"
        headroom = "-" if o.get("headroom_rps") is None else f"{o['headroom_rps']:g}"
        cells = [p, t, rate, f"{o['cost_per_hour']:,.2f}", f"{o['power_kw']:,.1f}", o["gpus"],
                 margin, headroom]
        rows.append(f"<tr><td>{name}</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    warnings = "".join(f'<li class="warn">{html.escape(w)}</li>'
                       for w in document.get("warnings", []))
    notes = f"<ul>{warnings}</ul>" if warnings else ""
    assumptions = "".join(f"<tr><th>{html.escape(a['name'])}</th><td style=\"text-align:left\">"
                          f"{html.escape(a['value'])}</td></tr>"
                          for a in document.get("assumptions", []))
    assumed = f"<h2>Modelling assumptions</h2><table>{assumptions}</table>" if assumptions else ""
    return (f"<h2>Optimum per design</h2><table><tr>{head}</tr>{''.join(rows)}</table>"
            f"{notes}{_resilience_html(document)}{_sensitivity_html(document)}{assumed}")


def _resilience_html(document: dict) -> str:
    """--survive-failures: the plain and failure-aware optima and the price of resilience."""
    rows = resilience_rows(document)
    if not rows:   # the title reads the failure inputs, which only an N+k report has
        return ""
    return _text_table(resilience_title(document), ["design", *RESILIENCE_COLUMNS], rows)


def _sensitivity_html(document: dict) -> str:
    """What moves the answer: one row per changed assumption, the optimum of every design."""
    names, rows = sensitivity_cells(document)
    return _text_table("What moves the answer", ["assumption", *names], rows)


def _text_table(title: str, header: list[str], rows: list[tuple[str, list[str]]]) -> str:
    """A titled HTML table of (label, cells) rows, all escaped; "" when there are no rows."""
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = [f"<tr><td>{html.escape(label)}</td>"
            + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
            for label, cells in rows]
    return f"<h2>{html.escape(title)}</h2><table><tr>{head}</tr>{''.join(body)}</table>"


def _non_monotone_html(document: dict) -> str:
    items = []
    for entry in document["designs"]:
        for cell in entry["non_monotone"]:
            items.append(f"<li>{html.escape(entry['design'])}: {tuple(cell['infeasible'])} "
                         f"infeasible although {tuple(cell['feasible_below'])} is feasible "
                         f"at {_rate_text(cell['rate_rps'])}</li>")
    if not items:
        return ""
    return f"<h2 class=\"warn\">Non-monotone cells</h2><ul class=\"warn\">{''.join(items)}</ul>"


# ---------------------------------------------------------------------------------- figures
def _reference_rate(result: DesignResult):
    """The rate the design-space panel shows: the optimum's (or the goal's)."""
    if result.optimum is not None:
        return result.optimum.rate_rps
    return result.goal.rate_rps


def design_space_figure(results: Sequence[DesignResult], inputs: dict):
    splits = [r for r in results if not r.design.is_baseline and r.points]
    if not splits:
        return None
    goal = inputs["goal"]
    by_power = goal["name"] == "min-power" or (goal["budget"] or {}).get("kind") == "power"
    colour_title = "power kW" if by_power else "cost $/h"
    cols = min(3, len(splits))
    rows = math.ceil(len(splits) / cols)
    titles = [f"{r.design.name} @ {_rate_text(_reference_rate(r))}" for r in splits]
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles,
                        horizontal_spacing=0.08, vertical_spacing=0.14)
    placed = [(trace, i // cols + 1, i % cols + 1) for i, result in enumerate(splits)
              for trace in _design_space_traces(result, by_power, first=i == 0)]
    _add_traces(fig, placed)
    for i in range(len(splits)):   # the used subplots only: a 2 x 3 grid may have empty ones
        fig.update_xaxes(title_text="prompt machines", row=i // cols + 1, col=i % cols + 1)
        fig.update_yaxes(title_text="token machines", row=i // cols + 1, col=i % cols + 1)
    fig.update_layout(title="Design space: feasibility and cost at the optimum's rate "
                            "(★ optimum; Splitwise Figure 12)",
                      coloraxis={"colorscale": "Viridis", "colorbar": {"title": colour_title}},
                      height=380 * rows + 80, legend={"orientation": "h", "y": -0.08})
    return fig


def _design_space_traces(result: DesignResult, by_power: bool, first: bool) -> list:
    rate = _reference_rate(result)
    here = [m for m in result.points if m.rate_rps == rate]
    ok = [m for m in here if m.meets_slos]
    bad = [m for m in here if not m.meets_slos]
    # plotly.js styles a legend symbol with the trace's first raw marker.color value and does
    # not map it through a coloraxis, so a legend entry of the cost-coloured trace logs "Invalid
    # color specifier: number …" (twice per draw) and falls back to black. The coloured points
    # therefore stay out of the legend; an empty proxy trace of the same legendgroup, with a
    # fixed colour, stands for them there (clicking it still toggles the whole group).
    traces = [
        go.Scatter(x=[m.prompt_machines for m in ok], y=[m.token_machines for m in ok],
                   mode="markers", name="feasible", legendgroup="feasible", showlegend=False,
                   marker={"size": 9, "color": [m.power_kw if by_power else m.cost_per_hour
                                                for m in ok], "coloraxis": "coloraxis"},
                   text=[_hover(m) for m in ok], hoverinfo="text"),
        go.Scatter(x=[m.prompt_machines for m in bad], y=[m.token_machines for m in bad],
                   mode="markers", name="infeasible", legendgroup="infeasible", showlegend=first,
                   marker={"size": 8, "symbol": "x", "color": "#b0b0b0"},
                   text=[_hover(m) for m in bad], hoverinfo="text")]
    if first:
        traces.insert(1, go.Scatter(x=[None], y=[None], mode="markers", name="feasible",
                                    legendgroup="feasible", hoverinfo="skip",
                                    marker={"size": 9, "color": FEASIBLE_LEGEND_COLOUR}))
    if result.goal.name == "max-rate" and result.frontier:
        traces.append(go.Scatter(x=[p for p, _ in result.frontier],
                                 y=[t for _, t in result.frontier], mode="lines",
                                 name="budget limit", legendgroup="budget", showlegend=first,
                                 line={"color": "#d62728", "dash": "dash", "width": 1}))
    if result.optimum is not None:
        o = result.optimum
        traces.append(go.Scatter(x=[o.prompt_machines], y=[o.token_machines], mode="markers",
                                 name="optimum", legendgroup="optimum", showlegend=first,
                                 marker={"size": 20, "symbol": "star", "color": "gold",
                                         "line": {"color": "black", "width": 1}},
                                 text=[_hover(o)], hoverinfo="text"))
    return traces


def _hover(m: Metrics) -> str:
    margin = m.outcome.worst_margin
    verdict = "feasible" if m.meets_slos else (m.outcome.reason or "infeasible")
    return (f"P={m.prompt_machines} T={m.token_machines}<br>{_rate_text(m.rate_rps)}<br>"
            f"${m.cost_per_hour:,.2f}/h, {m.power_kw:,.1f} kW, {m.gpus} GPUs<br>"
            f"worst margin {'' if margin is None else f'{margin:+.1%}'}<br>{verdict}")


def _rate_text(rate) -> str:
    return "trace rate" if rate is None else f"{rate:g} req/s"


def latency_load_figure(results: Sequence[DesignResult], inputs: dict):
    """Each optimum's percentiles against the request rate, with the SLO limits dotted."""
    curves = [(r, _load_curve(r)) for r in results if r.optimum is not None]
    curves = [(r, c) for r, c in curves if len(c) >= 2]
    if not curves:
        return None
    unit = "slowdown (x)" if inputs["slo_profile"]["kind"] == "slowdown" else "ms"
    titles = [f"{r.design.name}: {METRIC_TITLES[m]}" for r, _ in curves for m in METRIC_TITLES]
    fig = make_subplots(rows=len(curves), cols=3, subplot_titles=titles,
                        vertical_spacing=min(0.08, 0.5 / len(curves)), horizontal_spacing=0.06)
    placed = []
    for row, (result, points) in enumerate(curves, start=1):
        for col, metric in enumerate(METRIC_TITLES, start=1):
            for pct, dash in PERCENTILE_STYLE.items():
                key = f"{metric}_{pct}"
                values = [dict((k, v) for k, v, _ in m.outcome.slo)[key] for m in points]
                placed.append((go.Scatter(
                    x=[m.rate_rps for m in points], y=values, mode="lines+markers",
                    name=pct.upper(), legendgroup=pct, showlegend=row == 1 and col == 1,
                    line={"dash": dash, "color": "#1f77b4"}), row, col))
                limit = dict((k, lim) for k, _, lim in points[0].outcome.slo)[key]
                if limit is not None:
                    placed.append((go.Scatter(
                        x=[points[0].rate_rps, points[-1].rate_rps], y=[limit, limit],
                        mode="lines", name=f"{pct.upper()} limit", legendgroup=f"{pct}-limit",
                        showlegend=row == 1 and col == 1,
                        line={"dash": dash, "color": "#d62728", "width": 1}), row, col))
    _add_traces(fig, placed)
    fig.update_xaxes(title_text="rate (req/s)")
    fig.update_yaxes(title_text=unit, type="log")
    fig.update_layout(title="Latency percentiles of each optimum against load (red: SLO limits)",
                      height=300 * len(curves) + 100)
    return fig


def _add_traces(fig, placed: list) -> None:
    """(trace, row, col) into their subplots in one call: adding them one by one re-validates
    the figure each time (0.2 s for the 144 traces of eight designs' load curves)."""
    if placed:
        traces, rows, cols = zip(*placed)
        fig.add_traces(list(traces), rows=list(rows), cols=list(cols))


def _load_curve(result: DesignResult) -> list[Metrics]:
    o = result.optimum
    same = [m for m in result.points
            if (m.prompt_machines, m.token_machines) == (o.prompt_machines, o.token_machines)
            and m.rate_rps is not None and m.outcome.completed]
    return sorted(same, key=lambda m: m.rate_rps)


def summary_figure(results: Sequence[DesignResult]):
    done = [r for r in results if r.optimum is not None]
    if not done:
        return None
    names = [r.design.name for r in done]
    fig = make_subplots(rows=1, cols=3, subplot_titles=("cost $/h", "power kW",
                                                        "throughput req/s"))
    series = ((lambda m: m.cost_per_hour, "#1f77b4"), (lambda m: m.power_kw, "#ff7f0e"),
              (lambda m: m.rate_rps, "#2ca02c"))
    _add_traces(fig, [(go.Bar(x=names, y=[value(r.optimum) for r in done],
                              marker_color=colour, showlegend=False), 1, col)
                      for col, (value, colour) in enumerate(series, start=1)])
    fig.update_layout(title="Optimum of each design", height=420)
    return fig
