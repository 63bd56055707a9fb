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
    from simcore import Cluster, SimOptions, evaluate_slos, simulate as run_simulation
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
        _write_atomically(requests_csv, result.requests_frame().to_csv(index=False))
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


def _write_atomically(path: Path, text: str) -> None:
    import os
    import tempfile
    path = Path(path)
    if path.parent and not path.parent.exists():
        raise InputError(f"directory does not exist: {path.parent}")
    fd, tmp = tempfile.mkstemp(dir=path.parent or ".", prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _simulation_summary(cluster, cat, requests, result, report, model_spec) -> dict:
    stats = result.machine_stats
    pools = {}
    if result.feasible:
        for role, label in ((0, "prompt"), (1, "token"), (2, "machines")):
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


def main() -> None:
    """Entry point: turns bad input anywhere into one line on stderr and exit code 2."""
    try:
        app()  # standalone: typer/click report usage errors themselves with exit code 2
    except InputError as err:
        err_console.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
