"""Catalog and SLO profile loaders: published figures, derived ratios, one-line errors."""
from __future__ import annotations

import shutil

import pytest

from hardware_catalog import DATA_DIR, InputError, load_catalog
from slo_profiles import builtin_slo_profiles, load_slo_profile

CATALOG = load_catalog()


def test_table_v_ratios_come_out_of_the_defaults():
    a100, h100, cap = (CATALOG.machine(n) for n in ("dgx-a100", "dgx-h100", "dgx-h100-cap"))
    assert h100.power_kw / a100.power_kw == pytest.approx(1.75)
    # 70% of 1.75x is 1.225x, which Table V prints as 1.23x
    assert cap.power_kw / a100.power_kw == pytest.approx(1.23, abs=0.0051)
    assert round(h100.cost_per_hour / a100.cost_per_hour, 2) == 2.16
    # iso-power: 40 DGX-H100 draw what 70 DGX-A100 draw
    assert 40 * h100.power_kw == pytest.approx(70 * a100.power_kw)
    assert cap.prompt_slowdown > 1.0 and h100.prompt_slowdown == 1.0


def test_published_figures_and_sources():
    a100, h100 = CATALOG.machine("dgx-a100"), CATALOG.machine("dgx-h100")
    assert (a100.hbm_gib, a100.hbm_bandwidth_gbs, a100.gpu_power_w, a100.cost_per_hour) == \
        (80, 2039, 400, 17.6)
    assert (h100.hbm_gib, h100.hbm_bandwidth_gbs, h100.gpu_power_w, h100.cost_per_hour) == \
        (81559 / 1024, 3352, 700, 38.0)
    # HBM in the unit the driver reports: 81,920 MiB and 81,559 MiB per GPU (nvidia-smi)
    assert a100.hbm_bytes == 8 * 81920 * 2**20
    assert round(h100.hbm_bytes / 8 / 2**20) == 81559
    assert (a100.kv_link_gbps, h100.kv_link_gbps) == (200, 400)
    for machine in CATALOG.machines.values():
        assert machine.sources, machine.name
    uncalibrated = {m.name for m in CATALOG.machines.values() if not m.calibrated}
    assert {"h200", "b200", "mi300x", "l40s"} <= uncalibrated


def test_kv_bytes_per_token_accounts_for_grouped_query_attention():
    llama, bloom = CATALOG.model("llama2-70b"), CATALOG.model("bloom-176b")
    assert llama.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2          # 8 KV heads of 128
    assert bloom.kv_bytes_per_token == 2 * 70 * 14336 * 2            # no GQA
    # ignoring GQA would make Llama2-70B's KV 8x too large (the reference simulator's bug)
    assert llama.kv_bytes_per_token * 8 == 2 * 80 * 8192 * 2
    for name in ("llama-3-70b", "llama-3-8b", "mixtral-8x7b"):
        assert CATALOG.model(name).kv_heads < CATALOG.model(name).heads


def test_designs_of_the_paper():
    assert set(CATALOG.designs) == {"baseline-a100", "baseline-h100", "splitwise-aa",
                                    "splitwise-hh", "splitwise-ha", "splitwise-hhcap",
                                    "sarathi-a100", "sarathi-h100"}
    assert CATALOG.design("splitwise-ha").token_sku == "dgx-a100"
    assert CATALOG.design("baseline-h100").is_baseline


def test_unknown_names_list_the_known_ones():
    with pytest.raises(InputError, match="unknown machine SKU 'dgx-z100'.*dgx-a100"):
        CATALOG.machine("dgx-z100")
    with pytest.raises(InputError, match="unknown model 'gpt-9'.*bloom-176b"):
        CATALOG.model("gpt-9")


@pytest.fixture
def catalog_copy(tmp_path):
    for name in ("machines.yaml", "models.yaml", "designs.yaml"):
        shutil.copy(DATA_DIR / name, tmp_path / name)
    return tmp_path


@pytest.mark.parametrize("file, old, new, fragment", [
    ("machines.yaml", "cost_per_hour: 17.6", "cost_per_hour: cheap", "field 'cost_per_hour'"),
    ("machines.yaml", "cost_per_hour: 17.6", "cost_per_hour: -1", "must be a number > 0"),
    ("machines.yaml", "  gpus: 8\n  hbm_gib: 80.0\n  hbm_bandwidth_gbs: 2039",
     "  gpus: 8\n  hbm_bandwidth_gbs: 2039", "field 'hbm_gib': entry 'dgx-a100': missing"),
    ("machines.yaml", "power_cap: 0.70", "power_cap: 1.5", "must be a number > 0 and <= 1"),
    ("models.yaml", "kv_heads: 8", "kv_heads: 7", "field 'kv_heads'"),
    ("models.yaml", "layers: 70", "layers: .nan", "field 'layers'"),
    ("designs.yaml", "token_sku: dgx-h100-cap", "token_sku: dgx-h900", "unknown machine SKU"),
    ("designs.yaml", "baseline-a100:", "baseline-a100: [", "broken YAML"),
])
def test_malformed_catalog_files_give_one_line_errors(catalog_copy, file, old, new, fragment):
    path = catalog_copy / file
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(InputError) as err:
        load_catalog(str(catalog_copy))
    message = str(err.value)
    assert fragment in message and file in message and "\n" not in message


def test_splitwise_slo_profile_is_table_vi():
    profile = builtin_slo_profiles()["splitwise"]
    assert profile.kind == "slowdown"
    assert profile.limits[("ttft", "p99")] == 6.0 and profile.limits[("tbt", "p50")] == 1.25
    assert len(profile.limits) == 9
    assert {"interactive-chat", "relaxed-batch"} <= set(builtin_slo_profiles())


@pytest.mark.parametrize("text, fragment", [
    ("kind: slowdown\nlimits: {ttft: {p50: 2}", "broken YAML"),
    ("kind: relative\nlimits: {ttft: {p50: 2}}", "field 'kind'"),
    ("kind: slowdown\nlimits: {latency: {p50: 2}}", "unknown metric 'latency'"),
    ("kind: slowdown\nlimits: {ttft: {p95: 2}}", "unknown percentile 'p95'"),
    ("kind: slowdown\nlimits: {ttft: {p50: -2}}", "field 'limits.ttft.p50'"),
    ("", "file is empty"),
])
def test_malformed_slo_profiles_are_rejected(tmp_path, text, fragment):
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        load_slo_profile(str(path))
    assert fragment in str(err.value) and "mine.yaml" in str(err.value)


def test_subset_slo_profile_from_file(tmp_path):
    path = tmp_path / "ttft-only.yaml"
    path.write_text("kind: absolute_ms\nlimits:\n  ttft: {p99: 800}\n")
    profile = load_slo_profile(str(path))
    assert profile.limits == {("ttft", "p99"): 800.0}


def test_catalog_command_lists_everything_as_json(run_cli):
    run = run_cli("catalog", "--json", timeout=120)
    assert run.returncode == 0, run.stderr
    import json
    doc = json.loads(run.stdout)
    assert {m["name"] for m in doc["machines"]} >= {"dgx-a100", "dgx-h100", "dgx-h100-cap", "b200"}
    assert {m["name"] for m in doc["models"]} >= {"llama2-70b", "bloom-176b", "mixtral-8x7b"}
    assert len(doc["designs"]) == 8 and len(doc["slo_profiles"]) >= 3


def test_broken_slo_file_through_the_cli_exits_2(tmp_path, run_cli):
    path = tmp_path / "broken.yaml"
    path.write_text("kind: slowdown\nlimits: {ttft: [")
    run = run_cli("simulate", "--design", "splitwise-hh", "--prompt", "2", "--token", "2",
                  "--slo", path, timeout=120)
    assert run.returncode == 2
    assert "broken.yaml" in run.stderr and "broken YAML" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_models_carry_the_gemm_shapes_of_their_config_json():
    for model in CATALOG.models.values():
        assert model.intermediate_size and model.vocab_size, model.name
    l405, qwen = CATALOG.model("llama-3.1-405b"), CATALOG.model("qwen3-30b-a3b")
    assert (l405.layers, l405.hidden, l405.heads, l405.kv_heads, l405.intermediate_size,
            l405.vocab_size) == (126, 16384, 128, 8, 53248, 128256)
    # Qwen3's head_dim (128) is not hidden / heads (64): the KV cache follows head_dim
    assert qwen.head_dim == 128 and qwen.kv_bytes_per_token == 2 * 48 * 4 * 128 * 2
    assert (qwen.experts, qwen.experts_per_token, qwen.expert_intermediate_size) == (128, 8, 768)
    assert CATALOG.model("mixtral-8x7b").is_moe and not CATALOG.model("llama-3.1-70b").is_moe
    assert not CATALOG.model("bloom-176b").mlp_gated


@pytest.mark.parametrize("old, new, fragment", [
    ("  experts: 8\n", "", "field 'experts': entry 'mixtral-8x7b': a mixture-of-experts model"),
    ("experts_per_token: 2", "experts_per_token: 9", "field 'experts_per_token'"),
    ("vocab_size: 32000", "vocab_size: -5", "field 'vocab_size'"),
])
def test_moe_and_shape_fields_are_checked(catalog_copy, old, new, fragment):
    path = catalog_copy / "models.yaml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(InputError) as err:
        load_catalog(str(catalog_copy))
    assert fragment in str(err.value)


def test_the_catalog_marks_only_skus_without_measured_latencies(cli, monkeypatch):
    """Under the default engine, a SKU with vLLM kernel tables (H200, B200, L40S) or 2023
    profiles is not marked uncalibrated in `provision catalog`; MI300X (neither) is."""
    monkeypatch.setenv("COLUMNS", "200")
    outcome = cli(["catalog"])
    assert outcome.code == 0, outcome.stderr
    marked = {line.split("│")[1].split()[0] for line in outcome.stdout.splitlines()
              if line.startswith("│") and " * " in line.split("│")[1] + " "}
    assert marked == {"mi300x"}, marked


def test_a_catalog_overlay_adds_or_replaces_single_entries(tmp_path):
    """Issue 27: --catalog may hold one file with one entry; the packaged catalog stays, the
    entry replaces its namesake (packaged designs use it) or adds a new one."""
    import yaml
    machines = yaml.safe_load((DATA_DIR / "machines.yaml").read_text())
    (tmp_path / "machines.yaml").write_text(yaml.safe_dump({
        "dgx-h100": {**machines["dgx-h100"], "cost_per_hour": 12.5},
        "my-a100": machines["dgx-a100"]}))
    catalog = load_catalog(str(tmp_path))
    assert set(CATALOG.machines) < set(catalog.machines) and "my-a100" in catalog.machines
    assert catalog.models == CATALOG.models and set(catalog.designs) == set(CATALOG.designs)
    assert catalog.design("splitwise-hh").prompt.cost_per_hour == 12.5
    assert catalog.design("splitwise-aa") == CATALOG.design("splitwise-aa")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="holds none of machines.yaml"):
        load_catalog(str(empty))


def test_price_replaces_a_machines_cost_for_the_run(run_cli, tmp_path):
    """--price SKU=USD: the optimum is priced with it, the report echoes it and `check`
    reproduces the report; an unknown SKU is one line naming the known ones."""
    import json
    out = tmp_path / "out"
    done = run_cli("search", "--designs", "splitwise-hh", "--duration", "20",
                   "--verify-seeds", "2", "--price", "dgx-h100=20", "--no-cache", "--out", out)
    assert done.returncode == 0, done.stderr
    document = json.loads((out / "report.json").read_text())
    optimum = document["designs"][0]["optimum"]
    machines = optimum["prompt_machines"] + optimum["token_machines"]
    assert optimum["cost_per_hour"] == pytest.approx(20 * machines)
    assert document["inputs"]["options"]["price"] == [["dgx-h100", 20.0]]
    checked = run_cli("check", out / "report.json", "--no-cache")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    failed = run_cli("search", "--price", "dgx-z100=20", "--out", tmp_path / "x")
    assert failed.returncode == 2 and "--price: unknown machine SKU 'dgx-z100'" in failed.stderr


def test_the_uncalibrated_warning_names_what_is_estimated(tmp_path):
    """A model without its kernel shapes is the estimated part, not the GPU: the warning says
    so and points to --model-config; a GPU without kernel data gets advice `calibrate`
    accepts (5 points or more, not one prompt and one decode latency)."""
    import yaml
    import provisioner
    from provisioner.api import CALIBRATION_HINT, SHAPES_HINT
    models = yaml.safe_load((DATA_DIR / "models.yaml").read_text())
    shapeless = {k: v for k, v in models["llama-3-8b"].items()
                 if k not in ("intermediate_size", "vocab_size")}
    (tmp_path / "models.yaml").write_text(yaml.safe_dump({"my-8b": shapeless}))
    result = provisioner.search(catalog=str(tmp_path), model="my-8b", designs="splitwise-hh",
                                rate=10, duration=20, verify_seeds=1)
    warnings = result.to_dict()["warnings"]
    assert warnings and all(SHAPES_HINT in w for w in warnings)
    assert "calibrate" not in " ".join(warnings)
    assert "5 or more" in CALIBRATION_HINT and "one prompt and one" not in CALIBRATION_HINT
