"""Seed-robust optima: how often does each design's optimum meet every SLO on fresh samples of
the same workload, and what does verification cost?

For each verification setting (1 sample, the default 20, ...) it runs the default search
(BLOOM-176B, coding, all designs, min-cost) at `--rate` (default 70 req/s), then simulates every
design's optimum on `--fresh` seeds the search never saw (seed + 1000 ...) and prints the pass
rate, the samples that verified it (fewer than the setting when the sequential rule passed it
early), plus the simulations and CPU time of the search.

    python bench/verify_bench.py                  # --verify-seeds 20 (the default)
    python bench/verify_bench.py --seeds 1,3,20 --fresh 20 --rate 700
    python bench/verify_bench.py --audit          # the sequential rule on real candidates

With `--audit`, every complete verification runs all its samples (sequential off) and the
sequential rule, history guard included, is replayed on the samples in the order they ran: how
many candidates it would have passed early, after how many samples, and how many of those the
complete rule rejects (its wrong verdicts on this workload's real margins).
"""
from __future__ import annotations

import argparse
import time

import provisioner
import provisioner.api
from provisioner import verify
from provisioner.evaluate import SimulationEvaluator
from provisioner.study import Point

AUDIT = {"complete": 0, "early": 0, "wrong": 0, "samples_saved": 0}


class AuditVerifier(verify.Verifier):
    """Runs every complete verification on all samples, and counts what the sequential rule
    would have decided on them in the order they ran."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sequential = False

    def run(self, items):
        orders = [self._hardest_first(item.point) if isinstance(item, verify.Verify)
                  and item.samples is None else None for item in items]
        musts = [None if order is None else self._must_run(item.point, order)
                 for item, order in zip(items, orders)]   # the history guard, as it was
        results = super().run(items)
        for order, must, result in zip(orders, musts, results):
            if order is None:
                continue
            by_seed = dict(result.samples)
            ran = [(seed, by_seed[seed]) for seed in order if seed in by_seed]
            AUDIT["complete"] += 1
            for n in verify.step_ends(len(order), self.screen):
                prefix = ran[:n]
                if len(prefix) < n or not all(self._passes(o) for _, o in prefix):
                    break
                if n < must:
                    continue
                margins = verify.sample_margins(prefix)
                if margins is not None and verify.early_pass(margins, len(order), self.margin):
                    AUDIT["early"] += 1
                    AUDIT["wrong"] += not result.meets_slos
                    AUDIT["samples_saved"] += len(ran) - n
                    break
        return results


def fresh_pass_rate(result, fresh: int) -> dict[str, tuple[int, int, float]]:
    """design -> (passes, samples, worst margin seen) over `fresh` unseen seeds."""
    evaluator = SimulationEvaluator(result.study)
    rates = {}
    for design in result.designs:
        o = design.optimum
        if o is None:
            continue
        point = Point(design.design, o.prompt_machines, o.token_machines, o.rate_rps)
        outcomes = [evaluator.outcome(point, result.study.seed + 1000 + k) for k in range(fresh)]
        margins = [x.worst_margin for x in outcomes if x.worst_margin is not None]
        rates[design.design.name] = (sum(x.meets_slos for x in outcomes), fresh,
                                     min(margins) if margins else float("nan"))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="20", help="verification sample counts to compare")
    parser.add_argument("--fresh", type=int, default=20, help="unseen seeds per optimum")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--rate", type=float, default=70.0, help="request rate (req/s)")
    parser.add_argument("--audit", action="store_true",
                        help="replay the sequential rule on complete verifications")
    args = parser.parse_args()
    if args.audit:
        provisioner.api.Verifier = AuditVerifier
    provisioner.search(designs="splitwise-hh", rate=5, duration=10, jobs=1)  # compile once
    AUDIT.update(complete=0, early=0, wrong=0, samples_saved=0)   # (not the warm-up's)
    baseline_sims = None
    for n in (int(x) for x in args.seeds.split(",")):
        start, cpu = time.perf_counter(), time.process_time()
        result = provisioner.search(verify_seeds=n, jobs=args.jobs, rate=args.rate)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        sims = result.stats.simulated
        baseline_sims = baseline_sims or sims
        print(f"--verify-seeds {n}: {sims} simulations ({sims / baseline_sims:.2f}x the first "
              f"setting), {wall:.1f} s wall, {cpu:.1f} s CPU in this process")
        total = [0, 0]
        rates = fresh_pass_rate(result, args.fresh)
        for design in result.designs:
            o = design.optimum
            if o is None:
                print(f"  {design.design.name:16} infeasible")
                continue
            passes, fresh, worst = rates[design.design.name]
            total[0] += passes
            total[1] += fresh
            cells = (f"{o.prompt_machines}" if design.design.is_baseline
                     else f"{o.prompt_machines}P+{o.token_machines}T")
            print(f"  {design.design.name:16} {cells:>9}  ${o.cost_per_hour:>8,.1f}/h  fresh "
                  f"seeds passed {passes}/{fresh} ({passes / fresh:.0%}), worst margin "
                  f"{worst:+.1%}, verified on {len(o.samples)} sample(s)")
        if total[1]:
            print(f"  all optima: {total[0]}/{total[1]} fresh seeds passed "
                  f"({total[0] / total[1]:.1%})")
        if args.audit:
            print(f"  audit: {AUDIT['complete']} complete verifications, the sequential rule "
                  f"passes {AUDIT['early']} early ({AUDIT['samples_saved']} samples saved), "
                  f"{AUDIT['wrong']} of them rejected by all samples")
            AUDIT.update(complete=0, early=0, wrong=0, samples_saved=0)


if __name__ == "__main__":
    main()
