"""Generated bad-input suite (issue 10): every option, every file input, every numeric field.

Each case runs the CLI in-process (the `cli` fixture of tests/conftest.py; a few real subprocesses
at the end) and asserts: exit code 2, exactly one line on stderr `provision: error: ...` naming
the input, no traceback, and no output file created or changed. Every case fails before any
simulation, so the several hundred cases run in well under a minute. The tampered reports are
the exception that proves it: the few tamperings `check` tolerates are listed with their exit
code and why, and re-run a tiny search.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from hardware_catalog import InputError
from hardware_catalog.checks import Number, OneOf
from provisioner.options import SearchOptions, SimulateOptions, flag_of, option_fields

REPO = Path(__file__).resolve().parents[1]
HW_DIR = REPO / "hardware_catalog"
SIM = ["simulate", "--design", "splitwise-hh", "--prompt", "2", "--token", "2",
       "--duration", "1", "--rate", "5"]
SEARCH = ["search", "--designs", "splitwise-hh", "--duration", "1", "--rate", "5", "--no-cache"]


def snapshot(root: Path) -> dict:
    """Every file under root with its bytes (to prove nothing was created or changed)."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


@pytest.fixture
def bad(tmp_path, cli, bad_input):
    """bad(args, *names): run `args` (--out under tmp_path, for search) and assert the bad-input
    contract; nothing under tmp_path may be created or changed."""
    def run(args: list, *names, cwd: Path | None = None) -> str:
        before = snapshot(tmp_path)
        outcome = cli([str(a) for a in args], cwd=cwd)
        line = bad_input(outcome, *names)
        assert snapshot(tmp_path) == before, "an output file was created or changed"
        return line
    return run


# ------------------------------------------------------------------------------- options
def _numeric_options(tree: type) -> list[tuple[str, object]]:
    out = []
    for name, f in option_fields(tree).items():
        check = f.metadata.get("check")
        if f.metadata["cli"] and isinstance(check, Number):
            out.append((name, check))
    return out


def _bad_numbers(check: Number) -> list[str]:
    values = ["nan", "inf", "-inf", "abc", "", "1e400", "9" * 40, "-9" * 20]
    if check.low is not None:
        values.append(repr(check.low - 1) if not check.integer else str(int(check.low) - 1))
    if check.high is not None:
        values.append(str(int(check.high) * 10 + 1) if check.integer else f"{check.high * 10:g}")
    if check.integer:
        values += ["2.5", "1e30", "2**70"]
    return values


SEARCH_NUMBERS = [(flag_of(option_fields(SearchOptions)[n]), v)
                  for n, c in _numeric_options(SearchOptions) for v in _bad_numbers(c)]
SIM_NUMBERS = [(flag_of(option_fields(SimulateOptions)[n]), v)
               for n, c in _numeric_options(SimulateOptions) for v in _bad_numbers(c)]


@pytest.mark.parametrize("flag,value", SEARCH_NUMBERS)
def test_search_numeric_option_out_of_range(bad, tmp_path, flag, value):
    bad([*SEARCH, "--out", tmp_path / "out", flag, value], flag)


@pytest.mark.parametrize("flag,value", SIM_NUMBERS)
def test_simulate_numeric_option_out_of_range(bad, tmp_path, flag, value):
    bad([*SIM, "--requests-csv", tmp_path / "r.csv", flag, value], flag)


CLOSED = ["simulate", "--design", "splitwise-hh", "--prompt", "2", "--token", "2"]
CURVE = REPO / "examples" / "load-curves" / "azure-coding-2024-05-13.csv"


@pytest.mark.parametrize("extra,names", [
    (["--concurrency", "4", "--rate", "5"], ("--rate", "--concurrency")),
    (["--concurrency", "4", "--duration", "60"], ("--duration", "--concurrency")),
    (["--concurrency", "4", "--load-curve", CURVE], ("--load-curve", "--concurrency")),
    (["--concurrency", "4", "--mtbf-hours", "100"], ("--concurrency", "failure")),
    (["--think-time", "1"], ("--think-time", "--concurrency")),
    (["--requests", "10", "--rate", "5"], ("--requests", "--concurrency")),
])
def test_closed_loop_options_out_of_place(bad, tmp_path, extra, names):
    """--concurrency is a load of its own: not beside a rate, a window, a curve or failures;
    its options not without it."""
    bad([*CLOSED, "--requests-csv", tmp_path / "r.csv", *extra], *names)


CHOICES = [(flag_of(f), "spark") for n, f in option_fields(SearchOptions).items()
           if f.metadata["cli"] and isinstance(f.metadata["check"], OneOf)]


@pytest.mark.parametrize("flag,value", CHOICES)
def test_search_choice_options(bad, tmp_path, flag, value):
    bad([*SEARCH, "--out", tmp_path / "out", flag, value], flag)


TEXT_CASES = [("--model", "gpt-9", "gpt-9"), ("--workload", "no-such.csv", "no-such.csv"),
              ("--slo", "no-such.yaml", "no-such.yaml"), ("--slo", "fastest", "fastest"),
              ("--perf-model", "no-such.yaml", "no-such.yaml"), ("--catalog", "no-dir", "no-dir"),
              ("--designs", "splitwise-zz", "splitwise-zz"), ("--designs", "tpu/dgx-a100", "tpu"),
              ("--budget-like", "dgx-h100:0", "--budget-like"),
              ("--budget-like", "dgx-h100:1e30", "--budget-like"),
              ("--budget-like", "tpu:4", "tpu"), ("--address", "127.0.0.1:1", "--address"),
              ("--model", "a\x00b", "--model")]


@pytest.mark.parametrize("flag,value,name", TEXT_CASES)
def test_search_text_options(bad, tmp_path, flag, value, name):
    args = [*SEARCH, "--out", tmp_path / "out", flag, value]
    if flag == "--budget-like":
        args = [a for a in args if a not in ("--rate", "5")] + ["--goal", "max-rate"]
    bad(args, name)


@pytest.mark.parametrize("key,value", [
    ("rate", ".nan"), ("rate", ".inf"), ("rate", "-1"), ("rate", "1.0e+400"), ("rate", "'70'"),
    ("duration", "0"), ("duration", ".inf"), ("seed", "-1"), ("seed", "1.5"),
    ("seed", "99999999999999999999999"), ("jobs", "0"), ("jobs", "1.0e+30"),
    ("max_token", "1.0e+30"), ("max_gpus", "true"), ("search_limit", "0"),
    ("rate_tolerance", "1"), ("power_budget_kw", ".inf"), ("power_budget_kw", "1.0e+308"),
    ("cost_budget_per_hour", ".inf"), ("goal", "fast"), ("backend", "spark"),
    ("designs", "[]"), ("model", "[1, 2]"), ("no_cache", "'yes'"), ("exhaustive", "3"),
    ("custom_designs", "[1]"), ("custom_designs", "{splitwise-hh: {prompt_sku: dgx-a100}}"),
    ("custom_designs", "{mine: {prompt_sku: tpu}}"), ("unknown_key", "1"),
])
def test_spec_file_values(bad, tmp_path, key, value):
    spec = tmp_path / "spec.yaml"
    spec.write_text("designs: splitwise-hh\nduration: 1\nno_cache: true\n"
                    if key not in ("designs", "duration", "no_cache") else "")
    spec.write_text(spec.read_text() + f"{key}: {value}\n")
    line = bad(["search", "--spec", spec, "--out", tmp_path / "out"])
    assert "spec.yaml" in line or key in line, line  # the file, or the key as it is spelled


# ---------------------------------------------------------------------------- file inputs
def _bad_files(tmp_path: Path, suffix: str) -> dict[str, Path]:
    """Files that are not what they claim, each named by kind."""
    files = {}

    def put(kind, data: bytes):
        path = tmp_path / f"{kind}{suffix}"
        path.write_bytes(data)
        files[kind] = path

    put("empty", b"")
    put("blank", b"  \n\n \t\n")
    put("binary", bytes(range(256)) * 4)
    put("utf16", "kind: slowdown\n".encode("utf-16"))
    put("latin1", "caf\xe9: 1\n".encode("latin-1"))
    put("nul", b"a: 1\x00\n")
    if suffix in (".yaml", ".json"):
        put("deep", (b"[" * 5000 + b"]" * 5000) if suffix == ".json" else
            b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n")
        put("broken", b"{not: [valid" if suffix == ".yaml" else b"{not json")
    if suffix == ".yaml":
        put("duplicate", b"kind: slowdown\nkind: absolute_ms\nlimits: {ttft: {p50: 2}}\n")
        put("bomb", b"a: &a [1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
                    b"c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
                    b"e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
                    b"g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n")
    if suffix == ".json":
        put("nan", b'{"a": NaN}')
    directory = tmp_path / f"folder{suffix}"
    directory.mkdir()
    files["directory"] = directory
    fifo = tmp_path / f"fifo{suffix}"   # opening it would wait for a writer: refused by its kind
    os.mkfifo(fifo)
    files["fifo"] = fifo
    files["missing"] = tmp_path / f"missing{suffix}"
    files["proc"] = Path("/proc/self/status")
    return files


FILE_KINDS_YAML = ["empty", "blank", "binary", "utf16", "latin1", "nul", "deep", "broken",
                   "duplicate", "bomb", "directory", "fifo", "missing", "proc"]
FILE_KINDS_JSON = ["empty", "blank", "binary", "utf16", "latin1", "nul", "deep", "broken", "nan",
                   "directory", "fifo", "missing", "proc"]
FILE_KINDS_CSV = ["empty", "blank", "binary", "utf16", "latin1", "nul", "directory", "fifo",
                  "missing", "proc"]


def _run_file_case(bad, tmp_path, kind, suffix, build):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    path = _bad_files(inputs, suffix)[kind]
    args = build(path, tmp_path)
    name = path.name if kind != "proc" else "/proc/self/status"
    bad(args, name)


@pytest.mark.parametrize("kind", FILE_KINDS_YAML)
def test_spec_file_kinds(bad, tmp_path, kind):
    _run_file_case(bad, tmp_path, kind, ".yaml",
                   lambda p, t: ["search", "--spec", p, "--out", t / "out"])


# Not "missing" (a name that is no file is an unknown profile name: TEXT_CASES) nor "proc"
# (/proc/self/status has no .yaml name, so it is a profile name too).
@pytest.mark.parametrize("kind", [k for k in FILE_KINDS_YAML if k not in ("missing", "proc")])
def test_slo_profile_file_kinds(bad, tmp_path, kind):
    _run_file_case(bad, tmp_path, kind, ".yaml", lambda p, t: [*SIM, "--slo", p])


@pytest.mark.parametrize("kind", FILE_KINDS_YAML)
def test_perf_model_yaml_kinds(bad, tmp_path, kind):
    _run_file_case(bad, tmp_path, kind, ".yaml", lambda p, t: [*SIM, "--perf-model", p])


@pytest.mark.parametrize("kind", FILE_KINDS_JSON)
def test_perf_model_json_kinds(bad, tmp_path, kind):
    _run_file_case(bad, tmp_path, kind, ".json", lambda p, t: [*SIM, "--perf-model", p])


@pytest.mark.parametrize("kind", FILE_KINDS_CSV)
def test_perf_model_csv_kinds(bad, tmp_path, kind):
    _run_file_case(bad, tmp_path, kind, ".csv", lambda p, t: [*SIM, "--perf-model", p])


@pytest.mark.parametrize("kind", FILE_KINDS_CSV)
def test_trace_kinds(bad, tmp_path, kind):
    _run_file_case(bad, tmp_path, kind, ".csv", lambda p, t: [*SIM, "--workload", p])


@pytest.mark.parametrize("kind", FILE_KINDS_CSV)
def test_search_trace_kinds(bad, tmp_path, kind):
    _run_file_case(bad, tmp_path, kind, ".csv",
                   lambda p, t: [*SEARCH, "--workload", p, "--out", t / "out"])


@pytest.mark.parametrize("kind", FILE_KINDS_CSV)
def test_calibrate_profile_kinds(bad, tmp_path, kind):
    _run_file_case(bad, tmp_path, kind, ".csv",
                   lambda p, t: ["calibrate", p, "--out", t / "coefficients.json"])


@pytest.mark.parametrize("kind", FILE_KINDS_JSON)
def test_check_report_kinds(bad, tmp_path, kind):
    _run_file_case(bad, tmp_path, kind, ".json", lambda p, t: ["check", p, "--no-cache"])


CURVE_SIM = ["simulate", "--design", "splitwise-hh", "--prompt", "2", "--token", "2",
             "--curve-window", "600"]


def _good_curve(tmp_path: Path) -> Path:
    path = tmp_path / "good-curve.csv"
    path.write_text("time_s,rate_rps\n0,2\n600,3\n")
    return path


@pytest.mark.parametrize("kind", FILE_KINDS_CSV)
def test_load_curve_kinds(bad, tmp_path, kind):
    _run_file_case(bad, tmp_path, kind, ".csv", lambda p, t: [*CURVE_SIM, "--load-curve", p])


@pytest.mark.parametrize("kind", FILE_KINDS_CSV)
def test_search_load_curve_kinds(bad, tmp_path, kind):
    _run_file_case(bad, tmp_path, kind, ".csv",
                   lambda p, t: ["search", "--designs", "splitwise-hh", "--no-cache",
                                 "--load-curve", p, "--out", t / "out"])


@pytest.mark.parametrize("kind", FILE_KINDS_CSV)
def test_plan_kinds(bad, tmp_path, kind):
    _run_file_case(bad, tmp_path, kind, ".csv",
                   lambda p, t: [*CURVE_SIM, "--load-curve", _good_curve(t), "--plan", p])


@pytest.mark.parametrize("kind", FILE_KINDS_CSV)
def test_failure_schedule_kinds(bad, tmp_path, kind):
    _run_file_case(bad, tmp_path, kind, ".csv", lambda p, t: [*SIM, "--failures", p])


@pytest.mark.parametrize("kind", FILE_KINDS_JSON)
def test_model_config_kinds(bad, tmp_path, kind):
    _run_file_case(bad, tmp_path, kind, ".json", lambda p, t: [*SIM, "--model-config", p])


# --------------------------------------------------------- CSV kinds, from their schemas
# Every CSV file kind is declared once (hardware_catalog.csvschema.SCHEMAS); its bad inputs are
# generated from that declaration: a missing, doubled or unknown column, no header, and each
# column's cells out of type or bounds. A kind added to SCHEMAS without a way in here fails
# test_every_csv_kind_has_a_way_in.
def _csv_route(kind: str, path: Path, tmp_path: Path) -> list:
    routes = {
        "trace": lambda: [*SIM, "--workload", path],
        "load_curve": lambda: [*CURVE_SIM, "--load-curve", path],
        "plan": lambda: [*CURVE_SIM, "--load-curve", _good_curve(tmp_path), "--plan", path],
        "failure_schedule": lambda: [*SIM, "--failures", path],
        "calibration_profile": lambda: ["calibrate", path, "--out", tmp_path / "c.json"],
        "perf_table": lambda: [*SIM, "--perf-model", path],
    }
    return routes[kind]()


def _layouts():
    from hardware_catalog.csvschema import SCHEMAS, CsvSchema
    for kind, layouts in SCHEMAS.items():
        for schema in ((layouts,) if isinstance(layouts, CsvSchema) else layouts):
            yield kind, schema


def _split(example: str) -> tuple[list[str], list[list[str]]]:
    header, *rows = example.strip().splitlines()
    return header.split(","), [row.split(",") for row in rows]


def _text(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(",".join(cells) for cells in [header, *rows]) + "\n"


def _bad_cells(cell) -> list[str]:
    from hardware_catalog.csvschema import Label, Num, Stamp, Word
    if isinstance(cell, Stamp):
        return ["yesterday", "x"] + (_bad_cells(cell.seconds) if cell.seconds else [])
    if isinstance(cell, Word):
        return ["bogus", ""]
    if isinstance(cell, Label):
        return [] if cell.blank else [""]
    assert isinstance(cell, Num), cell
    values = ["x", "nan", "-inf", "1e400", "2**70"]
    if not any(word == "" for word, _ in cell.words):
        values.append("")
    if not any(word == "inf" for word, _ in cell.words):
        values.append("inf")
    if cell.low is not None:
        values.append(f"{cell.low - 1:g}" if not cell.low_open else f"{cell.low:g}")
    if cell.high is not None:
        values.append(f"{cell.high * 10 + 10:.0f}")
    if cell.integer:
        values.append("2.5")
    return values


def _schema_cases():
    cases = []
    for kind, schema in _layouts():
        header, rows = _split(schema.example)
        label = f"{kind}:{schema.layout or kind}"
        for i, name in enumerate(header):
            if name not in schema.required:
                continue
            cases.append((kind, f"{label}:missing-{name}",
                          _text(header[:i] + header[i + 1:], [r[:i] + r[i + 1:] for r in rows]),
                          [name]))
        cases.append((kind, f"{label}:doubled", _text(header + [header[0]],
                                                      [r + [r[0]] for r in rows]),
                      [header[0], "twice"]))
        if not schema.extra:
            cases.append((kind, f"{label}:unknown", _text(header + ["bogus"],
                                                          [r + ["1"] for r in rows]),
                          ["bogus"]))
        cases.append((kind, f"{label}:no-header", _text(rows[0], rows[1:] or [rows[0]]), []))
        cases.append((kind, f"{label}:no-rows", _text(header, []), ["no"]))
        for column in schema.columns:
            if column.name not in header:
                continue
            index = header.index(column.name)
            for value in _bad_cells(column.cell):
                bad_rows = [r[:index] + [value] + r[index + 1:] if k == 0 else r
                            for k, r in enumerate(rows)]
                cases.append((kind, f"{label}:{column.name}={value!r}",
                              _text(header, bad_rows), ["row 2", column.name]))
    return cases


SCHEMA_CASES = _schema_cases()


@pytest.mark.parametrize("kind,case,text,words", SCHEMA_CASES, ids=[c[1] for c in SCHEMA_CASES])
def test_csv_kind_from_its_schema(bad, tmp_path, kind, case, text, words):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    path = inputs / f"{kind}.csv"
    path.write_text(text)
    bad(_csv_route(kind, path, tmp_path), path.name, *words)


@pytest.mark.parametrize("kind,schema", list(_layouts()),
                         ids=[f"{k}:{s.layout or k}" for k, s in _layouts()])
def test_csv_kind_examples_are_valid(tmp_path, kind, schema):
    """Each schema's example reads (the generated cases above break one thing of a valid file)."""
    from hardware_catalog.csvschema import read_table
    path = tmp_path / "example.csv"
    path.write_text(schema.example)
    table = read_table(schema, path)
    assert len(table) == len(_split(schema.example)[1])
    assert set(table.values) == {c.name for c in schema.columns if c.name in schema.example}


def test_every_csv_kind_has_a_way_in(tmp_path):
    from hardware_catalog.csvschema import SCHEMAS
    for kind in SCHEMAS:
        assert _csv_route(kind, tmp_path / "x.csv", tmp_path)


@pytest.mark.parametrize("which", ["machines", "models", "designs"])
@pytest.mark.parametrize("kind", [k for k in FILE_KINDS_YAML
                                  if k not in ("proc", "missing")])  # fixed names; an overlay
def test_catalog_file_kinds(bad, tmp_path, which, kind):                # may leave files out
    catalog = tmp_path / "catalog"
    shutil.copytree(HW_DIR, catalog, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    target = catalog / f"{which}.yaml"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    made = _bad_files(scratch, ".yaml")[kind]
    target.unlink()
    if kind == "directory":
        target.mkdir()
    elif kind == "fifo":   # (reading one to copy it would wait for a writer)
        os.mkfifo(target)
    elif kind != "missing":
        target.write_bytes(made.read_bytes())
    bad(["catalog", "--catalog", catalog], f"{which}.yaml")


# ---------------------------------------------------------------------- numeric fields
MACHINE_FIELDS = ["gpus", "hbm_gib", "hbm_gb", "hbm_bandwidth_gbs", "fp16_tflops", "gpu_power_w",
                  "cost_per_hour", "kv_link_gbps", "kv_layerwise_visible_ms", "power_cap",
                  "prompt_slowdown"]
MODEL_FIELDS = ["layers", "hidden", "heads", "kv_heads", "params_b", "bytes_per_value",
                "tensor_parallel"]
BAD_YAML_NUMBERS = [".inf", "-.inf", ".nan", "-1", "1.0e+300", "'12'", "true", "[1]",
                    "99999999999999999999999"]


def _first_record(which: str) -> dict:
    data = yaml.safe_load((HW_DIR / f"{which}.yaml").read_text())
    return data[next(iter(data))]


# HBM is given in one unit, hbm_gib or hbm_gb: only the one the first machine uses is damaged
# (setting the other as well is a different error: both units at once).
MACHINE_CASES = [f for f in MACHINE_FIELDS
                 if f not in ("hbm_gb", "hbm_gib") or f in _first_record("machines")]


def _catalog_with(tmp_path: Path, which: str, field: str, value: str) -> Path:
    catalog = tmp_path / "catalog"
    shutil.copytree(HW_DIR, catalog, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    path = catalog / f"{which}.yaml"
    data = yaml.safe_load(path.read_text())
    first = next(iter(data))
    data[first][field] = yaml.safe_load(value)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return catalog


@pytest.mark.parametrize("field", MACHINE_CASES)
@pytest.mark.parametrize("value", BAD_YAML_NUMBERS)
def test_catalog_machine_numbers(bad, tmp_path, field, value):
    catalog = _catalog_with(tmp_path, "machines", field, value)
    bad(["catalog", "--catalog", catalog], "machines.yaml", field)


@pytest.mark.parametrize("field", MODEL_FIELDS)
@pytest.mark.parametrize("value", BAD_YAML_NUMBERS)
def test_catalog_model_numbers(bad, tmp_path, field, value):
    catalog = _catalog_with(tmp_path, "models", field, value)
    bad(["catalog", "--catalog", catalog], "models.yaml")


@pytest.mark.parametrize("value", BAD_YAML_NUMBERS + ["0", "1.0e+8"])
def test_slo_profile_limits(bad, tmp_path, value):
    profile = tmp_path / "slo.yaml"
    profile.write_text(f"kind: absolute_ms\nlimits: {{ttft: {{p99: {value}}}}}\n")
    bad([*SIM, "--slo", profile], "slo.yaml", "limits.ttft.p99")


TABLE = {"tables": [{"machine": "dgx-h100", "prefill": {"tokens": [128, 2048], "ms": [50, 300]},
                     "decode": {"batch": [1, 64], "ms": [40, 80]}}]}


@pytest.mark.parametrize("where", ["prefill.tokens", "prefill.ms", "decode.batch", "decode.ms",
                                   "context_ms_per_token"])
@pytest.mark.parametrize("value", [math.inf, -1.0, 1e300, "x", True])
def test_perf_table_numbers(bad, tmp_path, where, value):
    table = json.loads(json.dumps(TABLE))
    entry = table["tables"][0]
    if where == "context_ms_per_token":
        entry[where] = value
    else:
        phase, key = where.split(".")
        entry[phase][key][1] = value
    path = tmp_path / "table.yaml"
    path.write_text(yaml.safe_dump(table))
    bad([*SIM, "--perf-model", path], "table.yaml")


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e300", "x", ""])
@pytest.mark.parametrize("column", ["x", "ms"])
def test_perf_table_csv_numbers(bad, tmp_path, column, value):
    rows = {"x": "2048", "ms": "300"}
    rows[column] = value
    path = tmp_path / "table.csv"
    path.write_text("machine,model,phase,x,ms\ndgx-h100,,prefill,128,50\n"
                    f"dgx-h100,,prefill,{rows['x']},{rows['ms']}\n"
                    "dgx-h100,,decode,1,40\ndgx-h100,,decode,64,80\n")
    bad([*SIM, "--perf-model", path], "table.csv")


@pytest.mark.parametrize("value", [".inf", ".nan", "-1", "1.0e+300", "'x'", "1.0e+19"])
def test_coefficient_numbers(bad, tmp_path, value):
    document = json.loads((REPO / "simcore" / "data" / "perf_coefficients.json").read_text())
    group = document["groups"][0]
    key = next(iter(group["prompt"]))
    group["prompt"][key] = yaml.safe_load(value)
    path = tmp_path / "coefficients.yaml"
    path.write_text(yaml.safe_dump(document))
    bad([*SIM, "--perf-model", path], "coefficients.yaml")


PLAIN = "arrival_s,prompt_tokens,output_tokens\n"


@pytest.mark.parametrize("column,value", [
    ("prompt_tokens", "1e30"), ("prompt_tokens", "9223372036854775808"),
    ("prompt_tokens", "100000000"), ("prompt_tokens", "2.5"), ("prompt_tokens", "0"),
    ("prompt_tokens", "-3"), ("prompt_tokens", "inf"), ("prompt_tokens", "nan"),
    ("prompt_tokens", "x"), ("output_tokens", "1e30"), ("output_tokens", "0"),
    ("output_tokens", "2**63"), ("arrival_s", "-1"), ("arrival_s", "1e300"),
    ("arrival_s", "inf"), ("arrival_s", "nan"), ("arrival_s", ""),
])
def test_trace_numbers(bad, tmp_path, column, value):
    row = {"arrival_s": "0.5", "prompt_tokens": "100", "output_tokens": "10"}
    row[column] = value
    path = tmp_path / "trace.csv"
    path.write_text(PLAIN + "0,10,5\n" + ",".join(row.values()) + "\n")
    line = bad([*SIM, "--workload", path], "trace.csv", "row 3")
    assert column in line


@pytest.mark.parametrize("stamp", ["9999-12-31 23:59:59", "1677-01-01 00:00:00", "x",
                                   "2262-04-12 00:00:00"])
def test_azure_timestamps(bad, tmp_path, stamp):
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,10,5\n"
                    f"{stamp},10,5\n")
    bad([*SIM, "--workload", path], "azure.csv", "TIMESTAMP")


@pytest.mark.parametrize("text,fragment", [
    ("model,hardware\n", "missing column"),
    ("model,hardware,tensor_parallel,prompt_size,batch_size,token_size,prompt_time,token_time\n"
     "llama2-70b,a100,8,128,1,10,50,40\n", "distinct rows"),
    ("model,hardware,tensor_parallel,prompt_size,batch_size,token_size,prompt_time,token_time\n"
     "llama2-70b,a100,8,128,1,10,inf,40\n", "prompt_time"),
    ("model,hardware,tensor_parallel,prompt_size,batch_size,token_size,prompt_time,token_time\n"
     "llama2-70b,a100,8,1e30,1,10,5,40\n", "prompt_size"),
    ("model,hardware,tensor_parallel,prompt_size,batch_size,token_size,prompt_time,token_time\n"
     "llama2-70b,a100,9999,128,1,10,5,40\n", "tensor_parallel"),
])
def test_calibrate_profile_values(bad, tmp_path, text, fragment):
    path = tmp_path / "profile.csv"
    path.write_text(text)
    bad(["calibrate", path, "--out", tmp_path / "c.json"], "profile.csv", fragment)


@pytest.mark.parametrize("args", [["--seed", "-1"], ["--seed", str(2**70)], ["--tp", "0"],
                                  ["--tp", "1e30"]])
def test_calibrate_options(bad, tmp_path, args):
    path = tmp_path / "profile.csv"
    path.write_text("model\n")
    bad(["calibrate", path, *args], args[0])


# ----------------------------------------------------------------------------- outputs
def test_out_is_a_file(bad, tmp_path):
    target = tmp_path / "taken"
    target.write_text("mine")
    bad([*SEARCH, "--out", target], "taken")


def test_report_json_is_a_directory(bad, tmp_path):
    (tmp_path / "out" / "report.json").mkdir(parents=True)
    bad([*SEARCH, "--out", tmp_path / "out"], "report.json")


def test_out_not_writable(bad, tmp_path):
    bad([*SEARCH, "--out", "/proc/1/provision-out"], "/proc/1")


def test_requests_csv_is_a_directory(bad, tmp_path):
    (tmp_path / "r.csv").mkdir()
    bad([*SIM, "--requests-csv", tmp_path / "r.csv"], "r.csv")


def test_requests_csv_not_writable(bad, tmp_path):
    bad([*SIM, "--requests-csv", "/proc/1/r.csv"], "/proc/1")


def test_calibrate_out_is_a_directory(bad, tmp_path):
    (tmp_path / "c.json").mkdir()
    profile = tmp_path / "p.csv"
    profile.write_text("model\n")
    bad(["calibrate", profile, "--out", tmp_path / "c.json"], "c.json")


# ------------------------------------------------------------------------ options too late
def test_unreachable_dask_address_fails_fast(bad, tmp_path):
    import socket
    import time
    with socket.socket() as probe:  # a free loopback port: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start = time.monotonic()
    bad([*SEARCH, "--out", tmp_path / "out", "--backend", "dask", "--address",
                   f"tcp://127.0.0.1:{port}"], f"127.0.0.1:{port}")
    assert time.monotonic() - start < 5


def test_run_out_of_reach_is_refused_up_front(bad, tmp_path):
    base = [a for a in SEARCH if a not in ("--duration", "1", "--rate", "5")]
    line = bad([*base, "--out", tmp_path / "out", "--rate", "1000000",
                "--duration", "600000"], "5000000")
    assert "lower the rate or the duration" in line


# ------------------------------------------------------------------- data of another meaning
def test_custom_design_may_not_redefine_a_catalog_design(bad, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("designs: splitwise-hh\ncustom_designs:\n  splitwise-hh:\n"
                    "    prompt_sku: dgx-a100\n    token_sku: dgx-a100\n")
    bad(["search", "--spec", spec, "--out", tmp_path / "out"], "splitwise-hh")


# --------------------------------------------------------------------------- tampered reports
# Every case edits one key of a pristine report and runs `provision check` on it. The pristine
# report comes from a tiny search (one design, a 1 s window, one verification seed), made once per
# module: a tampering `check` tolerates re-runs that search, which takes a fraction of a second.
# A tampering `check` must refuse is refused before any simulation (the case replaces the search
# with a failure). `check` reads the question from `inputs.options` only (through the command
# line's checks); the rest of `inputs` records what the names resolved to, and a change there is
# a note, never an error.
PRISTINE_SEARCH = ["search", "--designs", "splitwise-hh", "--duration", "1", "--rate", "5",
                   "--verify-seeds", "1", "--no-cache", "--jobs", "1"]
OPTIMUM_KEYS = ("prompt_machines", "token_machines", "rate_rps", "cost_per_hour", "power_kw",
                "gpus", "worst_margin", "slo", "headroom_rps", "binding_slo", "binding_margin",
                "verification")
COMPARED_KEYS = OPTIMUM_KEYS[:6]  # the answers `check` compares (provisioner.check.COMPARED)
NOT_COMPARED = OPTIMUM_KEYS[6:]   # the evidence behind an answer: re-derived and diffed too
RESOLVED_KEYS = ("model", "workload", "slo_profile", "perf_model", "goal", "designs", "catalog",
                 "sim_options", "kv_capacity_tokens")


def _echoed_options() -> list[str]:
    from provisioner.question import echoed_options
    return list(echoed_options())


def _tamper_paths() -> list[tuple]:
    paths = [("schema",), ("schema_version",), ("inputs",), ("designs",), ("summary",),
             ("summary", "best_design"), ("designs", 0), ("designs", 0, "design"),
             ("designs", 0, "feasible"), ("designs", 0, "optimum"), ("inputs", "options")]
    paths += [("inputs", "options", key) for key in _echoed_options()]
    paths += [("inputs", key) for key in RESOLVED_KEYS]
    paths += [("designs", 0, "optimum", key) for key in OPTIMUM_KEYS]
    return paths


def _dotted(path: tuple) -> str:
    return "".join(f"[{k}]" if isinstance(k, int) else (f".{k}" if i else k)
                   for i, k in enumerate(path))


_DELETE = object()
VALUES = {"del": _DELETE, "x": "x", "[1]": [1], "-1e+300": -1e300}

# The tamperings `check` accepts, each with its exit code, a fragment of its output and why it is
# not bad input. Every other case must be refused: exit 2 naming the report and the key.
CHANGED = (1, "optimum moved")      # an answer differs: the diff shows it, exit 1
UNCHANGED = (0, "optimum unchanged for 1 design")
NOTED = (0, "input changed:")       # what a name resolved to differs from now: a note
DIFFERS = (1, "report differs from its re-derivation")   # a value behind the answer differs
TOLERATED = {
    # answers: check compares them with the re-run and reports the difference
    ("summary.best_design", "del"): (1, "best design changed"),
    ("summary.best_design", "x"): (1, "best design changed"),
    ("designs[0]", "del"): CHANGED,            # the design's answer is gone: absent -> present
    ("designs[0].design", "x"): CHANGED,       # an answer for a design 'x' the re-run has not
    **{(f"designs[0].optimum.{key}", label): CHANGED
       for key in COMPARED_KEYS for label in ("del", "-1e+300")},  # a finite number, or none
    # the evidence behind an optimum: `check` re-derives every section and diffs it too
    **{(f"designs[0].optimum.{key}", label): DIFFERS
       for key in NOT_COMPARED for label in VALUES},
    # what the names resolved to: never read back, only compared with what they resolve to now
    **{(f"inputs.{key}", "del"): UNCHANGED for key in RESOLVED_KEYS},
    **{(f"inputs.{key}", label): NOTED for key in RESOLVED_KEYS
       for label in ("x", "[1]", "-1e+300")},
    # a valid load sweep (one extra rate, at the optimum's): the answer holds, but the report's
    # evaluated points are not the ones this sweep simulates
    ("inputs.options.load_sweep", "[1]"): DIFFERS,
}
# Refusals that name the option the echoed value is checked as, or the value, not the key.
NAMED = {
    ("designs", "[1]"): "designs[0]",
    ("inputs.options.model", "x"): "unknown model 'x'",
    ("inputs.options.designs", "x"): "unknown design 'x'",
}
TAMPERED = [pytest.param(path, label, id=f"{_dotted(path)}-{label}")
            for path in _tamper_paths() for label in VALUES]
@pytest.fixture(scope="module")
def pristine_report(tmp_path_factory, cli) -> dict:
    out = tmp_path_factory.mktemp("pristine") / "out"
    outcome = cli([*PRISTINE_SEARCH, "--out", out])
    assert outcome.code == 0, outcome.stderr
    document = json.loads((out / "report.json").read_text())
    assert document["designs"][0]["optimum"] is not None, "the tiny search found no optimum"
    return document


def _apply(document, path, value):
    target = document
    for key in path[:-1]:
        target = target[key]
    assert (path[-1] in target) if isinstance(target, dict) else path[-1] < len(target), \
        f"the pristine report has no {_dotted(path)}: update the tampered cases"
    if value is _DELETE:
        target.pop(path[-1])
    else:
        target[path[-1]] = value


def _no_simulation(*args, **kwargs):
    raise AssertionError("check simulated a report it must refuse")


def test_tolerated_cases_exist():
    """Each tolerated tampering is one of the generated cases (no stale entries)."""
    generated = {(_dotted(p.values[0]), p.values[1]) for p in TAMPERED}
    assert set(TOLERATED) <= generated and set(NAMED) <= generated
    assert not set(TOLERATED) & set(NAMED)


@pytest.mark.parametrize("path,label", TAMPERED)
def test_tampered_report(tmp_path, monkeypatch, cli, bad_input, pristine_report, path, label):
    document = json.loads(json.dumps(pristine_report))
    _apply(document, path, VALUES[label])
    report = tmp_path / "report.json"
    report.write_text(json.dumps(document))
    before = snapshot(tmp_path)
    expected = TOLERATED.get((_dotted(path), label))
    if expected is None:
        monkeypatch.setattr("provisioner.check.run_study", _no_simulation)
    outcome = cli(["check", report, "--no-cache", "--jobs", "1"])
    if expected is None:
        bad_input(outcome, "report.json", NAMED.get((_dotted(path), label), _dotted(path)))
    else:
        code, fragment = expected
        assert (outcome.code, outcome.stderr) == (code, ""), outcome.stderr
        assert fragment in outcome.stdout, outcome.stdout
    assert snapshot(tmp_path) == before


# ------------------------------------------------------------- property: extreme trace values
EXTREME = st.one_of(st.integers(-2**80, 2**80), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from(["1e30", "2**63", "", "x", "1.5", "9" * 25, "-0", "+7"]))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(arrival=EXTREME, prompt=EXTREME, output=EXTREME)
def test_trace_loader_property(tmp_path_factory, arrival, prompt, output):
    """A trace either loads with exactly the sizes given or is refused (InputError)."""
    from simcore.workload import MAX_REQUEST_TOKENS, load_trace
    path = tmp_path_factory.mktemp("trace") / "t.csv"
    path.write_text(PLAIN + f"{arrival},{prompt},{output}\n")
    try:
        workload = load_trace(path)
    except InputError as err:
        assert "\n" not in str(err) and "t.csv" in str(err)
        return
    for text, got in ((prompt, workload.prompt_tokens[0]), (output, workload.output_tokens[0])):
        value = float(text)
        assert value == int(got) and 1 <= got <= MAX_REQUEST_TOKENS
    assert math.isfinite(float(arrival)) and workload.arrival_s[0] == float(arrival)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(prompt=st.one_of(st.integers(-5, 3000), st.integers(2**62, 2**80),
                        st.sampled_from(["1e30", "nan", "2.0"])),
       output=st.integers(-2, 500))
def test_simulate_property(tmp_path_factory, cli, bad_input, prompt, output):
    """From the CLI: exit 2, or a run whose every request was simulated once, with the sizes and
    arrival given, and latencies that add up (0 < TTFT <= E2E, TBT >= 0 and only with a second
    token)."""
    tmp = tmp_path_factory.mktemp("sim")
    trace = tmp / "t.csv"
    trace.write_text(PLAIN + f"0,{prompt},{output}\n0.5,10,3\n")
    requests = tmp / "requests.csv"
    outcome = cli([*SIM[:-2], "--workload", trace, "--requests-csv", requests, "--json"])
    if outcome.code == 2:
        bad_input(outcome, "t.csv")
        assert not requests.exists()
        return
    assert outcome.code in (0, 1), outcome.stderr
    summary = json.loads(outcome.stdout)
    assert summary["requests"] == 2
    import pandas as pd
    frame = pd.read_csv(requests).sort_values("arrival_s")
    assert sorted(frame["request"]) == [0, 1]  # each request once
    assert frame["arrival_s"].tolist() == [0.0, 0.5]
    assert frame["prompt_tokens"].tolist() == [float(prompt), 10]
    assert frame["output_tokens"].tolist() == [output, 3]
    assert (frame["ttft_s"] > 0).all() and (frame["ttft_s"] <= frame["e2e_s"] + 1e-12).all()
    single = frame["output_tokens"] == 1
    assert frame["tbt_s"][single].isna().all()
    assert (frame["tbt_s"][~single] >= 0).all()


# ------------------------------------------------------------------- a few real subprocesses
@pytest.mark.parametrize("args,name", [
    (["simulate", "--design", "splitwise-hh", "--prompt", "2**70", "--token", "2"], "--prompt"),
    (["search", "--rate", "nan"], "--rate"),
    (["check", "/proc/self/status"], "/proc/self/status"),
    (["calibrate", "/nonexistent/profile.csv"], "profile.csv"),
])
def test_real_process(tmp_path, run_cli, bad_input, args, name):
    outcome = run_cli(*args, cwd=tmp_path)
    bad_input(outcome, name)
    assert list(tmp_path.iterdir()) == []
