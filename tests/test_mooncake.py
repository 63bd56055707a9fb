"""Mooncake traces at the input edge (issue 41, first slice): read by content, arrivals spread
within each timestamp's step, block ids kept aside, the prefix-reuse bound, bad lines refused."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hardware_catalog import InputError
from provisioner.mooncake import is_mooncake, prefix_reuse, read_mooncake, reuse_bounds, spread
from provisioner.study import workload_source
from provisioner.files import file_sha256

MOONCAKE = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "mooncake"

# Three timestamps on a 3 s grid: 3 requests at 0, 1 at 3000 ms, 2 at 6000 ms. Requests share
# prefixes: block 0 is everyone's first block; [0, 1] begins requests 1, 2 and 5.
ROWS = [
    {"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [0, 1]},
    {"timestamp": 0, "input_length": 1200, "output_length": 20, "hash_ids": [0, 1, 2]},
    {"timestamp": 0, "input_length": 600, "output_length": 30, "hash_ids": [0, 3]},
    {"timestamp": 3000, "input_length": 512, "output_length": 40, "hash_ids": [4]},
    {"timestamp": 6000, "input_length": 1536, "output_length": 50, "hash_ids": [0, 1, 2]},
    {"timestamp": 6000, "input_length": 300, "output_length": 60, "hash_ids": [0]},
]


def write(path: Path, rows=ROWS, extra: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + extra)
    return path


def test_read_and_spread(tmp_path):
    trace = read_mooncake(write(tmp_path / "t.jsonl"))
    w = trace.workload
    # 3 requests in the 3 s step from 0: 0, 1, 2 s; 1 at 3 s; the last timestamp's step is the
    # median step (3 s): 6 and 7.5 s
    assert w.arrival_s.tolist() == [0.0, 1.0, 2.0, 3.0, 6.0, 7.5]
    assert w.prompt_tokens.tolist() == [1024, 1200, 600, 512, 1536, 300]
    assert w.output_tokens.tolist() == [10, 20, 30, 40, 50, 60]
    assert [b.tolist() for b in trace.blocks] == [r["hash_ids"] for r in ROWS]
    assert "spread evenly" in w.notes[0]


def test_spread_is_deterministic_and_sorted():
    stamps = np.array([0, 0, 0, 0, 3000, 3000, 9000], dtype=float)
    a, b = spread(stamps), spread(stamps)
    assert a.tolist() == b.tolist() == [0, 0.75, 1.5, 2.25, 3, 6, 9]
    assert np.all(np.diff(a) >= 0)
    assert spread(np.array([5.0, 5.0])).tolist() == [0.005, 0.005]   # one timestamp: no step


def test_unsorted_timestamps_sorted_with_note(tmp_path):
    rows = [ROWS[3], *ROWS[:3]]
    trace = read_mooncake(write(tmp_path / "u.jsonl", rows))
    assert trace.workload.prompt_tokens.tolist()[-1] == 512
    assert trace.blocks[-1].tolist() == [4]
    assert any("not sorted" in n for n in trace.workload.notes)


def test_recognised_by_content(tmp_path):
    path = write(tmp_path / "t.jsonl")
    assert is_mooncake(path)
    source = workload_source(str(path))
    assert source.kind == "mooncake" and source.timed
    assert len(source.sizes()) == 6
    # no rate: the trace itself for the base seed; another seed the same requests shifted
    # (test_samples_keep_blocks); with --rate, a window of its scaled timeline
    assert source.at(None, 60, 0, 0) is source.sizes()
    window = source.at(5.0, 100, 3)
    assert set(window.prompt_tokens.tolist()) <= {r["input_length"] for r in ROWS}
    again = source.at(5.0, 100, 3)
    assert window.arrival_s.tolist() == again.arrival_s.tolist()
    csv = tmp_path / "t.csv"
    csv.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,10\n")
    assert not is_mooncake(csv) and workload_source(str(csv)).kind == "trace"
    other_json = tmp_path / "o.jsonl"
    other_json.write_text('{"completed": 1}\n')
    assert not is_mooncake(other_json)


def test_echo_carries_the_bound_only_for_prefixes(tmp_path):
    path = write(tmp_path / "t.jsonl")
    echo = workload_source(str(path)).echo()
    assert echo["kind"] == "mooncake"
    assert "--prefix-cache" in echo["prefix_reuse_bound"]["simulated"]
    assert "prefix_reuse_bound" not in workload_source("coding").echo()


def test_reuse_bound_by_hand():
    blocks = [r["hash_ids"] for r in ROWS]
    tokens = [r["input_length"] for r in ROWS]
    total = sum(tokens)   # 5172
    # infinite cache: request 2 hits [0, 1] (1024); 3 hits [0] (512); 4 nothing; 5 hits
    # [0, 1, 2] (all 1536); 6 hits [0] (300, its whole prompt)
    assert prefix_reuse(blocks, tokens) == pytest.approx((1024 + 512 + 1536 + 300) / total)
    # LRU of 2 blocks: after 1 {0,1}; 2 hits 0,1 (1024), keeps {1,2}... evicts 0
    # after 2: order 0,1,2 -> evict 0 -> {1,2}; 3: miss 0 -> {2,0,3} -> evict 2 -> {0,3};
    # 4: miss -> {3,4}; 5: miss 0 -> {1,2} at the end; 6: miss 0
    assert prefix_reuse(blocks, tokens, cache_tokens=2 * 512) == pytest.approx(1024 / total)
    # LRU of 3 blocks: 2 hits [0,1] (1024) -> {0,1,2}; 3 hits [0] (512) -> {2,0,3};
    # 4 misses -> {0,3,4}; 5 hits [0] (512) -> {0,1,2}; 6 hits [0] (300)
    assert prefix_reuse(blocks, tokens, cache_tokens=3 * 512 + 100) == pytest.approx(
        (1024 + 512 + 512 + 300) / total)
    assert prefix_reuse(blocks, tokens, cache_tokens=0) == 0.0
    # only leading blocks count: a seen block after a miss is no hit
    assert prefix_reuse([[1, 2], [3, 2]], [1024, 1024]) == 0.0


def test_reuse_bound_changes_no_simulation_input(tmp_path):
    """The block ids ride along as dense prefix blocks (`Workload.prefix_blocks`), read only by
    prefix caching (off by default: tests/test_prefix_cache.py shows they change nothing)."""
    path = write(tmp_path / "t.jsonl")
    w = workload_source(str(path)).sizes()
    assert not hasattr(w, "blocks")
    assert set(vars(w)) <= {"name", "arrival_s", "prompt_tokens", "output_tokens", "notes",
                            "prefix_blocks", "prefix_offsets", "prefix_block_tokens", "closed"}
    assert w.closed is None   # (a closed loop's users and think times: never a trace's own)


@pytest.mark.parametrize("line, says", [
    ("not json", "line 3 is not JSON"),
    ('{"timestamp": 1, "input_length": 5, "output_length": 5}', "line 3 lacks hash_ids"),
    ('{"timestamp": 1, "input_length": -5, "output_length": 5, "hash_ids": []}',
     "line 3: input_length must be at least 1"),
    ('{"timestamp": 1, "input_length": 5, "output_length": -1, "hash_ids": []}',
     "line 3: output_length must be at least 1"),
    ('{"timestamp": -1, "input_length": 5, "output_length": 5, "hash_ids": []}',
     "line 3: timestamp"),
    ('{"timestamp": 1, "input_length": 5, "output_length": 5, "hash_ids": [1, "a"]}',
     "line 3: hash_ids must be a list of integers"),
    ('{"timestamp": 1, "input_length": 5, "output_length": 5, "hash_ids": 7}',
     "line 3: hash_ids must be a list of integers"),
    ('[1, 2]', "line 3 is not a JSON object"),
    ('{"timestamp": 1, "input_length": 5.5, "output_length": 5, "hash_ids": []}',
     "line 3: input_length must be an integer"),
])
def test_bad_lines(tmp_path, line, says):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + line + "\n")
    with pytest.raises(InputError) as err:
        read_mooncake(path)
    assert says in str(err.value) and "bad.jsonl" in str(err.value)


def test_bad_line_on_the_command_line(tmp_path, cli, bad_input):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps({**ROWS[1], "hash_ids": "x"}) + "\n")
    for command in ("search", "simulate"):
        args = [command, "--workload", path, "--model", "llama-3.1-8b"]
        args += (["--designs", "baseline-h100"] if command == "search"
                 else ["--design", "baseline-h100", "--machines", "1"])
        bad_input(cli(args), "bad.jsonl", "line 2", "hash_ids")


@pytest.mark.skipif(not MOONCAKE.exists(), reason="needs ../shared/traces/mooncake")
@pytest.mark.parametrize("name, infinite, lru10, lru1", [
    ("conversation", 0.374, 0.291, 0.054), ("synthetic", 0.651, 0.577, 0.142)])
def test_issue_figures(name, infinite, lru10, lru1):
    """Issue 41: conversation 37% / 29% / 5%, synthetic 65% / 58% / 14% (the shared README's
    37.4 / 29.1 / 5.4 and 65.1 / 57.7 / 14.2)."""
    path = MOONCAKE / f"{name}_trace.jsonl"
    bounds = reuse_bounds(str(path), file_sha256(path))
    assert bounds["infinite_cache"] == pytest.approx(infinite, abs=0.001)
    assert bounds["lru_10M_tokens"] == pytest.approx(lru10, abs=0.001)
    assert bounds["lru_1M_tokens"] == pytest.approx(lru1, abs=0.001)


@pytest.mark.skipif(not MOONCAKE.exists(), reason="needs ../shared/traces/mooncake")
def test_conversation_trace_arrivals():
    trace = read_mooncake(MOONCAKE / "conversation_trace.jsonl")
    w = trace.workload
    assert len(w) == 12031 and len(trace.blocks) == 12031
    assert np.all(np.diff(w.arrival_s) > 0)   # no two requests at one instant
    assert w.arrival_s[:3].tolist() == pytest.approx([0.0, 0.3, 0.6])


# ---------------------------------------------------------------- samples keep their blocks
def _requests(w) -> list[tuple]:
    """Each request of a sample as (prompt, output, its block ids)."""
    return [(int(p), int(o), tuple(w.request_blocks(i).tolist()))
            for i, (p, o) in enumerate(zip(w.prompt_tokens, w.output_tokens))]


def _long_rows(n: int = 60) -> list[dict]:
    """n requests, 1 s apart, distinct sizes; request i's blocks [i % 5, 100 + i]: five shared
    first blocks, each request's own second block."""
    return [{"timestamp": 1000 * i, "input_length": 600 + i, "output_length": 10 + i,
             "hash_ids": [i % 5, 100 + i]} for i in range(n)]


def test_samples_keep_blocks(tmp_path):
    source = workload_source(str(write(tmp_path / "long.jsonl", _long_rows())))
    trace = source.sizes()
    own = set(_requests(trace))
    assert len(own) == 60
    # the base sample is the trace itself
    assert source.at(None, 30, 7, base_seed=7) is trace
    # another seed: the same requests, blocks and all, shifted cyclically in time
    shifted = source.at(None, 30, 1, base_seed=7)
    assert shifted.has_prefix_blocks and shifted.prefix_block_tokens == trace.prefix_block_tokens
    assert sorted(_requests(shifted)) == sorted(_requests(trace))
    assert _requests(shifted) != _requests(trace)
    assert np.all(np.diff(shifted.arrival_s) >= 0) and shifted.arrival_s[0] >= 0
    # in the trace's cyclic order: consecutive requests stay consecutive (i, i + 1 mod 60)
    order = [p - 600 for p, _, _ in _requests(shifted)]
    assert all((b - a) % 60 == 1 for a, b in zip(order, order[1:]))
    # still 1 s apart, the wrap too (the period is the span plus one mean gap: 60 s)
    assert np.allclose(np.diff(shifted.arrival_s), 1.0)
    # deterministic in its seed, another seed another order
    assert _requests(source.at(None, 30, 1, base_seed=7)) == _requests(shifted)
    assert _requests(source.at(None, 30, 2, base_seed=7)) != _requests(shifted)
    assert source.requests_at(None, 30, 1, 7) == 60


def test_rate_windows_scale_the_count(tmp_path):
    source = workload_source(str(write(tmp_path / "long.jsonl", _long_rows())))
    trace = source.sizes()
    own = set(_requests(trace))
    # the trace runs at 1 req/s; at 2 req/s its timeline is halved: 20 s hold 40 requests
    base = source.at(2.0, 20, 0, base_seed=0)
    assert len(base) == 40 == source.requests_at(2.0, 20, 0, 0)
    assert [p - 600 for p, _, _ in _requests(base)] == list(range(40))   # from the start
    assert np.allclose(base.arrival_s, np.arange(40) * 0.5)
    other = source.at(2.0, 20, 3, base_seed=0)
    assert len(other) == source.requests_at(2.0, 20, 3, 0) in (40, 41)
    assert set(_requests(other)) <= own                   # real requests with their own blocks
    assert len(set(_requests(other))) == len(other)       # none twice
    assert _requests(other) != _requests(base)
    assert _requests(source.at(2.0, 20, 3, base_seed=0)) == _requests(other)
    # 0.5 req/s over 60 s: 30 requests; the count follows the rate
    assert len(source.at(0.5, 60, 0, base_seed=0)) == 30
    # a window longer than the scaled span is shortened to it: every request once
    long = source.at(2.0, 100, 4, base_seed=0)
    assert len(long) == 60 and sorted(_requests(long)) == sorted(_requests(trace))
    assert long.arrival_s[-1] < 30 and "shortened" in long.notes[-1]
    with pytest.raises(InputError, match="too small"):
        source.at(0.001, 1, 3, base_seed=0)   # 1 s of a 60,000 s period, from a random offset


def test_other_traces_keep_their_samples(tmp_path):
    # a CSV trace: other seeds redraw sizes under the trace's own arrivals, as before
    csv = tmp_path / "t.csv"
    csv.write_text("arrival_s,prompt_tokens,output_tokens\n" +
                   "".join(f"{i},{100 + i},{10 + i}\n" for i in range(20)))
    source = workload_source(str(csv))
    other = source.at(None, 30, 1, base_seed=0)
    assert other.arrival_s.tolist() == source.sizes().arrival_s.tolist()
    assert not other.has_prefix_blocks and "redrawn" in other.notes[-1]


def test_search_says_how_its_samples_are_drawn():
    from provisioner.terminal import asked_input_lines
    workload = {"kind": "mooncake", "name": "t.jsonl"}
    [line] = asked_input_lines({"workload": workload, "goal": {"name": "min-cost", "rate_rps": 3}})
    assert "scaled to 3 req/s" in line and "prompt blocks" in line
    [line] = asked_input_lines({"workload": workload, "goal": {"name": "min-cost"}})
    assert "shift it cyclically" in line
    [line] = asked_input_lines({"workload": workload, "goal": {"name": "max-rate"}})
    assert "scaled to the searched rate" in line
