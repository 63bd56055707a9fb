"""Speculative decoding (issue 39, `simcore.specdecode`): the fast core against the reference
with it on (decode runs, mixed pools, chunked prefill), the step-time model's gain at batch 1
and at large batch, default-off runs unchanged, and bad option values refused."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from simcore import LatencyCurves, Workload
from simcore.cluster import ROLE_BOTH, ROLE_PROMPT, ROLE_TOKEN
from simcore.fast import setup
from simcore.fast.records import INF, RUN_DONE, RUN_PAUSED
from simcore.refsim import simulate_reference
from simcore.specdecode import CONTEXT_UNITS, SpecDecode, decode_steps, step_plan
from tests.harness import assert_bad_input
from tests.test_fast_runs import CURVES, SLOW, machines, workload
from tests.test_paged_kv import PAGED   # (its clusters, where paged blocks run out)

MTP = SpecDecode("mtp", 1, (0.85,), 1 / 80)
EAGLE = SpecDecode("eagle", 3, (0.8, 0.7, 0.6), 1 / 32)
FLAT = LatencyCurves(np.array([1.0, 8192.0]), np.array([0.1, 0.1]), np.array([1.0, 64.0]),
                     np.array([0.01, 0.01]), 0.0)


def spec_machines(m, spec):
    curves = tuple(c.with_spec_decode(spec.tokens, spec.draft_fraction, CONTEXT_UNITS)
                   for c in m.curves)
    return dataclasses.replace(m, curves=curves)


def plan(w, spec, seed=0):
    return step_plan(w.prompt_tokens, w.output_tokens, decode_steps(w.output_tokens, spec, seed))


def assert_agree(w, m, steps):
    ref = simulate_reference(w, m, steps=steps)
    fast = setup.simulate_fast(w, m, steps=steps)
    assert fast.keys() == ref.keys()
    for key in ref:
        np.testing.assert_array_equal(fast[key], ref[key], err_msg=key)
    return ref


CLUSTERS = {
    "splitwise": machines([ROLE_PROMPT] * 2 + [ROLE_TOKEN], [9000] * 2 + [60000], kinds=[0, 0, 1]),
    "lent": machines([ROLE_PROMPT] * 3 + [ROLE_TOKEN], [9000] * 3 + [3000], kinds=[0, 0, 1, 1]),
    "baseline": machines([ROLE_BOTH] * 3, [20000] * 3, limit=512),
    "chunked": dataclasses.replace(machines([ROLE_BOTH] * 3, [9000] * 3, kinds=[0, 1, 0]),
                                   chunk_tokens=64),
}


@pytest.mark.parametrize("name", sorted(CLUSTERS))
@pytest.mark.parametrize("spec", [MTP, EAGLE], ids=["mtp", "eagle"])
@pytest.mark.parametrize("seed", range(2))
def test_fast_core_agrees_with_the_reference_per_request(name, spec, seed):
    m = spec_machines(CLUSTERS[name], spec)
    w = workload(200, seed, rate=12.0, prompt=(1, 1500), output=(1, 200))
    steps = plan(w, spec, seed)
    ref = assert_agree(w, m, steps)
    # one inter-token gap per step (the tokens of a step arrive together), none for a 1-token
    # output
    assert ref["itl_histogram"].sum() == int(steps[0].sum() - len(w))
    assert np.all(np.isfinite(ref["finish_s"]))




def run_paused(w, m, steps, pauses=40):
    """The fast core's run with speculative steps, paused at `pauses` instants (as
    tests/test_fast_runs.run_paused); its results and the longest decode run at a pause."""
    state = setup.new_state(m, setup._new_requests(w, steps))
    state.machines.context_units[:] = steps[3]
    state.progress.counts[1] = len(w)
    longest = 0
    for until in np.linspace(0.0, float(w.arrival_s[-1]) * 1.2, pauses + 1)[1:] + 1e-4:
        assert setup._run(state, until) == RUN_PAUSED
        busy = state.machines.busy.astype(bool)
        longest = max(longest, int(state.machines.run_ticks[busy].max(initial=0)))
    assert setup._run(state, INF) == RUN_DONE
    return setup.results(state, failures=len(m.failures) > 0), longest


@pytest.mark.parametrize("name", sorted(PAGED))
@pytest.mark.parametrize("spec", [MTP, EAGLE], ids=["mtp", "eagle"])
def test_paged_spec_decode_agrees_with_the_reference_per_request(name, spec):
    """Paged KV under speculative decoding: blocks follow the tokens the steps accepted; the
    fast core (whole and paused) agrees with the reference request by request, preemptions
    (recomputing prompt + accepted tokens) included."""
    m = spec_machines(PAGED[name], spec)
    preempted = longest = 0
    for seed in range(2):
        w = workload(200, seed, rate=12.0, prompt=(1, 1500), output=(20, 400))
        steps = plan(w, spec, seed)
        ref = assert_agree(w, m, steps)
        paused, run = run_paused(w, m, steps)
        for key in ref:
            np.testing.assert_array_equal(paused[key], ref[key], err_msg=key)
        preempted += int(ref["preemptions"].sum())
        longest = max(longest, run)
        assert np.all(np.isfinite(ref["finish_s"]))
    assert longest > 5  # decode runs of a lone decode, its blocks walked (decode_runs)
    if name in ("baseline", "chunked"):
        assert preempted > 0


def test_paged_spec_decode_counts_tokens_not_steps():
    """By hand. One machine of 64 tokens (4 blocks of 16), two requests of 16 + 41 tokens,
    each 40 tokens after its first in 20 steps of 2: after g units a request holds 16 + 1 +
    2 (g - 1) tokens. A's 9th unit takes it to 33 tokens (3 blocks) beside B's 31 (2 blocks):
    48 + 32 > 64, so B (admitted last) is preempted after 7 steps, waits until A finishes
    (A ends at 57 tokens: 4 blocks), recomputes its 31 tokens (prompt + the 15 accepted, not
    prompt + 8 units) as one prefill and takes its 13 other steps. Counting steps as tokens
    would have held 16 + 9 at A's 9th unit and preempted nothing until much later."""
    w = Workload("t", np.array([0.0, 0.05]), np.array([16, 16]), np.array([41, 41]))
    steps = step_plan(w.prompt_tokens, w.output_tokens, np.array([20, 20]))
    m = dataclasses.replace(machines([ROLE_BOTH], [64]), curves=(FLAT, FLAT), kv_paged=True,
                            kv_watermark=0.0)
    trace: list = []
    ref = simulate_reference(w, m, trace, steps=steps)
    assert ref["preemptions"].tolist() == [1]
    pieces = [(t["start"], c) for t in trace for c in t["chunks"]]
    assert [c for _, c in pieces] == [(0, 16, 0), (1, 16, 0), (1, 31, 0)]
    recompute_start = pieces[-1][0]
    assert recompute_start == pytest.approx(ref["finish_s"][0])
    a_steps = [t for t in trace if 0 in t["decodes"]]
    b_steps = [t for t in trace if 1 in t["decodes"]]
    assert len(a_steps) == len(b_steps) == 20
    assert len([t for t in b_steps if t["end"] <= recompute_start]) == 7
    assert len([t for t in b_steps if t["start"] > recompute_start]) == 13
    assert ref["max_memory_tokens"].tolist() == [64]
    fast, _ = run_paused(w, m, steps, pauses=10)
    for key in ref:
        np.testing.assert_array_equal(fast[key], ref[key], err_msg=key)
    # the same requests one token per step (40 steps): no preemption before A's 17th token
    ones = step_plan(w.prompt_tokens, w.output_tokens, np.array([40, 40]))
    plain = simulate_reference(w, m, steps=ones)
    unit = simulate_reference(w, m)
    for key in unit:
        np.testing.assert_array_equal(plain[key], unit[key], err_msg=key)


FAILURES = np.array([[3.0, 2, 4.0], [5.5, 0, 2.0], [9.25, 3, np.inf]])


@pytest.mark.parametrize("paged", [False, True], ids=["reserve", "paged"])
@pytest.mark.parametrize("recovery", ["recompute", "regenerate", "replicate-host",
                                      "replicate-peer"])
def test_spec_decode_with_failures_agrees_with_the_reference(paged, recovery):
    """Machine failures under speculative decoding: a restart recomputes the prompt + the
    tokens accepted (or regenerates the steps sent, silently), a replica restores those
    tokens' KV; the fast core (whole and paused) agrees with the reference request by
    request, recoveries (and, paged, preemptions) included."""
    base = PAGED["splitwise-chunked"] if paged else CLUSTERS["splitwise"]
    m = dataclasses.replace(
        spec_machines(base, EAGLE), failures=FAILURES[:2] if not paged else FAILURES,
        detection_s=0.5, regenerate=recovery == "regenerate",
        replicate=recovery.startswith("replicate"),
        replica_peer=(np.array([-1, -1, 3, 2][:base.count]) if recovery == "replicate-peer"
                      and base.count == 4 else None))
    w = workload(250, 7, rate=15.0, prompt=(1, 1500), output=(20, 300))
    steps = plan(w, EAGLE, 7)
    ref = assert_agree(w, m, steps)
    paused, _ = run_paused(w, m, steps)
    for key in ref:
        np.testing.assert_array_equal(paused[key], ref[key], err_msg=key)
    assert ref["recoveries"].sum() > 0 and np.all(np.isfinite(ref["finish_s"]))
    # every step sent ends one gap, whatever was recomputed or regenerated
    assert ref["itl_histogram"].sum() == int(steps[0].sum() - len(w))


@pytest.mark.parametrize("regenerate", [False, True], ids=["recompute", "regenerate"])
def test_a_restart_recomputes_the_tokens_accepted(regenerate):
    """By hand. A request of 16 + 41 tokens in 20 steps of 2 on the first of two machines
    (prefill 0.1 s, a step 0.01 s) that fails at 0.155 s, detected at once: it had 5 steps
    (1 + 10 tokens). Recompute: machine 1 prefills 16 + 11 = 27 tokens (0.1 s) and takes the
    15 steps left: done at 0.155 + 0.1 + 0.15. Regenerate: it prefills the prompt (16
    recomputed + the 10 tokens after the first regenerated), then all 20 steps: 0.455 s."""
    w = Workload("t", np.array([0.0]), np.array([16]), np.array([41]))
    steps = step_plan(w.prompt_tokens, w.output_tokens, np.array([20]))
    m = dataclasses.replace(machines([ROLE_BOTH] * 2, [1000] * 2), curves=(FLAT, FLAT),
                            failures=np.array([[0.155, 0, np.inf]]), regenerate=regenerate)
    ref = assert_agree(w, m, steps)
    assert ref["recomputed_tokens"].tolist() == [26 if regenerate else 27]
    assert ref["finish_s"][0] == pytest.approx(0.455 if regenerate else 0.405)
    assert ref["token_machine"].tolist() == [1] and ref["itl_histogram"].sum() == 20


def test_steps_follow_the_acceptance_profile():
    output = np.full(20_000, 1001)
    steps = decode_steps(output, MTP, seed=3)
    assert abs(1000 / steps.mean() - 1.85) < 0.01      # 1 + 0.85 tokens per step
    assert np.all(steps >= 500) and np.all(steps <= 1000)  # 1..k+1 tokens per step
    eagle = decode_steps(output, EAGLE, seed=3)
    assert abs(1000 / eagle.mean() - EAGLE.tokens_per_step) < 0.02   # 1 + .8 + .56 + .336
    assert np.array_equal(decode_steps(output[:50], MTP, seed=3),
                          decode_steps(output[:50], MTP, seed=3))    # seeded
    assert np.array_equal(decode_steps(np.array([1, 2]), EAGLE, seed=0), [0, 1])


def _tpot(m, spec, batch, output=401, prompt=1000):
    """TPOT of `batch` requests arriving together on one token machine (their prompts done
    elsewhere, all admitted at once)."""
    w = workload(batch, 0, rate=1e9, prompt=(prompt, prompt + 1), output=(output, output + 1))
    w = dataclasses.replace(w, arrival_s=np.zeros(batch))
    steps = None if spec is None else plan(w, spec, 1)
    run = simulate_reference(w, m if spec is None else spec_machines(m, spec), steps=steps)
    return float(np.mean((run["finish_s"] - run["first_token_s"]) / (output - 1)))


def test_mtp_at_batch_one_gains_what_the_step_model_implies_and_less_at_large_batch():
    """Issue 39's test. Batch 1 on a memory-bound decode (the decode curve nearly flat from 1
    to 2 tokens): MTP with k = 1 at 85% acceptance gives ~1.85 tokens per step, and TPOT falls
    by the ratio of the step-time model: step / (1.85 x plain decode). At batch 64 the
    verification of 128 tokens costs more than a plain step of 64 (the curve rises), so the
    gain is smaller: here 1.80x at batch 1 against 1.37x at batch 64 (0.43 less)."""
    m = machines([ROLE_PROMPT, ROLE_TOKEN], [200_000, 2_000_000], kinds=[0, 0])
    plain, spec = _tpot(m, None, 1), _tpot(m, MTP, 1)
    spec_curves = CURVES.with_spec_decode(1, MTP.draft_fraction, CONTEXT_UNITS)
    context = 1000 + 200      # mean context of the 400 tokens after the first
    step = float(spec_curves.token_time(1, context * CONTEXT_UNITS))
    token = float(CURVES.token_time(1, context))
    implied = token / (step / 1.85)
    assert abs(plain / spec - implied) / implied < 0.02
    assert 1.75 < plain / spec < 1.86
    big_plain, big_spec = _tpot(m, None, 64), _tpot(m, MTP, 64)
    gain_64 = big_plain / big_spec
    assert gain_64 < plain / spec - 0.35     # 1.37x at batch 64 against 1.80x at batch 1
    assert 1.3 < gain_64 < 1.45


def test_with_spec_decode_curves_price_verification_and_drafting():
    spec = CURVES.with_spec_decode(3, 0.05, CONTEXT_UNITS)
    for b in (1.0, 3.0, 16.0, 40.0, 100.0):
        want = (float(CURVES.token_time(4 * b, 0)) + 3 * 0.05 * float(CURVES.token_time(b, 0)))
        assert float(spec.token_time(b, 0)) == pytest.approx(want, rel=1e-12)
    assert spec.decode_query_tokens == 4
    assert float(spec.token_time(1, CONTEXT_UNITS * 10)) - float(spec.token_time(1, 0)) \
        == pytest.approx(10 * CURVES.context_seconds_per_token)
    # a mixed pass counts 4 tokens per decode
    assert float(spec.mixed_time(100, 8, 0)) >= float(CURVES.prompt_time(132))


def test_default_off_is_the_run_of_before():
    m = CLUSTERS["chunked"]
    w = workload(120, 5, rate=12.0, prompt=(1, 1500), output=(1, 200))
    ones = np.ones(len(w), np.int64)
    unit = (w.output_tokens, w.prompt_tokens + w.output_tokens, ones, 1)
    for run in (simulate_reference, setup.simulate_fast):
        before, explicit = run(w, m), run(w, m, steps=unit)
        for key in before:
            np.testing.assert_array_equal(before[key], explicit[key], err_msg=key)
    assert SLOW.decode_query_tokens == 1


SEARCH = ["search", "--designs", "baseline-h100", "--model", "llama-3.1-8b", "--rate", "2",
          "--duration", "20"]


@pytest.mark.parametrize("args, name", [
    (["--spec-decode", "medusa"], "--spec-decode"),
    (["--spec-decode", "draft:no-such-model"], "--spec-decode"),
    (["--spec-decode", "mtp", "--spec-tokens", "0"], "--spec-tokens"),
    (["--spec-decode", "mtp", "--acceptance", "1.5"], "--acceptance"),
    (["--spec-decode", "eagle", "--spec-tokens", "3", "--acceptance", "0.8,0.7"],
     "--acceptance"),
    (["--spec-tokens", "2"], "--spec-tokens"),
    (["--acceptance", "0.8"], "--acceptance"),
])
def test_bad_spec_decode_options_are_refused_in_one_line(cli, args, name):
    assert_bad_input(cli([*SEARCH, *args]), name)


@pytest.mark.parametrize("spec", [MTP, EAGLE], ids=["mtp", "eagle"])
def test_a_curve_run_under_spec_decode_is_the_whole_run_of_its_chunks_plans(spec):
    """Over a load curve the requests come chunk by chunk, each chunk's steps drawn on its own
    (`with_step_plans`): the streamed run, its slots reused, is the same run as `simulate_fast`
    on every request at once given the chunks' plans end to end, and the harvested latencies
    count output tokens, not steps."""
    from simcore.cluster import Cluster, SimOptions
    from simcore.longrun import curve_chunks, simulate_curve, with_step_plans
    from simcore.simulate import run_machines
    from tests.strategies import CATALOG, MODEL, REFERENCE, SyntheticPerf
    cluster = Cluster(CATALOG.design("splitwise-hh"), 2, 1)
    perf = SyntheticPerf([0.02, 0.05, 0.1, 0.3], [0.01, 0.012, 0.02], 1e-7)
    options = SimOptions(spec_decode=spec, spec_seed=3)
    times, rates, end, edges = [0.0, 20.0, 40.0], [2.0, 6.0, 1.0], 60.0, [0.0, 30.0, 60.0]
    chunks = list(with_step_plans(curve_chunks("coding", times, rates, end, 7, edges, [], 16),
                                  spec, 3))
    assert len(chunks) > 3   # the plans are drawn chunk by chunk
    w = Workload("curve", *(np.concatenate([c[i] for c in chunks]) for i in range(3)))
    plans = [np.concatenate([c[3][i] for c in chunks]) for i in range(3)]
    machines = run_machines(cluster, MODEL, perf, options, end, w)[0]
    whole = setup.simulate_fast(w, machines, (*plans, CONTEXT_UNITS))
    got = {"first_token": np.full(len(w), np.nan), "finish": np.full(len(w), np.nan)}

    def harvest(first, records):
        for key, column in got.items():
            column[first:first + len(records)] = records[key]
    raw = setup.run_streamed(machines, iter(chunks), 64, harvest)
    np.testing.assert_array_equal(got["first_token"], whole["first_token_s"])
    np.testing.assert_array_equal(got["finish"], whole["finish_s"])
    np.testing.assert_array_equal(raw["itl_histogram"], whole["itl_histogram"])
    assert (plans[0] < w.output_tokens).any()   # some steps emitted several tokens
    run = simulate_curve(cluster, "coding", times, rates, end, edges, 7, MODEL, perf, REFERENCE,
                         options, slots=64)   # (its chunks: slots // 4 = 16 requests, as here)
    assert run.feasible and run.requests == len(w)
    tpot = (whole["finish_s"] - whole["first_token_s"]) / (w.output_tokens - 1)
    shown = ~np.isnan(run.latencies.tbt_s)
    np.testing.assert_allclose(run.latencies.tbt_s[shown], tpot[shown].astype(np.float32),
                               rtol=1e-6)


def test_simulate_runs_a_load_curve_with_spec_decode(cli, tmp_path):
    curve = tmp_path / "curve.csv"
    curve.write_text("time_s,rate_rps\n0,2\n600,3\n")
    args = ["simulate", "--design", "splitwise-hh", "--prompt", "2", "--token", "2",
            "--curve-window", "600", "--load-curve", str(curve), "--model", "llama-3.1-8b"]
    plain, spec = cli(args), cli([*args, "--spec-decode", "mtp"])
    assert plain.returncode in (0, 1) and spec.returncode in (0, 1), spec.stderr
    assert "mtp" in spec.stdout and spec.stdout != plain.stdout


def test_spec_file_keys_are_echoed_and_assumed(cli, tmp_path):
    """A spec file's spec_decode, spec_tokens and acceptance (a list): report.json echoes them,
    its sim_options carry the resolved method, and an assumption names it with its source."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("model: llama-3.1-8b\ndesigns: baseline-h100\nrate: 2\nduration: 20\n"
                    "spec_decode: eagle\nspec_tokens: 2\nacceptance: [0.8, 0.6]\n")
    outcome = cli(["search", "--spec", spec, "--no-cache", "-q", "--out", tmp_path / "out"])
    assert outcome.code == 0, outcome.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    options = report["inputs"]["options"]
    assert (options["spec_decode"], options["spec_tokens"], options["acceptance"]) == (
        "eagle", 2, [0.8, 0.6])
    used = report["inputs"]["sim_options"]["spec_decode"]
    assert used["tokens"] == 2 and used["acceptance"] == [0.8, 0.6]
    assert used["tokens_per_step"] == pytest.approx(1 + 0.8 + 0.48)
    (assumed,) = [a["value"] for a in report["assumptions"]
                  if a["name"] == "speculative_decoding"]
    assert "eagle, k=2" in assumed and "EAGLE" in assumed
    # the preset's paged KV admission holds under speculative decoding
    assert report["inputs"]["sim_options"]["kv_admission"] == "paged"
