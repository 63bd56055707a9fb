"""Issue 34: one reading edge. Load curves read by header name, repeated options merged or
refused, duplicates in a list refused (each case failed before: a curve read by position, the
last --price kept, --hardware given twice searching only its last list)."""
from __future__ import annotations

import json

import pytest

from hardware_catalog import InputError
from provisioner.loadcurve import read_load_curve

SIM = ["simulate", "--design", "splitwise-hh", "--prompt", "1", "--token", "1",
       "--model", "llama2-70b"]


def test_a_curve_is_read_by_its_header_names(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("rate_rps,time_s\n5,0\n10,60\n20,120\n")
    curve = read_load_curve(str(path))
    assert curve.times == (0.0, 60.0, 120.0) and curve.rates == (5.0, 10.0, 20.0)


@pytest.mark.parametrize("text,words", [
    ("5,0\n10,60\n20,120\n", ["holds numbers", "time_s,rate_rps"]),      # no header
    ("time_s,time_s\n0,5\n", ["time_s", "twice"]),
    ("time_s,extra,rate_rps\n0,1,5\n", ["extra", "unknown column"]),
    ("time_s,rate_rps\nnan,5\n", ["row 2", "time_s"]),
    ("time_s\n0\n", ["missing column 'rate_rps'"]),
])
def test_a_bad_curve_header_or_cell_is_one_line(tmp_path, text, words):
    path = tmp_path / "c.csv"
    path.write_text(text)
    with pytest.raises(InputError) as raised:
        read_load_curve(str(path))
    for word in words:
        assert word in str(raised.value)


def test_a_curve_of_less_than_one_request_is_refused(tmp_path, cli, bad_input):
    path = tmp_path / "tiny.csv"
    path.write_text("time_s,rate_rps\n0,1e-300\n60,1e-300\n")
    outcome = cli([*SIM, "--load-curve", str(path), "--curve-window", "10"])
    bad_input(outcome, "tiny.csv", "fewer than one")


def test_repeated_price_is_merged(cli):
    outcome = cli([*SIM, "--rate", "1", "--duration", "2", "--json",
                   "--price", "dgx-h100=5", "--price", "dgx-a100=3"])
    assert outcome.code in (0, 1), outcome.stderr
    assert json.loads(outcome.stdout)["cost_per_hour"] == pytest.approx(10.0)


def test_one_price_given_twice_is_refused(cli, bad_input):
    outcome = cli([*SIM, "--price", "dgx-h100=5", "--price", "dgx-h100=3"])
    bad_input(outcome, "--price", "dgx-h100 twice")


@pytest.mark.parametrize("args,words", [
    (["search", "--hardware", "dgx-h100", "--hardware", "dgx-a100"],
     ["--hardware", "twice", "--hardware dgx-h100,dgx-a100"]),
    (["search", "--rate", "5", "-r", "7"], ["--rate", "twice"]),
    (["search", "--designs", "splitwise-hh", "--designs=splitwise-aa"], ["--designs", "twice"]),
    (["search", "--sensitivity", "--no-sensitivity"], ["--sensitivity", "--no-sensitivity"]),
    (["search", "--hardware", "dgx-h100,dgx-h100"], ["--hardware", "'dgx-h100' twice"]),
    (["search", "--designs", "splitwise-hh,splitwise-hh"], ["--designs", "twice"]),
])
def test_other_repeats_are_refused(tmp_path, cli, bad_input, args, words):
    outcome = cli([*args, "--out", str(tmp_path / "out")])
    bad_input(outcome, *words)
    assert not (tmp_path / "out").exists()


def test_a_repeat_after_the_end_of_options_is_an_argument(cli, bad_input):
    """`--` ends the options: what follows is not counted as a repeat (click then refuses
    the stray argument on its own terms)."""
    outcome = cli([*SIM, "--rate", "1", "--", "--rate", "2"])
    assert outcome.code == 2 and "given twice" not in outcome.stderr
