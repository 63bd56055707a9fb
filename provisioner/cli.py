"""The `provision` command line: a thin shell over library functions.

Every command validates its input through the data layer; an InputError becomes one line on
stderr and exit code 2, an infeasible result or a drifted check exit code 1.
"""
from __future__ import annotations

import json
import sys

import numpy as np
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from hardware_catalog import InputError, load_catalog
from slo_profiles import builtin_slo_profiles

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Size LLM inference clusters (Splitwise prompt/token pools) for the least "
                       "cost, the least power or the most throughput under tail-latency SLOs.")
console = Console()
err_console = Console(stderr=True)


@app.callback()
def _root() -> None:
    """Size LLM inference clusters for the least cost, the least power or the most throughput."""


def fail(message: str, code: int = 2) -> None:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def print_json(document) -> None:
    sys.stdout.write(json.dumps(document, indent=2) + "\n")


# ---------------------------------------------------------------------------------- catalog
@app.command()
def catalog(as_json: bool = typer.Option(False, "--json", help="Print one JSON document.")):
    """List machine SKUs, models, SLO profiles and designs."""
    cat = load_catalog()
    profiles = builtin_slo_profiles()
    if as_json:
        print_json({"machines": [m.as_dict() for m in cat.machines.values()],
                    "models": [m.as_dict() for m in cat.models.values()],
                    "slo_profiles": [p.as_dict() for p in profiles.values()],
                    "designs": [d.as_dict() for d in cat.designs.values()]})
        return
    machines = Table(title="Machine SKUs (per machine)")
    for col in ("SKU", "GPUs", "HBM GB", "HBM TB/s", "FP16 TFLOPS", "power kW", "$/h", "KV link Gb/s",
                "calibrated"):
        machines.add_column(col, justify="left" if col in ("SKU",) else "right")
    for m in cat.machines.values():
        machines.add_row(m.name, f"{m.gpus}x {m.gpu}", f"{m.gpus * m.hbm_gb:g}",
                         f"{m.gpus * m.hbm_bandwidth_gbs / 1000:.1f}",
                         f"{m.gpus * m.fp16_tflops:g}", f"{m.power_kw:.2f}",
                         f"{m.cost_per_hour:.2f}", f"{m.gpus * m.kv_link_gbps:g}",
                         "yes" if m.calibrated else "[yellow]no[/]")
    models = Table(title="Models")
    for col in ("model", "layers", "hidden", "heads/KV heads", "params B", "weights GB",
                "KV KiB/token"):
        models.add_column(col, justify="left" if col == "model" else "right")
    for m in cat.models.values():
        models.add_row(m.name, str(m.layers), str(m.hidden), f"{m.heads}/{m.kv_heads}",
                       f"{m.params_b:g}" + (f" ({m.active_params_b:g} active)"
                                            if m.active_params_b else ""),
                       f"{m.weight_bytes / 1e9:.0f}", f"{m.kv_bytes_per_token / 1024:.0f}")
    slos = Table(title="SLO profiles")
    for col in ("profile", "kind", "limits"):
        slos.add_column(col)
    for p in profiles.values():
        unit = "x" if p.kind == "slowdown" else " ms"
        slos.add_row(p.name, p.kind, ", ".join(f"{m.upper()} {q.upper()} {v:g}{unit}"
                                               for (m, q), v in p.limits.items()))
    designs = Table(title="Designs")
    for col in ("design", "prompt machines", "token machines", "mixed pool"):
        designs.add_column(col)
    for d in cat.designs.values():
        designs.add_row(d.name, d.prompt_sku, d.token_sku or "(same machines)",
                        "-" if d.is_baseline else ("on" if d.mixed_pool else "off"))
    for table in (machines, models, slos, designs):
        console.print(table)


# --------------------------------------------------------------------------------- simulate
@app.command()
def simulate(
    design: str = typer.Option(..., "--design", "-d",
                               help="Design name (see `provision catalog`) or PROMPT_SKU/TOKEN_SKU."),
    prompt: Optional[int] = typer.Option(None, "--prompt", help="Prompt machines (Splitwise designs)."),
    token: Optional[int] = typer.Option(None, "--token", help="Token machines (Splitwise designs)."),
    machines: Optional[int] = typer.Option(None, "--machines", help="Pool size (baseline designs)."),
    rate: Optional[float] = typer.Option(None, "--rate", help="Requests per second (Poisson). "
                                         "Default 70 for the default workload; a CSV trace is "
                                         "replayed as it is unless --rate is given."),
    workload: str = typer.Option("coding", "--workload", "-w",
                                 help="Built-in name (coding, conversation) or a CSV trace."),
    model: str = typer.Option("bloom-176b", "--model", "-m", help="Model name."),
    duration: float = typer.Option(120.0, "--duration", help="Seconds of synthesized arrivals."),
    seed: int = typer.Option(0, "--seed", help="Random seed for synthesized arrivals and sizes."),
    slo: str = typer.Option("splitwise", "--slo", help="SLO profile name or YAML file."),
    perf_model: Optional[str] = typer.Option(None, "--perf-model",
                                             help="Latency tables or calibrated coefficients file."),
    mixed_pool: Optional[bool] = typer.Option(None, "--mixed-pool/--no-mixed-pool",
                                              help="Override the design's mixed-pool setting."),
    requests_csv: Optional[Path] = typer.Option(None, "--requests-csv",
                                                help="Write per-request latencies to this CSV."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
):
    """Simulate one cluster on one workload and check the SLOs (exit 1 if any SLO fails)."""
    from provisioner.inputs import resolve_design, resolve_perf_model
    from simcore import SimOptions, evaluate_slos, simulate as run_simulation
    from simcore.workload import builtin_workload_names, resolve_workload
    from slo_profiles import load_slo_profile

    cat = load_catalog()
    chosen = resolve_design(design, cat)
    cluster = _cluster_from_counts(chosen, prompt, token, machines)
    if rate is None and workload in builtin_workload_names():
        if workload != "coding":
            raise InputError(f"workload '{workload}' is a distribution; give --rate")
        rate = 70.0
    model_spec = cat.model(model)
    profile = load_slo_profile(slo)
    perf = resolve_perf_model(perf_model)
    requests = resolve_workload(workload, rate, duration, seed)
    result = run_simulation(cluster, requests, model_spec, perf, cat,
                            SimOptions(mixed_pool=mixed_pool))
    report = evaluate_slos(result, profile)
    if requests_csv is not None and result.feasible:
        from provisioner.evaluate import write_atomically
        if not requests_csv.parent.is_dir():
            raise InputError(f"directory does not exist: {requests_csv.parent}",
                             field="--requests-csv")
        write_atomically(requests_csv, result.requests_frame().to_csv(index=False))
    summary = _simulation_summary(cluster, cat, requests, result, report, model_spec)
    if as_json:
        print_json(summary)
    else:
        _print_simulation(summary, report, requests.notes)
    if not report.passed:
        raise typer.Exit(1)


def _cluster_from_counts(design, prompt, token, machines):
    from simcore import Cluster
    if design.is_baseline:
        if prompt is not None or token is not None:
            raise InputError(f"design '{design.name}' is a baseline: give --machines N, "
                             "not --prompt/--token")
        if machines is None:
            raise InputError(f"design '{design.name}' needs --machines N")
        return Cluster(design, machines)
    if machines is not None:
        raise InputError(f"design '{design.name}' splits the phases: give --prompt N --token M, "
                         "not --machines")
    if prompt is None or token is None:
        raise InputError(f"design '{design.name}' needs --prompt N and --token M")
    return Cluster(design, prompt, token)


def _simulation_summary(cluster, cat, requests, result, report, model_spec) -> dict:
    stats = result.machine_stats
    pools = {}
    if result.feasible:
        from simcore.cluster import ROLE_BOTH, ROLE_PROMPT, ROLE_TOKEN
        for role, label in ((ROLE_PROMPT, "prompt"), (ROLE_TOKEN, "token"),
                            (ROLE_BOTH, "machines")):
            mask = stats["role"] == role
            if mask.any():
                pools[label] = {
                    "count": int(mask.sum()), "sku": str(stats["sku"][mask][0]),
                    "utilization": round(float(stats["utilization"][mask].mean()), 4),
                    "mean_batch": round(float(stats["mean_batch"][mask].mean()), 3),
                    "peak_kv_fraction": round(float((stats["max_memory_tokens"][mask]
                                                     / np.maximum(stats["kv_capacity_tokens"][mask], 1)).max()), 4),
                    "mixed_pool_s": round(float(stats["mixed_pool_s"][mask].sum()), 3)}
    return {
        "design": cluster.design.name, "prompt_machines": cluster.prompt_machines,
        "token_machines": cluster.token_machines, "model": model_spec.name,
        "workload": requests.name, "requests": len(requests),
        "cost_per_hour": round(cluster.cost_per_hour(cat), 4),
        "power_kw": round(cluster.power_kw(cat), 4), "gpus": cluster.gpus(cat),
        "makespan_s": round(result.makespan_s, 6),
        "kv_transfer_ms_mean": round(float(np.nanmean(result.kv_transfer_s)) * 1000, 4)
        if result.feasible else None,
        "pools": pools, **report.as_dict()}


def _print_simulation(summary: dict, report, notes) -> None:
    for note in notes:
        err_console.print(f"note: {note}", highlight=False)
    counts = (f"{summary['prompt_machines']} machines" if summary["token_machines"] == 0
              else f"{summary['prompt_machines']} prompt + {summary['token_machines']} token")
    console.print(f"[bold]{summary['design']}[/] ({counts}), {summary['model']}, "
                  f"{summary['workload']}: {summary['requests']} requests, "
                  f"${summary['cost_per_hour']:.2f}/h, {summary['power_kw']:.2f} kW, "
                  f"{summary['gpus']} GPUs", highlight=False)
    if not report.feasible:
        console.print(f"[bold red]infeasible:[/] {report.reason}", highlight=False)
        return
    table = Table(title=f"SLO profile '{report.profile}'")
    for col in ("metric", "percentile", "value", "limit", "margin", "status"):
        table.add_column(col, justify="left" if col in ("metric", "percentile") else "right")
    for check in report.checks:
        value = "-" if check.value is None else f"{check.value:.3f}{check.unit}"
        table.add_row(check.metric.upper(), check.percentile.upper(), value,
                      f"{check.limit:g}{check.unit}", f"{check.margin:+.1%}",
                      "[green]pass[/]" if check.passed else "[bold red]FAIL[/]")
    console.print(table)
    for label, pool in summary["pools"].items():
        console.print(f"{label} pool: {pool['count']}x {pool['sku']}, utilization "
                      f"{pool['utilization']:.0%}, mean batch {pool['mean_batch']:.1f}, peak KV "
                      f"{pool['peak_kv_fraction']:.0%}, mixed pool {pool['mixed_pool_s']:.1f} s",
                      highlight=False)
    verdict = "[green]all SLOs met[/]" if report.passed else \
        f"[bold red]{len(report.failing)} SLO(s) missed[/]"
    console.print(verdict)


# -------------------------------------------------------------------------------- calibrate
@app.command()
def calibrate(
    profile: Path = typer.Argument(..., help="Profile CSV (SplitwiseSim format: model, hardware, "
                                   "tensor_parallel, prompt_size, batch_size, token_size, "
                                   "prompt_time, token_time in ms)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the coefficients file "
                                       "(JSON; YAML if FILE ends .yaml) that --perf-model reads."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random 80:20 held-out split."),
    tp: Optional[int] = typer.Option(None, "--tp", help="Fit only rows of this tensor parallelism."),
    exclude_hardware: list[str] = typer.Option([], "--exclude-hardware", help="Skip rows of this "
                                               "hardware (repeatable), e.g. synthetic rows."),
):
    """Fit the performance model to measured latencies and report held-out error."""
    from simcore.perfcalib import calibrate as fit_profile, read_profile_csv, select_rows
    from simcore.perfmodel import coefficients_document

    rows = select_rows(read_profile_csv(profile), tp, tuple(exclude_hardware), str(profile))
    result = fit_profile(rows, seed=seed)
    command = " ".join(["provision calibrate", str(profile)]
                       + ([f"--tp {tp}"] if tp is not None else [])
                       + [f"--exclude-hardware {h}" for h in exclude_hardware])
    document = coefficients_document(
        result.groups, command=command,
        source=f"{profile.name} (sha256 {_sha256(profile)[:16]}, {result.rows} rows fitted)")
    if out is not None:
        _write_coefficients(out, document)
    if as_json:
        print_json({"profile": str(profile), "seed": seed, "test_fraction": 0.2,
                    "rows": result.rows, "duplicates_dropped": result.duplicates_dropped,
                    "artefacts_dropped": result.artefacts_dropped,
                    "held_out": [e.as_dict() for e in result.errors],
                    "coefficients": document})
        return
    table = Table(title=f"Held-out error (random 80:20 split, seed {seed})")
    for col in ("model", "hardware", "TP", "phase", "fit", "held out", "MAPE %", "max %"):
        text = col in ("model", "hardware", "phase")
        table.add_column(col, justify="left" if text else "right", no_wrap=text)
    for e in result.errors:
        table.add_row(e.model, e.hardware, str(e.tensor_parallel), e.phase, str(e.train_rows),
                      str(e.test_rows), "-" if e.mape_pct is None else f"{e.mape_pct:.2f}",
                      "-" if e.max_ape_pct is None else f"{e.max_ape_pct:.1f}")
    console.print(table)
    console.print(f"{result.rows} rows fitted; {result.duplicates_dropped} duplicate rows counted "
                  f"once; {result.artefacts_dropped} preemption artefacts dropped.")
    if out is not None:
        console.print(f"wrote coefficients of {len(result.groups)} groups to {out}")


def _sha256(path: Path) -> str:
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_coefficients(path: Path, document: dict) -> None:
    import yaml
    text = (yaml.safe_dump(document, sort_keys=False) if path.suffix.lower() in (".yaml", ".yml")
            else json.dumps(document, indent=2) + "\n")
    try:
        path.write_text(text)
    except OSError as err:
        raise InputError(f"cannot write file: {err.strerror}", source=str(path)) from None


# ----------------------------------------------------------------------------- search, check
@app.command()
def search(
    spec: Optional[Path] = typer.Option(None, "--spec", help="YAML file whose keys mirror these "
                                        "options, plus custom_designs: {NAME: {prompt_sku, "
                                        "token_sku}}; options given here override it."),
    model: Optional[str] = typer.Option(None, "--model", "-m",
                                        help="Model name (default: bloom-176b)."),
    workload: Optional[str] = typer.Option(None, "--workload", "-w",
                                           help="Built-in name (coding, conversation) or a CSV "
                                                "trace (default: coding)."),
    designs: Optional[str] = typer.Option(None, "--designs", "-d",
                                          help="all, or D1,D2 (catalog names or "
                                               "PROMPT_SKU/TOKEN_SKU) (default: all)."),
    goal: Optional[str] = typer.Option(None, "--goal", "-g",
                                       help="min-cost | min-power (with --rate) | max-rate "
                                            "(with a budget) (default: min-cost)."),
    rate: Optional[float] = typer.Option(None, "--rate", "-r",
                                         help="Requests per second for min-cost/min-power "
                                              "(default: 70 for a built-in workload)."),
    power_budget_kw: Optional[float] = typer.Option(None, "--power-budget-kw",
                                                    help="max-rate under this provisioned power."),
    cost_budget_per_hour: Optional[float] = typer.Option(None, "--cost-budget-per-hour",
                                                         help="max-rate under this $/h."),
    budget_like: Optional[str] = typer.Option(None, "--budget-like",
                                              help="SKU:N, power:SKU:N or cost:SKU:N: the power (default) or "
                                                   "cost of N machines of SKU, e.g. dgx-h100:40 "
                                                   "or cost:dgx-h100:40."),
    slo: Optional[str] = typer.Option(None, "--slo",
                                      help="SLO profile name or YAML (default: splitwise)."),
    perf_model: Optional[str] = typer.Option(None, "--perf-model",
                                             help="Latency tables or calibrated coefficients."),
    duration: Optional[float] = typer.Option(None, "--duration",
                                             help="Seconds of Poisson arrivals (default: 120)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Random seed (default: 0)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o",
                                       help="Report directory (default: provision-report)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j",
                                       help="Parallel evaluations (default: one per core)."),
    backend: Optional[str] = typer.Option(None, "--backend",
                                          help="loky | dask | ray (default: loky)."),
    address: Optional[str] = typer.Option(None, "--address",
                                          help="Scheduler of a dask or ray cluster (dask "
                                               "without it: a local cluster)."),
    exhaustive: Optional[bool] = typer.Option(None, "--exhaustive/--no-exhaustive",
                                              help="Evaluate every grid point and report "
                                                   "non-monotone cells."),
    max_machines: Optional[int] = typer.Option(None, "--max-machines",
                                               help="At most this many machines in all."),
    max_gpus: Optional[int] = typer.Option(None, "--max-gpus", help="At most this many GPUs."),
    max_prompt: Optional[int] = typer.Option(None, "--max-prompt",
                                             help="At most this many prompt machines."),
    max_token: Optional[int] = typer.Option(None, "--max-token",
                                            help="At most this many token machines."),
    search_limit: Optional[int] = typer.Option(None, "--search-limit",
                                               help="Largest pool the search grows to (default: 256)."),
    rate_tolerance: Optional[float] = typer.Option(None, "--rate-tolerance",
                                                   help="max-rate: relative precision (default: 0.02)."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir",
                                             help="Evaluation cache (default: ~/.cache/provision)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Neither read nor write the cache."),
    catalog_dir: Optional[Path] = typer.Option(None, "--catalog",
                                               help="Catalog directory (machines.yaml, "
                                                    "models.yaml, designs.yaml) (default: built-in)."),
    as_json: bool = typer.Option(False, "--json", help="Print report.json on stdout."),
):
    """Find the optimal prompt/token pools of every design (writes report.json, evaluations.csv,
    report.html). With no options: BLOOM-176B, coding at 70 req/s, all designs, min-cost."""
    from provisioner.config import merge_options, plan_search, run_plan
    from provisioner.reports import (SearchProgress, non_monotone_lines, optimum_table,
                                     render_reports, write_reports)

    given = {"model": model, "workload": workload, "designs": designs, "goal": goal,
             "rate": rate, "power_budget_kw": power_budget_kw,
             "cost_budget_per_hour": cost_budget_per_hour, "budget_like": budget_like,
             "slo": slo, "perf_model": perf_model, "duration": duration, "seed": seed,
             "out": _text(out), "jobs": jobs, "backend": backend, "address": address,
             "exhaustive": exhaustive, "max_machines": max_machines, "max_gpus": max_gpus,
             "max_prompt": max_prompt, "max_token": max_token, "search_limit": search_limit,
             "rate_tolerance": rate_tolerance, "cache_dir": _text(cache_dir),
             "no_cache": no_cache or None, "catalog": _text(catalog_dir)}
    plan = plan_search(merge_options(given, spec))
    with SearchProgress([d.name for d in plan.designs], enabled=not as_json) as progress:
        run = run_plan(plan, progress.update)
    write_reports(plan.out, render_reports(run.document, run.results))
    if as_json:
        print_json(run.document)
    else:
        console.print(optimum_table(run.document))
        console.print(f"{run.stats.simulated} simulations, {run.stats.cache_hits} from the cache "
                      f"({run.document['summary']['evaluations']} points evaluated); reports in "
                      f"{plan.out}/", highlight=False)
    for line in non_monotone_lines(run.document):
        err_console.print(f"[yellow]non-monotone:[/] {line}", highlight=False, soft_wrap=True)
    if plan.settings.exhaustive:
        cells = run.document["summary"]["non_monotone_cells"]
        err_console.print(f"exhaustive audit: every grid point evaluated, {cells} non-monotone "
                          "cell(s)", highlight=False)
    if not run.document["summary"]["feasible_designs"]:
        err_console.print("[bold red]no feasible configuration[/] for any design: "
                          + "; ".join(f"{d['design']}: {d['reason']}"
                                      for d in run.document["designs"]),
                          highlight=False, soft_wrap=True)
        raise typer.Exit(1)


@app.command()
def check(
    report: Path = typer.Argument(..., help="A report.json written by `provision search`."),
    catalog_dir: Optional[Path] = typer.Option(None, "--catalog",
                                               help="Catalog directory to check against "
                                                    "[built-in]."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Parallel evaluations."),
    backend: str = typer.Option("loky", "--backend", help="loky | dask | ray."),
    address: Optional[str] = typer.Option(None, "--address", help="dask/ray scheduler."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="Evaluation cache."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Simulate everything afresh."),
    as_json: bool = typer.Option(False, "--json", help="Print the verdict as JSON."),
):
    """Re-derive the optimum from the inputs echoed in REPORT.json on the current catalog and
    code; exit 1 with a diff (design, field, old -> new) if it moved."""
    from provisioner.check import check_report
    from provisioner.config import default_jobs
    from provisioner.evaluate import default_cache_dir

    if jobs is not None and jobs < 1:
        raise InputError(f"--jobs must be >= 1, got {jobs}")
    result = check_report(report, catalog_dir=_text(catalog_dir), jobs=jobs or default_jobs(),
                          backend=backend, address=address,
                          cache_dir=None if no_cache else (cache_dir or default_cache_dir()))
    if as_json:
        print_json(result.as_dict())
    else:
        for note in result.notes:
            console.print(f"[yellow]input changed:[/] {note}", highlight=False)
        for design, key, old, new in result.changes:
            console.print(f"[red]moved:[/] {design} {key}: {old} -> {new}", highlight=False)
        designs = len(result.run.document["designs"])
        plural = "s" if designs != 1 else ""
        console.print(f"optimum unchanged for {designs} design{plural}" if result.unchanged else
                      f"[bold red]optimum moved[/] ({len(result.changes)} changes)",
                      highlight=False)
    if not result.unchanged:
        raise typer.Exit(1)


def _text(path: Optional[Path]) -> Optional[str]:
    return None if path is None else str(path)


def main() -> None:
    """Entry point: turns bad input anywhere into one line on stderr and exit code 2."""
    try:
        app()  # standalone: typer/click report usage errors themselves with exit code 2
    except InputError as err:
        err_console.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
