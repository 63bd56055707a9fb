"""The answer of `provision simulate` as one JSON document: what `--json` prints and the
terminal formats (`provisioner.terminal.print_simulation`), for a run of one cluster
(`simulation_summary`) or over a load curve (`curve_summary`). The question it answers is
`provisioner.question.SimulateQuestion`; the run, `provisioner.api.simulate_question`.
"""
from __future__ import annotations

import numpy as np

from simcore.cluster import ROLE_BOTH, ROLE_PROMPT, ROLE_TOKEN


def simulation_summary(run) -> dict:
    """The JSON document of `provision simulate` (a load curve's run: `curve_summary`)."""
    if hasattr(run, "plan"):
        return curve_summary(run)
    cluster, result, requests = run.cluster, run.result, run.workload
    return {
        **_cluster_fields(run, requests.name, len(requests)),
        "makespan_s": round(result.makespan_s, 6),
        "kv_transfer_ms_mean": round(float(np.nanmean(result.kv_transfer_s)) * 1000, 4)
        if result.feasible else None,
        "layout": run.layout,
        **({"window": run.window} if getattr(run, "window", None) else {}),
        **({"prefix_reuse_bound": run.prefix_reuse_bound}
           if getattr(run, "prefix_reuse_bound", None) else {}),
        "latency_ms": _simulated_ms(result),
        **({"closed_loop": closed_loop_fields(result)} if requests.closed is not None else {}),
        "pools": _pools(result, cluster) if result.feasible else {},
        **({"prefill": _prefill(cluster.design, result)} if cluster.design.is_chunked else {}),
        **({"failures": _failures(run)} if result.failure_stats is not None else {}),
        # prefix caching (--prefix-cache on): prefill tokens found cached, every instance
        **({"prefix_hit_rate": round(result.prefix_hit_rate, 4)}
           if result.feasible and result.prefix_hit_rate is not None else {}),
        # its host tier (--prefix-host-memory): the part of those tokens loaded from host memory
        **({"prefix_host_hit_rate": round(result.prefix_host_hit_rate, 4)}
           if result.feasible and result.prefix_host_hit_rate is not None else {}),
        "latency_source": run.latency_source,
        "uncalibrated_skus": run.uncalibrated, **run.report.as_dict()}


def closed_loop_fields(result) -> dict:
    """A closed loop's users, mean think time and the throughput they achieved: requests per
    second over the run, from time 0 (when the users start) to the last request's finish."""
    loop = result.workload.closed
    span = result.makespan_s
    return {"users": loop.users, "think_time_s": loop.think_mean_s,
            "throughput_rps": round(len(result.workload) / span, 6)
            if result.feasible and span > 0 else None}


def _cluster_fields(run, workload: str, requests: int) -> dict:
    cluster = run.cluster
    return {"design": cluster.design.name, "prompt_machines": cluster.prompt_machines,
            "token_machines": cluster.token_machines, "model": run.model.name,
            "workload": workload, "requests": requests,
            "cost_per_hour": round(cluster.cost_per_hour, 4),
            "power_kw": round(cluster.power_kw, 4), "gpus": cluster.gpus}


def curve_summary(run) -> dict:
    """The JSON document of `provision simulate --load-curve`: the whole curve's SLOs, each
    window's, the plan it was resized by. With a plan no one cluster serves the curve: the
    cluster's fields are null, and each step of the plan gives its pools, their cost, power
    and GPUs (the totals over the curve beside them); the pools' utilization is over the whole
    run, as many machines as the plan ever asks for."""
    curve = run.run
    fields = _cluster_fields(run, run.workload_name, curve.requests)
    steps = plan_steps(run)
    if steps:
        fields.update(prompt_machines=None, token_machines=None, cost_per_hour=None,
                      power_kw=None, gpus=None)
    return {
        **fields,
        "makespan_s": round(curve.makespan_s, 6), "layout": run.layout,
        "plan": steps or None,
        **({"plan_totals": _plan_totals(steps)} if steps else {}),
        "latency_ms": _simulated_ms(curve.latencies) if curve.feasible else None,
        "pools": _pools(curve, run.cluster) if curve.feasible else {},
        **({"failures": {"failures": 0 if curve.schedule is None else len(curve.schedule),
                         **{k: round(v, 6) if isinstance(v, float) else v
                            for k, v in curve.failure_stats.items()}}}
           if curve.failure_stats is not None else {}),
        # prefix caching over the curve: prefill tokens found cached, every request's lookups
        **({"prefix_hit_rate": round(curve.prefix_hit_rate, 4)}
           if curve.feasible and curve.prefix_hit_rate is not None else {}),
        "latency_source": run.latency_source, "uncalibrated_skus": run.uncalibrated,
        **run.report.as_dict(), "windows": curve_windows(run)}


def plan_steps(run) -> list[dict]:
    """simulate --plan: each step of the plan over the curve, with the pools serving from its
    start to the next step's (or the curve's end), their cost, power and GPUs (before a plan's
    first step, the whole cluster serves: a step of its own)."""
    if not run.plan:
        return []
    design = run.cluster.design
    end = run.windows[-1][0].end_s
    rows = list(run.plan)
    if rows[0][0] > 0:
        rows.insert(0, (0.0, run.cluster.prompt_machines, run.cluster.token_machines))
    steps = []
    for k, (start, prompt, token) in enumerate(rows):
        until = max(start, min(end, rows[k + 1][0] if k + 1 < len(rows) else end))
        steps.append({"start_s": start, "end_s": until, "prompt_machines": prompt,
                      "token_machines": token,
                      "cost_per_hour": round(design.cost_per_hour(prompt, token), 4),
                      "power_kw": round(design.power_kw(prompt, token), 4),
                      "gpus": design.gpus(prompt, token)})
    return steps


def _plan_totals(steps: list[dict]) -> dict:
    """A plan's cost, energy and machine-hours over the curve, and its dearest step's cost."""
    hours = [(s["end_s"] - s["start_s"]) / 3600.0 for s in steps]
    return {"cost_usd": round(sum(h * s["cost_per_hour"] for h, s in zip(hours, steps)), 6),
            "energy_kwh": round(sum(h * s["power_kw"] for h, s in zip(hours, steps)), 6),
            "machine_hours": round(sum(h * (s["prompt_machines"] + s["token_machines"])
                                       for h, s in zip(hours, steps)), 6),
            "hours": round(sum(hours), 6),
            "cost_per_hour_min": min(s["cost_per_hour"] for s in steps),
            "cost_per_hour_max": max(s["cost_per_hour"] for s in steps)}


def _simulated_ms(result) -> dict | None:
    """TTFT / TPOT / E2E / ITL P50, P90, P99 in ms of the run (None when infeasible)."""
    if not result.feasible:
        return None
    from provisioner.verify import milliseconds
    ms = milliseconds({"ttft": result.ttft_s, "tpot": result.tbt_s, "e2e": result.e2e_s,
                       "itl": result.itl_histogram})
    return {metric: {p: None if v is None else round(v, 4) for p, v in values.items()}
            for metric, values in ms.items()}


def curve_windows(run) -> list[dict]:
    """simulate --load-curve: each window's load, requests and SLO verdict (a window no request
    arrived in is met); with a plan, the pools serving in it (each step's that overlaps it)."""
    counts = run.run.window_requests or (0,) * len(run.windows)
    steps = plan_steps(run)

    def serving(w) -> dict:
        if not steps:
            return {}
        pools = [[s["prompt_machines"], s["token_machines"]] for s in steps
                 if s["start_s"] < w.end_s and s["end_s"] > w.start_s]
        return {"pools": [p for k, p in enumerate(pools) if k == 0 or p != pools[k - 1]]}

    def cached(k: int) -> dict:
        """Prefix caching: the hit rate of the requests that arrived in window k."""
        if run.run.window_prefix is None:
            return {}
        rate = run.run.window_hit_rate(k)
        return {"prefix_hit_rate": None if rate is None else round(rate, 4)}

    return [{"start_s": w.start_s, "end_s": w.end_s, "peak_rps": w.peak_rps,
             "mean_rps": round(w.mean_rps, 6), **serving(w), "requests": int(n),
             "passed": report is None or report.passed,
             "reason": "" if report is None else report.reason,
             "worst_margin": (round(report.worst_margin, 6)
                              if report is not None and report.feasible and report.checks
                              else None), **cached(k)}
            for k, ((w, report), n) in enumerate(zip(run.windows, counts))]


def _failures(run) -> dict:
    """Failures simulated: the schedule, requests affected, tokens recomputed, recovery time
    and goodput (requests within the SLO per second)."""
    from simcore.failures import failure_metrics, goodput
    result = run.result
    schedule = result.failure_stats["schedule"]
    summary = {"schedule": [[round(float(t), 6), int(m), None if d == float("inf") else
                             round(float(d), 6)] for t, m, d in schedule]}
    if not result.feasible:
        return summary
    metrics = failure_metrics(result, schedule)
    good, rate = goodput(result, run.profile, run.window_s)
    return {**summary, **{k: round(v, 6) if isinstance(v, float) else v
                          for k, v in metrics.items()},
            "goodput_requests": good, "goodput_rps": round(rate, 6)}


def _prefill(design, result) -> dict:
    """Chunked designs: the budget, prompt pieces per prompt, and the measured chunking overhead
    (the pieces each priced alone against the same prompts run whole, minus one)."""
    stats = result.machine_stats
    prefill = {"policy": design.prefill, "chunk_tokens": design.chunk_tokens}
    if not result.feasible or "prompt_chunks" not in stats:
        return prefill
    whole = float(stats["whole_prefill_s"].sum())
    return {**prefill,
            "chunks_per_prompt": round(float(stats["prompt_chunks"].sum()) / len(result.workload),
                                       4),
            "chunking_overhead": round(float(stats["chunked_prefill_s"].sum()) / whole - 1.0, 6)
            if whole > 0 else None}


def _pools(result, cluster) -> dict:
    stats, pools = result.machine_stats, {}
    machines = {ROLE_PROMPT: cluster.prompt_machines, ROLE_TOKEN: cluster.token_machines,
                ROLE_BOTH: cluster.prompt_machines}
    for role, label in ((ROLE_PROMPT, "prompt"), (ROLE_TOKEN, "token"), (ROLE_BOTH, "machines")):
        mask = stats["role"] == role
        if not mask.any():
            continue
        peak = stats["max_memory_tokens"][mask] / np.maximum(stats["kv_capacity_tokens"][mask], 1)
        pools[label] = {
            "count": machines[role], "instances": int(mask.sum()),
            "sku": str(stats["sku"][mask][0]),
            "utilization": round(float(stats["utilization"][mask].mean()), 4),
            "mean_batch": round(float(stats["mean_batch"][mask].mean()), 3),
            "peak_kv_fraction": round(float(peak.max()), 4),
            "kv_capacity_tokens": int(stats["kv_capacity_tokens"][mask][0]),
            "mixed_pool_s": round(float(stats["mixed_pool_s"][mask].sum()), 3)}
        if "preemptions" in stats:   # paged KV admission: decodes preempted and recomputed
            pools[label]["preemptions"] = int(stats["preemptions"][mask].sum())
        if "prefix_hit_tokens" in stats:  # prefix caching: prefill tokens found cached
            looked_up = int(stats["prefix_tokens"][mask].sum())
            pools[label]["prefix_hit_rate"] = round(
                int(stats["prefix_hit_tokens"][mask].sum()) / looked_up if looked_up else 0.0, 4)
            if "prefix_host_hit_tokens" in stats:  # its host tier: the part loaded from host
                pools[label]["prefix_host_hit_rate"] = round(
                    int(stats["prefix_host_hit_tokens"][mask].sum()) / looked_up
                    if looked_up else 0.0, 4)
    return pools
