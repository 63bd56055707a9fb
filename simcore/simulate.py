"""`simulate(cluster, workload, model, perf, catalog)`: one cluster, one workload, one rate."""
from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass, field

import numpy as np

from hardware_catalog import InputError, MachineSku, ModelSpec
from simcore import layout as layouts
from simcore.cluster import (ROLE_PROMPT, Cluster, MachineArrays, SimOptions, Stalled,
                             build_machine_arrays, instance_failures, instance_resizes,
                             plan_resizes, pool_layouts, pool_problem)
from simcore.fastsim import simulate_fast
from simcore.metrics import first_token_overheads, request_latencies, uncontended_latencies
from simcore.workload import Workload, with_arrivals

SIMULATOR_VERSION = "7"  # bump when simulation semantics change (search caches key on it)


@dataclass(frozen=True, eq=False)
class SimResult:
    feasible: bool
    reason: str
    workload: Workload
    ttft_s: np.ndarray
    tbt_s: np.ndarray
    e2e_s: np.ndarray
    ttft_slowdown: np.ndarray
    tbt_slowdown: np.ndarray
    e2e_slowdown: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    prompt_machine: np.ndarray
    token_machine: np.ndarray
    kv_transfer_s: np.ndarray
    machine_stats: dict = field(default_factory=dict)
    failure_stats: dict | None = None   # per request, when failures were simulated:
    # recoveries (times sent back after a loss), recomputed_tokens, recovery_s; and `schedule`
    prompt_instance: np.ndarray | None = None   # the instances (prompt_machine: their machine)
    token_instance: np.ndarray | None = None
    # every inter-token gap of every request, binned (`simcore.cluster.itl_bin`); None when
    # infeasible. `itl_s(pcts)` reads percentiles back.
    itl_histogram: np.ndarray | None = None

    def itl_s(self, pcts) -> np.ndarray:
        """ITL percentiles in seconds (NaN when no request has a second token)."""
        from simcore.metrics import histogram_percentiles
        return histogram_percentiles(self.itl_histogram, pcts)

    def __repr__(self) -> str:  # one line, not every array (notebooks print it)
        if not self.feasible:
            return f"SimResult(infeasible: {self.reason}, {len(self.workload):,} requests)"
        return (f"SimResult({len(self.workload):,} requests, makespan {self.makespan_s:.1f} s, "
                f"{len(self.machine_stats.get('role', ())):,} instances)")

    @property
    def prefix_hit_rate(self) -> float | None:
        """Prefix caching: the prefill tokens found cached over those looked up, every instance
        together (None when the run had no prefix cache)."""
        stats = self.machine_stats
        if "prefix_hit_tokens" not in stats:
            return None
        tokens = int(np.sum(stats["prefix_tokens"]))
        return int(np.sum(stats["prefix_hit_tokens"])) / tokens if tokens else 0.0

    @property
    def prefix_host_hit_rate(self) -> float | None:
        """Prefix caching's host tier: the prefill tokens found cached in host memory (loaded
        back) over those looked up, every instance together (None without the tier)."""
        stats = self.machine_stats
        if "prefix_host_hit_tokens" not in stats:
            return None
        tokens = int(np.sum(stats["prefix_tokens"]))
        return int(np.sum(stats["prefix_host_hit_tokens"])) / tokens if tokens else 0.0

    @property
    def makespan_s(self) -> float:
        return float(np.nanmax(self.finish_s)) if self.feasible and len(self.finish_s) else 0.0

    def requests_frame(self):
        """Per-request table (pandas) for CSV export."""
        import pandas as pd
        w = self.workload
        return pd.DataFrame({
            "request": np.arange(len(w)), "arrival_s": w.arrival_s,
            "prompt_tokens": w.prompt_tokens, "output_tokens": w.output_tokens,
            "prompt_machine": self.prompt_machine, "token_machine": self.token_machine,
            **({} if self.prompt_instance is None else {
                "prompt_instance": self.prompt_instance, "token_instance": self.token_instance}),
            "ttft_s": self.ttft_s, "tbt_s": self.tbt_s, "e2e_s": self.e2e_s,
            "kv_transfer_s": self.kv_transfer_s, "ttft_slowdown": self.ttft_slowdown,
            "tbt_slowdown": self.tbt_slowdown, "e2e_slowdown": self.e2e_slowdown,
            **({} if self.failure_stats is None else {
                key: self.failure_stats[key]
                for key in ("recoveries", "recomputed_tokens", "recovery_s")})})


def simulate(cluster: Cluster, workload: Workload, model: ModelSpec, perf,
             reference: MachineSku, options: SimOptions = SimOptions(),
             engine: str = "fast") -> SimResult:
    """Simulate `workload` on `cluster`; an unservable request makes the result infeasible.

    `reference` is the machine slowdowns are measured against (the same request alone on it,
    uncontended: a DGX-A100 for the Splitwise SLOs); `engine` "reference" runs the plain-Python
    event loop instead of the compiled core.
    """
    if len(workload) == 0:
        raise InputError("the workload has no requests")
    if workload.closed is not None and (options.has_failures or options.pool_plan):
        raise InputError("a closed loop (--concurrency) runs without failures or a pool plan: "
                         "drop one or the other")
    machines, schedule, reason = run_machines(cluster, model, perf, options,
                                              _sample_facts(workload)[0], workload)
    if reason:
        return _infeasible(workload, reason)
    if engine == "reference":   # (imported when asked: a search never runs it)
        from simcore.refsim import simulate_reference as run
    elif engine == "fast":
        run = simulate_fast
    else:
        raise ValueError(f"unknown engine {engine!r}: 'fast' or 'reference'")
    steps = spec_steps(workload, options)
    try:
        raw = run(workload, machines, steps=steps)
    except Stalled:
        if not len(machines.failures):
            raise
        return _infeasible(workload, "requests were left unserved: every machine that could "
                           "take them is down for the rest of the run")
    if workload.closed is not None:  # its arrivals are the run's
        workload = with_arrivals(workload, raw["arrival_s"])
    result = _result(workload, raw, machines, reference_curves(model, perf, reference, options),
                     cluster)
    if options.has_failures:
        n = len(workload)
        result = dataclasses.replace(result, failure_stats={
            "recoveries": raw.get("recoveries", np.zeros(n, np.int64)),
            "recomputed_tokens": raw.get("recomputed_tokens", np.zeros(n, np.int64)),
            "recovery_s": raw.get("recovery_s", np.zeros(n)), "schedule": schedule})
    return result


def spec_steps(workload: Workload, options: SimOptions):
    """Speculative decoding's per-request plan for the simulators (`simcore.specdecode`), or
    None when it is off."""
    spec = options.spec_decode
    if spec is None:
        return None
    from simcore.specdecode import decode_steps, step_plan
    known = _SPEC_STEPS.setdefault(workload, {})  # a search runs one sample on many clusters
    key = (spec, options.spec_seed)
    if key not in known:
        steps = decode_steps(workload.output_tokens, spec, options.spec_seed)
        known[key] = step_plan(workload.prompt_tokens, workload.output_tokens, steps)
    return known[key]


_SPEC_STEPS: "weakref.WeakKeyDictionary[Workload, dict]" = weakref.WeakKeyDictionary()


def run_machines(cluster: Cluster, model: ModelSpec, perf, options: SimOptions,
                 horizon_s: float, workload: Workload | None = None):
    """(the instances' arrays with their failures and resizes, the machine failure schedule or
    None, "") for a run whose arrivals end by `horizon_s`; (None, None, why) when the cluster
    cannot serve at all, or cannot serve a request of `workload`."""
    machines, reason = _memo(_MACHINES, (cluster.design, model, perf, options),
                             (cluster.prompt_machines, cluster.token_machines),
                             lambda: _instances(cluster, model, perf, options))
    if reason:
        return None, None, reason
    reason = _unservable_reason(cluster, workload, model, machines) if workload else ""
    if reason:
        return None, None, reason
    schedule = None
    if options.has_failures:
        from simcore.failures import failure_array
        schedule = failure_array(cluster, options, horizon_s)
        machines = dataclasses.replace(machines,
                                       failures=instance_failures(schedule, machines.spans))
    if options.pool_plan:
        machines = dataclasses.replace(machines, resizes=instance_resizes(
            plan_resizes(cluster, options.pool_plan), machines.spans))
    return machines, schedule, ""


def _instances(cluster: Cluster, model: ModelSpec, perf, options: SimOptions):
    """(the instances' arrays, "") of `cluster`, before failures and resizes; (None, why) when
    a pool holds no instance."""
    pool_layout = pool_layouts(cluster.design, model, options.memory_reserve_fraction)
    reason = pool_problem(cluster, pool_layout)
    if reason:
        return None, reason
    return build_machine_arrays(cluster, model, perf, options, pool_layout), ""


def reference_curves(model: ModelSpec, perf, reference: MachineSku, options: SimOptions):
    """The latency curves slowdowns are measured against: `reference` alone, its default
    layout."""
    def curves():
        layout = layouts.default_layout(model, reference, options.memory_reserve_fraction)
        return layouts.curves(perf, model, reference, layout)
    return _memo(_REFERENCE, (model, perf, reference), (options.memory_reserve_fraction,),
                 curves)


# A search simulates each candidate cluster on up to 20 workload samples, every one against
# the same reference machine: the instances' arrays (read, never written, by the simulators)
# and the reference curves are built once per cluster (and options) and kept while among the
# last MEMO_ENTRIES. Keyed by the identity of the objects they come from; an entry holds
# them, so their ids are not reused while it lives.
MEMO_ENTRIES = 256
_MACHINES: dict = {}
_REFERENCE: dict = {}


def _memo(table: dict, objects: tuple, values: tuple, compute):
    """compute(), once per identity of `objects` and value of `values` (hashable)."""
    key = (*map(id, objects), *values)
    known = table.get(key)
    if known is None:
        if len(table) >= MEMO_ENTRIES:
            table.clear()
        known = table[key] = (objects, compute())
    return known[1]


# Facts of a workload sample every run of it checks: (its last arrival, the largest prompt +
# output of a request, the largest prompt), once per sample (a search runs it on many
# clusters).
_FACTS: "weakref.WeakKeyDictionary[Workload, tuple]" = weakref.WeakKeyDictionary()


def _sample_facts(w: Workload) -> tuple[float, int, int]:
    if not len(w):   # (a long run's empty chunk: nothing to check)
        return 0.0, 0, 0
    facts = _FACTS.get(w)
    if facts is None:
        facts = _FACTS[w] = (float(np.max(w.arrival_s)),
                             int(np.max(w.prompt_tokens + w.output_tokens)),
                             int(np.max(w.prompt_tokens)))
    return facts


def _unservable_reason(cluster: Cluster, workload: Workload, model: ModelSpec,
                       machines: MachineArrays) -> str:
    """A request whose KV reservation exceeds every decode machine can never finish."""
    decoders = machines.kv_capacity[machines.role != ROLE_PROMPT]
    capacity = int(decoders.max())
    if capacity <= 0:
        return (f"{model.name} weights ({model.weight_bytes / 1e9:.0f} GB) leave no room for KV "
                f"cache on {cluster.skus[-1]}")
    _, most_needed, longest = _sample_facts(workload)
    if most_needed > capacity:
        need = workload.prompt_tokens + workload.output_tokens
        too_big = np.flatnonzero(need > capacity)
        i = int(too_big[0])
        return (f"{len(too_big)} request(s) never fit in KV memory, e.g. request {i} needs "
                f"{int(need[i])} tokens, a token machine holds {capacity}")
    hold = int(machines.kv_capacity.min())   # any machine may compute a prompt (mixed pool)
    if longest > hold:
        too_long = np.flatnonzero(workload.prompt_tokens > hold)
        i = int(too_long[0])
        return (f"{len(too_long)} prompt(s) never fit in a machine's KV memory while computed, "
                f"e.g. request {i} has {int(workload.prompt_tokens[i])} tokens, a machine holds "
                f"{hold}")
    return ""


def _infeasible(workload: Workload, reason: str) -> SimResult:
    nan = np.full(len(workload), np.nan)
    none = np.full(len(workload), -1, dtype=np.int64)
    return SimResult(False, reason, workload, nan, nan, nan, nan, nan, nan, nan, nan, none, none,
                     nan)


def _chunking_stats(w: Workload, raw: dict, machines: MachineArrays) -> dict:
    """Chunked designs: prompt pieces per machine, their cost each priced alone, and the cost
    of the same prompts run whole on the machines that prefilled them (the measured chunking
    overhead is the ratio of the two sums, minus one)."""
    whole = np.zeros(machines.count)
    for kind, curves in enumerate(machines.curves):
        mine = machines.kind[raw["prompt_machine"]] == kind
        np.add.at(whole, raw["prompt_machine"][mine], curves.prompt_time(w.prompt_tokens[mine]))
    return {"prompt_chunks": raw["prompt_chunks"], "chunked_prefill_s": raw["chunked_prefill_s"],
            "whole_prefill_s": whole}


# A search simulates one workload sample on many clusters against one reference machine: its
# requests' uncontended latencies are computed once per (workload, reference curves, TBT rule).
# Entries keep their curves alive, so an id in a key is never reused while its entry exists.
_UNCONTENDED: "weakref.WeakKeyDictionary[Workload, dict]" = weakref.WeakKeyDictionary()


def _uncontended(w: Workload, reference, per_token: bool):
    known = _UNCONTENDED.setdefault(w, {})
    key = (id(reference), per_token)
    if key not in known or known[key][0] is not reference:
        known[key] = (reference, uncontended_latencies(w.prompt_tokens, w.output_tokens,
                                                       reference, per_token))
    return known[key][1]


def _result(workload: Workload, raw: dict, machines: MachineArrays, reference, cluster) -> SimResult:
    w = workload
    per_token = machines.tbt_per_output_token
    ttft, tbt, e2e = request_latencies(
        w.arrival_s, w.output_tokens, raw["first_token_s"], raw["finish_s"], per_token,
        first_token_overheads(machines.curves, machines.kind, raw["prompt_machine"]))
    ref_ttft, ref_tbt, ref_e2e = _uncontended(w, reference, per_token)
    makespan = float(np.max(raw["finish_s"]))
    stats = machine_statistics(raw, machines, cluster, makespan)
    if machines.chunk_tokens > 0 and "prompt_chunks" in raw:
        stats.update(_chunking_stats(w, raw, machines))
    first_machine = np.append(stats["machine"], -1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return SimResult(True, "", w, ttft, tbt, e2e, ttft / ref_ttft, tbt / ref_tbt,
                         e2e / ref_e2e, raw["first_token_s"], raw["finish_s"],
                         first_machine[raw["prompt_machine"]], first_machine[raw["token_machine"]],
                         raw["kv_transfer_s"], stats, prompt_instance=raw["prompt_machine"],
                         token_instance=raw["token_machine"], itl_histogram=raw["itl_histogram"])


def machine_statistics(raw: dict, machines: MachineArrays, cluster: Cluster,
                       makespan: float) -> dict:
    """Per instance: its SKU, first machine, role, busy time and utilization over `makespan`,
    iterations, mean batch, peak and capacity of KV tokens, time lent to the mixed pool (and,
    with paged KV admission, the decodes it preempted; with prefix caching, its prefill tokens
    found cached, looked up, and their ratio)."""
    iterations = raw["iterations"]
    first = np.array([span[0] for span in machines.spans], dtype=np.int64)
    return {
        "sku": np.array(cluster.skus)[first],   # one list, not one per instance
        "machine": first,
        "role": machines.role,
        "busy_s": raw["busy_s"],
        "utilization": raw["busy_s"] / makespan if makespan > 0 else raw["busy_s"] * 0,
        "iterations": iterations,
        "mean_batch": np.where(iterations > 0, raw["batch_size_sum"] / np.maximum(iterations, 1), 0.0),
        "max_memory_tokens": raw["max_memory_tokens"], "kv_capacity_tokens": machines.kv_capacity,
        "mixed_pool_s": raw["mixed_pool_s"],
        # paged KV admission only: running decodes each instance preempted (recomputed)
        **({} if "preemptions" not in raw else {"preemptions": raw["preemptions"]}),
        # prefix caching only: prefill tokens found cached, prefill tokens looked up, their ratio
        **({} if "prefix_hit_tokens" not in raw else {
            "prefix_hit_tokens": raw["prefix_hit_tokens"],
            "prefix_tokens": raw["prefix_tokens"],
            "prefix_hit_rate": np.where(raw["prefix_tokens"] > 0, raw["prefix_hit_tokens"]
                                        / np.maximum(raw["prefix_tokens"], 1), 0.0)}),
        # its host tier only: the tokens of those hits loaded from host memory
        **({} if "prefix_host_hit_tokens" not in raw else {
            "prefix_host_hit_tokens": raw["prefix_host_hit_tokens"]}),
    }
