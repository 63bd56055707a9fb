"""Workloads: trace loading and validation, built-in size tables, synthesis, command-line rules."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hardware_catalog import InputError
from simcore.workload import (BUILTIN_TABLES_PATH, Workload, builtin_size_table,
                              builtin_workload_names, load_trace, synthesize)

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
TRACES = {"coding": SHARED / "traces" / "azure_code_2023.csv",
          "conversation": SHARED / "traces" / "azure_conv_2023.csv"}
needs_traces = pytest.mark.skipif(not all(p.exists() for p in TRACES.values()),
                                  reason="shared Azure traces not available")
PLAIN_HEADER = "arrival_s,prompt_tokens,output_tokens\n"


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def rejection(path: Path) -> str:
    with pytest.raises(InputError) as caught:
        load_trace(path)
    message = str(caught.value)
    assert "\n" not in message
    assert path.name in message
    return message


def ranks(values: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(values, kind="stable"), kind="stable") / len(values)


# ---------------------------------------------------------------------------------- formats
def test_azure_format_timestamps_become_seconds_after_first(tmp_path):
    path = write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens,Extra\n"
                           "2023-11-16 18:17:03.9799600,4808,10,x\n"
                           "2023-11-16 18:17:04.0319600,3180,8,y\n"
                           "2023-11-16 18:17:05,100,1,z\n", "azure.csv")
    w = load_trace(path)
    assert w.name == "azure.csv"
    np.testing.assert_allclose(w.arrival_s, [0.0, 0.052, 1.02004], atol=1e-9)
    assert w.prompt_tokens.tolist() == [4808, 3180, 100]
    assert w.output_tokens.tolist() == [10, 8, 1]
    assert w.arrival_s.dtype == np.float64 and w.prompt_tokens.dtype == np.int64


def test_splitwisesim_format(tmp_path):
    path = write(tmp_path, "request_id,request_type,application_id,arrival_timestamp,batch_size,"
                           "prompt_size,token_size\n"
                           "0,2,0,0.5,1,120,30\n1,2,0,1.25,1,900,4\n")
    w = load_trace(path)
    assert w.arrival_s.tolist() == [0.5, 1.25]  # seconds kept as they are
    assert w.prompt_tokens.tolist() == [120, 900]
    assert w.output_tokens.tolist() == [30, 4]


def test_plain_format_ignores_extra_columns_case_spaces_and_blank_lines(tmp_path):
    path = write(tmp_path, "note, Arrival_S ,PROMPT_TOKENS,output_tokens\n"
                           "a,0,10,2\n\nb,2.5,20.0,3\n\n")
    w = load_trace(path)
    assert w.arrival_s.tolist() == [0.0, 2.5]
    assert w.prompt_tokens.tolist() == [10, 20]
    assert w.output_tokens.tolist() == [2, 3]
    assert w.notes == ("columns not read: note",)   # read by name: said, never shifted


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e5, allow_nan=False), st.integers(1, 10**6),
                          st.integers(1, 10**5)), min_size=1, max_size=40))
def test_plain_csv_round_trips_sorted(rows):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.csv"
        path.write_text(PLAIN_HEADER + "".join(f"{a!r},{p},{o}\n" for a, p, o in rows))
        w = load_trace(path)
    order = np.argsort([a for a, _, _ in rows], kind="stable")
    assert w.arrival_s.tolist() == [rows[i][0] for i in order]
    assert w.prompt_tokens.tolist() == [rows[i][1] for i in order]
    assert w.output_tokens.tolist() == [rows[i][2] for i in order]


def test_unsorted_arrivals_are_sorted_stably_with_a_note(tmp_path):
    path = write(tmp_path, PLAIN_HEADER + "3,30,3\n1,10,1\n3,31,4\n2,20,2\n")
    w = load_trace(path)
    assert w.arrival_s.tolist() == [1, 2, 3, 3]
    assert w.prompt_tokens.tolist() == [10, 20, 30, 31]  # ties keep file order
    assert w.notes == ("arrivals were not sorted; sorted 4 requests by arrival time",)


# --------------------------------------------------------------------------- malformations
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
MALFORMED = {
    "unknown header": ("a,b,c\n1,2,3\n", 1, None, "accepted formats"),
    "missing column": ("arrival_s,prompt_tokens\n0,5\n", 1, "output_tokens", "plain"),
    "missing azure column": ("TIMESTAMP,ContextTokens\nx,5\n", 1, "GeneratedTokens", "Azure"),
    "non-numeric tokens": (PLAIN_HEADER + "0,5,5\n1,abc,5\n", 3, "prompt_tokens", "number"),
    "empty token cell": (PLAIN_HEADER + "0,5,\n", 2, "output_tokens", "empty value"),
    "NaN tokens": (PLAIN_HEADER + "0,nan,5\n", 2, "prompt_tokens", "finite number"),
    "zero tokens": (PLAIN_HEADER + "0,5,5\n1,5,0\n", 3, "output_tokens", ">= 1"),
    "negative tokens": (PLAIN_HEADER + "0,-5,5\n", 2, "prompt_tokens", ">= 1"),
    "non-integer tokens": (PLAIN_HEADER + "0,5,5\n1,5,4.5\n", 3, "output_tokens", "whole number"),
    "negative arrival": (PLAIN_HEADER + "0,5,5\n-1,5,5\n", 3, "arrival_s", ">= 0"),
    "NaN arrival": (PLAIN_HEADER + "NaN,5,5\n", 2, "arrival_s", "finite number"),
    "negative splitwise arrival": (
        "arrival_timestamp,prompt_size,token_size\n-0.5,5,5\n", 2, "arrival_timestamp", ">= 0"),
    "unparseable timestamp": (AZURE_HEADER + "2023-11-16 18:17:03,5,5\nyesterday,5,5\n", 3,
                              "TIMESTAMP", "timestamp"),
    "missing timestamp": (AZURE_HEADER + "2023-11-16 18:17:03,5,5\n,5,5\n", 3, "TIMESTAMP",
                          "timestamp"),
    "row after blank line": (PLAIN_HEADER + "0,5,5\n\n1,x,5\n", 4, "prompt_tokens", "number"),
}


@pytest.mark.parametrize("case", MALFORMED, ids=list(MALFORMED))
def test_malformed_trace_names_file_row_and_field(tmp_path, case):
    text, row, field, fragment = MALFORMED[case]
    message = rejection(write(tmp_path, text, "bad.csv"))
    assert f"row {row}" in message
    if field is not None:
        assert f"field '{field}'" in message
    assert fragment in message


def test_several_bad_rows_are_counted(tmp_path):
    message = rejection(write(tmp_path, PLAIN_HEADER + "0,0,5\n1,0,5\n2,0,5\n"))
    assert "row 2" in message and "2 more bad rows" in message


@pytest.mark.parametrize("text, fragment", [("", "empty"), (PLAIN_HEADER, "no requests"),
                                            (PLAIN_HEADER + "\n\n", "no requests"),
                                            (PLAIN_HEADER + "0,5,5\n1,5,5,9,9\n",
                                             "malformed CSV: expected 3 fields, found 5")])
def test_empty_header_only_and_ragged_files_rejected(tmp_path, text, fragment):
    assert fragment in rejection(write(tmp_path, text))


def test_unreadable_paths_rejected(tmp_path):
    assert "cannot read" in rejection(tmp_path / "absent.csv")
    folder = tmp_path / "folder.csv"
    folder.mkdir()
    assert "is a directory" in rejection(folder)
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00\x81" * 50)
    rejection(binary)


# --------------------------------------------------------------------------------- synthesis
def gaps_cv(w: Workload) -> float:
    gaps = np.diff(w.arrival_s)
    return float(gaps.std() / gaps.mean())


def test_poisson_synthesis_is_seeded_and_reproducible():
    a, b = synthesize("coding", 70, 120, seed=0), synthesize("coding", 70, 120, seed=0)
    for field in ("arrival_s", "prompt_tokens", "output_tokens"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    c = synthesize("coding", 70, 120, seed=1)
    assert len(a) != len(c) or not np.array_equal(a.arrival_s, c.arrival_s)
    assert a.name == "coding@70rps/120s/seed0"
    assert np.all(np.diff(a.arrival_s) >= 0) and a.arrival_s[0] >= 0 and a.arrival_s[-1] < 120
    assert a.prompt_tokens.min() >= 1 and a.output_tokens.min() >= 1


def test_poisson_rate_and_gap_cv_over_a_long_window():
    w = synthesize("conversation", 50, 2000, seed=3)
    expected = 50 * 2000
    assert abs(len(w) - expected) <= 5 * np.sqrt(expected)  # Poisson count: sd = sqrt(mean)
    assert abs(gaps_cv(w) - 1.0) < 0.03                     # exponential gaps have cv 1


def test_gamma_arrivals_are_burstier_than_poisson():
    poisson = synthesize("coding", 50, 2000, seed=4)
    bursty = synthesize("coding", 50, 2000, seed=4, arrival="gamma", burstiness_cv=3.0)
    assert gaps_cv(bursty) > gaps_cv(poisson) + 1.0
    assert abs(gaps_cv(bursty) - 3.0) < 0.3
    expected = 50 * 2000  # a renewal process's count has variance about mean x cv^2
    assert abs(len(bursty) - expected) <= 5 * 3.0 * np.sqrt(expected)
    assert bursty.name == "coding@50rps/2000s/gamma-cv3/seed4"


def test_sizes_resampled_from_a_workload_are_its_pairs():
    source = Workload("src", np.array([0.0, 1.0, 2.0]), np.array([10, 20, 30]),
                      np.array([1, 2, 3]))
    w = synthesize(source, 20, 50, seed=0)
    assert set(zip(w.prompt_tokens.tolist(), w.output_tokens.tolist())) == {(10, 1), (20, 2),
                                                                              (30, 3)}
    assert w.name == "src@20rps/50s/seed0"


@pytest.mark.parametrize("kwargs, fragment", [
    ({"rate_rps": 0}, "rate"), ({"rate_rps": -1}, "rate"), ({"rate_rps": float("nan")}, "rate"),
    ({"duration_s": 0}, "duration"), ({"burstiness_cv": 0, "arrival": "gamma"}, "cv"),
    ({"arrival": "uniform"}, "arrival process"), ({"burstiness_cv": 2.0}, "gamma"),
    ({"seed": -1}, "seed"), ({"rate_rps": 1e-6, "duration_s": 1}, "too small"),
    ({"sizes": "nonesuch"}, "coding, conversation"), ({"rate_rps": 1e6, "duration_s": 1e6},
                                                       "more than")])
def test_synthesis_options_validated(kwargs, fragment):
    arguments = {"sizes": "coding", "rate_rps": 10.0, "duration_s": 10.0, "seed": 0, **kwargs}
    with pytest.raises(InputError, match=fragment) as caught:
        synthesize(**arguments)
    assert "\n" not in str(caught.value)


# ------------------------------------------------------------------------ built-in tables
def test_builtin_tables_name_source_licence_and_rate():
    document = json.loads(BUILTIN_TABLES_PATH.read_text())
    assert BUILTIN_TABLES_PATH.stat().st_size < 50_000
    assert builtin_workload_names() == ("coding", "conversation")
    for entry in document["workloads"].values():
        assert entry["source"]["licence"] == "CC-BY 4.0"
        assert "Azure" in entry["source"]["dataset"]
        native = (entry["requests"] - 1) / entry["span_s"]
        assert entry["native_rate_rps"] == pytest.approx(native, rel=1e-3)
        assert np.sum(entry["rank_cell_counts"]) == entry["requests"]


@needs_traces
@pytest.mark.parametrize("name", TRACES)
def test_tables_reproduce_trace_percentiles(name):
    trace, table = load_trace(TRACES[name]), builtin_size_table(name)
    for tokens, quantiles in ((trace.prompt_tokens, table.prompt_quantiles),
                              (trace.output_tokens, table.output_quantiles)):
        for p in (0.5, 0.9, 0.99):
            assert np.interp(p, table.quantile_probs, quantiles) == pytest.approx(
                np.quantile(tokens, p), rel=0.02)


@needs_traces
@pytest.mark.parametrize("name", TRACES)
def test_synthesized_sample_reproduces_trace_percentiles(name):
    """Tolerance: a sample p-quantile from n draws sits, with overwhelming probability, between
    the source's quantiles at p -/+ 4 sd of a binomial proportion (sqrt(p(1-p)/n)); 1 token more
    for rounding. This bound is distribution-free, unlike a fixed relative error, which is too
    tight where the density is thin (coding output P99) and too loose where it is dense."""
    trace = load_trace(TRACES[name])
    sample = synthesize(name, 100, 200, seed=0)  # about 20k requests
    assert 19_000 < len(sample) < 21_000
    for field in ("prompt_tokens", "output_tokens"):
        source, drawn = getattr(trace, field), getattr(sample, field)
        for p in (0.5, 0.9, 0.99):
            spread = 4 * np.sqrt(p * (1 - p) / len(drawn))
            low, high = np.quantile(source, [p - spread, min(p + spread, 1.0)])
            assert low - 1 <= np.quantile(drawn, p) <= high + 1, (field, p)


@needs_traces
@pytest.mark.parametrize("name", TRACES)
def test_synthesized_sample_keeps_the_prompt_output_relation(name):
    """Mean output rank per prompt quintile (the conversation trace's is strongly non-monotone).
    0.03 is about 4 sd of the difference: the trace's quintiles hold 1.8k-3.9k requests, the
    sample's 4k, and a mean of uniform ranks over k requests has sd 0.29 / sqrt(k)."""
    trace = load_trace(TRACES[name])
    sample = synthesize(name, 100, 200, seed=1)

    def output_rank_by_prompt_quintile(w: Workload) -> np.ndarray:
        quintile = np.minimum((ranks(w.prompt_tokens) * 5).astype(int), 4)
        output_rank = ranks(w.output_tokens)
        return np.array([output_rank[quintile == q].mean() for q in range(5)])

    np.testing.assert_allclose(output_rank_by_prompt_quintile(sample),
                               output_rank_by_prompt_quintile(trace), atol=0.03)


@needs_traces
@pytest.mark.parametrize("name, count", [("coding", 8819), ("conversation", 19366)])
def test_azure_traces_load_as_they_are(name, count):
    w = load_trace(TRACES[name])
    assert len(w) == count
    assert w.arrival_s[0] == 0.0 and np.all(np.diff(w.arrival_s) >= 0)
    assert 3400 < w.arrival_s[-1] < 3600  # about 57-58 minutes
    assert not any("sorted" in note for note in w.notes)
    assert w.prompt_tokens.min() >= 1 and w.output_tokens.min() >= 1


# ----------------------------------------------------------------- names at the edge (provisioner)
def test_builtin_name_is_synthesized_at_the_rate():
    from provisioner.study import workload_source
    source = workload_source("conversation")
    assert source.kind == "builtin"
    w = source.at(5, 60, 2)
    assert w.name == "conversation@5rps/60s/seed2"
    w = synthesize("conversation", 5, 60, 2, arrival="gamma", burstiness_cv=2.0)
    assert w.name == "conversation@5rps/60s/gamma-cv2/seed2"


def test_csv_replayed_without_rate_and_resampled_with_one(tmp_path):
    from provisioner.study import workload_source
    path = write(tmp_path, PLAIN_HEADER + "0,10,1\n100,20,2\n500,30,3\n", "mine.csv")
    replay = workload_source(str(path)).at(None, 120, 0)
    assert replay.arrival_s.tolist() == [0, 100, 500]  # whole trace, duration ignored
    assert replay.name == "mine.csv"
    resampled = workload_source(str(path)).at(10, 30, 0)
    assert resampled.name == "mine.csv@10rps/30s/seed0"
    assert resampled.arrival_s.max() < 30 and len(resampled) > 100
    assert set(resampled.prompt_tokens.tolist()) <= {10, 20, 30}


def test_unknown_workload_lists_builtin_names(tmp_path):
    from provisioner.study import workload_source
    with pytest.raises(InputError, match="coding, conversation") as caught:
        workload_source(str(tmp_path / "nope.csv"))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("rate, arrival, cv", [(0.5, "poisson", 1.0), (70.0, "poisson", 1.0),
                                               (700.0, "poisson", 1.0), (20.0, "gamma", 3.0)])
def test_arrival_count_is_the_length_synthesize_draws(rate, arrival, cv):
    from simcore.workload import arrival_count
    for seed in (0, 1, 17):
        drawn = synthesize("coding", rate, 60.0, seed, arrival=arrival, burstiness_cv=cv)
        assert arrival_count(rate, 60.0, seed, arrival, cv) == len(drawn)
