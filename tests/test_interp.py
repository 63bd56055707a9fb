"""Bucketed knot look-ups: the same numbers as numpy's binary searches, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from simcore.interp import MIN_BUCKETS, SMALL, KnotIndex, PiecewiseLinear
from simcore.latency import piecewise_linear
from simcore.workload import builtin_size_table, builtin_workload_names


def _knots_and_values(seed: int, count: int, scale: float, ties: bool):
    """Sorted knots (with repeats when `ties`), a spread of values around them, the knots
    themselves and their neighbouring floats (the values that test a bucket's edge cases)."""
    rng = np.random.default_rng(seed)
    knots = np.sort(rng.random(count) * scale)
    if ties:
        knots = np.sort(np.concatenate((knots, knots[rng.integers(0, count, count // 3 + 1)])))
    span = knots[-1] - knots[0] + 1.0
    values = np.concatenate((
        rng.uniform(knots[0] - span / 4, knots[-1] + span / 4, 5 * SMALL),
        knots, np.nextafter(knots, -np.inf), np.nextafter(knots, np.inf),
        knots[0] + (knots[-1] - knots[0]) * np.arange(MIN_BUCKETS + 1) / MIN_BUCKETS))
    return knots, rng.permutation(values)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), count=st.integers(1, 1500),
       scale=st.sampled_from([1e-3, 1.0, 3e4]), ties=st.booleans())
def test_count_le_is_searchsorted_right(seed, count, scale, ties):
    knots, values = _knots_and_values(seed, count, scale, ties)
    index = KnotIndex(knots)
    assert np.array_equal(index.count_le(values), np.searchsorted(knots, values, side="right"))
    assert np.array_equal(index.count_le(values[:SMALL - 1]),
                          np.searchsorted(knots, values[:SMALL - 1], side="right"))


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), count=st.integers(2, 1500),
       scale=st.sampled_from([1e-3, 1.0, 3e4]), values_scale=st.sampled_from([1e-6, 1.0, 1e3]))
def test_piecewise_linear_is_numpy_interp_bit_for_bit(seed, count, scale, values_scale):
    knots, values = _knots_and_values(seed, count, scale, ties=False)
    knots = np.unique(knots)
    if len(knots) < 2:
        return
    heights = np.random.default_rng(seed + 1).normal(size=len(knots)) * values_scale
    plain = PiecewiseLinear(knots, heights)
    extended = PiecewiseLinear(knots, heights, extrapolate=True)
    for x in (values, values[:SMALL - 1]):
        assert np.array_equal(plain(x), np.interp(x, knots, heights))
        assert np.array_equal(extended(x), piecewise_linear(x, knots, heights))


def test_piecewise_linear_refuses_knots_numpy_would_search_ambiguously():
    with pytest.raises(ValueError, match="strictly increasing"):
        PiecewiseLinear(np.array([0.0, 1.0, 1.0, 2.0]), np.array([0.0, 1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="finite"):
        PiecewiseLinear(np.array([0.0, 1.0]), np.array([0.0, np.inf]))
    with pytest.raises(ValueError, match="sorted"):
        KnotIndex(np.array([1.0, 0.0]))


def _sample_with_numpy(table, rng, count):
    """What SizeTable.sample drew through Generator.choice and np.interp before the look-ups."""
    bins = len(table.rank_bin_edges) - 1
    weights = table.rank_cell_counts.ravel() / table.rank_cell_counts.sum()
    cells = rng.choice(weights.size, size=count, p=weights)
    prompt_rank = table._uniform_in_bins(rng, cells // bins)
    output_rank = table._uniform_in_bins(rng, cells % bins)
    tokens = [np.interp(rank, table.quantile_probs, q) for rank, q in
              ((prompt_rank, table.prompt_quantiles), (output_rank, table.output_quantiles))]
    return tuple(np.maximum(np.rint(t), 1).astype(np.int64) for t in tokens)


@pytest.mark.parametrize("name", builtin_workload_names())
@pytest.mark.parametrize("count", [1, SMALL - 1, SMALL, 8_500, 20_000])
def test_size_table_draws_what_choice_and_interp_drew(name, count):
    """The same requests for the same seed as before the look-ups (so cached evaluations and
    reports stay valid), and the generator left in the same state."""
    table = builtin_size_table(name)
    for seed in range(5):
        ours, theirs = np.random.default_rng(seed), np.random.default_rng(seed)
        drawn, expected = table.sample(ours, count), _sample_with_numpy(table, theirs, count)
        for got, want in zip(drawn, expected):
            assert got.dtype == want.dtype and np.array_equal(got, want)
        assert ours.random() == theirs.random()


def test_latency_curve_prices_whole_workloads_as_the_knot_rule():
    from simcore.perfmodel import default_performance_model
    from simcore.workload import synthesize
    from hardware_catalog import load_catalog

    catalog = load_catalog()
    model = catalog.model("bloom-176b")
    curves = default_performance_model().curves(model, catalog.machine("dgx-h100"))
    prompts = synthesize("conversation", 70, 120, 0).prompt_tokens.astype(np.float64)
    prompts = np.concatenate((prompts, [0, 1e6, curves.prompt_tokens[-1]], curves.prompt_tokens))
    assert np.array_equal(curves.prompt_time(prompts),
                          piecewise_linear(prompts, curves.prompt_tokens, curves.prompt_seconds))
