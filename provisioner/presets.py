"""Assumption presets: `provision` (our semantics, SPEC section 4) and `splitwise-sim` (the
modelling choices of the simulator the Splitwise paper used, so that its study can be
reproduced with our simulators and each choice's effect seen).

`splitwise-sim` emulates these choices of SplitwiseSim (numbers from
`shared/design/splitwise-sim-semantics.md`, read from its code at commit 8f99e7d):
- #1 HBM: 8 x 80 GiB per DGX-A100 / DGX-H100;
- #2 weights as it states them: BLOOM-176B 329e9 B, Llama2-70B 138e9 B (a GiB figure written
  as bytes: a bug of it, emulated because it is one number);
- #3 no HBM reserve;
- #4 KV bytes per token ignoring grouped-query attention (a bug: Llama2-70B's KV is 8x too
  large; emulated because it is one field);
- #5 KV transfer always serialized after the prompt, at 200 GiB/s per machine;
- #6 TBT = (E2E - TTFT) / output tokens;
- #7-#10 its latency model (`simcore.splitwise_sim`), unless --perf-model is given: 1-D
  curves over "batch tokens" (prompt x batch) from its 2023 profiles, median per x, linear
  inside and beyond; prompt-only iterations on the prompt curve; decode-only iterations on the
  token curve looked up at x = number of decodes (a bug: flat in the batch size; emulated
  because it is a curve our simulators already take), no context term; mixed iterations at 1.1x
  the prompt curve at prompt + decode tokens. Pairs its profiles do not cover (machines other
  than DGX-A100/H100/H100-cap, models other than BLOOM-176B and Llama2-70B) keep our model;
- #11 its SLO references: TTFT the prompt curve at the prompt size; TBT a time per token of
  the request alone (its token curve at x = prompt size), not divided by the output tokens as
  the measured TBT is; E2E = TTFT reference + (output - 1) x TBT reference
  (`LatencyCurves.reference_token_time`, `simcore.metrics.uncontended_latencies`).
Not emulated (they need a different simulator, or are bugs that are not cheap): #12 its batch
limits (decodes counting one token each, at most 512 requests), #13 KV(prompt + 1) instead of
KV(prompt) held on the prompt machine, #14-#16 its mixed-pool return and routing keys, and its
prompts over 2048 tokens waiting behind a run of decode-only iterations.
"""
from __future__ import annotations

from dataclasses import replace

from hardware_catalog import Catalog, ModelSpec
from provisioner.options import LEGACY_ENGINE, PRESETS
from provisioner.study import PerfSource
from simcore import SimOptions
DEFAULT_RESERVE = {"provision": 0.10, "splitwise-sim": 0.0}
assert set(DEFAULT_RESERVE) == set(PRESETS)

_SPLITWISE_SIM_HBM_GIB = 80.0
_SPLITWISE_SIM_MACHINES = ("dgx-a100", "dgx-h100", "dgx-h100-cap")
_SPLITWISE_SIM_WEIGHTS = {"bloom-176b": 329e9, "llama2-70b": 138e9}
_SPLITWISE_SIM_LINK_BYTES_PER_S = 200 * 2**30
_NEVER_LAYERWISE = 1 << 62   # every transfer is below the layer-wise threshold


def preset_catalog(name: str, catalog: Catalog) -> Catalog:
    """The catalog with the preset's machine and model figures (unchanged for `provision`)."""
    if name == "provision":
        return catalog
    machines = dict(catalog.machines)
    for sku in _SPLITWISE_SIM_MACHINES:
        if sku in machines:
            m = machines[sku]
            link_gbps = _SPLITWISE_SIM_LINK_BYTES_PER_S * 8 / (m.gpus * 1e9)
            machines[sku] = replace(m, hbm_gib=_SPLITWISE_SIM_HBM_GIB, kv_link_gbps=link_gbps)
    models = {name_: _splitwise_sim_model(m) for name_, m in catalog.models.items()}
    bound = catalog.with_machines(machines)
    return Catalog(bound.machines, models, bound.designs)


def _splitwise_sim_model(model: ModelSpec) -> ModelSpec:
    return replace(model, kv_heads=model.heads,
                   weights_bytes=_SPLITWISE_SIM_WEIGHTS.get(model.name, model.weights_bytes))


def preset_perf(name: str, source: PerfSource) -> PerfSource:
    """The latency model of the preset: SplitwiseSim's curves (#7-#11) under `splitwise-sim`
    unless a --perf-model file is given (the user's measurements win). The preset pins the
    engine to splitwise-2023: its curves and the pairs they do not cover are the 2023 model's."""
    if name == "provision" or source.path is not None:
        return source
    return replace(source, latency_model="splitwise-sim", engine=LEGACY_ENGINE)


# KV admission of each preset (SimOptions.kv_admission): paged blocks with recompute preemption
# (vLLM's scheduler, what deployed engines run) for provision; the paper's up-front reservation
# for splitwise-sim, a named assumption its claims rest on.
DEFAULT_KV_ADMISSION = {"provision": "paged", "splitwise-sim": "reserve"}


# How an engine batches waiting prompts beside running decodes without chunks
# (SimOptions.prefill_first): SGLang's scheduler runs a prefill batch whenever one is ready
# (decodes mix in only with --enable-mixed-chunk); vLLM V1 schedules the running decodes and
# then the waiting prompts in one step, and TensorRT-LLM's in-flight batching mixes them too.
PREFILL_FIRST_ENGINES = ("sglang",)


def default_batching(name: str, engine: str) -> str:
    """The batching rule of the preset and engine: the Splitwise simulator mixes."""
    return "prefill-first" if name == "provision" and engine in PREFILL_FIRST_ENGINES \
        else "mixed"


def preset_sim_options(name: str, reserve: float | None, kv_admission: str | None = None,
                       batching: str | None = None, engine: str = "vllm") -> SimOptions:
    """The simulation options of the preset; an explicit --memory-reserve, --kv-admission or
    --batching wins."""
    reserve = DEFAULT_RESERVE[name] if reserve is None else reserve
    admission = kv_admission or DEFAULT_KV_ADMISSION[name]
    prefill_first = (batching or default_batching(name, engine)) == "prefill-first"
    if name == "provision":
        return SimOptions(memory_reserve_fraction=reserve, kv_admission=admission,
                          prefill_first=prefill_first)
    return SimOptions(memory_reserve_fraction=reserve, kv_admission=admission,
                      prefill_first=prefill_first,
                      layerwise_min_prompt_tokens=_NEVER_LAYERWISE, tbt_per_output_token=True)
