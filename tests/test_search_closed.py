"""`provision search --concurrency N`: the cheapest cluster of each design that holds N users
within the SLOs (docs/closed-loop.md, provisioner.closedloop).

- the optimum is what a brute force over pool sizes finds on the same samples, each simulated
  by `provision simulate --concurrency` (which reproduces the search's base sample);
- more users never need fewer machines; the same seed gives the same report;
- the rate the capacity bounds size for is proven: on clusters that meet the SLOs, every
  request arrives and all but the allowed slow ones finish by the proof's times;
- what needs a rate or failures is refused in one line; the question echoes the loop.
"""
from __future__ import annotations

import json
import statistics

import numpy as np
import pytest

import provisioner
from provisioner.closedloop import proof
from provisioner.options import SearchOptions, build
from provisioner.question import from_echo, identity, resolve_study, to_echo
from simcore.simulate import reference_curves

SMALL = dict(model="llama-3.1-8b", designs="baseline-h100", think_time=0.5, requests=400,
             verify_seeds=3, jobs=1)


def closed_search(**options):
    return provisioner.search(**{**SMALL, **options})


@pytest.fixture(scope="module")
def sixteen():
    return closed_search(concurrency=16)


def simulated(machines: int, tp: int, seed: int, users: int = 16):
    """`provision simulate --concurrency` of the question on `machines` machines at TP `tp`."""
    return provisioner.simulate(design="baseline-h100", machines=machines, tp=tp, seed=seed,
                                model=SMALL["model"], concurrency=users,
                                think_time=SMALL["think_time"], requests=SMALL["requests"])


def verified(runs, margin: float) -> bool:
    """The verifier's verdict on complete samples, from the runs' SLO reports: every sample
    meets every limit by `margin`, and each limit's mean + 2 sd over the samples is within."""
    if not all(run.report.passed for run in runs):
        return False
    checks = [{(c.metric, c.percentile): c for c in run.report.checks} for run in runs]
    for key, check in checks[0].items():
        values = [by_key[key].value for by_key in checks]
        if None in values:
            continue
        if any(1.0 - v / check.limit < margin for v in values):
            return False
        if statistics.fmean(values) + 2.0 * statistics.stdev(values) > check.limit:
            return False
    return True


def test_the_optimum_is_the_smallest_pool_every_sample_holds(sixteen):
    """Brute force: 1, 2, ... machines of the optimum's layout, each verification sample
    simulated directly; the smallest that every sample holds is the search's optimum."""
    (result,) = sixteen.designs
    optimum = result.optimum
    tp = result.layout["pool"]["tp"]
    seeds = [seed for seed, _ in optimum.samples]
    assert seeds == [0, 1, 2]
    margin = sixteen.study.settings.verify_margin
    smallest = next(n for n in range(1, 20)
                    if verified([simulated(n, tp, seed) for seed in seeds], margin))
    assert optimum.prompt_machines == smallest > 1


def test_simulate_reproduces_the_base_sample(sixteen):
    """`simulate --concurrency 16 --seed 0` on the optimum: the search's latencies and the
    throughput its report gives."""
    o = sixteen.to_dict()["designs"][0]["optimum"]
    run = simulated(o["machines"], o["layout"]["pool"]["tp"], 0)
    base = dict(sixteen.designs[0].optimum.samples)[0]   # the search's outcome of seed 0
    values = {key: value for key, value, _ in base.slo}
    for check in run.report.checks:   # to the bit
        assert check.value == values[f"{check.metric}_{check.percentile}"]
    summary = run.to_dict()
    for metric, percentiles in o["latency_ms"].items():   # (simulate prints 4 digits)
        for pct, value in percentiles.items():
            assert summary["latency_ms"][metric][pct] == pytest.approx(value, rel=1e-3)
    assert o["closed_loop"] == pytest.approx(summary["closed_loop"], rel=1e-5)
    assert o["rate_rps"] is None


def test_more_users_never_need_fewer_machines():
    """8, 16 and 32 users: the machines grow, none below its capacity bound's floor."""
    machines = []
    for users in (8, 16, 32):
        entry = closed_search(concurrency=users).to_dict()["designs"][0]
        machines.append(entry["optimum"]["machines"])
        assert entry["capacity_bound"]["pool_floors"][0] <= machines[-1]
    assert machines == sorted(machines) and machines[0] < machines[-1]


def test_the_same_seed_gives_the_same_report(sixteen):
    again = closed_search(concurrency=16)
    assert json.dumps(again.to_dict()) == json.dumps(sixteen.to_dict())


def test_the_bounds_rate_is_proven_on_clusters_that_meet_the_slos(sixteen):
    """The proof's steps on the base sample of clusters that meet the SLOs (the optimum and
    larger): every request has arrived by `arrive_by`, all but `slow` have finished by
    `done_by`; the throughput achieved is above the bounds' rate."""
    study = sixteen.study
    o = sixteen.designs[0].optimum
    tp = sixteen.designs[0].layout["pool"]["tp"]
    sample = study.goal.closed.sample(study.workload, study.seed)
    curves = reference_curves(study.model, study.perf.load(study.catalog), study.reference,
                              study.sim_options)
    steps = proof(sample, study.slo, curves, study.sim_options.tbt_per_output_token)
    assert steps is not None and study.goal.closed.bound_rps <= steps.rate
    for machines in (o.prompt_machines, o.prompt_machines + 2):
        run = simulated(machines, tp, study.seed)
        assert run.report.passed
        result = run.result
        assert np.max(result.workload.arrival_s) <= steps.arrive_by
        assert np.sum(result.finish_s <= steps.done_by) >= len(sample) - steps.slow
        assert run.to_dict()["closed_loop"]["throughput_rps"] >= study.goal.closed.bound_rps


def test_slos_that_bound_no_e2e_size_for_no_load(tmp_path):
    """TTFT limits alone bound no request's E2E: no rate is proven, the pools grow from one
    machine (the bounds' floors), and the search still finds the optimum."""
    profile = tmp_path / "ttft-only.yaml"
    profile.write_text("kind: absolute_ms\nlimits:\n  ttft: {p50: 200, p99: 1000}\n")
    found = closed_search(concurrency=16, slo=str(profile)).to_dict()
    loop = found["inputs"]["goal"]["closed_loop"]
    assert loop["bound_rps"] is None and "grow from one machine" in loop["bound_why"]
    entry = found["designs"][0]
    assert entry["capacity_bound"]["pool_floors"] == [1, 0] and entry["feasible"]


def test_the_question_echoes_the_loop(sixteen):
    """report.json echoes the users, think time and requests (null for an open loop), and a
    report's echo rebuilds the same question and cache key."""
    echo = json.loads(json.dumps(to_echo(sixteen.study)))
    options = echo["options"]
    assert (options["concurrency"], options["think_time"], options["requests"]) == (16, 0.5, 400)
    assert echo["goal"]["closed_loop"]["users"] == 16 and echo["window"] is None
    rebuilt = from_echo(echo, "report.json")
    assert identity(rebuilt) == identity(sixteen.study)
    assert identity(rebuilt)["goal"] == {"users": 16, "think_time_s": 0.5, "requests": 400}
    plain = to_echo(resolve_study(build(SearchOptions, {"designs": ("baseline-h100",)})))
    assert [plain["options"][k] for k in ("concurrency", "think_time", "requests")] == [None] * 3
    assert "closed_loop" not in plain["goal"]


CLOSED = ["search", "--designs", "baseline-h100", "--model", "llama-3.1-8b", "--no-cache"]
CURVE = "examples/load-curves/azure-coding-2024-05-13.csv"


@pytest.mark.parametrize("extra,names", [
    (["--concurrency", "4", "--rate", "5"], ("--rate", "--concurrency")),
    (["--concurrency", "4", "--duration", "60"], ("--duration", "--concurrency")),
    (["--concurrency", "4", "--goal", "max-rate", "--budget-like", "dgx-h100:4"],
     ("max-rate", "--concurrency", "min-cost")),
    (["--concurrency", "4", "--load-curve", CURVE], ("--load-curve", "--concurrency")),
    (["--concurrency", "4", "--survive-failures", "1"], ("--survive-failures",
                                                         "--concurrency")),
    (["--concurrency", "4", "--mtbf-hours", "100"], ("--mtbf-hours", "--concurrency")),
    (["--concurrency", "4", "--prefix-model", "system=2:500,turns=1-3,think=10"],
     ("--prefix-model", "--concurrency")),
    (["--think-time", "1"], ("--think-time", "--concurrency")),
    (["--requests", "10"], ("--requests", "--concurrency")),
])
def test_what_needs_a_rate_is_refused(cli, bad_input, repo, tmp_path, extra, names):
    """One line naming both options, exit 2, nothing written."""
    bad_input(cli([*CLOSED, "--out", tmp_path / "out", *extra], cwd=repo), *names)
    assert not (tmp_path / "out").exists()


def test_the_reports_show_the_users_and_their_throughput(cli, repo, tmp_path):
    """The terminal, report.html and report.json say the users and the throughput achieved
    where an open loop says its rate; nothing calls the load a trace's rate."""
    out = tmp_path / "out"
    run = cli([*CLOSED[:2], "baseline-h100,splitwise-hh", *CLOSED[3:], "--concurrency", "16",
               "--think-time", "0.5", "--requests", "400", "--verify-seeds", "3", "--quiet",
               "--out", out], cwd=repo)
    assert run.returncode == 0, run.stderr
    document = json.loads((out / "report.json").read_text())
    loops = [entry["optimum"]["closed_loop"] for entry in document["designs"]]
    assert all(loop["users"] == 16 and loop["throughput_rps"] > 0 for loop in loops)
    assert "Load: a closed loop of 16 users, mean think time 0.5 s" in run.stdout
    assert f"{loops[0]['throughput_rps']:.4g}" in run.stdout
    page = (out / "report.html").read_text()
    assert "closed loop: 16 users, mean think time 0.5 s" in page
    assert "splitwise-hh @ 16 users" in page and "trace rate" not in page


def test_sensitivity_leaves_out_what_needs_a_rate(sixteen):
    """--sensitivity with a closed loop: no rate +-10% and no burstier arrivals (the users'
    requests arrive as the cluster answers them); the other assumptions stay."""
    from provisioner.sensitivity import variants
    labels = [label for label, _ in variants(sixteen.study.auxiliary())]
    assert not any(label.startswith(("rate", "burstier")) for label in labels)
    assert "KV transfer always serialized" in labels
    open_loop = resolve_study(build(SearchOptions, {"designs": ("baseline-h100",)}))
    assert [label for label, _ in variants(open_loop)][:2] == ["rate +10%", "rate -10%"]
