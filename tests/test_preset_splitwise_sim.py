"""The `splitwise-sim` assumption preset: SplitwiseSim's TBT and SLO references (semantics rows 6
and 11, shared/design/splitwise-sim-semantics.md)."""
from __future__ import annotations

import numpy as np
import pytest

import provisioner
from hardware_catalog import load_catalog
from simcore import Cluster, LatencyCurves, SimOptions, Workload, simulate

CATALOG = load_catalog()
MODEL = CATALOG.model("llama2-70b")
REFERENCE = CATALOG.machine("dgx-a100")


class _Perf:
    """One set of batch-axis curves (with a context term) for every machine."""
    curves_ = LatencyCurves(np.array([1.0, 512.0, 2048.0, 8192.0]),
                            np.array([0.05, 0.09, 0.3, 1.5]), np.array([1.0, 16.0, 64.0]),
                            np.array([0.03, 0.032, 0.05]), 2e-7)

    def curves(self, model, machine):
        return self.curves_


def _run(per_token: bool):
    rng = np.random.default_rng(7)
    n = 60
    workload = Workload("w", np.sort(rng.uniform(0, 2, n)), rng.integers(10, 3000, n),
                        np.r_[1, 1, rng.integers(2, 300, n - 2)])
    cluster = Cluster(CATALOG.design("baseline-h100"), 2)
    return simulate(cluster, workload, MODEL, _Perf(), REFERENCE,
                    SimOptions(tbt_per_output_token=per_token))


def test_tbt_over_output_tokens_keeps_the_reference_per_token():
    """SplitwiseSim divides the measured TBT by the output tokens but not its reference (the
    token curve at x = prompt size, a time per token of the request alone): on the same run the
    TBT slowdowns shrink by (n - 1) / n, 1-token outputs count with slowdown 0 (their TBT is
    0, the reference is not), and the E2E reference (TTFT reference + (n - 1) x TBT reference)
    is the uncontended E2E, so E2E slowdowns are unchanged. Dividing both by n changed nothing."""
    gaps, per_token = _run(False), _run(True)
    n = gaps.workload.output_tokens
    many = n > 1
    np.testing.assert_array_equal(gaps.first_token_s, per_token.first_token_s)
    np.testing.assert_allclose(per_token.tbt_slowdown[many],
                               gaps.tbt_slowdown[many] * (n[many] - 1) / n[many], rtol=1e-12)
    assert np.all(np.isnan(gaps.tbt_slowdown[~many]))
    np.testing.assert_array_equal(per_token.tbt_slowdown[~many], 0.0)
    np.testing.assert_allclose(per_token.e2e_slowdown, gaps.e2e_slowdown, rtol=1e-12)
    np.testing.assert_array_equal(per_token.ttft_slowdown, gaps.ttft_slowdown)


def _slo(assumptions: str) -> dict:
    run = provisioner.simulate(design="baseline-h100", machines=40, rate=120, model="llama2-70b",
                               workload="conversation", assumptions=assumptions)
    return {key: check["value"] for key, check in run.report.as_dict()["slo"].items()}


def test_presets_give_different_tbt_slowdowns_on_the_issue_example():
    """Issue 23's example: the nine slowdowns were the same under both presets. SplitwiseSim's
    TBT (over output tokens, reference undivided) is the smaller one."""
    ours, theirs = _slo("provision"), _slo("splitwise-sim")
    for pct in ("p50", "p90", "p99"):
        assert theirs[f"tbt_{pct}"] < ours[f"tbt_{pct}"]
    assert theirs != ours
