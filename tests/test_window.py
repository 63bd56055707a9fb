"""The arrival window: derived from the workload when --duration is left out (issue 37)."""
import json

import pytest

from provisioner.api import assumptions
from provisioner.options import SearchOptions, SimulateOptions, StudyOptions
from provisioner.question import (merge_options, resolve_simulate, resolve_study, tail_lengths,
                                  to_echo)
from provisioner.study import window_text, workload_source


def long_trace(path, output=1000, prompt=1000, rows=50):
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"2023-11-16 18:00:{i % 60:02d},{prompt},{output}" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def study(**options):
    return resolve_study(merge_options(SearchOptions, options))


def test_duration_is_derived_by_default():
    assert StudyOptions().duration is None


def test_default_workload_keeps_two_minutes():
    s = study()
    assert s.duration_s == 120.0 and s.window.source == "derived"
    assert "under the 120 s floor" in s.window.why
    assert tail_lengths(s.workload) == (7436, 252)   # the coding table's P99s


def test_long_outputs_get_a_longer_window(tmp_path):
    s = study(workload=long_trace(tmp_path / "long.csv"), rate=3.0)
    # 1,000 + 1,000 tokens alone on a DGX-A100: 34.3 s; 11 x = 378 s, up to a whole minute
    assert s.duration_s == 420.0
    assert (s.window.tail_prompt, s.window.tail_output) == (1000, 1000)
    assert 34 < s.window.alone_s < 35
    assert "11 x that is 378 s" in s.window.why
    # the derived window is what the samples span, and what the cache key holds
    from provisioner.question import identity
    assert identity(s)["duration_s"] == 420.0
    assert s.workload.at(3.0, s.duration_s, 0).arrival_s.max() > 300


def test_window_grows_with_the_tail(tmp_path):
    short = study(workload=long_trace(tmp_path / "a.csv", output=250), rate=3.0).duration_s
    long = study(workload=long_trace(tmp_path / "b.csv", output=2000), rate=1.0).duration_s
    assert short == 120.0 and long == 780.0


@pytest.mark.parametrize("given", [60.0, 120.0, 1000.0])
def test_duration_wins(tmp_path, given):
    s = study(workload=long_trace(tmp_path / "long.csv"), rate=3.0, duration=given)
    assert s.duration_s == given and s.window.source == "given"


def test_spec_duration_wins(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"workload: {long_trace(tmp_path / 'long.csv')}\nrate: 3\nduration: 90\n")
    s = resolve_study(merge_options(SearchOptions, {}, spec))
    assert s.duration_s == 90.0 and s.window.source == "given"


def test_report_shows_the_window(tmp_path):
    s = study(workload=long_trace(tmp_path / "long.csv"), rate=3.0)
    inputs = to_echo(s)
    assert inputs["options"]["duration"] is None
    assert inputs["window"]["duration_s"] == 420.0 and inputs["window"]["source"] == "derived"
    json.dumps(inputs)
    line = window_text(inputs["window"])
    assert line.startswith("420 s (derived: ") and "dgx-a100" in line
    assert {"name": "window", "value": line} in assumptions(s)
    given = to_echo(study(duration=60.0))
    assert window_text(given["window"]) == "60 s (--duration)"
    # a report written before windows were derived: its echoed duration
    assert window_text(None, 120.0) == "120 s"


def test_simulate_derives_the_same_window(tmp_path):
    trace = long_trace(tmp_path / "long.csv")
    options = merge_options(SimulateOptions, {"design": "baseline-h100", "machines": 4,
                                              "workload": trace, "rate": 3.0})
    q = resolve_simulate(options)
    assert q.duration_s == 420.0 and q.to_dict()["window"]["source"] == "derived"
    assert q.duration_s == study(workload=trace, rate=3.0).duration_s


def test_tail_lengths_of_a_trace(tmp_path):
    assert tail_lengths(workload_source(long_trace(tmp_path / "t.csv", output=300))) == (1000, 300)
