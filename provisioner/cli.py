"""The `provision` command line: a thin shell over library functions.

Every command validates its input through the data layer; an InputError becomes one line on
stderr and exit code 2, an infeasible result or a drifted check exit code 1.
"""
from __future__ import annotations

import json
import sys
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


def main() -> None:
    """Entry point: turns bad input anywhere into one line on stderr and exit code 2."""
    try:
        app()  # standalone: typer/click report usage errors themselves with exit code 2
    except InputError as err:
        err_console.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
