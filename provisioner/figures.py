"""report.html: the search report as one offline page (plotly.js inlined) with three figures:
the (P, T) design space of each Splitwise design coloured by feasibility and cost with the
optimum starred (the paper's Figure 12), latency percentiles of each optimum against load, and a
summary bar chart of the designs. Figure div ids are fixed so the page is byte-identical.

The figures are plain plotly figure dicts (data, layout), written out unvalidated: building
them as plotly.graph_objects validated every property and took about 0.4 s of every search
(imports included). tests/test_figures.py checks each one against plotly's validators and the
subplot grid against make_subplots. Each figure's part of the page is what plotly.io.to_html
writes, byte for byte (`figure_div`, checked by the same tests), without importing plotly:
plotly.io loads narwhals and plotly's validators, about 0.06 s of every search's start."""
from __future__ import annotations

import html
import json
import math
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path
from typing import Sequence

from provisioner.tables import (answer_sentence, closed_loop_text, layout_label,
                                no_optimum_text, optimum_rate)
from provisioner.tables import (RESILIENCE_COLUMNS, SAVINGS_COLUMNS, resilience_rows,
                                resilience_title, savings_rows, savings_title,
                                sensitivity_cells)
from provisioner.study import DesignResult, Metrics, window_text
from provisioner import unitcosts
from slo_profiles import ABSOLUTE_METRICS

CONSTRAINTS = ("max_machines", "max_gpus", "max_prompt", "max_token")  # in the summary table
PERCENTILE_STYLE = {"p50": "solid", "p90": "dash", "p99": "dot"}
METRIC_TITLES = {"ttft": "TTFT", "tbt": "TBT", "e2e": "E2E", "itl": "ITL"}
FEASIBLE_LEGEND_COLOUR = "#21918c"          # Viridis' midpoint: the design-space legend symbol


def html_report(document: dict, results: Sequence[DesignResult]) -> str:
    inputs = document["inputs"]
    if document.get("load_curve") is not None:
        figures = [("fig-load-curve", load_curve_figure(document)),
                   ("fig-curve-margins", curve_margin_figure(document)),
                   ("fig-curve-prefix", curve_prefix_figure(document))]
    elif document["summary"].get("hardware") is not None:   # dozens of designs: one scatter
        figures = [("fig-hardware", hardware_figure(results))]
    else:
        figures = [("fig-design-space", design_space_figure(results, inputs)),
                   ("fig-latency-load", latency_load_figure(results, inputs)),
                   ("fig-summary", summary_figure(results))]
    parts, template = [], plotly_template()   # read once: the figures only read it
    for div_id, figure in figures:
        if figure is None:
            continue
        figure["layout"]["template"] = template
        parts.append(figure_div(figure, div_id, include_plotlyjs=not parts))
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
        f"<p class=\"answer\"><b>{html.escape(answer_sentence(document))}</b></p>",
        _inputs_html(inputs), optimum_html(document), _comparison_html(document),
        _non_monotone_html(document),
        *parts, "</body>", "</html>", ""])


# ------------------------------------------------------------------------------- text parts
def _inputs_html(inputs: dict) -> str:
    goal = inputs["goal"]
    load = (f"{goal['rate_rps']:g} req/s" if goal["rate_rps"] is not None else
            "budget " + _budget_text(goal["budget"]) if goal["budget"] else "trace rate")
    window = window_text(inputs.get("window"), inputs["options"]["duration"])
    if goal.get("closed_loop"):
        loop = goal["closed_loop"]
        load = (f"closed loop: {closed_loop_text(loop)}, {loop['requests']:,} requests a "
                "sample (req/s below: the throughput they achieved)")
        window = "the loop's requests, until the last finishes"
    options = inputs["options"]
    constraints = ", ".join(f"{k} {options[k]}" for k in CONSTRAINTS if options[k]) or "none"
    rows = [("goal", f"{goal['name']} ({goal['paper_name']})"), ("load", load),
            ("model", inputs["model"]["name"]), ("workload", inputs["workload"]["name"]),
            ("window", f"{window}, seed {options['seed']}"),
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
    searched = ", best of each searched" if view.get("pruned") else ""   # --hardware prunes
    return (f"<h2>Disaggregated vs chunked colocated ({html.escape(view['goal'])}{searched})"
            "</h2>"
            f"<p>{html.escape(view['sentence'])}</p>"
            f"<table><tr>{head}</tr>{''.join(rows)}</table>")


def optimum_html(document: dict) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("design", "layout", "P", "T", "rate req/s",
                                               "cost $/h", "power kW", "GPUs",
                                               "binding SLO / margin", "headroom req/s"))
    rows = []
    for entry in document["designs"]:
        o = entry["optimum"]
        name = html.escape(entry["design"])
        if entry["design"] == document["summary"]["best_design"]:
            name = f"<b>{name}</b> ★"
        if entry.get("uncalibrated_skus"):
            name += ' <span class="warn">(uncalibrated)</span>'
        if o is None:
            rows.append(f"<tr><td>{name}</td><td colspan=\"9\">"
                        f"{html.escape(no_optimum_text(entry))}</td></tr>")
            continue
        p = o.get("machines", o.get("prompt_machines"))
        t = "-" if "machines" in o else o["token_machines"]
        margin = "" if o["worst_margin"] is None else f"{o['worst_margin']:+.1%}"
        if o.get("binding_slo"):
            margin = (f"{o['binding_slo'].replace('_', ' ').upper()} "
                      f"{o['binding_margin']:+.1%}")
        served = optimum_rate(o)
        rate = "trace" if served is None else f"{served:g}"
        headroom = "-" if o.get("headroom_rps") is None else f"{o['headroom_rps']:g}"
        cells = [html.escape(layout_label(o.get("layout")) or "-"), p, t, rate,
                 f"{o['cost_per_hour']:,.2f}", f"{o['power_kw']:,.1f}", o["gpus"], margin,
                 headroom]
        rows.append(f"<tr><td>{name}</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    warnings = "".join(f'<li class="warn">{html.escape(w)}</li>'
                       for w in document.get("warnings", []))
    notes = f"<ul>{warnings}</ul>" if warnings else ""
    assumptions = "".join(f"<tr><th>{html.escape(a['name'])}</th><td style=\"text-align:left\">"
                          f"{html.escape(a['value'])}</td></tr>"
                          for a in document.get("assumptions", []))
    assumed = f"<h2>Modelling assumptions</h2><table>{assumptions}</table>" if assumptions else ""
    return (f"<h2>Optimum per design</h2><table><tr>{head}</tr>{''.join(rows)}</table>"
            f"{notes}{_latency_html(document)}{_unit_costs_html(document)}"
            f"{_resilience_html(document)}{_savings_html(document)}"
            f"{_sensitivity_html(document)}{assumed}")


LATENCY_METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E"), ("itl", "ITL"))


def _latency_html(document: dict) -> str:
    """Each optimum's latencies in ms on the base sample (beside the SLOs' own units)."""
    rows = []
    for entry in document["designs"]:
        ms = (entry["optimum"] or {}).get("latency_ms")
        if not ms:
            continue
        rows.append((entry["design"], [
            "-" if ms.get(m, {}).get(p) is None else f"{ms[m][p]:,.1f}"
            for m, _ in LATENCY_METRICS for p in ("p50", "p90", "p99")]))
    header = ["design", *(f"{label} {p.upper()}" for _, label in LATENCY_METRICS
                          for p in ("p50", "p90", "p99"))]
    return _text_table("Latencies of each optimum, ms (base sample; TPOT: a request's mean gap "
                       "between tokens; ITL: every gap)", header, rows)


def _unit_costs_html(document: dict) -> str:
    """Each optimum's tokens/s, $ and kWh per million tokens (`provisioner.unitcosts`)."""
    return _text_table(unitcosts.HTML_TITLE, ["design", *unitcosts.COLUMNS],
                       unitcosts.unit_cost_rows(document))


def _savings_html(document: dict) -> str:
    """--prefix-cache on|aware: each design's optimum with and without the cache."""
    rows = savings_rows(document)
    if not rows:   # (the title reads inputs a document without savings may not have)
        return ""
    return _text_table(savings_title(document), ["design", *SAVINGS_COLUMNS], rows)


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


# The default plotly template and the Viridis colour scale as plotly.py writes them: a validated
# figure carries both expanded (plotly.js's own defaults differ), so the dicts do too.
VIRIDIS = ["#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779",
           "#6ece58", "#b5de2b", "#fde725"]


@lru_cache(maxsize=1)
def plotly_template() -> dict:
    """plotly.py's default template ("plotly"), read from its package data as pio.templates
    does, without building (and validating) a Template object."""
    return json.loads(plotly_package_file("templates/plotly.json").decode())


def plotly_package_file(name: str) -> bytes:
    """A file of plotly's package data (plotly.js, the templates), found without importing
    plotly (its __init__ alone takes about 0.01 s)."""
    spec = find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("plotly is not installed; reinstall provision")
    return (Path(next(iter(spec.submodule_search_locations))) / "package_data" / name).read_bytes()


# plotly.io.to_html's pieces (plotly/io/_html.py): the config it writes for ours (`responsive`
# set by default; keys checked by plotly.offline's list), the script before plotly.js
PAGE_CONFIG = {"displaylogo": False, "responsive": True}
_WINDOW_PLOTLY_CONFIG = "<script>window.PlotlyConfig = {MathJaxConfig: 'local'};</script>"
_UNSAFE_IN_SCRIPT = (("<", "\\u003c"), (">", "\\u003e"), ("/", "\\u002f"))


def figure_div(figure: dict, div_id: str, include_plotlyjs: bool) -> str:
    """pio.to_html(figure, full_html=False, include_plotlyjs=..., div_id=div_id,
    config={"displaylogo": False}, validate=False), byte for byte: a div sized from the
    layout (or its template), then the script that draws the figure into it."""
    layout = figure.get("layout", {})
    template = layout.get("template", {}).get("layout", {})
    width, height = (_css_size(layout.get(key, template.get(key, "100%")))
                     for key in ("width", "height"))
    js = ("        " + _WINDOW_PLOTLY_CONFIG + "\n        <script>"
          + plotly_package_file("plotly.min.js").decode() + "</script>    "
          if include_plotlyjs else "")
    script = (f'                if (document.getElementById("{div_id}")) {{'
              f'                    Plotly.newPlot(                        "{div_id}",'
              f'                        {_script_json(figure.get("data", []))},'
              f'                        {_script_json(layout)},'
              f'                        {json.dumps(PAGE_CONFIG)}                    )'
              f'                }}')
    return (f'<div style="height:{height}; width:{width};">                {js}'
            f'            <div id="{div_id}" class="plotly-graph-div" '
            f'style="height:100%; width:100%;"></div>'
            f'            <script>                window.PLOTLYENV=window.PLOTLYENV || {{}};'
            f'                {script};            </script>        </div>')


def _css_size(value) -> str:
    """A number is pixels; anything else (a CSS length) is written as given."""
    try:
        float(value)
    except (ValueError, TypeError):
        return str(value)
    return f"{value}px"


def _script_json(value) -> str:
    """plotly.io.to_json_plotly's compact JSON: NaN and infinities as null, and <, > and /
    escaped so that no string can close the script."""
    text = json.dumps(value, separators=(",", ":"), default=_plain)
    if "NaN" in text or "Infinity" in text:   # (or a string holding those words: harmless)
        text = json.dumps(json.loads(text, parse_constant=lambda _: None),
                          separators=(",", ":"))
    for unsafe, safe in _UNSAFE_IN_SCRIPT:
        text = text.replace(unsafe, safe)
    return text


def _plain(value):
    """numpy scalars and arrays as the Python values they hold."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"a figure holds a {type(value).__name__}, which JSON cannot write")


def _colorscale(colours: list[str]) -> list:
    """A named scale as plotly.py expands it: evenly spaced [position, colour] pairs."""
    return [[i / (len(colours) - 1), c] for i, c in enumerate(colours)]


def subplot_grid(rows: int, cols: int, titles: Sequence[str] = (),
                 horizontal_spacing: float | None = None,
                 vertical_spacing: float | None = None) -> dict:
    """The layout make_subplots(rows, cols, subplot_titles=titles, ...) starts a figure with:
    axes x/y, x2/y2, ... row by row from the top left, each anchored to its pair, over equal
    cells with plotly's spacing and defaults; each title an annotation above its cell. The
    arithmetic follows plotly's so the domains are the same floats."""
    h = 0.2 / cols if horizontal_spacing is None else horizontal_spacing
    v = (0.5 if titles else 0.3) / rows if vertical_spacing is None else vertical_spacing
    widths = [(1.0 - h * (cols - 1)) / cols] * cols
    heights = [(1.0 - v * (rows - 1)) / rows] * rows
    layout: dict = {}
    annotations = []
    for r in range(rows):
        below = rows - 1 - r   # rows under this one
        bottom = sum(heights[:below]) + below * v
        y_domain = [min(max(bottom, 0.0), 1.0), min(bottom + heights[-1 - r], 1.0)]
        for c in range(cols):
            left = sum(widths[:c]) + c * h
            x_domain = [left, left + widths[c]]
            n = r * cols + c + 1
            layout[_axis_key("x", n)] = {"anchor": _axis_ref("y", n), "domain": x_domain}
            layout[_axis_key("y", n)] = {"anchor": _axis_ref("x", n), "domain": y_domain}
            if n <= len(titles) and titles[n - 1]:
                annotations.append({"font": {"size": 16}, "showarrow": False,
                                    "text": titles[n - 1], "x": sum(x_domain) / 2.0,
                                    "xanchor": "center", "xref": "paper", "y": y_domain[1],
                                    "yanchor": "bottom", "yref": "paper"})
    if annotations:
        layout["annotations"] = annotations
    return layout


def _axis_ref(axis: str, n: int) -> str:
    return axis if n == 1 else f"{axis}{n}"


def _axis_key(axis: str, n: int) -> str:
    return f"{axis}axis" if n == 1 else f"{axis}axis{n}"


def _in_cell(trace: dict, n: int) -> dict:
    """The trace drawn in subplot n (numbered row by row from 1)."""
    return {**trace, "xaxis": _axis_ref("x", n), "yaxis": _axis_ref("y", n)}


def _scatter(**properties) -> dict:
    return {"type": "scatter", **properties}


def design_space_figure(results: Sequence[DesignResult], inputs: dict) -> dict | None:
    splits = [r for r in results if not r.design.is_baseline and r.points]
    if not splits:
        return None
    goal = inputs["goal"]
    by_power = goal["name"] == "min-power" or (goal["budget"] or {}).get("kind") == "power"
    colour_title = "power kW" if by_power else "cost $/h"
    cols = min(3, len(splits))
    rows = math.ceil(len(splits) / cols)
    titles = [f"{r.design.name} @ " + (f"{r.goal.closed.users:,} users" if r.goal.closed
                                        else _rate_text(_reference_rate(r))) for r in splits]
    layout = subplot_grid(rows, cols, titles, horizontal_spacing=0.08, vertical_spacing=0.14)
    data = [_in_cell(trace, i + 1) for i, result in enumerate(splits)
            for trace in _design_space_traces(result, by_power, first=i == 0)]
    for n in range(1, len(splits) + 1):   # the used subplots only: a 2 x 3 grid may have empty ones
        layout[_axis_key("x", n)]["title"] = {"text": "prompt machines"}
        layout[_axis_key("y", n)]["title"] = {"text": "token machines"}
    layout.update(title={"text": "Design space: feasibility and cost at the optimum's rate "
                                 "(★ optimum; Splitwise Figure 12)"},
                  coloraxis={"colorscale": _colorscale(VIRIDIS),
                             "colorbar": {"title": {"text": colour_title}}},
                  height=380 * rows + 80, legend={"orientation": "h", "y": -0.08})
    return {"data": data, "layout": layout}


def _design_space_traces(result: DesignResult, by_power: bool, first: bool) -> list[dict]:
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
        _scatter(x=[m.prompt_machines for m in ok], y=[m.token_machines for m in ok],
                 mode="markers", name="feasible", legendgroup="feasible", showlegend=False,
                 marker={"size": 9, "color": [m.power_kw if by_power else m.cost_per_hour
                                              for m in ok], "coloraxis": "coloraxis"},
                 text=[_hover(m, result.goal.closed) for m in ok], hoverinfo="text"),
        _scatter(x=[m.prompt_machines for m in bad], y=[m.token_machines for m in bad],
                 mode="markers", name="infeasible", legendgroup="infeasible", showlegend=first,
                 marker={"size": 8, "symbol": "x", "color": "#b0b0b0"},
                 text=[_hover(m, result.goal.closed) for m in bad], hoverinfo="text")]
    if first:
        traces.insert(1, _scatter(x=[None], y=[None], mode="markers", name="feasible",
                                  legendgroup="feasible", hoverinfo="skip",
                                  marker={"size": 9, "color": FEASIBLE_LEGEND_COLOUR}))
    if result.goal.name == "max-rate" and result.frontier:
        traces.append(_scatter(x=[p for p, _ in result.frontier],
                               y=[t for _, t in result.frontier], mode="lines",
                               name="budget limit", legendgroup="budget", showlegend=first,
                               line={"color": "#d62728", "dash": "dash", "width": 1}))
    if result.optimum is not None:
        o = result.optimum
        traces.append(_scatter(x=[o.prompt_machines], y=[o.token_machines], mode="markers",
                               name="optimum", legendgroup="optimum", showlegend=first,
                               marker={"size": 20, "symbol": "star", "color": "gold",
                                       "line": {"color": "black", "width": 1}},
                               text=[_hover(o, result.goal.closed)], hoverinfo="text"))
    return traces


def _hover(m: Metrics, closed=None) -> str:
    margin = m.outcome.worst_margin
    verdict = "feasible" if m.meets_slos else (m.outcome.reason or "infeasible")
    load = f"{closed.users:,} users" if closed is not None else _rate_text(m.rate_rps)
    return (f"P={m.prompt_machines} T={m.token_machines}<br>{load}<br>"
            f"${m.cost_per_hour:,.2f}/h, {m.power_kw:,.1f} kW, {m.gpus} GPUs<br>"
            f"worst margin {'' if margin is None else f'{margin:+.1%}'}<br>{verdict}")


def _rate_text(rate) -> str:
    return "trace rate" if rate is None else f"{rate:g} req/s"


def latency_load_figure(results: Sequence[DesignResult], inputs: dict) -> dict | None:
    """Each optimum's percentiles against the request rate, with the SLO limits dotted."""
    curves = [(r, _load_curve(r)) for r in results if r.optimum is not None]
    curves = [(r, c) for r, c in curves if len(c) >= 2]
    if not curves:
        return None
    slowdown = inputs["slo_profile"]["kind"] == "slowdown"
    in_ms = set(inputs["slo_profile"].get("ms_metrics", ()))   # given in ms (--ttft-p99-ms)
    units = ["ms" if not slowdown or m in ABSOLUTE_METRICS or m in in_ms else "slowdown (x)"
             for m in METRIC_TITLES]
    columns = len(METRIC_TITLES)
    titles = [f"{r.design.name}: {METRIC_TITLES[m]}" for r, _ in curves for m in METRIC_TITLES]
    layout = subplot_grid(len(curves), columns, titles, vertical_spacing=min(0.08, 0.5 / len(curves)),
                          horizontal_spacing=0.06)
    data = []
    for row, (_result, points) in enumerate(curves):
        for col, metric in enumerate(METRIC_TITLES):
            cell, legend = row * columns + col + 1, row == 0 and col == 0
            for pct, dash in PERCENTILE_STYLE.items():
                key = f"{metric}_{pct}"
                values = [dict((k, v) for k, v, _ in m.outcome.slo)[key] for m in points]
                data.append(_in_cell(_scatter(
                    x=[m.rate_rps for m in points], y=values, mode="lines+markers",
                    name=pct.upper(), legendgroup=pct, showlegend=legend,
                    line={"dash": dash, "color": "#1f77b4"}), cell))
                limit = dict((k, lim) for k, _, lim in points[0].outcome.slo)[key]
                if limit is not None:
                    data.append(_in_cell(_scatter(
                        x=[points[0].rate_rps, points[-1].rate_rps], y=[limit, limit],
                        mode="lines", name=f"{pct.upper()} limit", legendgroup=f"{pct}-limit",
                        showlegend=legend, line={"dash": dash, "color": "#d62728", "width": 1}),
                        cell))
    for n in range(1, columns * len(curves) + 1):
        layout[_axis_key("x", n)]["title"] = {"text": "rate (req/s)"}
        layout[_axis_key("y", n)].update(title={"text": units[(n - 1) % columns]}, type="log")
    layout.update(title={"text": "Latency percentiles of each optimum against load "
                                 "(red: SLO limits)"},
                  height=300 * len(curves) + 100)
    return {"data": data, "layout": layout}


def _load_curve(result: DesignResult) -> list[Metrics]:
    o = result.optimum
    same = [m for m in result.points
            if (m.prompt_machines, m.token_machines) == (o.prompt_machines, o.token_machines)
            and m.rate_rps is not None and m.outcome.completed]
    return sorted(same, key=lambda m: m.rate_rps)


def load_curve_figure(document: dict) -> dict | None:
    """--load-curve: the curve's rate (and each window's sized rate) over time, and each
    design's machines per pool, planned and static, on a second axis."""
    curve = document["load_curve"]
    spans = curve["windows"]
    hours = [w["start_s"] / 3600.0 for w in spans] + [spans[-1]["end_s"] / 3600.0]

    def steps(values):   # a step line: each value held over its window
        return ([h for h in hours[:-1] for _ in (0, 1)][1:] + [hours[-1]],
                [v for v in values for _ in (0, 1)])

    data = []
    for label, key in (("peak rate req/s", "peak_rps"), ("mean rate req/s", "mean_rps")):
        x, y = steps([w[key] for w in spans])
        data.append(_scatter(x=x, y=y, mode="lines", name=label, line={"width": 1}))
    for name, entry in curve["designs"].items():
        if not entry["feasible"]:
            continue
        for pool, role in ((0, "prompt"), (1, "token")):
            if not any(p[pool] for p in entry["plan"]):
                continue
            x, y = steps([p[pool] for p in entry["plan"]])
            data.append(_scatter(x=x, y=y, mode="lines", yaxis="y2",
                                 name=f"{name} {role if entry['static'][1] else 'machines'}"))
            data.append(_scatter(x=[hours[0], hours[-1]], y=[entry["static"][pool]] * 2,
                                 mode="lines", yaxis="y2", line={"dash": "dot"},
                                 name=f"{name} {role if entry['static'][1] else 'machines'}, "
                                      "static"))
    layout = {"title": {"text": "Load over the curve and the machines per pool, planned "
                                "(solid) and static (dotted)"},
              "xaxis": {"title": {"text": "hours from the curve's start"}},
              "yaxis": {"title": {"text": "requests per second"}},
              "yaxis2": {"title": {"text": "machines"}, "overlaying": "y", "side": "right"},
              "height": 520, "legend": {"orientation": "h", "y": -0.2}}
    return {"data": data, "layout": layout}


def _window_series(document: dict, key: str) -> list[dict]:
    """One line per design and whole-curve run (plan solid, static dotted) of the per-window
    values `key` of each feasible design's whole-curve checks."""
    curve = document["load_curve"]
    middles = [(w["start_s"] + w["end_s"]) / 7200.0 for w in curve["windows"]]
    data = []
    for name, entry in curve["designs"].items():
        checked = entry.get("whole_curve") if entry["feasible"] else None
        if checked is None:
            continue
        for label, dash in (("plan", "solid"), ("static", "dot")):
            values = checked[label].get(key)
            if values:
                data.append(_scatter(x=middles, y=values, mode="lines+markers",
                                     line={"dash": dash, "shape": "hvh"},
                                     name=f"{name} {label}"))
    return data


def curve_margin_figure(document: dict) -> dict | None:
    """--load-curve: each window's worst SLO margin in the whole-curve runs of the static
    cluster (dotted) and of the plan (solid); below 0, the window missed an SLO."""
    data = _window_series(document, "window_margins")
    if not data:
        return None
    layout = {"title": {"text": "Worst SLO margin of each window in the whole-curve runs "
                                "(1 - value / limit; below 0: missed)"},
              "xaxis": {"title": {"text": "hours from the curve's start"}},
              "yaxis": {"title": {"text": "worst margin (fraction of the limit)"},
                        "tickformat": ".0%", "zeroline": True},
              "height": 420, "legend": {"orientation": "h", "y": -0.25}}
    return {"data": data, "layout": layout}


def curve_prefix_figure(document: dict) -> dict | None:
    """--load-curve with prefix caching: each window's prefix hit rate (the prefill tokens of
    the requests arriving in it found cached) in the whole-curve runs of the static cluster
    (dotted) and of the plan (solid); None without the cache."""
    data = _window_series(document, "window_prefix_hit_rates")
    if not data:
        return None
    layout = {"title": {"text": "Prefix cache hit rate of each window in the whole-curve runs "
                                "(prefill tokens of its requests found cached)"},
              "xaxis": {"title": {"text": "hours from the curve's start"}},
              "yaxis": {"title": {"text": "hit rate"}, "tickformat": ".0%", "rangemode": "tozero"},
              "height": 420, "legend": {"orientation": "h", "y": -0.25}}
    return {"data": data, "layout": layout}


def hardware_figure(results: Sequence[DesignResult]) -> dict | None:
    """A hardware search: every feasible design's optimum, cost against power, coloured by
    prompt SKU (uncalibrated ones drawn as crosses), the Pareto front joined."""
    done = [r for r in results if r.optimum is not None]
    if not done:
        return None
    data = []
    for sku in dict.fromkeys(r.design.prompt.name for r in done):
        ours = [r for r in done if r.design.prompt.name == sku]
        data.append(_scatter(
            x=[r.optimum.cost_per_hour for r in ours], y=[r.optimum.power_kw for r in ours],
            mode="markers", name=f"prompt {sku}",
            marker={"size": 11, "symbol": ["x" if r.uncalibrated else "circle" for r in ours]},
            text=[_hardware_hover(r) for r in ours], hoverinfo="text"))
    front = pareto_front(done)
    data.append(_scatter(x=[r.optimum.cost_per_hour for r in front],
                         y=[r.optimum.power_kw for r in front], mode="lines+text",
                         name="Pareto front (cost, power)", text=[r.design.name for r in front],
                         textposition="top right", line={"dash": "dot", "color": "#444"},
                         hoverinfo="skip"))
    layout = {"title": {"text": "Every feasible design: cost against power (x: uncalibrated "
                                "latencies; dotted: the Pareto front)"},
              "xaxis": {"title": {"text": "cost $/h"}},
              "yaxis": {"title": {"text": "power kW"}}, "height": 560}
    return {"data": data, "layout": layout}


def pareto_front(results: Sequence[DesignResult]) -> list[DesignResult]:
    """The designs no other beats in both cost and power, cheapest first."""
    ordered = sorted(results, key=lambda r: (r.optimum.cost_per_hour, r.optimum.power_kw))
    front, least_power = [], math.inf
    for r in ordered:
        if r.optimum.power_kw < least_power:
            front.append(r)
            least_power = r.optimum.power_kw
    return front


def _hardware_hover(result: DesignResult) -> str:
    o, d = result.optimum, result.design
    pools = d.pools_text(o.prompt_machines, o.token_machines, "skus")
    note = f"<br>uncalibrated: {', '.join(result.uncalibrated)}" if result.uncalibrated else ""
    return (f"<b>{html.escape(d.name)}</b><br>{pools}<br>${o.cost_per_hour:,.2f}/h, "
            f"{o.power_kw:,.1f} kW, {o.gpus} GPUs{note}")


def _served_rate(result: DesignResult) -> float | None:
    """The optimum's rate, or the throughput a closed loop's users achieved on it."""
    if result.optimum.rate_rps is not None:
        return result.optimum.rate_rps
    return ((result.verification or {}).get("closed_loop") or {}).get("throughput_rps")


def summary_figure(results: Sequence[DesignResult]) -> dict | None:
    done = [r for r in results if r.optimum is not None]
    if not done:
        return None
    names = [r.design.name for r in done]
    layout = subplot_grid(1, 3, ("cost $/h", "power kW", "throughput req/s"))
    series = ((lambda r: r.optimum.cost_per_hour, "#1f77b4"),
              (lambda r: r.optimum.power_kw, "#ff7f0e"), (_served_rate, "#2ca02c"))
    data = [_in_cell({"type": "bar", "x": names, "y": [value(r) for r in done],
                      "marker": {"color": colour}, "showlegend": False}, cell)
            for cell, (value, colour) in enumerate(series, start=1)]
    layout.update(title={"text": "Optimum of each design"}, height=420)
    return {"data": data, "layout": layout}
