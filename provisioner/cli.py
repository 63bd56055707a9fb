"""The `provision` command line: a thin shell over `provisioner.api`.

The options of `search`, `simulate` and `check` are generated from the declarations in
`provisioner.options`. Exit codes: 0 success, 1 SLOs infeasible or a check drifted, 2 bad input
(one line on stderr: `provision: error: ...`), 130 interrupted.

The library (numpy, pandas, numba, ortools, plotly) is imported inside the commands that use it,
so `provision --version` and `--help` start in a fraction of a second.
"""
from __future__ import annotations

import inspect
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import typer

try:  # recent typer vendors click as typer._click; its exceptions are not re-exported
    from typer._click.exceptions import ClickException, UsageError
except ImportError:  # pragma: no cover - typer on the real click
    from click.exceptions import ClickException, UsageError

from hardware_catalog import InputError
from provisioner import __version__
from provisioner.options import (Execution, SearchOptions, SimulateOptions, build,
                                 command_parameters, given_options, option_fields)

app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, context_settings={"help_option_names": ["-h", "--help"]},
                  help="Size LLM inference clusters (Splitwise prompt/token pools) for the least "
                       "cost, the least power or the most throughput under tail-latency SLOs.")


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"provision {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                       help="Print the version and exit.")) -> None:
    """Size LLM inference clusters for the least cost, the least power or the most throughput."""


PIPE_WIDTH = 200   # a pipe or file has no width to fit: wide enough that no table is squeezed


def _console(stderr: bool = False):
    from rich.console import Console
    console = Console(stderr=stderr)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(stderr=stderr, width=PIPE_WIDTH)
    return console


def note(message: str) -> None:
    _console(stderr=True).print(message, highlight=False, soft_wrap=True)


def print_json(document) -> None:
    sys.stdout.write(json.dumps(document, indent=2) + "\n")


def generated_command(name: str, tree: type, extra: list[inspect.Parameter],
                      exclude: tuple[str, ...] = ()) -> Callable:
    """Register `body(**values)` as command `name` with the options of `tree` plus `extra`."""
    def register(body: Callable) -> Callable:
        parameters = extra + command_parameters(tree, exclude)

        def command(**values):
            return body(**values)
        command.__signature__ = inspect.Signature(parameters)
        command.__annotations__ = {p.name: p.annotation for p in parameters}
        command.__doc__ = body.__doc__
        app.command(name)(command)
        return body
    return register


def _param(name: str, annotation, option) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                             annotation=annotation)


JSON = _param("as_json", bool, typer.Option(False, "--json", help="Print one JSON document."))
FORMAT = _param("output_format", str, typer.Option(
    "table", "--format", metavar="table|json|csv|markdown",
    help="What search prints on stdout: the terminal tables, report.json (as --json), or one "
         "row per design's optimum as CSV or Markdown (for pasting into a document)."))
SPEC = _param("spec", Optional[Path], typer.Option(
    None, "--spec", metavar="FILE", help="YAML file whose keys are these options' names (plus custom_designs: "
                         "{NAME: {prompt_sku, token_sku}}); options given here override it."))


# ---------------------------------------------------------------------------------- catalog
@app.command()
def catalog(as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
            catalog_dir: Optional[str] = typer.Option(None, "--catalog",
                                                      help="Catalog directory (default: "
                                                           "built-in).")):
    """List machine SKUs, models, SLO profiles and designs."""
    from provisioner.question import resolve_catalog
    from provisioner.terminal import catalog_tables
    from slo_profiles import builtin_slo_profiles

    cat, profiles = resolve_catalog(catalog_dir), builtin_slo_profiles()
    if as_json:
        from simcore.kernels import machine_latency_source
        print_json({"machines": [_machine_entry(m, machine_latency_source(m))
                                 for m in cat.machines.values()],
                    "models": [m.as_dict() for m in cat.models.values()],
                    "slo_profiles": [p.as_dict() for p in profiles.values()],
                    "designs": [d.as_dict() for d in cat.designs.values()]})
        return
    console = _console()
    for table in catalog_tables(cat, profiles):
        console.print(table)


def _machine_entry(machine, source: dict) -> dict:
    """A catalog machine in `catalog --json`: its record with its latency source in place of
    the bare `calibrated` flag (which said only whether the 2023 profiles measured it)."""
    entry = machine.as_dict()
    entry.pop("calibrated")
    entry["latency_source"] = source
    return entry


# --------------------------------------------------------------------------------- simulate
@generated_command("simulate", SimulateOptions, [SPEC, JSON])
def simulate(spec: Optional[Path] = None, as_json: bool = False, **values):
    """Simulate one cluster on one workload and check the SLOs (exit 1 if any SLO fails)."""
    from provisioner.question import asked, cli_style

    given = given_options(SimulateOptions, values)
    with asked(SimulateOptions, given, spec, cli_style(SimulateOptions)) as options:
        _simulate(options, spec, as_json)


def _simulate(options: SimulateOptions, spec: Optional[Path], as_json: bool) -> None:
    from provisioner.api import simulate_options
    from provisioner.question import input_files
    from provisioner.files import (check_not_an_input, check_output_file, output_errors,
                                   write_atomically)
    from provisioner.terminal import compile_notice, print_simulation

    csv_path = options.cluster.requests_csv
    if csv_path is not None:
        check_output_file(csv_path, "requests_csv")
        check_not_an_input(csv_path, input_files(options, spec), "requests_csv")
    with compile_notice(enabled=not as_json):
        run = simulate_options(options)
    if csv_path is not None and run.result.feasible:
        with output_errors("requests_csv"):
            write_atomically(Path(csv_path), run.result.requests_frame().to_csv(index=False))
    summary = run.to_dict()
    if as_json:
        print_json(summary)
    else:
        print_simulation(_console(), _console(stderr=True), summary, run)
    if not run.report.passed:
        raise typer.Exit(1)


# -------------------------------------------------------------------------------- calibrate
@app.command()
def calibrate(
    files: list[Path] = typer.Argument(..., metavar="PROFILE.csv | RESULTS.json...", help=(
        "A profile CSV (SplitwiseSim format: model, hardware, tensor_parallel, prompt_size, "
        "batch_size, token_size, prompt_time, token_time in ms), or serving-benchmark results: "
        "`vllm bench serve --save-result` JSON (one run per file or per line) and GuideLLM "
        "reports (JSON/YAML), one or more.")),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the file --perf-model reads: "
                                       "coefficients (a profile; YAML if FILE ends .yaml) or an "
                                       "engine calibration (benchmark results; JSON)."),
    seed: Optional[int] = typer.Option(None, "--seed", min=0, max=2**63 - 1,
                                       help="Seed of the random 80:20 held-out split (a "
                                            "profile; default 0)."),
    tp: Optional[int] = typer.Option(None, "--tp", min=1, max=1024,
                                     help="A profile: fit only rows of this tensor "
                                          "parallelism. Benchmark results: the served layout's "
                                          "TP (required)."),
    exclude_hardware: list[str] = typer.Option([], "--exclude-hardware", help="Skip rows of this "
                                               "hardware (repeatable), e.g. synthetic rows "
                                               "(a profile)."),
    model: Optional[str] = typer.Option(None, "--model", help="Benchmark results: the catalog "
                                        "model served (required)."),
    machine: Optional[str] = typer.Option(None, "--machine", help="Benchmark results: the "
                                          "catalog machine SKU served on (required)."),
    engine: Optional[str] = typer.Option(None, "--engine", metavar="vllm|sglang|trtllm",
                                         help="Benchmark results: the serving engine (default "
                                              "vllm, as the search's)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", metavar="bf16|fp8|fp4",
                                        help="Benchmark results: the weights' data type "
                                             "(default bf16)."),
    kv_dtype: Optional[str] = typer.Option(None, "--kv-dtype", metavar="auto|bf16|fp8",
                                           help="Benchmark results: the KV cache's data type "
                                                "(default auto: the engine's, as the search's)."),
):
    """Fit the performance model to measured latencies (a profile CSV) or an engine's overheads
    and per-phase scales to serving benchmarks (vllm bench serve, GuideLLM); report held-out
    error."""
    from provisioner.benchfiles import bench_format, read_bench_file

    from provisioner.files import check_not_an_input, check_output_file

    # a benchmark result: any file not named .csv, or a .csv whose content is one (JSON)
    kinds = {f.suffix.lower() != ".csv" or bench_format(f) is not None for f in files}
    for f in files:   # an unreadable or foreign file is named before any option is asked for
        if f.suffix.lower() != ".csv":
            read_bench_file(f)
    if kinds == {True}:
        given = {"--seed": seed is not None, "--exclude-hardware": bool(exclude_hardware)}
        for option, present in given.items():
            if present:
                raise InputError(f"{option} applies to a profile CSV, not to benchmark results",
                                 field=option.lstrip("-").replace("-", "_"))
        for option, value in (("--model", model), ("--machine", machine), ("--tp", tp)):
            if value is None:
                raise InputError(f"benchmark results need {option} (the served "
                                 f"{option.lstrip('-')})", field=option.lstrip("-"))
    else:
        if len(files) != 1 or True in kinds:
            raise InputError("give one profile CSV, or only serving-benchmark result files "
                             "(vllm bench serve JSON, GuideLLM reports)", field="files")
        for option, value in (("--model", model), ("--machine", machine), ("--engine", engine),
                              ("--dtype", dtype), ("--kv-dtype", kv_dtype)):
            if value is not None:
                raise InputError(f"{option} applies to serving-benchmark results, not to a "
                                 f"profile CSV (its rows name their model and hardware)",
                                 field=option.lstrip("-").replace("-", "_"))
    if out is not None:
        check_output_file(out, "out")
        check_not_an_input(out, {f"input {i + 1}": f for i, f in enumerate(files)}, "out")
    if kinds == {True}:
        _calibrate_serving(files, as_json, out, tp, model, machine, engine or "vllm",
                           dtype or "bf16", kv_dtype or "auto")
        return
    _calibrate_profile(files[0], as_json, out, seed or 0, tp, exclude_hardware)


def _calibrate_profile(profile: Path, as_json: bool, out: Optional[Path], seed: int,
                       tp: Optional[int], exclude_hardware: list[str]) -> None:
    from provisioner.files import file_sha256, output_errors, write_atomically
    from provisioner.terminal import calibration_table
    from simcore.perfcalib import calibrate as fit_profile, read_profile_csv, select_rows
    from simcore.perfmodel import coefficients_document

    rows = select_rows(read_profile_csv(profile), tp, tuple(exclude_hardware), str(profile))
    result = fit_profile(rows, seed=seed, source=str(profile))
    command = " ".join(["provision calibrate", str(profile)]
                       + ([f"--tp {tp}"] if tp is not None else [])
                       + [f"--exclude-hardware {h}" for h in exclude_hardware])
    document = coefficients_document(
        result.groups, command=command,
        source=f"{profile.name} (sha256 {file_sha256(profile)[:16]}, {result.rows} rows fitted)")
    if out is not None:
        with output_errors("out"):
            write_atomically(out, _coefficients_text(out, document))
    if as_json:
        print_json({"profile": str(profile), "seed": seed, "test_fraction": 0.2,
                    "rows": result.rows, "duplicates_dropped": result.duplicates_dropped,
                    "artefacts_dropped": result.artefacts_dropped,
                    "held_out": [e.as_dict() for e in result.errors],
                    "coefficients": document})
        return
    console = _console()
    console.print(calibration_table(result, seed))
    console.print(f"{result.rows} rows fitted; {result.duplicates_dropped} duplicate rows counted "
                  f"once; {result.artefacts_dropped} preemption artefacts dropped.")
    if out is not None:
        console.print(f"wrote coefficients of {len(result.groups)} groups to {out}")


def _calibrate_serving(files: list[Path], as_json: bool, out: Optional[Path], tp: int,
                       model_name: str, machine_name: str, engine: str, dtype: str,
                       kv_dtype: str) -> None:
    """Engine overheads and per-phase scales from serving benchmarks (provisioner.servefit)."""
    from provisioner.benchfiles import read_bench_files
    from provisioner.files import file_sha256, output_errors, write_atomically
    from provisioner.question import resolve_catalog
    from provisioner.servefit import calibration_document, fit_runs, price_runs
    from provisioner.study import kv_dtype_of, model_in_dtype
    from simcore.engine_overheads import fitted_overheads
    from simcore.kernels import KernelPerformanceModel

    for option, value, allowed in (("engine", engine, ("vllm", "sglang", "trtllm")),
                                   ("dtype", dtype, ("bf16", "fp8", "fp4")),
                                   ("kv_dtype", kv_dtype, ("auto", "bf16", "fp8"))):
        if value not in allowed:
            raise InputError(f"--{option.replace('_', '-')} must be one of "
                             f"{', '.join(allowed)}, got {value!r}", field=option)
    catalog = resolve_catalog(None)
    if model_name not in catalog.models:
        raise InputError(f"unknown model '{model_name}'; catalog models: "
                         f"{', '.join(sorted(catalog.models))}", field="model")
    if machine_name not in catalog.machines:
        raise InputError(f"unknown machine '{machine_name}'; catalog machines: "
                         f"{', '.join(sorted(catalog.machines))}", field="machine")
    runs = read_bench_files(files)     # every file validated before any pricing
    kv = kv_dtype_of(engine, dtype, kv_dtype)
    record = model_in_dtype(catalog.models[model_name], dtype, kv)
    sku = catalog.machines[machine_name]
    kernels = KernelPerformanceModel(engine, dtype, kv_dtype=kv)
    if not kernels.is_calibrated(record, sku, tp):
        raise InputError(f"no {engine} {dtype} kernel tables (KV {kv}) price {model_name} on "
                         f"{machine_name}: the fit needs them", field="machine")
    curves = kernels.curves(record, sku, tp)
    calibration = fit_runs(price_runs(runs, curves, record.layers), fitted_overheads(engine))
    command = " ".join(["provision calibrate", *map(str, files), "--model", model_name,
                        "--machine", machine_name, "--tp", str(tp), "--engine", engine,
                        "--dtype", dtype, "--kv-dtype", kv_dtype])
    sources = [{"path": str(f), "sha256": file_sha256(f),
                "runs": sum(r.file == str(f) for r in runs),
                "format": next(r.format for r in runs if r.file == str(f))} for f in files]
    document = calibration_document(calibration, engine=engine, dtype=dtype, kv_dtype=kv,
                                    model=model_name, machine=machine_name, tp=tp,
                                    sources=sources, command=command)
    if out is not None:
        with output_errors("out"):
            write_atomically(out, json.dumps(document, indent=2) + "\n")
    if as_json:
        print_json({**document, "out": str(out) if out is not None else None,
                    "compositions": calibration.compositions, "notes": calibration.notes})
        return
    _print_serving(_console(), document, calibration, out)


def _print_serving(console, document: dict, calibration, out: Optional[Path]) -> None:
    from rich.table import Table

    table = Table(title=f"{document['engine']} on {document['model']} / {document['machine']} "
                        f"TP {document['tp']}: measured vs predicted (ms)")
    for column in ("run", "c", "isl", "osl", "TPOT meas.", "before", "fitted", "held out",
                   "TTFT meas.", "before", "fitted", "held out"):
        table.add_column(column, justify="left" if column == "run" else "right")
    def cells(r, k):
        return [f"{r[k][x]:.2f}" if x in r[k] else "-"
                for x in ("measured", "before", "fitted", "held_out")]
    for r in document["runs"]:
        table.add_row(f"{Path(r['file']).name} {r['run']}", f"{r['concurrency']:.1f}",
                      f"{r['input_tokens']:.0f}", f"{r['output_tokens']:.0f}",
                      *cells(r, "tpot_ms"), *cells(r, "ttft_ms"))
    console.print(table)
    t, sc = document["terms"], document["scales"]
    console.print(f"fitted ({document['composition']}): {t['iteration_s'] * 1e3:.3g} ms per "
                  f"iteration + {t['sequence_s'] * 1e6:.3g} µs per sequence, first token "
                  f"+{t['first_token_s'] * 1e3:.3g} ms, prompt x{sc['prompt_scale']:.3g}, decode "
                  f"x{sc['decode_scale']:.3g}")
    held = document["held_out"]
    if held:
        for k in ("tpot", "ttft"):
            b, a = held[k]["before"], held[k]["after"]
            console.print(f"{k.upper()} error median/P90: engine defaults {b['median']:.1%}/"
                          f"{b['p90']:.1%} -> held out (leave one run out) {a['median']:.1%}/"
                          f"{a['p90']:.1%}")
    for note in calibration.notes:
        console.print(f"note: {note}")
    if out is not None:
        console.print(f"wrote engine calibration to {out}; search with --perf-model {out}")


def _coefficients_text(path: Path, document: dict) -> str:
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml
        return yaml.safe_dump(document, sort_keys=False)
    return json.dumps(document, indent=2) + "\n"


# ----------------------------------------------------------------------------- search, check
@generated_command("search", SearchOptions, [SPEC, JSON, FORMAT])
def search(spec: Optional[Path] = None, as_json: bool = False, output_format: str = "table",
           **values):
    """Find the optimal prompt/token pools of every design (writes report.json, evaluations.csv,
    report.html). With no options: BLOOM-176B, coding at 70 req/s, all designs, min-cost."""
    from provisioner.question import asked, cli_style

    if output_format not in OUTPUT_FORMATS:
        raise InputError(f"--format must be one of {', '.join(OUTPUT_FORMATS)}, got "
                         f"{output_format!r}", field="format")
    given = given_options(SearchOptions, values)
    with asked(SearchOptions, given, spec, cli_style(SearchOptions)) as options:
        _search(options, spec, "json" if as_json else output_format)


OUTPUT_FORMATS = ("table", "json", "csv", "markdown")


def _search(options: SearchOptions, spec: Optional[Path], output_format: str) -> None:
    as_json = output_format == "json"
    from provisioner.api import check_writable_dir, planned_searches, resolve_study, run_study
    from provisioner.reports import render_reports, write_reports
    from provisioner.evaluate import warm_up
    from provisioner.hardware import HARDWARE_PROGRESS
    from provisioner.terminal import (SearchProgress, best_lines, compile_notice, hardware_lines,
                                      hardware_view, headline_lines, load_curve_lines,
                                      markdown_table, optimum_table,
                                      search_notes, sensitivity_table)

    from provisioner.runner import check_execution

    from provisioner.files import check_not_an_input, output_errors
    from provisioner.question import input_files
    from provisioner.reports import WRITTEN_FILES

    out = Path(options.execution.out)
    check_writable_dir(out, "out")
    inputs = input_files(options, spec)
    for name in WRITTEN_FILES:
        check_not_an_input(out / name, inputs, "out")
    check_execution(options.execution)
    study = resolve_study(options)
    shown = not (as_json or options.execution.quiet)
    with compile_notice(enabled=shown):
        warm_up(study)
    tasks = [HARDWARE_PROGRESS] if study.hardware else [d.name for d in study.designs]
    with SearchProgress(tasks, enabled=shown, searches=planned_searches(study)) as progress:
        started = time.perf_counter()
        result = run_study(study, options.execution, progress.update)
        wall = time.perf_counter() - started
    document = result.to_dict()
    texts = render_reports(document, result.designs)
    with output_errors("out"):
        write_reports(out, texts)
    if as_json:
        print_json(document)
    elif output_format == "csv":
        sys.stdout.write(result.to_pandas().to_csv())
    elif output_format == "markdown":
        sys.stdout.write(markdown_table(document))
    else:
        console = _console()
        shown = hardware_view(document)
        # on a terminal the lines wrap between words; piped, each stays one line (for grep)
        soft = not console.is_terminal
        for line in headline_lines(document):   # a load curve's plan comes first
            console.print(line, highlight=False, soft_wrap=soft)
        console.print(optimum_table(shown, console.width))
        for line in hardware_lines(document) + search_notes(shown) + load_curve_lines(document):
            console.print(line, highlight=False, soft_wrap=soft)
        moved = sensitivity_table(document, console.width)
        if moved is not None:
            console.print(moved)
        rate = result.stats.simulated / max(wall, 1e-9)
        console.print(f"{result.stats.simulated} simulations ({rate:,.0f}/s over {wall:.1f} s), "
                      f"{result.stats.cache_hits} from the cache "
                      f"({document['summary']['evaluations']} points evaluated); reports in "
                      f"{out}/", highlight=False)
        for line in best_lines(document):
            console.print(line, highlight=False, soft_wrap=soft)
    _search_warnings(document, options.settings.exhaustive)
    if not document["summary"]["feasible_designs"]:
        note("[bold red]no feasible configuration[/] for any design: "
             + "; ".join(f"{d['design']}: {d['reason']}" for d in document["designs"]))
        raise typer.Exit(1)


def _search_warnings(document: dict, exhaustive: bool) -> None:
    from provisioner.reports import non_monotone_lines
    for line in non_monotone_lines(document):
        note(f"[yellow]non-monotone:[/] {line}")
    if exhaustive:
        cells = document["summary"]["non_monotone_cells"]
        note(f"exhaustive audit: every grid point evaluated, {cells} non-monotone cell(s)")


REPORT = _param("report", Path, typer.Argument(..., metavar="REPORT.json",
                                               help="A report.json written by `provision "
                                                    "search`."))
CHECK_OPTIONS = ("catalog", "jobs", "backend", "address", "cache_dir", "no_cache")


@generated_command("check", SearchOptions, [REPORT, JSON],
                   exclude=tuple(n for n in option_fields(SearchOptions) if n not in CHECK_OPTIONS))
def check(report: Path, as_json: bool = False, **values):
    """Re-derive every section of REPORT from the inputs it echoes, on the current catalog and
    code; exit 1 with a diff (design, field, old -> new) if anything moved, 2 if REPORT lacks a
    section its own inputs imply."""
    from provisioner.check import check_report

    from provisioner.runner import check_execution

    given = given_options(SearchOptions, values)
    execution = build(Execution, given)
    check_execution(execution)
    result = check_report(report, execution, catalog_dir=given.get("catalog"))
    if as_json:
        print_json(result.as_dict())
    else:
        console = _console()
        for line in result.lines():
            console.print(line, highlight=False)
    if not result.unchanged:
        raise typer.Exit(1)


@app.command()
def export(report: Path = typer.Argument(..., metavar="REPORT.json",
                                         help="A report.json written by `provision search`."),
           target: str = typer.Option(..., "--target", metavar="TARGET",
                                      help="vllm, sglang, trtllm (launch scripts), dynamo "
                                           "(a DynamoGraphDeployment), llm-d (model service "
                                           "values) or k8s (Deployments and Services)."),
           design: Optional[str] = typer.Option(None, "--design", metavar="D",
                                                help="The design to deploy (default: the "
                                                     "report's best)."),
           out: Optional[Path] = typer.Option(None, "--out", metavar="DIR",
                                              help="Output folder (default: export-TARGET "
                                                   "beside the report)."),
           force: bool = typer.Option(False, "--force",
                                      help="Replace the files of an earlier export in a "
                                           "non-empty --out."),
           draft_model: Optional[str] = typer.Option(
               None, "--draft-model", metavar="ID",
               help="The EAGLE head's Hugging Face id or path, when the search assumed "
                    "--spec-decode eagle (MTP needs none; a draft:MODEL's comes from the "
                    "catalog).")):
    """Write the launch configuration of every pool of a design of REPORT (the settings the
    simulation assumed, the KV-transfer wiring of prompt / token pools) for an engine or
    Kubernetes; a load-curve report's plan as a schedule."""
    from provisioner.export import export as export_files

    written = export_files(report, target, design, out, force, draft_model)
    console = _console()
    for path in written:
        console.print(str(path), highlight=False, soft_wrap=True)


@app.command()
def serve(report: Optional[Path] = typer.Argument(None, metavar="REPORT.json",
                                                  help="Open on this report's question."),
          spec: Optional[Path] = typer.Option(None, "--spec", metavar="FILE",
                                              help="Open on this spec file's question."),
          host: str = typer.Option("127.0.0.1", "--host", metavar="HOST",
                                   help="Address to listen on (loopback only unless "
                                        "--allow-remote)."),
          port: int = typer.Option(8765, "--port", metavar="N", min=0, max=65535,
                                   help="Port to listen on (0: any free port)."),
          allow_remote: bool = typer.Option(False, "--allow-remote",
                                            help="Listen on a non-loopback address: anyone "
                                                 "who reaches it can run searches here."),
          cache_dir: Optional[str] = typer.Option(None, "--cache-dir", metavar="DIR",
                                                  help="Evaluation cache of the page's "
                                                       "searches (default: "
                                                       "serve/ in the project's cache "
                                                       "folder)."),
          jobs: Optional[int] = typer.Option(None, "--jobs", "-j", metavar="N", min=1,
                                             max=1024, help="Parallel evaluations (default: "
                                                            "one per core).")):
    """A local what-if page: the answer of a search (the default question, REPORT's or
    --spec's), re-searched in the background as the rate, SLO limits, goal, budget, prices
    and hardware change; the question is in the page's address."""
    from provisioner.api import resolve_study
    from provisioner.serve import Explorer, base_options, make_server, page_url

    base = base_options(report, spec)
    explorer = Explorer(base, cache_dir, jobs)
    _, options, _ = explorer.canonical(explorer.base_query)   # as the page will ask it
    resolve_study(build(SearchOptions, options))               # bad names: refused here
    server = make_server(explorer, host, port, allow_remote)
    note(f"provision serve: {page_url(server, explorer.base_query)} (Ctrl-C stops; "
         f"evaluation cache {explorer.cache_dir})")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        note("provision serve: stopped")
    finally:
        server.server_close()


class StdoutFailed(Exception):
    """Writing to standard output failed (a full device, a closed pipe): not an OSError, so
    no command's own OSError handling mistakes it for one of its files."""

    def __init__(self, err: OSError):
        super().__init__(err.strerror or str(err))


class _GuardedStdout:
    """sys.stdout as it is, except that a failed write or flush raises StdoutFailed (rich
    prints through sys.stdout, so its tables are covered too)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as err:
            raise StdoutFailed(err) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as err:
            raise StdoutFailed(err) from None

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _single_threaded_blas() -> None:
    """numpy's OpenBLAS starts a worker thread per extra core when it loads, and the workers
    spin for about 0.1 CPU s before they sleep, whether or not anything calls BLAS: a tenth
    of a `provision simulate`, paid again by every worker process. provision multiplies no
    matrices worth threading, so its commands load OpenBLAS with one thread, unless the
    environment already says how many (the workers inherit it)."""
    if "numpy" not in sys.modules:   # (only before numpy loads: after, it changes nothing)
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _tolerant_streams() -> None:
    """A stream that cannot encode a character (PYTHONIOENCODING=ascii, a C locale) writes a
    replacement instead of failing: '?' on stdout (tables, ±, …), an escape on stderr (a file
    name in an error)."""
    for stream, errors in ((sys.stdout, "replace"), (sys.stderr, "backslashreplace")):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        if hasattr(stream, "reconfigure") and encoding not in ("utf8", "utf16", "utf32"):
            try:
                stream.reconfigure(errors=errors)
            except (OSError, ValueError):
                pass


def main() -> None:
    """Entry point: bad input anywhere becomes one line on stderr and exit code 2; Ctrl-C one
    line and exit code 130; a standard output that cannot be written one line and exit 2."""
    _single_threaded_blas()
    _tolerant_streams()
    stdout = sys.stdout
    sys.stdout = _GuardedStdout(stdout)
    try:
        _main()
    finally:
        if sys.stdout.__class__ is _GuardedStdout:
            sys.stdout = stdout


def _stdout_failed(err: StdoutFailed) -> None:
    """One line on stderr; the unwritten output is dropped (stdout pointed at /dev/null, so the
    interpreter's last flush does not fail again with 'Exception ignored')."""
    import os
    if getattr(sys.stdout, "_stream", sys.stdout) is sys.__stdout__:   # not a test's capture
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.__stdout__.fileno())
        except (OSError, ValueError, AttributeError):
            pass
    _fail(f"cannot write to standard output: {err}")


# Options whose repeats have one obvious meaning: their values are joined into one
# comma-separated value (`--price a=1 --price b=2` is `--price a=1,b=2`). typer keeps only the
# last occurrence of an option, so every other repeat is refused rather than dropped.
MERGED_OPTIONS = ("price",)


def repeats_resolved(root, args: list[str]) -> list[str]:
    """`args` with the repeats of a MERGED_OPTIONS option joined; InputError for any other
    option given more than once (the earlier value would be silently dropped)."""
    start = next((i for i, arg in enumerate(args) if not arg.startswith("-")), None)
    commands = getattr(root, "commands", {})
    if start is None or args[start] not in commands:
        return args
    by_flag = {flag: param for param in commands[args[start]].params
               if param.param_type_name == "option"
               for flag in (*param.opts, *param.secondary_opts)}
    given: dict[str, list[tuple[int, int, str, str | None]]] = {}
    index = start + 1
    while index < len(args) and args[index] != "--":
        flag, value, width = _occurrence(args, index, by_flag)
        if flag is not None:
            given.setdefault(by_flag[flag].name, []).append((index, width, flag, value))
        index += width
    for name, occurrences in given.items():
        if len(occurrences) > 1 and name not in MERGED_OPTIONS:
            raise InputError(_repeat_message(occurrences, by_flag))
    return _merged(args, {n: o for n, o in given.items() if len(o) > 1})


def _occurrence(args: list[str], index: int, by_flag: dict) -> tuple[str | None, str | None, int]:
    """(the option's flag, its value, how many arguments it takes) at `index`; (None, None,
    1) for an argument that is no known option (click judges it)."""
    arg = args[index]
    if arg.startswith("--") and "=" in arg:
        flag, value = arg.split("=", 1)
        return (flag, value, 1) if flag in by_flag else (None, None, 1)
    if arg in by_flag:
        param = by_flag[arg]
        if param.is_flag or param.count:
            return arg, None, 1
        return arg, (args[index + 1] if index + 1 < len(args) else None), 2
    if not arg.startswith("--") and len(arg) > 2 and arg[:2] in by_flag             and not by_flag[arg[:2]].is_flag:   # -r5: a short option and its value
        return arg[:2], arg[2:], 1
    return None, None, 1


def _repeat_message(occurrences: list, by_flag: dict) -> str:
    flags = sorted({flag for _, _, flag, _ in occurrences})
    shown = " and ".join(flags)
    values = [value for *_, value in occurrences if value is not None]
    if len(flags) > 1 and not values:
        return f"{shown} are both given; give one of them"
    listed = f" ({', '.join(values)})" if values else ""
    hint = ""
    if values and by_flag[flags[0]].name in _list_options():
        hint = f", one comma-separated list ({flags[0]} {','.join(values)})"
    times = "twice" if len(occurrences) == 2 else f"{len(occurrences)} times"
    return (f"{flags[0]} is given {times}{listed}: only one would count; "
            f"give it once{hint}")


def _list_options() -> set[str]:
    """Options that take a comma-separated list of names (their check is `Names`)."""
    from hardware_catalog.checks import Names
    return {name for tree in (SearchOptions, SimulateOptions)
            for name, f in option_fields(tree).items() if isinstance(f.metadata["check"], Names)}


def _merged(args: list[str], repeated: dict[str, list]) -> list[str]:
    """Each repeated MERGED_OPTIONS option as one occurrence, where the first one stood."""
    if not repeated:
        return args
    drop, put = set(), {}
    for occurrences in repeated.values():
        first, _, flag, _ = occurrences[0]
        put[first] = [flag, ",".join(value or "" for *_, value in occurrences)]
        for index, width, *_ in occurrences:
            drop.update(range(index, index + width))
    merged = []
    for index, arg in enumerate(args):
        if index in put:
            merged.extend(put[index])
        if index not in drop:
            merged.append(arg)
    return merged


def _main() -> None:
    try:
        import typer.main
        root = typer.main.get_command(app)
        code = root(args=repeats_resolved(root, sys.argv[1:]), standalone_mode=False)
        sys.stdout.flush()   # what is still buffered fails here, not at the interpreter's exit
    except StdoutFailed as err:
        _stdout_failed(err)
    except InputError as err:
        _fail(str(err))
    except UsageError as err:
        if type(err).__name__ == "NoArgsIsHelpError":  # `provision` alone: the help, exit 0
            sys.stdout.write(err.ctx.get_help() + "\n")
            sys.exit(0)
        command = err.ctx.command_path if err.ctx is not None else "provision"
        message = err.format_message().replace("Value error, ", "").rstrip(".")
        _fail(f"{message}; see '{command} --help'")
    except ClickException as err:
        _fail(err.format_message())
    except (typer.Abort, KeyboardInterrupt):
        _interrupted()
    except Exception as err:
        if _caused_by_interrupt(err):  # e.g. Ctrl-C inside an extension module's import
            _interrupted()
        raise
    if code == 130:  # typer turns a KeyboardInterrupt in a command into exit code 130
        _interrupted()
    sys.exit(code if isinstance(code, int) else 0)


def _caused_by_interrupt(err: BaseException) -> bool:
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


def _interrupted() -> None:
    """Ctrl-C: one line, exit 130; local workers are stopped, and a second Ctrl-C while
    shutting down changes nothing."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    runner = sys.modules.get("provisioner.runner")
    if runner is not None:
        runner.shutdown_workers()
    sys.stderr.write("provision: interrupted\n")
    sys.stderr.flush()
    sys.exit(130)


def _fail(message: str) -> None:
    sys.stderr.write(f"provision: error: {' '.join(message.split())}\n")
    sys.exit(2)


if __name__ == "__main__":
    main()
