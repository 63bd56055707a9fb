"""Prefill-first batching (issue 37; `SimOptions.prefill_first`, `--batching`,
docs/semantics.md): an iteration without chunks on a machine with running decodes and
waiting prompts runs the prompts alone while the decodes wait (SGLang's scheduler, vLLM V0,
Vidur's vLLM scheduler), instead of mixing them (vLLM V1, TensorRT-LLM, the Splitwise
simulator).

The fast core must agree with the reference with paused decodes (their first gap after the
pause from their last token, in plain iterations, decode runs and with silent decodes after
failures); a small case is checked by hand, and the engine's default is checked."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simcore import LatencyCurves, Workload
from simcore.cluster import ROLE_BOTH, ROLE_PROMPT, ROLE_TOKEN, SimOptions, itl_bin
from simcore.refsim import simulate_reference
from tests.test_fast_runs import assert_as_reference, machines, run_paused, workload

PREFILL_FIRST = {
    "baseline": machines([ROLE_BOTH] * 3, [60000] * 3, limit=512, prefill_first=True),
    # prompt machines lent to the mixed pool decode, and pause their decodes there too
    "lent": machines([ROLE_PROMPT] * 3 + [ROLE_TOKEN], [90000] * 3 + [3000],
                     kinds=[0, 0, 1, 1], prefill_first=True),
    "paged": machines([ROLE_BOTH] * 2, [6000] * 2, limit=512, prefill_first=True,
                      kv_paged=True),
    # a Splitwise chunked design: whole prompts on a prompt machine without decodes, chunks
    # (mixed, never paused) where it decodes
    "splitwise-chunked": machines([ROLE_PROMPT] * 2 + [ROLE_TOKEN] * 2,
                                  [9000] * 2 + [6000] * 2, kinds=[0, 0, 1, 1],
                                  chunk_tokens=256, prefill_first=True),
}


@pytest.mark.parametrize("name", sorted(PREFILL_FIRST))
@pytest.mark.parametrize("seed", range(2))
def test_prefill_first_runs_match_the_reference(name, seed):
    m = PREFILL_FIRST[name]
    w = workload(200, seed, rate=20.0, prompt=(1, 1500), output=(20, 300))
    fast, decode_ticks, _ = run_paused(w, m)
    assert decode_ticks > 5           # decode runs were in flight
    assert_as_reference(fast, w, m)
    mixed = simulate_reference(w, dataclasses.replace(m, prefill_first=False))
    # the rule mattered, except where every iteration beside decodes is chunked (never paused)
    same = np.array_equal(mixed["finish_s"], fast["finish_s"])
    assert same == (name == "splitwise-chunked")


def test_prefill_first_with_failures_matches_the_reference():
    failures = np.array([[3.0, 2, 4.0], [5.5, 0, 2.0], [9.25, 1, np.inf]])
    for regenerate in (False, True):
        m = dataclasses.replace(PREFILL_FIRST["baseline"], failures=failures, detection_s=0.5,
                                regenerate=regenerate)
        w = workload(250, 7, rate=15.0, prompt=(1, 1500), output=(20, 300))
        fast, _, _ = run_paused(w, m)
        assert fast["recoveries"].sum() > 0
        assert_as_reference(fast, w, m)


FLAT = LatencyCurves(np.array([1.0, 8192.0]), np.array([0.1, 0.1]), np.array([1.0, 64.0]),
                     np.array([0.01, 0.01]), 0.0)


def test_a_prompt_pauses_the_running_decode():
    """One machine: A (prompt 16, 30 tokens) decodes when B's prompt arrives. Prefill first,
    B's prompt runs alone (0.1 s) and A's gap across it is the prompt's time plus a decode
    step; mixed, A's token comes with B's prompt in one iteration and no gap is longer than
    that iteration."""
    w = Workload("t", np.array([0.0, 0.25]), np.array([16, 16]), np.array([30, 10]))
    m = dataclasses.replace(machines([ROLE_BOTH], [10000]), curves=(FLAT, FLAT))
    paused = dataclasses.replace(m, prefill_first=True)
    trace: list = []
    ref = simulate_reference(w, paused, trace)
    b_prompt = next(t for t in trace if any(c[0] == 1 for c in t["chunks"]))
    assert b_prompt["decodes"] == []                      # A waited
    a_ends = [t["end"] for t in trace if 0 in t["decodes"]]
    gap = min(e for e in a_ends if e > b_prompt["start"]) - max(
        e for e in a_ends if e <= b_prompt["start"])
    assert gap == pytest.approx(0.1 + 0.01)               # B's prompt, then A's step
    assert ref["itl_histogram"][itl_bin(gap)] >= 1
    mixed_trace: list = []
    mixed = simulate_reference(w, m, mixed_trace)
    together = next(t for t in mixed_trace if any(c[0] == 1 for c in t["chunks"]))
    assert together["decodes"] == [0]
    assert ref["finish_s"][0] > mixed["finish_s"][0]      # A finishes later when paused
    fast, _, _ = run_paused(w, paused, pauses=10)
    assert_as_reference(fast, w, paused)


def test_mixed_is_the_default_and_the_engine_decides():
    from provisioner.presets import preset_sim_options
    assert not SimOptions().prefill_first
    assert preset_sim_options("provision", None, engine="sglang").prefill_first
    assert not preset_sim_options("provision", None, engine="vllm").prefill_first
    assert not preset_sim_options("provision", None, engine="trtllm").prefill_first
    assert not preset_sim_options("splitwise-sim", None, engine="sglang").prefill_first
    assert preset_sim_options("provision", None, batching="prefill-first").prefill_first
    assert not preset_sim_options("provision", None, batching="mixed",
                                  engine="sglang").prefill_first


# ---------------------------------------------------------------------------- random clusters
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from strategies import (TIGHT_RESERVE, assert_engines_agree, both_engines, clusters,  # noqa: E402
                        failure_options, fit, perf_models, schedules, workloads)

prefill_first_options = st.builds(
    SimOptions, prompt_token_limit=st.sampled_from([512, 2048]),
    mixed_pool_queue_threshold=st.sampled_from([0, 2048, 8192]),
    memory_reserve_fraction=TIGHT_RESERVE, kv_admission=st.sampled_from(["reserve", "paged"]),
    prefill_first=st.just(True))


@settings(max_examples=60, deadline=None)
@given(cluster=clusters(), workload=workloads(), perf=perf_models, opts=prefill_first_options)
def test_prefill_first_engines_agree_on_random_clusters(cluster, workload, perf, opts):
    fast, ref = both_engines(cluster, workload, perf, opts)
    assert_engines_agree(fast, ref)


@settings(max_examples=30, deadline=None)
@given(cluster=clusters(), workload=workloads(), perf=perf_models, opts=failure_options,
       schedule=schedules())
def test_prefill_first_engines_agree_under_failures(cluster, workload, perf, opts, schedule):
    opts = dataclasses.replace(opts, failures=fit(schedule, cluster), prefill_first=True)
    fast, ref = both_engines(cluster, workload, perf, opts)
    assert_engines_agree(fast, ref, close=("busy_s", "mixed_pool_s"), atol=1e-9)
