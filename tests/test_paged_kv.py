"""Paged KV admission (issue 37; `SimOptions.kv_admission = "paged"`, docs/semantics.md):
blocks held as tokens are generated, admission by the current blocks plus vLLM's
watermark, the latest admitted decode preempted and recomputed when blocks run out.

The fast core must agree with the reference with preemptions actually happening (decode runs
end where memory would run out, as they end at a finish), on decode runs, chunked designs and
the mixed pool, paused as in tests/test_fast_runs.py; a small case is checked by hand."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hardware_catalog import InputError
from simcore import LatencyCurves, Workload
from simcore.cluster import ROLE_BOTH, ROLE_PROMPT, ROLE_TOKEN, SimOptions, itl_bin
from simcore.refsim import simulate_reference
from tests.test_fast_runs import assert_as_reference, machines, run_paused, workload

PAGED = {
    # two prompt machines feed one small token machine: its decodes outgrow it
    "splitwise": machines([ROLE_PROMPT] * 2 + [ROLE_TOKEN], [9000] * 2 + [12000],
                          kinds=[0, 0, 1], kv_paged=True),
    # prompt machines lent to the mixed pool decode, and preempt, too
    "lent": machines([ROLE_PROMPT] * 3 + [ROLE_TOKEN], [9000] * 3 + [3000],
                     kinds=[0, 0, 1, 1], kv_paged=True),
    # colocated machines: the preempted go back to the prompt queue they came from
    "baseline": machines([ROLE_BOTH] * 3, [6000] * 3, limit=512, kv_paged=True),
    # chunked designs, colocated and Splitwise (a token machine recomputes in chunks)
    "chunked": machines([ROLE_BOTH] * 2, [6000] * 2, chunk_tokens=256, kv_paged=True),
    "splitwise-chunked": machines([ROLE_PROMPT] * 2 + [ROLE_TOKEN] * 2, [9000] * 2 + [6000] * 2,
                                  kinds=[0, 0, 1, 1], chunk_tokens=256, kv_paged=True),
}


@pytest.mark.parametrize("name", sorted(PAGED))
@pytest.mark.parametrize("seed", range(2))
def test_paged_runs_match_the_reference(name, seed):
    m = PAGED[name]
    w = workload(200, seed, rate=12.0, prompt=(1, 1500), output=(20, 400))
    fast, decode_ticks, _ = run_paused(w, m)
    assert decode_ticks > 5           # decode runs were in flight
    assert fast["preemptions"].sum() > 0
    assert_as_reference(fast, w, m)


def test_paged_chunk_runs_match_the_reference():
    m = machines([ROLE_BOTH] * 2, [9000] * 2, chunk_tokens=128, kv_paged=True)
    w = workload(150, 4, rate=6.0, prompt=(1, 3000), output=(20, 300))
    fast, _, chunk_left = run_paused(w, m, pauses=80)
    assert chunk_left > 0 and fast["preemptions"].sum() > 0
    assert_as_reference(fast, w, m)


@pytest.mark.parametrize("block,watermark", [(1, 0.0), (16, 0.05), (32, 0.01)])
def test_paged_block_sizes_and_watermarks_match_the_reference(block, watermark):
    m = dataclasses.replace(PAGED["splitwise"], kv_block_tokens=block, kv_watermark=watermark)
    w = workload(200, 5, rate=12.0, prompt=(1, 1500), output=(20, 400))
    fast, _, _ = run_paused(w, m)
    assert fast["preemptions"].sum() > 0
    assert_as_reference(fast, w, m)


def test_paged_with_failures_matches_the_reference():
    failures = np.array([[3.0, 2, 4.0], [5.5, 0, 2.0], [9.25, 3, np.inf]])
    m = dataclasses.replace(PAGED["splitwise-chunked"], failures=failures, detection_s=0.5)
    w = workload(250, 7, rate=15.0, prompt=(1, 1500), output=(20, 300))
    fast, _, _ = run_paused(w, m)
    assert fast["recoveries"].sum() > 0 and fast["preemptions"].sum() > 0
    assert_as_reference(fast, w, m)


FLAT = LatencyCurves(np.array([1.0, 8192.0]), np.array([0.1, 0.1]), np.array([1.0, 64.0]),
                     np.array([0.01, 0.01]), 0.0)


def test_the_later_request_is_preempted_and_recomputed():
    """One machine of 64 tokens (4 blocks of 16), two requests of 16 + 40 tokens that cannot
    both grow to 56. Reserved up front, B waits for A. Paged, both run until A starts its
    third block (A at 33 tokens, B at 32: 48 + 32 > 64): B, admitted last, is preempted, waits
    for room (its 32 tokens beside A's growing blocks do not fit until A finishes), then
    recomputes its 16 + 16 tokens as one prefill and decodes its last 24 tokens; its 39
    decodes and every token are there, its gap across the preemption counted."""
    w = Workload("t", np.array([0.0, 0.05]), np.array([16, 16]), np.array([40, 40]))
    m = dataclasses.replace(machines([ROLE_BOTH], [64]), curves=(FLAT, FLAT), kv_paged=True,
                            kv_watermark=0.0)
    trace: list = []
    ref = simulate_reference(w, m, trace)
    assert ref["preemptions"].tolist() == [1]
    pieces = [(t["start"], c) for t in trace for c in t["chunks"]]
    assert [c for _, c in pieces] == [(0, 16, 0), (1, 16, 0), (1, 32, 0)]  # B recomputed
    recompute_start = pieces[-1][0]
    assert recompute_start == pytest.approx(ref["finish_s"][0])   # once A has finished
    b_decodes = [t for t in trace if 1 in t["decodes"]]
    assert len(b_decodes) == 39
    before = [t for t in b_decodes if t["end"] <= recompute_start]
    after = [t for t in b_decodes if t["start"] > recompute_start]
    assert len(before) == 15 and len(after) == 24
    gap = after[0]["end"] - before[-1]["end"]   # its 17th token after its 16th: the stall
    assert gap > 0.1 + 0.01 and ref["itl_histogram"][itl_bin(gap)] >= 1
    assert ref["max_memory_tokens"].tolist() == [64]
    reserved = simulate_reference(w, dataclasses.replace(m, kv_paged=False))
    assert "preemptions" not in reserved
    assert ref["first_token_s"][1] < reserved["first_token_s"][1]  # B starts before A ends
    fast, _, _ = run_paused(w, m, pauses=10)
    assert_as_reference(fast, w, m)


def test_reserve_is_the_default_and_checked():
    assert SimOptions().kv_admission == "reserve"
    with pytest.raises(InputError):
        SimOptions(kv_admission="lazy")


# ---------------------------------------------------------------------------- random clusters
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from strategies import (TIGHT_RESERVE, assert_engines_agree, both_engines, clusters,  # noqa: E402
                        failure_options, fit, perf_models, schedules, workloads)

paged_options = st.builds(SimOptions, prompt_token_limit=st.sampled_from([512, 2048]),
                          mixed_pool_queue_threshold=st.sampled_from([0, 2048, 8192]),
                          memory_reserve_fraction=TIGHT_RESERVE,
                          kv_admission=st.just("paged"),
                          kv_watermark=st.sampled_from([0.0, 0.01, 0.1]))


@st.composite
def long_workloads(draw):
    """`workloads` with outputs long enough to outgrow memory (tight reserve: preemptions)."""
    w = draw(workloads(max_requests=60))
    output = np.array(draw(st.lists(st.integers(1, 400), min_size=len(w), max_size=len(w))))
    return Workload("random", w.arrival_s, w.prompt_tokens * 4, output.astype(np.int64))


@settings(max_examples=60, deadline=None)
@given(cluster=clusters(), workload=long_workloads(), perf=perf_models, opts=paged_options)
def test_paged_engines_agree_on_random_clusters(cluster, workload, perf, opts):
    fast, ref = both_engines(cluster, workload, perf, opts)
    assert_engines_agree(fast, ref)
    if fast.feasible:
        np.testing.assert_array_equal(fast.machine_stats["preemptions"],
                                      ref.machine_stats["preemptions"])


@settings(max_examples=40, deadline=None)
@given(cluster=clusters(), workload=long_workloads(), perf=perf_models, opts=failure_options,
       schedule=schedules())
def test_paged_engines_agree_under_failures(cluster, workload, perf, opts, schedule):
    opts = dataclasses.replace(opts, failures=fit(schedule, cluster), kv_admission="paged")
    fast, ref = both_engines(cluster, workload, perf, opts)
    assert_engines_agree(fast, ref, close=("busy_s", "mixed_pool_s"), atol=1e-9)
    if fast.feasible:
        np.testing.assert_array_equal(fast.machine_stats["preemptions"],
                                      ref.machine_stats["preemptions"])


def test_blocks_grown_by_a_run_are_counted_per_residue():
    """`_grown` in closed form (a run's ticks // block full rounds, then the residues whose
    block starts in the remaining ticks) counts what ending the iterations one by one does:
    each decode of residue key starts a block at iteration j when j + key + clock is a
    multiple of the block."""
    from simcore.fast.decode_runs import _grown
    rng = np.random.default_rng(7)
    for _ in range(400):
        block = int(rng.choice([1, 2, 16, 32]))
        residues = rng.integers(0, 4, block)
        clock, ticks = int(rng.integers(0, 10_000)), int(rng.integers(1, 3 * block + 5))
        one_by_one = sum(int(residues[key]) for j in range(ticks) for key in range(block)
                         if (j + key + clock) % block == 0)
        assert _grown(residues, clock, ticks, block, int(residues.sum())) == one_by_one * block
