"""`provision calibrate`: profile validation, held-out error, and the coefficients file round trip."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hardware_catalog import load_catalog
from simcore.perfcalib import calibrate, clean_profile, read_profile_csv, select_rows
from simcore.perfmodel import FittedPerformanceModel, default_performance_model, load_performance_model

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
PROFILE = SHARED / "profiles" / "splitwise_sim_perf_model.csv"
CATALOG = load_catalog()

TARGET_PCT = {"prompt": 3.0, "token": 2.0}
# The repeats of this group scatter by up to 45% (e.g. 50.9-74.1 ms at one grid point); even a
# per-grid-point median lookup scores 2.7% in-sample, so the 3% target sits at its noise floor.
NOISE_FLOOR_PCT = {("llama2-70b", "h100-80gb", "prompt"): 3.5}


def synthetic_profile(scale: float = 2.0) -> pd.DataFrame:
    """SplitwiseSim-shaped sweeps generated from the default llama2-70b/A100 closed form x scale."""
    truth = default_performance_model().coefficients(CATALOG.model("llama2-70b"),
                                                     CATALOG.machine("dgx-a100"))
    sizes = [128, 256, 512, 1024, 2048, 4096, 8192] + [512] * 6
    batch = [1] * 7 + [2, 4, 8, 16, 32, 64]
    rows = pd.DataFrame({"model": "llama2-70b", "hardware": "a100-80gb", "tensor_parallel": 8,
                         "prompt_size": sizes * 2, "batch_size": batch * 2, "token_size": 128})
    n = rows.batch_size
    noise = np.repeat([1.0, 1.01], 13)  # two repeats of every point, 1% apart
    rows["prompt_time"] = scale * truth.prompt.seconds(rows.prompt_size * n, n) * 1000 * noise
    rows["token_time"] = scale * truth.decode.seconds(n, n * (rows.prompt_size + 64)) * 1000 * noise
    return rows


@pytest.fixture()
def synthetic_csv(tmp_path) -> Path:
    path = tmp_path / "profile.csv"
    synthetic_profile().to_csv(path, index=False)
    return path


@pytest.mark.skipif(not PROFILE.exists(), reason="needs ../shared/profiles")
def test_calibrate_on_the_shared_profile_reaches_the_random_split_targets():
    rows = select_rows(read_profile_csv(PROFILE), 8, ("h100-80gb-pcap",))
    result = calibrate(rows, seed=0)
    assert result.duplicates_dropped == 40 and result.rows == 380
    assert len(result.errors) == 8
    for e in result.errors:
        limit = NOISE_FLOOR_PCT.get((e.model, e.hardware, e.phase), TARGET_PCT[e.phase])
        assert e.test_rows == 19 and e.mape_pct <= limit, e


@pytest.mark.skipif(not PROFILE.exists(), reason="needs ../shared/profiles")
def test_preemption_artefacts_are_exactly_the_tp2_batch64_rows():
    profile = read_profile_csv(PROFILE)
    clean, _, artefacts = clean_profile(profile)
    unique = profile.drop_duplicates(subset=[c for c in profile.columns if c != "row"])
    dropped = unique[~unique.row.isin(clean.row)]
    assert artefacts == 15
    assert set(dropped.tensor_parallel) == {2} and set(dropped.batch_size) == {64}


def test_out_file_round_trips_through_load_performance_model(tmp_path, synthetic_csv, run_cli):
    for name in ("coefficients.json", "coefficients.yaml"):
        out = tmp_path / name
        done = run_cli("calibrate", str(synthetic_csv), "--out", str(out))
        assert done.returncode == 0, done.stderr
        fitted = calibrate(read_profile_csv(synthetic_csv)).groups
        model, machine = CATALOG.model("llama2-70b"), CATALOG.machine("dgx-a100")
        loaded = load_performance_model(out, load_catalog()).curves(model, machine)
        direct = FittedPerformanceModel(fitted).curves(model, machine)
        np.testing.assert_array_equal(loaded.prompt_seconds, direct.prompt_seconds)
        np.testing.assert_array_equal(loaded.decode_seconds, direct.decode_seconds)
        assert loaded.context_seconds_per_token == direct.context_seconds_per_token
        # the file really replaces the default: the synthetic machine is twice as slow
        default = default_performance_model().curves(model, machine)
        assert loaded.token_time(8, 0) == pytest.approx(2 * default.token_time(8, 0), rel=0.02)


def test_json_output_is_one_document_with_held_out_errors(synthetic_csv, run_cli):
    done = run_cli("calibrate", str(synthetic_csv), "--json", "--seed", "3")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["seed"] == 3 and document["rows"] == 26
    phases = {e["phase"]: e for e in document["held_out"]}
    assert set(phases) == {"prompt", "token"}
    assert all(e["test_rows"] == 5 and e["mape_pct"] < 2.0 for e in phases.values())
    assert document["coefficients"]["groups"][0]["reference"]["layers"] == 80


def test_table_output_lists_each_group_and_phase(synthetic_csv, run_cli):
    done = run_cli("calibrate", str(synthetic_csv))
    assert done.returncode == 0, done.stderr
    assert "llama2-70b" in done.stdout and "prompt" in done.stdout and "token" in done.stdout


GOOD_HEADER = "model,hardware,tensor_parallel,prompt_size,batch_size,token_size,prompt_time,token_time"
BAD_PROFILES = {
    "empty": ("", "file is empty"),
    "header-only": (GOOD_HEADER + "\n", "has a header but no rows"),
    "missing-column": ("model,hardware,tensor_parallel,prompt_size,batch_size,token_size,"
                       "prompt_time\nm,h,8,512,1,128,90\n", "missing column 'token_time'"),
    "non-numeric": (GOOD_HEADER + "\nm,h,8,512,1,128,90,45\nm,h,8,512,2,128,fast,46\n",
                    "row 3, field 'prompt_time'"),
    "zero": (GOOD_HEADER + "\nm,h,8,512,0,128,90,45\n", "row 2, field 'batch_size'"),
    "negative": (GOOD_HEADER + "\nm,h,8,512,1,128,90,-45\n", "row 2, field 'token_time'"),
    "fractional": (GOOD_HEADER + "\nm,h,8,512.5,1,128,90,45\n", "row 2, field 'prompt_size'"),
    "blank-model": (GOOD_HEADER + "\n,h,8,512,1,128,90,45\n", "row 2, field 'model'"),
}


@pytest.mark.parametrize("name", sorted(BAD_PROFILES))
def test_calibrate_rejects_malformed_csv_with_exit_code_2(tmp_path, name, run_cli):
    text, fragment = BAD_PROFILES[name]
    path = tmp_path / f"{name}.csv"
    path.write_text(text)
    done = run_cli("calibrate", str(path))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and fragment in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_calibrate_missing_file_and_empty_filter_exit_2(tmp_path, synthetic_csv, run_cli):
    assert run_cli("calibrate", str(tmp_path / "nope.csv")).returncode == 2
    assert run_cli("calibrate", str(synthetic_csv), "--tp", "4").returncode == 2
