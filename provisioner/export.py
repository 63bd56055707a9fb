"""`provision export`: a search report's answer as launch configurations (issue 40).

For one design of a report.json (default: the report's best design, `summary.best_design`) it
writes every pool's engine launch configuration with the settings the simulation assumed:
the model (the catalog's Hugging Face id), tensor / pipeline / expert parallel sizes of the
optimum's layout, the running-request cap, the prompt budget (chunked prefill on with the
design's chunk budget, or off for whole-prompt pools), the GPU memory fraction (1 - the
simulation's HBM reserve; TensorRT-LLM's, of the memory left after the weights, is the
simulation's KV room over that memory), the KV cache data type, the number of servers per pool, and for a
disaggregated (prompt / token pools) design the KV-transfer wiring between the pools. Targets:

* vllm, sglang, trtllm: one launch script per pool (trtllm: its LLM-API options YAML, and for
  prompt / token pools the disaggregated-serving YAML of context and generation servers);
* dynamo: a DynamoGraphDeployment (Frontend, prefill and decode workers);
* llm-d: the values of the llm-d model service chart (prefill and decode roles);
* k8s: a Deployment per pool (replicas: its servers; `nvidia.com/gpu`: one server's GPUs per
  node; container args: the engine flags) and a Service per pool.

A load-curve report's plan is exported as a schedule: schedule.csv (time, pool, machines,
replicas) and, for k8s, one replica patch per change. Every file is rendered before anything
is written; the files are a pure function of the report (no timestamps).
"""
from __future__ import annotations

import csv
import io
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hardware_catalog import InputError

TARGETS = ("vllm", "sglang", "trtllm", "dynamo", "llm-d", "k8s")
# The engine versions whose argument names the files use (tests/data/engine_args.json holds
# the documented names of each, with its source).
ENGINE_VERSIONS = {"vllm": "vLLM 0.11 (vllm serve)", "sglang": "SGLang 0.5 (sglang.launch_server)",
                   "trtllm": "TensorRT-LLM 1.x (trtllm-serve, PyTorch backend)"}
IMAGES = {"vllm": "vllm/vllm-openai:v0.11.0", "sglang": "lmsysorg/sglang:v0.5.0",
          "trtllm": "nvcr.io/nvidia/tensorrt-llm/release:1.0.0",
          "dynamo": "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.5.0",
          "llm-d": "ghcr.io/llm-d/llm-d:v0.2.0"}
# The simulation caps a server's running requests only by its KV room (each request's prompt
# plus its whole output reserved on admission): the engines' caps are set high enough not to
# bind before KV does (vLLM's largest default, and the running requests simcore.layout keeps
# sliding-window room for).
MAX_RUNNING = 1024
PORT = 8000
KV_CONNECTOR = "NixlConnector"
# vLLM 0.11's SpeculativeConfig.method for ours (vllm/config/speculative.py, SpeculativeMethod)
VLLM_SPEC_METHODS = {"mtp": "mtp", "eagle": "eagle", "draft": "draft_model"}
# engines whose launch arguments at the exported version name no draft-model speculation
NO_DRAFT_MODEL = ("sglang", "trtllm")
SGLANG_TRANSFER = "nixl"
# files an export writes (a --force export removes those of an earlier one it does not rewrite)
_EXPORT_NAMES = re.compile(r"^(README\.txt|schedule\.csv|deployments\.yaml|dynamo-graph\.yaml|"
                           r"llm-d-values\.yaml|disagg-config\.yaml|disagg\.sh|"
                           r"[a-z]+\.sh|[a-z]+-config\.yaml|patch-\d+-[a-z0-9-]+\.yaml)$")


@dataclass(frozen=True)
class Pool:
    role: str                 # prompt | token | pool (a colocated design's one pool)
    sku: str
    gpus_per_machine: int
    machines: int
    tp: int
    pp: int
    ep: int
    dp: int
    kv_tokens: int | None     # KV tokens per instance (the simulation's capacity)
    max_len: int | None = None   # the longest sequence a server takes (None: the model's)
    power_cap: float = 1.0    # the SKU's catalog power_cap (machine power / rated; 1: none)
    # TensorRT-LLM's KV fraction: of the memory left after the weights, the share that is the
    # simulation's KV room (None: the model is not a catalog model)
    kv_after_weights: float | None = None

    @property
    def server_gpus(self) -> int:
        """GPUs of one engine server: its expert-parallel group, else tp x pp."""
        return self.ep if self.ep > 1 else self.tp * self.pp

    @property
    def nodes_per_server(self) -> int:
        return max(1, -(-self.server_gpus // self.gpus_per_machine))

    @property
    def gpus_per_node(self) -> int:
        return min(self.server_gpus, self.gpus_per_machine)

    def servers(self, machines: int | None = None) -> int:
        """Engine servers `machines` machines of the pool hold (default: the optimum's)."""
        machines = self.machines if machines is None else machines
        if self.nodes_per_server > 1:
            return machines // self.nodes_per_server
        return machines * (self.gpus_per_machine // self.server_gpus)

    @property
    def phase(self) -> str:
        return {"prompt": "prefill", "token": "decode", "pool": "both"}[self.role]


@dataclass(frozen=True)
class Speculation:
    """The speculative decoding the simulation assumed, as an engine is told it: the method
    (mtp | eagle | draft), k drafted tokens a step, and the drafter's checkpoint (an EAGLE
    head's, given to export; a draft model's, from the catalog; none for MTP, whose layers
    ship with the model)."""
    method: str
    tokens: int
    drafter: str | None


@dataclass(frozen=True)
class Plan:
    """What the simulation assumed for the design, as an engine needs it."""
    report: str
    design: str
    disaggregated: bool
    mixed_pool: bool
    pools: tuple[Pool, ...]
    model: str
    model_source: str
    context: int | None       # the model's longest sequence (None: not in the catalog)
    engine: str               # the engine whose latencies the search used
    dtype: str
    kv_dtype: str             # bf16 | fp8 (resolved as the search resolved --kv-dtype auto)
    memory_fraction: float
    reserve: float
    chunked: bool
    chunk_tokens: int | None
    prompt_token_limit: int
    rate_rps: float | None
    cost_per_hour: float | None
    schedule: tuple[tuple[float, str, int, int, float], ...] = ()   # load curve: see rows
    scale_up_s: float = 0.0
    spec: Speculation | None = None   # speculative decoding, when the search assumed it

    @property
    def name(self) -> str:
        return dns_name(self.design)


def dns_name(text: str) -> str:
    """A Kubernetes object name (RFC 1123 label) from a design or pool name."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return (name or "design")[:50].rstrip("-")


# ------------------------------------------------------------------------- reading the report
def read_plan(path: Path, design: str | None, drafter: str | None = None) -> Plan:
    from provisioner.check import read_report
    document = read_report(path)
    source = str(path)
    try:
        return _plan(document, design, source, drafter)
    except (KeyError, TypeError, IndexError, ValueError) as err:
        if isinstance(err, InputError):
            raise
        raise InputError(f"malformed report ({type(err).__name__}: {err}); give a report.json "
                         "written by provision search", source=source) from None


def _plan(document: dict, design: str | None, source: str, drafter: str | None = None) -> Plan:
    entries = {e["design"]: e for e in document["designs"]}
    name = design or document["summary"]["best_design"]
    if name is None:
        raise InputError("no design of the report met the SLOs: nothing to export",
                         source=source, field="summary.best_design")
    if name not in entries:
        raise InputError(f"unknown design '{name}'; the report's designs: "
                         f"{', '.join(entries)}", source=source, field="design")
    entry = entries[name]
    optimum = entry["optimum"]
    if optimum is None:
        raise InputError(f"design '{name}' has no optimum ({entry['status']}: "
                         f"{entry['reason'] or 'no feasible pool sizes'}): nothing to export",
                         source=source, field="design")
    inputs = document["inputs"]
    options = inputs["options"]
    asked = next(d for d in inputs["designs"] if d["name"] == name)
    machines = inputs["catalog"]["machines"]
    layout = optimum.get("layout") or {}
    disaggregated = "prompt_machines" in optimum
    pools = []
    for role in (("prompt", "token") if disaggregated else ("pool",)):
        sku = entry["prompt_sku"] if role in ("prompt", "pool") else entry["token_sku"]
        count = optimum[f"{role}_machines" if disaggregated else "machines"]
        shape = layout.get(role) or {}
        gpus = int(machines[sku]["gpus"])
        tp = int(shape.get("tp", min(gpus, 8)))
        ep = int(shape.get("ep", 1))
        cap = float(machines[sku].get("power_cap", 1.0))
        pools.append(Pool(role, sku, gpus, int(count), tp, int(shape.get("pp", 1)), ep,
                          int(shape.get("dp", max(1, ep // tp))),
                          shape.get("kv_tokens_per_instance"),
                          power_cap=cap))
    from provisioner.study import kv_dtype_of
    engine = options["engine"]
    reserve = float(inputs["sim_options"]["memory_reserve_fraction"])
    model_name = inputs["model"]["name"]
    model, model_source, context = _hf_id(model_name, options)
    # an engine refuses to start when one sequence of its context does not fit its KV room;
    # the simulation sized every layout for the workload's longest request within that room
    pools = [Pool(**{**p.__dict__, "max_len": p.kv_tokens})
             if p.kv_tokens is not None and context is not None and p.kv_tokens < context
             else p for p in pools]
    spec = None if options.get("model_config") else _catalog(options).models.get(model_name)
    if spec is not None:
        pools = [Pool(**{**p.__dict__, "kv_after_weights": _kv_after_weights(
            spec, options["dtype"], kv_dtype_of(engine, options["dtype"], options["kv_dtype"]),
            float(machines[p.sku]["hbm_gib"]), p, reserve)}) for p in pools]
    chunked = entry.get("prefill") == "chunked"
    plan = Plan(report=source, design=name, disaggregated=disaggregated,
                mixed_pool=bool(asked.get("mixed_pool")) and disaggregated, pools=tuple(pools),
                model=model, model_source=model_source, context=context, engine=engine, dtype=options["dtype"],
                kv_dtype=kv_dtype_of(engine, options["dtype"], options["kv_dtype"]),
                memory_fraction=round(1.0 - reserve, 4), reserve=reserve, chunked=chunked,
                chunk_tokens=entry.get("chunk_tokens") if chunked else None,
                prompt_token_limit=int(inputs["sim_options"]["prompt_token_limit"]),
                rate_rps=optimum.get("rate_rps"), cost_per_hour=optimum.get("cost_per_hour"),
                spec=_speculation(inputs["sim_options"].get("spec_decode"), drafter, options,
                                  source))
    curve = document.get("load_curve")
    if curve is not None:
        plan = _with_schedule(plan, curve, name, source)
    return plan


def _speculation(assumed: dict | None, drafter: str | None, options: dict,
                 source: str) -> Speculation | None:
    """The report's speculative decoding with its drafter's checkpoint (None: none assumed;
    a --draft-model given then is refused, as it would be ignored)."""
    if assumed is None:
        if drafter is not None:
            raise InputError("--draft-model applies when the search assumed speculative "
                             "decoding (--spec-decode); this report has none", field="draft_model")
        return None
    method, tokens = assumed["method"], int(assumed["tokens"])
    if method == "eagle" and drafter is None:
        raise InputError("the search assumed EAGLE speculative decoding: give --draft-model "
                         "with the EAGLE head's Hugging Face id or path", source=source,
                         field="draft_model")
    if method == "draft" and drafter is None:
        drafter = _hf_id(assumed["draft_model"], options)[0]
    if method == "mtp" and drafter is not None:
        raise InputError("--draft-model does not apply to MTP (its layers ship with the model)",
                         field="draft_model")
    return Speculation(method, tokens, drafter)


def _hf_id(model_name: str, options: dict) -> tuple[str, str, int | None]:
    """The Hugging Face id the catalog maps the model to, where that came from, and the
    model's context length (None: unknown)."""
    if options.get("model_config"):
        return (str(options["model_config"]),
                "--model-config: the folder or id of the weights of that config.json (replace)",
                None)
    spec = _catalog(options).models.get(model_name)
    context = spec.context_tokens if spec is not None else None
    if spec is not None and spec.hf_id:
        return (spec.hf_id, f"catalog model {model_name} (hardware_catalog/models.yaml hf_id)",
                context)
    return model_name, (f"catalog model {model_name} names no Hugging Face id: replace it "
                        "with the weights' id or path"), context


def _catalog(options: dict):
    """The search's catalog (its --catalog folder when it can still be read, else the
    packaged one): for the models' Hugging Face ids, context lengths and weights."""
    from hardware_catalog import load_catalog
    try:
        return load_catalog(options.get("catalog"))
    except InputError:
        return load_catalog(None)


def _kv_after_weights(spec, dtype: str, kv_dtype: str, hbm_gib: float, pool: Pool,
                      reserve: float) -> float | None:
    """The simulation's KV room as a share of the memory its weights leave (what TensorRT-LLM's
    free_gpu_memory_fraction means): (HBM x (1 - reserve) - weights - window room) / (HBM -
    weights), of one instance, as simcore.layout.kv_capacity sizes it; rounded down."""
    import math

    from hardware_catalog import Layout
    from provisioner.study import model_in_dtype
    from simcore.layout import instance_weight_bytes, window_reserve_bytes
    try:
        model = model_in_dtype(spec, dtype, kv_dtype)
        layout = Layout(pool.tp, pool.pp, pool.ep)
    except (InputError, KeyError, ValueError):
        return None
    hbm = layout.gpus * hbm_gib * 2**30
    weights = instance_weight_bytes(model, layout)
    if hbm <= weights:
        return None
    kv = hbm * (1.0 - reserve) - weights - (window_reserve_bytes(model, layout)
                                             if model.sliding_layers else 0.0)
    return max(0.0, math.floor(kv / (hbm - weights) * 100) / 100)


def _with_schedule(plan: Plan, curve: dict, name: str, source: str) -> Plan:
    """A load-curve report: the design's plan as rows (time_s, pool, machines, replicas,
    apply_at_s): every pool at the first window, then each change; a pool that grows is applied
    the scale-up time before its window (the plan paid for the machine from then on)."""
    entry = curve["designs"].get(name)
    if entry is None or not entry.get("feasible"):
        raise InputError(f"design '{name}' has no feasible plan over the load curve: nothing "
                         "to schedule", source=source, field="load_curve.designs")
    scale_up = float(curve["rules"]["scale_up_s"])
    rows = []
    current = {p.role: None for p in plan.pools}
    for window, counts in zip(curve["windows"], entry["plan"]):
        start = float(window["start_s"])
        for pool, machines in zip(plan.pools, counts):
            machines = int(machines)
            before = current[pool.role]
            if machines == before:
                continue
            grow = before is not None and machines > before
            rows.append((start, pool.role, machines, pool.servers(machines),
                         max(0.0, start - scale_up) if grow else start))
            current[pool.role] = machines
    return Plan(**{**plan.__dict__, "schedule": tuple(rows), "scale_up_s": scale_up})


# ------------------------------------------------------------------------------ engine flags
def engine_of(plan: Plan, target: str) -> str:
    """The engine whose flags a target's files carry: the target itself, else (dynamo, llm-d,
    k8s) the engine whose latencies the search used (vLLM for the 2023 Splitwise model)."""
    if target in ENGINE_VERSIONS:
        return target
    if target == "llm-d":
        return "vllm"
    if target == "dynamo":
        return plan.engine if plan.engine == "sglang" else "vllm"
    return plan.engine if plan.engine in ENGINE_VERSIONS else "vllm"


def vllm_args(plan: Plan, pool: Pool, model: bool = True) -> list[str]:
    args = ([plan.model] if model else []) + [
        "--tensor-parallel-size", str(pool.tp), "--pipeline-parallel-size", str(pool.pp)]
    if pool.ep > 1:
        args += ["--data-parallel-size", str(pool.dp), "--enable-expert-parallel"]
    args += ["--max-num-seqs", str(MAX_RUNNING)]
    if pool.max_len is not None:
        args += ["--max-model-len", str(pool.max_len)]
    if plan.chunked:
        args += ["--enable-chunked-prefill", "--max-num-batched-tokens", str(plan.chunk_tokens)]
    else:   # whole prompts; vLLM then batches up to max(max_model_len, 2048) prompt tokens
        args += ["--no-enable-chunked-prefill"]
    args += ["--gpu-memory-utilization", f"{plan.memory_fraction:.2f}",
             "--kv-cache-dtype", "fp8" if plan.kv_dtype == "fp8" else "auto"]
    args += {"bf16": ["--dtype", "bfloat16"], "fp8": ["--quantization", "fp8"]}.get(plan.dtype,
                                                                                   [])
    if plan.disaggregated:
        role = "kv_producer" if pool.role == "prompt" else "kv_consumer"
        args += ["--kv-transfer-config", json.dumps({"kv_connector": KV_CONNECTOR,
                                                     "kv_role": role}, separators=(",", ":"))]
    if _drafts(plan, pool):
        config = {"method": VLLM_SPEC_METHODS[plan.spec.method],
                  **({"model": plan.spec.drafter} if plan.spec.drafter else {}),
                  "num_speculative_tokens": plan.spec.tokens}
        args += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    return args + ["--port", str(PORT)]


def _drafts(plan: Plan, pool: Pool) -> bool:
    """Does the pool's engine speculate? Every pool that decodes: not a prompt pool, which the
    files run as a pure prefill (the mixed pool has no engine setting)."""
    return plan.spec is not None and pool.role != "prompt"


def sglang_args(plan: Plan, pool: Pool) -> list[str]:
    tp = pool.ep if pool.ep > 1 else pool.tp
    args = ["--model-path", plan.model, "--tp-size", str(tp), "--pp-size", str(pool.pp)]
    if pool.ep > 1:
        args += ["--ep-size", str(pool.ep)]
        if pool.dp > 1:
            args += ["--enable-dp-attention", "--dp-size", str(pool.dp)]
    args += ["--max-running-requests", str(MAX_RUNNING)]
    if pool.max_len is not None:
        args += ["--context-length", str(pool.max_len)]
    if plan.chunked:
        args += ["--chunked-prefill-size", str(plan.chunk_tokens)]
    else:   # whole prompts, batches of up to the simulation's prompt tokens (a longer alone)
        args += ["--chunked-prefill-size", "-1", "--max-prefill-tokens",
                 str(plan.prompt_token_limit)]
    args += ["--mem-fraction-static", f"{plan.memory_fraction:.2f}",
             "--kv-cache-dtype", "fp8_e4m3" if plan.kv_dtype == "fp8" else "auto"]
    args += {"bf16": ["--dtype", "bfloat16"], "fp8": ["--quantization", "fp8"]}.get(plan.dtype,
                                                                                   [])
    if plan.disaggregated:
        args += ["--disaggregation-mode", pool.phase,
                 "--disaggregation-transfer-backend", SGLANG_TRANSFER]
    if _drafts(plan, pool):
        # a chain of k drafts (top-1 at each step), verified as k + 1 tokens: the
        # simulation's step; MTP runs through the same EAGLE worker on the model's own layers
        args += ["--speculative-algorithm", "EAGLE",
                 "--speculative-num-steps", str(plan.spec.tokens),
                 "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", str(plan.spec.tokens + 1)]
        if plan.spec.drafter:
            args += ["--speculative-draft-model-path", plan.spec.drafter]
    return args + ["--host", "0.0.0.0", "--port", str(PORT)]


def trtllm_args(plan: Plan, pool: Pool, options_file: str) -> list[str]:
    tp = pool.ep if pool.ep > 1 else pool.tp
    args = [plan.model, "--backend", "pytorch", "--tp_size", str(tp), "--pp_size", str(pool.pp)]
    if pool.ep > 1:
        args += ["--ep_size", str(pool.ep)]
    args += ["--max_batch_size", str(MAX_RUNNING)]
    if pool.max_len is not None:
        args += ["--max_seq_len", str(pool.max_len)]
    if plan.chunked:
        args += ["--max_num_tokens", str(plan.chunk_tokens)]
    args += ["--kv_cache_free_gpu_memory_fraction", f"{_trt_fraction(plan, pool):.2f}",
             "--host", "0.0.0.0", "--port", str(PORT), "--extra_llm_api_options", options_file]
    return args


def _trt_fraction(plan: Plan, pool: Pool) -> float:
    return plan.memory_fraction if pool.kv_after_weights is None else pool.kv_after_weights


def trtllm_options(plan: Plan, pool: Pool) -> dict:
    """The LLM-API options trtllm-serve reads from --extra_llm_api_options."""
    options: dict[str, Any] = {"enable_chunked_prefill": plan.chunked,
                               "kv_cache_config": {
                                   "dtype": "fp8" if plan.kv_dtype == "fp8" else "auto",
                                   "free_gpu_memory_fraction": _trt_fraction(plan, pool)}}
    if pool.ep > 1 and pool.dp > 1:
        options["enable_attention_dp"] = True
    if plan.disaggregated:
        options["cache_transceiver_config"] = {"backend": "NIXL"}
    if _drafts(plan, pool):
        options["speculative_config"] = (
            {"decoding_type": "MTP", "num_nextn_predict_layers": plan.spec.tokens}
            if plan.spec.method == "mtp" else
            {"decoding_type": "Eagle", "max_draft_len": plan.spec.tokens,
             "speculative_model_dir": plan.spec.drafter})
    return options


def pool_args(plan: Plan, pool: Pool, engine: str) -> tuple[list[str], list[str]]:
    """(command, args) of one server of the pool under `engine` in a container."""
    if engine == "vllm":
        return ["vllm", "serve"], vllm_args(plan, pool)
    if engine == "sglang":
        return ["python3", "-m", "sglang.launch_server"], sglang_args(plan, pool)
    return ["trtllm-serve"], trtllm_args(plan, pool, f"/config/{pool.role}-config.yaml")


# ------------------------------------------------------------------------------------ files
def _script(plan: Plan, pool: Pool, command: list[str]) -> str:
    nodes = (f", each over {pool.nodes_per_server} machines (a multi-node launch: Ray or the "
             f"engine's own; {pool.gpus_per_node} GPUs per machine)" if pool.nodes_per_server > 1
             else "")
    power = (f"# {pool.sku} is power-capped ({pool.power_cap:.0%} of rated machine power): cap "
             f"its GPUs first (nvidia-smi -pl), see README.txt.\n" if pool.power_cap < 1 else "")
    return (f"#!/bin/sh\n# {plan.design}, {_pool_phrase(pool)}: {pool.machines} x {pool.sku} "
            f"-> {pool.servers()} server(s) of {pool.server_gpus} GPU(s){nodes}.\n{power}"
            f"# Run it once per server: CUDA_VISIBLE_DEVICES set to the server's GPUs and, for\n"
            f"# several servers on a machine, a port each (sh {pool.role}.sh --port 8001: the\n"
            f"# arguments given are added last, and the last value of a flag wins). See README.txt.\n"
            f"exec {shlex.join(command)} \"$@\"\n")


def _pool_phrase(pool: Pool) -> str:
    return {"prompt": "prompt pool (prefill)", "token": "token pool (decode)",
            "pool": "the pool (prefill and decode)"}[pool.role]


def engine_files(plan: Plan, target: str) -> dict[str, str]:
    files = {}
    for pool in plan.pools:
        if target == "vllm":
            command = ["vllm", "serve", *vllm_args(plan, pool)]
        elif target == "sglang":
            command = ["python3", "-m", "sglang.launch_server", *sglang_args(plan, pool)]
        else:
            files[f"{pool.role}-config.yaml"] = _yaml(trtllm_options(plan, pool))
            command = ["trtllm-serve", *trtllm_args(plan, pool, f"{pool.role}-config.yaml")]
        files[f"{pool.role}.sh"] = _script(plan, pool, command)
    if target == "trtllm" and plan.disaggregated:
        prompt, token = plan.pools
        config = {"hostname": "localhost", "port": PORT, "backend": "pytorch",
                  "context_servers": _trt_servers(prompt, 8001),
                  "generation_servers": _trt_servers(token, 8001 + prompt.servers())}
        files["disagg-config.yaml"] = _yaml(config)
        files["disagg.sh"] = ("#!/bin/sh\n# the disaggregated front end: routes each request "
                              "to a context server, then a generation server\n"
                              "exec trtllm-serve disaggregated -c disagg-config.yaml\n")
    return files


def _trt_servers(pool: Pool, first_port: int) -> dict:
    count = pool.servers()
    return {"num_instances": count,
            "urls": [f"localhost:{first_port + k}" for k in range(count)]}


def _container(plan: Plan, pool: Pool, engine: str) -> dict:
    command, args = pool_args(plan, pool, engine)
    container: dict[str, Any] = {
        "name": "engine", "image": IMAGES[engine], "command": command, "args": args,
        "ports": [{"name": "http", "containerPort": PORT}],
        "resources": {"limits": {"nvidia.com/gpu": str(pool.gpus_per_node)},
                      "requests": {"nvidia.com/gpu": str(pool.gpus_per_node)}},
        "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": "hf-token", "key": "token", "optional": True}}}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": PORT},
                           "periodSeconds": 10}}
    if engine == "trtllm":
        container["volumeMounts"] = [{"name": "config", "mountPath": "/config"}]
    return container


def initial_replicas(plan: Plan) -> dict[str, int]:
    """Each pool's replicas at the start: the optimum's, or a plan's first window's."""
    replicas = {p.role: p.servers() for p in plan.pools}
    if plan.schedule:
        first = plan.schedule[0][0]
        replicas.update({role: count for time_s, role, _, count, _ in plan.schedule
                         if time_s == first})
    return replicas


def k8s_objects(plan: Plan) -> list[dict]:
    engine = engine_of(plan, "k8s")
    replicas = initial_replicas(plan)
    objects: list[dict] = []
    for pool in plan.pools:
        name = f"{plan.name}-{pool.role}"
        labels = {"app.kubernetes.io/name": plan.name, "app.kubernetes.io/component": pool.role,
                  "app.kubernetes.io/managed-by": "provision-export"}
        pod: dict[str, Any] = {"containers": [_container(plan, pool, engine)],
                               "nodeSelector": {"provision/sku": pool.sku}}
        if engine == "trtllm":
            config = f"{name}-config"
            objects.append({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": config, "labels": labels},
                            "data": {f"{pool.role}-config.yaml":
                                     _yaml(trtllm_options(plan, pool))}})
            pod["volumes"] = [{"name": "config", "configMap": {"name": config}}]
        annotations = {"provision/design": plan.design, "provision/sku": pool.sku,
                       "provision/machines": str(pool.machines),
                       "provision/servers-per-machine":
                           str(pool.gpus_per_machine // pool.server_gpus)
                           if pool.nodes_per_server == 1 else f"1/{pool.nodes_per_server}"}
        if _grouped(plan, pool):
            objects += _leader_worker_set(plan, pool, engine, name, labels, annotations, pod,
                                          replicas[pool.role])
            continue
        objects.append({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {"replicas": replicas[pool.role], "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": pod}}})
        objects.append({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "labels": labels},
            "spec": {"selector": labels,
                     "ports": [{"name": "http", "port": PORT, "targetPort": PORT}]}})
    return objects


# a server over several machines: a LeaderWorkerSet (sigs.k8s.io/lws) of one pod per machine;
# LWS sets LWS_GROUP_SIZE, LWS_LEADER_ADDRESS and LWS_WORKER_INDEX in every pod
LWS_API = "leaderworkerset.x-k8s.io/v1"
VLLM_MULTINODE = "bash /vllm-workspace/examples/online_serving/multi-node-serving.sh"


def _grouped(plan: Plan, pool: Pool) -> bool:
    """Whether k8s runs the pool's servers as LeaderWorkerSet groups (servers over machines)."""
    return pool.nodes_per_server > 1 and engine_of(plan, "k8s") in ("vllm", "sglang")


def _leader_worker_set(plan: Plan, pool: Pool, engine: str, name: str, labels: dict,
                       annotations: dict, pod: dict, replicas: int) -> list[dict]:
    """A pool whose servers span machines: a LeaderWorkerSet of `replicas` groups of
    nodes_per_server pods (vLLM: a Ray cluster per group, the leader serving, as vLLM's
    multi-node example; SGLang: every pod a rank of --nnodes), and a Service on the leaders."""
    leader = json.loads(json.dumps(pod))
    worker = json.loads(json.dumps(pod))
    main, other = leader["containers"][0], worker["containers"][0]
    if engine == "vllm":
        main["command"] = other["command"] = ["sh", "-c"]
        main["args"] = [f"{VLLM_MULTINODE} leader --ray_cluster_size=$(LWS_GROUP_SIZE); "
                        f"exec vllm serve {shlex.join(main['args'])}"]
        other["args"] = [f"{VLLM_MULTINODE} worker --ray_address=$(LWS_LEADER_ADDRESS)"]
    else:
        ranks = ["--nnodes", "$(LWS_GROUP_SIZE)", "--node-rank", "$(LWS_WORKER_INDEX)",
                 "--dist-init-addr", "$(LWS_LEADER_ADDRESS):20000"]
        main["args"] = main["args"] + ranks
        other["args"] = list(main["args"])
    for container in (other,):
        container.pop("readinessProbe", None)
        container.pop("ports", None)
    leaders = {**labels, "provision/role": "leader"}
    return [{"apiVersion": LWS_API, "kind": "LeaderWorkerSet",
             "metadata": {"name": name, "labels": labels, "annotations": annotations},
             "spec": {"replicas": replicas, "leaderWorkerTemplate": {
                 "size": pool.nodes_per_server, "restartPolicy": "RecreateGroupOnPodRestart",
                 "leaderTemplate": {"metadata": {"labels": leaders}, "spec": leader},
                 "workerTemplate": {"metadata": {"labels": labels}, "spec": worker}}}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels},
             "spec": {"selector": leaders,
                      "ports": [{"name": "http", "port": PORT, "targetPort": PORT}]}}]


def dynamo_graph(plan: Plan) -> dict:
    engine = engine_of(plan, "dynamo")
    module = f"dynamo.{engine}"
    services: dict[str, Any] = {"Frontend": {
        "dynamoNamespace": plan.name, "componentType": "frontend", "replicas": 1,
        "extraPodSpec": {"mainContainer": {"image": IMAGES["dynamo"]}}}}
    prefix = {"vllm": "Vllm", "sglang": "Sglang"}[engine]
    for pool in plan.pools:
        if engine == "vllm":
            args = vllm_args(plan, pool, model=False)
            args = _without(args, "--kv-transfer-config", 1) + (
                ["--is-prefill-worker"] if pool.role == "prompt" else [])
            args = ["--model", plan.model, *_without(args, "--port", 1)]
        else:
            args = _without(sglang_args(plan, pool), "--port", 1)
            args = _without(args, "--host", 1)
        kind = {"prompt": "PrefillWorker", "token": "DecodeWorker", "pool": "Worker"}[pool.role]
        service = {"dynamoNamespace": plan.name, "componentType": "worker",
                   "replicas": pool.servers(),
                   "resources": {"limits": {"gpu": str(pool.gpus_per_node)}},
                   "extraPodSpec": {"mainContainer": {
                       "image": IMAGES["dynamo"].replace("vllm-runtime", f"{engine}-runtime"),
                       "command": ["python3", "-m", module], "args": args}}}
        if pool.role != "pool":
            service["subComponentType"] = pool.phase
        services[f"{prefix}{kind}"] = service
    return {"apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeployment",
            "metadata": {"name": plan.name}, "spec": {"services": services}}


def _without(args: list[str], flag: str, values: int) -> list[str]:
    if flag not in args:
        return args
    k = args.index(flag)
    return args[:k] + args[k + 1 + values:]


def llm_d_values(plan: Plan) -> dict:
    """Values of the llm-d model service chart: a decode role and, for prompt / token pools, a
    prefill role; vLLM with NixlConnector both ways (llm-d's kv_both wiring)."""
    roles: dict[str, Any] = {}
    for pool in plan.pools:
        args = _without(vllm_args(plan, pool, model=False), "--kv-transfer-config", 1)
        args = _without(args, "--port", 1)
        if plan.disaggregated:
            args += ["--kv-transfer-config",
                     json.dumps({"kv_connector": KV_CONNECTOR, "kv_role": "kv_both"},
                                separators=(",", ":"))]
        role = "prefill" if pool.role == "prompt" else "decode"
        roles[role] = {
            "create": True, "replicas": pool.servers(),
            "parallelism": {"tensor": pool.tp, **({"data": pool.dp, "expert": pool.ep}
                                                  if pool.ep > 1 else {})},
            "containers": [{"name": "vllm", "image": IMAGES["llm-d"], "modelCommand": "vllmServe",
                            "args": args, "resources": {
                                "limits": {"nvidia.com/gpu": pool.gpus_per_node},
                                "requests": {"nvidia.com/gpu": pool.gpus_per_node}}}]}
    if "prefill" not in roles:
        roles["prefill"] = {"create": False}
    return {"modelArtifacts": {"uri": f"hf://{plan.model}", "name": plan.model},
            "routing": {"servicePort": PORT, "proxy": {"enabled": plan.disaggregated}},
            "decode": roles["decode"], "prefill": roles["prefill"]}


def schedule_csv(plan: Plan) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(("time_s", "pool", "machines", "replicas", "apply_at_s"))
    for time_s, role, machines, replicas, apply_at in plan.schedule:
        writer.writerow((f"{time_s:g}", role, machines, replicas, f"{apply_at:g}"))
    return buffer.getvalue()


def replica_patches(plan: Plan) -> dict[str, str]:
    """One merge patch per change of the plan (the Deployments start at its first window)."""
    files = {}
    current = initial_replicas(plan)
    k = 0
    for time_s, role, machines, replicas, apply_at in plan.schedule:
        if current[role] == replicas:
            continue
        current[role] = replicas
        k += 1
        name = f"{plan.name}-{role}"
        pool = next(p for p in plan.pools if p.role == role)
        api, kind = ((LWS_API, "LeaderWorkerSet") if _grouped(plan, pool)
                     else ("apps/v1", "Deployment"))
        header = (f"# at {apply_at:g} s (serving from {time_s:g} s): {role} pool to {machines} "
                  f"machine(s), {replicas} replica(s)\n# kubectl patch {kind.lower()} {name} "
                  f"--type merge --patch-file patch-{k:03d}-{role}.yaml\n")
        files[f"patch-{k:03d}-{role}.yaml"] = header + _yaml(
            {"apiVersion": api, "kind": kind, "metadata": {"name": name},
             "spec": {"replicas": replicas}})
    return files


class _Dumper(yaml.SafeDumper):
    """Plain YAML: a mapping used twice (labels and selectors) is written twice, no anchors."""

    def ignore_aliases(self, data) -> bool:
        return True


def _yaml(document: Any) -> str:
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                     width=1000)


def _yaml_all(documents: list[dict]) -> str:
    return yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                         width=1000)


def readme(plan: Plan, target: str, names: list[str]) -> str:
    engine = engine_of(plan, target)
    lines = [f"provision export --target {target}: design {plan.design} of {Path(plan.report).name}",
             "",
             f"Model: {plan.model} ({plan.model_source}).",
             f"Engine flags: {ENGINE_VERSIONS[engine]}; the search's latencies: {plan.engine} "
             f"kernel data, weights {plan.dtype}, KV cache {plan.kv_dtype}.",
             (f"Optimum: {plan.rate_rps:g} req/s at ${plan.cost_per_hour:,.2f}/h."
              if plan.rate_rps is not None and plan.cost_per_hour is not None else
              "Optimum: the report's."), "", "Pools:"]
    for pool in plan.pools:
        layout = (f"TP {pool.tp}, PP {pool.pp}" + (f", EP {pool.ep} (attention DP {pool.dp})"
                                                    if pool.ep > 1 else ""))
        kv = (f"; {pool.kv_tokens:,} KV tokens per instance in the simulation"
              if pool.kv_tokens is not None else "")
        lines.append(f"  {pool.role}: {pool.machines} x {pool.sku} ({pool.gpus_per_machine} GPUs "
                     f"each), {layout}: {pool.servers()} server(s) of {pool.server_gpus} "
                     f"GPU(s){kv}")
    capped = [p for p in plan.pools if p.max_len is not None]
    if capped:
        context = f"{plan.context:,}"
        lines.append(f"  (the model's context is {context} tokens; "
                     + ", ".join(f"{p.role} servers take sequences of up to {p.max_len:,} "
                                 f"tokens, their KV room" for p in capped)
                     + ": the engines refuse a context their KV cannot hold)")
    elif plan.context is None:
        lines.append("  (the model's context length is unknown here: if a server refuses to "
                     "start for want of KV room, cap its context to the KV tokens above)")
    budget = (f"chunked prefill on, {plan.chunk_tokens} tokens per iteration (the simulation's "
              "budget counts prompt tokens beside every running decode; vLLM's and TRT-LLM's "
              "count the decodes too)" if plan.chunked else
              f"whole prompts (chunked prefill off), FCFS batches of up to "
              f"{plan.prompt_token_limit} prompt tokens, a longer prompt alone (SGLang: "
              "--max-prefill-tokens; vLLM without chunking batches up to max(max_model_len, "
              "2048) tokens and refuses a smaller budget)")
    lines += ["", "Assumed, as the simulation did:",
              f"  - memory: {plan.reserve:.0%} of HBM reserved, the rest holds weights and KV: "
              f"GPU memory fraction {plan.memory_fraction:.2f}; TensorRT-LLM's is of the memory "
              "left after the weights: "
              + ", ".join(f"{p.role} {_trt_fraction(plan, p):.2f}" for p in plan.pools)
              + (" (the simulation's KV room over that memory)"
                 if all(p.kv_after_weights is not None for p in plan.pools)
                 else " (the model's weights are unknown here: the same fraction)"),
              f"  - prompts: {budget}",
              f"  - running requests: bounded only by KV room (a request's prompt and whole "
              f"output reserved on admission); the engine cap is {MAX_RUNNING}, not to bind first",
              f"  - KV cache: {plan.kv_dtype}" + (" (fp8 e4m3)" if plan.kv_dtype == "fp8" else
                                                  " (the model's dtype: auto)")]
    if plan.spec is not None:
        drafter = {"mtp": "the model's own MTP layers",
                   "eagle": f"the EAGLE head {plan.spec.drafter}",
                   "draft": f"the draft model {plan.spec.drafter}"}[plan.spec.method]
        lines.append(f"  - speculative decoding on the pools that decode: {plan.spec.tokens} "
                     f"drafted token(s) a step from {drafter}, verified in one pass (a chain: "
                     "top-1 drafts); the acceptance the search assumed is in the report "
                     "(inputs.sim_options.spec_decode): check it against your traffic")
    if plan.disaggregated:
        wiring = {"vllm": f"vLLM {KV_CONNECTOR}, prompt servers kv_producer, token servers "
                          "kv_consumer (a proxy sends each request to both)",
                  "sglang": f"--disaggregation-mode prefill|decode, transfer backend "
                            f"{SGLANG_TRANSFER} (mooncake also works); front it with "
                            "python -m sglang_router.launch_router --pd-disaggregation "
                            "--prefill URL --decode URL",
                  "trtllm": "cache transceiver NIXL; disagg-config.yaml lists context_servers "
                            "(prompt pool) and generation_servers (token pool): fill in the "
                            "servers' host:port"}[engine]
        lines.append(f"  - KV transfer prompt -> token pool: {wiring}")
        if plan.mixed_pool:
            lines.append("  - the simulation's mixed pool (token machines taking prompts when "
                         "the prompt queue is long) has no engine setting: the files run pure "
                         "prefill and decode pools")
    for pool in plan.pools:
        if pool.power_cap < 1:
            lines.append(f"  - {pool.role} pool: {pool.sku} runs power-capped (catalog power_cap "
                         f"{pool.power_cap:g}: the machine at {pool.power_cap:.0%} of its rated "
                         "power, its latencies and power priced so): set its GPUs' limits "
                         "(nvidia-smi -pl) as the catalog entry's source says; no engine flag "
                         "does")
    if any(p.nodes_per_server > 1 for p in plan.pools):
        lines.append("  - a server spanning machines needs a multi-node launch (Ray, the engine's "
                     "own, or a LeaderWorkerSet on Kubernetes); the files give one server's "
                     "flags and the GPUs of each of its machines"
                     + ("; deployments.yaml runs such a pool as a LeaderWorkerSet "
                        f"({LWS_API}: install LWS first), one pod per machine"
                        if target == "k8s" and engine in ("vllm", "sglang") else ""))
    if target == "k8s":
        lines.append("  - Kubernetes: a Deployment per pool, replicas = servers (machines x "
                     "servers per machine), nvidia.com/gpu = one server's GPUs per node, "
                     "nodeSelector provision/sku = the SKU; a Service per pool")
        if engine == "trtllm" and any(p.nodes_per_server > 1 for p in plan.pools):
            lines.append("  - TensorRT-LLM over several machines runs under MPI: its Deployment "
                         "holds one server's first machine only; launch the rest with mpirun")
        if plan.disaggregated:
            front = {"vllm": "vLLM's disaggregated proxy (examples/online_serving/"
                             "disaggregated_serving)",
                     "sglang": "python -m sglang_router.launch_router --pd-disaggregation",
                     "trtllm": "trtllm-serve disaggregated -c <config listing the pods>"}[
                         engine_of(plan, target)]
            lines.append(f"  - a front end sends each request to a prompt server, then a token "
                         f"server: run {front} over the two Services' pods")
    if plan.schedule:
        lines += ["", f"Load curve: schedule.csv has the plan (time_s: when the pool serves "
                      f"with that size; apply_at_s: when to order it, {plan.scale_up_s:g} s "
                      "earlier for a pool that grows)."
                  + (" deployments.yaml starts every pool at the plan's first window; one "
                     "patch-NNN-<pool>.yaml per change after it, applied in order." if target ==
                     "k8s" else "")]
    lines += ["", "Files:", *(f"  {name}" for name in names), ""]
    return "\n".join(lines)


def render(plan: Plan, target: str) -> dict[str, str]:
    if target in ("vllm", "sglang", "trtllm"):
        files = engine_files(plan, target)
    elif target == "dynamo":
        files = {"dynamo-graph.yaml": _yaml(dynamo_graph(plan))}
    elif target == "llm-d":
        files = {"llm-d-values.yaml": _yaml(llm_d_values(plan))}
    else:
        files = {"deployments.yaml": _yaml_all(k8s_objects(plan))}
        if plan.schedule:
            files.update(replica_patches(plan))
    if plan.schedule:
        files["schedule.csv"] = schedule_csv(plan)
    files["README.txt"] = readme(plan, target, sorted(files))
    return dict(sorted(files.items()))


def export(report: Path, target: str, design: str | None = None, out: Path | None = None,
           force: bool = False, draft_model: str | None = None) -> list[Path]:
    """Write the launch configurations of `design` (default: the report's best) for
    `target` in `out` (default: export-<target> beside the report); `draft_model`: the EAGLE
    head's checkpoint when the search assumed EAGLE speculative decoding."""
    from provisioner.files import write_files_atomically
    if target not in TARGETS:
        raise InputError(f"unknown target '{target}'; one of {', '.join(TARGETS)}",
                         field="target")
    report = Path(report)
    out = Path(out) if out is not None else report.parent / f"export-{target}"
    if out.exists() and not out.is_dir():
        raise InputError("exists and is not a directory", source=str(out), field="out")
    existing = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if existing and not force:
        raise InputError("is not empty; give --force to replace the files of an earlier export",
                         source=str(out), field="out")
    plan = read_plan(report, design, draft_model)
    engine = engine_of(plan, target)
    if plan.spec is not None and plan.spec.method == "draft" and engine in NO_DRAFT_MODEL:
        raise InputError(f"the search assumed draft-model speculative decoding, which "
                         f"{ENGINE_VERSIONS[engine]} is not exported for: export --target vllm "
                         "(or dynamo, llm-d, k8s on vLLM)", field="target")
    texts = render(plan, target)
    written = write_files_atomically(out, texts)
    for name in existing:   # --force: an earlier export's files this one does not rewrite
        if name not in texts and _EXPORT_NAMES.match(name) and (out / name).is_file():
            (out / name).unlink()
    for path in written:
        if path.suffix == ".sh":
            path.chmod(0o755)
    return written
