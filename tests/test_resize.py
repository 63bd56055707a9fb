"""Pools resized mid-run (issue 29): a plan's machines leave and join their pools; both
simulators agree, no request is routed to a machine out of its pool, and a machine that leaves
finishes what it holds."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hardware_catalog import InputError
from simcore import Cluster, SimOptions, simulate
from simcore.cluster import plan_resizes
from strategies import (MODEL, REFERENCE, SETTINGS, assert_engines_agree, both_engines, clusters,
                        options, perf_models, workloads)


@st.composite
def plans(draw, cluster):
    """1-4 steps over the workloads' 2 s of arrivals, each pool between 1 and its size."""
    starts = sorted({0.0, *draw(st.lists(st.sampled_from([0.25, 0.5, 0.75, 1.0, 1.5]),
                                         max_size=3))})
    token = cluster.token_machines
    return tuple((t, draw(st.integers(1, cluster.prompt_machines)),
                  draw(st.integers(1, token)) if token else 0) for t in starts)


def serving(plan, pool, index, at):
    """Machine `index` of `pool` (0 prompt, 1 token) serves at time `at` under `plan`."""
    step = max(i for i, row in enumerate(plan) if row[0] <= at)
    return index < plan[step][1 + pool]


@SETTINGS
@given(data=st.data(), cluster=clusters(), workload=workloads(), perf=perf_models, opts=options)
def test_engines_agree_with_pools_resized_mid_run(data, cluster, workload, perf, opts):
    plan = data.draw(plans(cluster))
    opts = dataclasses.replace(opts, pool_plan=plan)
    fast, ref = both_engines(cluster, workload, perf, opts)
    assert_engines_agree(fast, ref, series=("first_token_s", "finish_s", "kv_transfer_s"))
    if not fast.feasible:
        return
    # routing happens on arrival: never to a machine out of its pool then
    first_token = cluster.prompt_machines
    for i, arrival in enumerate(workload.arrival_s):
        for machine in {int(fast.prompt_machine[i]), int(fast.token_machine[i])}:
            pool, index = (0, machine) if machine < first_token else (1, machine - first_token)
            assert serving(plan, pool, index, arrival), (i, machine, arrival)


def test_a_machine_that_leaves_finishes_its_work_and_takes_none_after():
    """Two token machines, the second leaving at 1 s: requests routed to it before still
    finish there (after 1 s), none arriving later goes to it."""
    from strategies import CATALOG, SyntheticPerf
    from simcore import Workload
    cluster = Cluster(CATALOG.design("splitwise-hh"), 1, 2)
    perf = SyntheticPerf([0.02, 0.05, 0.1, 0.3], [0.01, 0.012, 0.02], 1e-7)
    arrival = np.arange(0.0, 2.0, 0.05)
    w = Workload("steady", arrival, np.full(len(arrival), 200), np.full(len(arrival), 100))
    opts = SimOptions(pool_plan=((0.0, 1, 2), (1.0, 1, 1)))
    for engine in ("fast", "reference"):
        result = simulate(cluster, w, MODEL, perf, REFERENCE, opts, engine=engine)
        on_second = result.token_machine == 2
        assert on_second.any() and np.all(arrival[on_second] < 1.0)
        assert result.finish_s[on_second].max() > 1.0   # still decoding when it left
    unplanned = simulate(cluster, w, MODEL, perf, REFERENCE, SimOptions())
    assert np.any(arrival[unplanned.token_machine == 2] >= 1.0)


def test_bad_plans_are_refused():
    from strategies import CATALOG
    cluster = Cluster(CATALOG.design("splitwise-hh"), 2, 2)
    with pytest.raises(InputError, match="cluster has 2\\+2"):
        plan_resizes(cluster, ((0.0, 3, 1),))
    with pytest.raises(InputError, match="increase"):
        plan_resizes(cluster, ((5.0, 1, 1), (1.0, 2, 2)))
    with pytest.raises(InputError, match="token pool empty"):
        plan_resizes(cluster, ((0.0, 1, 0),))
