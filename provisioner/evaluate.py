"""The one binding between the search and the simulator.

`SimulationEvaluator.outcome(point)` builds the workload at the point's rate, runs
`simcore.simulate` on the point's cluster and evaluates the SLOs; it returns a plain, picklable
`Outcome`. Its identity (everything that changes a result) keys the evaluation cache.
"""
from __future__ import annotations

import hashlib
import math
import multiprocessing
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np

import provisioner.presets
import provisioner.samples
import simcore
from provisioner import __version__
from provisioner.question import identity
from provisioner.samples import LatestRequests, study_sample
from provisioner.simulation import closed_loop_fields
from provisioner.study import SLO_KEYS, Outcome, Point, Study
from provisioner.verify import INTERVAL_SEEDS, combine_samples, latency_values
from simcore import SIMULATOR_VERSION, Cluster, Workload, evaluate_slos, simulate
from slo_profiles import METRICS, PERCENTILES, SloProfile


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """The version of everything that turns a point into an outcome: the package versions and
    a hash of the simulator's sources and data, of the binding (`provisioner.evaluate` and the
    samples it draws, `provisioner.samples`) and of the assumption presets, so no cache entry
    written by other code is ever read."""
    digest = hashlib.sha256(f"{__version__}|{SIMULATOR_VERSION}".encode())
    package = Path(simcore.__file__).parent
    # every source of the package, its subpackages' too (a module turned into a package
    # stays in the fingerprint), each named by its path inside the package
    files = sorted([*package.rglob("*.py"), *package.glob("data/*.json")])
    for path in files:
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    for path in (Path(__file__), Path(provisioner.samples.__file__),
                 Path(provisioner.presets.__file__)):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


class Evaluator(Protocol):
    """Anything the runner can evaluate: the simulator binding or a test oracle. One may also
    have `sample_size(rate_rps, seed) -> int`, the size of a workload sample: the verifier
    then tries the largest samples first (without it, seed order)."""

    def outcome(self, point: Point, seed: int) -> Outcome: ...

    def identity(self) -> dict: ...

    def point_identity(self, point: Point) -> dict: ...   # the same for every point of a design


# The report gives bootstrap intervals for the optimum's first samples (provisioner.confidence),
# from their runs' per-request latencies, which outcomes do not keep. The runs of the first
# verification-only seeds are kept when simulated (the optimum's were, in its verification), so
# the report simulates again only its base sample. Only in this process (the report's interval
# runs come here on threads; worker processes keep nothing) and only the newest KEPT_REQUESTS
# requests' worth.
KEPT_SEEDS = INTERVAL_SEEDS - 1   # the seeds after the base seed whose runs are kept
KEPT_REQUESTS = 1_000_000   # 24 MB: three latencies a request
_KEPT = LatestRequests(KEPT_REQUESTS, lambda entry: len(entry[1]["ttft"]))


def _keep(evaluator: "SimulationEvaluator", point: Point, seed: int, result) -> None:
    if not result.feasible or multiprocessing.parent_process() is not None:
        return
    values = latency_values(result, evaluator.study.slo)
    _KEPT.put((id(evaluator), point, seed), (evaluator, values))  # the entry keeps its id taken


def _kept(evaluator: "SimulationEvaluator", point: Point, seed: int) -> dict | None:
    entry = _KEPT.get((id(evaluator), point, seed))
    return entry[1] if entry is not None and entry[0] is evaluator else None


@dataclass(frozen=True)
class SimulationEvaluator:
    """Binds the simulator to one study: model, workload, window, seed, SLOs, performance model."""
    study: Study

    @cached_property
    def all_nine(self) -> SloProfile:
        """The study's profile with all nine limits (`_all_nine`), built once: every
        simulation's SLO report reads it."""
        return _all_nine(self.study.slo)

    def outcome(self, point: Point, seed: int) -> Outcome:
        """The point simulated on the workload sample drawn with `seed` (with
        --survive-failures, in every failure placement: it passes only if all of them do)."""
        s = self.study
        cases = failure_cases(point, s.survive_failures, s.duration_s)
        if not cases:
            result, requests = self.simulate(point, seed)
            if 0 < seed - s.seed <= KEPT_SEEDS:
                _keep(self, point, seed, result)
            report = evaluate_slos(result, self.all_nine, s.settings.slo_confidence)
            return outcome_from_slo_report(report, s.slo, len(requests))
        outcomes = []
        for label, rows in cases:
            result, requests = self.simulate(point, seed, rows)
            report = evaluate_slos(result, self.all_nine, s.settings.slo_confidence)
            outcomes.append((label, outcome_from_slo_report(report, s.slo, len(requests))))
        combined = combine_samples(outcomes)
        if combined.reason.startswith("seed "):  # the case, not a seed, failed
            combined = replace(combined, reason=combined.reason[len("seed "):])
        return combined

    def simulate(self, point: Point, seed: int, failures: tuple = ()):
        """(simcore result, workload) of one sample, per-request arrays included; `failures`
        adds schedule rows (a failure case)."""
        s = self.study
        cluster = Cluster(point.design, point.prompt_machines, point.token_machines)
        requests = study_sample(s, point.rate_rps, seed)
        options = s.sim_options
        if options.has_failures or failures:
            options = replace(options, failures=options.failures + failures, failure_seed=seed)
        if options.spec_decode is not None:  # each sample draws its own steps
            options = replace(options, spec_seed=seed)
        result = simulate(cluster, requests, s.model, s.perf.load(s.catalog), s.reference,
                          options)
        return result, requests

    def latencies(self, point: Point, seed: int) -> dict[str, np.ndarray]:
        """`latency_values` of the point's run on sample `seed` (kept from its verification,
        or simulated again)."""
        return self.run_latencies(point, seed)[0]

    def run_latencies(self, point: Point, seed: int):
        """(`latency_values`, the run's TTFT / TPOT / E2E in seconds, its prefix-cache hit
        rate, and a closed loop's users, think time and achieved throughput) of the point's
        run on sample `seed`; the last three are None when the run was kept from its
        verification rather than simulated here (the hit rate also without a prefix cache,
        the loop without a closed loop)."""
        kept = _kept(self, point, seed)
        if kept is not None:
            return kept, None, None, None
        result = self.simulate(point, seed)[0]
        seconds = ({"ttft": result.ttft_s, "tpot": result.tbt_s, "e2e": result.e2e_s,
                    "itl": result.itl_histogram} if result.feasible else None)
        hit_rate = result.prefix_hit_rate if result.feasible else None
        loop = (closed_loop_fields(result) if self.study.goal.closed is not None
                and result.feasible else None)
        return latency_values(result, self.study.slo), seconds, hit_rate, loop

    def sample_size(self, rate_rps: float | None, seed: int) -> int:
        """Requests in the workload sample drawn with `seed` at `rate_rps` (its arrivals only:
        the verifier asks for every seed at every rate it verifies). The sample with the most
        requests in the window is the hardest for nearly every design, so it goes first."""
        s = self.study
        if s.goal.closed is not None:   # every sample: the loop's requests
            return s.goal.closed.requests
        return s.workload.requests_at(rate_rps, s.duration_s, seed, s.seed)

    def identity(self) -> dict:
        """Everything but the point and the sample seed that changes an outcome (derived from
        the declarations: `provisioner.question.identity`), and the code's fingerprint."""
        return {"code": code_fingerprint(), **identity(self.study)}

    def point_identity(self, point: Point) -> dict:
        """The records the point simulates on. Cost is left out on purpose: it does not change
        a simulation, and prices are recomputed from the current catalog on every read."""
        return {"design": point.design.as_dict(),
                "machines": {m.name: m.identity() for m in point.design.machines()}}


def warm_up(study: Study) -> None:
    """Load (or, on a fresh install, compile) the simulator core on one tiny request, so that a
    search's first batch does not look hung while numba compiles. The run has the first
    design's shape on the SLO reference machine, which every run prices its requests against
    (so it has performance data whenever a search can run): the design's own machine at its
    whole-machine layout may have none (a 1,024-GPU machine at TP 1024), and the search only
    runs the layouts that have."""
    first = study.designs[0]
    reference = study.reference
    design = replace(first, name="warm-up", prompt=reference,
                     token=None if first.is_baseline else reference,
                     prompt_layout=None, token_layout=None)
    cluster = Cluster(design, *design.each_pool(1))
    tiny = Workload("warm-up", np.zeros(1), np.array([16]), np.array([2]))
    simulate(cluster, tiny, study.model, study.perf.load(study.catalog), study.reference,
             study.sim_options)


FAILURE_AT = 0.10   # --survive-failures: the k machines fail this far into the window


def failure_cases(point: Point, k: int, duration_s: float) -> list[tuple[str, tuple]]:
    """--survive-failures k: (label, schedule rows) of each placement of k failed machines.

    Splitwise: k prompt machines, k token machines, and ceil(k/2) prompt + floor(k/2) token
    (a pool with fewer machines than asked loses all of them and the other pool the rest).
    Baselines: k machines. Each fails FAILURE_AT into the window, once the cluster is loaded,
    so its work is lost and recovered by the policy, and stays down for the rest of the run.
    Within a pool the machines are alike, so the lowest indices are taken: the router's ties
    go to them, so they hold the most work when they fail."""
    if not k:
        return []
    at = FAILURE_AT * duration_s
    p, t = point.prompt_machines, point.token_machines

    def rows(prompt_down, token_down):
        if prompt_down > p:
            prompt_down, token_down = p, token_down + prompt_down - p
        if token_down > t:
            token_down, prompt_down = t, min(p, prompt_down + token_down - t)
        return (tuple((at, "prompt", i, math.inf) for i in range(prompt_down))
                + tuple((at, "token", i, math.inf) for i in range(token_down)))

    if point.design.is_baseline:
        return [(f"{k} machine(s) failed", tuple((at, "any", i, math.inf)
                                                 for i in range(min(k, p))))]
    cases = {f"{k} prompt machine(s) failed": rows(k, 0),
             f"{k} token machine(s) failed": rows(0, k)}
    if k > 1:
        cases[f"{(k + 1) // 2} prompt + {k // 2} token machine(s) failed"] = rows((k + 1) // 2,
                                                                               k // 2)
    unique, seen = [], set()
    for label, schedule in cases.items():
        if schedule not in seen:
            seen.add(schedule)
            unique.append((label, schedule))
    return unique


def _all_nine(profile: SloProfile) -> SloProfile:
    """The profile with unlimited (inf) entries added, so every report carries all nine values;
    an inf limit always passes and has margin 1, so verdicts and worst margins are unchanged."""
    limits = {(m, p): profile.limits.get((m, p), math.inf) for m in METRICS for p in PERCENTILES}
    return replace(profile, limits=limits)


def outcome_from_slo_report(report, profile: SloProfile, requests: int) -> Outcome:
    if not report.feasible:
        slo = tuple((key, None, _limit(profile, key)) for key in SLO_KEYS)
        return Outcome(False, False, report.reason or "simulation did not complete", slo, None,
                       requests)
    values = {f"{c.metric}_{c.percentile}": c.value for c in report.checks}
    slo = tuple((key, values.get(key), _limit(profile, key)) for key in SLO_KEYS)
    margins = [1.0 - v / lim for _, v, lim in slo if lim is not None and v is not None]
    return Outcome(report.passed, True, report.reason, slo, min(margins) if margins else None,
                   requests)


def _limit(profile: SloProfile, key: str) -> float | None:
    metric, pct = key.split("_")
    return profile.limits.get((metric, pct))
