"""Prefix caching's host tier and the token machine's seeded cache (issue 41; simcore.refsim
"Prefix caching"): blocks evicted from HBM move to a host LRU (`MachineArrays.prefix_host_bytes`
per instance), a lookup continues there and the blocks it finds load back over PCIe, their
time added to the iteration that starts the prefill; a KV cache that reaches its token machine
seeds that machine's cache.

The fast core must agree with the reference request by request, host hits included, on the
clusters of tests/test_prefix_cache.py (routing, failures, random loads); a small case of
each is checked by hand; a tier too small for a block changes nothing; on a slice of the
Mooncake conversation trace (skipped without ../shared) a host tier raises the hit rate."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore import Workload
from simcore.cluster import ROLE_BOTH, ROLE_PROMPT, ROLE_TOKEN
from simcore.fast import setup
from simcore.refsim import simulate_reference
from tests.test_fast_runs import assert_as_reference, machines, run_paused
from tests.test_prefix_cache import (BLOCK, CLUSTERS, CONVERSATION, LINEAR, ROUTED,
                                     conversation_slice, hit_rate, shared_prefixes)

KV_BYTES = 2_000_000  # the test machines' KV bytes per token (tests/test_fast_runs.machines)


def with_host(m, blocks: int, block: int = BLOCK, link: float = 25e9):
    """The cluster with a host tier of `blocks` blocks of `block` tokens per machine."""
    return dataclasses.replace(m, prefix_host_bytes=float(blocks * block * KV_BYTES),
                               host_link_bytes_per_s=np.full(m.count, link))


def host_hits(result) -> int:
    return int(result["prefix_host_hit_tokens"].sum())


@pytest.mark.parametrize("name", sorted(CLUSTERS))
@pytest.mark.parametrize("seed", range(2))
def test_host_tier_runs_match_the_reference(name, seed):
    m = with_host(CLUSTERS[name], 40)
    w = shared_prefixes(200, seed, rate=12.0, output=(20, 200))
    fast, _, _ = run_paused(w, m)
    assert host_hits(fast) > 0
    assert_as_reference(fast, w, m)


@pytest.mark.parametrize("name", sorted(ROUTED))
def test_host_tier_with_prefix_aware_routing_matches_the_reference(name):
    m = with_host(ROUTED[name], 25)
    w = shared_prefixes(200, 5, rate=12.0, output=(20, 200))
    fast, _, _ = run_paused(w, m)
    assert_as_reference(fast, w, m)


def test_host_tier_with_failures_matches_the_reference():
    failures = np.array([[3.0, 2, 4.0], [5.5, 0, 2.0], [9.25, 3, np.inf]])
    m = with_host(dataclasses.replace(CLUSTERS["splitwise-chunked-paged"], failures=failures,
                                      detection_s=0.5), 30)
    w = shared_prefixes(250, 7, rate=15.0, output=(20, 300))
    fast, _, _ = run_paused(w, m)
    assert fast["recoveries"].sum() > 0 and host_hits(fast) > 0
    assert_as_reference(fast, w, m)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), name=st.sampled_from(sorted(CLUSTERS)),
       routing=st.booleans(), prefill_first=st.booleans(), block=st.sampled_from([16, 64, 512]),
       rate=st.sampled_from([3.0, 12.0, 40.0]), shrink=st.sampled_from([1, 2, 3]),
       host=st.sampled_from([1, 3, 40, 10_000]), link=st.sampled_from([1e9, 25e9]))
def test_host_tier_matches_the_reference_on_any_cluster(seed, name, routing, prefill_first,
                                                        block, rate, shrink, host, link):
    m = dataclasses.replace(CLUSTERS[name], prefix_routing=routing, prefill_first=prefill_first)
    m = with_host(dataclasses.replace(m, kv_capacity=m.kv_capacity // shrink + 3000), host,
                  block, link)
    w = shared_prefixes(60, seed, rate, documents=1 + seed % 6, output=(1, 120), block=block)
    fast, _, _ = run_paused(w, m, pauses=5)
    assert_as_reference(fast, w, m)


def test_a_host_tier_smaller_than_a_block_changes_nothing():
    """Less host memory than one block's KV holds no block: the run is the run without the
    tier, and reports no host hits."""
    w = shared_prefixes(150, 3, rate=12.0, output=(20, 200))
    for name, m in CLUSTERS.items():
        tiny = dataclasses.replace(with_host(m, 1), prefix_host_bytes=BLOCK * KV_BYTES - 1.0)
        expected = simulate_reference(w, m)
        for run in (simulate_reference(w, tiny), setup.simulate_fast(w, tiny)):
            assert run.keys() == expected.keys(), name
            for key in expected:
                np.testing.assert_array_equal(run[key], expected[key], err_msg=f"{name} {key}")


def test_a_block_evicted_from_hbm_is_found_in_host_memory_by_hand():
    """One machine of 2,200 KV tokens, blocks of 512 tokens (1.024 GB of KV each), a host tier
    of two blocks loaded at 2.048 GB/s (0.5 s a block); a prompt of x tokens takes x ms.

    A (1,024 tokens, blocks 0 1) at 0 s: cached [1 0] after it. B (1,024, blocks 5 6) at 10 s:
    inserting 6 5 leaves room for 2 (2,200 - 1,025 held), so 1 then 0 move to host [1 0].
    C (1,100, blocks 0 1 2) at 20 s: none in HBM, 0 and 1 in host: a hit of 1,024 tokens, all
    loaded (1 s) before its 76 tokens (76 ms): TTFT 1.076 s. Loading them pushes 6 and 5 to
    host [6 5]; C's insertion pushes 2 there, and the host, holding two, drops 6. D (100, block
    6) at 30 s: 6 is gone (the host evicted it at its capacity), no hit: 0.1 s. E (1,024, blocks
    0 1) at 40 s: trimmed to room for 2, [1 0 6] sends 1 to host; 0 is in HBM, 1 in host: a
    hit of 1,023 tokens (a prefill computes one), 511 of them loaded (0.499 s), then 1 ms."""
    m = dataclasses.replace(machines([ROLE_BOTH], [2200], prefix_cache=True), curves=(LINEAR,),
                            prefix_host_bytes=2 * 512 * KV_BYTES,
                            host_link_bytes_per_s=np.array([2.048e9]))
    w = Workload("hand", np.arange(5) * 10.0, np.array([1024, 1024, 1100, 100, 1024]),
                 np.ones(5, np.int64),
                 prefix_blocks=np.array([0, 1, 5, 6, 0, 1, 2, 6, 0, 1]),
                 prefix_offsets=np.array([0, 2, 4, 7, 8, 10]), prefix_block_tokens=512)
    for run in (simulate_reference(w, m), setup.simulate_fast(w, m)):
        ttft = run["first_token_s"] - w.arrival_s
        np.testing.assert_allclose(ttft, [1.024, 1.024, 1.076, 0.1, 0.001 + 511 / 1024])
        assert run["prefix_hit_tokens"].tolist() == [1024 + 1023]
        assert run["prefix_host_hit_tokens"].tolist() == [1024 + 511]
    without = dataclasses.replace(m, prefix_host_bytes=0.0)
    for run in (simulate_reference(w, without), setup.simulate_fast(w, without)):
        assert run["prefix_hit_tokens"].tolist() == [512]  # E finds block 0 only: C's
        assert "prefix_host_hit_tokens" not in run              # 0 1 were lost, D found none


def test_a_transferred_kv_seeds_the_token_machine_by_hand():
    """One prompt and one token machine, a mixed pool with a small queue threshold. A (1,024
    tokens, blocks 0 1) at 0 s prefills on the prompt machine; its KV reaches the token
    machine, whose cache it seeds. At 5 s B and C (1,100 tokens, blocks 0 1 2 and 0 1 3)
    arrive together: B queues on the prompt machine (a hit there), then its queue is long, so
    the token machine joins the mixed pool and prefills C: C finds A's blocks, which the token
    machine never prefilled (1,024 tokens: without the seeding, none)."""
    m = dataclasses.replace(machines([ROLE_PROMPT, ROLE_TOKEN], [100_000] * 2, kinds=[0, 0],
                                     prefix_cache=True), curves=(LINEAR,), queue_threshold=1000)
    w = Workload("seed", np.array([0.0, 5.0, 5.0]), np.array([1024, 1100, 1100]),
                 np.array([20, 2, 2]), prefix_blocks=np.array([0, 1, 0, 1, 2, 0, 1, 3]),
                 prefix_offsets=np.array([0, 2, 5, 8]), prefix_block_tokens=512)
    for run in (simulate_reference(w, m), setup.simulate_fast(w, m)):
        assert run["prompt_machine"].tolist() == [0, 0, 1]
        assert run["prefix_hit_tokens"].tolist() == [1024, 1024]


def test_the_cli_reports_host_hits_and_is_deterministic(tmp_path, cli, bad_input):
    """--prefix-host-memory on a Mooncake trace: the host tier's share is printed and in
    --json, the same twice; without --prefix-cache the option is bad input."""
    from tests.test_mooncake import ROWS, write
    path = write(tmp_path / "t.jsonl", ROWS * 3)
    base = ["simulate", "--workload", path, "--model", "llama-3.1-8b", "--design",
            "baseline-h100", "--machines", "1", "--prefix-cache", "on",
            "--prefix-host-memory", "64"]
    out = cli(base)
    assert out.code == 0, out.stderr
    assert "of which in host memory" in out.stdout
    runs = [cli(base + ["--json"]).stdout for _ in range(2)]
    assert runs[0] == runs[1]
    summary = json.loads(runs[0])
    assert 0 <= summary["prefix_host_hit_rate"] <= summary["prefix_hit_rate"]
    assert "prefix_host_hit_rate" in summary["pools"]["machines"]
    plain = json.loads(cli(base[:-2] + ["--json"]).stdout)
    assert "prefix_host_hit_rate" not in plain
    line = bad_input(cli(base[:-4] + ["--prefix-host-memory", "64"]), "--prefix-host-memory")
    assert "--prefix-cache" in line


@pytest.mark.skipif(not CONVERSATION.exists(), reason="needs ../shared/traces/mooncake")
def test_a_host_tier_raises_the_mooncake_hit_rate():
    """Eight small instances (140k KV tokens each, the smallest cache of
    tests/test_prefix_cache.py): host tiers of 0, 100 and 1,000 blocks' worth each find more
    and more prefixes, all below the infinite-cache bound."""
    w, bound = conversation_slice()
    m = machines([ROLE_BOTH] * 8, [140_000] * 8, limit=8192, prefix_cache=True)
    rates, hosts = [], []
    for blocks in (0, 100, 1000):
        run = setup.simulate_fast(w, with_host(m, blocks, w.prefix_block_tokens))
        rates.append(hit_rate(run))
        hosts.append(host_hits(run) if blocks else 0)
    assert rates[0] < rates[1] < rates[2] < bound
    assert 0 == hosts[0] < hosts[1] < hosts[2]
    small = w.head(300)
    tiered = with_host(m, 100, w.prefix_block_tokens)
    ref, fast = simulate_reference(small, tiered), setup.simulate_fast(small, tiered)
    for key in ref:
        np.testing.assert_array_equal(fast[key], ref[key], err_msg=key)


def test_token_machines_never_look_up_without_a_mixed_pool():
    """The seeding changes nothing where token machines never prefill: a Splitwise run without
    mixed pool, failures or preemption makes no lookup on a token machine, seeded or not."""
    m = dataclasses.replace(with_host(CLUSTERS["splitwise"], 40), mixed_pool=False)
    w = shared_prefixes(200, 1, rate=12.0, output=(20, 200))
    token = m.role == ROLE_TOKEN
    for run in (simulate_reference(w, m), setup.simulate_fast(w, m)):
        assert run["prefix_tokens"][token].sum() == 0
        assert run["prefix_hit_tokens"][~token].sum() > 0


def test_a_host_tier_run_types_the_core_as_any_other():
    """With a tier, without one, without the cache: the same types (the tier's state lives in
    the cache's arrays), so the install-time build's one signature per entry point serves all."""
    w = shared_prefixes(30, 1, rate=5.0)
    for m in (with_host(CLUSTERS["baseline"], 5), CLUSTERS["baseline"],
              dataclasses.replace(CLUSTERS["baseline"], prefix_cache=False)):
        setup.simulate_fast(w, m)
    for entry in (setup._run, setup._fill_requests, setup._fill_pools):
        if hasattr(entry, "nopython_signatures"):  # (the JIT build, not the install-time one)
            assert len(entry.nopython_signatures) == 1
