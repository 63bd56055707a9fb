"""The Python API (`provisioner.search`, `provisioner.simulate`), used from outside the checkout,
and the command-line conventions that fall out of the one option declaration."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

import provisioner
from hardware_catalog import Design, InputError, load_catalog
from provisioner.check import check_report
from provisioner.options import (Execution, SearchOptions, SimulateOptions, command_parameters,
                                 option_fields, read_spec)

HW_DIR = Path(__file__).resolve().parents[1] / "hardware_catalog"
SMALL = dict(model="llama2-70b", rate=4.0, duration=20.0, jobs=1)


def test_search_from_outside_the_checkout_writes_nothing_unless_asked(tmp_path, run_python):
    run = run_python("""
        import json, os, provisioner
        result = provisioner.search(designs="splitwise-ha", model="llama2-70b", rate=4,
                                    duration=20, jobs=1)
        (design,) = result.designs
        assert design.design.name == "splitwise-ha" and design.optimum is not None
        assert os.listdir(".") == [], os.listdir(".")      # nothing written
        paths = result.write("out")
        assert sorted(p.name for p in paths) == ["evaluations.csv", "report.html", "report.json"]
        assert json.load(open("out/report.json")) == result.to_dict()
        print(json.dumps([design.optimum.prompt_machines, design.optimum.token_machines]))
    """, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    prompt, token = json.loads(run.stdout)
    assert prompt >= 1 and token >= 1


def test_to_dict_is_the_report_json_of_the_cli(tmp_path, run_cli):
    result = provisioner.search(designs="splitwise-ha,baseline-a100", **SMALL)
    run = run_cli("search", "--designs", "splitwise-ha,baseline-a100", "--model", "llama2-70b",
                  "--rate", "4", "--duration", "20", "--jobs", "1", "--no-cache",
                  "--out", str(tmp_path / "out"), "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == result.to_dict()
    assert json.loads((tmp_path / "out" / "report.json").read_text()) == result.to_dict()
    assert result.best is not None and result.best.design.name == \
        result.to_dict()["summary"]["best_design"]


def test_a_design_built_in_python_is_searched():
    catalog = load_catalog()
    mine = Design("h100-prompt-a100-token", catalog.machine("dgx-h100"),
                  catalog.machine("dgx-a100"), mixed_pool=False)
    result = provisioner.search(designs=[mine], **SMALL)
    assert result.designs[0].design.with_layouts(None) == mine   # plus the layouts it chose
    assert result.to_dict()["inputs"]["designs"] == [mine.as_dict()]
    assert result.designs[0].optimum is not None


def test_api_errors_name_the_keyword():
    with pytest.raises(InputError, match=r"^rate= must be a number > 0"):
        provisioner.search(rate=-1)
    with pytest.raises(InputError, match=r"^unknown option rates=; known: model, workload"):
        provisioner.search(rates=70)
    with pytest.raises(InputError, match=r"^goal= must be one of min-cost, min-power, max-rate"):
        provisioner.search(goal="cheapest")


def test_simulate_from_python():
    run = provisioner.simulate(design="splitwise-hh", prompt=4, token=2, model="llama2-70b",
                               rate=2, duration=20)
    assert run.result.feasible and len(run.workload) > 10
    assert run.report.profile == "splitwise"


def _catalog_with_new_sku(tmp_path: Path) -> Path:
    catalog = tmp_path / "catalog"
    shutil.copytree(HW_DIR, catalog, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    machines = yaml.safe_load((catalog / "machines.yaml").read_text())
    machines["my-box"] = {**machines["dgx-h100"], "gpu": "H100-custom"}
    (catalog / "machines.yaml").write_text(yaml.safe_dump(machines))
    return catalog


def test_catalog_dir_and_perf_table_for_a_sku_only_in_that_catalog(tmp_path, run_cli):
    """Regression: the table loader used the packaged catalog and rejected `my-box`."""
    catalog = _catalog_with_new_sku(tmp_path)
    table = tmp_path / "table.yaml"
    table.write_text(yaml.safe_dump({"tables": [{
        "machine": "my-box", "prefill": {"tokens": [128, 2048, 8192], "ms": [40, 180, 900]},
        "decode": {"batch": [1, 32, 64], "ms": [25, 30, 38]}}]}))
    run = run_cli("search", "--catalog", str(catalog), "--perf-model", str(table),
                  "--designs", "my-box/my-box", "--model", "llama2-70b", "--rate", "4",
                  "--duration", "20", "--jobs", "1", "--no-cache", "--out",
                  str(tmp_path / "out"))
    assert run.returncode in (0, 1), run.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["inputs"]["designs"][0]["prompt_sku"] == "my-box"
    run = run_cli("simulate", "--catalog", str(catalog), "--perf-model", str(table),
                  "--design", "my-box/my-box", "--prompt", "2", "--token", "2",
                  "--model", "llama2-70b", "--rate", "2", "--duration", "10")
    assert run.returncode in (0, 1), run.stderr
    run = run_cli("simulate", "--perf-model", str(table), "--design", "splitwise-hh",
                  "--prompt", "2", "--token", "2", "--rate", "2", "--duration", "10")
    assert run.returncode == 2 and "unknown machine SKU 'my-box'" in run.stderr


def test_check_says_when_the_best_design_changes(tmp_path):
    result = provisioner.search(designs="splitwise-ha,baseline-a100", **SMALL)
    result.write(tmp_path / "out")
    before = result.to_dict()["summary"]["best_design"]
    catalog = tmp_path / "catalog"
    shutil.copytree(HW_DIR, catalog, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    machines = catalog / "machines.yaml"
    # make the best design's prompt machine 100x dearer
    sku = result.best.design.prompt_sku
    data = yaml.safe_load(machines.read_text())
    data[sku]["cost_per_hour"] *= 100
    machines.write_text(yaml.safe_dump(data))
    checked = check_report(tmp_path / "out" / "report.json", Execution(no_cache=True, jobs=1),
                           catalog_dir=str(catalog))
    after = checked.document["summary"]["best_design"]
    assert after != before
    assert ("(summary)", "best_design", before, after) in checked.changes
    assert any("best design changed" in line for line in checked.lines())


def test_every_option_is_declared_once_and_reaches_cli_and_spec(tmp_path):
    """The CLI flags and the spec keys are the declared options, nothing more, nothing less."""
    fields = option_fields(SearchOptions)
    cli = {p.name for p in command_parameters(SearchOptions)}
    assert cli == {n for n, f in fields.items() if f.metadata["cli"]}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"rate": 9, "max-token": 3, "exhaustive": True}))
    assert read_spec(spec) == {"rate": 9.0, "max_token": 3, "exhaustive": True}
    spec.write_text("rate: 9\nrate: 10\n")
    with pytest.raises(InputError):
        read_spec(spec)  # duplicate keys are bad input, not a silent override
    sim = {p.name for p in command_parameters(SimulateOptions)}
    assert {"design", "prompt", "token", "machines", "catalog", "rate"} <= sim


def test_version_help_and_usage_errors_are_one_line(run_cli):
    run = run_cli("--version")
    assert run.returncode == 0 and run.stdout.strip() == f"provision {provisioner.__version__}"
    run = run_cli("search", "--help")
    assert run.returncode == 0
    assert "<bool>" not in run.stdout and "{" not in run.stdout.split("Options:")[0]
    assert "--goal [min-cost|min-power|max-rate]" in run.stdout or \
        "<min-cost|min-power|max-rate>" in run.stdout
    for args in (["search", "--goal", "cheapest"], ["search", "--rate", "abc"],
                 ["search", "--bogus"], ["simulate"], ["check"]):
        run = run_cli(*args)
        assert run.returncode == 2, (args, run.stderr)
        assert run.stderr.startswith("provision: error: ") and run.stderr.count("\n") == 1, \
            run.stderr
        assert "Traceback" not in run.stderr


def test_catalog_names_are_not_cut_at_80_columns(run_cli):
    run = run_cli("catalog", env={"COLUMNS": "80"})
    assert run.returncode == 0
    assert max(len(line) for line in run.stdout.splitlines()) <= 80
    for name in ("dgx-h100-cap", "mixtral-8x7b", "interactive-chat", "splitwise-hhcap"):
        assert name in run.stdout
    assert "…" not in run.stdout


def test_docs_python_api_examples_run_as_written(tmp_path, run_python):
    section = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    blocks = [b.split("```", 1)[0] for b in section.split("```python\n")[1:]]
    assert len(blocks) == 4
    # the second and third are notebook cells (the third shows the second's result:
    # tests/test_notebook compares what it shows with the page's table): one script here
    for script in [blocks[0], "".join(blocks[1:3]), blocks[3]]:
        run = run_python(script, cwd=tmp_path)
        assert run.returncode == 0, run.stderr
    assert (tmp_path / "my-report" / "report.json").exists()


def test_input_error_is_exported_and_short_help_works(cli):
    """Issue 27: notebooks catch `provisioner.InputError`; `-h` is `--help`."""
    from hardware_catalog import InputError
    assert provisioner.InputError is InputError
    with pytest.raises(provisioner.InputError):
        provisioner.search(rate=-1)
    for args in (["-h"], ["search", "-h"], ["simulate", "-h"]):
        run = cli(args)
        assert run.returncode == 0 and "Usage" in run.stdout, args


@pytest.mark.parametrize("width", [40, 80, 200])
def test_the_optimum_table_never_cuts_a_number(width):
    """Issue 27: at any width every figure of the table is whole (rich cut "2,587.20" to
    "2,58…" at 80 columns); words wrap instead."""
    import io

    from rich.console import Console

    from provisioner.terminal import optimum_table
    document = provisioner.search(designs="baseline-a100,splitwise-ha", model="bloom-176b",
                                  rate=70, duration=30, verify_seeds=1).to_dict()
    buffer = io.StringIO()
    Console(file=buffer, width=width).print(optimum_table(document, width))
    text = buffer.getvalue()
    assert "…" not in text
    for entry in document["designs"]:
        o = entry["optimum"]
        for figure in (f"{o['cost_per_hour']:,.2f}", f"{o['power_kw']:,.1f}", str(o["gpus"])):
            assert figure in text, (figure, width)


def test_a_piped_search_prints_whole_numbers(run_cli):
    run = run_cli("search", "--designs", "baseline-a100", "--rate", "70", "--duration", "30",
                  "--verify-seeds", "1", "--no-cache", "--out", "/dev/null/x", env={"COLUMNS": ""})
    assert "…" not in run.stdout


def test_results_read_well_in_a_notebook(tmp_path):
    """Issue 27: short reprs (they ran to 54-176 KB), an HTML view, DataFrames, and the
    answer in one sentence at the top of report.html."""
    result = provisioner.search(designs="splitwise-hh,baseline-h100", model="llama-3-8b",
                                rate=20, duration=30, verify_seeds=2)
    assert len(repr(result)) < 400 and "Best: " in repr(result)
    assert all(len(repr(r)) < 300 for r in result.designs)
    assert len(repr(result.designs[0].points)) < 200 * len(result.designs[0].points)
    view = result._repr_html_()
    assert "<table" in view and "Best: " in view
    frame = result.to_pandas()
    assert list(frame.index) == ["splitwise-hh", "baseline-h100"]
    best = result.best
    assert frame.loc[best.design.name, "cost_per_hour"] == pytest.approx(
        best.optimum.cost_per_hour)
    assert frame.loc[best.design.name, "layout"]
    milliseconds = result.to_dict()["designs"][0]["optimum"]["latency_ms"]
    name = result.designs[0].design.name
    assert frame.loc[name, "ttft_p99_ms"] == milliseconds["ttft"]["p99"]
    assert frame.loc[name, "tpot_p50_ms"] == milliseconds["tpot"]["p50"]
    assert 0 < frame.loc[name, "ttft_p50_ms"] <= frame.loc[name, "e2e_p99_ms"]
    points = result.to_pandas(evaluations=True)
    assert len(points) == sum(len(r.points) for r in result.designs)
    result.write(tmp_path)
    page = (tmp_path / "report.html").read_text()
    sentence = page.split('<p class="answer"><b>')[1].split("</b>")[0]
    assert sentence.startswith("Best: " + best.design.name)
    assert "dgx-h100" in sentence and f"{best.optimum.gpus} GPUs" in sentence


def test_every_optimum_reports_its_latencies_in_milliseconds(cli, tmp_path):
    """Issue 27: TTFT, TPOT and E2E in ms beside the slowdown SLOs: report.json and the
    terminal; the base sample's percentiles, recomputed here from `simulate` on it."""
    out = tmp_path / "out"
    run = cli(["search", "--designs", "baseline-h100", "--model", "llama-3-8b", "--rate", "20",
               "--duration", "30", "--verify-seeds", "2", "--no-cache", "--out", out])
    assert run.returncode == 0, run.stderr
    report = json.loads((out / "report.json").read_text())
    optimum = report["designs"][0]["optimum"]
    ms = optimum["latency_ms"]
    assert set(ms) == {"ttft", "tpot", "e2e", "itl"}
    again = provisioner.simulate(design="baseline-h100", machines=optimum["machines"],
                                 model="llama-3-8b", rate=20, duration=30,
                                 tp=optimum["layout"]["pool"]["tp"])
    ttft = again.result.ttft_s * 1000.0
    assert ms["ttft"]["p50"] == pytest.approx(float(np.percentile(ttft, 50)), rel=1e-5)
    assert ms["ttft"]["p50"] <= ms["ttft"]["p90"] <= ms["ttft"]["p99"]
    # ITL: every gap, read back from the run's histogram, within its 0.5%
    itl = again.result.itl_s([50, 99]) * 1000.0
    assert [ms["itl"]["p50"], ms["itl"]["p99"]] == pytest.approx(list(itl), rel=1e-5)
    assert ms["itl"]["p50"] <= ms["itl"]["p90"] <= ms["itl"]["p99"]
    assert "Latencies of each optimum, ms" in run.stdout and "ITL" in run.stdout
    # and in the slo values of report.json (the worst sample's) and evaluations.csv, with no
    # limit (the profile sets none) but shown
    slo = report["designs"][0]["optimum"]["slo"]["itl_p99"]
    assert slo["limit"] is None and slo["value"] >= ms["itl"]["p99"] * (1 - 1e-5)
    assert "itl_p99" in (out / "evaluations.csv").read_text().splitlines()[0]


def test_at_80_columns_each_design_is_still_one_row():
    """Issue 40: at 80 columns the optimum table was 64 stacked lines; now a row per design
    (its cost, power, GPUs and binding SLO on the line of its name) within 80 columns."""
    import io

    from rich.console import Console

    from provisioner.terminal import optimum_table
    document = provisioner.search(designs="baseline-a100,splitwise-ha", model="bloom-176b",
                                  rate=70, duration=30, verify_seeds=1).to_dict()
    buffer = io.StringIO()
    Console(file=buffer, width=80).print(optimum_table(document, 80))
    lines = buffer.getvalue().splitlines()
    assert max(map(len, lines)) <= 80
    for entry in document["designs"]:
        o = entry["optimum"]
        row = next(line for line in lines if line.strip().startswith(entry["design"]))
        for figure in (f"{o['cost_per_hour']:,.2f}", f"{o['power_kw']:,.1f}", str(o["gpus"])):
            assert figure in row


def test_the_sensitivity_table_never_cuts_a_number():
    """Issue 27: `COLUMNS=80 provision search --sensitivity` broke "$1,707/h" over three
    lines; at every width each figure of every cell is whole (a block per assumption when
    the columns do not fit)."""
    import io

    from rich.console import Console

    from provisioner.tables import sensitivity_cells
    from provisioner.terminal import sensitivity_table
    document = provisioner.search(designs="baseline-a100,splitwise-ha", model="bloom-176b",
                                  rate=70, duration=30, verify_seeds=1,
                                  sensitivity=True).to_dict()
    _, rows = sensitivity_cells(document)
    for width in (40, 80, 200):
        buffer = io.StringIO()
        Console(file=buffer, width=width).print(sensitivity_table(document, width))
        text = buffer.getvalue()
        assert "…" not in text and max(map(len, text.splitlines())) <= width
        words = set(text.split())
        for _, cells in rows:
            for cell in cells:
                assert set(cell.split()) <= words, (cell, width)
