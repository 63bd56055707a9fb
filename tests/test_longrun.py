"""Long runs streamed in bounded memory (issue 29): the same run as with one record per
request, instant for instant, however few slots and however the arrivals are cut."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from simcore import Cluster, SimOptions, Workload, simulate
from simcore.fastsim import REQUEST, TooManyInFlight, run_streamed, simulate_fast
from simcore.longrun import curve_chunks, simulate_curve
from simcore.simulate import run_machines
from strategies import (CATALOG, MODEL, REFERENCE, SETTINGS, SyntheticPerf, clusters, fit,
                        failure_options, perf_models, schedules, workloads)


def streamed(machines, w: Workload, slots: int, chunk: int):
    """run_streamed over `w` cut into chunks of `chunk`: per-request fields by arrival order."""
    got = {"first_token": np.full(len(w), np.nan), "finish": np.full(len(w), np.nan),
           "prompt_machine": np.zeros(len(w), np.int64), "token_machine": np.zeros(len(w), np.int64)}
    seen = []

    def harvest(first, records):
        seen.append((first, len(records)))
        for key, column in got.items():
            column[first:first + len(records)] = records[key]

    chunks = ((w.arrival_s[i:i + chunk], w.prompt_tokens[i:i + chunk], w.output_tokens[i:i + chunk])
              for i in range(0, len(w), chunk))
    raw = run_streamed(machines, chunks, slots, harvest)
    # every request handed over once, in order
    assert [f for f, _ in seen] == list(np.cumsum([0] + [n for _, n in seen])[:-1])
    assert sum(n for _, n in seen) == len(w)
    return got, raw


@SETTINGS
@given(cluster=clusters(), workload=workloads(max_requests=60), perf=perf_models,
       opts=failure_options, schedule=schedules(), slots=st.sampled_from([8, 16, 64]),
       data=st.data())
def test_a_streamed_run_is_the_same_run(cluster, workload, perf, opts, schedule, slots, data):
    """Bit for bit: first tokens, finishes, machines, machine statistics and ITL, with
    failures and pools resized mid-run, with 8 slots for 60 requests (slots reused 7 times)."""
    chunk = data.draw(st.integers(1, slots // 2))
    plan = ()
    if data.draw(st.booleans()):
        plan = ((0.0, cluster.prompt_machines, cluster.token_machines),
                (1.0, max(1, cluster.prompt_machines - 1),
                 max(1, cluster.token_machines - 1) if cluster.token_machines else 0))
    opts = dataclasses.replace(opts, failures=fit(schedule, cluster), pool_plan=plan)
    machines, _, reason = run_machines(cluster, MODEL, perf, opts,
                                       float(workload.arrival_s.max()), workload)
    assume(not reason)
    try:
        whole = simulate_fast(workload, machines)
    except Exception:  # a stalled run: streamed, it stalls too (tested below)
        assume(False)
    try:
        got, raw = streamed(machines, workload, slots, chunk)
    except TooManyInFlight:
        # only when a request had not finished when its slot was needed: when the chunk of
        # the request `slots` after it was filled, at the first arrival of that chunk
        n = len(workload)
        needed = (np.arange(n) + slots) // chunk * chunk
        assert any(whole["finish_s"][g] >= workload.arrival_s[needed[g]]
                   for g in range(n) if needed[g] < n)
        return
    np.testing.assert_array_equal(got["first_token"], whole["first_token_s"])
    np.testing.assert_array_equal(got["finish"], whole["finish_s"])
    np.testing.assert_array_equal(got["prompt_machine"], whole["prompt_machine"])
    np.testing.assert_array_equal(got["token_machine"], whole["token_machine"])
    for key in ("busy_s", "iterations", "batch_size_sum", "max_memory_tokens", "mixed_pool_s",
                "itl_histogram"):
        np.testing.assert_array_equal(raw[key], whole[key])


def test_a_curve_run_gives_each_window_its_requests_latencies():
    """simulate_curve on a small curve: the requests `curve_chunks` draws, simulated whole by
    `simulate`, give the same per-request latencies (as float32), window by window."""
    cluster = Cluster(CATALOG.design("splitwise-hh"), 2, 1)
    perf = SyntheticPerf([0.02, 0.05, 0.1, 0.3], [0.01, 0.012, 0.02], 1e-7)
    times, rates, end, edges = [0.0, 20.0, 40.0], [2.0, 6.0, 1.0], 60.0, [0.0, 30.0, 60.0]
    counts = []
    chunks = list(curve_chunks("coding", times, rates, end, 7, edges, counts))
    w = Workload("curve", *(np.concatenate(parts) for parts in zip(*chunks)))
    whole = simulate(cluster, w, MODEL, perf, REFERENCE)
    run = simulate_curve(cluster, "coding", times, rates, end, edges, 7, MODEL, perf, REFERENCE)
    assert run.feasible and run.window_requests == tuple(counts) and run.requests == len(w)
    for metric in ("ttft_s", "tbt_s", "e2e_s", "ttft_slowdown", "e2e_slowdown"):
        np.testing.assert_allclose(getattr(run.latencies, metric),
                                   getattr(whole, metric).astype(np.float32), rtol=1e-6)
    np.testing.assert_array_equal(run.latencies.itl_histogram, whole.itl_histogram)
    first = counts[0]
    np.testing.assert_array_equal(run.window(1).ttft_s, run.latencies.ttft_s[first:])
    # the arrivals of each window are in it
    assert np.all(w.arrival_s[:first] < 30.0) and np.all(w.arrival_s[first:] >= 30.0)


def test_a_run_that_cannot_keep_up_is_infeasible_not_a_crash():
    cluster = Cluster(CATALOG.design("splitwise-hh"), 1, 1)
    perf = SyntheticPerf([0.2, 0.5, 1.0, 3.0], [0.05, 0.06, 0.1], 1e-6)
    run = simulate_curve(cluster, "coding", [0.0], [50.0], 30.0, [0.0, 30.0], 1, MODEL, perf,
                         REFERENCE, slots=64)
    assert not run.feasible and "falls behind" in run.reason
    assert REQUEST.itemsize <= 160
    with pytest.raises(ValueError, match="half"):
        list(run_streamed(run_machines(cluster, MODEL, perf, SimOptions(), 1.0)[0],
                          [(np.zeros(40), np.ones(40, np.int64), np.ones(40, np.int64))], 64,
                          lambda first, records: None))


def test_a_traces_curve_keeps_its_bursts_at_the_curves_rate():
    """With a trace as the workload, a curve's arrivals draw the trace's own gaps (over their
    mean) rescaled to the curve's rate: bursts of five simultaneous requests stay bursts of
    zero gaps, at 10 req/s instead of the trace's 5."""
    arrival = np.repeat(np.arange(200.0), 5)
    trace = Workload("bursts", arrival, np.full(1000, 100), np.full(1000, 10))
    counts = []
    chunks = list(curve_chunks(trace, [0.0], [10.0], 500.0, 0, [0.0, 500.0], counts))
    times = np.concatenate([c[0] for c in chunks])
    gaps = np.diff(times)
    assert abs(len(times) - 5000) < 500 and counts == [len(times)]
    assert abs((gaps == 0).mean() - 0.8) < 0.03        # four of five gaps inside a burst
    assert np.allclose(gaps[gaps > 0], 0.5, rtol=0.01)  # ~5 x the mean gap of 0.1 s
    sizes = np.concatenate([c[1] for c in chunks])
    assert np.all(sizes == 100)                        # the trace's sizes


def test_a_streamed_run_keeps_the_prefix_caches_across_chunks():
    """Prefix caching (aware routing, a host tier) over chunks of 7 requests in 64 slots, the
    pools resized mid-run, machines failing or not: the same run as with every request's
    record and blocks at once, request by request and in the machines' hits, and the whole run as the reference's (a
    machine that rejoins starts cold in both)."""
    from simcore.refsim import simulate_reference
    from simcore.sessions import PrefixModel, synthesize_sessions
    from tests.test_fast_runs import machines as arrays
    from simcore.cluster import ROLE_BOTH, ROLE_PROMPT, ROLE_TOKEN
    w = synthesize_sessions("conversation", PrefixModel(3, 700, 2, 5, 4.0), 60_000, 3.0, 40.0, 5)
    w = dataclasses.replace(w, prefix_blocks=w.prefix_blocks * 1_000_003 + (1 << 40))
    plans = {"baseline": np.array([[10.0, 2, -1], [25.0, 2, 1], [30.0, 1, -1]]),
             "splitwise": np.array([[12.0, 1, -1], [28.0, 1, 1]])}
    failures = np.array([[18.0, 0, 2.0], [33.0, 2, 1.0]])
    cases = [(name, m, fails, slots)
             for name, m in (("baseline", arrays([ROLE_BOTH] * 3, [60_000] * 3, limit=4096)),
                             ("splitwise", arrays([ROLE_PROMPT] * 2 + [ROLE_TOKEN],
                                                  [30_000] * 3, kinds=[0, 0, 1], limit=4096)))
             # (failures hold requests longer than 64 arrivals: more slots)
             for fails, slots in ((np.zeros((0, 3)), 64), (failures, 256))]
    for name, m, fails, slots in cases:
        m = dataclasses.replace(m, prefix_cache=True, prefix_routing=True,
                                resizes=plans[name], prefix_host_bytes=2_000_000 * 512 * 40,
                                host_link_bytes_per_s=np.full(3, 1e10), detection_s=0.5,
                                failures=fails)
        whole = simulate_fast(w, m)
        assert not len(fails) or whole["recoveries"].sum() > 0
        assert whole["prefix_hit_tokens"].sum() > 0
        ref = simulate_reference(w, m)
        for key in ref:
            np.testing.assert_array_equal(whole[key], ref[key], err_msg=f"{name} {key}")
        got = {"first_token": np.full(len(w), np.nan), "finish": np.full(len(w), np.nan),
               "prompt_machine": np.zeros(len(w), np.int64)}
        hits = np.zeros((len(w), 2), np.int64)

        def harvest(first, records, counts, got=got, hits=hits):
            for key, column in got.items():
                column[first:first + len(records)] = records[key]
            hits[first:first + len(records)] = counts

        def chunks(size=7):
            offsets = w.prefix_offsets
            for i in range(0, len(w), size):
                j = min(i + size, len(w))
                yield (w.arrival_s[i:j], w.prompt_tokens[i:j], w.output_tokens[i:j], None,
                       w.prefix_blocks[offsets[i]:offsets[j]], offsets[i:j + 1] - offsets[i])

        most = int(np.diff(w.prefix_offsets).max())
        raw = run_streamed(m, chunks(), slots, harvest, 512, most)
        np.testing.assert_array_equal(got["first_token"], whole["first_token_s"])
        np.testing.assert_array_equal(got["finish"], whole["finish_s"])
        np.testing.assert_array_equal(got["prompt_machine"], whole["prompt_machine"])
        np.testing.assert_array_equal(hits[:, 0], whole["request_hit_tokens"])
        np.testing.assert_array_equal(hits[:, 1], whole["request_looked_up"])
        for key in ("prefix_hit_tokens", "prefix_tokens", "prefix_host_hit_tokens", "busy_s"):
            np.testing.assert_array_equal(raw[key], whole[key], err_msg=f"{name} {key}")


def test_sessions_over_a_curve_are_the_same_streamed_or_whole():
    """Sessions over a three-step curve with the cache on and aware routing: the turns
    `curve_session_chunks` draws follow the curve (each window's count near its rate x span),
    and simulate_curve in 64 slots gives the latencies and the machines' hits of `simulate`
    on all the turns at once; a second seed differs, the same seed gives the same turns."""
    from simcore.longrun import curve_session_chunks
    from simcore.sessions import PrefixModel
    model = PrefixModel(4, 600, 1, 4, 3.0)
    cluster = Cluster(CATALOG.design("splitwise-hh"), 2, 1)
    perf = SyntheticPerf([0.02, 0.05, 0.1, 0.3], [0.01, 0.012, 0.02], 1e-7)
    times, rates, end, edges = [0.0, 20.0, 40.0], [2.0, 6.0, 1.0], 60.0, [0.0, 20.0, 40.0, 60.0]
    counts = []
    chunks = list(curve_session_chunks("conversation", model, 60_000, times, rates, end, 7,
                                       edges, counts, chunk=16))
    arrival = np.concatenate([c[0] for c in chunks])
    assert np.all(np.diff(arrival) >= 0) and arrival[-1] < end and sum(counts) == len(arrival)
    assert counts[1] > 2 * counts[0] and counts[1] > 2 * counts[2]   # the rate's step up
    offsets = [np.asarray(c[5]) for c in chunks]
    flat = np.concatenate([offsets[0]] + [o[1:] + sum(x[-1] for x in offsets[:i + 1])
                                          for i, o in enumerate(offsets[1:])])
    w = Workload("curve", arrival, *(np.concatenate([c[k] for c in chunks]) for k in (1, 2)),
                 prefix_blocks=np.concatenate([c[4] for c in chunks]), prefix_offsets=flat,
                 prefix_block_tokens=512)
    again = []
    assert [c[4].tolist() for c in curve_session_chunks(
        "conversation", model, 60_000, times, rates, end, 7, edges, again, chunk=16)] == [
        c[4].tolist() for c in chunks] and again == counts
    opts = SimOptions(prefix_cache=True, prefix_routing=True)
    whole = simulate(cluster, w, MODEL, perf, REFERENCE, opts)
    run = simulate_curve(cluster, "conversation", times, rates, end, edges, 7, MODEL, perf,
                         REFERENCE, opts, slots=64, sessions=model, context=60_000)
    assert run.feasible and run.window_requests == tuple(counts)
    for metric in ("ttft_s", "tbt_s", "e2e_s"):
        np.testing.assert_allclose(getattr(run.latencies, metric),
                                   getattr(whole, metric).astype(np.float32), rtol=1e-6)
    assert whole.prefix_hit_rate > 0.05
    for key in ("prefix_hit_tokens", "prefix_tokens"):
        np.testing.assert_array_equal(run.machine_stats[key], whole.machine_stats[key])


def test_a_curves_windows_report_their_prefix_hit_rates():
    """Per window, the hit rate of the requests arriving in it (tokens their lookups found
    cached / looked up): the streamed run's equals the whole run's per-request counts summed
    by window; it lies between 0 and the bound of one infinite cache of every other
    request's blocks; a smaller KV memory (a smaller cache) finds less overall."""
    from simcore.longrun import curve_session_chunks
    from simcore.sessions import PrefixModel
    model = PrefixModel(2, 1100, 2, 6, 2.0)
    cluster = Cluster(CATALOG.design("splitwise-hh"), 2, 1)
    perf = SyntheticPerf([0.02, 0.05, 0.1, 0.3], [0.01, 0.012, 0.02], 1e-7)
    times, rates, end, edges = [0.0, 20.0], [3.0, 8.0], 40.0, [0.0, 10.0, 20.0, 30.0, 40.0]
    args = ("conversation", times, rates, end, edges, 3, MODEL, perf, REFERENCE)
    runs = [simulate_curve(cluster, *args[:5], 3, MODEL, perf, REFERENCE,
                           SimOptions(prefix_cache=True, memory_reserve_fraction=reserve),
                           slots=256, sessions=model, context=60_000)
            for reserve in (0.1, 0.4)]
    big, small = runs
    counts = []
    chunks = list(curve_session_chunks("conversation", model, 60_000, times, rates, end, 3,
                                       edges, counts, chunk=16))
    prompt = np.concatenate([c[1] for c in chunks])
    offsets, total = [0], 0
    for c in chunks:
        offsets += list(np.asarray(c[5][1:]) + total)
        total += int(c[5][-1])
    w = Workload("curve", np.concatenate([c[0] for c in chunks]), prompt,
                 np.concatenate([c[2] for c in chunks]),
                 prefix_blocks=np.concatenate([c[4] for c in chunks]),
                 prefix_offsets=np.array(offsets), prefix_block_tokens=512)
    machines, _, _ = run_machines(cluster, MODEL, perf, SimOptions(prefix_cache=True,
                                                                   memory_reserve_fraction=0.1),
                                  end, w)
    whole = simulate_fast(w, machines)
    window = np.repeat(np.arange(len(counts)), counts)
    bound_hits = np.zeros(len(w), np.int64)
    users = {}
    for i in range(len(w)):
        for b in w.request_blocks(i).tolist():
            users.setdefault(b, set()).add(i)
    for i in range(len(w)):
        run = 0
        for b in w.request_blocks(i).tolist():
            if len(users[b]) < 2:
                break
            run += 1
        bound_hits[i] = min(run * 512, prompt[i] - 1)
    assert big.window_requests == tuple(counts)
    for k in range(len(counts)):
        mine = window == k
        hit = whole["request_hit_tokens"][mine].sum()
        looked = whole["request_looked_up"][mine].sum()
        assert big.window_prefix[k].tolist() == [hit, looked]
        assert looked == prompt[mine].sum()     # one lookup a request (no recompute)
        assert 0 <= big.window_hit_rate(k) <= bound_hits[mine].sum() / looked
    assert big.window_hit_rate(1) > 0.1
    assert small.prefix_hit_rate < big.prefix_hit_rate
    assert big.prefix_hit_rate == (whole["request_hit_tokens"].sum()
                                   / whole["request_looked_up"].sum())
