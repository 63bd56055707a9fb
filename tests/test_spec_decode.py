"""Speculative decoding (issue 39, `simcore.specdecode`): the fast core against the reference
with it on (decode runs, mixed pools, chunked prefill), the step-time model's gain at batch 1
and at large batch, default-off runs unchanged, and bad option values refused."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from simcore.cluster import ROLE_BOTH, ROLE_PROMPT, ROLE_TOKEN
from simcore.fast import setup
from simcore.refsim import simulate_reference
from simcore.specdecode import CONTEXT_UNITS, SpecDecode, decode_steps, step_plan
from tests.harness import assert_bad_input
from tests.test_fast_runs import CURVES, SLOW, machines, workload

MTP = SpecDecode("mtp", 1, (0.85,), 1 / 80)
EAGLE = SpecDecode("eagle", 3, (0.8, 0.7, 0.6), 1 / 32)


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
    (["--spec-decode", "mtp", "--mtbf-hours", "100"], "--mtbf-hours"),
    (["--spec-decode", "mtp", "--kv-admission", "paged"], "--kv-admission"),
])
def test_bad_spec_decode_options_are_refused_in_one_line(cli, args, name):
    assert_bad_input(cli([*SEARCH, *args]), name)


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
    # KV reserved up front under speculative decoding (paged, the default, gives way)
    assert report["inputs"]["sim_options"]["kv_admission"] == "reserve"
