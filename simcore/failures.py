"""Machine failures (DejaVu, ICML 2024): schedules and their metrics.

A schedule is given at the edge as rows (time_s, pool, index, down_s): `pool` is "prompt",
"token" or "any" and `index` numbers the machines of that pool from 0 ("any": the whole
cluster, prompt machines first; a baseline has one pool, which all three names mean). Random
failures come from a per-machine MTBF: each machine fails after exponential up-times of mean
MTBF and stays down `repair_s`, drawn with a seed, over the window of the workload's arrivals.

`failure_array(cluster, options, horizon_s)` turns both into what the simulators run on: rows
(time_s, machine, down_s) sorted by (time, machine), with any failure of a machine that is still
down dropped (a down machine cannot fail again). `down_s` may be infinite (never repaired).
"""
from __future__ import annotations

import numpy as np

from hardware_catalog import InputError
from hardware_catalog.csvschema import FAILURE_SCHEDULE, read_table


def read_failure_csv(path) -> tuple:
    """Rows (time_s, pool, machine, down_s) of a failure schedule CSV (`FAILURE_SCHEDULE`:
    columns by name); `down_s` may be `inf` (down for the whole run)."""
    table = read_table(FAILURE_SCHEDULE, path)
    return tuple((float(table["time_s"][i]), str(table["pool"][i]), int(table["machine"][i]),
                  float(table["down_s"][i])) for i in range(len(table)))


def check_schedule(rows, prompt_machines: int, token_machines: int, baseline: bool,
                   source: str = "failures") -> None:
    """Every row names a machine of the cluster (InputError otherwise)."""
    for i, (_, pool, index, _) in enumerate(rows):
        size = _pool_size(pool, prompt_machines, token_machines, baseline)
        if index >= size:
            raise InputError(f"row {i + 1}: machine {index} of pool '{pool}' does not exist: "
                             f"the pool has {size} machine(s)", source=source)


def _pool_size(pool, prompt, token, baseline):
    if baseline or pool == "any":
        return prompt + token
    return prompt if pool == "prompt" else token


def _machine(pool, index, prompt, baseline):
    return index + (prompt if pool == "token" and not baseline else 0)


def random_failures(machines: int, mtbf_s: float, repair_s: float, horizon_s: float,
                    seed: int) -> list[tuple[float, int, float]]:
    """Each machine fails after exponential up-times (mean `mtbf_s`) within [0, horizon_s) and
    is down `repair_s` each time. Machine m's up-times are row m of one seeded stream drawn
    row by row with a fixed row length, so they do not depend on the cluster's size (a row
    too short for the horizon, which is rare, continues from a stream of its own)."""
    width = int(min(1000, max(4, np.ceil(3.0 * horizon_s / mtbf_s) + 4)))
    up = np.random.default_rng([seed, 12]).exponential(mtbf_s, size=(machines, width))
    failed_at = np.cumsum(up, axis=1) + np.arange(width) * repair_s
    rows = []
    for m in range(machines):
        times = failed_at[m]
        rows += [(float(t), m, repair_s) for t in times[times < horizon_s]]
        if times[-1] < horizon_s:  # the row ran out before the horizon
            rng = np.random.default_rng([seed, 12, m])
            t = float(times[-1]) + repair_s
            while True:
                t += float(rng.exponential(mtbf_s))
                if t >= horizon_s:
                    break
                rows.append((t, m, repair_s))
                t += repair_s
    return rows


def failure_array(cluster, options, horizon_s: float) -> np.ndarray:
    """The schedule the simulators run on: rows (time_s, machine, down_s), sorted, no machine
    failing while it is down."""
    baseline = cluster.design.is_baseline
    prompt, token = cluster.prompt_machines, cluster.token_machines
    check_schedule(options.failures, prompt, token, baseline)
    rows = [(float(t), _machine(pool, int(i), prompt, baseline), float(d))
            for t, pool, i, d in options.failures]
    if options.mtbf_hours > 0:
        rows += random_failures(prompt + token, options.mtbf_hours * 3600.0,
                                max(options.repair_s, 1e-9), horizon_s, options.failure_seed)
    rows.sort(key=lambda r: (r[0], r[1]))
    kept, up_at = [], {}
    for t, m, d in rows:
        if t < up_at.get(m, -1.0):
            continue  # still down
        kept.append((t, m, d))
        up_at[m] = t + d
    return np.array(kept, dtype=np.float64).reshape(-1, 3)


def failure_metrics(result, failures: np.ndarray, slo_limits: dict | None = None) -> dict:
    """Requests affected, tokens recomputed, recovery time, machine downtime and goodput.

    `slo_limits` maps metric ("ttft", "tbt", "e2e") to the per-request limit a request must meet
    to count in goodput (in the unit of the result's slowdown or seconds, see `goodput`)."""
    stats = result.failure_stats
    affected = stats["recoveries"] > 0
    recovery = stats["recovery_s"][affected]
    end = result.makespan_s
    down = float(np.sum(np.clip(np.minimum(failures[:, 0] + failures[:, 2], end)
                                - failures[:, 0], 0, None))) if len(failures) else 0.0
    return {
        "failures": int(np.sum(failures[:, 0] < end)) if len(failures) else 0,
        "machine_down_s": down,
        "requests_affected": int(affected.sum()),
        "tokens_recomputed": int(stats["recomputed_tokens"].sum()),
        "recovery_s_mean": float(recovery.mean()) if len(recovery) else 0.0,
        "recovery_s_max": float(recovery.max()) if len(recovery) else 0.0,
    }


def goodput(result, profile, window_s: float) -> tuple[int, float]:
    """(requests within the SLO, those per second of the arrival window `window_s`): a request
    counts when each of its TTFT, TBT and E2E is within the profile's loosest limit for that
    metric (its P99 limit in the Splitwise profile). Per second of arrivals, not of the run's
    makespan: the offered rate is per second of arrivals, and the drain after the window is
    not more time to serve it in."""
    if not result.feasible or window_s <= 0:
        return 0, 0.0
    good = np.ones(len(result.workload), dtype=bool)
    for metric in ("ttft", "tbt", "e2e"):
        limits = [v for (m, _), v in profile.limits.items() if m == metric]
        if not limits:
            continue
        slowdown = profile.slowdown(metric)
        values = getattr(result, f"{metric}_slowdown" if slowdown else f"{metric}_s")
        values = values if slowdown else values * 1000.0
        good &= np.isnan(values) | (values <= max(limits))
    count = int(good.sum())
    return count, count / window_s
