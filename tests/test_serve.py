"""`provision serve` (issue 42): the what-if page's query string, its JSON endpoint against
`provisioner.search`, the downloaded report against `provision check`, loopback by default,
bad input, and the page itself in headless Chromium (driven over the DevTools protocol on a
pipe, no driver library; skipped without /usr/bin/chromium, as tests/test_report_html.py is).

Every server binds port 0 and is shut down by its fixture; questions are small (two designs,
20 s windows, one verification sample)."""
from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

import provisioner
from hardware_catalog import InputError
from provisioner.check import check_report
from provisioner.options import Execution
from provisioner.serve import (DEFAULT_HOST, Explorer, make_server, optimum_record, page_url,
                               page_view, parse_query, to_query)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SMALL = dict(designs=("baseline-a100", "splitwise-ha"), model="bloom-176b", rate=20.0,
             duration=20.0, verify_seeds=1)
QUERY = "designs=baseline-a100,splitwise-ha&model=bloom-176b&rate=20&duration=20&verify_seeds=1"


def library_optima(**changes) -> dict:
    """The optimum per design `provisioner.search` finds for SMALL with `changes`."""
    result = provisioner.search(**{**SMALL, **changes}, jobs=1)
    return {entry["design"]: optimum_record(entry) for entry in result.to_dict()["designs"]}


@pytest.fixture
def served(tmp_path):
    explorer = Explorer(SMALL, tmp_path / "cache", jobs=1)
    server = make_server(explorer, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield explorer, server
    server.shutdown()
    server.server_close()
    thread.join(10)
    explorer.close()


def get(server, path: str) -> tuple[int, bytes, dict]:
    url = page_url(server).rstrip("/") + path
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read(), dict(err.headers)


def answered(server, query: str, timeout: float = 120) -> dict:
    """Poll /api/search?query as the page does until the search is done (or failed)."""
    deadline = time.monotonic() + timeout
    while True:
        code, body, _ = get(server, f"/api/search?{query}")
        status = json.loads(body)
        if status["state"] in ("done", "error") or time.monotonic() > deadline:
            return {"http": code, **status}
        time.sleep(0.1)


# --------------------------------------------------------------------------- the query string
def test_the_query_string_round_trips_to_the_options():
    options, limits = parse_query(
        "rate=140&goal=min-power&designs=splitwise-hh,h200/dgx-a100&price=dgx-h100=30,"
        "dgx-a100=12.5&mixed_pool=false&verify_seeds=3&chunk_tokens=auto&hardware=&"
        "slo_itl_p99=200&slo_ttft_p50=1.5")
    assert options == {"rate": 140.0, "goal": "min-power",
                       "designs": ("splitwise-hh", "h200/dgx-a100"),
                       "price": (("dgx-a100", 12.5), ("dgx-h100", 30.0)), "mixed_pool": False,
                       "verify_seeds": 3, "chunk_tokens": "auto"}
    assert limits == {("itl", "p99"): 200.0, ("ttft", "p50"): 1.5}
    query = to_query(options, limits)
    assert parse_query(query) == (options, limits)
    assert to_query(*parse_query(query)) == query           # canonical: a fixed point
    # defaults are left out: the address holds only what differs
    assert to_query(*parse_query("goal=min-cost&model=bloom-176b&designs=all&rate=70.5")) == \
        "rate=70.5"
    # the options reach provisioner.search as the same checked values
    explorer = Explorer()
    assert explorer.canonical(query)[1] == options
    # an SLO limit equal to the profile's own is no change
    assert explorer.canonical("slo_ttft_p99=6&slo_tbt_p50=1.3")[0] == "slo_tbt_p50=1.3"


@pytest.mark.parametrize("query, named", [
    ("rate=-1", "rate"), ("rate=fast", "rate"), ("rates=70", "rates"),
    ("goal=cheapest", "goal"), ("price=dgx-h100", "price"), ("slo_ttft_p95=2", "slo_ttft_p95"),
    ("slo_tbt_p99=0", "slo_tbt_p99"), ("rate=1&rate=2", "rate"), ("jobs=4", "jobs"),
    ("mixed_pool=maybe", "mixed_pool")])
def test_bad_options_are_refused_naming_the_key(query, named):
    with pytest.raises(InputError, match=named):
        parse_query(query)


def test_the_endpoint_refuses_bad_options_in_one_line(served):
    _, server = served
    code, body, _ = get(server, "/api/search?rate=-1")
    assert code == 400
    answer = json.loads(body)
    assert answer["state"] == "error" and "rate" in answer["error"] and "\n" not in answer["error"]
    # a question the options accept but the catalog does not: the search's error, one line
    status = answered(server, "model=no-such-model&rate=20&duration=20")
    assert status["state"] == "error" and "no-such-model" in status["error"]


# ------------------------------------------------------------------------------ the endpoint
def test_the_endpoint_answers_as_the_library(served):
    explorer, server = served
    status = answered(server, QUERY)
    assert status["state"] == "done", status
    assert status["query"] == "rate=20&duration=20&designs=baseline-a100,splitwise-ha&" \
                              "verify_seeds=1"
    assert status["optima"] == library_optima()
    assert set(status["figures"]) == {"fig-pareto", "fig-design-space", "fig-latency-load"}
    assert "Unit costs" in status["tables_html"]
    assert status["answer"].startswith("Best: ")
    # asked again (any spelling of the same question): the same search, answered at once
    started = time.monotonic()
    again = answered(server, "verify_seeds=1&rate=20.0&duration=20&designs=baseline-a100,"
                             "splitwise-ha")
    assert time.monotonic() - started < 1.0 and again["optima"] == status["optima"]
    assert len(explorer.questions) == 1
    # the report of the view is report.json as the library writes it
    code, body, headers = get(server, f"/report.json?{QUERY}")
    assert code == 200 and "attachment" in headers["Content-Disposition"]
    assert json.loads(body) == provisioner.search(**SMALL, jobs=1).to_dict()


def test_a_question_the_page_moved_on_from_is_not_searched(tmp_path, monkeypatch):
    """Moving the rate five times queues five searches; those the page stopped polling while
    an earlier search ran are dropped (asked again, they are new questions)."""
    explorer = Explorer(cache_dir=tmp_path / "cache", jobs=1)
    ran = []
    monkeypatch.setattr(provisioner, "search", lambda **k: ran.append(k["rate"]) or 1 / 0)
    with explorer.searching:                    # a search is running
        old = explorer.ask("rate=5")
        new = explorer.ask("rate=6")
        old.asked -= 60                          # its polls stopped a minute ago
        new.asked += 60                          # still polled
    deadline = time.monotonic() + 10
    while "queued" in (old.state, new.state) or "running" in (old.state, new.state):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    explorer.close()
    assert ran == [6.0] and new.state == "error" and "ZeroDivisionError" in new.error
    assert old.state == "error" and "abandoned" in old.error
    assert list(explorer.questions) == ["rate=6"]


def test_a_downloaded_report_with_changed_slo_limits_passes_check(served, tmp_path):
    _, server = served
    query = f"{QUERY}&slo_tbt_p50=1.5&slo_e2e_p50=1.5"
    status = answered(server, query)
    assert status["state"] == "done", status
    assert status["slo_profile"]["limits"]["tbt"]["p50"] == 1.5
    code, body, _ = get(server, f"/report.json?{query}")
    assert code == 200
    report = tmp_path / "report.json"
    report.write_bytes(body)
    checked = check_report(report, Execution(no_cache=True, jobs=1))
    assert checked.unchanged, checked.lines()


def test_a_hardware_search_shows_its_cost_power_front():
    """--hardware's dozens of designs: the front, not a design-space panel per design."""
    result = provisioner.search(hardware="dgx-a100,dgx-h100", rate=20.0, duration=20.0,
                                verify_seeds=1, jobs=1)
    document = result.to_dict()
    view = page_view(result, document)
    assert list(view["figures"]) == ["fig-pareto"]
    front = view["figures"]["fig-pareto"]["data"][-1]
    assert front["name"].startswith("Pareto front") and front["text"]
    assert view["optima"] == {e["design"]: optimum_record(e) for e in document["designs"]}


def test_the_page_serves_plotly_once(served):
    _, server = served
    code, page, _ = get(server, "/")
    assert code == 200
    text = page.decode()
    assert text.count("<script src=\"/plotly.min.js\"></script>") == 1
    assert len(text) < 40_000                                  # plotly.js is not inlined
    code, script, headers = get(server, "/plotly.min.js")
    assert code == 200 and script.startswith(b"/**") and len(script) > 1_000_000
    assert get(server, "/nothing")[0] == 404


# ------------------------------------------------------------------------ the command line
def test_serve_listens_on_loopback_only_by_default(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "provisioner.cli", "serve", "--port", "0", "--cache-dir",
         str(tmp_path / "cache"), "--spec", str(spec_file(tmp_path))],
        stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(__import__("harness").REPO), os.environ.get("PYTHONPATH")]))})
    try:
        line = proc.stderr.readline()
        assert line.startswith(f"provision serve: http://{DEFAULT_HOST}:"), line
        url = line.split()[2]
        assert "rate=20" in url and "verify_seeds=1" in url    # the spec's question
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.status == 200
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, proc.stderr.read()
    assert make_server.__defaults__[0] == DEFAULT_HOST == "127.0.0.1"


def spec_file(tmp_path):
    spec = tmp_path / "small.yaml"
    spec.write_text("designs: baseline-a100,splitwise-ha\nrate: 20\nduration: 20\n"
                    "verify_seeds: 1\n")
    return spec


def test_a_remote_host_is_refused_unless_asked(cli, bad_input):
    bad_input(cli(["serve", "--host", "0.0.0.0", "--port", "0"]), "--host", "--allow-remote")
    with pytest.raises(InputError, match="--allow-remote"):
        make_server(Explorer(), "0.0.0.0", 0)
    server = make_server(Explorer(), "0.0.0.0", 0, allow_remote=True)   # asked: it binds
    server.server_close()


def test_bad_serve_input_is_one_line(cli, bad_input, tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("rate: -4\n")
    bad_input(cli(["serve", "--spec", spec, "--port", "0"]), "rate")
    spec.write_text("model: no-such-model\n")
    bad_input(cli(["serve", "--spec", spec, "--port", "0"]), "no-such-model")
    bad_input(cli(["serve", tmp_path / "missing.json", "--port", "0"]), "missing.json")
    bad_input(cli(["serve", "--port", "70000"]), "--port")
    report = tmp_path / "report.json"
    report.write_text("{}")
    bad_input(cli(["serve", report, "--port", "0"]), "schema")
    bad_input(cli(["serve", report, "--spec", spec_file(tmp_path), "--port", "0"]),
              "REPORT.json or --spec")
    with socket.socket() as taken:   # a port in use: one line, not OSError
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        bad_input(cli(["serve", "--port", taken.getsockname()[1]]), "cannot listen")


# -------------------------------------------------------------------------------- a browser
# The pipes become the browser's fds 3 and 4 in a small trampoline (a shell's redirections take
# one-digit fds only; preexec_fn is unsafe beside the server's threads).
PIPE_FDS = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
            "os.execv(sys.argv[3], sys.argv[3:])")


class DevTools:
    """Chromium over the DevTools protocol on a pipe (--remote-debugging-pipe: commands on its
    fd 3, answers on its fd 4, each message JSON ended by a NUL byte)."""

    def __init__(self, tmp_path):
        to_browser, self._from_us = os.pipe()
        self._from_browser, to_us = os.pipe()
        self.log = open(tmp_path / "chromium.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PIPE_FDS, str(to_browser), str(to_us), CHROMIUM,
             "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-extensions", f"--user-data-dir={tmp_path / 'profile'}",
             "--remote-debugging-pipe", "about:blank"],
            pass_fds=(to_browser, to_us), stdout=self.log, stderr=self.log)
        os.close(to_browser)
        os.close(to_us)
        self._buffer, self._id, self.session = b"", 0, None
        self.problems: list[str] = []   # the page's uncaught errors and console warnings

    def send(self, method: str, params: dict | None = None, timeout: float = 30) -> dict:
        self._id += 1
        message = {"id": self._id, "method": method, "params": params or {}}
        if self.session is not None and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._from_us, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                answer = json.loads(raw)
                self._heard(answer)
                if answer.get("id") == self._id:
                    assert "error" not in answer, answer
                    return answer["result"]
            left = deadline - time.monotonic()
            assert left > 0, f"chromium did not answer {method}"
            if select.select([self._from_browser], [], [], left)[0]:
                chunk = os.read(self._from_browser, 1 << 16)
                assert chunk, "chromium closed the pipe"
                self._buffer += chunk

    def _heard(self, message: dict) -> None:
        """Record an event of the page that is an error or a warning (plotly.js warns through
        console.trace("WARN: ..."))."""
        params = message.get("params", {})
        if message.get("method") == "Runtime.exceptionThrown":
            self.problems.append(json.dumps(params.get("exceptionDetails"))[:500])
        elif message.get("method") == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", "")))
                            for a in params.get("args", []))
            if params.get("type") in ("error", "warning", "assert") or \
                    re.search(r"\b(warn|warning|error|invalid)\b", text, re.IGNORECASE):
                self.problems.append(f"{params.get('type')}: {text}"[:500])

    def open(self, url: str) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget",
                                 {"targetId": target, "flatten": True})["sessionId"]
        self.send("Runtime.enable")          # from here on, the page's console is heard
        self.send("Page.navigate", {"url": url})

    def evaluate(self, expression: str):
        answer = self.send("Runtime.evaluate", {"expression": expression,
                                                "returnByValue": True})
        assert "exceptionDetails" not in answer, answer
        return answer["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 120):
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            state = self.evaluate("document.body && document.body.dataset.state")
            status = self.evaluate("(document.getElementById('status') || {}).textContent")
            assert state != "error", status
            assert time.monotonic() < deadline, f"timed out on {expression}: {state}, {status}"
            time.sleep(0.2)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except (AssertionError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._from_us, self._from_browser):
            os.close(fd)
        self.log.close()


OPTIMA_JS = ("JSON.stringify(Object.fromEntries(Array.from(document.querySelectorAll("
             "'#optima tr[data-design]')).map(r => [r.dataset.design, r.dataset.optimum ? "
             "JSON.parse(r.dataset.optimum) : null])))")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_the_page_in_a_browser_follows_the_rate(served, tmp_path):
    _, server = served
    browser = DevTools(tmp_path)
    try:
        browser.open(page_url(server))         # no query: the serve's own question
        browser.wait_for("document.body && document.body.dataset.state === 'done'")
        assert json.loads(browser.evaluate(OPTIMA_JS)) == library_optima()
        assert browser.evaluate("document.querySelectorAll('.js-plotly-plot .main-svg')"
                                ".length") >= 3
        assert browser.evaluate("document.getElementById('f-rate').value") == "20"
        # the rate moves: the page asks again, and its new optimum is the library's
        browser.evaluate("document.getElementById('f-rate').value = '35';"
                         "document.getElementById('apply').click(); true")
        browser.wait_for("document.body.dataset.state === 'done' && "
                         "(document.body.dataset.query || '').includes('rate=35')")
        assert "rate=35" in browser.evaluate("location.search")     # the address holds it
        assert json.loads(browser.evaluate(OPTIMA_JS)) == library_optima(rate=35.0)
        link = browser.evaluate("document.getElementById('download').href")
        assert "/report.json?" in link and "rate=35" in link
        assert browser.problems == []
        browser.evaluate("console.warn('a warning'); true")   # the probe hears the console
        browser.evaluate("true")
        assert any("a warning" in p for p in browser.problems), browser.problems
    finally:
        browser.close()
