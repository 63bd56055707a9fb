"""Unit costs (issue 40): each optimum's tokens/s, tokens/s per GPU and per user, $ and kWh per
million tokens in report.json, the terminal and report.html; a plain search ends with a one-line
"Best:" answer; `provision check` re-derives the unit costs like every other section."""
from __future__ import annotations

import json
import re

import pytest

from provisioner.figures import optimum_html
from provisioner.tables import best_line
from provisioner.unitcosts import unit_cost_lines, unit_costs

SEARCH = ["search", "--designs", "splitwise-hh,baseline-h100", "--rate", "5", "--duration",
          "20", "--verify-seeds", "1", "--no-cache", "--jobs", "1"]


def test_arithmetic_on_a_known_case():
    """10 req/s of 1,000 prompt + 200 output tokens on 16 GPUs at $36/h and 10 kW, the
    prompt pool $12/h and the token pool $24/h, TPOT P50 25 ms."""
    record = unit_costs(rate_rps=10.0, mean_prompt_tokens=1000.0, mean_output_tokens=200.0,
                        cost_per_hour=36.0, power_kw=10.0, gpus=16, tpot_p50_ms=25.0,
                        pool_costs={"prompt": 12.0, "token": 24.0})
    expected = {"input_tokens_per_s": 10_000.0, "output_tokens_per_s": 2_000.0,
                "total_tokens_per_s": 12_000.0, "tokens_per_s_per_gpu": 750.0,
                "output_tokens_per_s_per_gpu": 125.0, "output_tokens_per_s_per_user": 40.0,
                # 12,000 tok/s = 43.2 M tokens an hour; 2,000 output tok/s = 7.2 M
                "usd_per_m_tokens_blended": 36.0 / 43.2,
                "usd_per_m_output_tokens_all_cost": 36.0 / 7.2,
                "prompt_pool_usd_per_m_input_tokens": 12.0 / 36.0,   # 36 M input tokens
                "token_pool_usd_per_m_output_tokens": 24.0 / 7.2,
                "kwh_per_m_tokens": 10.0 / 43.2}
    for key, value in expected.items():
        assert record[key] == pytest.approx(value, rel=1e-12), key
    assert record["basis"]["tokens_from"] == "base sample"
    colocated = unit_costs(rate_rps=10.0, mean_prompt_tokens=1000.0, mean_output_tokens=200.0,
                           cost_per_hour=36.0, power_kw=10.0, gpus=16)
    assert "prompt_pool_usd_per_m_input_tokens" not in colocated   # no split without pools
    assert colocated["output_tokens_per_s_per_user"] is None        # no TPOT given


def _document(goal: str = "min-cost", optimum: dict | None = None) -> dict:
    optimum = optimum or {"machines": 3, "rate_rps": 5.0, "cost_per_hour": 114.0,
                          "unit_costs": {"usd_per_m_tokens_blended": 2.66498}}
    return {"inputs": {"goal": {"name": goal}}, "summary": {"best_design": "baseline-h100"},
            "designs": [{"design": "baseline-h100", "prompt_sku": "dgx-h100",
                         "token_sku": None, "optimum": optimum}]}


def test_best_line_of_a_synthetic_report():
    assert best_line(_document()) == ("Best: baseline-h100 3 x dgx-h100 at $114.00/h ($2.66 "
                                      "per M tokens blended)")
    assert best_line(_document("max-rate")).endswith(", serving 5 req/s")
    nobody = _document()
    nobody["summary"]["best_design"] = None
    assert best_line(nobody) is None


@pytest.fixture(scope="module")
def searched(tmp_path_factory, cli):
    out = tmp_path_factory.mktemp("units") / "out"
    outcome = cli([*SEARCH, "--out", out])
    assert outcome.code == 0, outcome.stderr
    return outcome, out


def test_report_terminal_and_page_carry_the_unit_costs(searched):
    outcome, out = searched
    document = json.loads((out / "report.json").read_text())
    for entry in document["designs"]:
        o = entry["optimum"]
        uc = o["unit_costs"]
        basis = uc["basis"]
        assert basis["rate_rps"] == o["rate_rps"] and basis["sample_seed"] == 0
        total = uc["total_tokens_per_s"]
        assert total == pytest.approx(o["rate_rps"] * (basis["mean_prompt_tokens"]
                                                       + basis["mean_output_tokens"]), rel=1e-5)
        assert uc["tokens_per_s_per_gpu"] == pytest.approx(total / o["gpus"], rel=1e-5)
        assert uc["usd_per_m_tokens_blended"] == pytest.approx(
            o["cost_per_hour"] / (total * 3600) * 1e6, rel=1e-5)
        assert uc["kwh_per_m_tokens"] == pytest.approx(o["power_kw"] / (total * 3600) * 1e6,
                                                       rel=1e-5)
        assert uc["output_tokens_per_s_per_user"] == pytest.approx(
            1000.0 / o["latency_ms"]["tpot"]["p50"], rel=1e-5)
        split = "token_pool_usd_per_m_output_tokens" in uc
        assert split == (entry["token_sku"] is not None)   # disaggregated designs only
    lines = unit_cost_lines(document)
    assert lines[0].startswith("Unit costs") and all(len(line) < 80 for line in lines[1:])
    stdout = outcome.stdout
    assert "Unit costs" in stdout and "/M blended" in stdout
    last = [line for line in stdout.splitlines() if line.strip()][-1]
    assert re.fullmatch(r"Best: \S+ \d+ (x dgx-h100|dgx-h100 prompt \+ \d+ dgx-h100 token) at "
                        r"\$[\d,]+\.\d\d/h \(\$[\d.,]+ per M tokens blended\)", last), last
    assert last.startswith(f"Best: {document['summary']['best_design']} ")
    page = (out / "report.html").read_text()
    assert "<h2>Unit costs" in page and "$/M blended" in page
    assert "Unit costs" in optimum_html(document)


def test_check_re_derives_the_unit_costs(searched, cli, tmp_path):
    _, out = searched
    outcome = cli(["check", out / "report.json", "--no-cache", "--jobs", "1"])
    assert (outcome.code, outcome.stderr) == (0, ""), outcome.stdout + outcome.stderr
    document = json.loads((out / "report.json").read_text())
    document["designs"][0]["optimum"]["unit_costs"]["usd_per_m_tokens_blended"] = 0.01
    edited = tmp_path / "report.json"
    edited.write_text(json.dumps(document))
    drift = cli(["check", edited, "--no-cache", "--jobs", "1"])
    assert drift.code == 1, drift.stdout + drift.stderr
    assert "optimum.unit_costs.usd_per_m_tokens_blended: 0.01" in drift.stdout
