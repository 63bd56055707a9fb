"""The fast core agrees with the reference simulator and both keep the simulation invariants."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hardware_catalog import InputError
from simcore import Cluster, LatencyCurves, SimOptions, Workload, simulate
from simcore.cluster import ROLE_PROMPT, build_machine_arrays, kv_transfer_seconds
from simcore.perfmodel import default_performance_model
from simcore.splitwise_sim import SplitwiseSimPerformance
from strategies import (CATALOG, MODEL, REFERENCE, SETTINGS, TIGHT_RESERVE, SyntheticPerf,
                        assert_engines_agree, both_engines, clusters, layout_clusters, options,
                        perf_models, workloads)


@SETTINGS
@given(cluster=clusters(), workload=workloads(), perf=perf_models, opts=options)
def test_fast_core_agrees_with_reference(cluster, workload, perf, opts):
    assert_engines_agree(*both_engines(cluster, workload, perf, opts),
                         series=("first_token_s", "finish_s", "kv_transfer_s", "ttft_s",
                                 "e2e_s"))


@SETTINGS
@given(cluster_model=layout_clusters(), workload=workloads(), perf=perf_models, opts=options)
def test_engines_agree_with_instances_and_pipelines(cluster_model, workload, perf, opts):
    """Several instances per machine and pipelines across machines (issue 25)."""
    cluster, model = cluster_model
    assert_engines_agree(*both_engines(cluster, workload, perf, opts, model=model),
                         series=("first_token_s", "finish_s", "kv_transfer_s", "ttft_s",
                                 "e2e_s"))


@st.composite
def large_fleets(draw):
    """Hundreds of machines (routing trees 7-10 levels deep), Splitwise or baseline."""
    design = CATALOG.design(draw(st.sampled_from(["splitwise-hh", "splitwise-ha", "splitwise-aa",
                                                  "baseline-h100", "sarathi-a100"])))
    if design.is_baseline:
        return Cluster(design, draw(st.integers(100, 700)))
    return Cluster(design, draw(st.integers(60, 500)), draw(st.integers(30, 300)))


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cluster=large_fleets(), workload=workloads(max_requests=60), perf=perf_models,
       opts=options)
def test_engines_agree_on_large_fleets_with_a_few_requests(cluster, workload, perf, opts):
    """Ties among hundreds of idle machines go to the lowest index in both engines."""
    assert_engines_agree(*both_engines(cluster, workload, perf, opts))


SPLITWISE_SIM_PERF = SplitwiseSimPerformance(default_performance_model())
splitwise_sim_options = st.builds(
    SimOptions, prompt_token_limit=st.sampled_from([1, 512, 2048]),
    mixed_pool_queue_threshold=st.sampled_from([0, 2048, 8192]),
    memory_reserve_fraction=TIGHT_RESERVE, layerwise_min_prompt_tokens=st.just(1 << 62),
    tbt_per_output_token=st.just(True))


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cluster=clusters(), workload=workloads(), opts=splitwise_sim_options,
       model=st.sampled_from([MODEL, CATALOG.model("llama2-70b")]))
def test_engines_agree_under_the_splitwise_sim_preset(cluster, workload, opts, model):
    """SplitwiseSim's flat decode curve (token curve over prompt x batch tokens looked up at the
    number of decodes), its 1.1 x prompt-curve mixed iterations and its SLO references (the
    `splitwise-sim` preset's latency model), on every design (chunked ones included)."""
    fast, ref = both_engines(cluster, workload, SPLITWISE_SIM_PERF, opts, model)
    assert_engines_agree(fast, ref, series=("first_token_s", "finish_s", "kv_transfer_s",
                                            "ttft_slowdown", "tbt_slowdown", "e2e_slowdown"))


@SETTINGS
@given(cluster=clusters(), workload=workloads(), perf=perf_models, opts=options)
def test_invariants(cluster, workload, perf, opts):
    result = simulate(cluster, workload, MODEL, perf, REFERENCE, opts)
    if not result.feasible:
        need = workload.prompt_tokens + workload.output_tokens
        machines = build_machine_arrays(cluster, MODEL, perf, opts)
        decoders = machines.kv_capacity[machines.role != ROLE_PROMPT]
        assert need.max() > decoders.max(), "infeasible only when a request can never fit"
        return
    w, stats = workload, result.machine_stats
    # every request gets exactly one first token and finishes once, in order
    assert np.all(np.isfinite(result.first_token_s)) and np.all(np.isfinite(result.finish_s))
    assert np.all(result.first_token_s >= w.arrival_s)
    assert np.all(result.finish_s >= result.first_token_s)
    assert np.array_equal(result.finish_s == result.first_token_s, w.output_tokens == 1)
    # output tokens are conserved: each request is in output-1 decodes and in one prompt batch
    # (chunked designs: in one batch per piece of its prompt)
    extra_pieces = stats["prompt_chunks"].sum() - len(w) if "prompt_chunks" in stats else 0
    assert stats["iterations"] @ stats["mean_batch"] == pytest.approx(w.output_tokens.sum()
                                                                      + extra_pieces)
    # every output token after a request's first ends one inter-token gap (ITL)
    assert result.itl_histogram.sum() == (w.output_tokens - 1).sum()
    # KV memory in use never exceeds capacity
    assert np.all(stats["max_memory_tokens"] <= stats["kv_capacity_tokens"])
    # no request is faster than it would be alone on the machines it ran on
    machines = build_machine_arrays(cluster, MODEL, perf, opts)
    for i in range(len(w)):
        pm, tm = result.prompt_machine[i], result.token_machine[i]
        prompt_curves = machines.curves[machines.kind[pm]]
        token_curves = machines.curves[machines.kind[tm]]
        alone_ttft = float(prompt_curves.prompt_time(w.prompt_tokens[i]))
        gaps = int(w.output_tokens[i]) - 1
        contexts = w.prompt_tokens[i] + np.arange(1, gaps + 1)
        alone_decode = float(np.sum(token_curves.token_time(1, contexts))) if gaps else 0.0
        transfer = kv_transfer_seconds(int(w.prompt_tokens[i]), pm, tm, machines) \
            if pm != tm and gaps else 0.0
        assert result.ttft_s[i] >= alone_ttft * (1 - 1e-12)
        assert result.e2e_s[i] >= (alone_ttft + transfer + alone_decode) * (1 - 1e-9)


@settings(max_examples=200, deadline=None)
@given(slots=st.lists(st.integers(0, 12), min_size=1, max_size=40),
       prompt_machines=st.integers(1, 4), service=st.sampled_from([0.0625, 0.125, 0.25, 1.0]))
def test_more_prompt_machines_never_delay_first_tokens(slots, prompt_machines, service):
    """Theory case: a FCFS pool where the router's choice is the earliest-free machine.

    With equal prompts, one prompt per batch, a constant service time and arrivals on multiples
    of it, every iteration ends exactly when requests arrive, so the fewest pending tokens is the
    shortest queue is the machine free first: the c-server FCFS queue, in which an added server
    never delays any job. (Outside this case routing by pending tokens counts a running prompt in
    full, and an added machine can delay a request: the router is not work-conserving.)
    Service times are powers of two so that sums of iterations hit the arrival instants exactly.
    """
    arrival = np.sort(np.array(slots, dtype=float)) * service
    n = len(arrival)
    w = Workload("slotted", arrival, np.full(n, 100, dtype=np.int64), np.full(n, 3, dtype=np.int64))

    class ConstantPrompt(SyntheticPerf):
        def curves(self, model, machine, tp=None):
            return LatencyCurves(np.array([1.0, 2.0]), np.array([service, service]),
                                 np.array([1.0, 2.0]), np.array([0.02, 0.021]), 0.0)

    perf = ConstantPrompt(None, None, None)
    opts = SimOptions(prompt_token_limit=1, mixed_pool=False)
    design = CATALOG.design("splitwise-hh")
    fewer = simulate(Cluster(design, prompt_machines, 2), w, MODEL, perf, REFERENCE, opts)
    more = simulate(Cluster(design, prompt_machines + 1, 2), w, MODEL, perf, REFERENCE, opts)
    assert np.all(more.first_token_s <= fewer.first_token_s * (1 + 1e-12))


def test_unservable_request_makes_run_infeasible():
    perf = SyntheticPerf([0.05, 0.1, 0.3, 1.0], [0.02, 0.03, 0.05], 0.0)
    opts = SimOptions(memory_reserve_fraction=0.38)
    w = Workload("big", np.array([0.0, 1.0]), np.array([100, 20000]), np.array([10, 10]))
    result = simulate(Cluster(CATALOG.design("splitwise-aa"), 1, 1), w, MODEL, perf, REFERENCE, opts)
    assert not result.feasible
    assert "request 1" in result.reason and "never fit" in result.reason


def test_tbt_divides_by_gaps_and_kv_transfer_delays_second_token_only():
    perf = SyntheticPerf([0.1, 0.2, 0.5, 2.0], [0.02, 0.03, 0.05], 0.0)
    w = Workload("one", np.array([0.0]), np.array([100], dtype=np.int64),
                 np.array([5], dtype=np.int64))
    cluster = Cluster(CATALOG.design("splitwise-aa"), 1, 1)
    result = simulate(cluster, w, MODEL, perf, REFERENCE)
    curves = perf.curves(MODEL, CATALOG.machine("dgx-a100"))
    machines = build_machine_arrays(cluster, MODEL, perf, SimOptions())
    transfer = kv_transfer_seconds(100, 0, 1, machines)
    assert result.ttft_s[0] == pytest.approx(float(curves.prompt_time(100)))
    decode = float(curves.token_time(1, 0))
    assert result.e2e_s[0] == pytest.approx(result.ttft_s[0] + transfer + 4 * decode)
    assert result.tbt_s[0] == pytest.approx((transfer + 4 * decode) / 4)
    # alone on a DGX-A100 with the same curves (no transfer): slowdowns reflect only the transfer
    assert result.ttft_slowdown[0] == pytest.approx(1.0)
    assert result.tbt_slowdown[0] == pytest.approx((transfer + 4 * decode) / (4 * decode))


def test_kv_transfer_serialized_below_threshold_and_layerwise_above():
    perf = SyntheticPerf([0.1, 0.2, 0.5, 2.0], [0.02, 0.03, 0.05], 0.0)
    machines = build_machine_arrays(Cluster(CATALOG.design("splitwise-ha"), 1, 1), MODEL, perf,
                                    SimOptions())
    a100_link = CATALOG.machine("dgx-a100").kv_link_bytes_per_s
    small = kv_transfer_seconds(511, 0, 1, machines)
    assert small == pytest.approx(511 * MODEL.kv_bytes_per_token / a100_link)
    large = kv_transfer_seconds(4096, 0, 1, machines)
    assert large == pytest.approx(0.008 + 4096 * MODEL.kv_bytes_per_token / (70 * a100_link))


def test_cluster_rejects_bad_counts():
    with pytest.raises(InputError):
        Cluster(CATALOG.design("splitwise-hh"), 0, 3)
    with pytest.raises(InputError):
        Cluster(CATALOG.design("splitwise-hh"), 3, 0)
    with pytest.raises(InputError):
        Cluster(CATALOG.design("baseline-a100"), 3, 2)


def test_uncompiled_fast_core_gives_the_same_answer():
    """PROVISION_NO_JIT=1 runs the fast core as plain Python (for debugging, or without numba).
    BLOOM-176B: a prompt's KV bytes exceed 2**31, which the int32 record fields must not wrap."""
    import json
    import os
    import subprocess
    import sys
    script = (
        "import json, numpy as np\n"
        "from hardware_catalog import load_catalog\n"
        "from simcore import Cluster, simulate\n"
        "from simcore.fastsim import CORE\n"
        "from simcore.perfmodel import default_performance_model\n"
        "from simcore.workload import synthesize\n"
        "c = load_catalog()\n"
        "w = synthesize('conversation', 20.0, 10.0, seed=3)\n"
        "r = simulate(Cluster(c.design('splitwise-ha'), 2, 2), w, c.model('bloom-176b'),\n"
        "             default_performance_model(), c.machine('dgx-a100'))\n"
        "print(json.dumps({'core': CORE, 'finish': r.finish_s.tolist(),\n"
        "                  'kv': r.kv_transfer_s.tolist()}))\n")
    results = {}
    for flag in ("", "1"):
        env = {**os.environ, "PROVISION_NO_JIT": flag}
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             env=env, timeout=300)
        assert run.returncode == 0, run.stderr
        results[flag] = json.loads(run.stdout)
    assert results[""]["core"] in ("aot", "jit") and results["1"]["core"] == "python"
    np.testing.assert_allclose(results["1"]["finish"], results[""]["finish"], rtol=1e-12)
    np.testing.assert_allclose(results["1"]["kv"], results[""]["kv"], rtol=1e-12)



def test_percentiles_are_numpys_bit_for_bit():
    """The SLO percentiles come from `percentiles`, which must equal np.percentile exactly:
    samples of 1 to 20,000 values, with and without ties, at the SLO percentiles, at random
    ones and at the ends."""
    from simcore.metrics import percentiles
    rng = np.random.default_rng(7)
    for trial in range(6000):
        n = int(rng.integers(1, (6, 60, 20_000)[trial % 3]))
        values = rng.gamma(2.0, 1.0, n)
        if trial % 4 == 0:
            values = np.round(values, 1)   # ties
        pcts = ([50.0, 90.0, 99.0], list(rng.uniform(0, 100, 3)), [0.0, 99.99, 100.0])[trial % 3]
        expected = np.percentile(values, pcts)
        assert np.array_equal(percentiles(values, pcts).view(np.int64),
                              expected.view(np.int64)), (n, pcts)


def test_itl_counts_every_gap_and_reads_back_within_its_accuracy():
    """One request alone on a baseline machine: its gaps are its decode iterations' times
    (context growing by one token each); ITL percentiles are those gaps' nearest-rank
    percentiles within the histogram's 0.5%, and the first gap is the first decode."""
    from simcore.cluster import ITL_ACCURACY
    cluster = Cluster(CATALOG.design("baseline-a100"), 1)
    perf = SyntheticPerf([0.05, 0.2, 0.5, 1.5], [0.01, 0.012, 0.02], 2e-6)
    w = Workload("one", np.array([0.0]), np.array([1000]), np.array([201]))
    for engine in ("fast", "reference"):
        result = simulate(cluster, w, MODEL, perf, REFERENCE, SimOptions(), engine=engine)
        curves = build_machine_arrays(cluster, MODEL, perf, SimOptions()).curves[0]
        gaps = np.sort(curves.token_time(1, 1001 + np.arange(200)))  # prompt + generated
        assert result.itl_histogram.sum() == 200
        for pct, value in zip((50, 90, 99), result.itl_s([50, 90, 99])):
            exact = gaps[int(np.ceil(pct / 100 * 200)) - 1]
            assert abs(value / exact - 1) <= ITL_ACCURACY + 1e-12
        assert result.tbt_s[0] == pytest.approx(gaps.mean(), rel=1e-9)


def test_chunked_prefill_removes_the_decode_stalls_itl_shows():
    """Long prompts batched whole beside running decodes stall them for a prompt's time: the
    ITL tail shows it, a request's mean gap (TPOT) hides most of it. Stall-free chunked prefill
    (Sarathi) bounds every iteration, so its ITL P99 is far lower on the same machines."""
    rng = np.random.default_rng(3)
    n = 300
    w = Workload("mixed", np.sort(rng.uniform(0, 30, n)), rng.integers(1500, 4000, n),
                 rng.integers(50, 200, n))
    p99 = {}
    for name in ("baseline-h100", "sarathi-h100"):
        result = simulate(Cluster(CATALOG.design(name), 2), w, MODEL,
                          default_performance_model(), REFERENCE, SimOptions())
        assert result.feasible
        p99[name] = float(result.itl_s([99])[0])
    assert p99["sarathi-h100"] < 0.5 * p99["baseline-h100"], p99
