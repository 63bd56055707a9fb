"""Hardware catalog: machine SKUs, models and cluster designs as typed, immutable records.

The YAML files beside this module are the data; `load_catalog()` validates them once and
everything downstream trusts the records it returns.
"""
from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import yaml

from hardware_catalog.checks import (CHUNK_TOKENS_MAX, CHUNK_TOKENS_MIN, Flag, Invalid, Number,
                                     OneOf, Text)
from hardware_catalog.errors import InputError, option_ref

DATA_DIR = Path(__file__).resolve().parent

__all__ = ["InputError", "MachineSku", "ModelSpec", "Layout", "Pool", "Design", "Catalog",
           "load_catalog",
           "read_yaml", "read_json", "read_text", "check_path"]

# Sane ranges of input files (issue: bad input). Beyond them a file is not what it claims.
MAX_FILE_BYTES = 512 * 1024 * 1024   # any input file (a 5-million-request trace is ~200 MB)
MAX_DOCUMENT_DEPTH = 32              # nesting of a YAML/JSON document (ours need 5)
MAX_DOCUMENT_NODES = 2_000_000       # values in a YAML/JSON document (aliases counted each time)
# Sane ranges of catalog numbers: a machine has at most this many GPUs (a model's tensor
# parallelism too); the other fields' ranges are written where they are read.
MAX_GPUS = 1024
MAX_INSTANCE_TP = 8   # MachineSku.instance_tp


@dataclass(frozen=True)
class MachineSku:
    """One machine (e.g. a DGX with 8 GPUs). Per-GPU figures except cost and power."""
    name: str
    gpu: str
    gpus: int
    hbm_gib: float             # per GPU, as the driver reports it (nvidia-smi MiB / 1024)
    hbm_bandwidth_gbs: float
    fp16_tflops: float
    gpu_power_w: float
    cost_per_hour: float
    kv_link_gbps: float
    kv_layerwise_visible_ms: float
    perf_profile: str
    calibrated: bool
    power_cap: float = 1.0
    prompt_slowdown: float = 1.0
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def power_kw(self) -> float:
        """Provisioned power: GPUs x TDP x cap (the paper's Table V normalisation)."""
        return self.gpus * self.gpu_power_w * self.power_cap / 1000.0

    @property
    def hbm_bytes(self) -> float:
        return self.gpus * self.hbm_gib * 2**30

    @property
    def instance_tp(self) -> int:
        """Tensor parallelism of a whole-machine instance (a design whose layout is not given,
        the largest TP a search tries): every GPU of a machine of up to MAX_INSTANCE_TP GPUs;
        on a larger one (a 72-GPU NVL72 rack) the largest TP of at most MAX_INSTANCE_TP that
        divides its GPUs: the kernel data measure all-reduce over 2 to 8 GPUs, and a rack's
        larger groups are expert-parallel."""
        if self.gpus <= MAX_INSTANCE_TP:
            return self.gpus
        return max(t for t in range(1, MAX_INSTANCE_TP + 1) if self.gpus % t == 0)

    @property
    def kv_link_bytes_per_s(self) -> float:
        """Machine-to-machine KV bandwidth: every GPU sends its tensor-parallel shard on its own link."""
        return self.gpus * self.kv_link_gbps * 1e9 / 8.0

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "gpu": self.gpu, "gpus": self.gpus, "hbm_gib": self.hbm_gib,
                "hbm_bandwidth_gbs": self.hbm_bandwidth_gbs, "fp16_tflops": self.fp16_tflops,
                "gpu_power_w": self.gpu_power_w, "power_cap": self.power_cap,
                "power_kw": round(self.power_kw, 6), "cost_per_hour": self.cost_per_hour,
                "kv_link_gbps": self.kv_link_gbps,
                "kv_layerwise_visible_ms": self.kv_layerwise_visible_ms,
                "prompt_slowdown": self.prompt_slowdown, "perf_profile": self.perf_profile,
                "calibrated": self.calibrated}

    def identity(self) -> dict[str, Any]:
        """What changes a simulation on this machine: its record without the price (prices
        are recomputed from the current catalog on every read)."""
        record = self.as_dict()
        record.pop("cost_per_hour")
        return record


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    params_b: float
    bytes_per_value: int
    active_params_b: float | None = None
    perf_profile: str | None = None
    source: str = ""
    weights_bytes: float | None = None   # stated weight size; None: parameters x bytes per value
    # GEMM shapes of the kernel-level model (simcore.kernels); None where a catalog omits them
    intermediate_size: int | None = None  # MLP width (of the dense MLP; MoE: see expert_*)
    vocab_size: int | None = None
    head_dim_size: int | None = None      # the config's head_dim when it is not hidden / heads
    mlp_gated: bool = True                # gated MLP (gate, up, down) or plain (up, down)
    experts: int | None = None            # routed experts per MoE layer (None: dense)
    experts_per_token: int | None = None
    expert_intermediate_size: int | None = None
    kv_bytes_per_value: int | None = None  # the KV cache's (--kv-dtype); None: bytes_per_value
    # issue 36: DeepSeek-style models (None / 0 / False: not this kind of model)
    shared_experts: int | None = None     # n_shared_experts, each expert_intermediate_size wide
    dense_layers: int = 0                 # first_k_dense_replace: the first layers' dense MLP
    kv_lora_rank: int | None = None       # multi-head latent attention (MLA): the KV latent
    q_lora_rank: int | None = None        # MLA's query latent (None: a full query projection)
    qk_rope_head_dim: int | None = None   # MLA: rotary part of a query/key head (cached too)
    qk_nope_head_dim: int | None = None   # MLA: the rest of a query/key head
    v_head_dim: int | None = None         # MLA: a value head
    sliding_window: int | None = None     # tokens a sliding-window layer attends to (gpt-oss)
    sliding_layers: int = 0               # how many layers use the window (the rest: full)
    attention_sinks: bool = False         # a learned sink logit per head (gpt-oss): no KV
    hf_id: str | None = None              # Hugging Face repository (`provision export` loads it)
    context_tokens: int | None = None     # the longest sequence (max_position_embeddings)

    @property
    def head_dim(self) -> int:
        return self.head_dim_size if self.head_dim_size is not None else self.hidden // self.heads

    @property
    def is_moe(self) -> bool:
        return self.experts is not None

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is the MoE block (the first `dense_layers` are dense)."""
        return (self.layers - self.dense_layers) if self.is_moe else 0

    @property
    def _kv_value_bytes(self) -> int:
        return (self.bytes_per_value if self.kv_bytes_per_value is None
                else self.kv_bytes_per_value)

    @property
    def kv_bytes_per_layer_token(self) -> int:
        """One token's KV in one layer: K and V of the KV heads (grouped-query attention
        stores kv_heads heads, not heads), or MLA's compressed latent (kv_lora_rank values)
        and its rotary key (qk_rope_head_dim values), one vector for all heads."""
        if self.is_mla:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * self._kv_value_bytes
        return 2 * self.kv_heads * self.head_dim * self._kv_value_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes every token holds for as long as its request runs: every layer's, except
        the sliding-window layers' (they hold at most `sliding_window` tokens per request;
        `kv_bytes` counts them)."""
        return (self.layers - self.sliding_layers) * self.kv_bytes_per_layer_token

    @property
    def window_kv_bytes(self) -> int:
        """The most KV one request holds in the sliding-window layers (0: none)."""
        if not self.sliding_layers:
            return 0
        return self.sliding_layers * self.sliding_window * self.kv_bytes_per_layer_token

    def kv_bytes(self, context: int) -> int:
        """KV bytes of one request holding `context` tokens: every full-attention layer holds
        them all, a sliding-window layer min(context, window)."""
        window = (self.sliding_layers * min(context, self.sliding_window)
                  if self.sliding_layers else 0)
        return self.kv_bytes_per_token * context + window * self.kv_bytes_per_layer_token

    @property
    def weight_bytes(self) -> float:
        if self.weights_bytes is not None:
            return self.weights_bytes
        return self.params_b * 1e9 * self.bytes_per_value

    @property
    def routed_expert_params_b(self) -> float:
        """Billions of parameters in the routed experts (0 for a dense model): what expert
        parallelism divides; the rest (attention, shared experts, dense layers, embeddings)
        is held by every attention rank."""
        if not self.is_moe:
            return 0.0
        matrices = 3 if self.mlp_gated else 2
        return (self.moe_layers * self.experts * matrices * self.hidden
                * self.expert_intermediate_size) / 1e9

    @property
    def expert_weight_bytes(self) -> float:
        """Bytes of the routed experts: their share of the parameters, of the weight bytes (so
        a stated size, e.g. gpt-oss's MXFP4 experts, is divided alike)."""
        if not self.is_moe or not self.params_b:
            return 0.0
        return self.weight_bytes * min(1.0, self.routed_expert_params_b / self.params_b)

    @property
    def flops_params_b(self) -> float:
        """Parameters touched per token (all of them, or the active experts of a MoE)."""
        return self.active_params_b if self.active_params_b is not None else self.params_b

    def as_dict(self) -> dict[str, Any]:
        record = {"name": self.name, "layers": self.layers, "hidden": self.hidden,
                  "heads": self.heads, "kv_heads": self.kv_heads, "params_b": self.params_b,
                  "active_params_b": self.active_params_b,
                  "bytes_per_value": self.bytes_per_value,
                  "kv_bytes_per_token": self.kv_bytes_per_token, "perf_profile": self.perf_profile}
        # the issue-36 fields only where a model has them (older records echo as they did)
        for key in _NEW_MODEL_FIELDS:
            value = getattr(self, key)
            if value not in (None, 0, False):
                record[key] = value
        if self.sliding_layers:
            record["window_kv_bytes"] = self.window_kv_bytes
        return record


_NEW_MODEL_FIELDS = ("shared_experts", "dense_layers", "kv_lora_rank", "q_lora_rank",
                     "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "sliding_window",
                     "sliding_layers", "attention_sinks")


@dataclass(frozen=True, order=True)
class Layout:
    """How one pool's machines run the model.

    Dense layers (and a mixture of experts whose experts split like dense columns, `ep` = 1):
    instances of `tp` GPUs of one machine (tensor parallel), each spanning `pp` machines
    (pipeline stages, for a model one machine cannot hold). A machine of G GPUs holds G / tp
    instances; a pool of N machines, (N // pp) x G / tp.

    Expert parallelism (`ep` > 1, issue 36): the MoE layers' experts are spread over an
    expert-parallel group of `ep` GPUs (each holds experts / ep of them, whole), and attention
    runs on `dp` = ep / tp ranks of `tp` GPUs each: `dp` = 1 is tensor-parallel attention
    over the group (the "TEP" layout engines offer), `dp` > 1 data-parallel attention (DP
    attention, "DEP"), every rank with its own requests and KV cache. The simulators see each
    attention rank as an instance; a group spans ep / G machines when it is larger than one
    machine (an NVLink domain: 8 GPUs of an HGX machine, 72 of an NVL72 rack), and a machine
    holds G // ep groups when it is smaller (GPUs left over stay idle)."""
    tp: int
    pp: int = 1
    ep: int = 1
    dp: int = 1

    def __post_init__(self):
        for name in ("tp", "pp", "ep", "dp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_GPUS:
                raise InputError(f"{name} must be a whole number from 1 to {MAX_GPUS}, "
                                 f"got {value!r}")
        if self.ep > 1 and (self.pp > 1 or self.tp * self.dp != self.ep):
            raise InputError(f"an expert-parallel layout runs EP {self.ep} as TP x DP ranks "
                             f"without a pipeline; got TP {self.tp}, DP {self.dp}, PP {self.pp}")
        if self.ep == 1 and self.dp > 1:
            raise InputError("data-parallel attention (DP > 1) needs expert parallelism (EP > 1)")

    @property
    def is_expert_parallel(self) -> bool:
        return self.ep > 1

    @property
    def gpus(self) -> int:
        """GPUs of one instance (one attention rank of an expert-parallel group)."""
        return self.tp * self.pp

    def span(self, machine: "MachineSku") -> int:
        """Machines one group spans: the pipeline's stages, or an expert-parallel group
        larger than one machine."""
        if self.ep > 1:
            return max(1, -(-self.ep // machine.gpus))
        return self.pp

    def instances_per_span(self, machine: "MachineSku") -> int:
        """Instances on the `span` machines of one group (several groups on one machine
        when a group is smaller than it)."""
        if self.ep > 1:
            if self.ep >= machine.gpus:
                return self.dp
            return (machine.gpus // self.ep) * self.dp
        return machine.gpus // self.tp

    def instances_per_machine(self, machine: "MachineSku") -> int:
        """Instances per machine (per group of `span` machines when a group spans several)."""
        return self.instances_per_span(machine)

    def instances(self, machine: "MachineSku", machines: int) -> int:
        return (machines // self.span(machine)) * self.instances_per_span(machine)

    def problem(self, machine: "MachineSku") -> str:
        """Why the layout cannot run on the machine ("" when it can)."""
        if machine.gpus % self.tp:
            return (f"TP {self.tp} does not divide the {machine.gpus} GPUs of "
                    f"'{machine.name}'")
        if self.ep > machine.gpus and self.ep % machine.gpus:
            return (f"EP {self.ep} is not a whole number of '{machine.name}' machines "
                    f"({machine.gpus} GPUs each)")
        return ""

    @property
    def label(self) -> str:
        """TP8, TP4xPP2; an expert-parallel layout names its attention, then its experts:
        TP8/EP8 (tensor-parallel attention), DP32/EP32 (data-parallel attention of one GPU
        per rank), TP2xDP8/EP16."""
        if self.ep > 1:
            attention = (f"TP{self.tp}" if self.dp == 1 else
                         f"DP{self.dp}" if self.tp == 1 else f"TP{self.tp}xDP{self.dp}")
            return f"{attention}/EP{self.ep}"
        return f"TP{self.tp}" + (f"xPP{self.pp}" if self.pp > 1 else "")

    def as_dict(self) -> dict[str, int]:
        record = {"tp": self.tp, "pp": self.pp}
        if self.ep > 1:   # dense layouts echo as they always did
            record.update(ep=self.ep, dp=self.dp)
        return record


PREFILL_POLICIES = ("whole", "chunked")
RESERVED_DESIGN_CHARACTERS = "/@"   # PROMPT_SKU/TOKEN_SKU names, NAME@BUDGET variants
DEFAULT_CHUNK_TOKENS = 512  # Sarathi-Serve's budget for strict SLOs (2048 for relaxed ones)


POOL_ROLES = ("prompt", "token", "mixed")


@dataclass(frozen=True)
class Pool:
    """One pool of a design's machines, as code asks about it (`Design.pools`): its role
    ("prompt" or "token": a Splitwise pool, each running its phase; "mixed": a colocated
    design's one pool, every machine running both phases), its SKU and its layout (None: not
    chosen yet)."""
    role: str
    sku: MachineSku
    layout: Layout | None = None

    def __post_init__(self):
        if self.role not in POOL_ROLES:
            raise ValueError(f"pool role must be one of {', '.join(POOL_ROLES)}, "
                             f"got {self.role!r}")

    @property
    def is_mixed(self) -> bool:
        return self.role == "mixed"

    @property
    def label(self) -> str:
        """The pool's name in reports: its role, "pool" for a colocated design's one."""
        return "pool" if self.is_mixed else self.role

    @property
    def size_option(self) -> str:
        """The option that sizes it: --machines for a colocated pool, else --prompt/--token."""
        return "machines" if self.is_mixed else self.role

    @property
    def phrase(self) -> str:
        """The pool in a sentence: "the pool", "the prompt pool"."""
        return "the pool" if self.is_mixed else f"the {self.role} pool"

    @property
    def size_key(self) -> str:
        """Its size in report.json: "machines" (colocated), "prompt_machines", "token_machines"."""
        return "machines" if self.is_mixed else f"{self.role}_machines"

    def count_text(self, machines: int) -> str:
        """`machines` of its SKU in a sentence: "12 x dgx-h100" (colocated), "3 dgx-h100
        prompt"."""
        return (f"{machines} x {self.sku.name}" if self.is_mixed
                else f"{machines} {self.sku.name} {self.role}")


@dataclass(frozen=True)
class Design:
    """A cluster design: a baseline (one pool, token None) or a Splitwise prompt/token split.

    It holds its machine records, so whoever has a design has everything needed to price and
    simulate it; no name is looked up again downstream. `prefill` is the batching policy of
    the machines that run both phases (baseline machines, Splitwise mixed-pool machines):
    "whole" prompts in mixed batches (a long prompt stalls the running decodes), or "chunked"
    (Sarathi-Serve stall-free batching: at most `chunk_tokens` prompt tokens per iteration,
    every running decode in every iteration).
    """
    name: str
    prompt: MachineSku
    token: MachineSku | None = None
    mixed_pool: bool = True
    prefill: str = "whole"
    chunk_tokens: int | None = None   # chunked only; DEFAULT_CHUNK_TOKENS when not given
    # the pools' layouts (a baseline's one pool: prompt_layout); None: not chosen yet (the
    # search chooses, a simulation takes the whole machine: `simcore.layout.default_layout`)
    prompt_layout: Layout | None = None
    token_layout: Layout | None = None

    def __post_init__(self):
        for role, machine in (("prompt", self.prompt), ("token", self.token)):
            if machine is not None and not isinstance(machine, MachineSku):
                raise TypeError(f"design '{self.name}': {role} must be a MachineSku record "
                                f"(catalog.machine(name)), got {machine!r}")
        if self.prefill not in PREFILL_POLICIES:
            raise InputError(f"design '{self.name}': prefill must be one of "
                             f"{', '.join(PREFILL_POLICIES)}, got {self.prefill!r}")
        if self.prefill == "whole" and self.chunk_tokens is not None:
            raise InputError(f"design '{self.name}': chunk_tokens applies to prefill: chunked")
        if self.prefill == "chunked":
            if self.chunk_tokens is None:
                object.__setattr__(self, "chunk_tokens", DEFAULT_CHUNK_TOKENS)
            if (isinstance(self.chunk_tokens, bool) or not isinstance(self.chunk_tokens, int)
                    or self.chunk_tokens < 1):
                raise InputError(f"design '{self.name}': chunk_tokens must be a whole number "
                                 f">= 1, got {self.chunk_tokens!r}")

    @property
    def is_chunked(self) -> bool:
        return self.prefill == "chunked"

    @property
    def is_baseline(self) -> bool:
        return self.token is None

    @property
    def prompt_sku(self) -> str:
        return self.prompt.name

    @property
    def token_sku(self) -> str | None:
        return self.token.name if self.token is not None else None

    def with_layouts(self, prompt: Layout | None, token: Layout | None = None) -> "Design":
        """The same design with its pools' layouts set (a baseline takes `prompt` only)."""
        from dataclasses import replace
        return replace(self, prompt_layout=prompt,
                       token_layout=None if self.is_baseline else token)

    @property
    def pools(self) -> tuple[Pool, ...]:
        """Its pools: a colocated design's one ("mixed"), or the prompt pool, then the token
        pool."""
        if self.token is None:
            return (Pool("mixed", self.prompt, self.prompt_layout),)
        return (Pool("prompt", self.prompt, self.prompt_layout),
                Pool("token", self.token, self.token_layout))

    @property
    def layouts(self) -> tuple[Layout | None, ...]:
        """The layout of each pool: (prompt,) for a baseline, (prompt, token) otherwise."""
        return tuple(pool.layout for pool in self.pools)

    def machines(self) -> tuple[MachineSku, ...]:
        """The distinct machine records of the design (prompt first)."""
        return (self.prompt,) if self.token is None else tuple(dict.fromkeys((self.prompt,
                                                                              self.token)))

    def _sum(self, attr: str, prompt: int, token: int) -> float:
        total = prompt * getattr(self.prompt, attr)
        return total + (token * getattr(self.token, attr) if self.token is not None else 0)

    def cost_per_hour(self, prompt: int, token: int = 0) -> float:
        return self._sum("cost_per_hour", prompt, token)

    def power_kw(self, prompt: int, token: int = 0) -> float:
        return self._sum("power_kw", prompt, token)

    def gpus(self, prompt: int, token: int = 0) -> int:
        return int(self._sum("gpus", prompt, token))

    def as_dict(self) -> dict[str, Any]:
        """The design as reports echo it (the prefill keys only for chunked designs, so the
        echo of a whole-prompt design is what it always was)."""
        record = {"name": self.name, "prompt_sku": self.prompt_sku, "token_sku": self.token_sku,
                  "mixed_pool": self.mixed_pool if not self.is_baseline else False}
        if self.is_chunked:
            record.update(prefill=self.prefill, chunk_tokens=self.chunk_tokens)
        if self.prompt_layout is not None:
            record["prompt_layout"] = self.prompt_layout.as_dict()
        if self.token_layout is not None:
            record["token_layout"] = self.token_layout.as_dict()
        return record

    def pool(self, role: str) -> Pool | None:
        """Its pool of `role` ("prompt", "token" or "mixed"), None when it has none."""
        return next((pool for pool in self.pools if pool.role == role), None)

    @property
    def lends_work(self) -> bool:
        """Splitwise pools that lend each other work (the mixed pool); colocated: False."""
        return self.token is not None and self.mixed_pool

    def each_pool(self, machines: int) -> tuple[int, int]:
        """`machines` in every pool, as (prompt, token) counts: (N, 0) colocated."""
        return machines, (machines if self.token is not None else 0)

    def counts(self, prompt: int, token: int = 0) -> tuple[tuple[Pool, int], ...]:
        """A cluster's machines per pool, in `pools` order: the token count is dropped for a
        colocated design (its one pool holds `prompt` machines)."""
        return tuple(zip(self.pools, (prompt, token)))

    def pool_sizes(self, prompt: int, token: int = 0) -> dict[str, int]:
        """A cluster's pools as report.json keys them: {"machines": N} (colocated) or
        {"prompt_machines": P, "token_machines": T}."""
        return {pool.size_key: n for pool, n in self.counts(prompt, token)}

    def pools_text(self, prompt: int, token: int = 0, form: str = "short") -> str:
        """A cluster's pools in words, in one of three forms: "short" ("12", "3P+9T"),
        "machines" ("12 machines", "3P+9T") and "skus" ("12 x dgx-h100", "3 dgx-h100 prompt
        + 9 dgx-a100 token")."""
        counts = self.counts(prompt, token)
        if form == "skus":
            return " + ".join(pool.count_text(n) for pool, n in counts)
        if counts[0][0].is_mixed:
            return f"{prompt} machines" if form == "machines" else f"{prompt}"
        return "+".join(f"{n}{pool.role[0].upper()}" for pool, n in counts)


@dataclass(frozen=True)
class Catalog:
    machines: Mapping[str, MachineSku]
    models: Mapping[str, ModelSpec]
    designs: Mapping[str, Design]

    def __repr__(self) -> str:  # names only: every record's fields run to tens of KB
        return (f"Catalog(machines={list(self.machines)}, models={list(self.models)}, "
                f"designs={list(self.designs)})")

    def machine(self, name: str) -> MachineSku:
        return _lookup(self.machines, name, "machine SKU")

    def model(self, name: str) -> ModelSpec:
        return _lookup(self.models, name, "model")

    def design(self, name: str) -> Design:
        return _lookup(self.designs, name, "design")

    def with_designs(self, extra: Mapping[str, Design]) -> "Catalog":
        """This catalog plus more design records (a custom design may not take a catalog
        name, even to define the same design: one name, one design)."""
        for name in extra:
            if name in self.designs:
                raise InputError(f"design '{name}' redefines a catalog design; give it "
                                 "another name", field="custom_designs")
        return Catalog(self.machines, self.models, {**self.designs, **extra})

    def with_machines(self, machines: Mapping[str, MachineSku]) -> "Catalog":
        """This catalog with some machine records replaced, its designs bound to them."""
        table = {**self.machines, **machines}
        designs = {name: replace(d, prompt=table[d.prompt.name],
                                 token=table[d.token.name] if d.token is not None else None)
                   for name, d in self.designs.items()}
        return Catalog(table, self.models, designs)

    def with_prices(self, prices: tuple[tuple[str, float], ...]) -> "Catalog":
        """--price: these SKUs at these prices per hour (an unknown SKU named with the known)."""
        if not prices:
            return self
        try:
            return self.with_machines({sku: replace(self.machine(sku), cost_per_hour=usd)
                                       for sku, usd in prices})
        except InputError as err:
            raise InputError(f"{option_ref('price')}: {err}") from None


def _lookup(table: Mapping[str, Any], name: str, what: str):
    try:
        return table[name]
    except KeyError:
        raise InputError(f"unknown {what} '{name}'; known: {', '.join(sorted(table))}") from None


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser: 5x faster
    """safe_load that rejects a key given twice in one mapping (YAML silently keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):   # a list or mapping key is not even hashable
                shown = "null" if key is None else repr(key)[:40]
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {shown} is a {_yaml_kind(key)}, not a string: every key "
                    "must be a string (quote it)", key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _yaml_kind(value: Any) -> str:
    for kinds, name in (((list, tuple), "list"), (dict, "mapping"), (bool, "boolean"),
                        ((int, float), "number"), (type(None), "null")):
        if isinstance(value, kinds):
            return name
    return type(value).__name__   # a date, bytes


NULL_HINT = "is null; give a value, or remove the key to use its default"


def check_path(path: str | Path, field: str | None = None) -> None:
    """Refuse, in one line, a path the system will not even look up (a name or the whole path
    too long, a symlink loop), which Path.exists() and is_file() raise as OSError; a missing
    file is left to the caller."""
    try:
        os.stat(path)
    except OSError as err:
        if err.errno in (errno.ENAMETOOLONG, errno.ELOOP):
            shown = str(path) if len(str(path)) <= 60 else str(path)[:60] + "..."
            raise InputError(f"{err.strerror}; give a shorter path", source=shown,
                             field=field) from None
    except ValueError:   # a NUL byte
        raise InputError("the path contains a NUL byte", field=field) from None


def read_text(path: str | Path, *, max_bytes: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of a regular file, or a one-line InputError naming the file and saying what
    it is instead (missing, a directory, a device or /proc file, empty, binary, UTF-16, too big).
    A UTF-8 byte-order mark is dropped."""
    source = str(path)
    try:
        info = os.stat(path)
    except OSError as err:
        raise InputError(f"cannot read file: {err.strerror}; check the path",
                         source=source) from None
    if stat.S_ISDIR(info.st_mode):
        raise InputError("is a directory, not a file; give the file's path", source=source)
    if not stat.S_ISREG(info.st_mode):
        raise InputError("is not a regular file (a device, pipe or socket); give a file",
                         source=source)
    if info.st_size > max_bytes:
        raise InputError(f"file is too large ({info.st_size} bytes; at most {max_bytes}); "
                         "give a smaller file", source=source)
    try:
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as err:
        raise InputError(f"cannot read file: {err.strerror}; check its permissions",
                         source=source) from None
    if info.st_size == 0 and data:
        raise InputError("is a special file (its size is not known, as in /proc); give a "
                         "regular file", source=source)
    if len(data) > max_bytes:
        raise InputError(f"file is too large (at most {max_bytes} bytes); give a smaller file",
                         source=source)
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise InputError("is UTF-16 text; save it as UTF-8", source=source)
    if b"\x00" in data:
        raise InputError(f"is a binary file (NUL byte at offset {data.find(0)}), not "
                         "UTF-8 text; give a text file", source=source)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise InputError(f"is not UTF-8 text (byte 0x{data[err.start]:02x} at offset "
                         f"{err.start}); save it as UTF-8", source=source) from None
    if not text.strip():
        raise InputError("file is empty; give a file with content", source=source)
    return text


def read_yaml(path: Path) -> Any:
    """Parse a YAML file, turning every failure into a one-line InputError naming the file."""
    text = read_text(path)
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise InputError(f"broken YAML{line}: {problem}; fix the file", source=str(path)) from None
    except RecursionError:
        raise _too_deep(path) from None
    if data is None:
        raise InputError("file is empty (no YAML document); give a file with content",
                         source=str(path))
    check_document_shape(data, str(path))
    return data


def read_json(path: str | Path) -> Any:
    """Parse a JSON file, turning every failure into a one-line InputError naming the file."""
    text = read_text(path)
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as err:
        raise InputError(f"broken JSON at line {err.lineno}: {err.msg}; fix the file",
                         source=str(path)) from None
    except ValueError as err:  # NaN / Infinity, not JSON
        raise InputError(f"broken JSON: {err}; fix the file", source=str(path)) from None
    except RecursionError:
        raise _too_deep(path) from None
    check_document_shape(data, str(path))
    return data


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _too_deep(path) -> InputError:
    return InputError(f"nested more than {MAX_DOCUMENT_DEPTH} levels deep; this is not a "
                      "provision input file", source=str(path))


def check_document_shape(data: Any, source: str) -> None:
    """Reject documents nested too deeply or too large (YAML aliases can multiply a small file)
    before any code walks them recursively."""
    stack, nodes = [(data, 1)], 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > MAX_DOCUMENT_NODES:
            raise InputError(f"has more than {MAX_DOCUMENT_NODES} values (YAML aliases "
                             "included); this is not a provision input file", source=source)
        if isinstance(value, dict):
            children = [*value.keys(), *value.values()]
        elif isinstance(value, (list, tuple)):
            children = value
        else:
            continue
        if depth >= MAX_DOCUMENT_DEPTH and children:
            raise _too_deep(source)
        stack.extend((child, depth + 1) for child in children)


class _Fields:
    """Reads typed fields of one YAML entry with errors that name file, entry and field."""

    def __init__(self, entry: Any, source: str, name: str):
        if not isinstance(entry, dict):
            raise InputError(f"entry '{name}' must be a mapping of fields", source=source)
        self.entry, self.source, self.name = entry, source, name

    def _err(self, key: str, message: str) -> InputError:
        return InputError(f"entry '{self.name}': {message}", source=self.source, field=key)

    def raw(self, key: str, default: Any = ...):
        if key not in self.entry:
            if default is ...:
                raise self._err(key, "missing required field")
            return default
        if self.entry[key] is None:   # null is not a value: a field is given or left out
            raise self._err(key, NULL_HINT)
        return self.entry[key]

    def _checked(self, key: str, check, default: Any):
        if key not in self.entry and default is not ...:
            return default   # left out: the default, as it is
        value = self.raw(key, default)
        try:
            return check(value)
        except Invalid as err:
            raise self._err(key, str(err)) from None

    def number(self, key: str, default: Any = ..., *, positive: bool = True,
               integer: bool = False, at_most: float | None = None):
        check = Number(0, at_most, integer=integer, low_open=positive)
        return self._checked(key, check, default)

    def text(self, key: str, default: Any = ...):
        return self._checked(key, Text(), default)

    def flag(self, key: str, default: Any = ...):
        return self._checked(key, Flag(), default)

    def reject_unknown(self, known: set[str]) -> None:
        unknown = sorted(set(self.entry) - known)
        if unknown:
            raise self._err(unknown[0], f"unknown field; expected one of {', '.join(sorted(known))}")


_MACHINE_FIELDS = {"gpu", "gpus", "hbm_gib", "hbm_bandwidth_gbs", "fp16_tflops", "gpu_power_w",
                   "cost_per_hour", "kv_link_gbps", "kv_layerwise_visible_ms", "perf_profile",
                   "calibrated", "power_cap", "prompt_slowdown", "sources"}


def parse_machine(name: str, entry: Any, source: str) -> MachineSku:
    f = _Fields(entry, source, name)
    f.reject_unknown(_MACHINE_FIELDS)
    sources = f.raw("sources", {})
    if not isinstance(sources, dict):
        raise f._err("sources", "must be a mapping of field to source")
    for key, value in sources.items():
        try:
            Text()(value)
        except Invalid as err:
            raise f._err(f"sources.{key}", str(err)) from None
    return MachineSku(
        name=name, gpu=f.text("gpu"), gpus=f.number("gpus", integer=True, at_most=MAX_GPUS),
        hbm_gib=f.number("hbm_gib", at_most=1e5),
        hbm_bandwidth_gbs=f.number("hbm_bandwidth_gbs", at_most=1e6),
        fp16_tflops=f.number("fp16_tflops", at_most=1e6),
        gpu_power_w=f.number("gpu_power_w", at_most=1e5),
        cost_per_hour=f.number("cost_per_hour", at_most=1e6),
        kv_link_gbps=f.number("kv_link_gbps", at_most=1e6),
        kv_layerwise_visible_ms=f.number("kv_layerwise_visible_ms", positive=False,
                                         at_most=1e5),
        perf_profile=f.text("perf_profile"), calibrated=f.flag("calibrated"),
        power_cap=f.number("power_cap", 1.0, at_most=1.0),
        prompt_slowdown=f.number("prompt_slowdown", 1.0, at_most=100.0),
        sources={str(k): str(v) for k, v in sources.items()})


_MODEL_FIELDS = {"layers", "hidden", "heads", "kv_heads", "params_b", "active_params_b",
                 "bytes_per_value", "perf_profile", "source", "hf_id", "context_tokens",
                 "intermediate_size", "vocab_size", "head_dim", "mlp_gated", "experts",
                 "experts_per_token", "expert_intermediate_size", *_NEW_MODEL_FIELDS}
_MOE_FIELDS = ("experts", "experts_per_token", "expert_intermediate_size")
_MLA_FIELDS = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


def parse_model(name: str, entry: Any, source: str) -> ModelSpec:
    f = _Fields(entry, source, name)
    if isinstance(entry, dict) and "tensor_parallel" in entry:
        raise f._err("tensor_parallel", "a model no longer fixes its tensor parallelism: remove "
                     "the key (the search chooses a layout per pool; pin one with --tp, "
                     "--tp-prompt, --tp-token or --pp)")
    f.reject_unknown(_MODEL_FIELDS)
    model = ModelSpec(
        name=name, layers=f.number("layers", integer=True, at_most=10_000),
        hidden=f.number("hidden", integer=True, at_most=1_000_000),
        heads=f.number("heads", integer=True, at_most=100_000),
        kv_heads=f.number("kv_heads", integer=True, at_most=100_000),
        params_b=f.number("params_b", at_most=1e5),
        bytes_per_value=f.number("bytes_per_value", 2, integer=True, at_most=8),
        active_params_b=f.number("active_params_b", None, at_most=1e5),
        perf_profile=f.text("perf_profile", None), source=f.text("source", ""),
        intermediate_size=f.number("intermediate_size", None, integer=True, at_most=10_000_000),
        vocab_size=f.number("vocab_size", None, integer=True, at_most=100_000_000),
        head_dim_size=f.number("head_dim", None, integer=True, at_most=100_000),
        mlp_gated=f.flag("mlp_gated", True),
        experts=f.number("experts", None, integer=True, at_most=1_000_000),
        experts_per_token=f.number("experts_per_token", None, integer=True, at_most=1_000_000),
        expert_intermediate_size=f.number("expert_intermediate_size", None, integer=True,
                                          at_most=10_000_000),
        shared_experts=f.number("shared_experts", None, integer=True, at_most=1_000),
        dense_layers=f.number("dense_layers", 0, positive=False, integer=True, at_most=10_000),
        kv_lora_rank=f.number("kv_lora_rank", None, integer=True, at_most=1_000_000),
        q_lora_rank=f.number("q_lora_rank", None, integer=True, at_most=1_000_000),
        qk_rope_head_dim=f.number("qk_rope_head_dim", None, integer=True, at_most=100_000),
        qk_nope_head_dim=f.number("qk_nope_head_dim", None, integer=True, at_most=100_000),
        v_head_dim=f.number("v_head_dim", None, integer=True, at_most=100_000),
        sliding_window=f.number("sliding_window", None, integer=True, at_most=100_000_000),
        sliding_layers=f.number("sliding_layers", 0, positive=False, integer=True,
                                at_most=10_000),
        attention_sinks=f.flag("attention_sinks", False), hf_id=f.text("hf_id", None),
        context_tokens=f.number("context_tokens", None, integer=True, at_most=100_000_000))
    given = [key for key in _MOE_FIELDS if getattr(model, key) is not None]
    if given and len(given) != len(_MOE_FIELDS):
        missing = next(key for key in _MOE_FIELDS if key not in given)
        raise f._err(missing, f"a mixture-of-experts model needs {', '.join(_MOE_FIELDS)}")
    if model.experts is not None and model.experts_per_token > model.experts:
        raise f._err("experts_per_token", f"{model.experts_per_token} active experts of "
                                          f"{model.experts}")
    for key in ("shared_experts", "dense_layers"):
        if getattr(model, key) and not model.is_moe:
            raise f._err(key, f"{key} belong to a mixture-of-experts model; give "
                              f"{', '.join(_MOE_FIELDS)}")
    if model.dense_layers >= model.layers:
        raise f._err("dense_layers", f"{model.dense_layers} dense layers of {model.layers}")
    given = [key for key in _MLA_FIELDS if getattr(model, key) is not None]
    if (given or model.q_lora_rank is not None) and len(given) != len(_MLA_FIELDS):
        missing = next(key for key in _MLA_FIELDS if key not in given)
        raise f._err(missing, f"multi-head latent attention needs {', '.join(_MLA_FIELDS)}")
    if (model.sliding_window is None) != (model.sliding_layers == 0):
        raise f._err("sliding_layers" if model.sliding_window else "sliding_window",
                     "sliding-window attention needs both sliding_window and sliding_layers")
    if model.sliding_layers >= model.layers:
        raise f._err("sliding_layers", f"{model.sliding_layers} sliding-window layers of "
                                       f"{model.layers} (at least one full-attention layer)")
    if model.hidden % model.heads and model.head_dim_size is None:
        raise f._err("heads", f"hidden size {model.hidden} is not divisible by {model.heads} "
                              "heads (give head_dim when a head is not hidden / heads wide)")
    if model.heads % model.kv_heads:
        raise f._err("kv_heads", f"{model.heads} heads are not divisible into {model.kv_heads} KV groups")
    return model


def parse_design(name: str, entry: Any, source: str,
                 machines: Mapping[str, MachineSku]) -> Design:
    """A design entry ({prompt_sku, token_sku, mixed_pool, prefill, chunk_tokens}) with its SKUs
    resolved to records."""
    reserved = [c for c in RESERVED_DESIGN_CHARACTERS if c in name]
    if reserved:
        raise InputError(f"design name '{name}' contains '{reserved[0]}', which is reserved "
                         "('/' names PROMPT_SKU/TOKEN_SKU designs, '@' the budget variants "
                         "of --chunk-tokens auto); rename it", source=source, field=name)
    f = _Fields(entry, source, name)
    f.reject_unknown({"prompt_sku", "token_sku", "mixed_pool", "prefill", "chunk_tokens"})

    def machine(key: str, default: Any = ...) -> MachineSku | None:
        sku = f.text(key, default)
        if sku is None:
            return None
        if sku not in machines:
            raise f._err(key, f"unknown machine SKU '{sku}'; known: {', '.join(sorted(machines))}")
        return machines[sku]

    prefill = f._checked("prefill", OneOf(PREFILL_POLICIES), "whole")
    chunk_tokens = f.number("chunk_tokens", None, integer=True, at_most=CHUNK_TOKENS_MAX)
    if chunk_tokens is not None and chunk_tokens < CHUNK_TOKENS_MIN:
        raise f._err("chunk_tokens", f"must be a whole number >= {CHUNK_TOKENS_MIN} and <= "
                                     f"{CHUNK_TOKENS_MAX}, got {chunk_tokens}")
    if chunk_tokens is not None and prefill != "chunked":
        raise f._err("chunk_tokens", "applies to prefill: chunked; add it or drop chunk_tokens")
    return Design(name=name, prompt=machine("prompt_sku"), token=machine("token_sku", None),
                  mixed_pool=f.flag("mixed_pool", True), prefill=prefill,
                  chunk_tokens=chunk_tokens)


def _parse_table(path: Path, parse) -> dict[str, Any]:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise InputError("expected a mapping of names to entries", source=str(path))
    for name in data:
        try:
            Text()(name)
        except Invalid as err:
            raise InputError(f"entry name {err}; name every entry with a string",
                             source=str(path)) from None
    return {str(name): parse(str(name), entry, str(path)) for name, entry in data.items()}


CATALOG_FILES = ("machines.yaml", "models.yaml", "designs.yaml")


@lru_cache(maxsize=None)
def load_catalog(directory: str | None = None) -> Catalog:
    """Load and validate machines.yaml, models.yaml and designs.yaml: the packaged ones, and
    with `directory` an overlay: each of the three files it holds adds entries to the packaged
    table or replaces those of the same name (one SKU, one model, or a whole catalog). The
    packaged designs are bound to the overlaid machines, so a SKU given again changes them."""
    machines = _parse_table(DATA_DIR / "machines.yaml", parse_machine)
    models = _parse_table(DATA_DIR / "models.yaml", parse_model)
    tables = [DATA_DIR / "designs.yaml"]
    if directory:
        base = Path(directory)
        present = [name for name in CATALOG_FILES    # a directory or broken link: its error
                   if (base / name).exists() or (base / name).is_symlink()]
        if not present:
            raise InputError(f"holds none of {', '.join(CATALOG_FILES)}; put the entries to add "
                             "or replace in one of them", source=str(directory))
        if "machines.yaml" in present:
            machines.update(_parse_table(base / "machines.yaml", parse_machine))
        if "models.yaml" in present:
            models.update(_parse_table(base / "models.yaml", parse_model))
        if "designs.yaml" in present:
            tables.append(base / "designs.yaml")
    designs: dict[str, Design] = {}
    for path in tables:
        designs.update(_parse_table(path, lambda name, entry, source:
                                    parse_design(name, entry, source, machines)))
    return Catalog(machines, models, designs)
