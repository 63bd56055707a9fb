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
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hardware_catalog import InputError, ModelSpec, parse_model, read_json

REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
UNSUPPORTED = {"kv_lora_rank": "multi-head latent attention (DeepSeek)",
               "first_k_dense_replace": "dense and sparse layers mixed (DeepSeek)",
               "mlp_only_layers": "dense and sparse layers mixed"}


def model_from_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """The model record a config.json describes, named `name` (default: the file's stem)."""
    source = str(path)
    config = read_json(path)
    if not isinstance(config, dict):
        raise InputError("a config.json is a mapping of the model's settings", source=source)
    config = config.get("text_config", config)   # multimodal configs nest the language model
    for key in REQUIRED:
        if not isinstance(config.get(key), int) or isinstance(config.get(key), bool):
            raise InputError(f"needs {key} (a whole number) as in a Hugging Face config.json",
                             source=source, field=key)
    for key, what in UNSUPPORTED.items():
        if config.get(key):
            raise InputError(f"{what} is not modelled; describe the model in a catalog "
                             "models.yaml instead (README: Catalog and calibration)",
                             source=source, field=key)
    entry = _entry(config, source)
    label = name or Path(path).stem
    return parse_model(label, entry, source)


def _entry(c: dict[str, Any], source: str) -> dict[str, Any]:
    layers, hidden, heads = c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or hidden // heads
    vocab = c["vocab_size"]
    experts = c.get("num_local_experts") or c.get("num_experts")
    top_k = c.get("num_experts_per_tok")
    if experts and c.get("num_local_experts"):
        expert_width = c.get("intermediate_size")          # Mixtral: every MLP is the MoE
    else:
        expert_width = c.get("moe_intermediate_size")
    dense_width = c.get("intermediate_size")
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    embeddings = vocab * hidden * (1 if c.get("tie_word_embeddings") else 2)
    entry: dict[str, Any] = {"layers": layers, "hidden": hidden, "heads": heads,
                             "kv_heads": kv_heads, "vocab_size": vocab,
                             "bytes_per_value": 2,   # served in bf16; --dtype fp8 halves it
                             "source": "Hugging Face config.json; parameters from the shapes"}
    if head_dim != hidden // heads:
        entry["head_dim"] = head_dim
    if experts:
        if not (top_k and expert_width):
            raise InputError("a mixture-of-experts config needs num_experts_per_tok and the "
                             "experts' width (intermediate_size or moe_intermediate_size)",
                             source=source, field="num_experts_per_tok")
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
                             field="intermediate_size")
        mlp = 3 * hidden * dense_width
        entry.update(intermediate_size=dense_width,
                     params_b=round((embeddings + layers * (attention + mlp)) / 1e9, 3))
    return entry
