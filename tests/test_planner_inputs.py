"""A planner's inputs (issue 40): --isl/--osl, SLO limits in milliseconds, and serving-benchmark
result files as workloads. Each search here is one design over a short window."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import provisioner
from hardware_catalog import InputError
from provisioner.options import SearchOptions, SimulateOptions, build, from_keywords
from provisioner.question import (identity, options_from_echo, resolve_study, tail_lengths,
                                  to_echo)
from simcore.workload import parse_lengths
from slo_profiles import MS_OPTIONS, load_slo_profile, with_ms_limits

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "tests" / "data" / "bench"
DETAILED = BENCH / "vllm-rate4-detailed.json"
GUIDELLM = BENCH / "guidellm-concurrent.json"
SWEEP = BENCH / "vllm-sweep.jsonl"   # no per-request records
SMALL = dict(designs="baseline-h100", duration=30, verify_seeds=3, jobs=1, no_cache=True)


def study(**options):
    return resolve_study(build(SearchOptions, from_keywords(SearchOptions, options)))


# ------------------------------------------------------------------------------ --isl/--osl
def test_fixed_lengths_make_every_request_that_size():
    s = study(isl="2000", osl="300", rate=20.0, duration=30.0)
    sample = s.workload.at(20.0, 30.0, 0)
    assert s.workload.kind == "lengths" and s.workload.name == "isl=2000,osl=300"
    assert set(sample.prompt_tokens) == {2000} and set(sample.output_tokens) == {300}
    assert 450 < len(sample) < 750          # Poisson arrivals at the rate: about 600
    gaps = np.diff(sample.arrival_s)
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.15   # exponential gaps: cv 1
    # the window is derived from the given lengths' P99 (here the lengths themselves)
    derived = study(isl="2000", osl="300").window
    assert (derived.tail_prompt, derived.tail_output) == (2000, 300)


@pytest.mark.parametrize("text,low,high,median", [
    ("uniform:1000-3000", 1000, 3000, 2000), ("lognormal:2000,0.5", 1, None, 2000)])
def test_distributions_sample_as_documented(text, low, high, median):
    s = study(isl=text, osl="lognormal:300,0.3", rate=50.0, duration=120.0)
    sample = s.workload.at(50.0, 120.0, 1)
    prompt = sample.prompt_tokens
    assert prompt.min() >= low and (high is None or prompt.max() <= high)
    assert abs(np.median(prompt) / median - 1) < 0.05
    assert abs(np.median(sample.output_tokens) / 300 - 1) < 0.05
    if text.startswith("lognormal"):     # sigma of the log
        assert abs(np.log(prompt).std() - 0.5) < 0.03
    assert tail_lengths(s.workload)[0] == int(np.ceil(parse_lengths(text).quantile(0.99)))


def test_lengths_are_canonical_and_accept_spec_integers(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("isl: 2000\nosl: ' uniform:100-300 '\nttft_p99_ms: 500\n")
    from provisioner.question import merge_options
    options = merge_options(SearchOptions, {}, spec)
    assert (options.study.isl, options.study.osl) == ("2000", "uniform:100-300")
    assert options.slo_limits.ttft_p99_ms == 500.0


def test_a_search_with_isl_osl_echoes_them_and_keys_the_cache_on_them(tmp_path):
    result = provisioner.search(isl="2000", osl="300", **SMALL)
    inputs = result.to_dict()["inputs"]
    assert inputs["options"]["isl"] == "2000" and inputs["options"]["osl"] == "300"
    assert inputs["workload"]["kind"] == "lengths"
    assert inputs["workload"]["name"] == "isl=2000,osl=300"
    assert result.designs[0].optimum is not None
    # the echo re-resolves to the same question; other lengths are another cache key
    asked = study(isl="2000", osl="300", **{k: v for k, v in SMALL.items()
                                              if k not in ("jobs", "no_cache")})
    again = resolve_study(options_from_echo(to_echo(asked), "report.json"))
    assert identity(again) == identity(asked)
    other = study(isl="2000", osl="400", designs="baseline-h100", duration=30)
    assert identity(other) != identity(asked)


# ------------------------------------------------------------------- SLO limits in ms
def test_ms_limits_replace_their_metric_and_keep_the_others():
    base = load_slo_profile("splitwise")
    mixed = with_ms_limits(base, {("ttft", "p99"): 500.0, ("tbt", "p99"): 50.0})
    assert mixed.name == "splitwise+ttft-p99-500ms+tpot-p99-50ms"
    assert mixed.limits[("ttft", "p99")] == 500.0 and ("ttft", "p50") not in mixed.limits
    assert mixed.limits[("tbt", "p99")] == 50.0 and ("tbt", "p90") not in mixed.limits
    assert {k: v for k, v in mixed.limits.items() if k[0] == "e2e"} == \
        {k: v for k, v in base.limits.items() if k[0] == "e2e"}
    assert (mixed.unit("ttft"), mixed.unit("tbt"), mixed.unit("e2e")) == ("ms", "ms", "x")
    absolute = with_ms_limits(load_slo_profile("interactive-chat"), {("e2e", "p90"): 9000.0})
    assert absolute.limits[("e2e", "p90")] == 9000.0 and absolute.absolute == ()
    assert absolute.limits[("ttft", "p99")] == 5000.0


def test_every_metric_and_percentile_has_an_option():
    from provisioner.options import option_fields
    fields = option_fields(SearchOptions)
    names = {name for name, _, _ in MS_OPTIONS}
    assert names == {f"{m}_{p}_ms" for m in ("ttft", "tpot", "e2e", "itl")
                     for p in ("p50", "p90", "p99")}
    assert names <= set(fields) and names <= set(option_fields(SimulateOptions))
    s = study(**{name: 100.0 + i for i, name in enumerate(sorted(names))})
    assert len(s.slo.limits) == 12 and s.slo.absolute == ("ttft", "tbt", "e2e")


def test_a_tighter_ttft_limit_binds_and_costs_more():
    """At a loose TTFT P99 limit the optimum is bound by TPOT P99; at a tight one TTFT P99
    binds and more machines are bought (prompts queue less). All three metrics are limited in
    ms here, so the profile's slowdowns play no part."""
    common = dict(isl="2000", osl="300", tpot_p99_ms=60.0, e2e_p99_ms=60000.0, **SMALL)
    loose = provisioner.search(ttft_p99_ms=60000.0, **common).designs[0]
    tight = provisioner.search(ttft_p99_ms=250.0, **common).designs[0]
    assert loose.verification["binding_slo"] == "tbt_p99"
    assert tight.verification["binding_slo"] == "ttft_p99"
    assert tight.optimum.prompt_machines > loose.optimum.prompt_machines
    assert tight.optimum.cost_per_hour > loose.optimum.cost_per_hour
    limits = {key: (value, limit) for key, value, limit in tight.optimum.outcome.slo}
    assert limits["ttft_p99"][1] == 250.0 and limits["ttft_p99"][0] <= 250.0
    assert limits["tbt_p99"][1] == 60.0 and limits["ttft_p50"][1] is None


# ---------------------------------------------------------------- result files as workloads
def test_a_vllm_detailed_result_is_a_workload_of_its_lengths():
    s = study(workload=str(DETAILED), model="llama-3.1-8b", designs="splitwise-hh", rate=20.0,
              duration=30.0)
    assert s.workload.kind == "bench"
    d = json.loads(DETAILED.read_text())
    pairs = {(i, o) for i, o, e in zip(d["input_lens"], d["output_lens"], d["errors"]) if not e}
    sample = s.workload.at(20.0, 30.0, 0)
    assert set(zip(sample.prompt_tokens.tolist(), sample.output_tokens.tolist())) <= pairs
    assert len(set(zip(sample.prompt_tokens.tolist(), sample.output_tokens.tolist()))) > 20
    assert "40 requests of vllm-rate4-detailed.json" in sample.notes[0]
    assert sample.notes[1].startswith("poisson arrivals at 20 req/s")


def test_without_a_rate_a_vllm_result_replays_its_recorded_send_times():
    s = study(workload=str(DETAILED), model="llama-3.1-8b", designs="splitwise-hh")
    assert s.goal.rate_rps is None and s.workload.timed
    d = json.loads(DETAILED.read_text())
    base = s.workload.at(None, s.duration_s, s.seed, base_seed=s.seed)
    starts = np.array(d["start_times"])
    assert np.allclose(base.arrival_s, np.sort(starts) - starts.min())
    assert base.prompt_tokens.tolist() == d["input_lens"]   # (sent in order)
    other = s.workload.at(None, s.duration_s, 1, base_seed=s.seed)   # another sample
    assert np.array_equal(other.arrival_s, base.arrival_s)
    assert other.prompt_tokens.tolist() != base.prompt_tokens.tolist()
    untimed = study(workload=str(GUIDELLM), model="llama-3.1-8b", designs="splitwise-hh")
    assert not untimed.workload.timed and untimed.goal.rate_rps == 70.0


def test_a_guidellm_report_is_a_workload_and_a_search_runs_on_it():
    d = json.loads(GUIDELLM.read_text())
    pairs = {(r["prompt_tokens"], r["output_tokens"]) for b in d["benchmarks"]
             for r in b["requests"]["successful"]}
    result = provisioner.search(workload=str(GUIDELLM), model="llama-3.1-8b", rate=10.0,
                                **{**SMALL, "designs": "splitwise-hh"})
    inputs = result.to_dict()["inputs"]
    assert inputs["workload"]["kind"] == "bench" and inputs["goal"]["rate_rps"] == 10.0
    assert result.designs[0].optimum is not None
    sample = study(workload=str(GUIDELLM), model="llama-3.1-8b", designs="splitwise-hh",
                   duration=30.0).workload.at(70.0, 30.0, 0)   # no rate: the default 70
    assert set(zip(sample.prompt_tokens.tolist(), sample.output_tokens.tolist())) <= pairs


# ------------------------------------------------------------------------------ bad input
SEARCH = ["search", "--designs", "splitwise-hh", "--duration", "1", "--rate", "5", "--no-cache"]


@pytest.mark.parametrize("args,names", [
    (["--isl", "2000"], ("--isl", "--osl")),
    (["--osl", "300"], ("--osl", "--isl")),
    (["--isl", "2000", "--osl", "300", "--workload", "conversation"], ("--workload", "--isl")),
    (["--isl", "abc", "--osl", "300"], ("--isl", "uniform:LOW-HIGH")),
    (["--isl", "0", "--osl", "300"], ("--isl",)),
    (["--isl", "uniform:3000-1000", "--osl", "300"], ("--isl", "LOW")),
    (["--isl", "lognormal:2000,9", "--osl", "300"], ("--isl", "sigma")),
    (["--isl", "normal:2000,5", "--osl", "300"], ("--isl",)),
    (["--isl", "2000", "--osl", "99999999999"], ("--osl",)),
    (["--isl", "9999000", "--osl", "10"], ("--isl 9999000 --osl 10", "shorter")),
    (["--ttft-p99-ms", "0"], ("--ttft-p99-ms",)),
    (["--tpot-p99-ms", "-50"], ("--tpot-p99-ms",)),
    (["--tbt-p90-ms", "abc"], ("--tbt-p90-ms",)),
    (["--workload", str(SWEEP)], ("vllm-sweep.jsonl", "per-request")),
])
def test_bad_planner_inputs_are_one_line(cli, bad_input, tmp_path, args, names):
    bad_input(cli([*SEARCH, "--out", tmp_path / "out", *args]), *names)
    assert not (tmp_path / "out").exists()


def test_a_spec_with_both_a_workload_and_lengths_is_refused(cli, bad_input, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("workload: coding\nisl: 2000\nosl: 300\n")
    bad_input(cli([*SEARCH, "--spec", spec, "--out", tmp_path / "out"]), "workload", "isl")
    with pytest.raises(InputError, match="workload= or isl=/osl="):
        provisioner.search(workload="coding", isl="2000", osl="300", **SMALL)


def test_a_result_file_without_lengths_is_refused(cli, bad_input, tmp_path):
    d = json.loads(GUIDELLM.read_text())
    for benchmark in d["benchmarks"]:
        benchmark["requests"] = {"successful": []}
    empty = tmp_path / "guidellm.json"
    empty.write_text(json.dumps(d))
    bad_input(cli([*SEARCH, "--workload", empty, "--out", tmp_path / "out"]),
              "guidellm.json", "per-request")
    broken = tmp_path / "vllm.json"
    d = json.loads(DETAILED.read_text())
    d["input_lens"][3] = -1
    broken.write_text(json.dumps(d))
    bad_input(cli([*SEARCH, "--workload", broken, "--out", tmp_path / "out"]),
              "vllm.json", "request 4 input_lens")


def test_simulate_takes_the_same_inputs(cli):
    outcome = cli(["simulate", "--design", "splitwise-hh", "--prompt", "2", "--token", "2",
                   "--rate", "2", "--duration", "10", "--isl", "1000", "--osl", "100",
                   "--ttft-p99-ms", "100000", "--tpot-p99-ms", "100000", "--json"])
    assert outcome.code in (0, 1), outcome.stderr
    document = json.loads(outcome.stdout)
    assert "isl=1000,osl=100" in json.dumps(document)
    assert "splitwise+ttft-p99-100000ms+tpot-p99-100000ms" in json.dumps(document)
