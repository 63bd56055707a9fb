"""A model record from a Hugging Face `config.json` (`--model-config`): bring your own model.

The shapes map one to one (num_hidden_layers, hidden_size, num_attention_heads,
num_key_value_heads, intermediate_size, vocab_size, head_dim); mixture-of-experts models take
their experts from the two common spellings (Mixtral: num_local_experts and intermediate_size;
Qwen-MoE: num_experts and moe_intermediate_size, every layer sparse), with num_experts_per_tok.
DeepSeek-V3/R1 and Kimi-K2 (issue 36) spell their experts n_routed_experts with
moe_intermediate_size, add n_shared_experts and first_k_dense_replace dense layers, and use
multi-head latent attention (kv_lora_rank, q_lora_rank, qk_rope_head_dim, qk_nope_head_dim,
v_head_dim); gpt-oss names each layer's attention in layer_types (sliding_attention with
sliding_window, or full_attention) and has attention sinks (model_type gpt_oss).
Parameters are counted from the shapes (`parameters`): embedding and LM head (one matrix when
the embeddings are tied), per layer the attention projections (MLA's latent ones) and the MLP
(gate, up and down), or the router, every expert and the shared ones (active: the top-k
experts and the shared ones); norms and biases are left out (under 0.1%). The result goes through the catalog's own checks (`parse_model`), so a config that
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
from hardware_catalog.checks import Flag, Invalid, Mapping, Text, count

LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True)
class LayerTypes:
    """A list naming each layer's attention: full_attention or sliding_attention."""

    def __call__(self, value: Any) -> tuple[str, ...]:
        if (not isinstance(value, list) or not value
                or any(v not in LAYER_TYPES for v in value)):
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:60] + "..."
            raise Invalid(f"must be {self.describe()}, got {shown}")
        return tuple(value)

    def describe(self) -> str:
        return f"a list of {' or '.join(LAYER_TYPES)}, one per layer"


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
    "num_local_experts": Setting(count(1, 1_000_000), aliases=("num_experts", "n_routed_experts"),
                                 doc="experts per layer (Mixtral, gpt-oss; num_experts: "
                                     "Qwen-MoE; n_routed_experts: DeepSeek, Kimi)"),
    "num_experts_per_tok": Setting(count(1, 1_000_000), doc="experts each token uses"),
    "moe_intermediate_size": Setting(count(1, 10_000_000),
                                     doc="each expert's width (Qwen-MoE)"),
    "decoder_sparse_step": Setting(count(1, 10_000), default=1,
                                   doc="every n-th layer is sparse (Qwen-MoE); only 1 is modelled"),
    "tie_word_embeddings": Setting(Flag(), default=False,
                                   doc="embedding and LM head share one matrix"),
    # DeepSeek-V3/R1, Kimi-K2 (issue 36)
    "n_shared_experts": Setting(count(1, 1_000),
                                doc="shared experts every token uses, moe_intermediate_size wide"),
    "first_k_dense_replace": Setting(count(0, 10_000), default=0,
                                     doc="the first layers have a dense MLP (intermediate_size)"),
    "moe_layer_freq": Setting(count(1, 10_000), default=1,
                              doc="every n-th layer after the dense ones is sparse; only 1"),
    "kv_lora_rank": Setting(count(1, 1_000_000), doc="MLA: the cached KV latent's width"),
    "q_lora_rank": Setting(count(1, 1_000_000), doc="MLA: the query latent (null: none)"),
    "qk_rope_head_dim": Setting(count(1, 100_000), doc="MLA: rotary key/query dims (cached)"),
    "qk_nope_head_dim": Setting(count(1, 100_000), doc="MLA: the other key/query dims"),
    "v_head_dim": Setting(count(1, 100_000), doc="MLA: a value head's width"),
    # gpt-oss: alternating sliding-window and full attention, attention sinks
    "sliding_window": Setting(count(1, 100_000_000),
                              doc="tokens a sliding-window layer attends to"),
    "use_sliding_window": Setting(Flag(), default=None,
                                  doc="false: sliding_window is not used (Qwen3)"),
    "layer_types": Setting(LayerTypes(), doc="per layer sliding_attention or full_attention"),
    "model_type": Setting(Text(), doc="gpt_oss: attention sinks (one learned logit per head)"),
}
TEXT_CONFIG = "text_config"   # multimodal configs nest the language model's settings here
TEXT_CONFIG_CHECK = Mapping()
UNSUPPORTED = {"mlp_only_layers": "dense and sparse layers mixed",
               "shared_expert_intermediate_size": "shared experts (Qwen2-MoE)"}
MLA = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
SINK_MODEL_TYPES = ("gpt_oss",)
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
                             "models.yaml instead (docs/designs-and-hardware.md: Catalog and calibration)",
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
    if hidden % heads and c["head_dim"] is None:
        raise refuse("num_attention_heads", f"hidden_size {hidden} is not divisible by "
                                            f"{heads} heads")
    if heads % kv_heads:
        raise refuse("num_key_value_heads", f"{heads} attention heads are not divisible into "
                                            f"{kv_heads} KV heads")
    head_dim = c["head_dim"] if c["head_dim"] is not None else hidden // heads
    vocab = c["vocab_size"]
    experts, top_k = c["num_local_experts"], c["num_experts_per_tok"]
    for name in ("decoder_sparse_step", "moe_layer_freq"):
        if c[name] != 1:
            raise refuse(name, "dense and sparse layers interleaved is not modelled; "
                         "describe the model in a catalog models.yaml instead (docs/designs-and-hardware.md: "
                         "Catalog and calibration)")
    if experts is None and top_k is not None:
        raise refuse("num_experts_per_tok", "a mixture-of-experts config needs its number of "
                     "experts too (num_local_experts, num_experts or n_routed_experts)")
    for name in ("n_shared_experts", "first_k_dense_replace"):
        if c[name] and experts is None:
            raise refuse(name, f"{name} belongs to a mixture-of-experts config; give its "
                         "experts (num_local_experts, num_experts or n_routed_experts)")
    if experts is not None and spelled["num_local_experts"] == "num_local_experts":
        expert_width = c["intermediate_size"]          # Mixtral, gpt-oss: every MLP is the MoE
    else:
        expert_width = c["moe_intermediate_size"]
    dense_width = c["intermediate_size"]
    mla = [name for name in MLA if c[name] is not None]
    if mla and len(mla) != len(MLA):
        missing = next(name for name in MLA if name not in mla)
        raise refuse(missing, f"multi-head latent attention needs {', '.join(MLA)}")
    entry: dict[str, Any] = {"layers": layers, "hidden": hidden, "heads": heads,
                             "kv_heads": kv_heads, "vocab_size": vocab,
                             "bytes_per_value": 2,   # served in bf16; --dtype fp8 halves it
                             "source": "Hugging Face config.json; parameters from the shapes"}
    if head_dim != hidden // heads or hidden % heads:
        entry["head_dim"] = head_dim
    if mla:
        entry.update({"kv_lora_rank": c["kv_lora_rank"],
                      "qk_rope_head_dim": c["qk_rope_head_dim"],
                      "qk_nope_head_dim": c["qk_nope_head_dim"], "v_head_dim": c["v_head_dim"]})
        if c["q_lora_rank"] is not None:
            entry["q_lora_rank"] = c["q_lora_rank"]
    sliding = _sliding(c, layers, refuse)
    if sliding:
        entry.update(sliding_window=c["sliding_window"], sliding_layers=sliding)
    if c["model_type"] in SINK_MODEL_TYPES:
        entry["attention_sinks"] = True
    if experts is not None:
        if not (top_k and expert_width):
            raise InputError("a mixture-of-experts config needs num_experts_per_tok and the "
                             "experts' width (intermediate_size or moe_intermediate_size)",
                             source=source, field=prefix + "num_experts_per_tok")
        if top_k > experts:
            raise refuse("num_experts_per_tok", f"{top_k} active experts of {experts}")
        dense = c["first_k_dense_replace"]
        if dense >= layers:
            raise refuse("first_k_dense_replace", f"{dense} dense layers of {layers}")
        if dense and not dense_width:
            raise refuse("first_k_dense_replace", "dense layers need intermediate_size")
        entry.update(experts=experts, experts_per_token=top_k,
                     expert_intermediate_size=expert_width,
                     intermediate_size=dense_width or expert_width)
        if c["n_shared_experts"]:
            entry["shared_experts"] = c["n_shared_experts"]
        if dense:
            entry["dense_layers"] = dense
    elif not dense_width:
        raise InputError("needs intermediate_size (the MLP width)", source=source,
                         field=prefix + "intermediate_size")
    else:
        entry["intermediate_size"] = dense_width
    total, active = parameters(entry, tied=c["tie_word_embeddings"])
    entry["params_b"] = round(total / 1e9, 3)
    if experts is not None:
        entry["active_params_b"] = round(active / 1e9, 3)
    return entry


def _sliding(c: dict[str, Any], layers: int, refuse) -> int:
    """How many layers use the sliding window (0: none): those layer_types names (gpt-oss
    alternates them). A sliding_window without layer_types (Mistral-7B-v0.1: every layer; Qwen3:
    turned off by use_sliding_window) is not modelled: every layer's KV is counted in full, an
    upper bound."""
    window, types = c["sliding_window"], c["layer_types"]
    if types is None:
        return 0
    if len(types) != layers:
        raise refuse("layer_types", f"names {len(types)} layers of {layers}")
    sliding = sum(1 for t in types if t == "sliding_attention")
    if sliding and (window is None or c["use_sliding_window"] is False):
        raise refuse("layer_types", "sliding_attention layers need sliding_window")
    if sliding == layers:
        raise refuse("layer_types", "every layer slides; at least one full_attention layer "
                     "is modelled (describe the model in a catalog models.yaml instead)")
    return sliding


def parameters(e: dict[str, Any], tied: bool = False) -> tuple[float, float]:
    """(total, active per token) parameters of a model entry from its shapes: embedding and
    LM head (one matrix when tied), per layer the attention projections (Q, K, V, O; MLA: the
    query latent down and up, the KV latent down with the rotary key, the KV up projection and
    the output), the dense MLP (gate, up, down) of dense layers, and of MoE layers the router,
    every routed expert and the shared experts (active: top-k routed and the shared ones).
    Norms, biases and sinks are left out (under 0.1%); so is DeepSeek's multi-token-prediction
    layer (num_nextn_predict_layers: loaded only for speculative decoding)."""
    h, heads, layers = e["hidden"], e["heads"], e["layers"]
    d = e.get("head_dim") or h // heads
    if e.get("kv_lora_rank"):
        rope, nope, v = e["qk_rope_head_dim"], e["qk_nope_head_dim"], e["v_head_dim"]
        q = (h * e["q_lora_rank"] + e["q_lora_rank"] * heads * (nope + rope)
             if e.get("q_lora_rank") else h * heads * (nope + rope))
        attention = (q + h * (e["kv_lora_rank"] + rope) + e["kv_lora_rank"] * heads * (nope + v)
                     + heads * v * h)
    else:
        attention = 2 * h * heads * d + 2 * h * e["kv_heads"] * d
    embeddings = e["vocab_size"] * h * (1 if tied else 2)
    if not e.get("experts"):
        total = embeddings + layers * (attention + 3 * h * e["intermediate_size"])
        return total, total
    dense = e.get("dense_layers", 0)
    per_expert = 3 * h * e["expert_intermediate_size"]
    shared = e.get("shared_experts", 0) * per_expert
    router = h * e["experts"]
    common = embeddings + layers * attention + dense * 3 * h * e["intermediate_size"]
    sparse = layers - dense
    total = common + sparse * (router + e["experts"] * per_expert + shared)
    active = common + sparse * (router + e["experts_per_token"] * per_expert + shared)
    return total, active
