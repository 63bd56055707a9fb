"""Which hardware to buy (issue 28): every design shape over the SKUs, pruned by bounds."""
from __future__ import annotations

import json

import pytest

import provisioner
from hardware_catalog import load_catalog
from provisioner.hardware import hardware_designs

CATALOG = load_catalog()
SMALL = dict(model="llama2-70b", rate=10, duration=30, verify_seeds=3)


def test_every_shape_over_the_catalog_keeps_the_catalogs_names():
    designs = hardware_designs(["all"], CATALOG)
    skus = len(CATALOG.machines)
    assert len(designs) == skus * skus + 2 * skus
    names = [d.name for d in designs]
    assert len(set(names)) == len(names)
    for name in CATALOG.designs:   # the paper's eight are among them, under their names
        assert name in names
    assert "h200/dgx-a100" in names and "colocated-b200" in names and "chunked-l40s" in names
    assert sum(1 for d in designs if d.token is not None) == skus * skus


@pytest.mark.parametrize("args, names", [
    (["--hardware", "dgx-z100"], ["hardware", "dgx-z100", "dgx-a100"]),
    (["--hardware", ","], ["hardware"]),
    (["--hardware", "all,h200"], ["hardware", "all"]),
    (["--hardware", "h200", "--designs", "splitwise-hh"], ["designs", "hardware"]),
])
def test_bad_hardware_is_one_line(run_cli, tmp_path, args, names):
    from harness import assert_bad_input
    assert_bad_input(run_cli("search", *args, "--out", tmp_path / "out"), *names)
    assert not (tmp_path / "out").exists()


def test_pruning_keeps_the_answer_and_never_the_job_count(tmp_path):
    """The best design is the one every design searched in full gives; a pruned design's
    bound cannot beat it; the report is byte-identical with 1 and 2 jobs, on threads, loky
    and a local dask cluster."""
    skus = "dgx-a100,dgx-h100,h200"
    pruned = provisioner.search(hardware=skus, jobs=1, **SMALL)
    full = provisioner.search(designs=list(hardware_designs(skus.split(","), CATALOG)),
                              jobs=2, **SMALL)
    assert pruned.best.design.name == full.best.design.name
    assert pruned.best.optimum.cost_per_hour == full.best.optimum.cost_per_hour
    document = pruned.to_dict()
    summary = document["summary"]["hardware"]
    assert summary["designs"] == 15 and summary["best"] == pruned.best.design.name
    best_cost = pruned.best.optimum.cost_per_hour
    for entry in document["designs"]:
        assert entry["status"] in ("feasible", "pruned", "infeasible")
        if entry["status"] == "pruned" and not entry["evaluated"]:
            assert entry["capacity_bound"]["value"] >= best_cost - 1e-6
    runs = [(1, "threads"), (2, "threads"), (2, "loky"), (2, "dask")]
    for jobs, backend in runs:
        provisioner.search(hardware=skus, jobs=jobs, backend=backend,
                           **SMALL).write(tmp_path / f"{backend}{jobs}")
    reports = {(tmp_path / f"{backend}{jobs}" / "report.json").read_bytes()
               for jobs, backend in runs}
    assert len(reports) == 1


def test_the_terminal_shows_the_best_few_and_counts_the_rest(run_cli, tmp_path):
    run = run_cli("search", "--hardware", "all", "--model", "llama2-70b", "--rate", "10",
                  "--duration", "30", "--verify-seeds", "2", "--no-cache", "--out",
                  tmp_path / "out")
    assert run.returncode == 0, run.stderr
    document = json.loads((tmp_path / "out" / "report.json").read_text())
    summary = document["summary"]["hardware"]
    shapes = len(CATALOG.machines) ** 2 + 2 * len(CATALOG.machines)
    assert summary["designs"] == shapes and summary["pruned"] > 0
    assert "Best over these machines:" in run.stdout and f"{shapes} design shapes" in run.stdout
    rows = [d["design"] for d in document["designs"] if d["status"] == "feasible"]
    assert len(rows) > 8   # more feasible designs than the table shows
    shown = [name for name in rows if f"│ {name} " in run.stdout or f"│ {name} *" in run.stdout]
    assert len(shown) <= 9


def test_report_html_plots_every_feasible_design_with_the_pareto_front(tmp_path):
    from provisioner.figures import hardware_figure, pareto_front
    result = provisioner.search(hardware="dgx-a100,dgx-h100,h200", **SMALL)
    feasible = [r for r in result.designs if r.feasible]
    front = pareto_front(feasible)
    def dominates(a, b):
        return (a.optimum.cost_per_hour <= b.optimum.cost_per_hour
                and a.optimum.power_kw <= b.optimum.power_kw
                and (a.optimum.cost_per_hour, a.optimum.power_kw)
                != (b.optimum.cost_per_hour, b.optimum.power_kw))

    for r in feasible:   # the front: exactly the designs nothing dominates
        assert (r in front) == (not any(dominates(f, r) for f in feasible)), r
    for a, b in zip(front, front[1:]):
        assert a.optimum.cost_per_hour <= b.optimum.cost_per_hour
        assert a.optimum.power_kw > b.optimum.power_kw
    figure = hardware_figure(result.designs)
    plotted = sum(len(trace["x"]) for trace in figure["data"][:-1])
    assert plotted == len(feasible)
    result.write(tmp_path)
    page = (tmp_path / "report.html").read_text()
    assert 'id="fig-hardware"' in page and "Pareto front" in page
