"""`search --mixed-pool/--no-mixed-pool` and the spec key `mixed_pool` (issue 37).

Splitwise's mixed pool lets prompt machines decode and token machines prefill when their own
pool is loaded; Dynamo and llm-d deployments run pure pools. The option reaches the
simulations, is echoed in report.json (which `check` re-derives), works from a spec file and
the Python API, is said in the terminal and in the disaggregated-vs-chunked verdict, and is
refused where no design of the question has separate pools. Left out, each design keeps its
own setting (the default search is unchanged).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import provisioner
from hardware_catalog import InputError
from provisioner.options import SearchOptions, from_keywords
from provisioner.question import merge_options, options_from_echo, resolve_study, to_echo

TINY = ["--designs", "splitwise-hh", "--model", "llama2-70b", "--duration", "20",
        "--verify-seeds", "2", "--rate", "5", "--no-cache", "--jobs", "1"]
SPLIT_AND_CHUNKED = ["--designs", "splitwise-hh,sarathi-h100", *TINY[2:]]


def _search(cli, out: Path, *args) -> tuple[dict, str]:
    outcome = cli(["search", *args, "--out", out])
    assert outcome.code == 0, outcome.stderr
    return json.loads((out / "report.json").read_text()), outcome.stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cli) -> dict:
    """The tiny question three ways: as asked (each design's own), --mixed-pool, --no-mixed-pool."""
    folder = tmp_path_factory.mktemp("mixed")
    found = {}
    for name, flag in (("own", ()), ("on", ("--mixed-pool",)), ("off", ("--no-mixed-pool",))):
        document, stdout = _search(cli, folder / name, *TINY, *flag)
        found[name] = {"report": document, "stdout": stdout, "out": folder / name,
                       "csv": (folder / name / "evaluations.csv").read_text()}
    return found


def _optimum_cost(document: dict) -> float:
    (design,) = document["designs"]
    return design["optimum"]["cost_per_hour"]


def _study(**keywords):
    return resolve_study(merge_options(SearchOptions, from_keywords(SearchOptions, keywords)))


# ------------------------------------------------------------------ it reaches the simulations
def test_no_mixed_pool_reaches_the_simulations(runs):
    on, off = runs["on"], runs["off"]
    # the design record every point simulates carries the setting, and the simulation options
    # the report echoes say it
    assert on["report"]["inputs"]["designs"][0]["mixed_pool"] is True
    assert off["report"]["inputs"]["designs"][0]["mixed_pool"] is False
    assert off["report"]["inputs"]["sim_options"]["mixed_pool"] is False
    # the samples differ (the prompt machine no longer decodes when the token pool is loaded)
    assert on["csv"] != off["csv"]
    # pure pools never need fewer machines than pools that lend each other work
    assert _optimum_cost(off["report"]) >= _optimum_cost(on["report"])


def test_left_out_each_design_keeps_its_own(runs):
    own, on = runs["own"], runs["on"]
    assert own["report"]["inputs"]["options"]["mixed_pool"] is None
    assert own["report"]["inputs"]["sim_options"]["mixed_pool"] is None
    # splitwise-hh's own setting is on: the same simulations as --mixed-pool
    assert own["csv"] == on["csv"]
    assert own["report"]["designs"] == on["report"]["designs"]


def test_the_terminal_says_which_was_used(runs):
    assert "Mixed pool: off (--no-mixed-pool)" in runs["off"]["stdout"]
    assert "Mixed pool: on (--mixed-pool)" in runs["on"]["stdout"]
    assert "Mixed pool: each design's own (on" in runs["own"]["stdout"]


# --------------------------------------------------------------------- echoed, re-derived
def test_it_is_echoed_and_check_re_derives_it(runs, cli, tmp_path):
    document = runs["off"]["report"]
    assert document["inputs"]["options"]["mixed_pool"] is False
    options = options_from_echo(document["inputs"], "report.json")
    assert options.question.mixed_pool is False
    outcome = cli(["check", runs["off"]["out"] / "report.json", "--no-cache", "--jobs", "1"])
    assert (outcome.code, outcome.stderr) == (0, ""), outcome.stdout + outcome.stderr
    # the echo is what check runs: flipped, the re-derived report (with the mixed pool) differs
    flipped = json.loads(json.dumps(document))
    flipped["inputs"]["options"]["mixed_pool"] = True
    report = tmp_path / "report.json"
    report.write_text(json.dumps(flipped))
    outcome = cli(["check", report, "--no-cache", "--jobs", "1"])
    assert outcome.code == 1, outcome.stdout + outcome.stderr
    # an edited echo that is not a flag is bad input naming the key
    flipped["inputs"]["options"]["mixed_pool"] = "off"
    report.write_text(json.dumps(flipped))
    outcome = cli(["check", report, "--no-cache", "--jobs", "1"])
    assert outcome.code == 2 and "inputs.options.mixed_pool" in outcome.stderr, outcome.stderr


def test_the_cache_tells_the_settings_apart():
    own = _study(designs="splitwise-hh", model="llama2-70b")
    off = _study(designs="splitwise-hh", model="llama2-70b", mixed_pool=False)
    from provisioner.question import identity
    assert identity(own) != identity(off)
    # left out, the key is what it was before the option existed (the simulation options'
    # mixed_pool was already there, None)
    assert identity(own)["sim_options"]["mixed_pool"] is None


# ---------------------------------------------------------------- spec file, Python API
def test_the_spec_key(runs, cli, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("mixed_pool: false\n")
    document, stdout = _search(cli, tmp_path / "out", "--spec", spec, *TINY)
    assert document["inputs"]["options"]["mixed_pool"] is False
    assert (tmp_path / "out" / "evaluations.csv").read_text() == runs["off"]["csv"]
    assert "Mixed pool: off" in stdout
    # the command line wins over the spec file
    on = merge_options(SearchOptions, {"mixed_pool": True}, spec)
    assert on.question.mixed_pool is True
    spec.write_text("mixed_pool: 'no'\n")
    with pytest.raises(InputError, match="mixed_pool.*true or false"):
        merge_options(SearchOptions, {}, spec)


def test_the_python_api():
    study = _study(designs="all", model="llama2-70b", mixed_pool=False)
    split = [d for d in study.designs if not d.is_baseline]
    assert split and all(d.mixed_pool is False for d in split)
    assert to_echo(study)["options"]["mixed_pool"] is False
    with pytest.raises(InputError, match="mixed_pool= must be true or false"):
        from_keywords(SearchOptions, {"mixed_pool": "off"})
    result = provisioner.search(designs="splitwise-hh", model="llama2-70b", duration=20,
                                verify_seeds=2, rate=5, mixed_pool=False, no_cache=True, jobs=1)
    assert result.to_dict()["inputs"]["options"]["mixed_pool"] is False
    assert result.designs[0].design.mixed_pool is False


# ------------------------------------------------------------ the verdict: like with like
def test_the_verdict_says_how_the_disaggregated_designs_ran(cli, tmp_path):
    off, stdout = _search(cli, tmp_path / "off", *SPLIT_AND_CHUNKED, "--no-mixed-pool")
    view = off["summary"]["disaggregated_vs_chunked"]
    assert view["sentence"].endswith(
        "The disaggregated designs ran without the mixed pool (--no-mixed-pool): pure prefill "
        "and decode pools, as Dynamo and llm-d run them."), view["sentence"]
    assert "ran without the mixed pool" in stdout
    # the same results, said for --mixed-pool and for each design's own (the default report's
    # sentence is what it was)
    from provisioner.chunked import comparison
    result = provisioner.search(designs="splitwise-hh,sarathi-h100", model="llama2-70b",
                                duration=20, verify_seeds=2, rate=5, mixed_pool=False,
                                no_cache=True, jobs=1)
    assert result.to_dict()["summary"]["disaggregated_vs_chunked"]["sentence"] == \
        view["sentence"]
    on = comparison(result.designs, "min-cost", 5.0, mixed_pool=True)["sentence"]
    assert on.endswith("The disaggregated designs ran with the mixed pool (--mixed-pool): "
                       "prompt machines decode and token machines prefill when their own "
                       "pool is loaded."), on
    own = comparison(result.designs, "min-cost", 5.0)["sentence"]
    assert "mixed pool" not in own and view["sentence"].startswith(own)


# --------------------------------------------------------------------- where it cannot apply
def test_refused_when_no_design_has_separate_pools(cli, bad_input, tmp_path):
    out = tmp_path / "out"
    bad_input(cli(["search", "--designs", "sarathi-h100", "--model", "llama2-70b",
                   "--no-mixed-pool", "--no-cache", "--out", out]),
              "--mixed-pool cannot be used with --designs sarathi-h100",
              "a colocated design has one pool")
    bad_input(cli(["search", "--designs", "baseline-h100,sarathi-h100", "--model",
                   "llama2-70b", "--mixed-pool", "--no-cache", "--out", out]),
              "--mixed-pool cannot be used with --designs baseline-h100, sarathi-h100")
    assert not out.exists()
    spec = tmp_path / "spec.yaml"
    spec.write_text("mixed_pool: false\ndesigns: baseline-h100\n")
    bad_input(cli(["search", "--spec", spec, "--model", "llama2-70b", "--no-cache",
                   "--out", out]), "mixed_pool cannot be used with designs baseline-h100")
    with pytest.raises(InputError, match="mixed_pool= cannot be used with designs= "
                                         "baseline-h100"):
        provisioner.search(designs="baseline-h100", model="llama2-70b", mixed_pool=False)


def test_accepted_beside_colocated_designs():
    """--designs all (or a list with one Splitwise design): the colocated designs ignore it."""
    for designs in ("all", "baseline-h100,splitwise-hh"):
        study = _study(designs=designs, model="llama2-70b", mixed_pool=False)
        by_name = {d.name: d for d in study.designs}
        assert by_name["splitwise-hh"].mixed_pool is False
        assert by_name["baseline-h100"].as_dict() == _study(
            designs="baseline-h100", model="llama2-70b").designs[0].as_dict()
