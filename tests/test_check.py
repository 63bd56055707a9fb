"""`provision check` re-derives every section a report carries (issue 34): a load-curve report
with its windows, a design's plan or the whole `load_curve` section deleted is refused (exit 2,
naming the key its own inputs imply), and an edited value anywhere in a section is a drift
(exit 1, naming the path), not "unchanged"."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from hardware_catalog import InputError
from provisioner.check import implied_sections, section_changes

CURVE = "time_s,rate_rps\n0,4\n600,8\n"
SEARCH = ["--window", "600", "--designs", "splitwise-hh", "--model", "llama2-70b",
          "--duration", "20", "--jobs", "1", "--no-cache"]
TINY = ["search", "--designs", "splitwise-hh", "--duration", "1", "--rate", "5",
        "--verify-seeds", "1", "--no-cache", "--jobs", "1"]


@pytest.fixture(scope="module")
def curve_report(tmp_path_factory, cli) -> dict:
    folder = tmp_path_factory.mktemp("curve")
    (folder / "curve.csv").write_text(CURVE)
    outcome = cli(["search", "--load-curve", folder / "curve.csv", *SEARCH,
                   "--out", folder / "out"])
    assert outcome.code == 0, outcome.stderr
    document = json.loads((folder / "out" / "report.json").read_text())
    assert document["load_curve"]["designs"]["splitwise-hh"]["feasible"], "no plan to doctor"
    return document


@pytest.fixture(scope="module")
def plain_report(tmp_path_factory, cli) -> dict:
    out = tmp_path_factory.mktemp("plain") / "out"
    outcome = cli([*TINY, "--out", out])
    assert outcome.code == 0, outcome.stderr
    return json.loads((out / "report.json").read_text())


def _write(tmp_path, document: dict):
    report = tmp_path / "report.json"
    report.write_text(json.dumps(document))
    return report


def _no_simulation(*args, **kwargs):
    raise AssertionError("check simulated a report it must refuse")


def _delete(document: dict, path: tuple) -> dict:
    document = json.loads(json.dumps(document))
    target = document
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return document


@pytest.mark.parametrize("path", [
    ("load_curve",),
    ("load_curve", "windows"),
    ("load_curve", "designs"),
    ("load_curve", "designs", "splitwise-hh"),
    ("load_curve", "designs", "splitwise-hh", "plan"),
    ("load_curve", "designs", "splitwise-hh", "static"),
    ("load_curve", "designs", "splitwise-hh", "feasible"),
], ids=".".join)
def test_a_section_the_inputs_imply_is_required(tmp_path, monkeypatch, cli, bad_input,
                                                curve_report, path):
    """Each used to pass as "optimum unchanged" (exit 0): now one line naming the key, exit 2,
    before anything is simulated."""
    report = _write(tmp_path, _delete(curve_report, path))
    monkeypatch.setattr("provisioner.check.run_study", _no_simulation)
    outcome = cli(["check", report, "--no-cache", "--jobs", "1"])
    bad_input(outcome, "report.json", ".".join(path), "missing")


def test_edited_values_in_every_section_are_a_drift(tmp_path, cli, curve_report):
    """A window's rate, the plan's cost, its whole-curve run, the capacity bound and the
    evidence behind the optimum are each compared with the re-derived report."""
    document = json.loads(json.dumps(curve_report))
    curve = document["load_curve"]
    curve["windows"][1]["rate_rps"] = 99.0
    entry = curve["designs"]["splitwise-hh"]
    entry["cost_usd"]["plan"] = 1.0
    entry["whole_curve"]["static"]["requests"] += 1
    design = document["designs"][0]
    design["capacity_bound"]["value"] = 0.5
    design["optimum"]["worst_margin"] = 0.99
    outcome = cli(["check", _write(tmp_path, document), "--no-cache", "--jobs", "1"])
    assert (outcome.code, outcome.stderr) == (1, ""), outcome.stderr
    for named in ("load_curve.windows[1].rate_rps: 99.0", "load_curve.cost_usd.plan: 1.0",
                  "load_curve.whole_curve.static.requests", "capacity_bound.value: 0.5",
                  "optimum.worst_margin: 0.99", "report differs from its re-derivation"):
        assert named in outcome.stdout, outcome.stdout
    listed = cli(["check", _write(tmp_path, document), "--no-cache", "--jobs", "1", "--json"])
    fields = {change["field"] for change in json.loads(listed.stdout)["changes"]}
    assert "load_curve.windows[1].rate_rps" in fields and "capacity_bound.value" in fields


def test_an_untouched_load_curve_report_is_unchanged_in_every_section(tmp_path, cli,
                                                                      curve_report):
    outcome = cli(["check", _write(tmp_path, curve_report), "--no-cache", "--jobs", "1"])
    assert (outcome.code, outcome.stderr) == (0, ""), outcome.stdout + outcome.stderr
    assert "optimum unchanged for 1 design" in outcome.stdout
    assert "load_curve" in outcome.stdout   # named among the sections re-derived


def test_a_section_the_question_does_not_imply_is_a_drift(tmp_path, cli, plain_report,
                                                          curve_report):
    """A load-curve section pasted into a report of a plain search was not computed for it."""
    document = json.loads(json.dumps(plain_report))
    document["load_curve"] = curve_report["load_curve"]
    outcome = cli(["check", _write(tmp_path, document), "--no-cache", "--jobs", "1"])
    assert outcome.code == 1, outcome.stdout + outcome.stderr
    assert "load_curve: " in outcome.stdout and "-> absent" in outcome.stdout


def test_sensitivity_asked_but_missing_is_refused(tmp_path, monkeypatch, cli, bad_input,
                                                  plain_report):
    document = json.loads(json.dumps(plain_report))
    document["inputs"]["options"]["sensitivity"] = True
    monkeypatch.setattr("provisioner.check.run_study", _no_simulation)
    outcome = cli(["check", _write(tmp_path, document), "--no-cache", "--jobs", "1"])
    bad_input(outcome, "report.json", "'sensitivity'", "--sensitivity")


@pytest.mark.parametrize("flag,key", [("hardware", "summary.hardware"),
                                      ("survive_auto", "summary.survive_failures_auto")])
def test_summary_sections_the_question_implies(plain_report, flag, key):
    study = SimpleNamespace(load_curve=None, settings=SimpleNamespace(sensitivity=False),
                            hardware=False, survive_auto=False)
    implied_sections(plain_report, study, "report.json")   # a plain search implies neither
    setattr(study, flag, True)
    with pytest.raises(InputError, match=key.replace(".", r"\.") + ".*missing"):
        implied_sections(plain_report, study, "report.json")


def test_section_changes_match_designs_by_name_and_leave_answers_out():
    old = {"schema": "s", "inputs": {"a": 1},
           "designs": [{"design": "a", "feasible": True, "optimum": {"gpus": 8, "slo": 1.0},
                        "capacity_bound": {"value": 2.0}},
                       {"design": "b", "feasible": False, "optimum": None}],
           "summary": {"best_design": "a", "evaluations": 3}}
    new = {"schema": "s", "inputs": {"a": 2},
           "designs": [{"design": "b", "feasible": False, "optimum": None},
                       {"design": "a", "feasible": True, "optimum": {"gpus": 16, "slo": 1.5},
                        "capacity_bound": {"value": 2.0}, "frontier": [[1, 1]]}],
           "summary": {"best_design": "b", "evaluations": 3.0}}
    assert section_changes(old, new) == [("a", "optimum.slo", 1.0, 1.5),
                                         ("a", "frontier", "absent", [[1, 1]])]
