"""`provision serve`: a local what-if page over `provisioner.search` (issue 42).

The page is plain HTML with a form and plotly figures; its state is the address's query string,
so a link reproduces the question. The query string holds the search options that differ from
their defaults (the option names of `provisioner.options`, checked by the same declarations as
the command line), plus `slo_METRIC_PCT=LIMIT` overrides of the SLO profile's limits (written to
a small profile file in the serve cache, whose report then names that file).

Each question runs `provisioner.search` in a background thread (one search at a time; the
cores are the simulator's) with the serve's evaluation cache, so revisiting a point is instant;
`/api/search?QUERY` starts it if needed and answers its state (the page polls it), then the
optimum per design, the figures and the report's tables. `/report.json?QUERY` downloads the
report of a finished question, the document `provision check` accepts.

The server is the standard library's ThreadingHTTPServer: a handful of GET routes on loopback
need no framework. plotly.js is served once, from the installed plotly package.
"""
from __future__ import annotations

import hashlib
import html
import ipaddress
import json
import socket
import threading
import time
import traceback
from collections import OrderedDict
from dataclasses import fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from hardware_catalog import InputError
from hardware_catalog.checks import Flag, Mapping
from provisioner.options import SearchOptions, _cli_type, check_value, leaves

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
KEPT_QUESTIONS = 32          # finished questions kept in memory (the disk cache keeps the rest)
ABANDONED_S = 5.0            # a queued question nobody asked about for this long is not searched
SLO_PREFIX = "slo_"          # slo_ttft_p99=6: an SLO limit override

# The options a query string may carry: the question's (echoed in report.json), not how or
# where it runs (jobs, cache, output: the server's own).
QUERY_FIELDS = {path[-1]: f for path, f in leaves(SearchOptions)
                if path[0] != "execution" and f.metadata["echo"]
                and (f.metadata["cli"] or f.metadata["spec"])}


# ------------------------------------------------------------------ the question as a query
def _text(value: Any) -> str:
    """One option value as query-string text (the inverse of `_parsed`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    if isinstance(value, (tuple, list)):
        if value and all(isinstance(v, (tuple, list)) and len(v) == 2 for v in value):
            return ",".join(f"{k}={_text(v)}" for k, v in value)   # prices: SKU=USD
        return ",".join(_text(v) for v in value)
    return str(value)


def _parsed(f, text: str) -> Any:
    """Query text as the value the command line would pass the option's check."""
    check = f.metadata["check"]
    if isinstance(check, Flag):
        lowered = text.strip().lower()
        if lowered not in ("true", "false", "1", "0", "yes", "no"):
            raise InputError(f"{f.name} must be true or false, got {text[:40]!r}")
        return lowered in ("true", "1", "yes")
    if isinstance(check, Mapping):
        try:
            return json.loads(text)
        except ValueError:
            raise InputError(f"{f.name} must be a JSON mapping") from None
    kind = _cli_type(f)
    if kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise InputError(f"{f.name} must be {what}, got {text[:40]!r}") from None
    return text


def parse_query(query: str) -> tuple[dict[str, Any], dict[tuple[str, str], float]]:
    """(options, SLO limit overrides) of a query string, each checked as the command line checks
    it; an InputError names the query key. Empty values mean the option's default."""
    from slo_profiles import MAX_LIMIT, METRICS, PERCENTILES
    from hardware_catalog.checks import Invalid, positive
    options: dict[str, Any] = {}
    limits: dict[tuple[str, str], float] = {}
    for key, text in parse_qsl(query, keep_blank_values=True):
        if key in options or (key.startswith(SLO_PREFIX) and key != "slo"
                              and tuple(key[len(SLO_PREFIX):].split("_", 1)) in limits):
            raise InputError(f"{key} is given twice in the query string")
        if not text.strip():
            continue
        if key.startswith(SLO_PREFIX) and key != "slo":
            metric, _, pct = key[len(SLO_PREFIX):].partition("_")
            if metric not in METRICS or pct not in PERCENTILES:
                raise InputError(f"unknown SLO limit {key}; use slo_METRIC_PCT with METRIC one "
                                 f"of {', '.join(METRICS)} and PCT one of "
                                 f"{', '.join(PERCENTILES)}")
            try:
                limits[(metric, pct)] = positive(MAX_LIMIT)(float(text))
            except (ValueError, Invalid) as err:
                raise InputError(f"{key} must be a number > 0, got {text[:40]!r}"
                                 if isinstance(err, ValueError) else f"{key} {err}") from None
            continue
        if key not in QUERY_FIELDS:
            raise InputError(f"unknown option {key} in the query string; known: the options "
                             "of `provision search --help` with underscores (not the "
                             "execution ones), and slo_METRIC_PCT")
        f = QUERY_FIELDS[key]
        value = check_value(f, _parsed(f, text), key)
        if value != f.default:
            options[key] = value
    return options, limits


def to_query(options: dict[str, Any], limits: dict[tuple[str, str], float] | None = None) -> str:
    """The canonical query string of a question: its non-default options in declaration order,
    then its SLO overrides."""
    pairs = [(name, _text(options[name])) for name in QUERY_FIELDS
             if name in options and options[name] is not None
             and options[name] != QUERY_FIELDS[name].default]
    pairs += [(f"{SLO_PREFIX}{metric}_{pct}", _text(float(limit)))
              for (metric, pct), limit in sorted((limits or {}).items(), key=_limit_order)]
    return urlencode(pairs, safe=",=/:")


def _limit_order(item) -> tuple[int, int]:
    from slo_profiles import METRICS, PERCENTILES
    (metric, pct), _ = item
    return METRICS.index(metric), list(PERCENTILES).index(pct)


def base_options(report: str | Path | None = None, spec: str | Path | None = None
                 ) -> dict[str, Any]:
    """The question the page opens on: a report's echoed options, a spec file's, or none (the
    defaults: `provision search`'s own question)."""
    if report is not None and spec is not None:
        raise InputError("give REPORT.json or --spec, not both")
    if report is not None:
        from provisioner.check import read_report
        from provisioner.question import options_from_echo
        path = Path(report)
        document = read_report(path)
        options = options_from_echo(document["inputs"], str(path), path.resolve().parent)
        values = {f.name: getattr(getattr(options, group.name), f.name)
                  for group in fields(options) for f in fields(getattr(options, group.name))}
        if any(not isinstance(d, str) for d in values.get("designs", ())):
            raise InputError("designs built in Python cannot be put in a page's address; "
                             "serve a report whose designs are catalog names", source=str(path),
                             field="inputs.options.designs")
        return {name: value for name, value in values.items()
                if name in QUERY_FIELDS and value is not None
                and value != QUERY_FIELDS[name].default}
    if spec is not None:
        from provisioner.options import read_spec
        given = read_spec(spec)
        return {name: value for name, value in given.items()
                if name in QUERY_FIELDS and value != QUERY_FIELDS[name].default}
    return {}


# ------------------------------------------------------------------------------ questions
class Question:
    """One search of the page: its state, progress and, when done, its result."""

    def __init__(self, query: str, options: dict, limits: dict):
        self.query, self.options, self.limits = query, options, limits
        self.state = "queued"            # queued, running, done, error
        self.progress: dict[str, int] = {}
        self.finished: list[str] = []
        self.started = self.asked = time.monotonic()
        self.seconds: float | None = None
        self.error: str | None = None
        self.result = None               # provisioner.api.SearchResult
        self.document: dict | None = None
        self.view: dict | None = None

    def on_batch(self, asked: dict[str, int]) -> None:
        self.progress = dict(asked)
        self.finished = sorted(getattr(asked, "finished", ()))

    def status(self) -> dict:
        answer = {"query": self.query, "state": self.state,
                  "progress": {"points": self.progress, "finished": self.finished,
                               "seconds": round(time.monotonic() - self.started, 1)
                               if self.seconds is None else self.seconds}}
        if self.state == "error":
            answer["error"] = self.error
        if self.state == "done":
            answer.update(self.view)
        return answer


class Explorer:
    """The questions of one `provision serve`: each searched once, in the background, one at a
    time, through `provisioner.search` with the serve's evaluation cache."""

    def __init__(self, base: dict[str, Any] | None = None, cache_dir: str | Path | None = None,
                 jobs: int | None = None, base_limits: dict | None = None):
        from provisioner.runner import default_cache_dir
        self.base = dict(base or {})
        self.base_limits = dict(base_limits or {})
        self.cache_dir = Path(cache_dir) if cache_dir is not None else \
            default_cache_dir() / "serve"
        self.jobs = jobs
        self.questions: OrderedDict[str, Question] = OrderedDict()
        self.lock = threading.Lock()          # the questions table
        self.searching = threading.Lock()     # one search at a time
        self.closed = False

    def close(self) -> None:
        """No more searches: the queued ones do not start; returns when the running one ends."""
        self.closed = True
        with self.searching:
            pass

    @property
    def base_query(self) -> str:
        return to_query(self.base, self.base_limits)

    def canonical(self, query: str) -> tuple[str, dict, dict]:
        """The question's canonical query, options and SLO overrides (those equal to the
        profile's own limits dropped); InputError for bad options."""
        options, limits = parse_query(query)
        if limits:
            from slo_profiles import load_slo_profile
            profile = load_slo_profile(options.get("slo", QUERY_FIELDS["slo"].default))
            limits = {k: v for k, v in limits.items() if profile.limits.get(k) != v}
        return to_query(options, limits), options, limits

    def ask(self, query: str) -> Question:
        """The question of `query`, started in the background if it is new."""
        canonical, options, limits = self.canonical(query)
        with self.lock:
            question = self.questions.get(canonical)
            if question is not None:
                self.questions.move_to_end(canonical)
                question.asked = time.monotonic()
                return question
            question = Question(canonical, options, limits)
            self.questions[canonical] = question
            for key in [k for k, q in self.questions.items() if q.state in ("done", "error")]:
                if len(self.questions) <= KEPT_QUESTIONS:
                    break
                del self.questions[key]
        threading.Thread(target=self._run, args=(question,), daemon=True,
                         name=f"provision-serve-{len(self.questions)}").start()
        return question

    def keywords(self, options: dict, limits: dict) -> dict:
        """`provisioner.search`'s keywords for a question (its SLO overrides as a profile file
        in the cache, named by its content)."""
        keywords = dict(options)
        if limits:
            keywords["slo"] = str(self.slo_file(options.get("slo", QUERY_FIELDS["slo"].default),
                                                limits))
        return {**keywords, "cache_dir": str(self.cache_dir),
                **({"jobs": self.jobs} if self.jobs else {})}

    def slo_file(self, name: str, limits: dict) -> Path:
        import yaml
        from slo_profiles import load_slo_profile
        profile = load_slo_profile(name)
        merged = {**profile.limits, **limits}
        nested: dict = {}
        for (metric, pct), limit in merged.items():
            nested.setdefault(metric, {})[pct] = limit
        data = {"description": f"{profile.name} with limits changed in provision serve",
                "kind": profile.kind, "limits": nested}
        text = yaml.safe_dump(data, sort_keys=True)
        digest = hashlib.sha256(text.encode()).hexdigest()[:10]
        path = self.cache_dir / "slo" / f"{profile.name}-{digest}.yaml"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{threading.get_ident()}.tmp")
            partial.write_text(text)
            partial.replace(path)
        return path

    def _run(self, question: Question) -> None:
        import provisioner
        with self.searching:
            if self.closed:
                question.state, question.error = "error", "the server is stopping"
                return
            if time.monotonic() - question.asked > ABANDONED_S:
                # the page moved on while it waited (its polls stopped): not searched; asked
                # again, it is a new question
                with self.lock:
                    if self.questions.get(question.query) is question:
                        del self.questions[question.query]
                question.state, question.error = "error", "abandoned before it was searched"
                return
            question.state, question.started = "running", time.monotonic()
            try:
                result = provisioner.search(on_batch=question.on_batch,
                                            **self.keywords(question.options, question.limits))
                question.result, question.document = result, result.to_dict()
                question.view = page_view(result, question.document)
                question.state = "done"
            except InputError as err:
                question.error, question.state = " ".join(str(err).split()), "error"
            except Exception as err:   # the page says so in one line; the log has the rest
                traceback.print_exc()
                question.error = f"the search failed: {type(err).__name__}: {err}"[:500]
                question.state = "error"
            finally:
                question.seconds = round(time.monotonic() - question.started, 2)


def optimum_record(entry: dict) -> dict | None:
    """A design's optimum as the page lists it (and as the tests compare it)."""
    o = entry["optimum"]
    if o is None:
        return None
    return {"machines": o.get("machines"), "prompt_machines": o.get("prompt_machines"),
            "token_machines": o.get("token_machines"), "rate_rps": o["rate_rps"],
            "cost_per_hour": o["cost_per_hour"], "power_kw": o["power_kw"], "gpus": o["gpus"]}


def page_view(result, document: dict) -> dict:
    """What the page shows of a finished search: the answer, the optimum per design, the
    figures (plotly figure dicts, the ones report.html draws for such a search, the cost-power
    front first) and the report's tables as HTML."""
    from provisioner.figures import (curve_margin_figure, design_space_figure,
                                     hardware_figure, latency_load_figure, load_curve_figure,
                                     optimum_html, plotly_template)
    from provisioner.tables import answer_sentence
    inputs = document["inputs"]
    built = {"fig-pareto": hardware_figure(result.designs)}
    if built["fig-pareto"] is not None:
        built["fig-pareto"]["layout"]["title"]["text"] = (
            "Cost against power of each design's optimum (dotted: the Pareto front; "
            "x: uncalibrated latencies)")
    if document.get("load_curve") is not None:
        built.update({"fig-load-curve": load_curve_figure(document),
                      "fig-curve-margins": curve_margin_figure(document)})
    elif document["summary"].get("hardware") is None:   # --hardware: dozens of designs
        built.update({"fig-design-space": design_space_figure(result.designs, inputs),
                      "fig-latency-load": latency_load_figure(result.designs, inputs)})
    figures = {}
    for div_id, figure in built.items():
        if figure is not None:
            figure["layout"]["template"] = plotly_template()
            figures[div_id] = figure
    return {"answer": answer_sentence(document),
            "best_design": document["summary"]["best_design"],
            "optima": {e["design"]: optimum_record(e) for e in document["designs"]},
            "slo_profile": inputs["slo_profile"],
            "figures": figures, "tables_html": optimum_html(document)}


# ---------------------------------------------------------------------------------- server
def check_host(host: str, allow_remote: bool) -> None:
    """Loopback only unless asked: the page runs searches for whoever can reach it."""
    if allow_remote:
        return
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (socket.gaierror, UnicodeError) as err:
        raise InputError(f"--host {host!r} cannot be resolved ({err})") from None
    remote = sorted(a for a in addresses
                    if not ipaddress.ip_address(a.split("%", 1)[0]).is_loopback)
    if remote or not addresses:
        raise InputError(f"--host {host} is not a loopback address ({', '.join(remote)}): "
                         "anyone who reaches it could run searches on this machine; give "
                         "--allow-remote to listen there anyway")


def make_server(explorer: Explorer, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                allow_remote: bool = False) -> ThreadingHTTPServer:
    """The page's HTTP server, bound (port 0: any free port) but not yet serving."""
    check_host(host, allow_remote)
    handler = type("Handler", (PageHandler,), {"explorer": explorer})
    server_class = ThreadingHTTPServer
    if ":" in host:
        server_class = type("Server6", (ThreadingHTTPServer,),
                            {"address_family": socket.AF_INET6})
    try:
        server = server_class((host, port), handler)
    except OSError as err:
        raise InputError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    server.daemon_threads = True
    return server


def page_url(server: ThreadingHTTPServer, query: str = "") -> str:
    host, port = server.server_address[:2]
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}/" + (f"?{query}" if query else "")


class PageHandler(BaseHTTPRequestHandler):
    explorer: Explorer
    server_version = "provision-serve"

    def log_message(self, format, *args):   # quiet: the terminal shows the URL and errors
        pass

    def do_GET(self):
        parts = urlsplit(self.path)
        route = {"/": self._page, "/plotly.min.js": self._plotly,
                 "/api/search": self._search, "/report.json": self._report}.get(parts.path)
        if route is None:
            return self._send(404, "text/plain", b"not found\n")
        try:
            route(parts.query)
        except InputError as err:
            self._json(400, {"state": "error", "error": " ".join(str(err).split())})

    def _send(self, code: int, kind: str, body: bytes, headers: dict | None = None):
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, document: dict, headers: dict | None = None):
        self._send(code, "application/json", json.dumps(document).encode(), headers)

    def _page(self, query: str):
        self._send(200, "text/html; charset=utf-8", page_html(self.explorer).encode())

    def _plotly(self, query: str):
        self._send(200, "application/javascript", plotly_js(),
                   {"Cache-Control": "max-age=86400"})

    def _search(self, query: str):
        self._json(200, self.explorer.ask(query).status(), {"Cache-Control": "no-store"})

    def _report(self, query: str):
        question = self.explorer.ask(query)
        if question.state != "done":
            return self._json(409, question.status())
        from provisioner.reports import json_text
        self._send(200, "application/json", json_text(question.document).encode(),
                   {"Content-Disposition": 'attachment; filename="report.json"'})


_PLOTLY: list[bytes] = []


def plotly_js() -> bytes:
    if not _PLOTLY:
        from provisioner.figures import plotly_package_file
        _PLOTLY.append(plotly_package_file("plotly.min.js"))
    return _PLOTLY[0]


# -------------------------------------------------------------------------------- the page
def form_choices(explorer: Explorer) -> dict:
    """The names the form offers (the catalog's designs, models and SKUs; SLO profiles)."""
    from provisioner.options import GOALS
    from provisioner.question import resolve_catalog
    from slo_profiles import METRICS, PERCENTILES, builtin_slo_profiles
    catalog = resolve_catalog(explorer.base.get("catalog"))
    return {"designs": list(catalog.designs), "models": list(catalog.models),
            "skus": {name: m.cost_per_hour for name, m in catalog.machines.items()},
            "profiles": {name: p.as_dict() for name, p in builtin_slo_profiles().items()},
            "goals": list(GOALS), "metrics": list(METRICS), "percentiles": list(PERCENTILES),
            "base_query": explorer.base_query}


# The form's fields: (query key, label, input type, help)
FORM_FIELDS = (
    ("rate", "rate req/s", "number", "requests per second (min-cost / min-power)"),
    ("goal", "goal", "goal", ""),
    ("power_budget_kw", "power budget kW", "number", "max-rate"),
    ("cost_budget_per_hour", "cost budget $/h", "number", "max-rate"),
    ("budget_like", "budget like", "text", "[power:|cost:]SKU:N"),
    ("designs", "designs", "text", "all, or D1,D2 (catalog names or PROMPT_SKU/TOKEN_SKU)"),
    ("hardware", "hardware", "text", "instead of designs: all, or SKU1,SKU2"),
    ("price", "prices", "text", "SKU=USD,... per hour"),
    ("model", "model", "model", ""),
    ("slo", "SLO profile", "slo", ""),
)


def page_html(explorer: Explorer) -> str:
    choices = json.dumps(form_choices(explorer)).replace("</", "<\\/")
    rows = []
    for key, label, kind, hint in FORM_FIELDS:
        if kind in ("goal", "model", "slo"):
            field = f'<select name="{key}" id="f-{key}"></select>'
        else:
            step = ' step="any" min="0"' if kind == "number" else ""
            field = f'<input name="{key}" id="f-{key}" type="{kind}"{step} size="36">'
        rows.append(f"<label>{html.escape(label)} {field} <small>{html.escape(hint)}</small>"
                    "</label>")
    return PAGE.replace("{{FIELDS}}", "\n".join(rows)).replace("{{CHOICES}}", choices)


PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>provision serve: what if?</title>
<style>
body{font-family:sans-serif;margin:1.2em;max-width:1400px}
form label{display:block;margin:.25em 0}
form small{color:#666}
table{border-collapse:collapse;margin:.8em 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}
#slo-limits input{width:6em}
.warn{color:#a15c00}
#status{padding:.4em;background:#f3f3f3}
#status.error{background:#fde2e2;color:#8a1010}
</style>
<script src="/plotly.min.js"></script>
</head>
<body data-state="loading">
<h1>provision serve: what if?</h1>
<form id="question">
{{FIELDS}}
<table id="slo-limits"></table>
<button type="submit" id="apply">Search</button>
<a id="download" href="#">report.json of this view</a>
</form>
<p id="status">loading</p>
<p id="answer"></p>
<table id="optima"></table>
<div id="fig-pareto"></div>
<div id="fig-design-space"></div>
<div id="fig-latency-load"></div>
<div id="fig-load-curve"></div>
<div id="fig-curve-margins"></div>
<div id="tables"></div>
<script>
const CHOICES = {{CHOICES}};
const FORM_KEYS = Array.from(document.querySelectorAll('#question [name]')).map(e => e.name);
const FIGURES = ['fig-pareto', 'fig-design-space', 'fig-latency-load', 'fig-load-curve',
                 'fig-curve-margins'];
let current = null;      // the query string on show
let poller = null;

function fill(select, values, labels) {
  select.innerHTML = '';
  for (const v of values) {
    const o = document.createElement('option');
    o.value = v; o.textContent = labels ? labels[v] : v;
    select.appendChild(o);
  }
}
fill(document.getElementById('f-goal'), CHOICES.goals);
fill(document.getElementById('f-model'), CHOICES.models);
fill(document.getElementById('f-slo'), Object.keys(CHOICES.profiles));
document.getElementById('f-price').placeholder =
  Object.entries(CHOICES.skus).map(([k, v]) => k + '=' + v).slice(0, 3).join(',') + ',...';
document.getElementById('f-designs').placeholder = 'all: ' + CHOICES.designs.join(',');

function limitsTable(profile) {
  const table = document.getElementById('slo-limits');
  const unit = m => (profile.kind === 'slowdown' && m !== 'itl') ? 'x' : 'ms';
  let rows = '<tr><th>SLO limit</th>' +
    CHOICES.percentiles.map(p => '<th>' + p.toUpperCase() + '</th>').join('') + '</tr>';
  for (const m of CHOICES.metrics) {
    rows += '<tr><td>' + m.toUpperCase() + ' (' + unit(m) + ')</td>';
    for (const p of CHOICES.percentiles) {
      const v = (profile.limits[m] || {})[p];
      rows += '<td><input type="number" step="any" min="0" name="slo_' + m + '_' + p +
              '" value="' + (v === undefined ? '' : v) + '" placeholder="none"></td>';
    }
    rows += '</tr>';
  }
  table.innerHTML = rows;
}

function showForm(query, profile) {
  const params = new URLSearchParams(query);
  for (const key of FORM_KEYS) {
    const el = document.querySelector('#question [name="' + key + '"]');
    if (el && !key.startsWith('slo_')) el.value = params.get(key) || '';
  }
  if (!params.get('goal')) document.getElementById('f-goal').value = 'min-cost';
  if (!params.get('model')) document.getElementById('f-model').value = 'bloom-176b';
  const slo = document.getElementById('f-slo');
  const named = params.get('slo');
  if (named && !Array.from(slo.options).some(o => o.value === named)) {
    const o = document.createElement('option');   // a profile file (a spec's, a report's)
    o.value = named; o.textContent = named; slo.appendChild(o);
  }
  slo.value = named || 'splitwise';
  if (profile) limitsTable(profile);
  else if (CHOICES.profiles[slo.value]) {
    const p = JSON.parse(JSON.stringify(CHOICES.profiles[slo.value]));
    for (const [k, v] of params) {
      const m = /^slo_([a-z]+)_(p[0-9]+)$/.exec(k);
      if (m) { p.limits[m[1]] = p.limits[m[1]] || {}; p.limits[m[1]][m[2]] = Number(v); }
    }
    limitsTable(p);
  }
}

function formQuery() {
  // the form's fields replace their keys; options the form does not show are kept (the
  // server drops SLO limits equal to the profile's own)
  const params = new URLSearchParams(current || '');
  for (const key of Array.from(params.keys())) {
    if (key.startsWith('slo_')) params.delete(key);
  }
  for (const el of document.querySelectorAll('#question [name]')) {
    if (el.value.trim() === '') params.delete(el.name); else params.set(el.name, el.value.trim());
  }
  return params.toString();
}

function setStatus(text, error) {
  const s = document.getElementById('status');
  s.textContent = text; s.className = error ? 'error' : '';
}

function cell(v) { return '<td>' + (v === null || v === undefined ? '-' : v) + '</td>'; }

function showAnswer(answer) {
  document.getElementById('answer').textContent = answer.answer;
  let rows = '<tr><th>design</th><th>P</th><th>T</th><th>rate req/s</th><th>cost $/h</th>' +
             '<th>power kW</th><th>GPUs</th></tr>';
  for (const [name, o] of Object.entries(answer.optima)) {
    const best = name === answer.best_design ? ' ★' : '';
    if (!o) { rows += '<tr data-design="' + name + '"><td>' + name + '</td><td colspan="6">infeasible</td></tr>'; continue; }
    rows += '<tr data-design="' + name + '" data-optimum=\\'' + JSON.stringify(o) + '\\'><td>' +
      name + best + '</td>' + cell(o.machines !== null ? o.machines : o.prompt_machines) +
      cell(o.machines !== null ? null : o.token_machines) + cell(o.rate_rps) +
      cell(o.cost_per_hour.toFixed(2)) + cell(o.power_kw.toFixed(1)) + cell(o.gpus) + '</tr>';
  }
  document.getElementById('optima').innerHTML = rows;
  for (const id of FIGURES) {
    const div = document.getElementById(id);
    const figure = answer.figures[id];
    if (figure) Plotly.react(div, figure.data, figure.layout, {displaylogo: false});
    else { Plotly.purge(div); div.innerHTML = ''; }
  }
  document.getElementById('tables').innerHTML = answer.tables_html;
}

async function poll(query) {
  let answer;
  try {
    const response = await fetch('/api/search?' + query, {cache: 'no-store'});
    answer = await response.json();
  } catch (err) {
    setStatus('the server did not answer: ' + err, true);
    document.body.dataset.state = 'error';
    return;
  }
  if (query !== current) return;               // a newer question was asked meanwhile
  if (answer.state === 'error') {
    setStatus(answer.error, true);
    document.body.dataset.state = 'error';
    return;
  }
  if (answer.query !== current) {              // the canonical form of the same question
    current = answer.query;
    history.replaceState(null, '', '?' + current);
  }
  document.getElementById('download').href = '/report.json?' + current;
  if (answer.state !== 'done') {
    const p = answer.progress;
    const points = Object.entries(p.points).map(([d, n]) =>
      d + ' ' + n + (p.finished.includes(d) ? ' (done)' : '')).join(', ');
    setStatus(answer.state + ' for ' + p.seconds + ' s' + (points ? ': points asked ' + points : ''));
    document.body.dataset.state = answer.state;
    poller = setTimeout(() => poll(current), 300);
    return;
  }
  setStatus('done in ' + answer.progress.seconds + ' s');
  showForm(current, answer.slo_profile);
  showAnswer(answer);
  document.body.dataset.query = current;
  document.body.dataset.state = 'done';
}

function ask(query, push) {
  if (poller) clearTimeout(poller);
  current = query;
  if (push) history.pushState(null, '', '?' + query);
  document.body.dataset.state = 'asked';
  setStatus('asking');
  poll(query);
}

document.getElementById('question').addEventListener('submit', e => {
  e.preventDefault();
  ask(formQuery(), true);
});
document.getElementById('f-slo').addEventListener('change', () => {
  const profile = CHOICES.profiles[document.getElementById('f-slo').value];
  if (profile) limitsTable(profile);   // the new profile's own limits
});
window.addEventListener('popstate', () => {
  const q = location.search.slice(1);
  showForm(q, null);
  ask(q, false);
});
const start = location.search ? location.search.slice(1) : CHOICES.base_query;
showForm(start, null);
ask(start, false);
</script>
</body>
</html>
"""
