"""Every sentence in a report is about something that was computed (issue 34): comparisons
name only designs that were searched, pruned designs say what bounds them, a load curve's
answer is its plan, and `simulate --plan` shows the plan's clusters, never a made-up one."""
from __future__ import annotations

import html
import json
import re

import pytest

import provisioner

HARDWARE = dict(hardware="dgx-h100,b300,h200", duration=20, verify_seeds=2)
KINDS = {"disaggregated": "disaggregated", "chunked": "chunked colocated"}


@pytest.fixture(scope="module")
def hardware_report(tmp_path_factory):
    """BLOOM-176B, coding at 70 req/s over three SKUs: a disaggregated B300 design wins,
    chunked B300 and H200 are pruned (as `--hardware all` prunes chunked B300, which, searched
    alone, costs less than sarathi-h100, the chunked design searched in full)."""
    out = tmp_path_factory.mktemp("hardware")
    result = provisioner.search(**HARDWARE)
    result.write(out)
    return result, json.loads((out / "report.json").read_text()), (out / "report.html").read_text()


def test_the_comparison_names_the_pruned_designs_with_their_bounds(hardware_report):
    result, document, _ = hardware_report
    view = document["summary"]["disaggregated_vs_chunked"]
    assert view["winner"] in KINDS
    lost = next(kind for kind in KINDS if kind != view["winner"])
    pruned = {e["design"]: e["pruned"] for e in document["designs"]
              if e["status"] == "pruned" and (e.get("prefill") == "chunked") == (lost == "chunked")}
    assert pruned, "the question must prune a design of the side that lost"
    sentence = view["sentence"]
    # the side that lost is the best *searched*, and its pruned designs are named with what
    # bounds them, so no margin reads as one over every design of that kind
    assert f"the best {KINDS[lost]} design searched" in sentence
    named = [p["design"] for p in view["pruned"][lost]]
    assert named == sorted(pruned, key=lambda n: (pruned[n]["cannot_beat"], n))
    for name in named[:3]:
        limit = f"${pruned[name]['cannot_beat']:,.2f}/h"
        assert (f"{name} (bound {limit})" if pruned[name]["by"] == "capacity_bound" else
                f"{name} (no pool sizes cheaper than {limit} met the SLOs)") in sentence
    best = result.best.optimum.cost_per_hour
    assert f"answer ({result.best.design.name} at ${best:,.2f}/h)" in sentence
    # what the bounds settle: a margin over every design of that kind, against the least
    least = min([p["cannot_beat"] for p in pruned.values()] + [view[lost]["cost_per_hour"]])
    assert (f"so no {KINDS[lost]} design costs less" if least <= best + 1e-6 else
            f"at least {1 - best / least:.0%} cheaper than every {KINDS[lost]}") in sentence


def test_a_pruned_design_says_its_bound_against_the_answer(hardware_report):
    result, document, page = hardware_report
    best = result.best
    pruned = [e for e in document["designs"] if e["status"] == "pruned"]
    assert any(e["pruned"]["by"] == "capacity_bound" for e in pruned)
    for entry in pruned:
        record = entry["pruned"]
        assert entry["optimum"] is None and entry["reason"].startswith("pruned: ")
        assert record["answer"]["design"] == best.design.name
        assert record["answer"]["value"] == pytest.approx(best.optimum.cost_per_hour)
        assert record["cannot_beat"] >= best.optimum.cost_per_hour - 1e-6
        if record["by"] == "capacity_bound":
            assert entry["reason"].startswith(
                f"pruned: bound ${record['cannot_beat']:,.2f}/h above the answer")
            assert record["cannot_beat"] == entry["capacity_bound"]["value"]
    for entry in document["designs"]:   # infeasible designs keep their word and keys
        if entry["status"] == "infeasible":
            assert "pruned" not in entry
    # report.html: no pruned design is labelled infeasible
    rows = re.findall(r'<tr><td>([^<]*)</td><td colspan="9">([^<]*)</td></tr>', page)
    labels = {html.unescape(name): text for name, text in rows}
    for entry in pruned:
        text = html.unescape(labels[entry["design"]])
        assert text.startswith("pruned: ") and "infeasible" not in text, text


def _curve(tmp_path, text: str):
    path = tmp_path / "curve.csv"
    path.write_text(text)
    return path


def test_a_load_curve_reports_first_line_is_the_plan(run_cli, tmp_path):
    """The terminal's first line and report.html's answer: the plan, its saving and whether
    it held over the whole curve, then the static cluster."""
    path = _curve(tmp_path, "time_s,rate_rps\n0,2\n600,12\n1200,2\n1800,2\n")
    out = tmp_path / "out"
    run = run_cli("search", "--load-curve", path, "--window", "600", "--designs",
                  "splitwise-hh", "--model", "llama2-70b", "--duration", "30",
                  "--verify-seeds", "2", "--out", out, "--quiet")
    assert run.returncode == 0, run.stderr
    document = json.loads((out / "report.json").read_text())
    entry = document["load_curve"]["designs"]["splitwise-hh"]
    assert entry["cost_usd"]["plan"] < entry["cost_usd"]["static"]
    first = run.stdout.splitlines()[0]
    plan, static = f"${entry['cost_usd']['plan']:,.0f}", f"${entry['cost_usd']['static']:,.0f}"
    assert first.startswith("Plan: splitwise-hh"), first
    assert plan in first and static in first and f"{entry['saves']:.0%} less" in first
    held = entry["whole_curve"]["plan"]["windows_met"] == len(document["load_curve"]["windows"])
    assert ("it held over the whole curve" if held else "did not hold") in first
    cost = document["designs"][0]["optimum"]["cost_per_hour"]
    assert first.index(plan) < first.index("Static cluster") < first.index(f"${cost:,.2f}/h")
    page = (out / "report.html").read_text()
    answer = html.unescape(re.search(r'<p class="answer"><b>(.*?)</b>', page).group(1))
    assert answer.startswith("Plan: splitwise-hh") and plan in answer


def test_simulate_with_a_plan_reports_its_clusters_not_a_made_up_one(run_cli, tmp_path):
    """The plan's largest pools (4P+2T, $228/h) serve in no window: neither the terminal nor
    the JSON names that cluster; each step and each window give the pools that serve then."""
    curve = _curve(tmp_path, "time_s,rate_rps\n0,2\n60,12\n120,4\n")
    plan = tmp_path / "plan.csv"
    plan.write_text("start_s,prompt_machines,token_machines\n0,1,1\n60,4,1\n120,1,2\n")
    common = ("simulate", "--design", "splitwise-hh", "--model", "llama2-70b", "--load-curve",
              curve, "--curve-window", "60", "--plan", plan)
    terminal = run_cli(*common)
    assert terminal.returncode in (0, 1), terminal.stderr
    assert "$228" not in terminal.stdout and "4 prompt + 2 token" not in terminal.stdout
    assert "4P+2T" not in terminal.stdout
    assert "0:01-0:02 4P+1T $190.00/h" in terminal.stdout
    for window, pools in (("0:00-0:01", "1P+1T"), ("0:01-0:02", "4P+1T"),
                          ("0:02-0:03", "1P+2T")):
        assert f"window {window} {pools}:" in terminal.stdout
    document = json.loads(run_cli(*common, "--json").stdout)
    assert document["prompt_machines"] is None and document["cost_per_hour"] is None
    assert [(s["prompt_machines"], s["token_machines"], s["cost_per_hour"])
            for s in document["plan"]] == [(1, 1, 76.0), (4, 1, 190.0), (1, 2, 114.0)]
    assert [w["pools"] for w in document["windows"]] == [[[1, 1]], [[4, 1]], [[1, 2]]]
    assert document["plan_totals"]["cost_usd"] == pytest.approx((76 + 190 + 114) / 60)
