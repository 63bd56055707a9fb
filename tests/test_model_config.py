"""`--model-config` (a Hugging Face config.json): every setting read is typed and bounded by
its declaration (`hardware_catalog.hf_config.SCHEMA`), and the bad-input cases are generated
from it: a zero, a negative or fractional count, a number written as a string, a boolean
written as a string, a wrong-typed text_config are each refused with one line naming the file
and the setting (exit 2 from the command line, InputError from Python); a setting left out
takes its default.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import provisioner
from hardware_catalog import InputError
from hardware_catalog.checks import Flag, Number, Text
from hardware_catalog.hf_config import SCHEMA, TEXT_CONFIG, LayerTypes, model_from_hf_config

REPO = Path(__file__).resolve().parents[1]
MISTRAL = json.loads((REPO / "examples" / "models" / "mistral-7b-v0.1.json").read_text())
MIXTRAL = {**MISTRAL, "num_local_experts": 8, "num_experts_per_tok": 2}
SIMULATE = ["simulate", "--design", "splitwise-hh", "--prompt", "1", "--token", "1",
            "--duration", "1", "--rate", "5"]


def _bad_values(check) -> list:
    """Values the setting's check refuses, by what a hand-edited config.json gets wrong."""
    if isinstance(check, Flag):
        return ["false", "true", 0, 1, "yes"]
    if isinstance(check, Text):
        return ["", 8, True, ["gpt_oss"], "a\nb"]
    if isinstance(check, LayerTypes):
        return ["full_attention", [], ["dense"], [1], {"0": "full_attention"}]
    assert isinstance(check, Number) and check.integer
    return [v for v in (0, -1, 2.5, "8", "0", True, [8], {"value": 8}, 10 ** 30)
            if not (v == 0 and check.low == 0 and not isinstance(v, bool))]


def _case_id(value) -> str:
    return json.dumps(value)


CASES = [(spelling, value) for name, setting in SCHEMA.items()
         for spelling in setting.names(name) for value in _bad_values(setting.check)]
REQUIRED = [name for name, setting in SCHEMA.items() if setting.required]


def _write(tmp_path: Path, config) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def _base_for(name: str) -> dict:
    """A valid config in which `name` is read (the expert settings: a Mixtral)."""
    return dict(MIXTRAL if "expert" in name else MISTRAL)


@pytest.mark.parametrize("name,value", CASES, ids=[f"{n}={_case_id(v)}" for n, v in CASES])
def test_a_bad_setting_is_refused_naming_it(tmp_path, cli, bad_input, name, value):
    config = _base_for(name)
    if name in ("num_experts", "n_routed_experts"):   # other spellings of num_local_experts
        config.pop("num_local_experts")
        config["moe_intermediate_size"] = 1024
    config[name] = value
    path = _write(tmp_path, config)
    bad_input(cli([*SIMULATE, "--model-config", path]), "config.json", f"'{name}'")
    with pytest.raises(InputError, match=f"config.json, field '{name}'"):
        model_from_hf_config(path)


@pytest.mark.parametrize("name,value", [(n, v) for n in ("num_key_value_heads", "head_dim",
                                                         "hidden_size")
                                        for v in (0, "8")])
def test_inside_text_config_the_setting_is_named_with_its_path(tmp_path, cli, bad_input,
                                                               name, value):
    path = _write(tmp_path, {"architectures": ["LlavaForConditionalGeneration"],
                             TEXT_CONFIG: {**MISTRAL, name: value}})
    bad_input(cli([*SIMULATE, "--model-config", path]), "config.json",
              f"'{TEXT_CONFIG}.{name}'")


@pytest.mark.parametrize("value", [[], None, "mistral", 7, [MISTRAL]], ids=_case_id)
def test_a_text_config_that_is_not_a_mapping(tmp_path, cli, bad_input, value):
    path = _write(tmp_path, {**MISTRAL, TEXT_CONFIG: value})
    bad_input(cli([*SIMULATE, "--model-config", path]), "config.json", f"'{TEXT_CONFIG}'")
    with pytest.raises(InputError, match=TEXT_CONFIG):
        model_from_hf_config(path)


@pytest.mark.parametrize("name", REQUIRED)
@pytest.mark.parametrize("how", ["missing", "null"])
def test_a_required_setting_must_be_given(tmp_path, cli, bad_input, name, how):
    config = dict(MISTRAL)
    if how == "missing":
        config.pop(name)
    else:
        config[name] = None
    path = _write(tmp_path, config)
    bad_input(cli([*SIMULATE, "--model-config", path]), "config.json", f"'{name}'")


def test_the_python_api_raises_input_error_naming_the_setting(tmp_path):
    path = _write(tmp_path, {**MISTRAL, "num_key_value_heads": 0})
    with pytest.raises(InputError, match="config.json, field 'num_key_value_heads'"):
        provisioner.simulate(design="splitwise-hh", prompt=1, token=1, duration=1, rate=5,
                             model_config=str(path))


@pytest.mark.parametrize("settings,name", [
    ({"num_key_value_heads": 5}, "num_key_value_heads"),        # 32 heads in 5 groups
    ({"num_attention_heads": 7}, "num_attention_heads"),        # 4096 not divisible by 7
    ({"num_experts_per_tok": 2}, "num_experts_per_tok"),        # experts per token, no experts
    ({"num_local_experts": 8, "num_experts_per_tok": 9}, "num_experts_per_tok"),
    ({"num_local_experts": 8, "num_experts": 8, "num_experts_per_tok": 2}, "num_experts"),
    ({"num_experts": 8, "num_experts_per_tok": 2}, "num_experts_per_tok"),  # no expert width
    ({"decoder_sparse_step": 2}, "decoder_sparse_step"),
    ({"shared_expert_intermediate_size": 5632}, "shared_expert_intermediate_size"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_settings_that_do_not_fit_together(tmp_path, cli, bad_input, settings, name):
    path = _write(tmp_path, {**MISTRAL, **settings})
    bad_input(cli([*SIMULATE, "--model-config", path]), "config.json", f"'{name}'")


def test_left_out_or_null_optional_settings_take_their_defaults(tmp_path):
    """HF writes null for an unset attribute: the same as leaving it out."""
    given = model_from_hf_config(_write(tmp_path, MISTRAL))
    assert (given.kv_heads, given.head_dim, given.experts) == (8, 128, None)
    assert given.params_b == pytest.approx(7.24, abs=0.01)
    for how in ("missing", "null"):
        config = dict(MISTRAL)
        for name in ("num_key_value_heads", "head_dim", "tie_word_embeddings"):
            if how == "missing":
                config.pop(name, None)
            else:
                config[name] = None
        model = model_from_hf_config(_write(tmp_path, config))
        assert model.kv_heads == model.heads == 32          # no GQA
        assert model.head_dim == 4096 // 32
        assert model.params_b > given.params_b              # more KV heads, untied embeddings
    tied = model_from_hf_config(_write(tmp_path, {**MISTRAL, "tie_word_embeddings": True}))
    assert given.params_b - tied.params_b == pytest.approx(32000 * 4096 / 1e9, abs=1e-3)


def test_a_mixtral_config_is_a_mixture_of_experts(tmp_path):
    model = model_from_hf_config(_write(tmp_path, MIXTRAL))
    assert (model.experts, model.experts_per_token) == (8, 2)
    assert model.expert_intermediate_size == MISTRAL["intermediate_size"]
    assert model.params_b == pytest.approx(46.7, abs=0.1)


# --- issue 36: MLA and modern mixture-of-experts models --------------------------------------
ARCHITECTURES = {   # examples/models/<file>: the public config.json (also in aiconfigurator-core)
    "deepseek-r1.json": ("deepseek-r1", 671.0, 37.6),
    "kimi-k2-instruct.json": ("kimi-k2", 1026.4, 32.9),
    "gpt-oss-120b.json": ("gpt-oss-120b", 116.8, 5.7),
    "qwen3-235b-a22b.json": ("qwen3-235b-a22b", 235.1, 22.2),
}


@pytest.mark.parametrize("filename", sorted(ARCHITECTURES))
def test_each_architectures_config_reads_as_its_catalog_entry(filename):
    from hardware_catalog import load_catalog
    name, total, active = ARCHITECTURES[filename]
    model = model_from_hf_config(REPO / "examples" / "models" / filename)
    assert model.params_b == pytest.approx(total, abs=0.1)
    assert model.active_params_b == pytest.approx(active, abs=0.1)
    entry = load_catalog().model(name)
    fields = ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate_size",
              "vocab_size", "experts", "experts_per_token", "expert_intermediate_size",
              "shared_experts", "dense_layers", "kv_lora_rank", "q_lora_rank",
              "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "sliding_window",
              "sliding_layers", "attention_sinks", "params_b", "active_params_b",
              "kv_bytes_per_token", "weight_bytes")
    assert {f: getattr(model, f) for f in fields} == {f: getattr(entry, f) for f in fields}
    assert entry.source.split()[0].count("/") == 1       # the Hugging Face repository named


def test_an_mla_models_kv_is_the_compressed_latent():
    """DeepSeek-R1: (kv_lora_rank 512 + rope 64) values per token per layer, not 2 x heads x
    head_dim; on every tensor-parallel GPU (the latent is one vector for all heads)."""
    from hardware_catalog import Layout, load_catalog
    from simcore import layout as layouts
    model = load_catalog().model("deepseek-r1")
    assert model.is_mla
    assert model.kv_bytes_per_token == 61 * (512 + 64) * 2 == 70_272
    assert model.kv_bytes_per_token < 2 * 61 * 128 * 128 * 2 / 50
    assert layouts.kv_bytes_per_token(model, Layout(8)) == 8 * 70_272
    fp8 = model.__class__(**{**model.__dict__, "kv_bytes_per_value": 1})
    assert fp8.kv_bytes_per_token == 61 * 576


def test_a_sliding_window_models_kv_is_bounded_by_its_window():
    """gpt-oss-120b: 18 full-attention layers hold every token, 18 sliding layers at most 128."""
    from hardware_catalog import load_catalog
    model = load_catalog().model("gpt-oss-120b")
    per_layer = 2 * 8 * 64 * 2
    assert model.kv_bytes_per_layer_token == per_layer
    assert model.kv_bytes_per_token == 18 * per_layer
    assert model.kv_bytes(100) == 36 * per_layer * 100
    assert model.kv_bytes(100_000) == 18 * per_layer * 100_000 + 18 * per_layer * 128
    assert model.kv_bytes(100_000) - model.kv_bytes_per_token * 100_000 == model.window_kv_bytes
    longer = [model.kv_bytes(c) - model.kv_bytes_per_token * c for c in (128, 1_000, 10 ** 6)]
    assert longer == [model.window_kv_bytes] * 3


def test_weights_count_experts_shared_experts_dense_layers_and_mla_projections():
    from hardware_catalog.hf_config import parameters
    from hardware_catalog import load_catalog
    m = load_catalog().model("deepseek-r1")
    entry = {f: getattr(m, f) for f in ("layers", "hidden", "heads", "kv_heads", "vocab_size",
                                        "intermediate_size", "experts", "experts_per_token",
                                        "expert_intermediate_size", "shared_experts",
                                        "dense_layers", "kv_lora_rank", "q_lora_rank",
                                        "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")}
    total, _ = parameters(entry)
    h = 7168
    mla = h * 1536 + 1536 * 128 * 192 + h * 576 + 512 * 128 * 256 + 128 * 128 * h
    expert = 3 * h * 2048
    by_hand = (2 * 129280 * h + 61 * mla + 3 * 3 * h * 18432
               + 58 * (h * 256 + 257 * expert))
    assert total == by_hand
    assert parameters({**entry, "shared_experts": 0})[0] == by_hand - 58 * expert
    assert parameters({**entry, "dense_layers": 0})[0] == (
        by_hand - 3 * 3 * h * 18432 + 3 * (h * 256 + 257 * expert))


def test_a_layout_that_does_not_fit_is_refused_with_the_figures():
    from hardware_catalog import Layout, load_catalog
    from simcore import layout as layouts
    catalog = load_catalog()
    model = catalog.model("deepseek-r1")   # 1,342 GB in bf16: more than one 8 x H200 machine
    why = layouts.fit_problem(model, catalog.machine("h200"), Layout(8), 0.1, 8192)
    assert "167.8 GB of weights per GPU" in why and "KV tokens" in why
    fp8 = model.__class__(**{**model.__dict__, "bytes_per_value": 1})
    assert not layouts.fit_problem(fp8, catalog.machine("h200"), Layout(8), 0.1, 8192)


@pytest.mark.parametrize("settings,name", [
    ({"kv_lora_rank": 512}, "qk_rope_head_dim"),                 # MLA needs all its dims
    ({"n_shared_experts": 1}, "n_shared_experts"),              # shared experts, no experts
    ({"num_local_experts": 8, "num_experts_per_tok": 2, "first_k_dense_replace": 32},
     "first_k_dense_replace"),
    ({"sliding_window": 128, "layer_types": ["full_attention"]}, "layer_types"),
    ({"layer_types": ["sliding_attention"] * 32}, "layer_types"),  # no window given
    ({"num_local_experts": 8, "num_experts_per_tok": 2, "moe_layer_freq": 2}, "moe_layer_freq"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_new_settings_that_do_not_fit_together(tmp_path, settings, name):
    path = _write(tmp_path, {**MISTRAL, **settings})
    with pytest.raises(InputError, match=f"config.json, field '{name}'"):
        model_from_hf_config(path)
