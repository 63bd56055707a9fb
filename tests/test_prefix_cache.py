"""Prefix caching (issue 41; `SimOptions.prefix_cache`, simcore.refsim "Prefix caching"): each
machine's LRU cache of the prompt blocks it prefilled, in the KV memory its requests leave free;
a prefill computes only the tokens past its longest cached prefix.

The fast core must agree with the reference request by request, hit counts included, on
workloads whose prompts share prefixes (colocated, Splitwise, chunked, paged, with failures,
paused as in tests/test_fast_runs.py); a small case is checked by hand; on a slice of the
Mooncake conversation trace (skipped without ../shared) the simulated hit rate stays below the
infinite-cache bound and rises with the cache's room. Without the option, or without blocks,
nothing changes."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore import LatencyCurves, Workload
from simcore.cluster import ROLE_BOTH, ROLE_PROMPT, ROLE_TOKEN
from simcore.fast import setup
from simcore.refsim import simulate_reference
from tests.test_fast_runs import assert_as_reference, machines, run_paused, workload

BLOCK = 64


def shared_prefixes(n, seed, rate, documents=6, output=(1, 60), block=BLOCK):
    """Requests over a few long documents: each prompt is a leading part of one document (its
    blocks the document's first ones) and, half the time, a tail of its own."""
    rng = np.random.default_rng(seed)
    base = workload(n, seed, rate, prompt=(1, 2), output=output)
    longest = max(2, min(40, 2560 // block))  # prompts within every machine's memory
    prompts, ids, offsets = [], [], [0]
    unique = documents * longest
    for _ in range(n):
        d = int(rng.integers(documents))
        shared = int(rng.integers(1, longest))
        blocks = [d * longest + j for j in range(shared)]
        tokens = shared * block
        if rng.random() < 0.5:
            blocks.append(unique)
            unique += 1
            tokens += int(rng.integers(1, block + 1))
        else:
            tokens -= int(rng.integers(0, block))
        prompts.append(tokens)
        ids += blocks
        offsets.append(len(ids))
    return Workload("shared", base.arrival_s, np.array(prompts, np.int64), base.output_tokens,
                    prefix_blocks=np.array(ids, np.int64), prefix_offsets=np.array(offsets),
                    prefix_block_tokens=block)


CLUSTERS = {
    "baseline": machines([ROLE_BOTH] * 3, [20000] * 3, limit=1024, prefix_cache=True),
    "splitwise": machines([ROLE_PROMPT] * 2 + [ROLE_TOKEN], [9000] * 2 + [60000],
                          kinds=[0, 0, 1], prefix_cache=True),
    "lent": machines([ROLE_PROMPT] * 3 + [ROLE_TOKEN], [9000] * 3 + [3000], kinds=[0, 0, 1, 1],
                     prefix_cache=True),
    "chunked": dataclasses.replace(machines([ROLE_BOTH] * 2, [9000] * 2, kinds=[0, 1],
                                            prefix_cache=True), chunk_tokens=256),
    "paged": machines([ROLE_BOTH] * 3, [6000] * 3, limit=512, kv_paged=True, prefix_cache=True),
    "splitwise-chunked-paged": dataclasses.replace(
        machines([ROLE_PROMPT] * 2 + [ROLE_TOKEN] * 2, [9000] * 2 + [6000] * 2,
                 kinds=[0, 0, 1, 1], kv_paged=True, prefix_cache=True), chunk_tokens=256),
}


ROUTED = {name: dataclasses.replace(m, prefix_routing=True) for name, m in CLUSTERS.items()}


def hit_rate(result) -> float:
    return result["prefix_hit_tokens"].sum() / result["prefix_tokens"].sum()


@pytest.mark.parametrize("name", sorted(CLUSTERS))
@pytest.mark.parametrize("seed", range(2))
def test_prefix_cache_runs_match_the_reference(name, seed):
    m = CLUSTERS[name]
    w = shared_prefixes(200, seed, rate=12.0, output=(20, 200))
    fast, _, _ = run_paused(w, m)
    assert 0.05 < hit_rate(fast) < 1
    assert_as_reference(fast, w, m)


@pytest.mark.parametrize("seed", range(8))
def test_prefix_cache_matches_the_reference_on_random_loads(seed):
    rng = np.random.default_rng(100 + seed)
    m = CLUSTERS[sorted(CLUSTERS)[seed % len(CLUSTERS)]]
    m = dataclasses.replace(m, kv_capacity=m.kv_capacity // int(rng.integers(1, 4)) + 3000)
    w = shared_prefixes(int(rng.integers(20, 120)), seed, rate=float(rng.choice([3.0, 30.0])),
                        documents=int(rng.integers(1, 8)), output=(1, 100),
                        block=int(rng.choice([16, 64, 512])))
    fast, _, _ = run_paused(w, m, pauses=7)
    assert_as_reference(fast, w, m)


@pytest.mark.parametrize("name", sorted(ROUTED))
@pytest.mark.parametrize("seed", range(2))
def test_prefix_aware_routing_matches_the_reference(name, seed):
    m = ROUTED[name]
    w = shared_prefixes(200, seed, rate=12.0, output=(20, 200))
    fast, _, _ = run_paused(w, m)
    assert_as_reference(fast, w, m)
    plain = setup.simulate_fast(w, CLUSTERS[name])
    if name in ("baseline", "chunked", "paged", "splitwise"):  # sessions stay with their
        assert hit_rate(fast) > hit_rate(plain)                # prefix
    # (with small token machines the mixed pool lends prompt machines out, chosen by load
    # alone, so the hit rate can go either way)


def test_prefix_aware_routing_with_failures_matches_the_reference():
    failures = np.array([[3.0, 2, 4.0], [5.5, 0, 2.0], [9.25, 1, np.inf]])
    m = dataclasses.replace(ROUTED["baseline"], failures=failures, detection_s=0.5)
    w = shared_prefixes(250, 8, rate=15.0, output=(20, 300))
    fast, _, _ = run_paused(w, m)
    assert fast["recoveries"].sum() > 0
    assert_as_reference(fast, w, m)


def test_prefix_aware_routing_by_hand():
    """Two idle machines. A (1024 tokens, blocks 0 1) at 0 s: a tie, machine 0, which caches
    its blocks. At 5 s B (200 tokens, blocks 5 6): no prefix anywhere, a tie again, machine 0
    (load 200 pending + 201 committed). Then C (1100 tokens, blocks 0 1 2): machine 0's load
    401 less its cached 1024 beats machine 1's 0, so C joins B there and hits 1024 tokens;
    without prefix-aware routing C goes to the idle machine 1 and hits nothing."""
    m = dataclasses.replace(machines([ROLE_BOTH] * 2, [100_000] * 2, prefix_cache=True,
                                     prefix_routing=True), curves=(LINEAR,))
    w = Workload("hand", np.array([0.0, 5.0, 5.0]), np.array([1024, 200, 1100]),
                 np.array([1, 1, 1]), prefix_blocks=np.array([0, 1, 5, 6, 0, 1, 2]),
                 prefix_offsets=np.array([0, 2, 4, 7]), prefix_block_tokens=512)
    for run in (simulate_reference(w, m), setup.simulate_fast(w, m)):
        assert run["prompt_machine"].tolist() == [0, 0, 0]
        assert run["prefix_hit_tokens"].tolist() == [1024, 0]
    plain = dataclasses.replace(m, prefix_routing=False)
    for run in (simulate_reference(w, plain), setup.simulate_fast(w, plain)):
        assert run["prompt_machine"].tolist() == [0, 0, 1]
        assert run["prefix_hit_tokens"].tolist() == [0, 0]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), name=st.sampled_from(sorted(CLUSTERS)),
       routing=st.booleans(), prefill_first=st.booleans(), block=st.sampled_from([16, 64, 512]),
       rate=st.sampled_from([3.0, 12.0, 40.0]), shrink=st.sampled_from([1, 2, 3]))
def test_prefix_cache_matches_the_reference_on_any_cluster(seed, name, routing, prefill_first,
                                                           block, rate, shrink):
    m = dataclasses.replace(CLUSTERS[name], prefix_routing=routing, prefill_first=prefill_first)
    m = dataclasses.replace(m, kv_capacity=m.kv_capacity // shrink + 3000)
    w = shared_prefixes(60, seed, rate, documents=1 + seed % 6, output=(1, 120), block=block)
    fast, _, _ = run_paused(w, m, pauses=5)
    assert_as_reference(fast, w, m)


def test_prefix_cache_with_failures_matches_the_reference():
    failures = np.array([[3.0, 2, 4.0], [5.5, 0, 2.0], [9.25, 3, np.inf]])
    m = dataclasses.replace(CLUSTERS["splitwise-chunked-paged"], failures=failures,
                            detection_s=0.5)
    w = shared_prefixes(250, 7, rate=15.0, output=(20, 300))
    fast, _, _ = run_paused(w, m)
    assert fast["recoveries"].sum() > 0 and hit_rate(fast) > 0.05
    assert_as_reference(fast, w, m)


def test_without_the_option_or_blocks_nothing_changes():
    w = shared_prefixes(150, 3, rate=12.0, output=(20, 200))
    plain = Workload(w.name, w.arrival_s, w.prompt_tokens, w.output_tokens)
    for name, m in CLUSTERS.items():
        off = dataclasses.replace(m, prefix_cache=False)
        expected = simulate_reference(plain, off)
        for run in (simulate_reference(w, off), setup.simulate_fast(w, off),
                    simulate_reference(plain, m), setup.simulate_fast(plain, m)):
            assert run.keys() == expected.keys(), name
            for key in expected:
                np.testing.assert_array_equal(run[key], expected[key], err_msg=f"{name} {key}")


LINEAR = LatencyCurves(np.array([1.0, 8192.0]), np.array([0.001, 8.192]), np.array([1.0, 64.0]),
                       np.array([0.01, 0.01]), 0.0)  # a prompt of x tokens: x ms


@pytest.mark.parametrize("chunk_tokens", [0, 4096])
def test_a_shared_prefix_is_prefilled_once_by_hand(chunk_tokens):
    """One machine; A (1024 tokens, blocks 0 1) at 0, then B (1100 tokens, blocks 0 1 2) at 10 s:
    B finds A's two blocks (1024 tokens) and prefills only its 76 others: 76 ms, not 1.1 s. C
    (600 tokens, blocks 5 6) shares nothing; D (1024 tokens, blocks 0 1) is all cached but
    computes its last token."""
    m = dataclasses.replace(machines([ROLE_BOTH], [100_000], prefix_cache=True),
                            curves=(LINEAR,), chunk_tokens=chunk_tokens)
    w = Workload("hand", np.array([0.0, 10.0, 20.0, 30.0]), np.array([1024, 1100, 600, 1024]),
                 np.array([1, 1, 1, 1]), prefix_blocks=np.array([0, 1, 0, 1, 2, 5, 6, 0, 1]),
                 prefix_offsets=np.array([0, 2, 5, 7, 9]), prefix_block_tokens=512)
    for run in (simulate_reference(w, m), setup.simulate_fast(w, m)):
        ttft = run["first_token_s"] - w.arrival_s
        np.testing.assert_allclose(ttft, [1.024, 0.076, 0.600, 0.001])
        assert run["prefix_hit_tokens"].tolist() == [1024 + 1023]
        assert run["prefix_tokens"].tolist() == [1024 + 1100 + 600 + 1024]


def test_a_full_memory_leaves_no_room_for_the_cache():
    """The cache's room is the KV memory its admitted requests leave: a machine whose only
    request holds all of it keeps no block, so B, arriving while A decodes, finds none."""
    m = dataclasses.replace(machines([ROLE_BOTH], [1100 + 1000], prefix_cache=True),
                            curves=(LINEAR,))
    w = Workload("full", np.array([0.0, 1.5]), np.array([1024, 1024]), np.array([1000, 5]),
                 prefix_blocks=np.array([0, 1, 0, 1]), prefix_offsets=np.array([0, 2, 4]),
                 prefix_block_tokens=512)
    for run in (simulate_reference(w, m), setup.simulate_fast(w, m)):
        assert run["prefix_hit_tokens"].tolist() == [0]


def test_block_ids_are_any_64_bit_ids():
    """The caches hash block ids, so ids far apart and above 2**32 (a streamed run's global
    ids) give the same run as the dense ids they stand for."""
    w = shared_prefixes(150, 5, rate=12.0, output=(20, 200))
    spread = (w.prefix_blocks * 7_919 + 1) << 33 | w.prefix_blocks  # distinct, up to 2**62
    far = dataclasses.replace(w, prefix_blocks=spread)
    for name in ("splitwise-chunked-paged", "baseline"):
        dense = setup.simulate_fast(w, ROUTED[name])
        wide = setup.simulate_fast(far, ROUTED[name])
        for key in dense:
            np.testing.assert_array_equal(wide[key], dense[key], err_msg=f"{name} {key}")
    assert_as_reference(setup.simulate_fast(far, ROUTED["baseline"]), far, ROUTED["baseline"])


def test_the_caches_memory_does_not_grow_with_the_runs_distinct_blocks():
    """A cache's slots are its capacity's blocks, its host tier's and one request's: ten times
    the distinct blocks (every request's own) take no more memory, and the run still matches
    the reference (its slots reused many times over, its table's entries deleted as often)."""
    m = dataclasses.replace(CLUSTERS["splitwise"], kv_capacity=np.array([3000, 3000, 9000]))
    sizes = []
    for n in (60, 600):
        base = shared_prefixes(n, 2, rate=30.0, output=(1, 30), documents=1)
        own = np.arange(len(base.prefix_blocks), dtype=np.int64)  # no block shared
        w = dataclasses.replace(base, prefix_blocks=own)
        state = setup.new_state(m, setup._new_requests(w), w)
        sizes.append(sum(a.nbytes for a in state.prefix[2:]))
        assert state.prefix.block.shape == (3, setup.cache_slots(
            m, BLOCK, int(np.diff(w.prefix_offsets).max())))
    assert sizes[0] == sizes[1]
    assert_as_reference(setup.simulate_fast(w, m), w, m)


def test_the_cache_structure_is_an_lru_by_id():
    """The slot pool and its hash table against a dictionary kept in recency order, on random
    ids drawn from a few values and from all of int64, with a host tier: the same blocks in
    the same tiers in the same order after every step."""
    from collections import OrderedDict
    from simcore.fast import prefix as core
    rng = np.random.default_rng(4)
    m = dataclasses.replace(machines([ROLE_BOTH], [BLOCK * 12], prefix_cache=True),
                            prefix_host_bytes=2_000_000 * BLOCK * 5,
                            host_link_bytes_per_s=np.array([1e9]))
    caches = setup.empty_caches(m, BLOCK, 8)
    hbm, host = OrderedDict(), OrderedDict()
    pool = np.concatenate([np.arange(30), rng.integers(0, 2**62, 30)])
    for step in range(3000):
        if step % 97 == 0:
            core._clear_cache(caches, 0)
            hbm.clear()
            host.clear()
        for b in rng.choice(pool, int(rng.integers(1, 9))):
            core._to_hbm(caches, 0, int(b))
            host.pop(int(b), None)
            hbm[int(b)] = None
            hbm.move_to_end(int(b))
        room = int(rng.integers(0, 13))
        core._evict_to(caches, 0, room)
        while len(hbm) > room:
            host[hbm.popitem(last=False)[0]] = None
        while len(host) > 5:
            host.popitem(last=False)
        for tier, expected in ((1, hbm), (2, host)):
            assert walk(caches, 3 * (tier - 1)) == list(expected)
            assert all(core._tier(caches, 0, b) == tier for b in expected)
        assert all(core._tier(caches, 0, int(b)) == 0 for b in pool
                   if int(b) not in hbm and int(b) not in host)


def walk(caches, end):
    """A tier's block ids, least recently used first (ends' columns from `end`)."""
    blocks, s = [], caches.ends[0, end]
    while s != -1:
        blocks.append(int(caches.block[0, s]))
        s = caches.next[0, s]
    assert len(blocks) == caches.ends[0, end + 2]
    return blocks


# ---------------------------------------------------------------------------- Mooncake

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake"
CONVERSATION = TRACES / "conversation_trace.jsonl"


def conversation_slice(n: int = 1500):
    """The conversation trace's first n requests from time 0, with their blocks, and their
    infinite-cache bound."""
    from provisioner.mooncake import prefix_reuse, read_mooncake
    trace = read_mooncake(CONVERSATION)
    w = trace.workload.head(n)
    w = Workload(w.name, w.arrival_s - w.arrival_s[0], w.prompt_tokens, w.output_tokens,
                 w.notes, w.prefix_blocks, w.prefix_offsets, w.prefix_block_tokens)
    return w, prefix_reuse(trace.blocks[:n], w.prompt_tokens)


@pytest.mark.skipif(not CONVERSATION.exists(), reason="needs ../shared/traces/mooncake")
def test_mooncake_hit_rate_is_below_the_bound_and_grows_with_the_cache():
    w, bound = conversation_slice()
    rates = []
    for capacity in (140_000, 1_000_000, 4_000_000):  # 1,500 requests: 3.6%, 7.0%, 9.8%
        m = machines([ROLE_BOTH] * 8, [capacity] * 8, limit=8192, prefix_cache=True)
        run = setup.simulate_fast(w, m)
        rates.append(hit_rate(run))
    assert 0 < rates[0] < rates[1] < rates[2] < bound  # (bound: 27%)
    routed = hit_rate(setup.simulate_fast(w, dataclasses.replace(m, prefix_routing=True)))
    assert rates[2] < routed < bound
    ref = simulate_reference(w.head(300), m)
    fast = setup.simulate_fast(w.head(300), m)
    for key in ref:
        np.testing.assert_array_equal(fast[key], ref[key], err_msg=key)


def test_the_mooncake_reader_gives_dense_block_ids(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1000, "output_length": 5, '
                    '"hash_ids": [70, 12]}\n'
                    '{"timestamp": 9, "input_length": 10, "output_length": 5, "hash_ids": []}\n'
                    '{"timestamp": 3, "input_length": 1100, "output_length": 5, '
                    '"hash_ids": [70, 12, 99]}\n')
    from provisioner.mooncake import read_mooncake
    w = read_mooncake(path).workload
    assert w.prefix_block_tokens == 512
    assert [w.request_blocks(i).tolist() for i in range(3)] == [[1, 0], [1, 0, 2], []]
    assert w.head(2).prefix_offsets.tolist() == [0, 2, 5]


def test_a_prefix_run_types_the_core_as_any_other():
    """Placeholders when off, real caches when on: the same types, so the install-time build's
    one signature per entry point (tests/test_aot.py) serves both."""
    w = shared_prefixes(30, 1, rate=5.0)
    for m in (CLUSTERS["baseline"], ROUTED["splitwise"],
              dataclasses.replace(CLUSTERS["baseline"], prefix_cache=False)):
        setup.simulate_fast(w, m)
    # and a streamed run's caches, their ring of ids grown chunk by chunk
    chunks = [(w.arrival_s[i:i + 5], w.prompt_tokens[i:i + 5], w.output_tokens[i:i + 5], None,
               w.prefix_blocks[w.prefix_offsets[i]:w.prefix_offsets[min(i + 5, len(w))]],
               w.prefix_offsets[i:i + 6] - w.prefix_offsets[i]) for i in range(0, len(w), 5)]
    setup.run_streamed(ROUTED["baseline"], chunks, 16, lambda first, records, hits: None,
                       BLOCK, int(np.diff(w.prefix_offsets).max()))
    for entry in (setup._run, setup._fill_requests, setup._fill_pools):
        if hasattr(entry, "nopython_signatures"):  # (the JIT build, not the install-time one)
            assert len(entry.nopython_signatures) == 1


def test_simulate_prints_the_hit_rate(tmp_path, cli):
    """--prefix-cache on a Mooncake trace replayed as recorded: the share of prefill tokens
    found cached is printed and in --json; off (the default) says nothing of it."""
    import json
    from tests.test_mooncake import ROWS, write
    path = write(tmp_path / "t.jsonl", ROWS * 3)
    base = ["simulate", "--workload", path, "--model", "llama-3.1-8b", "--design",
            "baseline-h100", "--machines", "1"]
    for value in ("on", "aware"):
        out = cli(base + ["--prefix-cache", value])
        assert out.code == 0, out.stderr
        assert "prefix cache: " in out.stdout and "of prefill tokens found cached" in out.stdout
        summary = json.loads(cli(base + ["--prefix-cache", value, "--json"]).stdout)
        assert 0 < summary["prefix_hit_rate"] < 1
        assert summary["pools"]["machines"]["prefix_hit_rate"] == summary["prefix_hit_rate"]
    out = cli(base)
    assert out.code == 0 and "prefix cache: " not in out.stdout
    # with --rate: a window of the trace's timeline scaled to the rate, its requests' blocks kept
    out = cli(base + ["--prefix-cache", "on", "--rate", "2", "--duration", "6"])
    assert out.code == 0 and "carry no prompt blocks" not in out.stderr
    assert "of prefill tokens found cached" in out.stdout and "window" in out.stdout
    assert "prefix_hit_rate" not in json.loads(cli(base + ["--json"]).stdout)


def sessions_trace(path: Path, sessions: int = 60, turns: int = 3) -> Path:
    """A Mooncake trace of chat sessions: one 4-block system prompt shared by all, each turn's
    prompt the session's earlier turns plus two new blocks (so a later turn's prefix is its
    earlier turns'), a turn every 0.25 s."""
    import json
    rows, t, unique = [], 0, 100
    for _ in range(sessions):
        own = []
        for turn in range(turns):
            own += [unique, unique + 1]
            unique += 2
            ids = [0, 1, 2, 3] + own
            rows.append({"timestamp": t, "input_length": 512 * len(ids) - 100,
                         "output_length": 60 + 10 * turn, "hash_ids": ids})
            t += 250
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_search_reports_what_the_cache_saved(tmp_path):
    """With --prefix-cache, the search also answers the question with the cache off and
    reports, per design, both optima and what the cache saved; each side is the optimum of
    that search on its own. Off, nothing of it is reported."""
    import provisioner
    from provisioner.tables import savings_rows
    question = dict(workload=str(sessions_trace(tmp_path / "s.jsonl")), model="llama-3.1-8b",
                    designs="baseline-h100,splitwise-hh", rate=400, duration=30,
                    verify_seeds=3)
    found = provisioner.search(prefix_cache="aware", **question).to_dict()
    plain = provisioner.search(**question).to_dict()
    assert plain["designs"][0]["optimum"] is not None
    for cached, off in zip(found["designs"], plain["designs"]):
        s, o = cached["prefix_cache_savings"], cached["optimum"]
        assert "prefix_cache_savings" not in off and "prefix_hit_rate" not in off["optimum"]
        for side, entry in (("with_cache", o), ("without_cache", off["optimum"])):
            for key in ("cost_per_hour", "power_kw", "rate_rps"):
                assert s[side][key] == entry[key]
            assert s[side].get("machines") == entry.get("machines")
            assert s[side].get("token_machines") == entry.get("token_machines")
        assert s["cost_saved_per_hour"] == pytest.approx(
            off["optimum"]["cost_per_hour"] - o["cost_per_hour"], abs=0.01)
        assert s["cost_saved"] == pytest.approx(
            1 - o["cost_per_hour"] / off["optimum"]["cost_per_hour"], abs=1e-4)
        assert 0.2 < o["prefix_hit_rate"] < 0.77   # under the trace's infinite-cache bound
    # sessions re-send 4 shared and 2 own blocks a turn: the cache saves machines somewhere
    assert any(d["prefix_cache_savings"]["cost_saved"] > 0.1 for d in found["designs"])
    rows = dict(savings_rows(found))
    assert set(rows) == {"baseline-h100", "splitwise-hh"}
    assert "of prefill tokens cached" in rows["splitwise-hh"][1]
    assert savings_rows(plain) == []
