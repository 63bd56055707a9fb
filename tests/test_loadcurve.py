"""Sizing for a load curve (issue 29, first part): the curve, its windows, the plan."""
from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings as hyp_settings, strategies as st

import provisioner
from harness import assert_bad_input
from provisioner.loadcurve import (PlanRules, Window, grid_rate, plan_cost, plan_pools,
                                   read_load_curve, windows)

SMALL = dict(designs="splitwise-hh", model="llama2-70b", duration=30, verify_seeds=2)


def _curve(tmp_path, text: str):
    path = tmp_path / "curve.csv"
    path.write_text(text)
    return path


def test_windows_hold_each_windows_peak_and_mean(tmp_path):
    curve = read_load_curve(str(_curve(tmp_path, "time_s,rate_rps\n0,10\n1800,30\n3600,5\n")))
    assert curve.end_s == 5400   # the last rate holds for the median step
    first, second = windows(curve, 3600)
    assert (first.peak_rps, first.mean_rps) == (30, 20) and first.rate_rps >= 30
    assert (second.start_s, second.end_s, second.peak_rps) == (3600, 5400, 5)
    assert grid_rate(30) >= 30 and grid_rate(30) / 30 < 1.021


def test_iso_timestamps_and_rescaling(tmp_path):
    curve = read_load_curve(str(_curve(
        tmp_path, "time_s,rate_rps\n2024-05-13T00:00:00,4\n2024-05-13T00:10:00,8\n")))
    assert curve.times == (0.0, 600.0) and curve.scaled(80).rates == (40.0, 80.0)


@pytest.mark.parametrize("text, words", [
    ("time_s,rate_rps\n0,1\n0,2\n", ["row 3", "time_s"]),
    ("time_s,rate_rps\n600,1\n0,2\n", ["row 3", "time_s"]),
    ("time_s,rate_rps\n0,1\n600,-2\n", ["row 3", "rate_rps"]),
    ("time_s,rate_rps\n0,nan\n", ["row 2", "rate_rps"]),
    ("time_s,rate_rps\n0,inf\n", ["row 2", "rate_rps"]),
    ("time_s,rate_rps\n0,0\n600,0\n", ["every rate is 0"]),
    ("", ["load curve"]),
    ("time_s,rate_rps\n", ["no rows"]),
    ("time_s,rate_rps\nnoon,3\n", ["row 2", "time_s"]),
    ("time_s,rate_rps\n0,1\n40000000,2\n", ["row 3", "time_s", "366-day limit"]),
])
def test_a_bad_curve_is_one_line_naming_the_file_row_and_field(run_cli, tmp_path, text, words):
    path = _curve(tmp_path, text)
    outcome = run_cli("search", "--load-curve", path, "--out", tmp_path / "out")
    assert_bad_input(outcome, "curve.csv", *words)
    assert not (tmp_path / "out").exists()


def test_a_window_longer_than_the_curve_and_a_rate_beside_it_are_refused(run_cli, tmp_path):
    path = _curve(tmp_path, "time_s,rate_rps\n0,5\n600,8\n")
    assert_bad_input(run_cli("search", "--load-curve", path, "--window", "7200", "--out",
                             tmp_path / "o"), "--window")
    assert_bad_input(run_cli("search", "--load-curve", path, "--rate", "9", "--out",
                             tmp_path / "o"), "--rate")


SPANS = [Window(3600.0 * k, 3600.0 * (k + 1), 1.0, 1.0, 1.0) for k in range(5)]


def _brute_force(options, unit, rules):
    """The cheapest plan of options alone (no flapping, floors applied), by enumerating
    every sequence; None when every one flaps."""
    floored = [sorted({tuple(max(rules.floor, n) if n else 0 for n in c) for c in window})
               for window in options]
    best = None
    for plan in itertools.product(*floored):
        if any(any(b < a and c > b for a, b, c in zip(x, y, z))
               for x, y, z in zip(plan, plan[1:], plan[2:])):
            continue
        cost = plan_cost(plan, SPANS[:len(plan)], unit, rules.scale_up_s)
        if best is None or cost < best - 1e-9:
            best = cost
    return best


clusters = st.tuples(st.integers(1, 6), st.integers(1, 4))


@hyp_settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(clusters, min_size=1, max_size=3), min_size=2, max_size=5),
       st.sampled_from([0.0, 600.0, 1800.0]), st.integers(1, 2))
def test_the_plan_is_the_cheapest_that_never_flaps(options, scale_up_s, floor):
    rules, unit = PlanRules(scale_up_s, floor), (38.0, 17.6)
    plan = plan_pools(options, SPANS, unit, rules)
    assert len(plan) == len(options)
    for pools, window in zip(plan, options):   # each window: at least one of its options
        assert any(all(p >= max(floor, n) for p, n in zip(pools, c)) for c in window)
    for a, b, c in zip(plan, plan[1:], plan[2:]):   # no pool shrinks then grows right back
        assert not any(y < x and z > y for x, y, z in zip(a, b, c))
    cost = plan_cost(plan, SPANS[:len(plan)], unit, scale_up_s)
    alone = _brute_force(options, unit, rules)
    assert alone is None or cost <= alone + 1e-9
    instant = plan_pools(options, SPANS, unit, PlanRules(0.0, floor))
    assert plan_cost(instant, SPANS[:len(plan)], unit, 0.0) <= cost + 1e-9


def test_a_days_plan_serves_every_window_and_saves_against_the_static_cluster(tmp_path):
    """Three loads over four 10-minute windows: the static cluster is the busiest window's
    optimum; each planned cluster meets every SLO at its window's rate on the base sample;
    without the provisioning delay the plan never costs more."""
    path = _curve(tmp_path, "time_s,rate_rps\n0,4\n600,12\n1200,4\n1800,8\n")
    result = provisioner.search(load_curve=str(path), window=600, **SMALL)
    result.write(tmp_path / "out")
    document = json.loads((tmp_path / "out" / "report.json").read_text())
    curve = document["load_curve"]
    entry = curve["designs"]["splitwise-hh"]
    assert entry["feasible"] and result.study.goal.rate_rps == max(
        w["rate_rps"] for w in curve["windows"])
    static = result.designs[0].optimum
    assert entry["static"] == [static.prompt_machines, static.token_machines]
    costs = entry["cost_usd"]
    assert costs["plan_without_delay"] <= costs["plan"] <= costs["static"] + 1e-6
    for window, pools in zip(curve["windows"], entry["plan"]):
        run = provisioner.simulate(design="splitwise-hh", prompt=pools[0], token=pools[1],
                                   model="llama2-70b", rate=window["peak_rps"], duration=30)
        assert run.report.passed, (window, pools, run.report.as_dict())
    rows = (tmp_path / "out" / "plan.csv").read_text().splitlines()
    assert len(rows) == 1 + len(curve["windows"]) and rows[0].startswith("window,")
    # both answers run over the whole curve in one simulation each: the plan's pools resized
    # at every window's start, machines failing at the fleet rate; every window met
    checked = entry["whole_curve"]
    for label in ("static", "plan"):
        run = checked[label]
        assert run["feasible"] and run["failing_windows"] == [], (label, run)
        assert run["windows_met"] == len(curve["windows"]) and run["whole_curve"]["passed"]
        assert run["failures"]["mtbf_hours"] == 6000.0
    assert checked["plan"]["requests"] == checked["static"]["requests"] > 0


def test_a_plan_is_stepped_up_where_its_whole_curve_run_misses(monkeypatch):
    """A window that misses gets a larger cluster (no smaller in either pool than before);
    missing again, the window before it too; the runs stop once every window is met or
    nothing larger is left."""
    from provisioner import curverun
    needs = {2: (5, 2)}   # window 2 is met only with 5P+2T or more
    runs = []

    def fake_run(study, cluster, plan):
        runs.append(list(plan))
        failing = [k for k, need in needs.items() if plan[k][0] < need[0] or plan[k][1] < need[1]]
        return {"feasible": True, "failing_windows": failing}
    monkeypatch.setattr(curverun, "run_curve", fake_run)
    options = [[(2, 1), (5, 2)], [(2, 1), (5, 2)], [(2, 1), (3, 1), (5, 2)], [(2, 1)]]

    def replan(opts):  # the cheapest option of each window
        return [min(o, key=sum) for o in opts]
    plan, record, stepped = curverun.verified_plan(None, lambda p: None, options,
                                                   replan(options), replan)
    assert plan[2] == (5, 2) and record["failing_windows"] == [] and 2 in stepped
    assert runs[0][2] == (2, 1) and runs[1][2] == (3, 1) and len(runs) == 3
    assert 1 in stepped   # missed twice: its predecessor was stepped up too
    # nothing larger left: the runs stop, the miss stays in the record
    needs[3] = (9, 9)
    runs.clear()
    options = [[(2, 1)], [(2, 1)], [(5, 2)], [(2, 1)]]
    plan, record, _ = curverun.verified_plan(None, lambda p: None, options, replan(options),
                                             replan)
    assert record["failing_windows"] == [3] and len(runs) <= curverun.STEP_UP_ROUNDS


def test_curve_options_without_a_curve_are_refused(run_cli, tmp_path):
    assert_bad_input(run_cli("search", "--window", "1800", "--out", tmp_path / "o"),
                     "--window", "--load-curve")


def test_simulate_replays_a_curve_and_checks_each_window(run_cli, tmp_path):
    """A cluster sized for 5 req/s meets the SLOs in the first minute of a curve and misses
    them in a 40 req/s minute; the JSON names each window's verdict."""
    path = _curve(tmp_path, "time_s,rate_rps\n0,5\n60,40\n120,5\n")
    run = run_cli("simulate", "--design", "splitwise-hh", "--prompt", "2", "--token", "1",
                  "--model", "llama2-70b", "--load-curve", path, "--curve-window", "60",
                  "--json")
    assert run.returncode in (0, 1), run.stderr
    document = json.loads(run.stdout)
    spans = document["windows"]
    assert [w["start_s"] for w in spans] == [0, 60, 120]
    assert spans[0]["passed"] and not spans[1]["passed"]
    assert spans[1]["requests"] > 5 * spans[0]["requests"]
    assert sum(w["requests"] for w in spans) == document["requests"]
    assert_bad_input(run_cli("simulate", "--design", "splitwise-hh", "--prompt", "1", "--token",
                             "1", "--load-curve", path, "--rate", "5"), "--rate")
    assert_bad_input(run_cli("simulate", "--design", "splitwise-hh", "--prompt", "1", "--token",
                             "1", "--curve-window", "60"), "--curve-window", "--load-curve")


def test_simulate_replays_a_plan_over_the_curve(run_cli, tmp_path):
    """--plan resizes the pools window by window in the one run: the same curve missed with
    2P+1T throughout is met where the plan adds machines for the busy minute; no one cluster
    serves the curve (the cluster's fields are null), and the JSON gives the plan's steps."""
    curve = _curve(tmp_path, "time_s,rate_rps\n0,2\n60,20\n120,2\n")
    plan = tmp_path / "plan.csv"
    plan.write_text("start_s,prompt_machines,token_machines\n0,1,1\n60,4,2\n120,1,1\n")
    common = ("simulate", "--design", "splitwise-hh", "--model", "llama2-70b", "--load-curve",
              curve, "--curve-window", "60", "--json")
    flat = json.loads(run_cli(*common, "--prompt", "1", "--token", "1").stdout)
    planned = run_cli(*common, "--plan", plan)
    document = json.loads(planned.stdout)
    assert (document["prompt_machines"], document["token_machines"]) == (None, None)
    assert [step["prompt_machines"] for step in document["plan"]] == [1, 4, 1]
    assert document["requests"] == flat["requests"]     # the same arrivals
    assert not flat["windows"][1]["passed"] and document["windows"][1]["passed"]


@pytest.mark.parametrize("text, words", [
    ("start_s,prompt_machines\n0,1\n", ["plan.csv", "token_machines"]),
    ("start_s,prompt_machines,token_machines\n0,1,1\n0,2,1\n", ["plan.csv", "row 3", "start_s"]),
    ("start_s,prompt_machines,token_machines\n0,1.5,1\n", ["plan.csv", "row 2",
                                                           "prompt_machines"]),
    ("start_s,prompt_machines,token_machines\n0,0,1\n", ["plan.csv", "row 2", "prompt_machines"]),
    ("start_s,prompt_machines,token_machines,design\n0,1,1,splitwise-aa\n",
     ["plan.csv", "splitwise-hh"]),
])
def test_a_bad_plan_is_one_line_naming_the_file_row_and_field(run_cli, tmp_path, text, words):
    curve = _curve(tmp_path, "time_s,rate_rps\n0,2\n60,4\n")
    plan = tmp_path / "plan.csv"
    plan.write_text(text)
    assert_bad_input(run_cli("simulate", "--design", "splitwise-hh", "--load-curve", curve,
                             "--plan", plan), *words)


def test_a_plan_needs_a_curve_and_must_fit_the_cluster(run_cli, tmp_path):
    curve = _curve(tmp_path, "time_s,rate_rps\n0,2\n60,4\n")
    plan = tmp_path / "plan.csv"
    plan.write_text("start_s,prompt_machines,token_machines\n0,3,1\n")
    assert_bad_input(run_cli("simulate", "--design", "splitwise-hh", "--prompt", "1", "--token",
                             "1", "--plan", plan), "--plan", "--load-curve")
    assert_bad_input(run_cli("simulate", "--design", "splitwise-hh", "--prompt", "1", "--token",
                             "1", "--load-curve", curve, "--curve-window", "60", "--plan", plan),
                     "3+1")
    assert_bad_input(run_cli("simulate", "--design", "splitwise-hh", "--prompt", "1", "--token",
                             "1", "--load-curve", curve), "--curve-window",
                     "longer than the load curve")


def test_a_linear_curve_interpolates_between_its_rows():
    """--curve-shape linear: a window's peak is the highest rate inside it (a row or an edge),
    its mean the integral; the arrivals follow the ramp (a rising ramp puts 3/4 of its
    requests in its second half)."""
    import numpy as np

    from provisioner.loadcurve import LoadCurve, windows
    from simcore.longrun import _linear_arrivals, curve_chunks, expected_requests
    curve = LoadCurve("ramp", (0.0, 600.0, 1200.0), (0.0, 20.0, 0.0), 600.0, linear=True)
    spans = windows(curve, 300.0)
    assert [w.peak_rps for w in spans[:4]] == [10.0, 20.0, 20.0, 10.0]
    assert [w.mean_rps for w in spans[:4]] == pytest.approx([5.0, 15.0, 15.0, 5.0])
    assert windows(curve.shaped("step"), 300.0)[0].peak_rps == 0.0
    times = _linear_arrivals(np.random.default_rng(0), 0.0, 100.0, 100.0)
    assert abs(len(times) - 5000) < 4 * 5000 ** 0.5
    assert np.all((times >= 0) & (times < 100.0)) and np.all(np.diff(times) >= 0)
    late = (times >= 50.0).mean()
    assert abs(late - 0.75) < 0.03
    falling = _linear_arrivals(np.random.default_rng(1), 100.0, 0.0, 100.0)
    assert abs((falling < 50.0).mean() - 0.75) < 0.03
    counts = []
    drawn = sum(len(a) for a, _, _ in curve_chunks("coding", curve.times, curve.rates,
                                                   curve.end_s, 3, [0.0, 900.0, 1800.0],
                                                   counts, linear=True))
    assert drawn == sum(counts)
    assert abs(drawn - expected_requests(curve.times, curve.rates, curve.end_s, True)) < 4 * 110
    assert expected_requests(curve.times, curve.rates, curve.end_s, True) == pytest.approx(12000)


def test_check_rederives_the_plan_and_says_where_it_moved(run_cli, tmp_path):
    """`provision check` on a load-curve report re-derives the plan too: unchanged, exit 0;
    a plan edited at one window, exit 1 naming the design and the window."""
    path = _curve(tmp_path, "time_s,rate_rps\n0,4\n600,8\n")
    out = tmp_path / "out"
    run = run_cli("search", "--load-curve", path, "--window", "600", "--designs",
                  "splitwise-hh", "--model", "llama2-70b", "--duration", "20", "--out", out,
                  "--quiet")
    assert run.returncode == 0, run.stderr
    report = out / "report.json"
    assert run_cli("check", report, "--no-cache").returncode == 0
    document = json.loads(report.read_text())
    plan = document["load_curve"]["designs"]["splitwise-hh"]["plan"]
    plan[1] = [plan[1][0] + 5, plan[1][1]]
    report.write_text(json.dumps(document))
    drifted = run_cli("check", report, "--no-cache")
    assert drifted.returncode == 1
    assert "splitwise-hh" in drifted.stdout and "window 1" in drifted.stdout


def test_a_curve_search_with_sessions_reports_each_windows_hit_rate(tmp_path):
    """Sessions over a curve, the cache aware: each whole-curve check gives its overall and
    per-window hit rates (in [0, 1), the whole run's the tokens-weighted mean of its windows
    at most), plan.csv a column of them, report.html a figure; with the cache off, none."""
    path = _curve(tmp_path, "time_s,rate_rps\n0,4\n60,10\n120,4\n")
    kwargs = dict(load_curve=str(path), window=60, designs="baseline-h100",
                  model="llama-3.1-8b", workload="conversation", verify_seeds=2,
                  prefix_model="system=4:1500,turns=1-5,think=10")
    cached = provisioner.search(prefix_cache="aware", **kwargs)
    cached.write(tmp_path / "on")
    entry = json.loads((tmp_path / "on" / "report.json").read_text())[
        "load_curve"]["designs"]["baseline-h100"]["whole_curve"]
    for label in ("static", "plan"):
        rates = entry[label]["window_prefix_hit_rates"]
        assert len(rates) == 3 and all(0 <= r < 1 for r in rates) and max(rates) > 0.1
        assert min(rates) <= entry[label]["prefix_hit_rate"] <= max(rates)
    assert "whole_curve_prefix_hit_rate" in (tmp_path / "on" / "plan.csv").read_text()
    assert "Prefix cache hit rate of each window" in (tmp_path / "on" / "report.html").read_text()
    plain = provisioner.search(**kwargs)
    plain.write(tmp_path / "off")
    text = (tmp_path / "off" / "report.json").read_text()
    assert "prefix_hit_rate" not in text
    assert "whole_curve_prefix_hit_rate" not in (tmp_path / "off" / "plan.csv").read_text()
    assert "Prefix cache hit rate" not in (tmp_path / "off" / "report.html").read_text()
