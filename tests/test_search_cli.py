"""`provision search` / `provision check` on the real simulator with small workloads: reports,
determinism across runs, jobs and backends, the cache, atomic writes, option validation, the
check's drift detection and the HTML report in a headless browser."""
from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from hardware_catalog import InputError
from provisioner import files
from provisioner.api import merge_options, resolve_study, run_study
from provisioner.check import check_report
from provisioner.evaluate import SimulationEvaluator
from provisioner.options import Execution, SearchOptions, from_keywords
from provisioner.reports import render_reports, write_reports
from provisioner.runner import Runner

HW_DIR = Path(__file__).resolve().parents[1] / "hardware_catalog"
SMALL = {"model": "llama2-70b", "rate": 4.0, "duration": 20.0,
         "designs": "splitwise-ha,baseline-a100", "jobs": 1, "no_cache": True}
SMALL_ARGS = ["--model", "llama2-70b", "--rate", "4", "--duration", "20",
              "--designs", "splitwise-ha,baseline-a100", "--jobs", "1"]


def small_plan(tmp_path, **overrides):
    """The typed options of a small search (Python keywords, checked as the API checks them)."""
    options = {**SMALL, "out": str(tmp_path / "out"), **overrides}
    given = from_keywords(SearchOptions, {k: v for k, v in options.items() if v is not None})
    return merge_options(SearchOptions, given)


def rendered(options):
    run = run_study(resolve_study(options), options.execution)
    return render_reports(run.to_dict(), run.designs), run


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory, run_cli):
    base = tmp_path_factory.mktemp("search")
    run = run_cli("search", *SMALL_ARGS, "--out", str(base / "out"), "--json",
                  env={"XDG_CACHE_HOME": str(base / "cache")})
    assert run.returncode == 0, run.stderr
    return base / "out", run


# ------------------------------------------------------------------------------ report files
def test_report_json_schema_and_contents(report_dir):
    out, run = report_dir
    document = json.loads((out / "report.json").read_text())
    assert json.loads(run.stdout) == document             # --json prints report.json
    assert document["schema_version"] == 5
    inputs = document["inputs"]
    assert inputs["model"]["name"] == "llama2-70b" and inputs["workload"]["name"] == "coding"
    assert inputs["goal"] == {"name": "min-cost", "paper_name": "iso-throughput cost-optimized",
                              "rate_rps": 4.0, "budget": None}
    assert inputs["options"]["seed"] == 0 and inputs["options"]["duration"] == 20.0
    assert set(inputs["catalog"]["machines"]) == {"dgx-h100", "dgx-a100"}
    ha, base = document["designs"]
    assert ha["design"] == "splitwise-ha" and base["design"] == "baseline-a100"
    assert set(ha["optimum"]) >= {"prompt_machines", "token_machines", "rate_rps",
                                  "cost_per_hour", "power_kw", "gpus", "slo"}
    assert "machines" in base["optimum"] and "token_machines" not in base["optimum"]
    slo = ha["optimum"]["slo"]
    assert list(slo) == [f"{m}_{p}" for m in ("ttft", "tbt", "e2e", "itl")
                         for p in ("p50", "p90", "p99")]
    assert slo["ttft_p99"]["limit"] == 6.0 and slo["ttft_p99"]["value"] <= 6.0
    o = ha["optimum"]
    assert o["cost_per_hour"] == pytest.approx(o["prompt_machines"] * 38.0
                                               + o["token_machines"] * 17.6)
    assert {"prompt_machines": o["prompt_machines"], "token_machines": o["token_machines"]} \
        in [{k: p[k] for k in ("prompt_machines", "token_machines")}
            for p in ha["evaluated"] if p["feasible"] and p["rate_rps"] == 4.0]
    rows = list(csv.DictReader(io.StringIO((out / "evaluations.csv").read_text())))
    assert len(rows) == ha["evaluations"] + base["evaluations"]
    assert set(rows[0]) >= {"design", "layout", "prompt_machines", "token_machines", "rate_rps",
                            "feasible", "cost_per_hour", "power_kw", "ttft_p50", "e2e_p99"}
    assert str(Path.home()) not in (out / "report.json").read_text()


def test_reports_are_byte_identical_across_runs_and_job_counts(tmp_path):
    first, _ = rendered(small_plan(tmp_path))
    again, _ = rendered(small_plan(tmp_path))
    two_jobs, _ = rendered(small_plan(tmp_path, jobs=2))
    processes, _ = rendered(small_plan(tmp_path, jobs=2, backend="loky"))
    assert first == again == two_jobs == processes
    assert "<script" in first["report.html"] and "fig-design-space" in first["report.html"]


def test_dask_local_cluster_gives_the_same_report(tmp_path):
    pytest.importorskip("dask.distributed")
    loky, _ = rendered(small_plan(tmp_path, designs="splitwise-ha"))
    dask, _ = rendered(small_plan(tmp_path, designs="splitwise-ha", backend="dask", jobs=2))
    assert loky == dask


def test_cache_hit_on_rerun_and_reuse_when_widened(tmp_path):
    cache = str(tmp_path / "cache")
    narrow = dict(designs="splitwise-ha", no_cache=None, cache_dir=cache)
    _, first = rendered(small_plan(tmp_path, **narrow))
    _, second = rendered(small_plan(tmp_path, **narrow))
    # a cached optimum's verification samples are simulated again before they are reported
    rechecked = len(second.designs[0].optimum.samples)
    assert first.stats.simulated > rechecked > 0
    assert second.stats.simulated == rechecked
    assert second.stats.cache_hits == first.stats.simulated
    assert first.to_dict() == second.to_dict()
    _, wider = rendered(small_plan(tmp_path, **{**narrow, "designs": "splitwise-ha,baseline-a100"}))
    _, alone = rendered(small_plan(tmp_path, designs="baseline-a100", no_cache=True))
    assert wider.stats.cache_hits == first.stats.simulated   # the first design is all reused
    # only the new design is simulated (and the reused optimum's samples again)
    assert wider.stats.simulated == alone.stats.simulated + rechecked


def test_a_failing_writer_leaves_no_partial_report(tmp_path, monkeypatch):
    texts, _ = rendered(small_plan(tmp_path))
    out = tmp_path / "reports"
    write_reports(out, texts)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    calls = []
    real_stage = files.stage_file

    def failing_stage(path, text):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_stage(path, text + "changed")

    monkeypatch.setattr(files, "stage_file", failing_stage)
    with pytest.raises(OSError):
        write_reports(out, texts)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # old files, no temp files


def test_a_failing_renderer_writes_nothing(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from provisioner import figures
    from provisioner.cli import app

    def broken(*args, **kwargs):
        raise RuntimeError("plotly exploded")

    monkeypatch.setattr(figures, "html_report", broken)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["search", *SMALL_ARGS, "--no-cache", "--out", str(out)])
    assert isinstance(result.exception, RuntimeError)
    assert not out.exists() or not any(out.iterdir())


# ----------------------------------------------------------------------------------- goals
def test_max_rate_under_a_power_budget(tmp_path):
    _, run = rendered(small_plan(tmp_path, rate=None, goal="max-rate", power_budget_kw=60.0,
                                 designs="splitwise-hh,baseline-h100"))
    for entry in run.to_dict()["designs"]:
        o = entry["optimum"]
        assert entry["feasible"] and o["power_kw"] <= 60.0 and o["rate_rps"] > 0
        # just above the optimum rate the same cluster fails (within the tolerance)
        above = [p for p in entry["evaluated"] if p["rate_rps"] > o["rate_rps"]
                 and {k: p[k] for k in p if k.endswith("machines")}
                 == {k: o[k] for k in o if k.endswith("machines")}]
        failing = [p["rate_rps"] for p in above if not p["feasible"]]
        # ...or passed the base sample but failed verification on another one
        cell = [o.get("machines", o.get("prompt_machines")), o.get("token_machines", 0)]
        failing += [r["rate_rps"] for r in entry["rejected_candidates"]
                    if r["machines"] == cell and r["rate_rps"] > o["rate_rps"]]
        assert failing and min(failing) <= o["rate_rps"] * 1.02 ** 2


def test_no_feasible_configuration_exits_1(tmp_path, run_cli):
    run = run_cli("search", "--rate", "70", "--duration", "20", "--search-limit", "1",
                  "--designs", "splitwise-aa", "--no-cache", "--out", str(tmp_path / "o"))
    assert run.returncode == 1, run.stderr
    assert "no feasible configuration" in run.stderr
    assert "infeasible even with 1 prompt" in run.stderr
    assert re.search(r"(TTFT|TBT|E2E) P(50|90|99) [0-9.]+ > ", run.stderr), "names the SLOs missed"


# ------------------------------------------------------------------------------ validation
@pytest.mark.parametrize("options, message", [
    ({"rate": 0.0}, "rate= must be a number > 0"),
    ({"rate": -3.0}, "rate= must be a number > 0"),
    ({"rate": float("nan")}, "rate= must be a number > 0"),
    ({"rate": 1e30}, "rate= must be a number > 0 and <= 1e+06"),
    ({"designs": "splitwise-xx"}, "unknown design 'splitwise-xx'"),
    ({"designs": "all,splitwise-hh"}, "cannot be combined"),
    ({"goal": "cheapest"}, "goal= must be one of min-cost, min-power, max-rate"),
    ({"power_budget_kw": 100.0}, "a budget applies to --goal max-rate"),
    ({"goal": "max-rate", "rate": None}, "needs a budget"),
    ({"goal": "max-rate", "budget_like": "dgx-h100:40"}, "searches the rate: drop --rate"),
    ({"goal": "max-rate", "rate": None, "budget_like": "dgx-h100"}, "SKU:N"),
    ({"goal": "max-rate", "rate": None, "budget_like": "dgx-h100:0"}, "SKU:N"),
    ({"goal": "max-rate", "rate": None, "budget_like": "tpu:4"}, "unknown machine SKU 'tpu'"),
    ({"goal": "max-rate", "rate": None, "budget_like": "watts:dgx-h100:4"}, "SKU:N"),
    ({"goal": "max-rate", "rate": None, "power_budget_kw": 50.0, "cost_budget_per_hour": 9.0},
     "give one budget"),
    ({"jobs": 0}, "jobs= must be a whole number >= 1"),
    ({"backend": "spark"}, "backend= must be one of threads, loky, dask, ray"),
    ({"seed": -1}, "seed= must be a whole number >= 0"),
    ({"duration": float("inf")}, "duration= must be a number > 0"),
    ({"power_budget_kw": True}, "power_budget_kw= must be a number > 0"),
    ({"no_such_option": 1}, "unknown option no_such_option="),
    ({"address": "tcp://127.0.0.1:8786"}, "--address needs --backend dask or ray"),
    ({"workload": "no-such-trace.csv"}, "neither a built-in workload"),
    ({"model": "gpt-9"}, "unknown model 'gpt-9'"),
    ({"max_gpus": 0}, "max_gpus= must be a whole number >= 1"),
])
def test_bad_options_raise_one_line_errors(tmp_path, options, message):
    with pytest.raises(InputError, match=re.escape(message)) as err:
        plan = small_plan(tmp_path, **options)
        execution = plan.execution
        Runner(SimulationEvaluator(resolve_study(plan)), execution.jobs or 1, execution.backend,
               execution.address)
    assert "\n" not in str(err.value)


def test_ray_backend_without_ray_says_how_to_install(tmp_path):
    try:
        import ray  # noqa: F401
        pytest.skip("ray is installed")
    except ImportError:
        pass
    with pytest.raises(InputError, match=re.escape("pip install 'ray[default]'")):
        rendered(small_plan(tmp_path, backend="ray", jobs=2))


def test_bad_option_on_the_command_line_exits_2(run_cli):
    run = run_cli("search", "--rate", "-1")
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "--rate must be a number > 0" in run.stderr


def test_no_arguments_mean_the_embedded_default():
    options = SearchOptions()
    study = resolve_study(options)
    assert (study.model.name, study.workload.name, study.goal.name, study.goal.rate_rps,
            study.slo.name, study.duration_s, study.seed) == (
        "bloom-176b", "coding", "min-cost", 70.0, "splitwise", 120.0, 0)
    assert [d.name for d in study.designs] == ["baseline-a100", "baseline-h100", "splitwise-aa",
                                               "splitwise-hh", "splitwise-ha", "splitwise-hhcap",
                                               "sarathi-a100", "sarathi-h100"]
    max_rate = merge_options(SearchOptions, {"goal": "max-rate", "budget_like": "dgx-h100:40"})
    assert resolve_study(max_rate).goal.rate_rps is None


def test_spec_file_with_custom_design_and_command_line_override(tmp_path):
    spec = tmp_path / "study.yaml"
    spec.write_text(yaml.safe_dump({
        "model": "llama2-70b", "rate": 9, "duration": 20, "designs": ["h200-a100"],
        "custom_designs": {"h200-a100": {"prompt_sku": "h200", "token_sku": "dgx-a100"}},
        "max-token": 3}))
    plan = merge_options(SearchOptions, {"rate": 3.0, "no_cache": True, "jobs": 1}, spec)
    study = resolve_study(plan)
    assert [(d.name, d.prompt_sku, d.token_sku) for d in study.designs] == \
        [("h200-a100", "h200", "dgx-a100")]
    assert study.goal.rate_rps == 3.0 and study.constraints.max_token == 3
    _, run = rendered(plan)
    assert run.to_dict()["designs"][0]["optimum"]["token_machines"] <= 3
    spec.write_text("model: llama2-70b\nrates: 5\n")
    with pytest.raises(InputError, match="study.yaml, field 'rates': unknown option"):
        merge_options(SearchOptions, {}, spec)


# ---------------------------------------------------------------------------------- check
def test_check_unchanged_report_exits_0(report_dir, tmp_path, run_cli):
    out, _ = report_dir
    run = run_cli("check", str(out / "report.json"), "--no-cache", "--jobs", "1")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "optimum unchanged for 2 designs" in run.stdout


def test_check_catches_a_changed_catalog_cost(report_dir, tmp_path, run_cli):
    out, _ = report_dir
    catalog = tmp_path / "catalog"
    shutil.copytree(HW_DIR, catalog, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    machines = catalog / "machines.yaml"
    machines.write_text(machines.read_text().replace("cost_per_hour: 38.0",
                                                     "cost_per_hour: 30.0"))
    result = check_report(out / "report.json", Execution(no_cache=True, jobs=1),
                          catalog_dir=str(catalog))
    assert not result.unchanged
    assert "catalog dgx-h100 cost_per_hour: 38.0 -> 30.0" in result.notes
    fields = {(design, field) for design, field, _, _ in result.changes}
    assert ("splitwise-ha", "cost_per_hour") in fields
    run = run_cli("check", str(out / "report.json"), "--catalog", str(catalog), "--no-cache",
                  "--jobs", "1")
    assert run.returncode == 1
    assert re.search(r"moved: splitwise-ha cost_per_hour: [\d.]+ -> [\d.]+", run.stdout)


def test_check_bad_reports_exit_2(report_dir, tmp_path, run_cli):
    out, _ = report_dir
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    future = tmp_path / "future.json"
    document = json.loads((out / "report.json").read_text())
    future.write_text(json.dumps({**document, "schema_version": 99}))
    for path, message in ((tmp_path / "missing.json", "cannot read file"),
                          (broken, "broken JSON"), (future, "schema version 99")):
        run = run_cli("check", str(path))
        assert run.returncode == 2 and message in run.stderr, run.stderr


# -------------------------------------------------------------------------------- browser
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PROBE = """<script>
window.__errors = [];
window.addEventListener('error', e => window.__errors.push(String(e.message)));
const __consoleError = console.error;
console.error = (...args) => { window.__errors.push(args.join(' ')); __consoleError(...args); };
window.addEventListener('load', () => setTimeout(() => {
  document.body.setAttribute('data-errors', JSON.stringify(window.__errors));
  document.body.setAttribute('data-plots',
    String(document.querySelectorAll('.js-plotly-plot .main-svg').length));
}, 500));
</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_report_html_renders_in_headless_chromium(report_dir, tmp_path):
    out, _ = report_dir
    page = tmp_path / "page.html"
    page.write_text((out / "report.html").read_text().replace("<head>", "<head>" + PROBE, 1))
    run = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr",
         "--v=0", "--virtual-time-budget=15000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=180)
    dom = run.stdout
    errors = re.search(r'data-errors="([^"]*)"', dom)
    plots = re.search(r'data-plots="(\d+)"', dom)
    assert errors and plots, run.stderr[-2000:]
    assert json.loads(errors.group(1).replace("&quot;", '"')) == []
    assert int(plots.group(1)) >= 3          # design space, latency vs load, summary
    for div in ("fig-design-space", "fig-latency-load", "fig-summary"):
        assert f'id="{div}"' in dom
    assert "Uncaught" not in run.stderr


def test_a_search_imports_neither_pandas_nor_cp_model(tmp_path, run_python):
    """Selecting an optimum goes through OR-Tools' linear-solver wrapper: importing its
    cp_model module would import pandas, about 0.25 s of every search. Only --requests-csv
    (simulate) and traces need pandas. Nor numpy.ma (numpy's median, percentile and unique
    import it: 12 ms) or the reference simulator, which a search never runs."""
    probe = ("import sys\n"
             "from provisioner.cli import main\n"
             f"sys.argv = ['provision', 'search', *{SMALL_ARGS!r}, '--no-cache', '--json',\n"
             f"            '--out', {str(tmp_path / 'out')!r}]\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in ('pandas', 'ortools.sat.python.cp_model', 'numpy.ma',\n"
             "                         'simcore.refsim', 'ortools.linear_solver.pywraplp')\n"
             "             if m in sys.modules),\n"
             "      file=sys.stderr)\n")
    run = run_python(probe, timeout=300)
    assert run.stderr.strip().splitlines()[-1] == "['ortools.linear_solver.pywraplp']", run.stderr


def test_the_command_line_loads_openblas_with_one_thread(run_python):
    """numpy's OpenBLAS would start a worker thread per extra core that spins ~0.1 CPU s at
    load; a command sets OPENBLAS_NUM_THREADS=1 before numpy loads, unless it is set."""
    probe = ("import os, sys\n"
             "os.environ.pop('OPENBLAS_NUM_THREADS', None)\n"
             "given = sys.argv[1:]\n"
             "if given:\n    os.environ['OPENBLAS_NUM_THREADS'] = given[0]\n"
             "from provisioner.cli import main\n"
             "sys.argv = ['provision', '--version']\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\n"
             "import numpy\n"
             "print(os.environ['OPENBLAS_NUM_THREADS'], len(os.listdir('/proc/self/task')),"
             " file=sys.stderr)\n")
    ours = run_python(probe)
    assert ours.stderr.split() == ["1", "1"], ours.stderr
    theirs = run_python(probe.replace("sys.argv[1:]", "['2']"))
    assert theirs.stderr.split()[0] == "2", theirs.stderr


def test_quiet_keeps_stderr_for_warnings_and_errors(run_cli, tmp_path):
    """Issue 27: `-q` drops the progress; the results still print."""
    args = ["search", "--designs", "baseline-a100", "--rate", "20", "--duration", "20",
            "--verify-seeds", "1", "--no-cache", "--out", tmp_path / "out"]
    loud, quiet = run_cli(*args), run_cli(*args, "-q")
    assert loud.returncode == quiet.returncode == 0
    assert "evaluations" in loud.stderr and quiet.stderr == ""
    assert "Optimum per design" in quiet.stdout


@pytest.mark.parametrize("output", ["csv", "markdown"])
def test_format_prints_one_row_per_design(run_cli, tmp_path, output):
    """Issue 27: CSV and Markdown on stdout, whole numbers, one row per design; Markdown
    paste-ready (issue 40): a title line, few columns with units, formatted numbers."""
    run = run_cli("search", "--designs", "baseline-a100,splitwise-hh", "--rate", "20",
                  "--duration", "20", "--verify-seeds", "1", "--no-cache", "--out",
                  tmp_path / "out", "-q", "--format", output)
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    lines = run.stdout.strip().splitlines()
    body = lines[1:] if output == "csv" else lines[4:]
    assert len(body) == 2
    for entry, line in zip(report["designs"], body):
        assert entry["design"] in line
        assert f"{entry['optimum']['gpus']}" in line
    if output == "markdown":
        assert lines[0].startswith("Optimum per design") and lines[3].startswith("|---|")
        assert "$/h" in lines[2] and "TTFT P99 (ms)" in lines[2] and lines[2].count("|") == 12
        best = report["summary"]["best_design"]
        assert any(f"**{best}**" in line for line in body)
        for entry, line in zip(report["designs"], body):
            assert f"{entry['optimum']['cost_per_hour']:,.2f}" in line
            assert "e-0" not in line and "0000" not in line  # no raw floats


def test_shell_completion_is_on(run_cli):
    """Issue 27: typer's completion (`provision --install-completion`)."""
    run = run_cli("--show-completion", "bash")
    assert run.returncode == 0 and "complete" in run.stdout
    assert "--install-completion" in run_cli("--help").stdout
