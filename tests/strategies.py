"""Hypothesis strategies and simulator helpers shared by the simulator suites (test_simulator,
test_failures, test_chunked): a plain module, not a test module."""
from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from hardware_catalog import Design, Layout, load_catalog
from simcore import Cluster, LatencyCurves, SimOptions, Workload, simulate

CATALOG = load_catalog()
MODEL = CATALOG.model("bloom-176b")
REFERENCE = CATALOG.machine("dgx-a100")  # slowdowns are against an uncontended DGX-A100
# BLOOM-176B weights are 352.5 GB of a DGX's 640 GB: a reserve near 0.39 leaves room for only a
# few thousand KV tokens per machine, which makes memory waits and the mixed pool common.
TIGHT_RESERVE = st.floats(0.36, 0.40)


class SyntheticPerf:
    """Monotone latency curves per SKU, scaled so faster SKUs are faster (power cap included)."""

    def __init__(self, prompt_y, decode_y, context_coeff):
        self.prompt_y, self.decode_y, self.context_coeff = prompt_y, decode_y, context_coeff

    def curves(self, model, machine, tp=None):
        speed = machine.fp16_tflops / 312.0
        prompt = LatencyCurves(np.array([1.0, 512.0, 2048.0, 8192.0]),
                               np.array(self.prompt_y) / speed * machine.prompt_slowdown,
                               np.array([1.0, 16.0, 64.0]),
                               np.array(self.decode_y) / speed ** 0.5,
                               self.context_coeff)
        return prompt


def increasing(low, high, count):
    return st.lists(st.floats(low, high), min_size=count, max_size=count).map(
        lambda xs: list(np.cumsum(xs)))


perf_models = st.builds(SyntheticPerf, increasing(0.005, 0.5, 4), increasing(0.005, 0.03, 3),
                        st.sampled_from([0.0, 1e-7, 2e-6]))


@st.composite
def workloads(draw, max_requests=40):
    n = draw(st.integers(1, max_requests))
    # coarse arrival grid so that simultaneous arrivals (ties) are common
    arrival = np.sort(np.array(draw(st.lists(st.integers(0, 40), min_size=n, max_size=n)))) * 0.05
    prompt = np.array(draw(st.lists(st.integers(1, 3000), min_size=n, max_size=n)))
    output = np.array(draw(st.lists(st.integers(1, 40), min_size=n, max_size=n)))
    return Workload("random", arrival.astype(float), prompt.astype(np.int64),
                    output.astype(np.int64))


@st.composite
def clusters(draw):
    names = list(CATALOG.designs) + ["h100-prompt-a100cap-token"]
    name = draw(st.sampled_from(names))
    if name == "h100-prompt-a100cap-token":
        design = Design(name, CATALOG.machine("dgx-h100"), CATALOG.machine("dgx-h100-cap"),
                        mixed_pool=draw(st.booleans()))
    else:
        design = CATALOG.design(name)
    if design.is_baseline:
        return Cluster(design, draw(st.integers(1, 4)))
    if not draw(st.booleans()):
        design = dataclasses.replace(design, mixed_pool=False)
    return Cluster(design, draw(st.integers(1, 4)), draw(st.integers(1, 3)))


# Layouts that cut machines into instances: several per machine (small model) and pipelines
# across machines (BLOOM-176B needs 4+ GPUs' memory at the tight reserve, so TP4xPP2 / TP2xPP4)
LAYOUTS = {"bloom-176b": [None, Layout(8, 1), Layout(4, 2), Layout(2, 4), Layout(8, 2)],
           "llama-3-8b": [None, Layout(1), Layout(2), Layout(4), Layout(2, 2), Layout(1, 3)]}


@st.composite
def layout_clusters(draw):
    """(cluster, model): a cluster of `clusters()` with a layout per pool drawn for the model."""
    cluster = draw(clusters())
    model = CATALOG.model(draw(st.sampled_from(sorted(LAYOUTS))))
    choices = LAYOUTS[model.name]
    design = cluster.design.with_layouts(draw(st.sampled_from(choices)),
                                         draw(st.sampled_from(choices)))
    return Cluster(design, cluster.prompt_machines, cluster.token_machines), model


options = st.builds(SimOptions, prompt_token_limit=st.sampled_from([1, 512, 2048]),
                    mixed_pool_queue_threshold=st.sampled_from([0, 2048, 8192]),
                    memory_reserve_fraction=TIGHT_RESERVE)

SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def both_engines(cluster, workload, perf, opts, model=MODEL):
    """(fast, reference) results of the same run."""
    return (simulate(cluster, workload, model, perf, REFERENCE, opts, engine="fast"),
            simulate(cluster, workload, model, perf, REFERENCE, opts, engine="reference"))


def assert_engines_agree(fast, ref, *, series=("first_token_s", "finish_s", "kv_transfer_s"),
                         machines=True, exact=("iterations", "max_memory_tokens"),
                         close=("busy_s", "mixed_pool_s", "mean_batch"), atol=1e-12) -> None:
    """Same verdict; per-request `series` to 1e-9; the same machines per request; per-machine
    `exact` statistics equal and `close` ones to 1e-9 (absolute `atol`)."""
    assert fast.feasible == ref.feasible and fast.reason == ref.reason
    if not fast.feasible:
        return
    for name in series:
        np.testing.assert_allclose(getattr(fast, name), getattr(ref, name), rtol=1e-9, atol=0)
    if machines:
        np.testing.assert_array_equal(fast.prompt_machine, ref.prompt_machine)
        np.testing.assert_array_equal(fast.token_machine, ref.token_machine)
    for key in exact:
        np.testing.assert_array_equal(fast.machine_stats[key], ref.machine_stats[key])
    for key in close:
        np.testing.assert_allclose(fast.machine_stats[key], ref.machine_stats[key], rtol=1e-9,
                                   atol=atol)
    assert_same_gaps(fast.itl_histogram, ref.itl_histogram)


def assert_same_gaps(fast: np.ndarray, ref: np.ndarray) -> None:
    """The same inter-token gaps, each binned alike or (its time equal to 1e-9, on a bin's edge)
    one bin apart: equal totals, and neither cumulative count ahead of the other's next bin."""
    assert fast.sum() == ref.sum()
    cum_fast, cum_ref = np.cumsum(fast), np.cumsum(ref)
    assert np.all(cum_fast[1:] >= cum_ref[:-1]) and np.all(cum_ref[1:] >= cum_fast[:-1])



@st.composite
def schedules(draw):
    # arrivals fall in [0, 2] s: failures then hit queued, computing, in-flight and decoding work
    rows = draw(st.lists(st.tuples(st.floats(0.0, 1.5), st.sampled_from(["prompt", "token",
                                                                         "any"]),
                                   st.integers(0, 3), st.sampled_from([0.05, 0.3, 1.0, 3.0,
                                                                       float("inf")])),
                         min_size=1, max_size=6))
    return tuple((round(t, 2), pool, i, d) for t, pool, i, d in rows)


def fit(schedule, cluster):
    """Keep the rows that name a machine of the cluster."""
    p, t, base = cluster.prompt_machines, cluster.token_machines, cluster.design.is_baseline
    size = {"prompt": p if not base else p + t, "token": t if not base else p + t, "any": p + t}
    return tuple(row for row in schedule if row[2] < size[row[1]])


failure_options = st.builds(
    SimOptions, prompt_token_limit=st.sampled_from([512, 2048]),
    mixed_pool_queue_threshold=st.sampled_from([0, 2048, 8192]),
    memory_reserve_fraction=TIGHT_RESERVE, detection_s=st.sampled_from([0.0, 0.1, 0.5]),
    recovery=st.sampled_from(["restart", "replicate"]),
    replica_target=st.sampled_from(["host", "peer"]),
    restart=st.sampled_from(["recompute", "regenerate"]))
