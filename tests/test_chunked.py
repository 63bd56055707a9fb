"""Chunked prefill (Sarathi-Serve): both engines agree, the budget and stall-free rules hold, the
TBT/TTFT trade-off goes the way Sarathi's ablation says, the overhead model behaves, and the
options, designs, search and reports carry the policy."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hardware_catalog import Design, InputError, load_catalog
from hardware_catalog.checks import Invalid, OrAuto, count
from simcore import Cluster, LatencyCurves, SimOptions, Workload, simulate
from simcore.cluster import build_machine_arrays
from simcore.perfmodel import default_performance_model
from simcore.refsim import simulate_reference
from simcore.workload import synthesize
from strategies import (assert_engines_agree, both_engines, failure_options, fit, increasing,
                        schedules, workloads)

CATALOG = load_catalog()
MODEL = CATALOG.model("bloom-176b")
REFERENCE = CATALOG.machine("dgx-a100")
PERF = default_performance_model()


class SyntheticPerf:
    """Monotone curves with chunk terms, scaled per SKU (as tests/test_simulator.py)."""

    def __init__(self, prompt_y, decode_y, context_coeff, attention, kv_read):
        self.args = prompt_y, decode_y, context_coeff, attention, kv_read

    def curves(self, model, machine, tp=None):
        prompt_y, decode_y, context, attention, kv_read = self.args
        speed = machine.fp16_tflops / 312.0
        return LatencyCurves(np.array([1.0, 512.0, 2048.0, 8192.0]),
                             np.array(prompt_y) / speed * machine.prompt_slowdown,
                             np.array([1.0, 16.0, 64.0]), np.array(decode_y) / speed ** 0.5,
                             context, attention, kv_read).scaled()


perf_models = st.builds(SyntheticPerf, increasing(0.005, 0.5, 4), increasing(0.005, 0.03, 3),
                        st.sampled_from([0.0, 1e-7]), st.sampled_from([0.0, 1e-8, 1e-6]),
                        st.sampled_from([0.0, 1e-6, 1e-4]))


@st.composite
def chunked_clusters(draw):
    budget = draw(st.sampled_from([1, 7, 64, 512, 2048]))
    kind = draw(st.sampled_from(["sarathi-a100", "sarathi-h100", "split"]))
    if kind != "split":
        return Cluster(dataclasses.replace(CATALOG.design(kind), chunk_tokens=budget),
                       draw(st.integers(1, 4)))
    prompt, token = draw(st.sampled_from([("dgx-h100", "dgx-a100"), ("dgx-a100", "dgx-a100"),
                                          ("dgx-h100", "dgx-h100-cap")]))
    design = Design("split-chunked", CATALOG.machine(prompt), CATALOG.machine(token),
                    mixed_pool=draw(st.booleans()), prefill="chunked", chunk_tokens=budget)
    return Cluster(design, draw(st.integers(1, 3)), draw(st.integers(1, 3)))


options = st.builds(SimOptions, prompt_token_limit=st.sampled_from([1, 512, 2048]),
                    mixed_pool_queue_threshold=st.sampled_from([0, 2048, 8192]),
                    memory_reserve_fraction=st.floats(0.36, 0.40))

SETTINGS = settings(max_examples=250, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ------------------------------------------------------------------------- engines agree
@SETTINGS
@given(cluster=chunked_clusters(), workload=workloads(), perf=perf_models, opts=options)
def test_fast_core_agrees_with_reference_on_chunked_designs(cluster, workload, perf, opts):
    fast, ref = both_engines(cluster, workload, perf, opts)
    assert_engines_agree(fast, ref,
                         series=("first_token_s", "finish_s", "kv_transfer_s", "ttft_s",
                                 "e2e_s"),
                         exact=("iterations", "max_memory_tokens", "prompt_chunks"),
                         close=("busy_s", "mixed_pool_s", "mean_batch", "chunked_prefill_s"))
    if not fast.feasible:
        return
    # every request finishes once; prompt pieces: at least one per prompt
    assert np.all(np.isfinite(fast.finish_s)) and np.all(fast.first_token_s >= workload.arrival_s)
    assert fast.machine_stats["prompt_chunks"].sum() >= len(workload)
    assert np.all(fast.machine_stats["max_memory_tokens"]
                  <= fast.machine_stats["kv_capacity_tokens"])


@SETTINGS
@given(cluster=chunked_clusters(), workload=workloads(), perf=perf_models, data=st.data())
def test_fast_core_agrees_with_reference_on_chunked_designs_under_failures(cluster, workload,
                                                                           perf, data):
    opts = data.draw(failure_options)
    opts = dataclasses.replace(opts, failures=fit(data.draw(schedules()), cluster))
    assert_engines_agree(*both_engines(cluster, workload, perf, opts), machines=False,
                         exact=("iterations", "prompt_chunks"), close=())


def test_a_replica_restored_during_a_chunk_run_is_admitted_where_the_reference_admits_it():
    """Hypothesis found it: after a failure, a replica restored to a colocated machine arrives
    as a KV cache while the machine runs a prompt's pieces as one event (a chunk run); the run
    must end with the iteration in flight so the decode joins the next one."""
    cluster = Cluster(dataclasses.replace(CATALOG.design("sarathi-a100"), chunk_tokens=64), 1)
    n = 30
    workload = Workload("random", np.zeros(n), np.array([1] * 28 + [357, 129], np.int64),
                        np.array([1] * 28 + [3, 1], np.int64))
    perf = SyntheticPerf(list(np.cumsum([0.125, 0.5, 0.5, 0.5])),
                         list(np.cumsum([0.015625] * 3)), 0.0, 0.0, 0.0)
    opts = SimOptions(prompt_token_limit=512, mixed_pool_queue_threshold=0,
                      memory_reserve_fraction=0.375, detection_s=0.0, recovery="replicate",
                      replica_target="host", failures=((1.5, "prompt", 0, 0.05),))
    assert_engines_agree(*both_engines(cluster, workload, perf, opts), machines=False,
                         exact=("iterations", "prompt_chunks"), close=())


def test_fast_core_agrees_on_realistic_sarathi_runs():
    for design, machines, budget in (("sarathi-a100", 3, 256), ("sarathi-h100", 2, 2048)):
        cluster = Cluster(dataclasses.replace(CATALOG.design(design), chunk_tokens=budget),
                          machines)
        w = synthesize("conversation", 6.0, 20.0, seed=4)
        fast = simulate(cluster, w, MODEL, PERF, REFERENCE)
        ref = simulate(cluster, w, MODEL, PERF, REFERENCE, engine="reference")
        np.testing.assert_allclose(fast.finish_s, ref.finish_s, rtol=1e-9)
        np.testing.assert_allclose(fast.first_token_s, ref.first_token_s, rtol=1e-9)


# ------------------------------------------------------------------- budget and stall-free
def _trace(cluster, workload, perf=PERF, opts=SimOptions()):
    machines = build_machine_arrays(cluster, MODEL, perf, opts)
    trace: list = []
    raw = simulate_reference(workload, machines, trace)
    return raw, trace


@pytest.mark.parametrize("budget", [64, 512, 2048])
@pytest.mark.parametrize("design", ["sarathi-a100", "sarathi-h100"])
def test_budget_bounds_prompt_tokens_and_no_decode_ever_stalls(design, budget):
    cluster = Cluster(dataclasses.replace(CATALOG.design(design), chunk_tokens=budget), 2)
    w = synthesize("coding", 8.0, 20.0, seed=1)
    raw, trace = _trace(cluster, w)
    # Sarathi-Serve's Algorithm 3: the running decodes' tokens count in the budget first
    assert trace and all(sum(p for _, p, _ in it["chunks"]) <= max(0, budget - len(it["decodes"]))
                         for it in trace)
    squeezed = [it for it in trace if it["decodes"] and it["chunks"]]
    assert squeezed and any(sum(p for _, p, _ in it["chunks"]) + len(it["decodes"]) == budget
                            for it in squeezed)
    # a prompt's pieces are consecutive slices that add up to the prompt
    done = np.zeros(len(w), dtype=np.int64)
    for it in trace:
        for r, piece, before in it["chunks"]:
            assert before == done[r] and piece >= 1
            done[r] += piece
    np.testing.assert_array_equal(done, w.prompt_tokens)
    # stall-free: from its first token to its last, a request decodes in every iteration of
    # its machine, and in no other
    by_machine: dict[int, list] = {}
    for it in trace:
        by_machine.setdefault(it["machine"], []).append(it)
    for r in range(len(w)):
        m = int(raw["token_machine"][r])
        during = [it for it in by_machine[m]
                  if raw["first_token_s"][r] <= it["start"] < raw["finish_s"][r]]
        assert len(during) == w.output_tokens[r] - 1
        assert all(r in it["decodes"] for it in during)


def test_chunked_beats_stalling_baseline_on_tbt_and_costs_some_ttft():
    """Sarathi-Serve's ablation (Table 4): hybrid batching alone stalls decodes behind long
    prompts (high TBT tail); with chunking the TBT tail falls sharply and TTFT rises modestly."""
    w = synthesize("coding", 4.0, 60.0, seed=0)
    baseline = simulate(Cluster(CATALOG.design("baseline-h100"), 4), w, MODEL, PERF, REFERENCE)
    chunked = simulate(Cluster(CATALOG.design("sarathi-h100"), 4), w, MODEL, PERF, REFERENCE)
    tbt_base, tbt_chunk = (np.nanpercentile(r.tbt_s, 99) for r in (baseline, chunked))
    ttft_base, ttft_chunk = (np.percentile(r.ttft_s, 50) for r in (baseline, chunked))
    assert tbt_chunk < 0.75 * tbt_base
    assert ttft_base < ttft_chunk < 1.6 * ttft_base


def test_budget_beyond_every_queue_reproduces_the_baseline():
    """With a budget no queue ever exceeds, nothing is chunked: the run is today's baseline with
    the same prompt-token limit, request by request, in both engines."""
    w = synthesize("conversation", 5.0, 30.0, seed=2)
    budget = int(w.prompt_tokens.sum())
    opts = SimOptions(prompt_token_limit=budget)
    for engine in ("fast", "reference"):
        base = simulate(Cluster(CATALOG.design("baseline-a100"), 3), w, MODEL, PERF, REFERENCE,
                        opts, engine=engine)
        chunked = simulate(Cluster(dataclasses.replace(CATALOG.design("sarathi-a100"),
                                                       chunk_tokens=budget), 3),
                           w, MODEL, PERF, REFERENCE, opts, engine=engine)
        np.testing.assert_array_equal(chunked.first_token_s, base.first_token_s)
        np.testing.assert_array_equal(chunked.finish_s, base.finish_s)
        assert chunked.machine_stats["prompt_chunks"].sum() == len(w)


def test_budget_at_the_longest_prompt_keeps_every_lone_prompt_whole():
    """Spaced-out requests (one at a time): a budget of the longest prompt runs each prompt in
    one piece, exactly as the stalling baseline does."""
    rng = np.random.default_rng(0)
    prompts = rng.integers(100, 4000, 20).astype(np.int64)
    w = Workload("spaced", np.arange(20) * 30.0, prompts, np.full(20, 8, dtype=np.int64))
    base = simulate(Cluster(CATALOG.design("baseline-h100"), 1), w, MODEL, PERF, REFERENCE)
    chunked = simulate(Cluster(dataclasses.replace(CATALOG.design("sarathi-h100"),
                                                   chunk_tokens=int(prompts.max())), 1),
                       w, MODEL, PERF, REFERENCE)
    np.testing.assert_array_equal(chunked.finish_s, base.finish_s)
    np.testing.assert_array_equal(chunked.first_token_s, base.first_token_s)


# ------------------------------------------------------------------------- overhead model
def _one_prompt_overhead(design: str, prompt: int, budget: int) -> tuple[float, float]:
    """(measured chunking overhead, TTFT) of one prompt alone at batch size 1."""
    w = Workload("one", np.array([0.0]), np.array([prompt], dtype=np.int64),
                 np.array([1], dtype=np.int64))
    cluster = Cluster(dataclasses.replace(CATALOG.design(design), chunk_tokens=budget), 1)
    result = simulate(cluster, w, MODEL, PERF, REFERENCE)
    s = result.machine_stats
    return float(s["chunked_prefill_s"].sum() / s["whole_prefill_s"].sum() - 1), \
        float(result.ttft_s[0])


@pytest.mark.parametrize("design", ["sarathi-a100", "sarathi-h100"])
@pytest.mark.parametrize("prompt", [4096, 8192])
def test_chunking_overhead_grows_as_chunks_shrink_and_is_small_at_2048(design, prompt):
    overheads = [_one_prompt_overhead(design, prompt, b)[0] for b in (2048, 1024, 512, 256)]
    assert overheads[0] < 0.02
    assert all(a < b for a, b in zip(overheads, overheads[1:]))
    assert all(o >= -1e-12 for o in overheads)  # chunking never beats the whole prompt
    # at batch size 1 the TTFT is the chunked prefill itself
    whole = float(PERF.curves(MODEL, CATALOG.design(design).prompt).prompt_time(prompt))
    overhead, ttft = _one_prompt_overhead(design, prompt, 512)
    assert ttft == pytest.approx(whole * (1 + overhead), rel=1e-9)


def test_chunk_extra_is_zero_for_a_first_chunk_and_telescopes_to_at_least_the_whole_prompt():
    curves = PERF.curves(MODEL, CATALOG.machine("dgx-h100"))
    assert curves.chunk_extra(512, 0) == 0.0
    assert curves.chunk_attention_s > 0 and curves.chunk_kv_read_s > 0
    for prompt in (3000, 9000):
        total, done = 0.0, 0
        while done < prompt:
            piece = min(700, prompt - done)
            total += float(curves.prompt_time(piece)) + curves.chunk_extra(piece, done)
            done += piece
        assert total >= float(curves.prompt_time(prompt)) * (1 - 1e-12)


def test_table_perf_model_takes_chunk_terms_from_the_default_model():
    from simcore.perfmodel import load_performance_model
    from pathlib import Path
    table = Path(__file__).resolve().parents[1] / "examples" / "perf-tables" / "dgx-h100-bloom.yaml"
    perf = load_performance_model(table, CATALOG)
    h100 = CATALOG.machine("dgx-h100")
    assert perf.chunk_terms(MODEL, h100) == PERF.chunk_terms(MODEL, h100)
    curves = perf.curves(MODEL, h100)
    assert curves.chunk_attention_s == PERF.curves(MODEL, h100).chunk_attention_s


# ----------------------------------------------------------------- designs and options
def test_sarathi_designs_in_the_catalog_and_their_echo():
    for name, sku in (("sarathi-a100", "dgx-a100"), ("sarathi-h100", "dgx-h100")):
        d = CATALOG.design(name)
        assert d.is_baseline and d.is_chunked and d.prompt.name == sku and d.chunk_tokens == 512
        assert d.as_dict()["prefill"] == "chunked" and d.as_dict()["chunk_tokens"] == 512
    assert set(CATALOG.design("baseline-a100").as_dict()) == {"name", "prompt_sku", "token_sku",
                                                              "mixed_pool"}
    assert build_machine_arrays(Cluster(CATALOG.design("sarathi-a100"), 2), MODEL, PERF,
                                SimOptions()).chunk_tokens == 512
    assert build_machine_arrays(Cluster(CATALOG.design("baseline-a100"), 2), MODEL, PERF,
                                SimOptions()).chunk_tokens == 0


def test_design_entries_validate_the_policy(tmp_path):
    from hardware_catalog import parse_design
    ok = parse_design("mine", {"prompt_sku": "dgx-h100", "token_sku": "dgx-a100",
                               "prefill": "chunked", "chunk_tokens": 1024}, "f",
                      CATALOG.machines)
    assert ok.is_chunked and ok.chunk_tokens == 1024 and not ok.is_baseline
    for entry, field in (({"prompt_sku": "dgx-h100", "chunk_tokens": 512}, "chunk_tokens"),
                         ({"prompt_sku": "dgx-h100", "prefill": "sliced"}, "prefill"),
                         ({"prompt_sku": "dgx-h100", "prefill": "chunked",
                           "chunk_tokens": 8}, "chunk_tokens")):
        with pytest.raises(InputError, match=field):
            parse_design("bad", entry, "f", CATALOG.machines)
    with pytest.raises(InputError):
        Design("x", CATALOG.machine("dgx-h100"), prefill="whole", chunk_tokens=512)


def test_chunk_tokens_check_accepts_numbers_and_auto():
    check = OrAuto(count(16, 1_048_576))
    assert check("auto") == "auto" and check(512) == 512 and check("2048") == 2048
    for bad in (8, "8", "many", 1.5, 2_000_000):
        with pytest.raises(Invalid):
            check(bad)


def test_simulate_api_reports_chunks_and_overhead():
    import provisioner
    run = provisioner.simulate(design="sarathi-h100", machines=3, chunk_tokens=256,
                               model="llama2-70b", rate=6, duration=20)
    assert run.cluster.design.chunk_tokens == 256
    summary = run.to_dict()
    prefill = summary["prefill"]
    assert prefill["chunk_tokens"] == 256 and prefill["chunks_per_prompt"] > 1
    assert prefill["chunking_overhead"] > 0
    with pytest.raises(InputError, match="chunk"):
        provisioner.simulate(design="baseline-h100", machines=3, chunk_tokens=256, rate=6,
                             duration=10)
    with pytest.raises(InputError, match="search"):
        provisioner.simulate(design="sarathi-h100", machines=3, chunk_tokens="auto", rate=6,
                             duration=10)
    with pytest.raises(InputError, match="chunk_tokens"):
        provisioner.simulate(design="sarathi-h100", machines=3, chunk_tokens=4, rate=6,
                             duration=10)


def test_simulate_cli_prints_chunk_figures(run_cli):
    run = run_cli("simulate", "--design", "sarathi-h100", "--machines", "3", "--chunk-tokens",
                  "512", "--model", "llama2-70b", "--rate", "6", "--duration", "20", timeout=300)
    assert run.returncode in (0, 1), run.stderr
    assert "chunks per prompt" in run.stdout and "chunking overhead" in run.stdout
    bad = run_cli("simulate", "--design", "sarathi-h100", "--machines", "3", "--chunk-tokens",
                  "lots", timeout=300)
    assert bad.returncode == 2 and "--chunk-tokens" in bad.stderr


# --------------------------------------------------------------------------------- search
@pytest.fixture(scope="module")
def auto_search():
    import provisioner
    return provisioner.search(designs="splitwise-hh,sarathi-h100", model="llama2-70b",
                              workload="conversation", rate=4, duration=20, goal="min-cost",
                              chunk_tokens="auto", search_limit=32, jobs=1)


def test_auto_budget_search_reports_the_chosen_budget(auto_search):
    doc = auto_search.to_dict()
    assert doc["inputs"]["options"]["chunk_tokens"] == "auto"
    names = [d["design"] for d in doc["designs"]]
    assert names == ["splitwise-hh", "sarathi-h100"]
    sarathi = doc["designs"][1]
    assert sarathi["prefill"] == "chunked"
    tried = [line["chunk_tokens"] for line in sarathi["chunk_search"]]
    assert tried == [256, 512, 1024, 2048]
    feasible = [line for line in sarathi["chunk_search"] if line["feasible"]]
    if feasible:
        best = min(feasible, key=lambda line: (line["cost_per_hour"], line["power_kw"]))
        assert sarathi["chunk_tokens"] == best["chunk_tokens"]
        assert sarathi["optimum"]["cost_per_hour"] == pytest.approx(best["cost_per_hour"])
    assert "prefill" not in doc["designs"][0]  # whole-prompt designs keep their keys


def test_comparison_names_the_winner_in_json_terminal_and_html(auto_search):
    from provisioner.figures import html_report
    from provisioner.terminal import comparison_lines
    doc = auto_search.to_dict()
    view = doc["summary"]["disaggregated_vs_chunked"]
    assert view["disaggregated"]["design"] == "splitwise-hh"
    assert view["chunked"]["design"] == "sarathi-h100"
    assert view["winner"] in ("disaggregated", "chunked", "tie")
    assert "wins" in view["sentence"] or "Tie" in view["sentence"]
    for side in ("disaggregated", "chunked"):
        assert {"cost_per_hour", "power_kw", "gpus"} <= set(view[side])
    lines = comparison_lines(doc)
    assert lines and view["sentence"] in lines[-1]
    assert "Disaggregated vs chunked colocated" in html_report(doc, auto_search.designs)
    json.dumps(doc, allow_nan=False)


def test_no_comparison_without_both_kinds():
    import provisioner
    result = provisioner.search(designs="baseline-h100", model="llama2-70b", rate=2,
                                duration=10, search_limit=8, jobs=1)
    assert "disaggregated_vs_chunked" not in result.to_dict()["summary"]


def test_fixed_budget_replaces_the_chunked_designs_budget_only():
    from provisioner.chunked import budget_variants, with_chunk_tokens
    designs = (CATALOG.design("splitwise-hh"), CATALOG.design("sarathi-a100"))
    fixed = with_chunk_tokens(designs, 1024)
    assert fixed[0] == designs[0] and fixed[1].chunk_tokens == 1024
    searched, origin = budget_variants(designs, "auto")
    assert [d.name for d in searched] == ["splitwise-hh", "sarathi-a100@256", "sarathi-a100@512",
                                          "sarathi-a100@1024", "sarathi-a100@2048"]
    assert set(origin.values()) == {"splitwise-hh", "sarathi-a100"}
    assert all(d.chunk_tokens == int(d.name.split("@")[1]) for d in searched[1:])


def test_equal_costs_are_a_tie_not_a_win():
    """1 + 5 DGX-A100 and 6 DGX-A100 cost the same, though the float sums differ in the last
    bit (105.6 against 105.60000000000001): the verdict is a tie, never "0% cheaper"."""
    from provisioner.chunked import comparison
    from provisioner.study import DesignResult, Goal, Metrics, Outcome, Point
    catalog = load_catalog()
    goal = Goal("min-cost", 70.0)
    passed = Outcome(True, True, "", (), 0.1, 100)

    def result(name, p, t):
        design = catalog.design(name)
        return DesignResult(design, goal, Metrics.of(Point(design, p, t, 70.0), passed), "", [])

    split, chunked = result("splitwise-aa", 1, 5), result("sarathi-a100", 6, 0)
    assert split.optimum.cost_per_hour != chunked.optimum.cost_per_hour   # the premise
    view = comparison([split, chunked], "min-cost", 70.0)
    assert view["winner"] == "tie" and view["sentence"].startswith("Tie:")
    cheaper = comparison([result("splitwise-aa", 1, 5), result("sarathi-a100", 7, 0)],
                         "min-cost", 70.0)
    assert cheaper["winner"] == "disaggregated" and "0% cheaper" not in cheaper["sentence"]
