"""Instance layouts (issue 25): TP / PP per pool, many instances per machine, pipelines."""
from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest
import yaml

import provisioner
from hardware_catalog import DATA_DIR, InputError, Layout, load_catalog
from provisioner.check import optimum_changes
from provisioner.layouts import LayoutChoices, WorkloadShape, layout_choices
from provisioner.options import SearchOptions
from provisioner.question import resolve_study
from simcore import Cluster, SimOptions, Workload, simulate
from simcore import layout as layouts
from simcore.cluster import build_machine_arrays, instance_failures
from simcore.kernels import EnginePerformanceModel, KernelPerformanceModel
from simcore.perfmodel import default_performance_model

CATALOG = load_catalog()
A100, H100, H200 = (CATALOG.machine(n) for n in ("dgx-a100", "dgx-h100", "h200"))
PERF = EnginePerformanceModel(KernelPerformanceModel("vllm"), default_performance_model())
RESERVE = 0.10


def _study(**options):
    merged = SearchOptions()
    for group in ("study", "question", "layout"):
        record = getattr(merged, group)
        given = {k: v for k, v in options.items() if hasattr(record, k)}
        merged = replace(merged, **{group: replace(record, **given)})
    return resolve_study(merged)


# ------------------------------------------------------------------------------ memory
def test_bloom_fits_80gb_machines_only_at_tp8():
    """The paper's BLOOM-176B (352 GB) needs a whole DGX: TP8 is its one layout there."""
    bloom = CATALOG.model("bloom-176b")
    chosen, skipped = layouts.candidate_layouts(bloom, A100, default_performance_model(),
                                                RESERVE, 4096)
    assert chosen == [Layout(8)]
    assert {layout.tp for layout, _ in skipped} == {1, 2, 4}


def test_405b_spans_two_80gb_machines_and_fits_one_h200():
    big = CATALOG.model("llama-3.1-405b")
    on_a100, why = layouts.candidate_layouts(big, A100, PERF, RESERVE, 8192)
    assert Layout(8, 2) in on_a100 and all(layout.pp >= 2 for layout in on_a100)
    assert any("runs as TP8xPP2" in reason for _, reason in why)
    on_h200, _ = layouts.candidate_layouts(big, H200, PERF, RESERVE, 8192)
    assert Layout(8, 1) in on_h200


def test_kv_capacity_counts_replicated_kv_heads():
    """Qwen3-30B-A3B has 4 KV heads: at TP8 each head is stored twice."""
    qwen = CATALOG.model("qwen3-30b-a3b")
    assert layouts.kv_bytes_per_token(qwen, Layout(8)) == 2 * qwen.kv_bytes_per_token
    assert layouts.kv_bytes_per_token(qwen, Layout(4)) == qwen.kv_bytes_per_token
    llama = CATALOG.model("llama-3-8b")
    whole = layouts.kv_capacity(llama, H100, Layout(8), RESERVE)
    quarter = layouts.kv_capacity(llama, H100, Layout(2), RESERVE)
    assert quarter < whole / 4   # each instance holds its own copy of the weights


def test_pipeline_adds_its_stage_hops_to_every_iteration():
    llama = CATALOG.model("llama2-70b")
    one, two = (layouts.curves(PERF, llama, A100, Layout(4, pp)) for pp in (1, 2))
    per_token = layouts.ACTIVATION_BYTES * llama.hidden / (A100.kv_link_gbps * 1e9 / 8)
    np.testing.assert_allclose(two.prompt_time([512.0]) - one.prompt_time([512.0]),
                               layouts.PIPELINE_HOP_S + 512 * per_token, rtol=1e-9)
    np.testing.assert_allclose(two.token_time(8, 0) - one.token_time(8, 0),
                               layouts.PIPELINE_HOP_S + 8 * per_token, rtol=1e-9)


# ------------------------------------------------------------------------------ instances
def _workload(n=64, seed=3):
    rng = np.random.default_rng(seed)
    return Workload("w", np.sort(rng.uniform(0, 2, n)), rng.integers(100, 1500, n),
                    rng.integers(5, 60, n))


def test_a_machine_holds_gpus_over_tp_instances_and_all_serve():
    llama = CATALOG.model("llama-3-8b")
    design = CATALOG.design("baseline-h100").with_layouts(Layout(2))
    result = simulate(Cluster(design, 2), _workload(), llama, PERF, A100)
    assert result.feasible
    assert len(result.machine_stats["role"]) == 8           # 2 machines x 4 instances
    assert set(result.prompt_instance) == set(range(8))
    assert set(result.prompt_machine) == {0, 1}
    assert (result.machine_stats["iterations"] > 0).all()


def test_a_pool_smaller_than_its_pipeline_is_infeasible_not_an_error():
    big = CATALOG.model("llama-3.1-405b")
    design = CATALOG.design("baseline-a100").with_layouts(Layout(8, 2))
    result = simulate(Cluster(design, 1), _workload(8), big, PERF, A100)
    assert not result.feasible and "spans 2 machines" in result.reason
    assert simulate(Cluster(design, 2), _workload(8), big, PERF, A100).feasible


def test_a_machine_failure_takes_down_its_instances_and_pipelines_through_it():
    llama = CATALOG.model("llama-3-8b")
    design = CATALOG.design("splitwise-hh").with_layouts(Layout(4), Layout(2, 2))
    machines = build_machine_arrays(Cluster(design, 2, 2), llama, PERF, SimOptions())
    # prompt machines 0, 1 hold instances 0-1 and 2-3; token machines 2+3 hold one pipeline
    # group of 4 instances (4-7) spanning both
    assert machines.spans[:4] == ((0,), (0,), (1,), (1,))
    assert set(machines.spans[4:]) == {(2, 3)}
    rows = instance_failures(np.array([[1.0, 0, 5.0], [2.0, 2, 1.0], [2.5, 3, 3.0]]),
                             machines.spans)
    down = {(int(i)): (t, d) for t, i, d in rows}
    assert set(down) == {0, 1, 4, 5, 6, 7}
    assert down[0] == (1.0, 5.0)
    assert down[4] == (2.0, 3.5)   # both stages' outages merged: 2.0 until 5.5


# ------------------------------------------------------------------------------ the search
def test_llama3_8b_fits_in_16_gpus_and_names_its_layout():
    """The issue's case: the default question with Llama-3-8B; a layout per pool."""
    result = provisioner.search(model="llama-3-8b")
    best = result.best
    assert best is not None and best.optimum.gpus <= 16
    report = result.to_dict()
    entry = next(d for d in report["designs"] if d["design"] == best.design.name)
    assert set(entry["optimum"]["layout"]) in ({"prompt", "token"}, {"pool"})
    assert any(line["status"] == "chosen" for line in entry["layouts"])


def test_capacity_bounds_never_exceed_a_found_optimum():
    """A bound prunes layouts: it must be a lower bound of what the search finds."""
    result = provisioner.search(model="llama-3.1-70b", designs="splitwise-hh,baseline-h100",
                                rate=20, verify_seeds=3)
    lines = [line for d in result.designs for line in d.layouts
             if line["status"] in ("chosen", "lost")]
    assert lines
    for line in lines:
        assert line["bound"] <= line["cost_per_hour"] + 1e-9, line


def test_paper_specs_search_tp8_only():
    study = _study(model="bloom-176b", engine="splitwise-2023")
    for name, plan in layout_choices(study, study.designs).items():
        assert [v.design.layouts for v in plan.variants] == [
            (Layout(8),) * len(plan.variants[0].design.layouts)], name


def test_405b_plans_pipelines_on_80gb_and_one_machine_on_h200():
    study = _study(model="llama-3.1-405b", designs=("baseline-a100", "h200/h200"))
    found = layout_choices(study, study.designs)
    assert all(layout.pp >= 2 for v in found["baseline-a100"].variants
               for layout in v.design.layouts)
    assert any(v.design.layouts == (Layout(8), Layout(8)) for v in found["h200/h200"].variants)


def test_pins_reduce_the_variants_to_the_pinned_layout():
    study = _study(model="llama-3-8b", designs=("splitwise-hh", "baseline-h100"), tp_prompt=2,
                   tp_token=4, tp=8)
    found = layout_choices(study, study.designs)
    assert [v.design.layouts for v in found["splitwise-hh"].variants] == [(Layout(2), Layout(4))]
    assert [v.design.layouts for v in found["baseline-h100"].variants] == [(Layout(8),)]


def test_layout_lines_do_not_depend_on_jobs():
    kwargs = dict(model="llama-3-8b", designs="splitwise-hh", rate=20, verify_seeds=2)
    one, two = (provisioner.search(jobs=jobs, **kwargs) for jobs in (1, 2))
    assert one.designs[0].layouts == two.designs[0].layouts
    assert one.to_dict()["designs"] == two.to_dict()["designs"]


def test_a_changed_layout_is_a_changed_optimum():
    entry = {"design": "splitwise-hh", "feasible": True,
             "optimum": {"prompt_machines": 1, "token_machines": 1, "gpus": 16,
                         "layout": {"prompt": {"tp": 1, "pp": 1, "instances_per_machine": 8},
                                    "token": {"tp": 4, "pp": 1, "instances_per_machine": 2}}}}
    moved = {**entry, "optimum": {**entry["optimum"], "layout": {
        **entry["optimum"]["layout"], "token": {"tp": 8, "pp": 1, "instances_per_machine": 1}}}}
    changes = optimum_changes({"designs": [entry]}, {"designs": [moved]})
    assert [c[1] for c in changes] == ["layout"]
    assert changes[0][2] == "TP1 x8 / TP4 x2" and changes[0][3] == "TP1 x8 / TP8"


# ------------------------------------------------------------------------------ bad input
def test_tp_that_divides_no_machine(cli, bad_input):
    bad_input(cli(["search", "--model", "llama-3-8b", "--tp", "3"]), "--tp", "divide")


def test_pinned_layout_that_fits_nothing(cli, bad_input):
    bad_input(cli(["search", "--model", "llama2-70b", "--designs", "baseline-a100", "--tp", "1",
                   "--pp", "1"]), "tp", "KV tokens")


def test_simulate_pipeline_longer_than_the_pool(cli, bad_input):
    bad_input(cli(["simulate", "--design", "baseline-h100", "--machines", "1", "--model",
                   "llama-3-8b", "--tp", "4", "--pp", "2"]), "pp", "spans 2 machines")


def test_simulate_a_model_that_needs_two_machines(cli, bad_input):
    bad_input(cli(["simulate", "--design", "baseline-a100", "--machines", "1", "--model",
                   "llama-3.1-405b"]), "--machines 2")


def test_model_larger_than_every_sku(cli, bad_input, tmp_path):
    catalog = tmp_path / "catalog"
    shutil.copytree(DATA_DIR, catalog, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    models = yaml.safe_load((catalog / "models.yaml").read_text())
    huge = dict(models["llama-3.1-405b"], params_b=40000.0)
    models["huge"] = huge
    (catalog / "models.yaml").write_text(yaml.safe_dump(models))
    bad_input(cli(["search", "--catalog", catalog, "--model", "huge"]), "fits no design")


def test_tensor_parallel_left_the_model_catalog(tmp_path):
    catalog = tmp_path / "catalog"
    shutil.copytree(DATA_DIR, catalog, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    models = yaml.safe_load((catalog / "models.yaml").read_text())
    models["llama-3-8b"]["tensor_parallel"] = 8
    (catalog / "models.yaml").write_text(yaml.safe_dump(models))
    with pytest.raises(InputError, match="--tp"):
        load_catalog(catalog)


def test_plan_of_a_design_record_with_its_layout_keeps_it():
    study = _study(model="llama-3-8b", designs=("baseline-h100",))
    design = study.designs[0].with_layouts(Layout(4))
    plan = layout_choices(replace(study, designs=(design,)), (design,))[design.name]
    assert isinstance(plan, LayoutChoices)
    assert [v.design.layouts for v in plan.variants] == [(Layout(4),)]
    assert WorkloadShape.of(study).longest > 0


# ------------------------------------------------------------------------------ bounds
@pytest.fixture(scope="module")
def default_search():
    return provisioner.search().to_dict()


def test_every_default_design_reports_a_bound_no_optimum_lies_below(default_search):
    """The capacity bound (issue 26) is a lower bound: every design of the paper study's
    default question (70 req/s) costs at least its bound, and the terminal prints both."""
    for entry in default_search["designs"]:
        bound = entry["capacity_bound"]
        assert bound is not None and bound["value"] > 0, entry["design"]
        assert entry["optimum"]["cost_per_hour"] >= bound["value"], entry["design"]
        line = next(line for line in entry["layouts"] if line["status"] == "chosen")
        assert line["bound"] == bound["value"]


def test_the_bound_holds_at_700_requests_per_second():
    result = provisioner.search(designs="baseline-h100", rate=700, verify_seeds=2).to_dict()
    (entry,) = result["designs"]
    assert entry["optimum"]["cost_per_hour"] >= entry["capacity_bound"]["value"] > 0
    # the growth started from the pool the bound asks for, not from one machine
    assert entry["capacity_bound"]["pool_floors"][0] > 1
    assert min(p["machines"] for p in entry["evaluated"]) > 1


# ------------------------------------------------------------------ bring your own model
CONFIG = DATA_DIR.parent / "examples" / "models" / "mistral-7b-v0.1.json"


def _config_of(model) -> dict:
    """A Hugging Face config.json written from a catalog record (the inverse mapping)."""
    config = {"num_hidden_layers": model.layers, "hidden_size": model.hidden,
              "num_attention_heads": model.heads, "num_key_value_heads": model.kv_heads,
              "vocab_size": model.vocab_size, "tie_word_embeddings": False}
    if model.head_dim_size is not None:
        config["head_dim"] = model.head_dim_size
    if model.is_moe:
        config.update(num_experts=model.experts, num_experts_per_tok=model.experts_per_token,
                      moe_intermediate_size=model.expert_intermediate_size,
                      intermediate_size=model.intermediate_size)
    else:
        config["intermediate_size"] = model.intermediate_size
    return config


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b",
                                  "qwen3-30b-a3b"])
def test_a_config_json_gives_the_catalog_record(name, tmp_path):
    """The parameter count from the shapes matches the catalog's (from the same configs)."""
    import json

    from hardware_catalog.hf_config import model_from_hf_config
    model = CATALOG.model(name)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(_config_of(model)))
    mine = model_from_hf_config(path)
    assert mine.name == name
    assert mine.kv_bytes_per_token == model.kv_bytes_per_token
    assert mine.params_b == pytest.approx(model.params_b, rel=0.01)
    if model.is_moe:
        assert mine.active_params_b == pytest.approx(model.active_params_b, rel=0.02)


def test_search_and_check_a_model_from_its_config(cli, tmp_path):
    out = tmp_path / "out"
    run = cli(["search", "--model-config", CONFIG, "--designs", "baseline-h100", "--rate", "20",
               "--duration", "30", "--verify-seeds", "2", "--no-cache", "--out", out])
    assert run.returncode == 0, run.stderr
    import json
    report = json.loads((out / "report.json").read_text())
    assert report["inputs"]["model"]["name"] == "mistral-7b-v0.1"
    assert report["inputs"]["model"]["params_b"] == pytest.approx(7.24, abs=0.01)
    check = cli(["check", out / "report.json", "--no-cache"])
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_config_that_is_not_one(cli, bad_input, tmp_path):
    broken = tmp_path / "config.json"
    broken.write_text('{"hidden_size": 4096}')
    bad_input(cli(["search", "--model-config", broken]), "config.json", "num_hidden_layers")
    latent = tmp_path / "deepseek.json"
    latent.write_text('{"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2, '
                      '"vocab_size": 10, "kv_lora_rank": 512, "intermediate_size": 128}')
    bad_input(cli(["search", "--model-config", latent]), "latent attention")


REFERENCE = __import__("pathlib").Path(__file__).resolve().parents[1] / "examples" / "reference"


@pytest.mark.parametrize("report", sorted(REFERENCE.glob("*/report.json")),
                         ids=lambda path: path.parent.name)
def test_no_reference_optimum_lies_below_its_capacity_bound(report):
    """The paper study (its four reference specs, every design): each verified optimum costs
    at least the design's capacity bound, and each pool at least its floor. At 700 and 7,000
    req/s the same holds (bench/fleet_bench.py checks it; figures in bench/RESULTS.md)."""
    import json
    document = json.loads(report.read_text())
    for entry in document["designs"]:
        optimum, bound = entry["optimum"], entry["capacity_bound"]
        if optimum is None:
            continue
        assert optimum["cost_per_hour"] >= bound["value"] - 1e-6, entry["design"]
        if "machines" in optimum:   # a colocated pool's floor bounds it (a mixed pool's not)
            assert optimum["machines"] >= bound["pool_floors"][0], entry["design"]


def test_a_design_answers_with_its_pools():
    """`Design.pools`: a colocated design's one pool ("mixed"), a Splitwise design's prompt
    then token pool, each with its SKU and layout; the layout records are keyed by them."""
    from hardware_catalog import Pool
    from provisioner.layouts import layout_record, pinned
    model = CATALOG.model("llama2-70b")
    colocated = CATALOG.design("baseline-h100")
    split = CATALOG.design("splitwise-ha").with_layouts(Layout(4), Layout(8))
    assert [(p.role, p.sku, p.layout) for p in colocated.pools] == [("mixed", H100, None)]
    assert [(p.role, p.sku, p.layout) for p in split.pools] == [
        ("prompt", H100, Layout(4)), ("token", A100, Layout(8))]
    assert [p.label for p in colocated.pools + split.pools] == ["pool", "prompt", "token"]
    assert [p.size_option for p in colocated.pools + split.pools] == [
        "machines", "prompt", "token"]
    assert split.layouts == (Layout(4), Layout(8)) and colocated.layouts == (None,)
    assert list(layout_record(colocated, model, RESERVE)) == ["pool"]
    assert list(layout_record(split, model, RESERVE)) == ["prompt", "token"]
    pins = SearchOptions().layout
    pins = replace(pins, tp=2, tp_token=4)
    assert [pinned(pins, p) for p in split.pools] == [(2, None), (4, None)]
    assert pinned(pins, colocated.pools[0]) == (2, None)
    with pytest.raises(ValueError, match="role"):
        Pool("both", H100)
