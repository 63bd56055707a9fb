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
from hardware_catalog.checks import Flag, Number
from hardware_catalog.hf_config import SCHEMA, TEXT_CONFIG, model_from_hf_config

REPO = Path(__file__).resolve().parents[1]
MISTRAL = json.loads((REPO / "examples" / "models" / "mistral-7b-v0.1.json").read_text())
MIXTRAL = {**MISTRAL, "num_local_experts": 8, "num_experts_per_tok": 2}
SIMULATE = ["simulate", "--design", "splitwise-hh", "--prompt", "1", "--token", "1",
            "--duration", "1", "--rate", "5"]


def _bad_values(check) -> list:
    """Values the setting's check refuses, by what a hand-edited config.json gets wrong."""
    if isinstance(check, Flag):
        return ["false", "true", 0, 1, "yes"]
    assert isinstance(check, Number) and check.integer
    return [0, -1, 2.5, "8", "0", True, [8], {"value": 8}, 10 ** 30]


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
    if name == "num_experts":   # the Qwen-MoE spelling of num_local_experts
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
