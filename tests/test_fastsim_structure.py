"""The fast core's building blocks (simcore.fast), and its results against the reference on
hand-made clusters."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore import LatencyCurves, Workload
from simcore.fast import latency, records, routing, setup, simulate_fast, structures
from simcore.fast import pools as trees
from simcore.cluster import ROLE_BOTH, ROLE_PROMPT, ROLE_TOKEN, MachineArrays
from simcore.latency import piecewise_linear
from simcore.refsim import simulate_reference

CURVES = LatencyCurves(np.array([1.0, 512.0, 2048.0, 8192.0]), np.array([0.02, 0.05, 0.15, 0.6]),
                       np.array([1.0, 16.0, 64.0]), np.array([0.01, 0.012, 0.02]), 1e-7)
SLOW = LatencyCurves(CURVES.prompt_tokens, CURVES.prompt_seconds * 1.7, CURVES.decode_batch,
                     CURVES.decode_seconds * 1.3, 2e-7)


def machines(roles, capacity, kinds=None, mixed_pool=True, limit=2048, threshold=2048):
    count = len(roles)
    return MachineArrays(
        role=np.array(roles, np.int64),
        kind=np.array(kinds if kinds is not None else [0] * count, np.int64),
        kv_capacity=np.array(capacity, np.int64),
        link_bytes_per_s=np.full(count, 25e9), layerwise_visible_s=np.full(count, 0.008),
        curves=(CURVES, SLOW), kv_bytes_per_token=2_000_000, layers=70, mixed_pool=mixed_pool,
        prompt_token_limit=limit, queue_threshold=threshold, layerwise_min_prompt_tokens=512)


def workload(n, seed, rate=40.0):
    rng = np.random.default_rng(seed)
    arrival = np.round(np.cumsum(rng.exponential(1 / rate, n)), 2)  # rounded: many ties
    return Workload("t", arrival, rng.integers(1, 3000, n).astype(np.int64),
                    rng.integers(1, 60, n).astype(np.int64))


CLUSTERS = {
    "splitwise": machines([ROLE_PROMPT] * 3 + [ROLE_TOKEN] * 2, [9000] * 3 + [6000] * 2,
                          kinds=[0, 0, 0, 1, 1]),
    "splitwise-no-mixed": machines([ROLE_PROMPT] * 2 + [ROLE_TOKEN] * 2, [9000] * 4,
                                   mixed_pool=False),
    "baseline": machines([ROLE_BOTH] * 4, [7000] * 4, limit=512),
}


@pytest.mark.parametrize("name", sorted(CLUSTERS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fast_core_equals_reference_exactly(name, seed):
    m, w = CLUSTERS[name], workload(300, seed)
    fast, ref = simulate_fast(w, m), simulate_reference(w, m)
    assert fast.keys() == ref.keys()
    for key in ref:
        assert fast[key].dtype == ref[key].dtype, key
        assert fast[key].flags.c_contiguous, key
        np.testing.assert_array_equal(fast[key], ref[key], err_msg=key)


def test_stall_is_reported():
    # a token machine too small for the request: it waits forever in the decode wait
    m = machines([ROLE_PROMPT, ROLE_TOKEN], [100, 100], mixed_pool=False)
    w = Workload("t", np.array([0.0]), np.array([500], np.int64), np.array([10], np.int64))
    with pytest.raises(RuntimeError, match="stalled"):
        simulate_fast(w, m)


def test_piecewise_linear_matches_the_numpy_rule():
    xs, ys = CURVES.prompt_tokens, CURVES.prompt_seconds
    index = setup._bucket_starts(xs[None, :], np.array([len(xs)]))[0]
    scale = setup._bucket_scales(xs[None, :], np.array([len(xs)]))[0]
    for x in [0.0, 1.0, 3.0, 512.0, 700.5, 8192.0, 9000.0]:
        assert latency._piecewise_linear(x, xs, ys, len(xs), index, scale) == pytest.approx(
            float(piecewise_linear(np.array([x]), xs, ys)[0]), rel=1e-15)


def test_heap_pops_by_key_then_item():
    heap = records.Heap(np.zeros(8), np.zeros(8, np.int64), np.zeros(1, np.int64))
    for key, item in [(2.0, 5), (1.0, 7), (2.0, 1), (1.0, 3), (0.5, 9)]:
        structures._heap_push(heap, key, item)
    assert [structures._heap_pop(heap) for _ in range(5)] == [9, 3, 7, 1, 5]
    assert heap.size[0] == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.tuples(st.integers(0, 6), st.integers(0, 9))),
                max_size=120))
def test_heap_pops_what_heapq_pops(steps):
    """Pushes (key, item) and pops (None) interleaved, many ties: each pop gives heapq's
    smallest (key, item), and a heapified prefix (as a failure leaves it) pops in order too."""
    import heapq
    heap = records.Heap(np.zeros(128), np.zeros(128, np.int64), np.zeros(1, np.int64))
    expected = []
    for step in steps:
        if step is None:
            if expected:
                assert structures._heap_pop(heap) == heapq.heappop(expected)[1]
        else:
            structures._heap_push(heap, float(step[0]), step[1])
            heapq.heappush(expected, (float(step[0]), step[1]))
    kept = heap.size[0]
    heap.key[:kept], heap.item[:kept] = heap.key[:kept][::-1].copy(), heap.item[:kept][::-1].copy()
    structures._heapify(heap, kept)
    assert [structures._heap_pop(heap) for _ in range(kept)] == \
        [item for _, item in sorted(expected)]
    assert heap.size[0] == 0


def pools_for(name, pending, committed, in_mixed=()):
    ms = setup._new_machines(CLUSTERS[name])
    ms.pending[:], ms.committed[:] = pending, committed
    ms.in_mixed[list(in_mixed)] = True
    return ms, setup._new_pools(ms)


def test_routing_ties_go_to_the_lowest_index():
    ms, pools = pools_for("splitwise", [5, 3, 3, 0, 0], [0, 0, 0, 4, 4])
    assert trees._winner(pools, records.TREE_PROMPT_PENDING) == 1
    assert trees._winner(pools, records.TREE_TOKEN_COMMITTED) == 3
    assert trees._winner(pools, records.TREE_MIXED_COMMITTED) == records.NONE
    ms.in_mixed[3] = True
    trees._refresh(pools, ms, 3, records.CHANGED_POOL)
    assert trees._winner(pools, records.TREE_TOKEN_COMMITTED) == 4
    assert trees._winner(pools, records.TREE_MIXED_COMMITTED) == 3
    ms.committed[4] = 3
    trees._refresh(pools, ms, 4, records.CHANGED_COMMITTED)
    assert trees._winner(pools, records.TREE_TOKEN_COMMITTED) == 4
    ms.committed[3] = 1  # loads 5, 3, 3, 1, 3; the token machines hold 6000
    trees._refresh(pools, ms, 3, records.CHANGED_COMMITTED)
    assert routing._least_loaded(ms, pools, 100) == 3
    assert routing._least_loaded(ms, pools, 7000) == 1


def test_trees_agree_with_a_scan_after_random_updates():
    rng = np.random.default_rng(0)
    roles = [ROLE_PROMPT] * 9 + [ROLE_TOKEN] * 8
    ms = setup._new_machines(machines(roles, rng.choice([3000, 6000, 9000], 17)))
    pools = setup._new_pools(ms)
    for _ in range(2000):
        m = int(rng.integers(17))
        before = (ms.pending[m], ms.committed[m], ms.in_mixed[m])
        ms.pending[m] = rng.integers(0, 4)
        ms.committed[m] = rng.integers(0, 4)
        if rng.random() < 0.2:
            ms.in_mixed[m] = not ms.in_mixed[m]
        trees._refresh(pools, ms, m, trees._changes(ms[m], *before))
        idx = np.arange(17)
        own = ~ms.in_mixed
        for tree, pool, key in [
                (records.TREE_PROMPT_PENDING, (ms.role == ROLE_PROMPT) & own, ms.pending),
                (records.TREE_TOKEN_COMMITTED, (ms.role == ROLE_TOKEN) & own, ms.committed),
                (records.TREE_MIXED_PENDING, ms.in_mixed, ms.pending),
                (records.TREE_MIXED_COMMITTED, ms.in_mixed, ms.committed)]:
            expect = min(zip(key[pool], idx[pool]), default=(0, records.NONE))[1]
            assert trees._winner(pools, tree) == expect
        reservation = int(rng.integers(2990, 9010))
        fits = (ms.role == ROLE_PROMPT) & own & (ms.committed + reservation <= ms.capacity)
        expect = min(zip(ms.committed[fits], idx[fits]), default=(0, records.NONE))[1]
        assert routing._best_prompt_machine_that_holds(ms, pools, reservation) == expect
        fits = ms.capacity >= reservation
        load = ms.pending + ms.committed
        expect = min(zip(load[fits], idx[fits]), default=(0, records.NONE))[1]
        assert routing._least_loaded(ms, pools, reservation) == expect


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.sampled_from([0.5, 1.0, 8.0, 16.0, 15.0, 1000.0]), min_size=1,
                      max_size=300),
       queries=st.lists(st.floats(-10.0, 5e5, allow_nan=False), min_size=1, max_size=50))
def test_bucketed_knot_search_is_searchsorted(steps, queries):
    """The compiled core finds a curve's knot through buckets of its range; on any grid (near
    uniform or not, queries on knots, on bucket edges and between) it is np.searchsorted's,
    even when rounding puts a query in the bucket beside its own (the scale a hair off)."""
    xs = np.concatenate([[1.0], 1.0 + np.cumsum(steps)])
    ys = np.sqrt(xs) * 3.0
    index = setup._bucket_starts(xs[None, :], np.array([len(xs)]))[0]
    scale = setup._bucket_scales(xs[None, :], np.array([len(xs)]))[0]
    edges = list(np.linspace(xs[0], xs[-1], records.KNOT_BUCKETS + 1)[1:-1:7])
    inside = [x for x in queries + list(xs) + list(xs + 0.25) + edges if xs[0] < x <= xs[-1]]
    for off in (scale, scale * (1 + 1e-9), scale * (1 - 1e-9)):
        for x in inside:
            assert latency._first_knot_at_or_above(x, xs, len(xs), index, off) == \
                np.searchsorted(xs, x)
    curve = LatencyCurves(xs, ys, np.array([1.0, 2.0]), np.array([1.0, 2.0]), 0.0)
    for x in queries:
        assert latency._piecewise_linear(x, xs, ys, len(xs), index, scale) == pytest.approx(
            curve.prompt_time(np.array([x]))[0], rel=1e-12, abs=1e-12)


def test_running_decodes_leave_by_last_token_then_index():
    """The pairing heap of a machine's running decodes yields them by (finish tick, request),
    with interleaved admissions, and keeps the batch's context tokens."""
    rng = np.random.default_rng(3)
    n = 300
    w = Workload("t", np.zeros(n), rng.integers(1, 50, n).astype(np.int64),
                 rng.integers(2, 40, n).astype(np.int64))
    requests = setup._new_requests(w)
    requests.generated[:] = rng.integers(0, 2, n)
    ms = setup._new_machines(machines([ROLE_TOKEN], [10**9]))
    machine = ms[0]
    expected = []
    for r in range(n):
        structures._append_running(requests, machine, r)
        expected.append((int(requests.output[r] - requests.generated[r]), r))
        if r % 3 == 2:  # pop one between admissions
            assert structures._pop_running(requests, machine) == min(expected)[1]
            expected.remove(min(expected))
    assert machine.running_count == len(expected)
    context = sum(int(requests.prompt[r] + requests.generated[r]) for _, r in expected)
    assert machine.running_context == context
    got, order = [], sorted(expected)
    while machine.running_root != records.NONE:
        got.append(structures._pop_running(requests, machine))
    assert got == [r for _, r in order]
    assert machine.running_count == 0 and machine.running_context == 0


@pytest.mark.parametrize("offset", [0.0, 1e-4, -1e-4])
def test_a_decode_run_cut_by_a_prompt_ends_where_iterations_would(offset):
    """The fast core runs a decode machine's decode-only iterations as one event up to its
    next finish and cuts the run when work arrives. A prompt arriving exactly at an iteration
    end (offset 0), just after one, or just before one gives the reference's results."""
    m = machines([ROLE_BOTH, ROLE_BOTH], [10**6, 10**6], limit=512)

    def lone(output):  # the end of decode iteration output - 1 of a request alone
        w = Workload("t", np.array([0.0, 50.0]), np.array([300, 300], np.int64),
                     np.array([output, 2], np.int64))
        return simulate_reference(w, m)["finish_s"][0]
    boundary = lone(6)
    assert lone(5) < boundary < lone(7)
    arrivals = np.array([0.0, 0.0, boundary + offset, boundary + offset, boundary + 2.5 * offset])
    w = Workload("t", np.sort(arrivals), np.array([300, 280, 200, 260, 100], np.int64),
                 np.array([40, 25, 30, 12, 8], np.int64))
    fast, ref = simulate_fast(w, m), simulate_reference(w, m)
    for key in ref:
        np.testing.assert_array_equal(fast[key], ref[key], err_msg=key)


@pytest.mark.parametrize("seed", range(4))
def test_decode_runs_on_lent_machines_match_the_reference(seed):
    """One small token machine: prompt machines are lent to the mixed pool and decode there,
    in runs cut by prompts and KV caches arriving for them; per request as the reference."""
    m = machines([ROLE_PROMPT] * 3 + [ROLE_TOKEN], [9000] * 3 + [3000], kinds=[0, 0, 1, 1])
    w = workload(400, seed, rate=80.0)
    fast, ref = simulate_fast(w, m), simulate_reference(w, m)
    assert ref["mixed_pool_s"][:3].sum() > 0  # the prompt machines did decode in the mixed pool
    for key in ref:
        np.testing.assert_array_equal(fast[key], ref[key], err_msg=key)


@pytest.mark.parametrize("seed", range(4))
def test_chunk_runs_match_the_reference(seed):
    """Colocated chunked machines run a prompt's full pieces as one event and apply the ends in
    between before a route reads the load keys. Small pieces (runs of up to 46 iterations),
    arrivals inside runs and ties: every output equals the reference's."""
    m = dataclasses.replace(machines([ROLE_BOTH] * 4, [9000] * 4, kinds=[0, 0, 1, 1]),
                            chunk_tokens=64)
    w = workload(300, seed, rate=30.0)
    fast, ref = simulate_fast(w, m), simulate_reference(w, m)
    for key in ref:
        np.testing.assert_array_equal(fast[key], ref[key], err_msg=key)
