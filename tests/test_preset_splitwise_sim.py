"""The `splitwise-sim` assumption preset: SplitwiseSim's TBT and SLO references (semantics rows 6
and 11, shared/design/splitwise-sim-semantics.md)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import provisioner
from hardware_catalog import load_catalog
from provisioner.presets import preset_catalog, preset_perf
from provisioner.study import PerfSource
from simcore import Cluster, LatencyCurves, SimOptions, Workload, simulate

CATALOG = load_catalog()
MODEL = CATALOG.model("llama2-70b")
REFERENCE = CATALOG.machine("dgx-a100")


class _Perf:
    """One set of batch-axis curves (with a context term) for every machine."""
    curves_ = LatencyCurves(np.array([1.0, 512.0, 2048.0, 8192.0]),
                            np.array([0.05, 0.09, 0.3, 1.5]), np.array([1.0, 16.0, 64.0]),
                            np.array([0.03, 0.032, 0.05]), 2e-7)

    def curves(self, model, machine, tp=None):
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
                               workload="conversation", assumptions=assumptions,
                               engine="splitwise-2023")   # the issue's latencies (2023 model)
    return {key: check["value"] for key, check in run.report.as_dict()["slo"].items()}


def test_presets_give_different_tbt_slowdowns_on_the_issue_example():
    """Issue 23's example: the nine slowdowns were the same under both presets. SplitwiseSim's
    TBT (over output tokens, reference undivided) is the smaller one."""
    ours, theirs = _slo("provision"), _slo("splitwise-sim")
    for pct in ("p50", "p90", "p99"):
        assert theirs[f"tbt_{pct}"] < ours[f"tbt_{pct}"]
    assert theirs != ours


# ------------------------------------------------------------ SplitwiseSim's latency model
PROFILE = Path(__file__).resolve().parents[1].parent / "shared" / "profiles" / \
    "splitwise_sim_perf_model.csv"


def _preset_curves(model: str, machine: str) -> LatencyCurves:
    catalog = preset_catalog("splitwise-sim", load_catalog())
    perf = preset_perf("splitwise-sim", PerfSource()).load(catalog)
    return perf.curves(catalog.model(model), catalog.machine(machine))


def test_preset_decode_is_flat_in_the_batch_as_splitwise_sim_looks_it_up():
    """Semantics row 9: BLOOM-176B on H100, 35.3 ms at batch 1 and 36.2 ms at 512 (its profile
    measured 63.8 ms at batch 64); no context term; mixed = 1.1 x prompt curve at prompt +
    decode tokens (row 10); TBT reference = token curve at x = prompt size (row 11)."""
    h100 = _preset_curves("bloom-176b", "dgx-h100")
    assert h100.decode_axis == "batch_tokens" and h100.context_seconds_per_token == 0
    assert float(h100.token_time(1, 0)) == pytest.approx(0.0353, abs=5e-5)
    assert float(h100.token_time(512, 10**6)) == pytest.approx(0.0362, abs=5e-5)
    assert float(h100.mixed_time(1000, 24, 5000)) == pytest.approx(
        1.1 * float(h100.prompt_time(1024)))
    np.testing.assert_allclose(h100.reference_token_time(np.array([700, 3000]), np.array([5, 9])),
                               h100.token_time(np.array([700.0, 3000.0]), 0))
    capped = _preset_curves("bloom-176b", "dgx-h100-cap")
    assert float(capped.prompt_time(2048)) == pytest.approx(1.3 * float(h100.prompt_time(2048)))
    assert float(capped.token_time(64, 0)) == float(h100.token_time(64, 0))
    # a machine its profiles do not cover keeps the default model
    h200 = _preset_curves("bloom-176b", "h200")
    assert h200.decode_axis == "batch" and h200.mixed_prompt_factor == 1.0


@pytest.mark.skipif(not PROFILE.exists(), reason="needs ../shared/profiles")
def test_preset_curves_are_splitwise_sims_interpolation_of_its_profiles():
    """Its DatabasePerformanceModel: per x = prompt_size x batch_size the median latency,
    interpolated and extrapolated linearly (interp1d(fill_value="extrapolate"))."""
    import pandas as pd
    db = pd.read_csv(PROFILE)
    for model, hardware, machine in (("bloom-176b", "a100-80gb", "dgx-a100"),
                                     ("llama2-70b", "h100-80gb", "dgx-h100")):
        rows = db[(db.model == model) & (db.hardware == hardware) & (db.tensor_parallel == 8)]
        x = rows.prompt_size * rows.batch_size
        curves = _preset_curves(model, machine)
        def token_time(q, curves=curves):
            return curves.token_time(q, 0)
        for column, ours in (("prompt_time", curves.prompt_time), ("token_time", token_time)):
            median = (rows[column] / 1000).groupby(x).median()
            for q in (1, 17, 128, 300, 1500, 8192, 20000, 40000):
                expected = np.interp(q, median.index, median.values)
                if q < median.index[0] or q > median.index[-1]:
                    i, j = (0, 1) if q < median.index[0] else (-2, -1)
                    slope = ((median.values[j] - median.values[i])
                             / (median.index[j] - median.index[i]))
                    expected = median.values[i] + slope * (q - median.index[i])
                assert float(ours(q)) == pytest.approx(expected, rel=1e-12)


def test_check_rederives_a_preset_report_under_its_preset(tmp_path):
    """report.json echoes the preset (inputs.options.assumptions), so `provision check`
    re-derives the same optima with the preset's catalog, options and latency model."""
    from provisioner.check import check_report
    from provisioner.options import Execution
    small = dict(model="llama2-70b", rate=6.0, duration=20.0, jobs=1, verify_seeds=2,
                 designs="splitwise-hh,baseline-a100")
    result = provisioner.search(assumptions="splitwise-sim", **small)
    assert result.to_dict()["inputs"]["options"]["assumptions"] == "splitwise-sim"
    assert "latency_model" in result.to_dict()["inputs"]["perf_model"]
    result.write(tmp_path / "out")
    checked = check_report(tmp_path / "out" / "report.json", Execution(no_cache=True, jobs=1))
    assert checked.changes == [] and checked.notes == []
    plain = provisioner.search(**small).to_dict()["inputs"]
    assert plain["options"]["assumptions"] == "provision"
    assert "latency_model" not in plain["perf_model"]
