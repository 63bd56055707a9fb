"""The question a search answers: one record, one serialization (provisioner.question).

- echo -> from_echo round-trips every option (a property over generated questions);
- every option declared `outcome=True` changes the evaluation cache's identity and every other
  option of the question leaves it alone (so a widened search still reuses its entries);
- the cache can slow a search, never change its answer;
- errors name the option as the caller wrote it.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import provisioner
from hardware_catalog import DATA_DIR, InputError
from provisioner.options import SearchOptions, build, from_keywords, leaves
from provisioner.question import (echoed_options, from_echo, identity, options_from_echo,
                                  resolve_study, to_echo)
from simcore import SimOptions
from slo_profiles import MS_OPTIONS

REPO = Path(__file__).resolve().parents[1]
PERF_TABLE = REPO / "examples" / "perf-tables" / "dgx-h100-bloom.yaml"
MODEL_CONFIG = REPO / "examples" / "models" / "mistral-7b-v0.1.json"


def study_of(**values):
    return resolve_study(build(SearchOptions, values))


# ------------------------------------------------------------------------- the round trip
def _goal_and_budget(draw) -> dict:
    goal = draw(st.sampled_from(["min-cost", "min-power", "max-rate"]))
    if goal != "max-rate":
        return {"goal": goal, "rate": draw(st.sampled_from([None, 5.0, 70.0, 123.4]))}
    budget = draw(st.sampled_from(["power_budget_kw", "cost_budget_per_hour", "budget_like"]))
    value = {"power_budget_kw": draw(st.floats(1.0, 1e4)),
             "cost_budget_per_hour": draw(st.floats(1.0, 1e4)),
             "budget_like": draw(st.sampled_from(["dgx-h100:40", "cost:dgx-a100:7",
                                                  "power:h200:3"]))}[budget]
    return {"goal": goal, budget: value}


@st.composite
def questions(draw) -> dict:
    values = _goal_and_budget(draw)
    values.update(
        model=draw(st.sampled_from(["bloom-176b", "llama2-70b"])),
        workload=draw(st.sampled_from(["coding", "conversation"])),
        duration=draw(st.sampled_from([30.0, 120.0, 61.5])),
        seed=draw(st.integers(0, 2**40)),
        slo=draw(st.sampled_from(["splitwise", "relaxed-batch", "interactive-chat"])),
        memory_reserve=draw(st.sampled_from([None, 0.0, 0.2])),
        assumptions=draw(st.sampled_from(["provision", "splitwise-sim"])),
        chunk_tokens=draw(st.sampled_from([None, 256, "auto"])),
        designs=tuple(draw(st.lists(st.sampled_from(["splitwise-hh", "baseline-a100",
                                                     "sarathi-h100", "h200/dgx-a100"]),
                                    min_size=1, max_size=3, unique=True))),
        max_machines=draw(st.sampled_from([None, 50])),
        max_gpus=draw(st.sampled_from([None, 800])),
        verify_seeds=draw(st.integers(1, 30)),
        verify_margin=draw(st.sampled_from([0.0, 0.05, 0.1])),
        slo_confidence=draw(st.sampled_from([0.5, 0.9])),
        exhaustive=draw(st.booleans()),
        sensitivity=draw(st.booleans()),
        rate_tolerance=draw(st.sampled_from([0.02, 0.1])),
        search_limit=draw(st.sampled_from([16_384, 64])),
    )
    engine = draw(st.sampled_from(["vllm", "sglang", "splitwise-2023"]))
    # fp8 (weights or KV) needs the engine's fp8 tables on every machine: none on A100
    fp8 = (engine == "vllm" and values["assumptions"] == "provision"
           and not any("a100" in d for d in values["designs"]))
    values.update(engine=engine,
                  dtype=draw(st.sampled_from(["bf16", "fp8"] if fp8 else ["bf16"])),
                  kv_dtype=draw(st.sampled_from(["auto", "bf16", "fp8"] if fp8
                                                else ["auto", "bf16"])))
    if engine != "splitwise-2023" and values["assumptions"] == "provision" and draw(st.booleans()):
        values.update(iteration_overhead_ms=draw(st.sampled_from([0.0, 1.5])),
                      sequence_overhead_us=draw(st.sampled_from([None, 25.0])),
                      host_overlap=draw(st.sampled_from([None, True, False])))
    if draw(st.booleans()):
        values.update(survive_failures=draw(st.integers(1, 3)),
                      recovery=draw(st.sampled_from(["restart", "replicate"])),
                      restart=draw(st.sampled_from(["recompute", "regenerate"])),
                      mtbf_hours=draw(st.sampled_from([None, 0.5])),
                      detection_s=draw(st.sampled_from([5.0, 1.0])))
    return values


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(values=questions())
def test_echo_round_trips_every_option(values):
    options = build(SearchOptions, values)
    study = resolve_study(options)
    echo = json.loads(json.dumps(to_echo(study)))      # what report.json holds
    again = options_from_echo(echo, "report.json")
    assert again == replace(options, execution=again.execution)
    rebuilt = from_echo(echo, "report.json")
    assert to_echo(rebuilt) == to_echo(study)
    assert identity(rebuilt) == identity(study)


def test_the_echo_holds_every_option_of_the_question_and_none_of_its_execution():
    echoed = echoed_options()
    every = {path[-1]: path[0] for path, f in leaves(SearchOptions)}
    assert {n for n, group in every.items() if group == "execution"}.isdisjoint(echoed)
    assert {n for n, group in every.items() if group != "execution"} - {"min_rate",
                                                                          "max_rate"} \
        == set(echoed)
    for name, f in echoed.items():   # each option of the question says whether it moves an outcome
        assert f.metadata["outcome"] in (True, False), name


# ------------------------------------------------------------------------- the cache key
def _catalog_with_a_wider_reference(tmp_path: Path) -> str:
    """The packaged catalog with the slowdown reference (DGX-A100) given more HBM."""
    folder = tmp_path / "catalog"
    shutil.copytree(DATA_DIR, folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    machines = folder / "machines.yaml"
    text = machines.read_text()
    start = text.index("dgx-a100:")
    at = text.index("hbm_gib:", start)
    end = text.index("\n", at)
    machines.write_text(text[:at] + "hbm_gib: 96" + text[end:])
    return str(folder)


FAILING = {"survive_failures": 1}   # failure options apply only when machines fail
OUTCOME_CHANGES = {   # option -> (base options, the option's other value)
    "model": ({}, "llama2-70b"),
    "model_config": ({}, str(MODEL_CONFIG)),
    "workload": ({}, "conversation"),
    "duration": ({}, 60.0),
    "seed": ({}, 3),
    "slo": ({}, "relaxed-batch"),
    "perf_model": ({}, str(PERF_TABLE)),
    "engine": ({}, "splitwise-2023"),
    "dtype": ({"designs": ("splitwise-hh",)}, "fp8"),   # no fp8 tables on A100
    "kv_dtype": ({"designs": ("splitwise-hh",)}, "fp8"),
    "memory_reserve": ({}, 0.25),
    "assumptions": ({}, "splitwise-sim"),
    "kv_admission": ({}, "reserve"),
    "batching": ({}, "prefill-first"),
    "prefix_cache": ({}, "on"),
    "prefix_host_memory": ({"prefix_cache": "on"}, 256.0),
    "catalog": ({}, None),   # filled in by the test (a copy of the catalog, edited)
    "survive_failures": ({}, 2),
    "mtbf_hours": ({}, 1000.0),
    "repair_minutes": ({"mtbf_hours": 1000.0}, 5.0),
    "recovery": (FAILING, "replicate"),
    "restart": (FAILING, "regenerate"),
    "replica_target": ({**FAILING, "recovery": "replicate"}, "peer"),
    "detection_s": (FAILING, 1.0),
    "slo_confidence": ({}, 0.99),
    "mixed_pool": ({"designs": ("splitwise-hh",)}, False),
    "iteration_overhead_ms": ({}, 1.0),
    "spec_decode": ({}, "mtp"),
    "spec_tokens": ({"spec_decode": "eagle"}, 2),
    "acceptance": ({"spec_decode": "mtp"}, (0.7,)),
    "sequence_overhead_us": ({}, 20.0),
    "first_token_overhead_ms": ({}, 10.0),
    "host_overlap": ({}, True),
    "isl": ({"isl": "1000", "osl": "300"}, "uniform:1000-3000"),
    "osl": ({"isl": "2000", "osl": "300"}, "lognormal:300,0.5"),
    "prefix_model": ({}, "system=2:500,turns=1-3,think=10"),
    # a closed loop's users, think time and requests (the goal's closed loop)
    "concurrency": ({}, 8),
    "think_time": ({"concurrency": 8}, 2.0),
    "requests": ({"concurrency": 8}, 500),
    **{name: ({}, 500.0) for name, _, _ in MS_OPTIONS},   # --ttft-p99-ms ... over the profile
}
OTHER_CHANGES = {   # options that change the search or its points, never a sample's outcome
    "rate": 50.0, "chunk_tokens": 1024, "designs": ("splitwise-hh",), "goal": "min-power",
    "custom_designs": {"mine": {"prompt_sku": "h200"}}, "max_machines": 9, "max_gpus": 64,
    "max_prompt": 3, "max_token": 3, "exhaustive": True, "search_limit": 32,
    "rate_tolerance": 0.1, "verify_seeds": 3, "verify_margin": 0.0, "sensitivity": True,
    "start_rate": 2.0, "load_sweep": (0.9,), "tp": 8, "tp_prompt": 8, "tp_token": 8, "pp": 1,
    "ep": 1, "ep_prompt": 1, "ep_token": 1,
    "price": (("dgx-h100", 30.0),), "hardware": ("dgx-h100",),
    "load_curve": str(REPO / "examples" / "load-curves" / "azure-coding-2024-05-13.csv"),
    "window": 1800.0, "peak_rate": 50.0, "scale_up_minutes": 5.0, "min_machines": 2,
    "curve_shape": "linear",
}


def test_every_option_is_classified_by_these_tests():
    outcome = {n for n, f in echoed_options().items() if f.metadata["outcome"]}
    assert outcome == set(OUTCOME_CHANGES)
    others = {n for n, f in echoed_options().items() if not f.metadata["outcome"]}
    assert others - {"power_budget_kw", "cost_budget_per_hour", "budget_like"} \
        == set(OTHER_CHANGES)


@pytest.mark.parametrize("name", sorted(OUTCOME_CHANGES))
def test_an_outcome_option_changes_the_cache_key(name, tmp_path):
    base, other = OUTCOME_CHANGES[name]
    if name == "catalog":
        other = _catalog_with_a_wider_reference(tmp_path)
    before = identity(study_of(**base))
    assert identity(study_of(**{**base, name: other})) != before


CURVE_OPTIONS = ("window", "peak_rate", "scale_up_minutes", "min_machines",
                 "curve_shape")  # need a curve


@pytest.mark.parametrize("name", sorted(OTHER_CHANGES))
def test_other_options_leave_the_cache_key_alone(name):
    base = {"load_curve": OTHER_CHANGES["load_curve"]} if name in CURVE_OPTIONS else {}
    assert (identity(study_of(**{**base, name: OTHER_CHANGES[name]}))
            == identity(study_of(**base)))


SMALL = dict(designs="splitwise-hh", rate=40, duration=30, verify_seeds=3, jobs=1)


def test_a_shared_cache_respects_the_slo_confidence(tmp_path):
    """The issue's example: the 0.99 search must not reuse the 0.5 search's verdicts."""
    cache = str(tmp_path / "cache")
    provisioner.search(slo_confidence=0.5, cache_dir=cache, **SMALL)
    shared = provisioner.search(slo_confidence=0.99, cache_dir=cache, **SMALL)
    alone = provisioner.search(slo_confidence=0.99, **SMALL)
    (hh,) = shared.designs
    assert (hh.optimum.prompt_machines, hh.optimum.token_machines) == \
        (alone.designs[0].optimum.prompt_machines, alone.designs[0].optimum.token_machines)
    assert shared.to_dict()["designs"] == alone.to_dict()["designs"]


def test_forged_cache_entries_cannot_change_the_answer(tmp_path, capsys):
    """Entries that say cheap points pass (written by hand, or by other code) are caught when
    the optimum is simulated again, and the search runs again without reading the cache."""
    from provisioner.evaluate import SimulationEvaluator
    from provisioner.runner import DiskCache, Runner
    from provisioner.study import Outcome, Point

    cache = tmp_path / "cache"
    plain = provisioner.search(**SMALL)
    study = resolve_study(build(SearchOptions, from_keywords(SearchOptions, SMALL)))
    runner = Runner(SimulationEvaluator(study), 1, cache=DiskCache(cache))
    design = plain.designs[0].design   # the layout variant the search simulated
    forged = Outcome(True, True, "", tuple((key, 1.0, limit) for key, _, limit in
                                           plain.designs[0].optimum.outcome.slo), 0.5, 100)
    low = plain.designs[0].optimum   # cheap points around and below the growth's start
    for p in range(1, low.prompt_machines):
        for t in range(1, low.token_machines + 1):
            for seed in range(3):
                sample = (Point(design, p, t, 40.0), seed)
                runner.cache.put(runner._cache_key(sample), forged)
    cached = provisioner.search(cache_dir=str(cache), **SMALL)
    assert cached.to_dict()["designs"] == plain.to_dict()["designs"]
    assert "holds entries the simulator does not reproduce" in capsys.readouterr().err
    again = provisioner.search(cache_dir=str(cache), **SMALL)   # the entries were rewritten
    assert again.to_dict()["designs"] == plain.to_dict()["designs"]


# ------------------------------------------------------------------------------ its inverse
def test_check_refuses_an_echoed_option_out_of_range(tmp_path):
    echo = to_echo(study_of())
    for name, bad in (("memory_reserve", -0.5), ("memory_reserve", "x"), ("goal", None),
                      ("rate", -1.0), ("verify_seeds", 0)):
        tampered = json.loads(json.dumps(echo))
        tampered["options"][name] = bad
        with pytest.raises(InputError, match=f"inputs.options.{name}"):
            from_echo(tampered, "report.json")


def test_check_names_but_never_prints_a_file_the_report_points_at(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("PASSWORD=hunter2\nmore\n")
    echo = json.loads(json.dumps(to_echo(study_of())))
    echo["options"]["workload"] = str(secret)
    with pytest.raises(InputError) as err:
        from_echo(echo, "report.json", tmp_path)
    assert str(secret) in str(err.value) and "inputs.options.workload" in str(err.value)
    assert "hunter2" not in str(err.value) and "PASSWORD" not in str(err.value)


def test_a_report_file_name_is_resolved_beside_the_report(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,10\n1,200,20\n")
    echo = json.loads(json.dumps(to_echo(study_of(workload=str(trace), rate=None))))
    echo["options"]["workload"] = "trace.csv"      # as written, relative to the report
    study = from_echo(echo, "report.json", tmp_path)
    assert Path(study.workload.path) == trace


# ------------------------------------------------------------------------------ the naming
def test_cross_option_errors_name_the_option_as_the_caller_wrote_it(tmp_path):
    with pytest.raises(InputError) as err:
        provisioner.search(goal="max-rate", rate=5, budget_like="dgx-h100:4")
    assert "rate=" in str(err.value) and "--rate" not in str(err.value)
    spec = tmp_path / "spec.yaml"
    spec.write_text("goal: max-rate\nrate: 5\nbudget_like: dgx-h100:4\n")
    with pytest.raises(InputError) as err:
        provisioner.search(spec=spec)
    assert "drop rate" in str(err.value) and "--rate" not in str(err.value)
    assert "rate=" not in str(err.value)


def test_cross_option_errors_on_the_command_line_name_flags(tmp_path, cli):
    outcome = cli(["search", "--goal", "max-rate", "--rate", "5", "--budget-like", "dgx-h100:4",
                   "--out", tmp_path / "out"])
    assert outcome.code == 2
    assert "drop --rate" in outcome.stderr


def test_sim_options_refuse_a_reserve_out_of_range_from_python():
    """The range check sat after a `return` and never ran."""
    with pytest.raises(InputError, match="memory_reserve_fraction"):
        SimOptions(memory_reserve_fraction=-0.5)
    with pytest.raises(InputError, match="memory_reserve_fraction"):
        SimOptions(memory_reserve_fraction=1.0)


def test_the_committed_reference_reports_echo_every_option():
    """`provision check` refuses a report whose echo lacks an option: a new option means
    regenerating examples/reference (examples/ci/regenerate_reference.sh), or CI's reference
    check fails."""
    for path in sorted((REPO / "examples" / "reference").glob("*/report.json")):
        echoed = json.loads(path.read_text())["inputs"]["options"]
        assert set(echoed) == set(echoed_options()), path


# ------------------------------------------------------------------ the simulate question
def test_simulate_question_resolves_once_and_is_what_simulate_runs(tmp_path):
    """`resolve_simulate` turns the options into one record (names looked up, the sample drawn,
    the layouts pinned); `simulate_question` runs it; the run's `to_dict` is simulate --json."""
    from provisioner.api import simulate_question
    from provisioner.options import SimulateOptions
    from provisioner.question import SimulateQuestion, resolve_simulate
    values = {"design": "splitwise-hh", "prompt": 2, "token": 2, "model": "llama2-70b",
              "rate": 5.0, "duration": 20.0}
    question = resolve_simulate(build(SimulateOptions, values))
    assert isinstance(question, SimulateQuestion) and question.curve is None
    asked = question.to_dict()
    assert (asked["design"], asked["prompt_machines"], asked["token_machines"]) == (
        "splitwise-hh", 2, 2)
    assert asked["model"] == "llama2-70b" and asked["rate_rps"] == 5.0
    assert asked["requests"] == len(question.requests) > 0
    assert asked["perf_model"] == question.perf.identity()
    json.dumps(asked)   # plain values
    run = simulate_question(question)
    assert run.to_dict() == provisioner.simulate(**values).to_dict()
    assert run.to_dict()["requests"] == asked["requests"]


def test_simulate_question_of_a_load_curve_holds_its_windows_and_no_sample():
    from provisioner.options import SimulateOptions
    from provisioner.question import resolve_simulate
    curve = REPO / "examples" / "load-curves" / "azure-coding-2024-05-13.csv"
    question = resolve_simulate(build(SimulateOptions, {
        "design": "splitwise-hh", "prompt": 2, "token": 2, "load_curve": str(curve),
        "curve_window": 3600.0}))
    asked = question.to_dict()
    assert question.requests is None and asked["requests"] is None
    assert len(asked["windows"]) == 24 and asked["windows"][0] == [0.0, 3600.0]
    assert asked["load_curve"] == str(curve) and asked["plan"] == []
