"""Smaller cases of issue 34: an input is refused where it is wrong, naming what is wrong.

- a trace request longer than the model has room for names the trace file, its row and
  column (not `model`);
- a catalog machine of 1,024 GPUs (the documented limit) is searched at the layouts that have
  performance data (the warm-up no longer runs its whole-machine layout, which has none);
- an option that cannot apply to the question is refused naming both options, as the caller
  spelled them: `--duration` beside `simulate --load-curve`, `--tp-prompt` / `--tp-token` when
  no design of the question has a separate prompt or token pool.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import provisioner
from hardware_catalog import DATA_DIR, InputError
from provisioner.options import SearchOptions, from_keywords
from provisioner.question import merge_options, resolve_study

LONG_TRACE = "arrival_s,prompt_tokens,output_tokens\n0,100,10\n0.5,9999000,10\n1,100,10\n"
AZURE_TRACE = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
               "2023-11-16 18:15:46.6805900,4808,10\n"
               "2023-11-16 18:15:47.1000000,120,8\n"
               "2023-11-16 18:15:47.6805900,9000000,10\n")
BLOOM_ON_A100 = ["--design", "splitwise-aa", "--prompt", "20", "--token", "20",
                 "--model", "bloom-176b"]


# ------------------------------------------------------------ a request longer than fits
@pytest.fixture
def long_trace(tmp_path) -> Path:
    path = tmp_path / "long.csv"
    path.write_text(LONG_TRACE)
    return path


def test_simulate_names_the_trace_row_that_does_not_fit(cli, bad_input, long_trace):
    line = bad_input(cli(["simulate", *BLOOM_ON_A100, "--workload", long_trace]),
                     "long.csv", "row 3", "'prompt_tokens'", "9,999,000 prompt + 10 output")
    assert "'model'" not in line


def test_a_pinned_layout_too(cli, bad_input, long_trace):
    bad_input(cli(["simulate", *BLOOM_ON_A100, "--workload", long_trace, "--tp", "8",
                   "--pp", "2"]), "long.csv", "row 3", "'prompt_tokens'")


def test_search_names_the_trace_row_that_does_not_fit(cli, bad_input, long_trace, tmp_path):
    line = bad_input(cli(["search", "--designs", "splitwise-aa", "--model", "bloom-176b",
                          "--workload", long_trace, "--no-cache", "--out", tmp_path / "out"]),
                     "long.csv", "row 3", "'prompt_tokens'")
    assert "'model'" not in line and not (tmp_path / "out").exists()


def test_an_azure_trace_names_its_own_column(cli, bad_input, tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(AZURE_TRACE)
    bad_input(cli(["search", "--designs", "splitwise-aa", "--model", "bloom-176b",
                   "--workload", path, "--no-cache", "--out", tmp_path / "out"]),
              "azure.csv", "row 4", "'ContextTokens'")


def test_from_python_too(long_trace):
    with pytest.raises(InputError, match=r"long\.csv, row 3, field 'prompt_tokens'"):
        provisioner.simulate(design="splitwise-aa", prompt=20, token=20, model="bloom-176b",
                             workload=str(long_trace))


def test_a_model_too_large_for_any_layout_still_blames_the_model(cli, bad_input, tmp_path):
    """Only the request's length is the trace's fault: a model no layout holds at all is."""
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "models.yaml").write_text(yaml.safe_dump({"huge": {
        "layers": 400, "hidden": 65536, "heads": 512, "kv_heads": 64, "params_b": 20000,
        "intermediate_size": 262144, "vocab_size": 32000}}))
    path = tmp_path / "short.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,10\n")
    bad_input(cli(["simulate", "--design", "splitwise-aa", "--prompt", "20", "--token", "20",
                   "--model", "huge", "--catalog", catalog, "--workload", path]), "'model'")


# ------------------------------------------------------------ a 1,024-GPU machine
@pytest.fixture
def big_machine(tmp_path) -> Path:
    """A catalog overlay with a DGX-H100 of 1,024 GPUs (the catalog's limit, MAX_GPUS)."""
    machines = yaml.safe_load((DATA_DIR / "machines.yaml").read_text())
    entry = {k: v for k, v in machines["dgx-h100"].items() if k != "sources"}
    entry["gpus"] = 1024
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "machines.yaml").write_text(yaml.safe_dump({"big-h100": entry}))
    return catalog


def test_a_1024_gpu_machine_is_searched(cli, big_machine, tmp_path):
    out = tmp_path / "out"
    run = cli(["search", "--catalog", big_machine, "--designs", "big-h100/big-h100",
               "--model", "llama2-70b", "--duration", "5", "--verify-seeds", "2",
               "--no-cache", "--quiet", "--out", out])
    assert run.returncode == 0, run.stderr
    assert "no performance data" not in run.stderr
    (design,) = json.loads((out / "report.json").read_text())["designs"]
    assert design["feasible"]
    assert all(pool["tp"] < 1024 for pool in design["optimum"]["layout"].values())


def test_simulating_it_unpinned_runs_tp8_instances(cli, big_machine):
    """A machine of more than 8 GPUs (an NVL72 rack) runs TP8 instances unless pinned: the
    kernel data measure all-reduce over 2 to 8 GPUs (MachineSku.instance_tp)."""
    run = cli(["simulate", "--catalog", big_machine, "--design", "big-h100/big-h100",
               "--prompt", "1", "--token", "1", "--model", "llama2-70b",
               "--engine", "splitwise-2023", "--duration", "1", "--rate", "5"])
    assert run.returncode == 0, run.stderr
    assert "TP1024" not in run.stdout + run.stderr
    run = cli(["simulate", "--catalog", big_machine, "--design", "big-h100/big-h100",
               "--prompt", "1", "--token", "1", "--model", "llama2-70b", "--duration", "1",
               "--rate", "5", "--tp", "8"])
    assert run.returncode == 0, run.stderr


# ------------------------------------------------------------ options that cannot apply
@pytest.fixture
def curve(tmp_path) -> Path:
    path = tmp_path / "curve.csv"
    path.write_text("time_s,rate_rps\n0,5\n60,10\n120,5\n")
    return path


CURVE_RUN = ["simulate", "--design", "splitwise-hh", "--prompt", "2", "--token", "1",
             "--model", "llama2-70b", "--curve-window", "60"]


def test_duration_beside_a_load_curve(cli, bad_input, curve, tmp_path):
    bad_input(cli([*CURVE_RUN, "--load-curve", curve, "--duration", "30"]),
              "--duration cannot be used with --load-curve", "the curve sets the run's length")
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"load_curve: {curve}\nduration: 30\n")
    bad_input(cli([*CURVE_RUN, "--spec", spec]),
              "duration cannot be used with load_curve")
    with pytest.raises(InputError, match="duration= cannot be used with load_curve="):
        provisioner.simulate(design="splitwise-hh", prompt=2, token=1, model="llama2-70b",
                             load_curve=str(curve), curve_window=60, duration=30)


@pytest.mark.parametrize("pin", ["--tp-prompt", "--tp-token"])
def test_a_split_pool_pin_on_a_baseline(cli, bad_input, pin, tmp_path):
    bad_input(cli(["simulate", "--design", "baseline-h100", "--machines", "2",
                   "--model", "llama2-70b", "--duration", "1", pin, "4"]),
              f"{pin} cannot be used with --design baseline-h100", "--tp")
    bad_input(cli(["search", "--designs", "baseline-h100,sarathi-h100", "--model",
                   "llama2-70b", "--duration", "1", pin, "4", "--no-cache",
                   "--out", tmp_path / "out"]),
              f"{pin} cannot be used with --designs baseline-h100, sarathi-h100")
    key = pin.removeprefix("--").replace("-", "_")
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"{key}: 4\n")
    bad_input(cli(["simulate", "--spec", spec, "--design", "baseline-h100", "--machines", "2",
                   "--model", "llama2-70b", "--duration", "1"]),
              f"{key} cannot be used with --design baseline-h100")
    with pytest.raises(InputError, match=f"{key}= cannot be used with design= baseline-h100"):
        provisioner.simulate(design="baseline-h100", machines=2, model="llama2-70b",
                             duration=1, **{key: 4})


def test_a_split_pool_pin_applies_when_some_design_has_the_pool():
    """--designs all (or any list with a Splitwise design): the pin is for those designs, the
    colocated ones search their own layouts."""
    for designs in ("all", "baseline-h100,splitwise-hh"):
        study = resolve_study(merge_options(SearchOptions, from_keywords(SearchOptions, {
            "designs": designs, "model": "llama2-70b", "tp_prompt": 4, "duration": 1.0})))
        assert study.layout.tp_prompt == 4
