"""The Python API, and the edge where options become records.

    import provisioner
    result = provisioner.search(designs="splitwise-hh", rate=70, goal="min-cost")
    result.designs[0].optimum          # typed per-design results
    result.to_dict()                   # exactly report.json
    result.write("my-report")          # report.json, evaluations.csv, report.html

Keywords are the command-line option names with underscores. Names (designs, model, SLO profile,
workload, performance model) are resolved to records here, once; everything after this module
takes records. Nothing is written unless asked: from Python the evaluation cache is used only
when `cache_dir` is given.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Unpack

import html

from hardware_catalog import Design, ModelSpec
from provisioner import __version__
from provisioner.chunked import budget_variants, collapse_variants, progress_by_design
from provisioner.evaluate import SimulationEvaluator
from provisioner.files import check_output_dir
from provisioner.frontier import drive, search_designs
from provisioner.hardware import HARDWARE_PROGRESS, hardware_search, hardware_summary
from provisioner import loadcurve
from provisioner.sparing import FLEET_MTBF_HOURS, down_fraction, spare_record, spares_for
from provisioner.layouts import layout_choices, layout_record, no_layout_result
from provisioner.options import (LEGACY_ENGINE, Execution,
                                 FailureOptions,
                                 SearchOptions,
                                 SimulateOptions, from_keywords)
from provisioner.question import (SimulateQuestion, asked, budget_like, merge_options,
                                  python_style, resolve_simulate, resolve_study, to_echo)
from provisioner.figures import optimum_html
from provisioner.reports import (WRITTEN_FILES, csv_text, machines_of, render_reports,
                                 report_document,
                                 sensitivity_dict, summary_dict, write_reports)
from provisioner.keywords import SearchKeywords, SimulateKeywords
from provisioner.runner import (DiskCache, Runner, RunStats, cache_run, default_cache_dir,
                                default_jobs, warn)
from provisioner.sensitivity import sensitivity
from provisioner.unitcosts import attach_unit_costs
from provisioner.simulation import curve_summary, simulation_summary
from provisioner.sensitivity import variants as sensitivity_variants
from provisioner.tables import answer_sentence, layout_label
from provisioner.study import (ENGINE_NAMES, DesignResult, Metrics, PerfSource, Study, Window,
                               WorkloadSource, window_text)
from provisioner.verify import (SCREEN_SEEDS, Verifier, attach_verification,
                                recheck_cached_optimum, verification_seeds)
from simcore import SIMULATOR_VERSION, Cluster, evaluate_slos
from simcore import simulate as run_simulation
from simcore.perfmodel import perf_model_version
from simcore.kernels import kernel_data_version
from simcore.engine_overheads import NO_OVERHEADS

OnBatch = Callable[[dict[str, int]], None]


# ----------------------------------------------------------------------------- the results
def versions() -> dict:
    return {"provision": __version__, "simulator": SIMULATOR_VERSION,
            "perf_model": perf_model_version()}


def uncalibrated(design: Design, study: Study) -> list[str]:
    """The design's SKUs whose latencies for this model are scaled from datasheets."""
    return uncalibrated_skus(design, study.model, study.perf.load(study.catalog))


def uncalibrated_skus(design: Design, model, perf) -> list[str]:
    """The design's SKUs whose latencies (at their pools' TP) are not measured."""
    flagged = [pool.sku.name for pool in design.pools
               if not perf.is_calibrated(model, pool.sku, pool.layout.tp if pool.layout else None)]
    return list(dict.fromkeys(flagged))


def latency_source(source: PerfSource, perf: Any, model: Any, machines) -> str:
    """Whose latencies a run simulates, per machine: the engine's kernel data (source, engine
    version, GPU), the 2023 Splitwise model, or a user's file."""
    machines = list({m.name: m for m in machines}.values())
    calibrated = getattr(perf, "model", perf)   # under --sensitivity's scaling too
    if source.path is not None and hasattr(calibrated, "pair"):   # an engine calibration
        return f"--perf-model {source.name} (sha256 {source.sha256[:12]}), {calibrated.text(model)}"
    if source.path is not None:
        return (f"--perf-model {source.name} (sha256 {source.sha256[:12]}); pairs it does not "
                f"cover: the {LEGACY_ENGINE} model")
    if source.latency_model == "splitwise-sim":
        return ("SplitwiseSim's latency curves from the 2023 Splitwise profiles (--assumptions "
                f"splitwise-sim); other pairs: the {LEGACY_ENGINE} model")
    legacy = (f"the {LEGACY_ENGINE} model (fitted to the 2023 Splitwise profiles of "
              "DGX-A100/H100, scaled by datasheets to other machines)")
    if not source.uses_kernels:
        return f"{legacy}, {source.dtype}"
    covered: dict[str, list[str]] = {}
    left_out: dict[str, list[str]] = {}   # database anomalies this model's latencies avoid
    for m in machines:
        if perf.covers(model, m):
            tables = perf.kernels.tables(m)
            key = (f"{ENGINE_NAMES[source.engine]} {tables.document['gemm']['engine_version']} "
                   f"on {tables.document.get('device', tables.gpu)}"
                   + tables.model_note(model))   # issue 36: MLA, attention variants, MoE dtype
            covered.setdefault(key, []).append(m.name)
            tps = [tp for tp in (1, 2, 4, 8, 16) if tp <= m.gpus and model.heads % tp == 0]
            for note in tables.anomalies(model, tps):
                left_out.setdefault(note, [])
                if tables.gpu not in left_out[note]:
                    left_out[note].append(tables.gpu)
    dtypes = (source.dtype if (source.dtype, source.kv_dtype) == ("bf16", "bf16")
              else f"{source.dtype} weights, {source.kv_dtype} KV cache")
    text = (f"{kernel_data_version()} kernel tables ({dtypes}): "
            + "; ".join(f"{key} ({', '.join(names)})" for key, names in covered.items())
            if covered else f"no {ENGINE_NAMES[source.engine]} {source.dtype} kernel data for "
                            f"{model.name} on these machines")
    others = [m.name for m in machines if not perf.covers(model, m)]
    if others:
        text += (f"; {', '.join(others)}: the {LEGACY_ENGINE} model (no "
                 f"{ENGINE_NAMES[source.engine]} {source.dtype} kernel data: uncalibrated)")
    for note, gpus in left_out.items():   # docs/kernel-data.md: anomalies of the database
        text += f"; database anomaly left out on {', '.join(gpus)}: {note}"
    if covered and source.overheads != NO_OVERHEADS:
        text += f"; {source.overheads.text(model.layers)}"
    return text


CALIBRATION_HINT = ("latencies scaled from datasheets (uncalibrated: expect 15-30% error); "
                    "profile the model on that GPU at 5 or more (prompt size, batch size) points "
                    "over at least 2 of each (docs/perf-model-tables.md: the CSV), run "
                    "`provision calibrate PROFILE.csv --out coeffs.json`, then search with "
                    "`--perf-model coeffs.json`")
SHAPES_HINT = ("the model's kernel shapes are estimated: it has no intermediate_size or "
               "vocab_size; give both in its catalog entry or size it from its Hugging Face "
               "config.json (--model-config)")


def calibration_hint(model) -> str:
    """What is estimated (the model's shapes, or the GPU's latencies) and what to do."""
    if model.intermediate_size is None or model.vocab_size is None:
        return SHAPES_HINT
    return CALIBRATION_HINT


def assumptions(study: Study) -> list[dict]:
    """Every modelling assumption that moves the answer, with its value in this run."""
    o = study.sim_options
    serialized = o.layerwise_min_prompt_tokens >= 1 << 62
    machines = {m.name: m for d in study.designs for m in d.machines()}
    return [
        {"name": "preset", "value": study.assumptions},
        {"name": "latency_source", "value": latency_source(
            study.perf, study.perf.load(study.catalog), study.model, machines.values())
         + spec_note(o)},
        {"name": "memory", "value": f"HBM as the catalog states it (GiB-class figures, as "
                                    f"nvidia-smi reports); {o.memory_reserve_fraction:.0%} "
                                    "reserved; KV capacity = GPUs x HBM x (1 - reserve) - "
                                    "weights; a prompt's KV is held on its prompt machine "
                                    "until transferred"},
        {"name": "kv_admission", "value": "a decode is admitted when the KV of its prompt plus "
                                          "its full output fits (reserved up front, FCFS)"
         if o.kv_admission == "reserve" else
         f"paged (vLLM): blocks of {o.kv_block_tokens} tokens allocated as tokens are "
         f"generated; admission FCFS by the current blocks, leaving {o.kv_watermark:.0%} of "
         "the blocks free; when blocks run out the latest admitted decode is preempted and "
         "recomputed (its prompt and tokens so far prefilled again on its machine)"},
        {"name": "batching", "value": "prefill first: an iteration without chunks runs the "
                                      "waiting prompts alone while the running decodes wait"
         if o.prefill_first else "mixed: an iteration runs the waiting prompts and the "
                                 "running decodes together"},
        {"name": "kv_transfer", "value": "serialized after the prompt" if serialized else
         f"serialized below {o.layerwise_min_prompt_tokens} prompt tokens, layer-wise (only "
         "the last layer and the link's fixed time visible) from there"},
        {"name": "tbt", "value": "(E2E - TTFT) / output tokens, against a time per token of the "
                                 "request alone (not divided by its output tokens)"
         if o.tbt_per_output_token else
         "a request's mean gap between output tokens: (E2E - TTFT) / (output tokens - 1)"},
        *([{"name": "latency_model", "value": "SplitwiseSim's: 1-D curves over prompt x batch "
                                              "tokens from its 2023 profiles (DGX-A100/H100); "
                                              "decode iterations at x = number of decodes (flat "
                                              "in the batch, no context term); other machines: "
                                              "the default model"},
           {"name": "mixed_batch_cost", "value": "1.1 x prompt curve at prompt + decode tokens"}]
          if study.perf.latency_model == "splitwise-sim" else
          [{"name": "mixed_batch_cost", "value": "max(prompt curve at prompt + decode tokens, "
                                                 "decode curve at the batch) + context term"}]),
        {"name": "prompt_batching", "value": f"FCFS batches of up to {o.prompt_token_limit} "
                                             "prompt tokens (a longer prompt runs alone)"},
        {"name": "routing", "value": "prompt machine: fewest pending prompt tokens; token "
                                     "machine: fewest committed KV tokens; ties to the lowest "
                                     "index; mixed pool above "
                                     f"{o.mixed_pool_queue_threshold} queued tokens"},
        {"name": "window", "value": window_text(
            (study.window or Window(study.duration_s, "given", "--duration")).as_dict())},
        {"name": "verification", "value": f"every SLO on {study.settings.verify_seeds} workload "
                                          f"sample(s), seeds {list(_seeds(study))}"},
        *failure_assumptions(study),
        *spec_decode_assumptions(study),
    ]


def spec_note(options) -> str:
    """'; speculative decoding: ...' after the latency source when it is on, else ''."""
    spec = options.spec_decode
    return "" if spec is None else f"; speculative decoding: {spec.describe()}"


def spec_decode_assumptions(study: Study) -> list[dict]:
    """With --spec-decode: the method, k, the acceptance and its source (none otherwise)."""
    spec = study.sim_options.spec_decode
    if spec is None:
        return []
    from simcore.specdecode import SOURCES
    return [{"name": "speculative_decoding", "value": (
        f"{spec.describe()}; acceptance default source: {SOURCES[spec.method]}; a step "
        f"verifies {spec.tokens + 1} tokens per request (the decode curve at "
        f"{spec.tokens + 1} x the batch) plus drafting {spec.tokens} x "
        f"{spec.draft_fraction:.3g} x a decode; steps drawn per request and sample seed; ITL "
        "one gap per step")}]


def failure_assumptions(study: Study) -> list[dict]:
    """With failures configured: how they are placed and recovered (none otherwise)."""
    o, k = study.sim_options, study.survive_failures
    if not (o.has_failures or k):
        return []
    placed = []
    if k:
        placed.append(f"N+{k}: {k} machine(s) fail 10% into the window and stay down, as "
                      f"{k} prompt, {k} token" + (" and half and half" if k > 1 else "")
                      + " (baselines: any); a point passes only in every placement")
    if o.mtbf_hours:
        placed.append(f"random failures per machine, MTBF {o.mtbf_hours:g} h, repaired after "
                      f"{o.repair_s:g} s, drawn per sample seed")
    regenerate = ("restart (regenerate): prefill the prompt, then decode the tokens sent "
                  "again, silently")
    recovery = (regenerate if o.recovery == "restart" and o.restart == "regenerate" else
                "restart (recompute): re-prefill prompt + generated tokens"
                if o.recovery == "restart" else
                f"replicate: KV streamed to {o.replica_target} memory as generated (not charged "
                "to iterations), restored at the link bandwidth")
    return [{"name": "failures", "value": "; ".join(placed) + f"; detected after "
             f"{o.detection_s:g} s; {recovery}; a failed machine loses its work and KV"}]


@dataclass
class SearchResult:
    """What a search found: typed per-design results, run statistics and the report."""
    study: Study
    designs: list[DesignResult]
    stats: RunStats = field(default_factory=RunStats)
    sensitivity: list[dict] | None = None   # with --sensitivity: what moves each optimum
    load_plan: dict | None = None   # with --load-curve: the static cluster and the plan
    spares: dict | None = None   # --survive-failures auto: the k chosen and why

    def to_dict(self) -> dict:
        """Exactly the content of report.json (and of `provision search --json`)."""
        document = report_document(to_echo(self.study), self.designs, versions(),
                                   assumptions(self.study),
                                   calibration_hint(self.study.model))
        if self.sensitivity is not None:
            document["sensitivity"] = sensitivity_dict(self.sensitivity)
        if self.load_plan is not None:
            document["load_curve"] = self.load_plan
        if self.spares is not None:
            document["summary"]["survive_failures_auto"] = self.spares
        if self.study.hardware:
            document["summary"]["hardware"] = hardware_summary(
                self.designs, self.study.goal, frozenset(self.study.catalog.designs))
        return document

    def write(self, out_dir: str | Path) -> list[Path]:
        """Write report.json, evaluations.csv and report.html atomically; returns the paths."""
        return write_reports(Path(out_dir), render_reports(self.to_dict(), self.designs))

    def __repr__(self) -> str:   # one line (a notebook shows it; the full record is to_dict)
        goal = self.study.goal
        at = f" at {goal.rate_rps:g} req/s" if goal.rate_rps is not None else ""
        if goal.closed is not None:
            at = f" holding {goal.closed.users:,} users"
        feasible = sum(r.feasible for r in self.designs)
        return (f"SearchResult({goal.name}{at}, {len(self.designs)} designs, {feasible} "
                f"feasible; {answer_sentence(self.to_dict())})")

    def _repr_html_(self) -> str:
        """A notebook's view: the answer and the optimum per design, as report.html shows."""
        document = self.to_dict()
        return (f"<p><b>{html.escape(answer_sentence(document))}</b></p>"
                + optimum_html(document))

    def to_pandas(self, evaluations: bool = False):
        """One row per design (its optimum, layout, bound, binding SLO and its latencies in
        ms on the base sample: TTFT, TPOT and E2E at P50/P90/P99), or with
        `evaluations=True` every simulated point (evaluations.csv)."""
        import io

        import pandas as pd
        if evaluations:
            return pd.read_csv(io.StringIO(csv_text(self.designs)))
        rows = []
        for entry in self.to_dict()["designs"]:
            o = entry["optimum"] or {}
            rows.append({
                "design": entry["design"], "feasible": entry["feasible"],
                "status": entry["status"],
                "layout": layout_label(o.get("layout")),
                "prompt_machines": o.get("machines", o.get("prompt_machines")),
                "token_machines": o.get("token_machines"), "rate_rps": o.get("rate_rps"),
                "cost_per_hour": o.get("cost_per_hour"), "power_kw": o.get("power_kw"),
                "gpus": o.get("gpus"), "binding_slo": o.get("binding_slo"),
                "binding_margin": o.get("binding_margin"),
                "headroom_rps": o.get("headroom_rps"),
                "capacity_bound": (entry.get("capacity_bound") or {}).get("value"),
                **_latency_columns(o.get("latency_ms")),
                "reason": entry["reason"]})
        frame = pd.DataFrame(rows).set_index("design")
        for column in ("prompt_machines", "token_machines", "gpus"):   # whole, or missing
            frame[column] = frame[column].astype("Int64")
        return frame

    @property
    def best(self) -> DesignResult | None:
        best = summary_dict(self.designs, self.study.goal.name)["best_design"]
        return next((r for r in self.designs if r.design.name == best), None)


LATENCY_COLUMNS = tuple(f"{metric}_{pct}_ms" for metric in ("ttft", "tpot", "e2e", "itl")
                        for pct in ("p50", "p90", "p99"))


def _latency_columns(latency_ms: dict | None) -> dict:
    """The optimum's latencies in ms as columns (ttft_p50_ms, ..., itl_p99_ms; None without
    an optimum)."""
    latency_ms = latency_ms or {}
    return {column: latency_ms.get(column.split("_")[0], {}).get(column.split("_")[1])
            for column in LATENCY_COLUMNS}


def _seeds(study: Study) -> tuple[int, ...]:
    return verification_seeds(study.seed, study.settings.verify_seeds)


def run_study(study: Study, execution: Execution, on_batch: OnBatch | None = None,
              resilience: bool = True) -> SearchResult:
    with cache_run():   # an ignored cache entry: one warning in this and its nested searches
        return _run_study(study, execution, on_batch, resilience)


def _run_study(study: Study, execution: Execution, on_batch: OnBatch | None,
               resilience: bool) -> SearchResult:
    if study.survive_auto:
        study, choice, runs = choose_spares(study, execution, on_batch)
        found = run_study(study, execution, on_batch, resilience)
        found.spares = choice
        found.stats = add_stats(found.stats, *runs)
        return found
    cache_dir = None if execution.no_cache else Path(execution.cache_dir or default_cache_dir())
    cache = DiskCache(cache_dir) if cache_dir is not None else None
    results, stats = _search(study, execution, cache, on_batch)
    if results is None:   # the cache steered the search: again, reading nothing from it
        results, more = _search(study, execution, replace(cache, read=False), on_batch)
        stats = add_stats(stats, more)
    for result in results:
        result.uncalibrated = uncalibrated(result.design, study)
    # (`resilience` False: a search another one runs, whose optima alone are wanted)
    if study.survive_failures and resilience:
        price_of_resilience(study, execution, results, on_batch)
    if study.sim_options.prefix_cache and resilience:
        stats = add_stats(stats, cache_savings(study, execution, results, on_batch))
    plan = None
    if study.load_curve is not None:   # every other window rate searched, then the plans
        plan, more = loadcurve.load_plan(study, partial(run_study, execution=execution,
                                                        on_batch=on_batch, resilience=False),
                                         results)
        stats = add_stats(stats, *more)
    moved = None
    if study.settings.sensitivity:
        moved, more = sensitivity(study, execution,
                                  partial(run_study, on_batch=on_batch, resilience=False),
                                  results)
        stats = add_stats(stats, *more)
    return SearchResult(study, results, stats, moved, plan)


def choose_spares(study: Study, execution: Execution,
                  on_batch: OnBatch | None = None) -> tuple[Study, dict, list[RunStats]]:
    """--survive-failures auto: k from the pools of every design's optimum (without spares
    first, then with the k they call for, until k stops growing); the study with that k,
    the choice and why (`provisioner.sparing`), and the searches' counts."""
    o = study.sim_options
    mtbf = o.mtbf_hours or FLEET_MTBF_HOURS
    resilience = study.options.resilience if study.options is not None else FailureOptions()
    repair_hours = resilience.repair_minutes / 60.0
    q = down_fraction(mtbf, repair_hours)
    k, runs, pools = 0, [], []
    for _ in range(4):   # a pool grown by k machines may call for one more
        trial = study.auxiliary(survive_failures=k, survive_auto=False)
        found = run_study(trial, execution, on_batch, resilience=False)
        runs.append(found.stats)
        pools = [n for r in found.designs if r.optimum is not None
                 for n in (r.optimum.prompt_machines, r.optimum.token_machines) if n]
        needed = spares_for(pools, q)
        if needed <= k:
            break
        k = needed
    choice = spare_record(k, pools, mtbf, repair_hours, o.mtbf_hours > 0)
    return replace(study, survive_failures=k, survive_auto=False), choice, runs


def planned_searches(study: Study) -> int:
    """How many searches `run_study` runs for `study`: its own and the auxiliary ones of
    --survive-failures, --load-curve and --sensitivity (the progress ETA's whole; `auto`
    spares are counted as their usual two trials)."""
    count = 1
    if study.survive_auto:
        count += 2 + 2
    elif study.survive_failures:
        count += 1 + sum(p != study.sim_options.recovery for p in ("restart", "replicate"))
    if study.load_curve is not None:
        count += len(loadcurve.other_rates(study))
    if study.settings.sensitivity:
        count += len(sensitivity_variants(study.auxiliary()))
    if study.sim_options.prefix_cache:
        count += 1
    return count


def add_stats(*runs: RunStats) -> RunStats:
    """The simulations of several searches, counted together (the summary line's count)."""
    return RunStats(sum(r.simulated for r in runs), sum(r.cache_hits for r in runs),
                    sum(r.memo_hits for r in runs))


def _search(study: Study, execution: Execution, cache: DiskCache | None,
            on_batch: OnBatch | None) -> tuple[list[DesignResult] | None, RunStats]:
    """Every design searched, verified and given its intervals; None (with the run's counts)
    when an optimum's verification samples from the disk cache disagree with the simulator."""
    runner = Runner(SimulationEvaluator(study), execution.jobs or default_jobs(),
                    execution.backend, execution.address, cache)
    searched, origin = budget_variants(study.designs, study.chunk_tokens)
    choices = layout_choices(study, searched)
    verifier = Verifier(runner, _seeds(study), SCREEN_SEEDS, study.settings.verify_margin)
    with runner:
        runnable = [d for d in searched if choices[d.name].variants]
        variants = {name: p.variants for name, p in choices.items()}
        if study.hardware:
            found = drive({HARDWARE_PROGRESS: hardware_search(
                runnable, variants, study.goal, study.constraints, study.settings,
                frozenset(study.catalog.designs))}, verifier.run, on_batch)[HARDWARE_PROGRESS]
        else:
            found = search_designs(runnable, study.goal, study.constraints, study.settings,
                                   verifier.run, progress_by_design(on_batch, origin),
                                   runner.concurrent, variants)
            found = {r.design.name: r for r in found}
        results = [found.get(d.name) or no_layout_result(d, study.goal, choices[d.name])
                   for d in searched]
        for result in results:
            chosen = choices[result.design.name]
            result.layouts_skipped = chosen.skipped
            if chosen.variants:
                result.layouts = result.layouts + chosen.too_slow
        results = collapse_variants(study.designs, results, origin, study.goal)
        for result in results:
            if result.design.prompt_layout is not None:
                result.layout = layout_record(result.design, study.model,
                                              study.sim_options.memory_reserve_fraction)
        disagreements = recheck_cached_optimum(results, runner)
        if disagreements:
            warn(f"the evaluation cache {cache.directory} holds entries the simulator does not "
                 f"reproduce ({disagreements[0]}; {len(disagreements)} in all); searching again "
                 "without reading it (its entries are rewritten)")
            return None, runner.stats
        attach_verification(results, runner)
        attach_unit_costs(results, study)
    return results, runner.stats


def price_of_resilience(study: Study, execution: Execution, results: list[DesignResult],
                        on_batch: OnBatch | None = None) -> None:
    """--survive-failures: each design's plain optimum (no failures) and its failure-aware
    optimum under restart and under replicate, with their costs and powers (one extra search
    without failures and one with the other recovery policy)."""
    plain = study.auxiliary(survive_failures=0,
                            sim_options=replace(study.sim_options, mtbf_hours=0.0, failures=()))
    runs = {"plain": plain}
    for policy in ("restart", "replicate"):
        if policy != study.sim_options.recovery:
            runs[policy] = replace(plain, survive_failures=study.survive_failures,
                                   sim_options=replace(study.sim_options, recovery=policy))
    optima = {name: {r.design.name: r.optimum
                     for r in run_study(variant, execution, on_batch, resilience=False).designs}
              for name, variant in runs.items()}
    optima[study.sim_options.recovery] = {r.design.name: r.optimum for r in results}
    for result in results:
        name = result.design.name
        base = optima["plain"].get(name)
        entry = {"survive_failures": study.survive_failures,
                 "replica_target": study.sim_options.replica_target}
        for label in ("plain", "restart", "replicate"):
            o = optima[label].get(name)
            entry[label] = None if o is None else {
                **machines_of(o), "rate_rps": o.rate_rps,
                "cost_per_hour": o.cost_per_hour, "power_kw": o.power_kw}
            if label != "plain" and o is not None and base is not None:
                entry[label]["cost_ratio"] = o.cost_per_hour / base.cost_per_hour
                entry[label]["power_ratio"] = o.power_kw / base.power_kw
                if study.goal.name == "max-rate":  # same budget: the rate given up
                    entry[label]["rate_ratio"] = o.rate_rps / base.rate_rps
        result.resilience = entry


def cache_savings(study: Study, execution: Execution, results: list[DesignResult],
                  on_batch: OnBatch | None = None) -> RunStats:
    """--prefix-cache on|aware: the same question searched with the cache off, and per design
    what the cache saved against that optimum (`DesignResult.prefix_savings`: both optima, and
    the cost and power saved, or for max-rate the rate gained within the same budget).
    Returns the extra search's counts."""
    plain = study.auxiliary(sim_options=replace(study.sim_options, prefix_cache=False,
                                                prefix_routing=False))
    found = run_study(plain, execution, on_batch, resilience=False)
    without = {r.design.name: r.optimum for r in found.designs}
    for result in results:
        result.prefix_savings = savings_entry(result.optimum, without.get(result.design.name),
                                              study.goal.name)
    return found.stats


def savings_entry(cached: Metrics | None, plain: Metrics | None, goal: str) -> dict:
    """One design's optima with and without the prefix cache (None: infeasible), and what
    the cache saved when both exist: cost and power (a fraction of the uncached optimum's),
    or, for max-rate, the rate it adds within the same budget."""
    def optimum(o: Metrics | None) -> dict | None:
        return None if o is None else {**machines_of(o), "rate_rps": o.rate_rps,
                                       "cost_per_hour": o.cost_per_hour, "power_kw": o.power_kw}

    entry = {"without_cache": optimum(plain), "with_cache": optimum(cached)}
    if cached is not None and plain is not None:
        if goal == "max-rate":
            entry["rate_gain"] = cached.rate_rps / plain.rate_rps - 1.0
        else:
            entry["cost_saved_per_hour"] = plain.cost_per_hour - cached.cost_per_hour
            entry["cost_saved"] = 1.0 - cached.cost_per_hour / plain.cost_per_hour
            entry["power_saved"] = 1.0 - cached.power_kw / plain.power_kw
    return entry


def check_writable_dir(path: str | Path, field_name: str) -> None:
    """Fail before any simulation when `path` cannot become a directory we can write (with the
    report files in it, for --out)."""
    check_output_dir(path, field_name, WRITTEN_FILES if field_name == "out" else ())


def search(*, spec: str | Path | None = None, on_batch: OnBatch | None = None,
           **options: Unpack[SearchKeywords]) -> SearchResult:
    """Run a provisioning search; keywords are the CLI options (`rate=70`, `goal="min-cost"`,
    `designs="splitwise-hh,splitwise-aa"` or a list of names and `Design` records, ...),
    typed in `provisioner.keywords.SearchKeywords`."""
    given = from_keywords(SearchOptions, options)
    if "cache_dir" not in given:
        given.setdefault("no_cache", True)  # from Python, nothing is written unless asked
    with asked(SearchOptions, given, spec, python_style) as merged:
        return run_study(resolve_study(merged), merged.execution, on_batch)


# --------------------------------------------------------------------------- one cluster
@dataclass
class SimulationRun:
    """One cluster simulated on one workload, with everything the summary needs."""
    cluster: Any
    model: Any
    workload: Any
    result: Any
    report: Any   # simcore.SloReport
    uncalibrated: list[str] = field(default_factory=list)  # SKUs with datasheet-scaled latencies
    profile: Any = None   # the SLO profile (goodput counts requests within its limits)
    latency_source: str = ""   # whose latencies (the engine's kernel data, the 2023 model, a file)
    layout: dict | None = None   # each pool's layout (provisioner.layouts.layout_record)
    window_s: float = 0.0   # the arrival window (--duration; a replayed trace: its span)
    window: dict | None = None   # the window asked (--duration or derived) and why
    prefix_reuse_bound: dict | None = None   # a workload with prefixes: the bound of a cache
    prefix_cache: bool = False   # --prefix-cache on or aware (SimOptions.prefix_cache)

    def to_dict(self) -> dict:
        """`provision simulate --json`'s document (`provisioner.simulation`)."""
        return simulation_summary(self)

    @property
    def calibration_hint(self) -> str:
        """What to do about the uncalibrated SKUs (the terminal's warning)."""
        return calibration_hint(self.model)

    def __repr__(self) -> str:   # one line, not the workload's and results' arrays
        c = self.cluster
        pools = c.design.pools_text(c.prompt_machines, c.token_machines, "machines")
        passed = "SLOs met" if self.report.passed else "SLOs missed"
        return (f"SimulationRun({c.design.name} {pools}, {self.model.name}, "
                f"{self.workload.name}, {len(self.workload):,} requests; {passed})")


def simulate(*, spec: str | Path | None = None,
             **options: Unpack[SimulateKeywords]) -> SimulationRun:
    """Simulate one cluster; keywords are `provision simulate`'s options with underscores
    (typed in `provisioner.keywords.SimulateKeywords`)."""
    given = from_keywords(SimulateOptions, options)
    with asked(SimulateOptions, given, spec, python_style) as merged:
        return simulate_options(merged)


def simulate_options(options: SimulateOptions) -> SimulationRun | CurveSimulation:
    """The options' question (`provisioner.question.resolve_simulate`), simulated."""
    return simulate_question(resolve_simulate(options))


def simulate_question(question: SimulateQuestion) -> SimulationRun | CurveSimulation:
    """Simulate the question's cluster on its sample (or over its load curve) and check its
    SLOs: the only place the simulate path calls the simulator."""
    q = question
    if q.curve is not None:
        return _simulate_curve(q)
    result = run_simulation(q.cluster, q.requests, q.model, q.perf_model, q.reference,
                            q.sim_options)
    return SimulationRun(q.cluster, q.model, q.requests, result, evaluate_slos(result, q.slo),
                         uncalibrated_skus(q.cluster.design, q.model, q.perf_model), q.slo,
                         latency_source(q.perf, q.perf_model, q.model,
                                        q.cluster.design.machines()) + spec_note(q.sim_options),
                         layout_record(q.cluster.design, q.model,
                                       q.sim_options.memory_reserve_fraction), q.window_s,
                         None if q.window is None else q.window.as_dict(),
                         q.workload.echo().get("prefix_reuse_bound"),
                         bool(q.sim_options.prefix_cache))


@dataclass(eq=False)
class CurveSimulation:
    """`provision simulate --load-curve`: one cluster (resized by a plan, if given) over a whole
    load curve in one streamed run (`simcore.longrun`)."""
    cluster: Cluster
    model: ModelSpec
    workload_name: str
    run: object            # simcore.longrun.CurveRun
    report: object         # the SLOs over the whole curve (ITL included)
    windows: list          # (Window, its SloReport or None when no request arrived in it)
    uncalibrated: list
    profile: object
    latency_source: str
    layout: dict
    plan: tuple = ()
    notes: tuple = ()

    def to_dict(self) -> dict:
        """`provision simulate --load-curve --json`'s document (`provisioner.simulation`)."""
        return curve_summary(self)

    @property
    def calibration_hint(self) -> str:
        """What to do about the uncalibrated SKUs (the terminal's warning)."""
        return calibration_hint(self.model)

    def __repr__(self) -> str:
        met = sum(r is None or r.passed for _, r in self.windows)
        return (f"CurveSimulation({self.cluster.design.name}, {self.run.requests:,} requests, "
                f"{met} of {len(self.windows)} windows met)")


def _simulate_curve(q: SimulateQuestion) -> CurveSimulation:
    """simulate --load-curve: the run (`provisioner.loadcurve.run_asked_curve`), the SLOs per
    --curve-window and over the whole curve, packed with what the run was priced on."""
    run, whole, reports, notes = loadcurve.run_asked_curve(q)
    reserve = q.sim_options.memory_reserve_fraction
    return CurveSimulation(q.cluster, q.model, q.workload.name, run, whole, reports,
                           uncalibrated_skus(q.cluster.design, q.model, q.perf_model), q.slo,
                           latency_source(q.perf, q.perf_model, q.model,
                                          q.cluster.design.machines()) + spec_note(q.sim_options),
                           layout_record(q.cluster.design, q.model, reserve), q.plan, notes)


__all__ = ["search", "SearchResult", "simulate", "SimulationRun", "resolve_study", "run_study",
           "merge_options", "budget_like", "to_echo", "versions", "Study", "PerfSource",
           "WorkloadSource"]
