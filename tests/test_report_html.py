"""report.html in a headless browser: the page must render its plotly figures without a single
console error or warning (plotly.js reports bad figure specs as console warnings, e.g. "Invalid
color specifier", not as errors)."""
from __future__ import annotations

import html
import json
import re
import shutil
import subprocess

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FIGURES = ("fig-design-space", "fig-latency-load", "fig-summary")

# Injected first in <head>, before plotly.js is inlined, so it sees every console call. plotly.js
# logs its warnings through console.trace("WARN: ...") and its errors through console.error, so
# every channel is recorded (and still forwarded to the browser's own log).
PROBE = """<script>
window.__console = [];
window.addEventListener('error', e => window.__console.push('uncaught: ' + e.message));
window.addEventListener('unhandledrejection',
  e => window.__console.push('unhandled rejection: ' + String(e.reason)));
for (const level of ['error', 'warn', 'trace', 'assert', 'log', 'info', 'debug']) {
  const original = console[level];
  console[level] = function (...args) {
    if (level !== 'assert' || !args[0]) {
      window.__console.push(level + ': ' + (level === 'assert' ? args.slice(1) : args)
        .map(a => { try { return typeof a === 'string' ? a : JSON.stringify(a); }
                    catch (err) { return String(a); } }).join(' '));
    }
    return original.apply(console, args);
  };
}
window.addEventListener('load', () => setTimeout(() => {
  const figures = {};
  for (const div of document.querySelectorAll('.js-plotly-plot')) {
    figures[div.id] = {
      svgs: div.querySelectorAll('.main-svg').length,
      points: div.querySelectorAll('.scatterlayer .point, .barlayer .point').length,
      legend: Array.from(div.querySelectorAll('.legend .legendtext')).map(t => t.textContent),
    };
  }
  document.body.setAttribute('data-console', JSON.stringify(window.__console));
  document.body.setAttribute('data-figures', JSON.stringify(figures));
}, 1000));
</script>"""

# Chromium's --enable-logging=stderr echo of page console messages, e.g.
#   [12:12:1123/140617.761111:INFO:CONSOLE:45] "WARN: Invalid color specifier ...", source: ...
#   [12:12:1123/140617.761111:WARNING:CONSOLE(45)] "...", source: ...
CONSOLE_LINE = re.compile(r"^\[[^\]]*:(?P<level>[A-Z]+):CONSOLE[^\]]*\]\s*(?P<message>.*)$",
                          re.MULTILINE)


def console_problems(stderr: str) -> list[str]:
    """Page console messages in chromium's log that are errors or warnings, by level or text."""
    problems = []
    for match in CONSOLE_LINE.finditer(stderr):
        level, message = match.group("level"), match.group("message")
        if level in ("WARNING", "ERROR", "FATAL") or re.search(
                r"\b(warn|warning|error|uncaught|invalid)\b", message, re.IGNORECASE):
            problems.append(f"{level}: {message}")
    return problems


@pytest.fixture(scope="module")
def report_html(tmp_path_factory, run_cli):
    out = tmp_path_factory.mktemp("report") / "out"
    run = run_cli("search", "--designs", "splitwise-hh,baseline-h100", "--rate", "20",
                  "--duration", "30", "--jobs", "1", "--out", out, "--no-cache")
    assert run.returncode == 0, run.stderr[-3000:]
    return (out / "report.html").read_text()


def render(page_html: str, tmp_path):
    page = tmp_path / "page.html"
    page.write_text(page_html.replace("<head>", "<head>" + PROBE, 1))
    run = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--disable-extensions", f"--user-data-dir={tmp_path / 'profile'}",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=15000", "--dump-dom",
         page.as_uri()],
        capture_output=True, text=True, timeout=180)
    found = {name: re.search(rf'data-{name}="([^"]*)"', run.stdout)
             for name in ("console", "figures")}
    assert all(found.values()), f"the probe did not report: {run.stderr[-3000:]}"
    console, figures = (json.loads(html.unescape(found[n].group(1))) for n in ("console", "figures"))
    return console, figures, run


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_report_html_has_no_console_errors_or_warnings(report_html, tmp_path):
    console, figures, run = render(report_html, tmp_path)
    problems = [m for m in console if not m.startswith(("log: ", "info: ", "debug: "))]
    assert problems == [], problems
    assert console_problems(run.stderr) == []
    # the figures rendered: each one is a plotly div with its SVG layers and drawn data
    assert set(figures) == set(FIGURES), figures
    for div_id in FIGURES:
        assert figures[div_id]["svgs"] >= 2, (div_id, figures[div_id])
        assert figures[div_id]["points"] > 0, (div_id, figures[div_id])
    legend = figures["fig-design-space"]["legend"]
    assert legend.count("feasible") == 1 and "infeasible" in legend and "optimum" in legend
    assert {"P50", "P90", "P99"} <= set(figures["fig-latency-load"]["legend"])


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_console_probe_catches_plotly_warnings(tmp_path):
    """The probe itself must hear plotly.js warnings (so a silent page above means no warnings,
    not a deaf probe): a legend entry for markers coloured by numbers through a coloraxis is what
    made report.html warn "Invalid color specifier: number ..." before."""
    import plotly.graph_objects as go
    import plotly.io as pio
    figure = go.Figure(go.Scatter(x=[1, 2], y=[1, 2], mode="markers", name="coloured",
                                  showlegend=True,
                                  marker={"color": [380.0, 456.0], "coloraxis": "coloraxis"}))
    figure.update_layout(coloraxis={"colorscale": "Viridis"})
    page = ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"></head><body>"
            + pio.to_html(figure, full_html=False, include_plotlyjs=True, div_id="probe-check")
            + "</body></html>")
    console, figures, run = render(page, tmp_path)
    assert figures["probe-check"]["svgs"] >= 2
    assert any("Invalid color specifier" in m for m in console), console
    assert any("Invalid color specifier" in m for m in console_problems(run.stderr)), \
        run.stderr[-3000:]
