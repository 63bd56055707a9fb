"""A model record from a Hugging Face `config.json` (`--model-config`): bring your own model.

The shapes map one to one (num_hidden_layers, hidden_size, num_attention_heads,
num_key_value_heads, intermediate_size, vocab_size, head_dim); mixture-of-experts models take
their experts from the two common spellings (Mixtral: num_local_experts and intermediate_size;
Qwen-MoE: num_experts and moe_intermediate_size, every layer sparse), with num_experts_per_tok.
Parameters are counted from the shapes: embedding and LM head (one matrix when the embeddings
are tied), per layer the Q, K, V and O projections and the MLP (gate, up and down), or the
router and every expert (active: the top-k experts); norms and biases are left out (under
0.1%). The result goes through the catalog's own checks (`parse_model`), so a config that
makes no sense is refused the way a bad catalog entry is.

Every setting read is declared once, in `SCHEMA` (name -> `Setting`: its check from the
project's vocabulary, whether it is required, its default and the other names Hugging Face
configs give it), and read only through it: a zero, a negative or fractional count, a number
written as a string or a boolean written as one is refused naming the file and the setting.
A setting left out, or null (what Hugging Face writes for an unset attribute), takes its
default; a required one must be given. Other keys of the file do not change the sizing and are
not read.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from hardware_catalog import InputError, ModelSpec, parse_model, read_json
from hardware_catalog.checks import Flag, Invalid, Mapping, count


@dataclass(frozen=True)
class Setting:
    """One setting of a config.json: how it is checked, whether the file must give it, its
    default when left out (None: derived from others, see `doc`), and the other names Hugging
    Face configs spell it with (one of them at most may be given)."""
    check: Callable[[Any], Any]
    required: bool = False
    default: Any = None
    aliases: tuple[str, ...] = ()
    doc: str = ""

    def names(self, name: str) -> tuple[str, ...]:
        return (name, *self.aliases)


# The one declaration of this file kind (bounds as the catalog's models.yaml has them).
SCHEMA: dict[str, Setting] = {
    "num_hidden_layers": Setting(count(1, 10_000), required=True, doc="decoder layers"),
    "hidden_size": Setting(count(1, 1_000_000), required=True, doc="model width"),
    "num_attention_heads": Setting(count(1, 100_000), required=True, doc="query heads"),
    "vocab_size": Setting(count(1, 100_000_000), required=True, doc="vocabulary"),
    "num_key_value_heads": Setting(count(1, 100_000),
                                   doc="KV heads; default num_attention_heads (no GQA)"),
    "head_dim": Setting(count(1, 100_000),
                        doc="head size; default hidden_size / num_attention_heads"),
    "intermediate_size": Setting(count(1, 10_000_000),
                                 doc="MLP width (Mixtral: each expert's width)"),
    "num_local_experts": Setting(count(1, 1_000_000), aliases=("num_experts",),
                                 doc="experts per layer (Mixtral; num_experts: Qwen-MoE)"),
    "num_experts_per_tok": Setting(count(1, 1_000_000), doc="experts each token uses"),
    "moe_intermediate_size": Setting(count(1, 10_000_000),
                                     doc="each expert's width (Qwen-MoE)"),
    "decoder_sparse_step": Setting(count(1, 10_000), default=1,
                                   doc="every n-th layer is sparse (Qwen-MoE); only 1 is modelled"),
    "tie_word_embeddings": Setting(Flag(), default=False,
                                   doc="embedding and LM head share one matrix"),
}
TEXT_CONFIG = "text_config"   # multimodal configs nest the language model's settings here
TEXT_CONFIG_CHECK = Mapping()
UNSUPPORTED = {"kv_lora_rank": "multi-head latent attention (DeepSeek)",
               "first_k_dense_replace": "dense and sparse layers mixed (DeepSeek)",
               "mlp_only_layers": "dense and sparse layers mixed",
               "shared_expert_intermediate_size": "shared experts (Qwen2-MoE)",
               "n_shared_experts": "shared experts (DeepSeek)"}
REQUIRED = tuple(name for name, setting in SCHEMA.items() if setting.required)


def model_from_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """The model record a config.json describes, named `name` (default: the file's stem)."""
    source = str(path)
    config = read_json(path)
    if not isinstance(config, dict):
        raise InputError("a config.json is a mapping of the model's settings", source=source)
    prefix = ""
    if TEXT_CONFIG in config:
        try:
            config = TEXT_CONFIG_CHECK(config[TEXT_CONFIG])
        except Invalid as err:
            raise InputError(f"{err} (the language model's settings, as in a multimodal "
                             "config.json); fix it, or remove the key", source=source,
                             field=TEXT_CONFIG) from None
        prefix = f"{TEXT_CONFIG}."
    for key, what in UNSUPPORTED.items():
        if config.get(key):
            raise InputError(f"{what} is not modelled; describe the model in a catalog "
                             "models.yaml instead (README: Catalog and calibration)",
                             source=source, field=prefix + key)
    values, spelled = read_settings(config, source, prefix)
    entry = _entry(values, spelled, source, prefix)
    label = name or Path(path).stem
    return parse_model(label, entry, source)


def read_settings(config: dict[str, Any], source: str,
                  prefix: str = "") -> tuple[dict[str, Any], dict[str, str]]:
    """Every setting of `SCHEMA`, checked: (name -> value or default, name -> the key the
    file spelled it with). Errors name the file and the key as written."""
    values: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for name, setting in SCHEMA.items():
        given = [key for key in setting.names(name) if config.get(key) is not None]
        if len(given) > 1:
            raise InputError(f"gives one setting twice ({' and '.join(given)}); keep one",
                             source=source, field=prefix + given[1])
        if not given:
            if setting.required:
                raise InputError(f"needs {name} ({setting.check.describe()}) as in a Hugging "
                                 "Face config.json", source=source, field=prefix + name)
            values[name], spelled[name] = setting.default, name
            continue
        key = given[0]
        try:
            values[name] = setting.check(config[key])
        except Invalid as err:
            raise InputError(str(err), source=source, field=prefix + key) from None
        spelled[name] = key
    return values, spelled


def _entry(c: dict[str, Any], spelled: dict[str, str], source: str,
           prefix: str) -> dict[str, Any]:
    def refuse(name: str, message: str) -> InputError:
        return InputError(message, source=source, field=prefix + spelled[name])

    layers, hidden, heads = c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"]
    kv_heads = c["num_key_value_heads"] if c["num_key_value_heads"] is not None else heads
    if hidden % heads:
        raise refuse("num_attention_heads", f"hidden_size {hidden} is not divisible by "
                                            f"{heads} heads")
    if heads % kv_heads:
        raise refuse("num_key_value_heads", f"{heads} attention heads are not divisible into "
                                            f"{kv_heads} KV heads")
    head_dim = c["head_dim"] if c["head_dim"] is not None else hidden // heads
    vocab = c["vocab_size"]
    experts, top_k = c["num_local_experts"], c["num_experts_per_tok"]
    if c["decoder_sparse_step"] != 1:
        raise refuse("decoder_sparse_step", "dense and sparse layers mixed is not modelled; "
                     "describe the model in a catalog models.yaml instead (README: Catalog "
                     "and calibration)")
    if experts is None and top_k is not None:
        raise refuse("num_experts_per_tok", "a mixture-of-experts config needs its number of "
                     "experts too (num_local_experts or num_experts)")
    if experts is not None and spelled["num_local_experts"] == "num_local_experts":
        expert_width = c["intermediate_size"]          # Mixtral: every MLP is the MoE
    else:
        expert_width = c["moe_intermediate_size"]
    dense_width = c["intermediate_size"]
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    embeddings = vocab * hidden * (1 if c["tie_word_embeddings"] else 2)
    entry: dict[str, Any] = {"layers": layers, "hidden": hidden, "heads": heads,
                             "kv_heads": kv_heads, "vocab_size": vocab,
                             "bytes_per_value": 2,   # served in bf16; --dtype fp8 halves it
                             "source": "Hugging Face config.json; parameters from the shapes"}
    if head_dim != hidden // heads:
        entry["head_dim"] = head_dim
    if experts is not None:
        if not (top_k and expert_width):
            raise InputError("a mixture-of-experts config needs num_experts_per_tok and the "
                             "experts' width (intermediate_size or moe_intermediate_size)",
                             source=source, field=prefix + "num_experts_per_tok")
        if top_k > experts:
            raise refuse("num_experts_per_tok", f"{top_k} active experts of {experts}")
        per_expert = 3 * hidden * expert_width
        router = hidden * experts
        total = embeddings + layers * (attention + router + experts * per_expert)
        active = embeddings + layers * (attention + router + top_k * per_expert)
        entry.update(experts=experts, experts_per_token=top_k,
                     expert_intermediate_size=expert_width,
                     intermediate_size=dense_width or expert_width,
                     params_b=round(total / 1e9, 3), active_params_b=round(active / 1e9, 3))
    else:
        if not dense_width:
            raise InputError("needs intermediate_size (the MLP width)", source=source,
                             field=prefix + "intermediate_size")
        mlp = 3 * hidden * dense_width
        entry.update(intermediate_size=dense_width,
                     params_b=round((embeddings + layers * (attention + mlp)) / 1e9, 3))
    return entry
