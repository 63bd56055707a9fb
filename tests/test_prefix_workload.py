"""Workloads with prefixes from a stated session model (issue 41; simcore/sessions.py,
`--prefix-model`): shared system prompts, multi-turn sessions with think times.

Block ids share exactly what the model shares (a hand-checked case); a sample is a function
of its seed; its infinite-cache bound matches `provisioner.mooncake.prefix_reuse` run on its
blocks; both simulators agree on it with the cache on and with prefix-aware routing, which
finds more of it cached; bad values are refused in one line."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from provisioner.mooncake import prefix_reuse
from simcore.cluster import ROLE_BOTH
from simcore.fast import setup
from simcore.sessions import (BLOCK_TOKENS, infinite_cache_hit_share, parse_prefix_model,
                              session_blocks, synthesize_sessions)
from simcore.workload import SyntheticSizes, parse_lengths
from tests.test_fast_runs import assert_as_reference, machines
from tests.test_prefix_cache import hit_rate

SMALL = SyntheticSizes(parse_lengths("uniform:100-700"), parse_lengths("uniform:20-150"))
MODEL = parse_prefix_model("system=3:1100,turns=1-5,think=2")


def sample(seed=0, rate=6.0, duration=30.0, context=4096, model=MODEL, sizes=SMALL):
    return synthesize_sessions(sizes, model, context, rate, duration, seed)


def blocks_of(w):
    return [w.request_blocks(i).tolist() for i in range(len(w))]


def test_block_ids_share_exactly_the_shared_prefixes_by_hand():
    """Blocks of 4 tokens, system prompts of 6: request (system, session, prompt tokens)
    r0 (0, 0, 10): block 0 system 0's, block 1 (tokens 4-7: system and session text) session
    0's, block 2 (tokens 8-9, partial) its own; r1 (0, 0, 17), a later turn: blocks 0-1 as
    r0's, 2-3 session 0's (full now: r0's partial block 2 differed), 4 its own; r2 (0, 1, 9):
    system 0's block 0, then session 1's; r3 (1, 2, 8): system 1's block, session 2's."""
    ids, offsets = session_blocks(np.array([0, 0, 0, 1]), np.array([0, 0, 1, 2]),
                                  np.array([10, 17, 9, 8]), system_tokens=6, block=4)
    r0, r1, r2, r3 = (ids[offsets[i]:offsets[i + 1]].tolist() for i in range(4))
    assert offsets.tolist() == [0, 3, 8, 11, 13]           # ceil(prompt / 4) blocks each
    labels = {}
    for name, request in (("r0", r0), ("r1", r1), ("r2", r2), ("r3", r3)):
        for place, block in enumerate(request):
            labels.setdefault(block, []).append(f"{name}.{place}")
    shared = sorted(sorted(group) for group in labels.values() if len(group) > 1)
    assert shared == [["r0.0", "r1.0", "r2.0"], ["r0.1", "r1.1"]]
    assert sorted(labels) == list(range(len(labels)))      # dense ids 0..B-1


def test_a_system_prompt_of_whole_blocks_is_shared_whole():
    """System prompts of 8 tokens in blocks of 4: both of its blocks are shared by sessions
    with that system prompt; the first block past it is each session's."""
    ids, offsets = session_blocks(np.array([0, 0]), np.array([0, 1]), np.array([12, 13]),
                                  system_tokens=8, block=4)
    a, b = ids[:offsets[1]].tolist(), ids[offsets[1]:].tolist()
    assert a[:2] == b[:2] and a[2] != b[2] and len(set(a + b)) == 5


def test_a_sample_is_prefix_closed_and_cut_at_the_context():
    """An id stands for its whole prefix: it sits at one place, and two requests with the same
    id there have the same ids before it. No turn holds more than the context."""
    w = sample(seed=3, rate=10.0, duration=60.0, context=3000)
    assert w.prefix_block_tokens == BLOCK_TOKENS
    assert np.all(w.prompt_tokens + w.output_tokens <= 3000)
    assert np.all(np.diff(w.prefix_offsets) == -(-w.prompt_tokens // BLOCK_TOKENS))
    first = {}
    for request in blocks_of(w):
        for place, block in enumerate(request):
            seen = first.setdefault(block, (place, request[:place]))
            assert seen == (place, request[:place])
    # a system prompt's 1,100 tokens hold two whole blocks: every prompt opens with one of
    # the three systems' two blocks
    assert len({tuple(r[:2]) for r in blocks_of(w)}) == MODEL.systems


def test_a_sample_is_a_function_of_its_seed():
    a, b, other = sample(seed=5), sample(seed=5), sample(seed=6)
    for key in ("arrival_s", "prompt_tokens", "output_tokens", "prefix_blocks",
                "prefix_offsets"):
        assert getattr(a, key).tobytes() == getattr(b, key).tobytes(), key
    assert a.notes == b.notes and a.name == b.name
    assert len(a) != len(other) or not np.array_equal(a.prompt_tokens, other.prompt_tokens)


def test_the_rate_counts_requests():
    """Over 10 seeds of 200 s at 20 req/s: 4,000 requests expected (Poisson sessions: their
    count varies more than requests' would), and later turns' prompts hold the earlier ones."""
    counts = [len(sample(seed=s, rate=20.0, duration=200.0)) for s in range(10)]
    assert abs(np.mean(counts) / 4000 - 1) < 0.05, counts
    w = sample(seed=0, rate=20.0, duration=200.0)
    assert w.prompt_tokens.max() > MODEL.system_tokens + 700 * 2   # grown over turns


def test_the_infinite_cache_bound_matches_prefix_reuse():
    """The note's bound is `prefix_reuse` (the Mooncake reader's, an LRU dictionary walked
    request by request) on the sample's blocks."""
    w = sample(seed=2, rate=12.0, duration=60.0)
    share = infinite_cache_hit_share(w.prefix_blocks, w.prefix_offsets, w.prompt_tokens,
                                     BLOCK_TOKENS)
    assert share == pytest.approx(prefix_reuse(blocks_of(w), w.prompt_tokens), abs=1e-12)
    assert 0.3 < share < 1
    assert f"prefix reuse bound: {share:.1%}" in w.notes[-1]


CACHED = machines([ROLE_BOTH] * 3, [30000] * 3, limit=8192, prefix_cache=True)


@pytest.mark.parametrize("seed", range(2))
def test_both_simulators_agree_and_aware_routing_finds_more(seed):
    w = sample(seed=seed, rate=8.0, duration=30.0)
    bound = infinite_cache_hit_share(w.prefix_blocks, w.prefix_offsets, w.prompt_tokens,
                                     BLOCK_TOKENS)
    plain = setup.simulate_fast(w, CACHED)
    assert_as_reference(plain, w, CACHED)
    routed_machines = dataclasses.replace(CACHED, prefix_routing=True)
    routed = setup.simulate_fast(w, routed_machines)
    assert_as_reference(routed, w, routed_machines)
    assert 0.05 < hit_rate(plain) < hit_rate(routed) <= bound


SIM = ["simulate", "--design", "baseline-h100", "--machines", "2", "--model", "llama-3.1-8b",
       "--isl", "uniform:100-700", "--osl", "uniform:20-150", "--rate", "4", "--duration", "30"]


def test_simulate_prints_the_bound_and_the_hit_rate(cli):
    args = SIM + ["--prefix-model", "system=3:1100,turns=1-5,think=2", "--prefix-cache",
                  "aware"]
    out = cli(args)
    assert out.code == 0, out.stderr
    assert "note: prefix reuse bound: " in out.stderr
    assert "of prefill tokens found cached" in out.stdout
    summary = json.loads(cli(args + ["--json"]).stdout)
    assert 0 < summary["prefix_hit_rate"] < summary["prefix_reuse_bound"]["infinite_cache"]
    assert "+sessions(system=3:1100,turns=1-5,think=2)@4rps/30s/seed0" in summary["workload"]


def test_search_echoes_the_model_and_its_bound(cli, tmp_path):
    """report.json: the option as asked, the workload's identity (the model and the context
    that cut its sessions: the evaluation cache's key) and the bound."""
    out = cli(["search", "--model", "llama-3.1-8b", "--designs", "baseline-h100", "--isl",
               "uniform:100-700", "--osl", "uniform:20-150", "--rate", "4", "--duration", "30",
               "--verify-seeds", "2", "--prefix-model", "system=3:1100,turns=1-5,think=02.0",
               "--prefix-cache", "on", "--out", str(tmp_path / "r"), "--no-cache"])
    assert out.code == 0, out.stderr
    assert "Workload: sessions system=3:1100,turns=1-5,think=2 over the sizes of" in out.stdout
    inputs = json.loads((tmp_path / "r" / "report.json").read_text())["inputs"]
    assert inputs["options"]["prefix_model"] == "system=3:1100,turns=1-5,think=2"
    workload = inputs["workload"]
    assert (workload["prefix_model"], workload["context_tokens"]) == (
        "system=3:1100,turns=1-5,think=2", 131072)
    assert 0.3 < workload["prefix_reuse_bound"]["infinite_cache"] < 1


@pytest.mark.parametrize("value, words", [
    ("system=3:1100,turns=1-5", ["--prefix-model", "lacks think"]),
    ("system=3,turns=2,think=1", ["--prefix-model", "N:TOKENS"]),
    ("system=3:1100,turns=5-1,think=1", ["--prefix-model", "LOW must not exceed HIGH"]),
    ("system=3:1100,turns=2,think=0", ["--prefix-model", "think must be seconds > 0"]),
    ("system=3:1100,turns=2,think=1,colour=red", ["--prefix-model", "must be system="]),
    ("system=1:131072,turns=2,think=1", ["--prefix-model", "leave no room", "131,072"]),
])
def test_bad_prefix_models_are_refused_in_one_line(cli, bad_input, value, words):
    bad_input(cli(SIM + ["--prefix-model", value]), *words)


def test_a_prefix_model_beside_a_trace_or_its_blocks_on_a_curve_are_refused(
        cli, bad_input, tmp_path):
    from tests.test_mooncake import ROWS, write
    trace = write(tmp_path / "t.jsonl", ROWS)
    model = ["--prefix-model", "system=1:100,turns=2,think=1"]
    bad_input(cli(["simulate", "--design", "baseline-h100", "--machines", "1", "--model",
                   "llama-3.1-8b", "--workload", trace] + model), "--prefix-model",
              "Mooncake")
    from tests.test_question import OTHER_CHANGES
    bad_input(cli(["search", "--model", "llama-3.1-8b", "--designs", "baseline-h100",
                   "--workload", trace, "--prefix-cache", "on",
                   "--load-curve", OTHER_CHANGES["load_curve"], "--no-cache"]),
              "--prefix-cache", "--load-curve", "Mooncake")


def test_sessions_beyond_every_machines_memory_are_blamed_on_the_model():
    """When the model fits but the longest turn does not (`layouts.check_fits`), the error
    names --prefix-model: its turns grow up to the context, not to --isl/--osl's lengths."""
    from hardware_catalog.errors import naming
    from provisioner.layouts import request_too_long
    from provisioner.study import lengths_source
    source = dataclasses.replace(lengths_source("500", "100"),
                                 prefix_model="system=1:100,turns=9,think=1",
                                 context_tokens=131072)
    with naming(lambda name: "--" + name.replace("_", "-")):
        error = request_too_long(source, "m has room for")
    assert str(error).startswith("--prefix-model system=1:100,turns=9,think=1: its sessions' "
                                 "turns, which grow up to the model's context (131,072 tokens)")


def test_the_sensitivity_table_draws_no_burstier_sessions():
    """Sessions start as a Poisson process and their turns follow think times: the sensitivity
    table has no gamma-arrivals variant for them (it would not draw sessions), but keeps it
    for the same sizes drawn one by one."""
    from provisioner.sensitivity import variants
    from tests.test_question import study_of
    common = dict(model="llama-3.1-8b", workload="conversation", rate=10.0)
    sessions = [label for label, _ in variants(study_of(
        prefix_model="system=2:1000,turns=1-3,think=5", **common))]
    plain = [label for label, _ in variants(study_of(**common))]
    assert "burstier arrivals (gamma CV 2)" in plain
    assert [label for label in plain if label != "burstier arrivals (gamma CV 2)"] == sessions


def test_a_closed_loop_refuses_sessions(cli, bad_input):
    """--concurrency makes arrivals from finishes; sessions fix theirs in advance: one line."""
    bad_input(cli(["simulate", "--design", "baseline-h100", "--machines", "1", "--model",
                   "llama-3.1-8b", "--concurrency", "4", "--prefix-model",
                   "system=2:1000,turns=3,think=5"]), "--prefix-model", "--concurrency")


def test_sessions_over_a_curve_report_each_windows_hit_rate(cli, tmp_path):
    """simulate --load-curve with sessions and the cache: each window's line and JSON entry
    give its requests' hit rate (between 0 and 1), the whole curve's matches the machines';
    with the cache off no window mentions it."""
    import json
    curve = tmp_path / "spike.csv"
    curve.write_text("time_s,rate_rps\n0,4\n40,12\n80,4\n")
    base = ["simulate", "--design", "baseline-h100", "--machines", "2", "--model",
            "llama-3.1-8b", "--workload", "conversation", "--load-curve", str(curve),
            "--curve-window", "40", "--prefix-model", "system=4:1500,turns=1-5,think=10"]
    out = cli(base + ["--prefix-cache", "on"])
    assert out.code == 0, out.stderr
    text = " ".join(out.stdout.split())   # (the console may wrap a window's line)
    assert text.count("of prefill tokens cached, SLOs") == 3
    summary = json.loads(cli(base + ["--prefix-cache", "on", "--json"]).stdout)
    rates = [w["prefix_hit_rate"] for w in summary["windows"]]
    assert all(0 <= r < 1 for r in rates) and max(rates) > 0.2
    assert summary["prefix_hit_rate"] == summary["pools"]["machines"]["prefix_hit_rate"]
    off = json.loads(cli(base + ["--json"]).stdout)
    assert "prefix_hit_rate" not in off and all("prefix_hit_rate" not in w
                                                for w in off["windows"])
    assert "cached" not in cli(base).stdout
