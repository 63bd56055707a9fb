"""The fast core's two transformations the reference simulator does not have, each against the
reference on its own: decode runs (`simcore.fast.decode_runs`: a machine's decode-only
iterations up to its next finish as one event, cut when work arrives, ended by failure steps)
and chunk runs (`simcore.fast.chunks`: a colocated machine's full-budget pieces of one prompt as
one event, the ends in between applied off the busy heap).

Each test also pauses the loop at instants inside the run (`_run(state, until)`, as a streamed
run does) to see that runs were in flight there, so that it tests the transformation and not a
run that never formed; every output then equals the reference's, dtype included."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore import LatencyCurves, Workload
from simcore.cluster import ROLE_BOTH, ROLE_PROMPT, ROLE_TOKEN, MachineArrays
from simcore.fast import setup
from simcore.fast.records import INF, RUN_DONE, RUN_PAUSED
from simcore.refsim import simulate_reference

CURVES = LatencyCurves(np.array([1.0, 512.0, 2048.0, 8192.0]), np.array([0.02, 0.05, 0.15, 0.6]),
                       np.array([1.0, 16.0, 64.0]), np.array([0.01, 0.012, 0.02]), 1e-7)
SLOW = LatencyCurves(CURVES.prompt_tokens, CURVES.prompt_seconds * 1.7, CURVES.decode_batch,
                     CURVES.decode_seconds * 1.3, 2e-7)


def machines(roles, capacity, kinds=None, mixed_pool=True, limit=2048, **options):
    count = len(roles)
    return MachineArrays(
        role=np.array(roles, np.int64),
        kind=np.array(kinds if kinds is not None else [0] * count, np.int64),
        kv_capacity=np.array(capacity, np.int64),
        link_bytes_per_s=np.full(count, 25e9), layerwise_visible_s=np.full(count, 0.008),
        curves=(CURVES, SLOW), kv_bytes_per_token=2_000_000, layers=70, mixed_pool=mixed_pool,
        prompt_token_limit=limit, queue_threshold=2048, layerwise_min_prompt_tokens=512,
        **options)


def workload(n, seed, rate, prompt=(1, 3000), output=(1, 60)):
    rng = np.random.default_rng(seed)
    arrival = np.round(np.cumsum(rng.exponential(1 / rate, n)), 2)  # rounded: many ties
    return Workload("t", arrival, rng.integers(*prompt, n).astype(np.int64),
                    rng.integers(*output, n).astype(np.int64))


def run_paused(w: Workload, m: MachineArrays, pauses: int = 40):
    """The fast core's run, paused at `pauses` instants over the arrivals' span; returns its
    results and the most iterations a decode run and a chunk run had in flight at a pause."""
    state = setup.new_state(m, setup._new_requests(w), w)
    state.progress.counts[1] = len(w)
    decode_ticks = chunk_left = 0
    for until in np.linspace(0.0, float(w.arrival_s[-1]) * 1.2, pauses + 1)[1:] + 1e-4:
        assert setup._run(state, until) == RUN_PAUSED
        busy = state.machines.busy.astype(bool)
        decode_ticks = max(decode_ticks, int(state.machines.run_ticks[busy].max(initial=0)))
        chunk_left = max(chunk_left, int(state.machines.chunk_left[busy].max(initial=0)))
    assert setup._run(state, INF) == RUN_DONE
    return setup.results(state, failures=len(m.failures) > 0), decode_ticks, chunk_left


def assert_as_reference(fast: dict, w: Workload, m: MachineArrays) -> None:
    ref = simulate_reference(w, m)
    assert fast.keys() == ref.keys()
    for key in ref:
        assert fast[key].dtype == ref[key].dtype, key
        np.testing.assert_array_equal(fast[key], ref[key], err_msg=key)
    whole = setup.simulate_fast(w, m)  # paused or not, the same run
    for key in ref:
        np.testing.assert_array_equal(fast[key], whole[key], err_msg=key)


# ---------------------------------------------------------------------------- decode runs

DECODE_CLUSTERS = {
    # two prompt machines feed one token machine: long decode batches, cut by KV arrivals
    "splitwise": machines([ROLE_PROMPT] * 2 + [ROLE_TOKEN], [9000] * 2 + [60000],
                          kinds=[0, 0, 1]),
    # one small token machine: prompt machines lent to the mixed pool decode in runs cut by
    # prompts and KV caches arriving for them
    "lent": machines([ROLE_PROMPT] * 3 + [ROLE_TOKEN], [9000] * 3 + [3000], kinds=[0, 0, 1, 1]),
    # colocated machines without chunking: runs cut by prompts routed to them
    "baseline": machines([ROLE_BOTH] * 3, [20000] * 3, limit=512),
}


@pytest.mark.parametrize("name", sorted(DECODE_CLUSTERS))
@pytest.mark.parametrize("seed", range(3))
def test_decode_runs_match_the_reference(name, seed):
    m = DECODE_CLUSTERS[name]
    w = workload(200, seed, rate=12.0, prompt=(1, 1500), output=(20, 200))
    fast, decode_ticks, _ = run_paused(w, m)
    assert decode_ticks > 5  # runs of many iterations were in flight
    assert_as_reference(fast, w, m)


@pytest.mark.parametrize("recovery", ["restart", "replicate", "regenerate"])
def test_decode_runs_ended_by_failure_steps_match_the_reference(recovery):
    """With failures, a run ends by the next failure step (a failure, a repair, a lost request
    acted on), so that a failing machine is between iterations or in a single one."""
    failures = np.array([[3.0, 2, 4.0], [5.5, 0, 2.0], [9.25, 2, np.inf]])
    m = dataclasses.replace(
        machines([ROLE_PROMPT] * 2 + [ROLE_TOKEN] * 2, [9000] * 2 + [60000] * 2,
                 kinds=[0, 0, 1, 1]),
        failures=failures, detection_s=0.5, replicate=recovery == "replicate",
        regenerate=recovery == "regenerate")
    w = workload(250, 7, rate=15.0, prompt=(1, 1500), output=(20, 200))
    fast, decode_ticks, _ = run_paused(w, m)
    assert decode_ticks > 5
    assert fast["recoveries"].sum() > 0
    assert_as_reference(fast, w, m)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), rate=st.sampled_from([3.0, 10.0, 30.0]),
       output=st.sampled_from([(1, 8), (20, 200)]), name=st.sampled_from(sorted(DECODE_CLUSTERS)))
def test_decode_runs_match_the_reference_on_any_arrivals(seed, rate, output, name):
    m = DECODE_CLUSTERS[name]
    w = workload(60, seed, rate, prompt=(1, 1500), output=output)
    fast, _, _ = run_paused(w, m, pauses=7)
    assert_as_reference(fast, w, m)


# ---------------------------------------------------------------------------- chunk runs

def chunked(count, chunk_tokens, capacity=9000, **options):
    return dataclasses.replace(
        machines([ROLE_BOTH] * count, [capacity] * count, kinds=[i % 2 for i in range(count)],
                 **options), chunk_tokens=chunk_tokens)


@pytest.mark.parametrize("chunk_tokens", [16, 64, 256])
@pytest.mark.parametrize("seed", range(3))
def test_chunk_runs_match_the_reference(chunk_tokens, seed):
    """Small pieces (runs of up to 180 iterations), arrivals inside runs, ties: the ends applied
    off the busy heap before a route reads the load keys give the reference's every output.
    (At 5 req/s on 4 machines a prompt often starts alone, the one case a chunk run forms.)"""
    m = chunked(4, chunk_tokens)
    w = workload(200, seed, rate=5.0, prompt=(500, 3000))
    fast, _, chunk_left = run_paused(w, m)
    assert chunk_left > 3  # chunk runs were in flight
    assert_as_reference(fast, w, m)


@pytest.mark.parametrize("recovery", ["restart", "replicate"])
def test_chunk_runs_with_failures_match_the_reference(recovery):
    """A failure takes a chunk run's machine down mid-run; with replicas, a KV cache restored
    to a colocated machine cuts its chunk run at the iteration in flight."""
    failures = np.array([[6.0, 1, 3.0], [13.5, 3, 2.0], [21.0, 0, np.inf]])
    m = chunked(4, 64, capacity=30000, failures=failures, detection_s=0.25,
                replicate=recovery == "replicate")
    w = workload(200, 11, rate=5.0, prompt=(500, 3000))
    fast, _, chunk_left = run_paused(w, m)
    assert chunk_left > 3
    assert fast["recoveries"].sum() > 0
    assert_as_reference(fast, w, m)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), rate=st.sampled_from([5.0, 20.0, 60.0]),
       chunk_tokens=st.sampled_from([16, 64, 512]), count=st.integers(1, 4))
def test_chunk_runs_match_the_reference_on_any_arrivals(seed, rate, chunk_tokens, count):
    m = chunked(count, chunk_tokens)
    w = workload(50, seed, rate, prompt=(1, 3000))
    fast, _, _ = run_paused(w, m, pauses=7)
    assert_as_reference(fast, w, m)


# ------------------------------------------------------------------- engine overheads

def with_overheads(m: MachineArrays, overlap: bool) -> MachineArrays:
    """The same cluster with an engine's host time on both SKUs (after the GPU work or beside
    it; a per-request term too): every transformation above must price it as the reference.
    Overlapped, 20 ms + 0.2 ms a sequence is longer than the GPU work of most batches."""
    terms = (20e-3, 2e-4) if overlap else (1.1e-3, 23e-6)
    return dataclasses.replace(m, curves=tuple(c.with_engine_overheads(*terms, 0.04, overlap)
                                               for c in m.curves))


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("name", sorted(DECODE_CLUSTERS))
def test_decode_runs_with_engine_overheads_match_the_reference(name, overlap):
    m = with_overheads(DECODE_CLUSTERS[name], overlap)
    w = workload(200, 3, rate=12.0, prompt=(1, 1500), output=(20, 200))
    fast, decode_ticks, _ = run_paused(w, m)
    assert decode_ticks > 5
    assert_as_reference(fast, w, m)
    plain = setup.simulate_fast(w, DECODE_CLUSTERS[name])
    assert fast["busy_s"].sum() > plain["busy_s"].sum()   # the overheads were priced


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("chunk_tokens", [16, 256])
def test_chunk_runs_with_engine_overheads_match_the_reference(chunk_tokens, overlap):
    m = with_overheads(chunked(4, chunk_tokens), overlap)
    w = workload(200, 1, rate=5.0, prompt=(500, 3000))
    fast, _, chunk_left = run_paused(w, m)
    assert chunk_left > 3
    assert_as_reference(fast, w, m)
