"""Closed-loop load (issue 41; `simcore.workload.ClosedLoop`, simcore.refsim "Closed loop"): N
users each send a request, wait for its last token, think, and send the next.

The fast core must agree with the reference request by request, arrivals included (they are
the run's own), with think times 0 and > 0, on decode runs, chunk runs, paged KV and prefix
caching, paused mid-run; a one-user case is checked by hand; at most N requests are ever in the system;
bad users and think times are refused."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hardware_catalog import InputError
from simcore import LatencyCurves, Workload
from simcore.cluster import ROLE_BOTH, ROLE_PROMPT, ROLE_TOKEN
from simcore.fast import setup
from simcore.fast.records import INF, RUN_DONE, RUN_PAUSED
from simcore.refsim import simulate_reference
from simcore.workload import closed_loop
from tests.test_fast_runs import assert_as_reference, chunked, machines, workload
from tests.test_prefix_cache import shared_prefixes

CLUSTERS = {
    "splitwise": machines([ROLE_PROMPT] * 2 + [ROLE_TOKEN], [9000] * 2 + [60000],
                          kinds=[0, 0, 1]),
    "baseline": machines([ROLE_BOTH] * 3, [20000] * 3, limit=1024),
    "mixed": machines([ROLE_PROMPT] * 3 + [ROLE_TOKEN], [9000] * 3 + [6000], kinds=[0, 0, 1, 1]),
    "chunked": chunked(3, 128),
    "paged": machines([ROLE_PROMPT] * 2 + [ROLE_TOKEN], [9000] * 2 + [12000], kinds=[0, 0, 1],
                      kv_paged=True),
    "paged-chunked": chunked(2, 256, capacity=6000, kv_paged=True),
}


def closed(n, seed, users, think, **sizes):
    return closed_loop(workload(n, seed, 1.0, **sizes), users, think, seed)


def run_paused(w: Workload, m, pauses: int = 30, chunk_runs: list | None = None):
    """The fast core's run paused at `pauses` instants over its span (from a whole run);
    `chunk_runs` gets the most iterations a chunk run had in flight at each pause."""
    span = float(np.max(setup.simulate_fast(w, m)["finish_s"]))
    state = setup.new_state(m, setup._new_requests(w), w)
    state.progress.counts[1] = len(w)
    for until in np.linspace(0.0, span, pauses + 1)[1:-1] + 1e-4:
        assert setup._run(state, until) == RUN_PAUSED
        if chunk_runs is not None:
            chunk_runs.append(int(state.machines.chunk_left.max()))
    assert setup._run(state, INF) == RUN_DONE
    return setup.results(state, failures=False)


@pytest.mark.parametrize("name", sorted(CLUSTERS))
@pytest.mark.parametrize("users,think", [(1, 0.0), (6, 0.0), (12, 0.7), (40, 2.0)])
def test_closed_loops_match_the_reference(name, users, think):
    w = closed(150, users, users, think, prompt=(1, 2500), output=(5, 200))
    fast = run_paused(w, CLUSTERS[name])
    assert "arrival_s" in fast and np.all(np.diff(fast["arrival_s"]) >= 0)
    assert_as_reference(fast, w, CLUSTERS[name])


def test_closed_loops_with_chunk_runs_match_the_reference():
    """Long prompts in small pieces, short decodes, users back at once: chunk runs in flight
    while users arrive (their ends are applied off the busy heap before those routes)."""
    m = chunked(2, 64)
    w = closed(120, 3, 5, 0.0, prompt=(1500, 3000), output=(1, 8))
    chunk_runs = []
    fast = run_paused(w, m, pauses=60, chunk_runs=chunk_runs)
    assert max(chunk_runs) > 0
    assert_as_reference(fast, w, m)


@pytest.mark.parametrize("routing", [False, True])
def test_closed_loops_with_prefix_caching_match_the_reference(routing):
    m = machines([ROLE_BOTH] * 3, [20000] * 3, limit=1024, prefix_cache=True,
                 prefix_routing=routing)
    w = closed_loop(shared_prefixes(150, 2, 1.0), 8, 0.3, 2)
    fast = run_paused(w, m)
    assert fast["prefix_hit_tokens"].sum() > 0
    assert_as_reference(fast, w, m)


FLAT = LatencyCurves(np.array([1.0, 8192.0]), np.array([0.1, 0.1]), np.array([1.0, 64.0]),
                     np.array([0.01, 0.01]), 0.0)


def test_one_user_sends_one_request_after_another():
    """One machine, one user: prefill 0.1 s, then a decode of 0.01 s per token after the
    first; request k + 1 arrives at request k's finish plus its think time."""
    m = dataclasses.replace(machines([ROLE_BOTH], [100000]), curves=(FLAT,))
    base = Workload("w", np.zeros(4), np.array([10, 20, 30, 40]), np.array([1, 3, 5, 2]))
    w = closed_loop(base, 1, 0.5, 7)
    think = w.closed.think_s
    for run in (setup.simulate_fast, simulate_reference):
        raw = run(w, m)
        arrival, finish = [0.0], []
        for k, output in enumerate(base.output_tokens):
            finish.append(arrival[k] + 0.1 + 0.01 * (output - 1))
            arrival.append(finish[k] + think[k])
        np.testing.assert_allclose(raw["arrival_s"], arrival[:-1], rtol=0, atol=1e-12)
        np.testing.assert_allclose(raw["finish_s"], finish, rtol=0, atol=1e-12)
        assert np.all(raw["arrival_s"][1:] >= raw["finish_s"][:-1])


@pytest.mark.parametrize("name", ["splitwise", "chunked", "paged"])
@pytest.mark.parametrize("users", [1, 5, 17])
def test_never_more_than_n_requests_in_the_system(name, users):
    w = closed(200, users, users, 0.2, prompt=(1, 2500), output=(5, 200))
    raw = setup.simulate_fast(w, CLUSTERS[name])
    # at every arrival, the requests arrived before it and not yet finished (a request that
    # finishes at that instant has left: its user may be the one arriving)
    arrival, finish = raw["arrival_s"], raw["finish_s"]
    in_system = [(arrival[:k] <= arrival[k]).sum() - (finish[:k] <= arrival[k]).sum() + 1
                 for k in range(len(w))]
    assert max(in_system) == users
    assert (arrival[:users] == 0).all() and (arrival[users:] > 0).all()


def test_the_same_seed_gives_the_same_run():
    m = CLUSTERS["baseline"]
    runs = [setup.simulate_fast(closed(100, 3, 8, 0.5), m) for _ in range(2)]
    for key in runs[0]:
        assert runs[0][key].tobytes() == runs[1][key].tobytes(), key
    other = setup.simulate_fast(closed_loop(workload(100, 3, 1.0), 8, 0.5, 4), m)
    assert other["arrival_s"].tobytes() != runs[0]["arrival_s"].tobytes()


@pytest.mark.parametrize("users,think", [(0, 1.0), (-3, 1.0), (2, -0.5), (2, float("nan")),
                                         (2, float("inf"))])
def test_bad_closed_loops_are_refused(users, think):
    with pytest.raises(InputError):
        closed_loop(workload(10, 0, 1.0), users, think, 0)


def test_closed_loops_refuse_failures():
    m = dataclasses.replace(CLUSTERS["baseline"], failures=np.array([[1.0, 0, 2.0]]))
    for run in (setup.simulate_fast, simulate_reference):
        with pytest.raises(ValueError, match="closed loop"):
            run(closed(20, 0, 2, 0.0), m)


@pytest.mark.parametrize("name", ["splitwise", "paged"])
def test_closed_loops_with_speculative_decoding_match_the_reference(name):
    from tests.test_spec_decode import EAGLE, assert_agree, plan, spec_machines
    m = spec_machines(CLUSTERS[name], EAGLE)
    w = closed(150, 1, 10, 0.4, prompt=(1, 1500), output=(20, 300))
    ref = assert_agree(w, m, plan(w, EAGLE, 1))
    assert np.all(np.isfinite(ref["finish_s"])) and ref["arrival_s"][-1] > 0


def test_simulate_reports_the_closed_loop_and_its_throughput():
    """`provision simulate --concurrency 3 --think-time 0.5 --requests 40` from Python: the
    result's workload holds the run's arrivals (TTFT from them), the summary the users, the
    think time and the requests per second achieved over the run."""
    import provisioner
    run = provisioner.simulate(design="baseline-h100", machines=1, model="llama-3.1-8b",
                               concurrency=3, think_time=0.5, requests=40)
    result = run.result
    arrival = result.workload.arrival_s
    assert (arrival[:3] == 0).all() and (arrival[3:] > 0).all()
    assert np.all(result.first_token_s > arrival)
    # E2E is measured from the run's arrivals (plus the engine's first-token time)
    assert np.all(result.e2e_s >= result.finish_s - arrival - 1e-12)
    assert np.all(result.e2e_s < result.finish_s - arrival + 1.0)
    loop = run.to_dict()["closed_loop"]
    assert loop["users"] == 3 and loop["think_time_s"] == 0.5
    assert loop["throughput_rps"] == pytest.approx(40 / float(np.max(result.finish_s)),
                                                   rel=1e-5)
    again = provisioner.simulate(design="baseline-h100", machines=1, model="llama-3.1-8b",
                                 concurrency=3, think_time=0.5, requests=40)
    assert again.to_dict() == run.to_dict()


@pytest.mark.parametrize("values,count", [({"concurrency": 4}, 1000),
                                          ({"concurrency": 250}, 2500),
                                          ({"concurrency": 250, "requests": 30}, 30)])
def test_a_closed_loop_runs_enough_requests_per_user(values, count):
    """--requests left out: 1,000, or 10 per user when that is more (a run of one request per
    user is the start-up burst alone); given, as given. The question echoes the loop."""
    from provisioner.options import SimulateOptions, build
    from provisioner.question import resolve_simulate
    question = resolve_simulate(build(SimulateOptions, {
        "design": "baseline-h100", "machines": 1, "model": "llama-3.1-8b", "think_time": 1.5,
        **values}))
    assert len(question.requests) == count
    asked = question.to_dict()
    assert (asked["concurrency"], asked["think_time_s"]) == (values["concurrency"], 1.5)
    assert asked["rate_rps"] is None and asked["requests"] == count
