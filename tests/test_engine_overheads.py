"""The engine's time around its kernels (issue 37, `simcore.engine_overheads`): host time per
iteration and per sequence, after the GPU work (serial) or beside it (overlap), and a
per-request term on the first token; priced by both simulators, in the SLO reference, set from
the command line and the spec, echoed in the report."""
from __future__ import annotations

import json

import numpy as np
import pytest

from simcore import Cluster, LatencyCurves, Workload, simulate
from simcore.engine_overheads import NO_OVERHEADS, EngineOverheads, fitted_overheads
from simcore.metrics import _decodes_alone, uncontended_latencies
from strategies import CATALOG, MODEL, REFERENCE

FLAT = LatencyCurves(np.array([1.0, 8192.0]), np.array([0.05, 0.05]), np.array([1.0, 64.0]),
                     np.array([0.01, 0.01]), 0.0)


class FlatPerf:
    """Every machine: 50 ms per prompt iteration, 10 ms per decode iteration, whatever the
    sizes, with `overheads` on top; the SLO reference gets the same."""

    def __init__(self, overheads: EngineOverheads):
        self.overheads = overheads

    def curves(self, model, machine, tp=None):
        return self.overheads.apply(FLAT, model)

    def is_calibrated(self, model, machine, tp=None):
        return True


def one_request(overheads: EngineOverheads, engine: str, output: int = 11):
    cluster = Cluster(CATALOG.design("baseline-h100"), 1, 0)
    w = Workload("one", np.array([0.0]), np.array([100]), np.array([output]))
    return simulate(cluster, w, MODEL, FlatPerf(overheads), REFERENCE, engine=engine)


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_a_request_alone_pays_every_term_once_per_iteration(engine):
    """Serial: each iteration of one sequence takes its GPU time + 2 ms + 50 us; the first
    token reaches the client 30 ms later; TBT holds no first-token term."""
    terms = EngineOverheads(2e-3, 50e-6, 30e-3)
    result = one_request(terms, engine)
    host = 2e-3 + 50e-6
    assert result.ttft_s[0] == pytest.approx(0.05 + host + 0.03, rel=1e-12)
    assert result.tbt_s[0] == pytest.approx(0.01 + host, rel=1e-12)
    assert result.e2e_s[0] == pytest.approx(0.05 + 0.03 + 11 * host + 10 * 0.01, rel=1e-12)
    assert result.ttft_slowdown[0] == pytest.approx(1.0)   # the reference pays them too


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_overlapped_host_time_shows_only_when_longer_than_the_gpu_work(engine):
    """Overlap: an iteration takes max(GPU, host): a 20 ms host time hides a 10 ms decode,
    and a 50 ms prompt hides it."""
    result = one_request(EngineOverheads(20e-3, 0.0, overlap=True), engine)
    assert result.ttft_s[0] == pytest.approx(0.05, rel=1e-12)
    assert result.tbt_s[0] == pytest.approx(0.02, rel=1e-12)
    hidden = one_request(EngineOverheads(5e-3, 0.0, overlap=True), engine)
    assert hidden.tbt_s[0] == pytest.approx(0.01, rel=1e-12)


def test_the_per_sequence_term_grows_with_the_batch():
    """Eight requests decoding together: every iteration pays 8 x the per-sequence term."""
    cluster = Cluster(CATALOG.design("baseline-h100"), 1, 0)
    w = Workload("eight", np.zeros(8), np.full(8, 100), np.full(8, 21))
    slow = simulate(cluster, w, MODEL, FlatPerf(EngineOverheads(0.0, 1e-3)), REFERENCE)
    plain = simulate(cluster, w, MODEL, FlatPerf(NO_OVERHEADS), REFERENCE)
    # one prompt iteration of 8 prompts, then 20 decode iterations of 8: 21 x 8 ms more
    assert float(np.max(slow.finish_s) - np.max(plain.finish_s)) == pytest.approx(21 * 8e-3)


@pytest.mark.parametrize("overlap", [False, True])
def test_requests_alone_in_closed_form_match_their_iterations(overlap):
    curves = LatencyCurves(np.array([1.0, 512.0, 2048.0]), np.array([0.02, 0.05, 0.15]),
                           np.array([1.0, 16.0]), np.array([0.01, 0.012]), 1e-6)
    curves = curves.with_engine_overheads(0.011, 1e-4, 0.03, overlap)
    prompt, gaps = np.array([100.0, 1000.0, 5000.0, 20000.0]), np.array([0.0, 1.0, 50.0, 3000.0])
    want = [sum(float(curves.with_host(curves.token_time(1, p + k), 1))
                for k in range(1, int(g) + 1)) for p, g in zip(prompt, gaps)]
    np.testing.assert_allclose(_decodes_alone(curves, prompt, gaps), want, rtol=1e-12)
    ttft = uncontended_latencies(prompt.astype(int), (gaps + 1).astype(int), curves)[0]
    np.testing.assert_allclose(ttft, [float(curves.with_host(curves.prompt_time(p), 1)) + 0.03
                                      for p in prompt], rtol=1e-12)


def test_given_terms_replace_the_fitted_ones_and_say_so():
    fitted = fitted_overheads("vllm")
    given = fitted.overridden(iteration_s=1e-3, first_token_s=0.02, overlap=True)
    assert (given.iteration_s, given.sequence_s, given.overlap) == (1e-3, fitted.sequence_s, True)
    assert given.first_token(80) == 0.02          # a given first-token term is the whole term
    assert "given: first_token_s, iteration_s, overlap" in given.source
    assert fitted.overridden() is fitted
    assert fitted_overheads("no-such-engine") == NO_OVERHEADS


def test_every_fitted_engine_names_its_source():
    for engine in ("vllm", "sglang", "trtllm"):
        terms = fitted_overheads(engine)
        assert "measured" in terms.source and "docs/engine-overheads.md" in terms.source
        assert min(terms.iteration_s, terms.sequence_s, terms.first_token(61)) >= 0


# ------------------------------------------------------------------------ the question edge

SIMULATE = ["simulate", "--model", "llama-3.1-8b", "--design", "baseline-h100", "--machines",
            "1", "--tp", "2", "--rate", "30", "--duration", "30", "--json"]


def simulated(cli, *extra):
    outcome = cli([*SIMULATE, *extra])
    assert outcome.code in (0, 1), outcome.stderr   # 1: an SLO missed, as simulate says
    return json.loads(outcome.stdout)


def test_simulate_takes_the_terms_from_the_command_line(cli):
    plain = simulated(cli, "--iteration-overhead-ms", "0", "--sequence-overhead-us", "0",
                      "--first-token-overhead-ms", "0")
    slow = simulated(cli, "--iteration-overhead-ms", "1", "--sequence-overhead-us", "25",
                     "--first-token-overhead-ms", "40", "--no-host-overlap")
    assert slow["latency_ms"]["tpot"]["p50"] > plain["latency_ms"]["tpot"]["p50"] + 1.0
    assert slow["latency_ms"]["ttft"]["p50"] > plain["latency_ms"]["ttft"]["p50"] + 40.0
    assert "engine host time 1 ms per iteration + 25 µs per sequence" in slow["latency_source"]
    assert "first token +40 ms" in slow["latency_source"]


def test_a_measured_model_refuses_the_terms(cli, bad_input):
    bad_input(cli([*SIMULATE, "--engine", "splitwise-2023", "--sequence-overhead-us", "20"]),
              "--sequence-overhead-us", "measured iteration times")


def test_a_negative_term_is_refused(cli, bad_input):
    bad_input(cli([*SIMULATE, "--iteration-overhead-ms", "-1"]), "--iteration-overhead-ms")


def test_the_search_echoes_the_terms_and_keys_its_cache_on_them():
    from provisioner.options import SearchOptions, from_keywords
    from provisioner.question import identity, merge_options, resolve_study

    def study(**given):
        return resolve_study(merge_options(SearchOptions, from_keywords(SearchOptions, {
            "model": "llama-3.1-8b", "designs": "baseline-h100", **given})))
    plain, given = study(), study(sequence_overhead_us=30.0)
    assert given.perf.identity()["engine_overheads"]["sequence_us"] == 30.0
    assert identity(plain) != identity(given)
