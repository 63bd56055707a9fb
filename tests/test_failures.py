"""Machine failures (issue 12, DejaVu): both engines agree, hand-computed recoveries, invariants."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given

from hardware_catalog import InputError
from simcore import Cluster, SimOptions, Workload, simulate
from simcore.cluster import build_machine_arrays, itl_bin, kv_transfer_seconds
from simcore.failures import failure_array, read_failure_csv
from simcore.perfmodel import default_performance_model
from simcore.refsim import _ReferenceSimulation
from simcore.workload import synthesize
from strategies import (CATALOG, MODEL, REFERENCE, SETTINGS, assert_engines_agree,
                        assert_same_gaps, both_engines, clusters, failure_options, fit,
                        layout_clusters, perf_models, schedules, workloads)

PERF = default_performance_model()
LLAMA = CATALOG.model("llama2-70b")


@SETTINGS
@given(cluster=clusters(), workload=workloads(), perf=perf_models, opts=failure_options,
       schedule=schedules())
def test_fast_core_agrees_with_reference_under_failures(cluster, workload, perf, opts, schedule):
    opts = dataclasses.replace(opts, failures=fit(schedule, cluster))
    fast, ref = both_engines(cluster, workload, perf, opts)
    assert_engines_agree(fast, ref, close=("busy_s", "mixed_pool_s"), atol=1e-9)
    if fast.feasible and opts.failures:
        for key in ("recoveries", "recomputed_tokens"):
            np.testing.assert_array_equal(fast.failure_stats[key], ref.failure_stats[key])
        np.testing.assert_allclose(fast.failure_stats["recovery_s"],
                                   ref.failure_stats["recovery_s"], rtol=1e-9, atol=1e-12)


@SETTINGS
@given(cluster_model=layout_clusters(), workload=workloads(), perf=perf_models,
       opts=failure_options, schedule=schedules())
def test_engines_agree_under_failures_of_multi_instance_machines(cluster_model, workload, perf,
                                                                 opts, schedule):
    """A machine failure takes down every instance on it, and a pipeline spanning it."""
    cluster, model = cluster_model
    opts = dataclasses.replace(opts, failures=fit(schedule, cluster))
    fast, ref = both_engines(cluster, workload, perf, opts, model=model)
    assert_engines_agree(fast, ref, close=("busy_s", "mixed_pool_s"), atol=1e-9)
    if fast.feasible and opts.failures:
        for key in ("recoveries", "recomputed_tokens"):
            np.testing.assert_array_equal(fast.failure_stats[key], ref.failure_stats[key])


@SETTINGS
@given(cluster=clusters(), workload=workloads(), perf=perf_models, opts=failure_options,
       schedule=schedules())
def test_invariants_under_failures(cluster, workload, perf, opts, schedule):
    """Every request finishes exactly once with all its tokens, each sent once: the ITL
    histogram holds sum(output - 1) gaps whether restarts recompute or regenerate (a token
    regenerated is not sent again); a down machine starts nothing; memory never exceeds
    capacity."""
    opts = dataclasses.replace(opts, failures=fit(schedule, cluster))
    if not opts.failures:
        return
    result = simulate(cluster, workload, MODEL, perf, REFERENCE, opts, engine="reference")
    if not result.feasible:
        assert ("never fit" in result.reason or "down for the rest of the run" in result.reason)
        return
    machines = build_machine_arrays(cluster, MODEL, perf, opts)
    machines = dataclasses.replace(machines, failures=failure_array(
        cluster, opts, float(workload.arrival_s.max())))
    sim = _ReferenceSimulation(workload, machines)
    sim.run()
    assert sim.finished == len(workload)
    assert all(r.generated == r.output for r in sim.requests)  # tokens conserved
    assert all(r.emitted == r.output for r in sim.requests)    # each sent, once
    assert result.itl_histogram.sum() == int((workload.output_tokens - 1).sum())
    assert sim.itl.sum() == result.itl_histogram.sum()
    assert np.all(np.isfinite(result.finish_s)) and np.all(result.finish_s >= result.first_token_s)
    assert np.all(result.first_token_s >= workload.arrival_s)
    for t, m, d in machines.failures:
        for machine, start, _ in sim.iteration_log:
            assert not (machine == m and t <= start < t + d), "a down machine served"
    assert np.all(result.machine_stats["max_memory_tokens"]
                  <= result.machine_stats["kv_capacity_tokens"])


# ------------------------------------------------------------------ hand-computed (the issue's)

def _alone(design, prompt, token, engine, **failure):
    """One 500/500 request alone; its decoding machine fails 1 ms after its 250th token."""
    cluster = Cluster(CATALOG.design(design), prompt, token)
    w = Workload("one", np.array([0.0]), np.array([500]), np.array([500]))
    base = simulate(cluster, w, LLAMA, PERF, REFERENCE, SimOptions(), engine=engine)
    m = build_machine_arrays(cluster, LLAMA, PERF, SimOptions())
    curves = m.curves[0]
    t250 = float(curves.prompt_time(500))
    if token:
        t250 += kv_transfer_seconds(500, 0, prompt, m)
    t250 += sum(float(curves.token_time(1, 500 + k)) for k in range(1, 250))
    fail_at = t250 + 0.001
    opts = SimOptions(failures=((fail_at, "token" if token else "any", 0, 60.0),),
                      detection_s=5.0, **failure)
    run = simulate(cluster, w, LLAMA, PERF, REFERENCE, opts, engine=engine)
    return base, run, m, curves, fail_at - t250


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("design,prompt,token", [("baseline-a100", 2, 0), ("splitwise-aa", 1, 2)])
def test_restart_costs_detection_plus_a_prefill_over_prompt_and_generated(engine, design, prompt,
                                                                         token):
    base, run, m, curves, late = _alone(design, prompt, token, engine, recovery="restart")
    # it resumes on the other machine: detection, then a prefill over 500 + 250 tokens (plus,
    # disaggregated, the KV transfer of those 750 tokens); the 1 ms of the lost iteration
    transfer = kv_transfer_seconds(750, 0, prompt + 1, m) if token else 0.0
    expected = late + 5.0 + float(curves.prompt_time(750)) + transfer
    assert run.e2e_s[0] - base.e2e_s[0] == pytest.approx(expected, rel=1e-9)
    assert run.ttft_s[0] == base.ttft_s[0]  # tokens sent are not sent again
    assert run.failure_stats["recoveries"][0] == 1
    assert run.failure_stats["recomputed_tokens"][0] == 750


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("design,prompt,token", [("baseline-a100", 2, 0), ("splitwise-aa", 1, 2)])
def test_replicate_costs_detection_plus_the_kv_restore_only(engine, design, prompt, token):
    base, run, m, curves, late = _alone(design, prompt, token, engine, recovery="replicate")
    new = prompt + 1 if token else 1
    restore = 750 * LLAMA.kv_bytes_per_token / m.link_bytes_per_s[new]
    assert run.e2e_s[0] - base.e2e_s[0] == pytest.approx(late + 5.0 + restore, rel=1e-9)
    assert run.failure_stats["recomputed_tokens"][0] == 0
    # DejaVu's 500/500 example: the restart costs a large share of the E2E, replication little
    _, restart, *_ = _alone(design, prompt, token, engine, recovery="restart")
    assert run.e2e_s[0] < restart.e2e_s[0]


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("design,prompt,token", [("baseline-a100", 2, 0), ("splitwise-aa", 1, 2)])
def test_regenerate_decodes_the_tokens_sent_again_one_iteration_each_silently(engine, design,
                                                                              prompt, token):
    """The same failure (250 of 500 tokens sent): recompute prefills 500 + 250 tokens at once;
    regenerate (DejaVu's baseline) prefills the prompt only, then decodes the 249 other tokens
    already sent again, one iteration each: it finishes later, its TTFT is unchanged, and no
    token is sent twice (499 gaps; the 251st token's gap spans the loss and the
    regeneration)."""
    base, recompute, m, curves, late = _alone(design, prompt, token, engine, restart="recompute")
    _, regenerate, *_ = _alone(design, prompt, token, engine, restart="regenerate")
    transfer = kv_transfer_seconds(500, 0, prompt + 1, m) if token else 0.0
    redo = (float(curves.prompt_time(500)) + transfer
            + sum(float(curves.token_time(1, 500 + k)) for k in range(1, 250)))
    assert regenerate.e2e_s[0] - base.e2e_s[0] == pytest.approx(late + 5.0 + redo, rel=1e-9)
    assert regenerate.e2e_s[0] > recompute.e2e_s[0] + 1.0   # 249 decodes against one prefill
    assert regenerate.ttft_s[0] == recompute.ttft_s[0] == base.ttft_s[0]
    for run in (base, recompute, regenerate):
        assert run.itl_histogram.sum() == 499
    # the longest gap: from the 250th token (before the loss) to the 251st
    longest = int(np.flatnonzero(regenerate.itl_histogram)[-1])
    assert abs(longest - itl_bin(late + 5.0 + redo + float(curves.token_time(1, 750)))) <= 1
    stats = regenerate.failure_stats
    assert stats["recoveries"][0] == 1
    assert stats["recomputed_tokens"][0] == 500 + 249   # the prompt, and 249 decode tokens
    assert recompute.failure_stats["recomputed_tokens"][0] == 750
    # recovered once back where it was lost: the last token sent regenerated
    assert stats["recovery_s"][0] == pytest.approx(5.0 + redo, rel=1e-9)


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_a_request_lost_again_while_regenerating_keeps_what_it_had_sent(engine):
    """Lost at 250 tokens sent, then again while regenerating them (after its prefill): the
    second restart regenerates the same 250 (not fewer), the TTFT stays the first one and
    each token is sent once."""
    cluster = Cluster(CATALOG.design("baseline-a100"), 3)
    w = Workload("one", np.array([0.0]), np.array([500]), np.array([500]))
    base = simulate(cluster, w, LLAMA, PERF, REFERENCE, SimOptions(), engine=engine)
    m = build_machine_arrays(cluster, LLAMA, PERF, SimOptions())
    curves = m.curves[0]
    t250 = float(curves.prompt_time(500)) + sum(float(curves.token_time(1, 500 + k))
                                                for k in range(1, 250))
    first = t250 + 0.001
    # machine 1 takes it at detection; it fails again 100 regenerated tokens later
    again = first + 5.0 + float(curves.prompt_time(500)) + sum(
        float(curves.token_time(1, 500 + k)) for k in range(1, 100)) + 0.001
    opts = SimOptions(failures=((first, "any", 0, 600.0), (again, "any", 1, 600.0)),
                      detection_s=5.0, restart="regenerate")
    run = simulate(cluster, w, LLAMA, PERF, REFERENCE, opts, engine=engine)
    redo = float(curves.prompt_time(500)) + sum(float(curves.token_time(1, 500 + k))
                                                for k in range(1, 250))
    assert run.e2e_s[0] == pytest.approx(again + 5.0 + redo + base.e2e_s[0] - t250, rel=1e-9)
    assert run.ttft_s[0] == base.ttft_s[0]
    assert run.itl_histogram.sum() == 499
    assert run.failure_stats["recoveries"][0] == 2
    assert run.failure_stats["recomputed_tokens"][0] == 2 * (500 + 249)


# ------------------------------------------------------------------ no failure, same answer

def test_no_failure_configured_changes_nothing():
    w = synthesize("conversation", 30.0, 20.0, seed=4)
    cluster = Cluster(CATALOG.design("splitwise-ha"), 2, 2)
    plain = simulate(cluster, w, LLAMA, PERF, REFERENCE, SimOptions())
    assert plain.failure_stats is None
    # a failure after everything finished runs the failure code and changes nothing else
    late = SimOptions(failures=((plain.makespan_s + 1.0, "token", 0, 1.0),))
    for engine in ("fast", "reference"):
        after = simulate(cluster, w, LLAMA, PERF, REFERENCE, late, engine=engine)
        for name in ("first_token_s", "finish_s", "kv_transfer_s", "e2e_s"):
            assert np.array_equal(getattr(after, name), getattr(plain, name))
        assert after.failure_stats["recoveries"].sum() == 0


def test_replicate_not_worse_than_restart_on_a_lightly_loaded_cluster():
    """One machine of each pool failing at several instants on a lightly loaded cluster (3 + 3
    machines at 10 req/s), host replicas: replication's P99 (and every affected request's worst
    E2E) is not worse. On a loaded cluster it can be (restored requests put their decode load
    back sooner): docs/failures.md and bench/replication_bench.py measure how often."""
    w = synthesize("conversation", 10.0, 60.0, seed=1)
    cluster = Cluster(CATALOG.design("splitwise-hh"), 3, 3)
    for pool in ("token", "prompt"):
        for at in (10.0, 20.0, 30.0, 40.0):
            e2e = {}
            for recovery in ("restart", "replicate"):
                opts = SimOptions(failures=((at, pool, 1, 30.0),), recovery=recovery,
                                  replica_target="host")
                result = simulate(cluster, w, LLAMA, PERF, REFERENCE, opts)
                assert result.feasible
                affected = result.failure_stats["recoveries"] > 0
                e2e[recovery] = (np.percentile(result.e2e_s, 99),
                                 result.e2e_s[affected].max(initial=0.0))
            assert e2e["replicate"][0] <= e2e["restart"][0] * (1 + 1e-12), (pool, at, e2e)
            assert e2e["replicate"][1] <= e2e["restart"][1] * (1 + 1e-12), (pool, at, e2e)


def test_every_machine_down_forever_is_infeasible_with_a_reason():
    w = Workload("two", np.array([0.0, 1.0]), np.array([100, 100]), np.array([10, 10]))
    cluster = Cluster(CATALOG.design("baseline-a100"), 1)
    opts = SimOptions(failures=((0.5, "any", 0, float("inf")),))
    for engine in ("fast", "reference"):
        result = simulate(cluster, w, LLAMA, PERF, REFERENCE, opts, engine=engine)
        assert not result.feasible and "down" in result.reason


def test_a_request_waits_for_the_repair_when_every_machine_is_down():
    w = Workload("two", np.array([0.0, 1.0]), np.array([100, 100]), np.array([10, 10]))
    cluster = Cluster(CATALOG.design("baseline-a100"), 1)
    opts = SimOptions(failures=((0.5, "any", 0, 2.0),))
    results = [simulate(cluster, w, LLAMA, PERF, REFERENCE, opts, engine=e)
               for e in ("fast", "reference")]
    np.testing.assert_allclose(results[0].finish_s, results[1].finish_s, rtol=1e-12)
    assert results[0].first_token_s[1] > 2.5  # arrived at 1.0, served after the repair at 2.5


# ------------------------------------------------------------------ schedules at the edge

def test_failure_csv_is_read_and_checked(tmp_path):
    good = tmp_path / "f.csv"
    good.write_text("time_s,pool,machine,down_s\n1.5,token,0,30\n0,prompt,1,inf\n")
    assert read_failure_csv(good) == ((1.5, "token", 0, 30.0), (0.0, "prompt", 1, float("inf")))
    for body, what in (("time_s,pool,machine\n1,token,0\n", "missing column"),
                       ("time_s,pool,machine,down_s\n1,gpu,0,3\n", "field 'pool'"),
                       ("time_s,pool,machine,down_s\n-1,token,0,3\n", "field 'time_s'"),
                       ("time_s,pool,machine,down_s\n1,token,0.5,3\n", "field 'machine'"),
                       ("time_s,pool,machine,down_s\n1,token,0,0\n", "field 'down_s'"),
                       ("time_s,pool,machine,down_s\n1,token,x,3\n", "field 'machine'")):
        bad = tmp_path / "bad.csv"
        bad.write_text(body)
        with pytest.raises(InputError, match=what):
            read_failure_csv(bad)


def test_schedule_resolves_pools_and_drops_failures_of_down_machines():
    cluster = Cluster(CATALOG.design("splitwise-hh"), 2, 3)
    opts = SimOptions(failures=((1.0, "token", 2, 5.0), (2.0, "token", 2, 5.0),
                                (0.5, "prompt", 1, 1.0), (0.7, "any", 4, 1.0)))
    rows = failure_array(cluster, opts, 100.0)
    # "any" 4 is token 2, down 0.7-1.7: its failure at 1.0 is dropped, the one at 2.0 kept
    assert rows.tolist() == [[0.5, 1, 1.0], [0.7, 4, 1.0], [2.0, 4, 5.0]]
    with pytest.raises(InputError, match="does not exist"):
        failure_array(cluster, SimOptions(failures=((1.0, "prompt", 2, 1.0),)), 100.0)


def test_mtbf_schedule_is_seeded_and_per_machine():
    small = Cluster(CATALOG.design("splitwise-hh"), 2, 2)
    big = Cluster(CATALOG.design("splitwise-hh"), 2, 4)
    opts = SimOptions(mtbf_hours=0.05, repair_s=30.0, failure_seed=7)
    a, b = failure_array(small, opts, 600.0), failure_array(small, opts, 600.0)
    assert np.array_equal(a, b) and len(a) > 0
    # machine 0's failures do not depend on the cluster's size
    c = failure_array(big, opts, 600.0)
    assert np.array_equal(a[a[:, 1] == 0], c[c[:, 1] == 0])
    other = failure_array(small, dataclasses.replace(opts, failure_seed=8), 600.0)
    assert not np.array_equal(a, other)


# ------------------------------------------------------------------ command line and search

def test_simulate_prints_failure_metrics_only_when_failures_are_configured(tmp_path, cli):
    schedule = tmp_path / "failures.csv"
    schedule.write_text("time_s,pool,machine,down_s\n5,token,0,inf\n8,prompt,1,3\n")
    common = ["simulate", "--design", "splitwise-hh", "--prompt", "6", "--token", "3",
              "--rate", "10", "--duration", "20", "--json"]
    plain = json.loads(cli(common).stdout)
    assert "failures" not in plain
    for recovery in (["--recovery", "restart"], ["--recovery", "replicate"],
                     ["--recovery", "restart", "--restart", "regenerate"]):
        run = cli(common + ["--failures", schedule, *recovery])
        assert run.code in (0, 1), run.stderr
        failures = json.loads(run.stdout)["failures"]
        assert failures["schedule"] == [[5.0, 6, None], [8.0, 1, 3.0]]
        assert failures["requests_affected"] > 0 and failures["goodput_rps"] > 0
        # per second of the 20 s arrival window, not of the makespan (issue 27)
        assert failures["goodput_rps"] == pytest.approx(failures["goodput_requests"] / 20.0,
                                                        abs=1e-6)
    text = cli(common[:-1] + ["--mtbf-hours", "0.01", "--repair-minutes", "0.5"])
    assert "requests affected" in text.stdout and "goodput" in text.stdout


@pytest.mark.parametrize("args,message", [
    (["--failures", "MISSING.csv"], "MISSING.csv"),
    (["--recovery", "replicate"], "--recovery applies when machines fail"),
    (["--restart", "regenerate"], "--restart applies when machines fail"),
    (["--failures", "SCHEDULE", "--restart", "again"], "--restart"),
    (["--repair-minutes", "3", "--failures", "SCHEDULE"], "--repair-minutes applies"),
    (["--failures", "SCHEDULE", "--recovery", "sometimes"], "recovery"),
    (["--mtbf-hours", "-1"], "--mtbf-hours"),
])
def test_failure_options_bad_input_exits_2(tmp_path, cli, args, message):
    schedule = tmp_path / "failures.csv"
    schedule.write_text("time_s,pool,machine,down_s\n5,token,7,inf\n")
    args = [str(schedule) if a == "SCHEDULE" else a for a in args]
    run = cli(["simulate", "--design", "splitwise-hh", "--prompt", "2", "--token", "2",
                  "--rate", "5", "--duration", "5", *args])
    assert run.code == 2 and message in run.stderr, run.stderr


def test_schedule_naming_a_missing_machine_exits_2(tmp_path, cli):
    schedule = tmp_path / "failures.csv"
    schedule.write_text("time_s,pool,machine,down_s\n5,token,7,inf\n")
    run = cli(["simulate", "--design", "splitwise-hh", "--prompt", "2", "--token", "2",
                  "--rate", "5", "--duration", "5", "--failures", schedule])
    assert run.code == 2 and "machine 7 of pool 'token' does not exist" in run.stderr


def test_failure_cases_cover_prompt_token_and_mixed_placements():
    from provisioner.evaluate import failure_cases
    from provisioner.study import Point
    hh = CATALOG.design("splitwise-hh")
    cases = dict(failure_cases(Point(hh, 4, 3, 10.0), 2, 100.0))
    assert cases["2 prompt machine(s) failed"] == ((10.0, "prompt", 0, np.inf),
                                                    (10.0, "prompt", 1, np.inf))
    assert cases["2 token machine(s) failed"] == ((10.0, "token", 0, np.inf),
                                                   (10.0, "token", 1, np.inf))
    assert cases["1 prompt + 1 token machine(s) failed"] == ((10.0, "prompt", 0, np.inf),
                                                              (10.0, "token", 0, np.inf))
    # a pool smaller than k loses every machine and the other pool the rest
    small = dict(failure_cases(Point(hh, 1, 3, 10.0), 2, 100.0))
    assert small["2 prompt machine(s) failed"] == ((10.0, "prompt", 0, np.inf),
                                                    (10.0, "token", 0, np.inf))
    base = failure_cases(Point(CATALOG.design("baseline-h100"), 5, 0, 10.0), 1, 100.0)
    assert base == [("1 machine(s) failed", ((10.0, "any", 0, np.inf),))]
    assert failure_cases(Point(hh, 4, 3, 10.0), 0, 100.0) == []


def test_survive_failures_search_reports_the_price_of_resilience():
    import provisioner
    plain = provisioner.search(designs="splitwise-hh", rate=20, duration=60, verify_seeds=2,
                               jobs=1)
    assert plain.to_dict()["inputs"]["options"]["survive_failures"] is None
    assert "recovery" not in plain.to_dict()["inputs"]["sim_options"]
    assert "resilience" not in plain.to_dict()["designs"][0]
    result = provisioner.search(designs="splitwise-hh", rate=20, duration=60, verify_seeds=2,
                                jobs=1, survive_failures=1)
    document = result.to_dict()
    assert document["inputs"]["options"]["survive_failures"] == 1
    entry = document["designs"][0]
    resilience = entry["resilience"]
    o = entry["optimum"]
    assert resilience["restart"]["cost_per_hour"] == o["cost_per_hour"]  # --recovery restart
    assert resilience["plain"]["cost_per_hour"] == plain.to_dict()["designs"][0]["optimum"][
        "cost_per_hour"]
    for policy in ("restart", "replicate"):
        assert resilience[policy]["cost_ratio"] >= 1.0
    # the failure-aware optimum really passes with a machine down in each placement
    from provisioner.evaluate import SimulationEvaluator
    from provisioner.study import Point
    point = Point(result.designs[0].design, o["prompt_machines"], o["token_machines"], 20.0)
    assert SimulationEvaluator(result.study).outcome(point, result.study.seed).meets_slos


def test_failure_options_in_a_spec_file_and_a_checked_report(tmp_path):
    import provisioner
    from provisioner.check import check_report
    from provisioner.options import Execution, SearchOptions, read_spec
    spec = tmp_path / "spec.yaml"
    spec.write_text("designs: baseline-h100\nrate: 10\nduration: 30\nverify-seeds: 1\n"
                    "survive-failures: 1\nrecovery: replicate\ndetection_s: 2\n")
    assert read_spec(spec, SearchOptions)["survive_failures"] == 1
    result = provisioner.search(spec=spec, jobs=1)
    inputs = result.to_dict()["inputs"]
    assert inputs["sim_options"]["recovery"] == "replicate"
    assert inputs["sim_options"]["detection_s"] == 2.0
    result.write(tmp_path / "out")
    checked = check_report(tmp_path / "out" / "report.json", Execution(jobs=1, no_cache=True))
    assert checked.unchanged, checked.lines()
    bad = tmp_path / "bad.yaml"
    bad.write_text("survive-failures: 0\n")
    with pytest.raises(InputError, match="survive-failures"):
        read_spec(bad, SearchOptions)


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_peer_replicas_halve_capacity_and_are_lost_with_their_peer(engine):
    cluster = Cluster(CATALOG.design("splitwise-aa"), 1, 3)
    w = Workload("one", np.array([0.0]), np.array([500]), np.array([500]))
    peer = dict(recovery="replicate", replica_target="peer", detection_s=5.0)
    plain_m = build_machine_arrays(cluster, LLAMA, PERF, SimOptions())
    m = build_machine_arrays(cluster, LLAMA, PERF, SimOptions(mtbf_hours=1.0, **peer))
    assert list(m.replica_peer) == [-1, 2, 3, 1]          # a ring over the token machines
    assert list(m.kv_capacity) == [plain_m.kv_capacity[0]] + [plain_m.kv_capacity[1] // 2] * 3
    curves = m.curves[0]
    t250 = (float(curves.prompt_time(500)) + kv_transfer_seconds(500, 0, 1, m)
            + sum(float(curves.token_time(1, 500 + k)) for k in range(1, 250)))
    fail_at = t250 + 0.001
    base = simulate(cluster, w, LLAMA, PERF, REFERENCE, SimOptions(), engine=engine)
    # the replica on machine 2 survives: restore it (to machine 2, the least committed)
    up = SimOptions(failures=((fail_at, "token", 0, 60.0),), **peer)
    run = simulate(cluster, w, LLAMA, PERF, REFERENCE, up, engine=engine)
    restore = 750 * LLAMA.kv_bytes_per_token / m.link_bytes_per_s[2]
    assert run.e2e_s[0] - base.e2e_s[0] == pytest.approx(0.001 + 5.0 + restore, rel=1e-9)
    # the peer went down first: the replica is gone, the request restarts (on machine 3)
    gone = SimOptions(failures=((1.0, "token", 1, float("inf")), (fail_at, "token", 0, 60.0)),
                      **peer)
    run = simulate(cluster, w, LLAMA, PERF, REFERENCE, gone, engine=engine)
    redo = float(curves.prompt_time(750)) + kv_transfer_seconds(750, 0, 3, m)
    assert run.e2e_s[0] - base.e2e_s[0] == pytest.approx(0.001 + 5.0 + redo, rel=1e-9)
    assert run.failure_stats["recomputed_tokens"][0] == 750


@pytest.mark.parametrize("design,prompt,token", [("splitwise-hh", 2, 2), ("splitwise-ha", 3, 2),
                                                 ("baseline-h100", 3, 0),
                                                 ("sarathi-h100", 3, 0)])
@pytest.mark.parametrize("recovery,target,restart", [
    ("restart", "host", "recompute"), ("replicate", "host", "recompute"),
    ("replicate", "peer", "recompute"), ("restart", "host", "regenerate"),
    ("replicate", "peer", "regenerate")])
def test_engines_agree_on_busy_clusters_with_many_failures(design, prompt, token, recovery,
                                                           target, restart):
    """Loaded clusters, failures every few seconds: every kind of loss happens (under
    regenerate, requests lost again while regenerating, silent decodes in long decode runs)."""
    w = synthesize("conversation", 3.0, 60.0, seed=2)
    cluster = Cluster(CATALOG.design(design), prompt, token)
    opts = SimOptions(mtbf_hours=0.005, repair_s=4.0, failure_seed=3, detection_s=1.0,
                      recovery=recovery, replica_target=target, restart=restart)
    fast = simulate(cluster, w, LLAMA, PERF, REFERENCE, opts, engine="fast")
    ref = simulate(cluster, w, LLAMA, PERF, REFERENCE, opts, engine="reference")
    assert fast.feasible and ref.feasible
    assert (ref.failure_stats["recoveries"] > 0).sum() >= 5
    for name in ("first_token_s", "finish_s", "kv_transfer_s"):
        np.testing.assert_allclose(getattr(fast, name), getattr(ref, name), rtol=1e-9)
    for key in ("recoveries", "recomputed_tokens"):
        np.testing.assert_array_equal(fast.failure_stats[key], ref.failure_stats[key])
    np.testing.assert_array_equal(fast.machine_stats["iterations"],
                                  ref.machine_stats["iterations"])
    np.testing.assert_allclose(fast.failure_stats["recovery_s"], ref.failure_stats["recovery_s"],
                               rtol=1e-9, atol=1e-12)
    assert_same_gaps(fast.itl_histogram, ref.itl_histogram)
    assert ref.itl_histogram.sum() == int((w.output_tokens - 1).sum())


def test_resilience_rows_follow_the_goal():
    """Cost goals show cost and power against the plain optimum; max-rate shows the rate given
    up, in every feasible cell (also when no failure-aware optimum exists)."""
    from provisioner.tables import resilience_rows

    def document(goal, restart):
        plain = {"prompt_machines": 27, "token_machines": 5, "rate_rps": 70.0,
                 "cost_per_hour": 1216.0, "power_kw": 172.5}
        return {"inputs": {"goal": {"name": goal}},
                "designs": [{"design": "splitwise-hh", "resilience": {
                    "plain": plain, "restart": restart, "replicate": None}}]}

    cost = document("min-cost", {"prompt_machines": 28, "token_machines": 5, "rate_rps": 70.0,
                                 "cost_per_hour": 1254.0, "power_kw": 177.9,
                                 "cost_ratio": 1254 / 1216, "power_ratio": 177.9 / 172.5})
    assert resilience_rows(cost) == [("splitwise-hh", [
        "27P+5T $1,216/h 172.5 kW", "28P+5T $1,254/h 177.9 kW (+3.1% cost, +3.1% power)",
        "infeasible"])]
    rate = document("max-rate", {"prompt_machines": 27, "token_machines": 5, "rate_rps": 63.0,
                                 "cost_per_hour": 1216.0, "power_kw": 172.5,
                                 "cost_ratio": 1.0, "power_ratio": 1.0, "rate_ratio": 0.9})
    assert resilience_rows(rate) == [("splitwise-hh", [
        "27P+5T 70 req/s $1,216/h", "27P+5T 63 req/s $1,216/h (-10.0% rate)", "infeasible"])]
    none_survive = document("max-rate", None)
    assert resilience_rows(none_survive)[0][1][0] == "27P+5T 70 req/s $1,216/h"
