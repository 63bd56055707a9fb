"""Paged KV admission against the up-front reservation on a KV-bound question (issue 37).

BLOOM-176B (multi-head attention: 4.5 MiB of KV per token) on four DGX-H100 (the weights take
352 of their 640 GB: a machine holds 65,581 KV tokens) serving a chat trace with long answers
(~1,000-token prompts and outputs, `long_outputs_trace`). Under the up-front rule a request
reserves its prompt plus its whole output at admission, so memory fills with tokens not yet
generated. How we know the question is KV-bound: at the paged maximum rate the reserved tokens
under reserve peak at 97% of capacity, at 25% above it at 100% (requests wait for memory and
the SLOs fail), while paged admission holds 77% and 94% there; the maximum rate differs only by
the admission rule.

For each admission rule: `provision search --goal max-rate` (the rate the budget's cluster
sustains under the SLOs); then the cluster simulated under both rules at the reserve's maximum
rate, at the paged one's and 25% above it: mean batch (iterations weighted), preemptions, peak
KV / capacity (under reserve: reserved tokens), whether the SLOs pass.

    python bench/paged_kv_bench.py [--spec-decode eagle]
    (with --spec-decode, both rules under speculative decoding: paged blocks count the tokens
    the steps accepted)
    (its searches: provision search --designs baseline-h100 --model bloom-176b \\
         --workload long-outputs.csv --duration 120 --goal max-rate \\
         --budget-like dgx-h100:4 --kv-admission reserve|paged)
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import provisioner

QUESTION = dict(designs="baseline-h100", model="bloom-176b", duration=120.0, goal="max-rate",
                budget_like="dgx-h100:4")


def long_outputs_trace(folder: Path) -> str:
    """A chat trace with long answers (the sizes only: a rate resamples the arrivals): prompts
    log-normal around 1,000 tokens, outputs around 1,000 (64 to 4,000), 2,000 requests, seed 0."""
    rng = np.random.default_rng(0)
    n = 2000
    prompt = np.clip(rng.lognormal(np.log(1000), 0.6, n), 16, 8000).astype(int)
    output = np.clip(rng.lognormal(np.log(1000), 0.5, n), 64, 4000).astype(int)
    path = folder / "long-outputs.csv"
    rows = [f"{i * 0.1:.1f},{p},{o}" for i, (p, o) in enumerate(zip(prompt, output))]
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    return str(path)


def simulated(point, rate: float, admission: str) -> dict:
    counts = ({"machines": point.prompt_machines} if not point.token_machines else
              {"prompt": point.prompt_machines, "token": point.token_machines})
    run = provisioner.simulate(design=point.design.name, **counts, model=QUESTION["model"],
                               workload=QUESTION["workload"], duration=QUESTION["duration"],
                               rate=rate, kv_admission=admission, **SPEC)
    stats = run.result.machine_stats
    iterations = stats["iterations"]
    batch = float((stats["mean_batch"] * iterations).sum() / max(iterations.sum(), 1))
    peak = float((stats["max_memory_tokens"] / stats["kv_capacity_tokens"]).max())
    return {"batch": batch, "peak": peak, "passed": run.report.passed,
            "preemptions": int(stats.get("preemptions", np.zeros(1)).sum())}


SPEC: dict = {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec-decode", default="none", help="mtp, eagle or draft:MODEL")
    method = parser.parse_args().spec_decode
    if method != "none":
        SPEC["spec_decode"] = method
    folder = Path(tempfile.mkdtemp())
    QUESTION["workload"] = long_outputs_trace(folder)
    found = {}
    for admission in ("reserve", "paged"):
        start = time.perf_counter()
        result = provisioner.search(**QUESTION, kv_admission=admission, **SPEC)
        design = result.designs[0]
        found[admission] = (design.optimum.point, time.perf_counter() - start)
    reserve_rate, paged_rate = (found[a][0].rate_rps for a in ("reserve", "paged"))
    print(f"{ {**QUESTION, 'workload': 'long-outputs.csv', **SPEC} }")
    for admission, (point, seconds) in found.items():
        print(f"{admission:8s} max rate {point.rate_rps:6.2f} req/s on "
              f"{point.design.pools_text(point.prompt_machines, point.token_machines)} "
              f"(search {seconds:.1f} s)")
    print(f"paged / reserve max rate: {paged_rate / reserve_rate:.2f}x")
    point = found["reserve"][0]
    print(f"{'rate':>6s} {'admission':9s} {'batch':>6s} {'preempt':>7s} {'peak/cap':>8s} "
          f"{'SLOs':>5s}")
    for rate in (reserve_rate, paged_rate, round(1.25 * paged_rate, 2)):
        for admission in ("reserve", "paged"):
            s = simulated(point, rate, admission)
            print(f"{rate:6.2f} {admission:9s} {s['batch']:6.1f} {s['preemptions']:7d} "
                  f"{s['peak']:8.3f} {'pass' if s['passed'] else 'fail':>5s}")


if __name__ == "__main__":
    main()
