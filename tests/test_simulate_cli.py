"""`provision simulate`: SLO table, JSON, per-request CSV, and exit codes 0 / 1 / 2."""
from __future__ import annotations

import json

import pandas as pd
import pytest


def test_well_sized_cluster_meets_slos_and_writes_requests(tmp_path, run_cli):
    out = tmp_path / "requests.csv"
    run = run_cli("simulate", "--design", "splitwise-hh", "--prompt", "30", "--token", "8",
                  "--rate", "20", "--duration", "30", "--requests-csv", str(out), "--json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["passed"] is True and doc["feasible"] is True
    assert set(doc["slo"]) == {f"{m}_{p}" for m in ("ttft", "tbt", "e2e")
                               for p in ("p50", "p90", "p99")}
    frame = pd.read_csv(out)
    assert len(frame) == doc["requests"] and frame["e2e_s"].notna().all()


def test_undersized_cluster_fails_with_exit_1(run_cli):
    run = run_cli("simulate", "--design", "baseline-a100", "--machines", "1", "--rate", "20",
                  "--duration", "20")
    assert run.returncode == 1, run.stderr
    assert "FAIL" in run.stdout


def test_custom_design_from_two_skus(run_cli):
    run = run_cli("simulate", "--design", "h200/dgx-a100", "--prompt", "4", "--token", "4",
                  "--rate", "5", "--duration", "20", "--json")
    assert run.returncode in (0, 1), run.stderr
    assert json.loads(run.stdout)["design"] == "h200/dgx-a100"


@pytest.mark.parametrize("args, fragment", [
    (["--design", "splitwise-xx", "--prompt", "2", "--token", "2"], "unknown design"),
    (["--design", "splitwise-hh", "--prompt", "0", "--token", "2"], "must be a whole number >= 1"),
    (["--design", "splitwise-hh", "--prompt", "2", "--token", "-1"], "must be a whole number >= 1"),
    (["--design", "baseline-a100", "--machines", "0"], "must be a whole number >= 1"),
    (["--design", "baseline-a100", "--prompt", "2", "--token", "2"], "--machines"),
    (["--design", "splitwise-hh", "--machines", "4"], "--prompt"),
    (["--design", "splitwise-hh", "--prompt", "2", "--token", "2", "--rate", "0"], "rate"),
    (["--design", "splitwise-hh", "--prompt", "2", "--token", "2", "--rate", "-3"], "rate"),
    (["--design", "splitwise-hh", "--prompt", "2", "--token", "2", "--model", "gpt-9"],
     "unknown model"),
    (["--design", "nope/dgx-a100", "--prompt", "2", "--token", "2"], "unknown machine SKU"),
    (["--design", "splitwise-hh", "--prompt", "2", "--token", "2", "--slo", "nope"],
     "unknown SLO profile"),
])
def test_bad_input_is_one_line_and_exit_2(args, fragment, run_cli):
    run = run_cli("simulate", *args)
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert fragment in run.stderr
    assert "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_empty_workload_file_is_rejected(tmp_path, run_cli):
    trace = tmp_path / "empty.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n")
    run = run_cli("simulate", "--design", "splitwise-hh", "--prompt", "2", "--token", "2",
                  "--workload", str(trace))
    assert run.returncode == 2
    assert "empty.csv" in run.stderr and "Traceback" not in run.stderr


def test_replays_a_trace_file_as_it_is(tmp_path, run_cli):
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,100,5\n0.5,2000,20\n1.0,300,1\n")
    run = run_cli("simulate", "--design", "splitwise-aa", "--prompt", "1", "--token", "1",
                  "--workload", str(trace), "--json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["requests"] == 3 and doc["workload"].startswith("trace")
