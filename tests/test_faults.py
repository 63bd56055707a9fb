"""Faults (issue 10): damaged cache entries, an unwritable cache, Ctrl-C, kill -9 while writing."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provisioner.runner import DiskCache, outcome_from_json
from provisioner.study import Outcome

GOOD = Outcome(True, True, "", (("ttft_p50", 0.5, 2.0), ("tbt_p99", 0.7, float("inf"))), 0.3, 12)


def _entry(cache: DiskCache, key: str) -> Path:
    return cache.directory / key[:2] / f"{key}.json"


@pytest.mark.parametrize("text", [
    "[]", "{}", '"x"', "null", "{not json", "", "\x00\x01", json.dumps({"meets_slos": True}),
    json.dumps({**json.loads(json.dumps(GOOD.__dict__)), "requests": "many"}),
    json.dumps({**json.loads(json.dumps(GOOD.__dict__)), "worst_margin": "NaN"}),
    json.dumps(GOOD.__dict__).replace("0.3", "NaN"),
    json.dumps(GOOD.__dict__).replace("0.5", "NaN"),
    json.dumps(GOOD.__dict__).replace('"ttft_p50", 0.5', '"ttft_p50"'),
    json.dumps({**json.loads(json.dumps(GOOD.__dict__)), "meets_slos": "yes"}),
    json.dumps({**json.loads(json.dumps(GOOD.__dict__)), "extra": 1}),
    "[" * 5000,
])
def test_damaged_cache_entry_is_ignored_with_one_warning(tmp_path, capsys, text):
    cache = DiskCache(tmp_path)
    key = "ab" + "0" * 62
    _entry(cache, key).parent.mkdir(parents=True)
    _entry(cache, key).write_text(text)
    assert cache.get(key) is None and cache.get(key) is None
    assert capsys.readouterr().err.count("provision: warning:") == 1
    cache.put(key, GOOD)  # re-simulated and overwritten
    assert cache.get(key) == GOOD


def test_good_entry_round_trips_with_an_unlimited_slo(tmp_path):
    cache = DiskCache(tmp_path)
    cache.put("cd" + "1" * 62, GOOD)
    assert cache.get("cd" + "1" * 62) == GOOD
    assert outcome_from_json(json.loads(json.dumps(GOOD.__dict__))) == GOOD


def test_a_cache_entry_has_the_usual_file_mode_and_no_temp_file_is_left(tmp_path):
    cache, key = DiskCache(tmp_path), "ef" + "2" * 62
    umask = os.umask(0o027)
    try:
        cache.put(key, GOOD)
        cache.put(key, GOOD)   # overwritten in place
    finally:
        os.umask(umask)
    assert stat.S_IMODE(_entry(cache, key).stat().st_mode) == 0o640
    assert [p.name for p in _entry(cache, key).parent.iterdir()] == [f"{key}.json"]


def test_a_runner_keys_a_sample_by_the_whole_record_hashed():
    """A runner encodes the study's and each design's part of a key once per run; the key is
    still the sha256 of the whole record's canonical JSON (caches written before stay valid)."""
    from provisioner.api import resolve_study
    from provisioner.evaluate import SimulationEvaluator
    from provisioner.options import SearchOptions
    from provisioner.runner import CACHE_FORMAT, Runner
    from provisioner.study import Point

    evaluator = SimulationEvaluator(resolve_study(SearchOptions()))
    runner = Runner(evaluator)
    for design in evaluator.study.designs:
        for point, seed in ((Point(design, 3, 2, 70.0), 0), (Point(design, 12, 0, None), 5)):
            whole = {"format": CACHE_FORMAT, "study": evaluator.identity(),
                     "point": [point.prompt_machines, point.token_machines, point.rate_rps],
                     "seed": seed, "records": evaluator.point_identity(point)}
            blob = json.dumps(whole, sort_keys=True, separators=(",", ":"), default=str)
            assert runner._cache_key((point, seed)) == hashlib.sha256(blob.encode()).hexdigest()


def test_unwritable_cache_runs_uncached_with_a_warning(tmp_path, cli):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    out = tmp_path / "out"
    outcome = cli(["simulate", "--design", "splitwise-hh", "--prompt", "2", "--token", "2",
                      "--duration", "1", "--rate", "5"])
    assert outcome.code in (0, 1)
    run = cli(["search", "--designs", "splitwise-hh", "--model", "llama2-70b", "--rate", "2",
                  "--duration", "5", "--jobs", "1", "--cache-dir", str(blocker / "cache"),
                  "--out", str(out), "--json"])
    assert run.code in (0, 1), run.stderr
    warnings = [line for line in run.stderr.splitlines() if line.startswith("provision: warning:")]
    assert len(warnings) == 1 and "cache" in warnings[0]
    assert (out / "report.json").exists()


def _default_sigint() -> None:
    """In the child before it starts: SIGINT as a terminal gives it. A test run started in the
    background inherits SIGINT ignored, and Python then never turns it into KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(args: list[str], tmp_path: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "provisioner.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, start_new_session=True, preexec_fn=_default_sigint)


def _group_alive(pgid: int) -> list[str]:
    found = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True)
    return found.stdout.split()


def _tracebacks(err: str) -> list[str]:
    """Each traceback printed on stderr: its header line up to the exception line."""
    blocks, current = [], None
    for line in err.splitlines():
        if line.startswith("Traceback (most recent call last)"):
            current = [line]
        elif current is not None:
            current.append(line)
            if line and not line[0].isspace():  # the exception line ends the block
                blocks.append("\n".join(current))
                current = None
    if current is not None:
        blocks.append("\n".join(current))
    return blocks


def _nanny_race(block: str) -> bool:
    """The one traceback a dask run may print: SIGINT reaching a distributed nanny or worker
    process before it ignores the signal, interrupting dask's own code."""
    return "/distributed/" in block and "KeyboardInterrupt" in block


@pytest.mark.parametrize("backend", ["threads", "loky", "dask"])
def test_ctrl_c_stops_cleanly(tmp_path, backend):
    """SIGINT to the whole process group (what a terminal's Ctrl-C does) once evaluations run:
    one line, exit 130, and no worker left behind. With dask a nanny may print a traceback of
    its own when SIGINT reaches it before its worker ignores the signal: only that one is
    allowed, everything else is asserted as for the other backends."""
    # an hour's window (250k requests a simulation): still searching when Ctrl-C comes
    proc = _start(["search", "--designs", "splitwise-hh,splitwise-aa", "--duration", "3600",
                   "--jobs", "2", "--no-cache", "--backend", backend, "--out",
                   str(tmp_path / "out")], tmp_path)
    deadline = time.monotonic() + 90
    started = backend == "threads"   # no worker process to wait for: simulating within 1-2 s
    if started:
        time.sleep(5)
    while not started and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(1)
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                  text=True).stdout.split()
        if len(children) >= 2:
            time.sleep(4)  # let the workers take their first tasks
            started = True
            break
    if not started:
        proc.kill()
        pytest.skip("workers did not start in time on this machine")
    assert proc.poll() is None, "the search ended before Ctrl-C: make it longer"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    tracebacks = [b for b in _tracebacks(err) if not (backend == "dask" and _nanny_race(b))]
    assert not tracebacks, err[-3000:]
    if backend != "dask":
        assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == "provision: interrupted"
    for _ in range(20):
        if not _group_alive(proc.pid):
            break
        time.sleep(0.5)
    assert not _group_alive(proc.pid)
    assert not (tmp_path / "out" / "report.json").exists()


def test_the_worker_resource_tracker_prints_nothing_after_an_interrupt(tmp_path):
    """After Ctrl-C loky's resource tracker may find a worker semaphore already unlinked and
    warn on our stderr after "provision: interrupted" (seen once in CI). A process that leaves
    a registered, already-gone semaphore behind shows the tracker stays silent."""
    script = ("from joblib.externals.loky.backend import resource_tracker\n"
              "from provisioner import runner\n"
              "runner._start_quiet_resource_tracker()\n"
              "resource_tracker.register('/provision-test-already-unlinked', 'semlock')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    time.sleep(1)  # the tracker cleans up after its last user is gone
    assert done.returncode == 0, done.stderr
    assert "resource_tracker" not in done.stderr
    assert "PYTHONWARNINGS" not in os.environ


def test_ctrl_c_after_selecting_an_optimum_is_still_a_keyboard_interrupt(tmp_path, repo):
    """CP-SAT must leave Python's SIGINT handler in place: with its default it installed the
    C default, so a Ctrl-C after the first optimum killed the process outright (no cleanup,
    workers orphaned)."""
    script = (
        "import os, signal, sys, time\n"
        "sys.path.insert(0, 'tests')\n"
        "import oracles\n"
        "from hardware_catalog import load_catalog\n"
        "from provisioner.options import Constraints\n"
        "from provisioner.runner import Runner\n"
        "from provisioner.verify import Verifier\n"
        "from provisioner.select import select_optimum\n"
        "from provisioner.study import Goal, Point\n"
        "catalog = load_catalog()\n"
        "design = catalog.design('splitwise-hh')\n"
        "runner = Runner(oracles.OracleEvaluator(catalog, oracles.diagonal, 'diagonal'))\n"
        "points = Verifier(runner, (0,)).run([Point(design, p, 12 - p, 10.0) for p in (2, 3)])\n"
        "assert select_optimum(points, Goal('min-cost', 10.0), Constraints(), design)\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(5)\n"
        "except KeyboardInterrupt:\n"
        "    sys.exit(7)\n")
    run = subprocess.run([sys.executable, "-c", script], cwd=repo, capture_output=True,
                         text=True, timeout=120, preexec_fn=_default_sigint)
    assert run.returncode == 7, (run.returncode, run.stderr[-2000:])


def test_kill_9_while_writing_reports_leaves_old_or_new(tmp_path, repo):
    """A writer killed with -9 at random moments: report.json is always a whole document."""
    out = tmp_path / "out"
    script = ("import sys, json\nfrom pathlib import Path\n"
              "from provisioner.files import write_files_atomically\n"
              "i = 0\nwhile True:\n    i += 1\n"
              "    doc = json.dumps({'n': i, 'pad': 'x' * 200000})\n"
              "    write_files_atomically(Path(sys.argv[1]), {'report.json': doc, "
              "'evaluations.csv': 'a\\n' * 50000})\n")
    for delay in (0.3, 0.5, 0.7):
        proc = subprocess.Popen([sys.executable, "-c", script, str(out)], cwd=repo)
        time.sleep(delay)
        proc.kill()
        proc.wait()
        if (out / "report.json").exists():
            json.loads((out / "report.json").read_text())
        # a writer killed mid-write may leave its staged files, hidden (.NAME.PID.N.tmp): never
        # under a name a reader opens, and never anything else
        for path in out.iterdir() if out.exists() else ():
            assert path.name in ("report.json", "evaluations.csv") or (
                path.name.startswith((".report.json.", ".evaluations.csv."))
                and path.name.endswith(".tmp")), path.name
