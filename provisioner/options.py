"""Every option of `provision`, declared once.

Each option is one field of a frozen dataclass: its type, default, check (from the small
vocabulary in `hardware_catalog.checks`) and help text. From these declarations come
- the typer command-line options (`command_parameters`), with choices for closed sets;
- the `--spec` YAML loader (`read_spec`), which accepts exactly the same names;
- the Python API's keyword arguments (`provisioner.search(**options)`);
- the question a report echoes, its inverse for `provision check`, and the evaluation cache's
  identity (`provisioner.question`: `to_echo`, `from_echo`, `identity`, from the `echo` and
  `outcome` flags here).

A value is checked once, where it enters, and an error names the field the way the user wrote
it: `--rate` on the command line, `rate:` in a spec file, `rate=` from Python.
Adding an option means adding one field here and the code that uses its value.
"""
from __future__ import annotations

import enum
import inspect
import os
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, make_dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from hardware_catalog import NULL_HINT, InputError, check_path, read_yaml
from hardware_catalog.checks import (CHUNK_TOKENS_MAX, CHUNK_TOKENS_MIN, Flag, Invalid, Mapping,
                                     Names, Number, NumberList, OneOf, OrAuto, Prices, Text,
                                     count,
                                     fraction, positive)
from slo_profiles import MAX_LIMIT as MAX_SLO_MS, MS_OPTIONS

GOALS = ("min-cost", "min-power", "max-rate")
RECOVERIES = ("restart", "replicate")
CURVE_SHAPES = ("step", "linear")      # a load curve between its rows (LoadCurve.linear)
KV_ADMISSIONS = ("reserve", "paged")   # SimOptions.kv_admission
BATCHINGS = ("mixed", "prefill-first")  # SimOptions.prefill_first
PREFIX_CACHES = ("off", "on", "aware")
PREFIX_HOST_GB_MAX = 1e6                # --prefix-host-memory: a million GB per instance   # SimOptions.prefix_cache, prefix_routing
RESTARTS = ("recompute", "regenerate")   # how a restart rebuilds the KV (SimOptions.restart)
REPLICA_TARGETS = ("host", "peer")
PRESETS = ("provision", "splitwise-sim")
ENGINES = ("vllm", "sglang", "trtllm", "splitwise-2023")   # whose latencies (docs/latencies.md)
LEGACY_ENGINE = "splitwise-2023"   # the model fitted to the 2023 Splitwise profiles
DTYPES = ("bf16", "fp8", "fp4")
KV_DTYPES = ("auto", "bf16", "fp8")   # --kv-dtype; auto: as the engine does (study.KV_DEFAULT)
BACKENDS = ("threads", "loky", "dask", "ray")
LOCAL_BACKENDS = ("threads", "loky")   # on this machine: no --address
DEFAULT_RATE = 70.0   # req/s of a built-in workload when no rate is given (the paper's default)

# Sane ranges: beyond them a run is a typo, or out of reach of this machine (issue: bad input).
MAX_RATE = 1e6              # requests per second
MAX_DURATION = 7 * 86400.0  # seconds of synthesized arrivals
# The window a question runs when --duration is left out (provisioner.question.derived_window):
# long outputs need long windows (the window starts empty, so a short one is a mostly unloaded
# cluster and overstates the sustainable rate; docs/workloads.md, "The window", with the measurements).
WINDOW_FLOOR_S = 120.0       # the paper's 2-minute window: the least a question runs
WINDOW_LIFETIMES = 11        # tail requests' lifetimes the window spans (warm-up included)
WINDOW_QUANTILE = 0.99       # the tail lengths: the workload's P99 prompt and output tokens
WINDOW_RULE = (f"the larger of {WINDOW_FLOOR_S:g} s and {WINDOW_LIFETIMES} x the time a "
               "request at the workload's P99 prompt and output lengths takes alone on the SLO "
               "reference machine, rounded up to a whole minute")
MAX_SEED = 2**63 - 1
# closed loops (--concurrency): users, and requests in all (vllm bench serve's --num-prompts
# default); the bound keeps a run within what a machine simulates in minutes
MAX_USERS = 1_000_000
DEFAULT_CLOSED_REQUESTS = 1000
# ... or this many per user, the more: all users start at 0, so a run of barely one request
# per user is the start-up burst alone, never a steady state
CLOSED_REQUESTS_PER_USER = 10
MAX_CLOSED_REQUESTS = 10_000_000
MAX_MACHINES = 100_000      # per pool, and in all
# The search's own bound: 16,384 machines per pool is ~5x the largest fleet the scale benchmark
# simulates in ~2 s (3,200 machines, 840k requests, ~350 MB); beyond it one simulation takes
# tens of seconds and GBs, so a growing search stops there and says so.
SEARCH_LIMIT = 16_384
MAX_JOBS = 1024
MAX_BUDGET = 1e9            # kW or $/h
CHUNK_BUDGETS = (256, 512, 1024, 2048)  # --chunk-tokens auto: Sarathi-Serve's range of budgets
MAX_GPUS_PER_INSTANCE = 1024   # a machine's GPUs (the catalog's bound)
MAX_PIPELINE = 8               # machines one instance spans (simcore.layout.MAX_PIPELINE)
MAX_EXPERT_PARALLEL = 256      # GPUs of one expert-parallel group (the MoE data's largest EP)
MAX_OVERHEAD_MS = 60_000.0     # an engine overhead of a minute is a typo


def option(default: Any, help: str, check: Any, *, short: str | None = None,
           flag: str | None = None, cli: bool = True, spec: bool = True, echo: bool = True,
           path: bool = False, default_text: str | None = None, required: bool = False,
           metavar: str | None = None, outcome: bool | None = None):
    """A dataclass field that carries its command-line and spec-file description.

    `flag` overrides the command-line spelling (a bool gets `--name/--no-name` unless given);
    `cli`/`spec` False keep an option out of the command line / spec files; `echo` False keeps
    it out of report.json; `path` marks a file name resolved against a spec file's folder.
    `outcome` says whether the option changes what one simulated sample says (beyond the point
    itself: its machines, rate and design record): such options make up the evaluation cache's
    identity (`provisioner.question.identity`). Every option of the question declares it.
    """
    return field(default=default, metadata={
        "help": help, "check": check, "short": short, "flag": flag, "cli": cli, "spec": spec,
        "echo": echo, "path": path, "default_text": default_text, "required": required,
        "metavar": metavar, "outcome": outcome})


SPEC_TOKENS_MAX = 16


@dataclass(frozen=True)
class SpecMethod:
    """--spec-decode: none, mtp, eagle or draft:MODEL."""

    def __call__(self, value: Any) -> str:
        value = getattr(value, "value", value)
        if isinstance(value, str) and (value in ("none", "mtp", "eagle") or (
                value.startswith("draft:") and value[6:].strip() and "\n" not in value)):
            return value
        raise Invalid(f"must be {self.describe()}, got {value!r}")

    def describe(self) -> str:
        return "none, mtp, eagle or draft:MODEL"


@dataclass(frozen=True)
class Acceptance:
    """--acceptance: a rate in [0, 1], or a comma list (a spec file: a list) of them."""

    def __call__(self, value: Any) -> tuple:
        items = value.split(",") if isinstance(value, str) else (
            list(value) if isinstance(value, (list, tuple)) else [value])
        try:
            rates = tuple(float(v) for v in items)
        except (TypeError, ValueError):
            raise Invalid(f"must be {self.describe()}, got {value!r}") from None
        if (not rates or len(rates) > SPEC_TOKENS_MAX
                or not all(0.0 <= r <= 1.0 for r in rates)):
            raise Invalid(f"must be {self.describe()}, got {value!r}")
        return rates

    def describe(self) -> str:
        return f"a rate in [0, 1] or a comma list of up to {SPEC_TOKENS_MAX} of them"


def _text_or_none(value):
    return None if value is None else Text()(value)


class Lengths:
    """--isl / --osl: a token count or a distribution (simcore.workload.LENGTH_GRAMMAR), kept
    in its canonical spelling (`uniform:1000-3000`)."""

    def __call__(self, value: Any) -> str:
        from simcore.workload import parse_lengths
        return parse_lengths(value).text

    def describe(self) -> str:
        from simcore.workload import LENGTH_GRAMMAR
        return LENGTH_GRAMMAR


class PrefixModelText:
    """--prefix-model: a session model (simcore.sessions.PREFIX_MODEL_GRAMMAR), kept in its
    canonical spelling."""

    def __call__(self, value: Any) -> str:
        from simcore.sessions import parse_prefix_model
        return parse_prefix_model(value).text

    def describe(self) -> str:
        from simcore.sessions import PREFIX_MODEL_GRAMMAR
        return PREFIX_MODEL_GRAMMAR


LENGTHS_HELP = ("N, uniform:LOW-HIGH or lognormal:MEDIAN,SIGMA; with --{other}, a workload of "
                "these lengths under Poisson arrivals at --rate, instead of --workload")


# --------------------------------------------------------------------------------- the tree
@dataclass(frozen=True)
class StudyOptions:
    """The question's data: model, workload, SLOs, performance model, catalog."""
    model: str = option("bloom-176b", "Model name (see `provision catalog`), a Hugging Face id "
                                      "(ORG/NAME: a catalog model's, or one whose config.json "
                                      "is in the local Hugging Face cache) or a snapshot "
                                      "folder.", Text(),
                        short="-m", metavar="NAME", outcome=True)
    workload: str = option("coding", "Built-in workload (coding, conversation), a CSV trace, or "
                                     "a `vllm bench serve` / GuideLLM result file (its requests' "
                                     "lengths under Poisson arrivals at --rate).",
                           Text(), short="-w", path=True, metavar="NAME|CSV", outcome=True)
    isl: Optional[str] = option(
        None, "Input (prompt) tokens per request: " + LENGTHS_HELP.format(other="osl") + ".",
        Lengths(), metavar="N|DIST", default_text="--workload's", outcome=True)
    osl: Optional[str] = option(
        None, "Output tokens per request: " + LENGTHS_HELP.format(other="isl") + ".",
        Lengths(), metavar="N|DIST", default_text="--workload's", outcome=True)
    prefix_model: Optional[str] = option(
        None, "Sessions with shared prefixes instead of independent requests: N system prompts "
              "of TOKENS tokens (one per session, uniformly), T turns a session (or uniform "
              "LOW-HIGH), each turn's prompt the system prompt, the earlier turns' text and "
              "outputs and its new text (sizes from the workload), arriving an exponential "
              "think time (mean SECONDS) after the previous turn; --rate counts requests. "
              "The prompts carry blocks that --prefix-cache can hit (docs/workloads.md).",
        PrefixModelText(), metavar="system=N:TOKENS,turns=T|LOW-HIGH,think=SECONDS",
        default_text="none: independent requests", outcome=True)
    rate: Optional[float] = option(
        None, "Requests per second (Poisson arrivals). A CSV trace is replayed as it is unless "
              "a rate asks for its sizes under new arrivals (a Mooncake trace: a window of its "
              "timeline scaled to the rate).", positive(MAX_RATE), short="-r",
        default_text=f"{DEFAULT_RATE:g} for a built-in workload", outcome=False)
    duration: Optional[float] = option(
        None, "Seconds of synthesized arrivals. Left out, derived from the workload: "
              f"{WINDOW_RULE}.", positive(MAX_DURATION),
        default_text="derived (120 for the default workload)", outcome=True)
    concurrency: Optional[int] = option(
        None, "Closed-loop load instead of --rate: N users, each sending a request, waiting "
              "for its last token, thinking (--think-time), then sending the next; all start "
              "at time 0, and the run is --requests requests; search sizes the cheapest "
              "(min-power: least-power) cluster that holds them within the SLOs "
              "(docs/closed-loop.md).",
        count(1, MAX_USERS), metavar="N", outcome=True)
    think_time: Optional[float] = option(
        None, "--concurrency: each user's mean think time in seconds between a request's last "
              "token and its next request (exponential, drawn from --seed; 0: back to back).",
        Number(0, MAX_DURATION), metavar="S", default_text="0", outcome=True)
    requests: Optional[int] = option(
        None, "--concurrency: the requests the users send in all, their sizes drawn from the "
              "workload (a Mooncake trace: its first ones); the run ends when the last has "
              "finished.", count(1, MAX_CLOSED_REQUESTS), metavar="M",
        default_text=f"{DEFAULT_CLOSED_REQUESTS:,} or {CLOSED_REQUESTS_PER_USER} per user, "
                     "the more", outcome=True)
    seed: int = option(0, "Random seed of the synthesized arrivals and sizes.", count(0, MAX_SEED), outcome=True)
    slo: str = option("splitwise", "SLO profile name (see `provision catalog`) or YAML file.",
                      Text(), path=True, metavar="NAME|FILE", outcome=True)
    perf_model: Optional[str] = option(
        None, "Latency tables or calibrated coefficients file (docs/perf-model-tables.md).",
        Text(), path=True, default_text="the built-in model", metavar="FILE", outcome=True)
    model_config: Optional[str] = option(
        None, "A Hugging Face config.json to size instead of a catalog model (its layers, "
              "hidden size, heads, KV heads, MLP, vocabulary and experts; named after the "
              "file).", Text(), path=True, metavar="CONFIG.JSON",
        default_text="the catalog model --model names", outcome=True)
    engine: str = option(
        "vllm", "Whose latencies: the serving engine's measured kernels (aiconfigurator-core "
                "tables; GPUs without them fall back to splitwise-2023 and are marked "
                "uncalibrated), or splitwise-2023, the model fitted to the 2023 Splitwise "
                "profiles.", OneOf(ENGINES), outcome=True)
    dtype: str = option(
        "bf16", "Data type of the weights: fp8 halves their bytes and uses the engine's fp8 "
                "kernel tables; fp4 (NVFP4, 0.5625 bytes per value with its scales) uses the "
                "nvfp4 tables of Blackwell GPUs (not with --engine splitwise-2023; refused on "
                "GPUs without them, naming those that have them).", OneOf(DTYPES),
        outcome=True)
    kv_dtype: str = option(
        "auto", "Data type of the KV cache: fp8 halves its bytes per token and uses the "
                "fp8-KV attention tables; auto does as the engine does: bf16 under vLLM and "
                "SGLang (their --kv-cache-dtype auto keeps the model's bf16), the weights' "
                "--dtype under TensorRT-LLM (kv_cache_quant_algo of NVIDIA's fp8 checkpoints).",
        OneOf(KV_DTYPES), outcome=True)
    # the engine's time around its kernels (simcore.engine_overheads): on kernel-composed
    # latencies only (measured iteration times hold it already); None: the engine's fitted value
    iteration_overhead_ms: Optional[float] = option(
        None, "The engine's host time per iteration in ms (scheduling, preparing inputs, "
              "sampling), on latencies composed from kernel tables; 0 turns it off.",
        Number(0, MAX_OVERHEAD_MS), metavar="MS", outcome=True,
        default_text="the engine's, fitted to measured runs (docs/engine-overheads.md)")
    sequence_overhead_us: Optional[float] = option(
        None, "The engine's host time per sequence of an iteration (each decode, prompt or "
              "chunk) in microseconds; 0 turns it off.", Number(0, MAX_OVERHEAD_MS * 1e3),
        metavar="US", outcome=True, default_text="the engine's fitted value")
    first_token_overhead_ms: Optional[float] = option(
        None, "Milliseconds added to every request's TTFT and E2E (tokenization, admission, the "
              "first sampling step), whatever the model's layers; 0 turns it off.",
        Number(0, MAX_OVERHEAD_MS), metavar="MS", outcome=True,
        default_text="the engine's fitted value")
    host_overlap: Optional[bool] = option(
        None, "--host-overlap: the engine prepares the next iteration while the GPUs run this "
              "one (async scheduling), so an iteration takes the longer of its GPU and host "
              "times; --no-host-overlap: their sum.", Flag(), outcome=True,
        default_text="the engine's fitted composition")
    memory_reserve: Optional[float] = option(
        None, "Fraction of HBM kept free for activations and fragmentation (vLLM's "
              "gpu_memory_utilization 0.9 keeps 0.10).", fraction(low_open=False),
        default_text="0.10; 0 with --assumptions splitwise-sim", outcome=True)
    kv_admission: Optional[str] = option(
        None, "KV admission on decoding machines: reserve (a request is admitted when its "
              "prompt plus its full output fit, held up front: the Splitwise paper's rule) or "
              "paged (vLLM: blocks of 16 tokens allocated as tokens are generated, admission "
              "by the current blocks leaving a 1% watermark, the latest admitted preempted and "
              "recomputed when blocks run out).", OneOf(KV_ADMISSIONS),
        default_text="paged; reserve with --assumptions splitwise-sim", outcome=True)
    batching: Optional[str] = option(
        None, "Iterations without chunks on a machine with running decodes and waiting prompts: "
              "mixed (prompts and decodes in one iteration: vLLM V1, TensorRT-LLM, the "
              "Splitwise simulator) or prefill-first (the prompts run alone, the decodes wait: "
              "SGLang's scheduler, vLLM V0 and Vidur's vLLM scheduler). Chunked iterations "
              "always mix (Sarathi-Serve).", OneOf(BATCHINGS),
        default_text="the engine's: prefill-first under sglang, else mixed; mixed with "
                     "--assumptions splitwise-sim", outcome=True)
    prefix_cache: str = option(
        "off", "Prefix caching: on keeps, on every instance, the KV blocks of the prompts it "
               "prefilled in an LRU cache in its free KV memory, and a prefill computes only "
               "the tokens past its longest cached prefix (vLLM's automatic prefix caching, "
               "SGLang's radix cache); aware also routes each prompt to the instance where "
               "its cached prefix outweighs the load most (SGLang's cache-aware router). Only "
               "prompts with known blocks can hit: a Mooncake trace's (its hash_ids; every "
               "sample keeps real requests: with --rate, a window of its scaled timeline) "
               "or --prefix-model's sessions.",
        OneOf(PREFIX_CACHES), outcome=True)
    prefix_host_memory: float = option(
        0.0, "--prefix-cache: each instance's host (CPU) memory for its cache, in GB (0: none). "
             "Blocks evicted from HBM move to a host LRU of this size; a prefill whose cached "
             "prefix continues there loads those blocks back over PCIe (50 GB/s per GPU) "
             "before the iteration that starts it runs (vLLM's CPU offload with LMCache).",
        Number(0.0, PREFIX_HOST_GB_MAX), metavar="GB", outcome=True)
    assumptions: str = option(
        "provision", "Modelling assumptions: ours, or the Splitwise paper simulator's choices "
                     "(docs/trust.md: Assumption presets).", OneOf(PRESETS), outcome=True)
    catalog: Optional[str] = option(
        None, "Catalog overlay directory: the machines.yaml, models.yaml and designs.yaml it "
              "holds add to the packaged catalog or replace its entries of the same name.", Text(),
        path=True, default_text="built-in", metavar="DIR", outcome=True)
    price: tuple = option(
        (), "Machine prices for this run: SKU=USD_PER_HOUR[,SKU=USD_PER_HOUR...] (replace the "
            "catalog's cost_per_hour; a spec file may give a mapping).", Prices(),
        default_text="the catalog's", metavar="SKU=USD,...", outcome=False)
    spec_decode: str = option(
        "none", "Speculative decoding: none, mtp (the model's multi-token-prediction module), "
                "eagle (an EAGLE-style one-layer draft head) or draft:MODEL (a catalog model "
                "drafting on the same GPUs). Each decode step drafts --spec-tokens tokens and "
                "emits 1 + the accepted ones; its time is the verification of k + 1 tokens per "
                "request plus the drafting (docs/spec-decode.md).", SpecMethod(),
        metavar="none|mtp|eagle|draft:MODEL", outcome=True)
    spec_tokens: Optional[int] = option(
        None, "--spec-decode: tokens drafted per step (k).", count(1, SPEC_TOKENS_MAX),
        default_text="1 for mtp, 3 for eagle and draft:MODEL", outcome=True)
    acceptance: Optional[tuple] = option(
        None, "--spec-decode: the chance a drafted token is accepted when every one before it "
              "was: one rate for every position, or a comma list, one per drafted token.",
        Acceptance(), metavar="RATE[,RATE...]", outcome=True,
        default_text="0.85 for mtp (DeepSeek-V3 report), 0.75 eagle, 0.7 draft:MODEL")
    chunk_tokens: Optional[Any] = option(
        None, f"Prompt tokens per iteration of chunked-prefill designs (sarathi-*, or prefill: "
              f"chunked), {CHUNK_TOKENS_MIN}-{CHUNK_TOKENS_MAX}; auto (search only) searches "
              f"{', '.join(map(str, CHUNK_BUDGETS))} per design and reports the best.",
        OrAuto(count(CHUNK_TOKENS_MIN, CHUNK_TOKENS_MAX)),
        default_text="the design's, 512 for sarathi-*", metavar="N|auto", outcome=False)


@dataclass(frozen=True)
class QuestionOptions:
    """What to optimise, and for which designs."""
    designs: tuple = option(("all",), "all, or D1,D2 (catalog names or PROMPT_SKU/TOKEN_SKU).",
                            Names(), short="-d", default_text="all", metavar="LIST", outcome=False)
    hardware: Optional[tuple] = option(
        None, "Which machines to buy: all, or SKU1,SKU2,... Every design shape over them (each "
              "prompt SKU x token SKU pair, each SKU colocated, each chunked) is searched, best "
              "capacity bound first; one that cannot beat the best found is pruned. Instead "
              "of --designs.", Names(), default_text="--designs", metavar="all|SKUS",
        outcome=False)
    # None, not True, by default: each design keeps its own setting (a catalog or spec design
    # may declare mixed_pool: false), and a search that does not give it runs as it always did
    mixed_pool: Optional[bool] = option(
        None, "Splitwise (disaggregated) designs: --mixed-pool lets prompt machines decode and "
              "token machines prefill when their own pool is loaded (Splitwise's mixed pool); "
              "--no-mixed-pool runs pure prefill and decode pools, as Dynamo and llm-d deploy "
              "them. Colocated designs have one pool and ignore it (refused when no design of "
              "the question has separate pools).", Flag(),
        default_text="each design's own: on for the catalog's Splitwise designs", outcome=True)
    goal: str = option("min-cost", "min-cost or min-power at --rate; max-rate under a budget.",
                       OneOf(GOALS), short="-g", outcome=False)
    power_budget_kw: Optional[float] = option(None, "max-rate under this provisioned power (kW).",
                                              positive(MAX_BUDGET), outcome=False)
    cost_budget_per_hour: Optional[float] = option(None, "max-rate under this cost ($/h).",
                                                   positive(MAX_BUDGET), outcome=False)
    budget_like: Optional[str] = option(
        None, "SKU:N, power:SKU:N or cost:SKU:N: the power (default) or cost of N machines of "
              "SKU, e.g. dgx-h100:40.", Text(), metavar="[KIND:]SKU:N", outcome=False)
    survive_failures: Optional[Any] = option(
        None, "N+k sizing: the optimum must also meet every SLO when k machines fail (10% into "
              "the window, down for the rest of the run) in each placement: k prompt, k token, "
              "and half and half (baselines: k machines); reports the price of resilience for "
              "restart and replicate. auto: k from --mtbf-hours (default: a published fleet "
              "figure) and --repair-minutes, so more than k machines of a pool are down at "
              "once with probability < 1e-4.", OrAuto(count(1, 64)), metavar="K|auto",
        outcome=True)
    load_curve: Optional[str] = option(
        None, "A load curve (CSV time_s,rate_rps, seconds or ISO timestamps, piecewise "
              "constant): size the static cluster for its busiest --window and plan the pools "
              "window by window (docs/load-curves.md).", Text(), path=True,
        metavar="CSV", outcome=False)
    window: float = option(3600.0, "--load-curve: the planning window in seconds.",
                           positive(MAX_DURATION), outcome=False)
    curve_shape: str = option(
        "step", "--load-curve: the rate between the curve's rows: step (each row's rate holds "
                "until the next) or linear (interpolated).", OneOf(CURVE_SHAPES),
        outcome=False)
    peak_rate: Optional[float] = option(
        None, "--load-curve: rescale the curve so its highest rate is this (req/s).",
        positive(MAX_RATE), outcome=False)
    scale_up_minutes: float = option(
        10.0, "--load-curve: minutes a machine added to a pool takes to boot and load weights "
              "(paid, serving nothing).", Number(0.0, 1440.0), outcome=False)
    min_machines: int = option(1, "--load-curve: the plan keeps at least this many machines "
                                  "per pool.", count(1, MAX_MACHINES), outcome=False)
    custom_designs: Optional[dict] = option(
        None, "Spec files only: {NAME: {prompt_sku, token_sku, mixed_pool, prefill, "
              "chunk_tokens}}.", Mapping(),
        cli=False, outcome=False)


@dataclass(frozen=True)
class LayoutOptions:
    """Instance layouts: pin a pool's tensor / pipeline / expert parallelism
    (docs/layouts.md)."""
    tp: Optional[int] = option(
        None, "Tensor parallelism of every pool (the one pool of colocated designs; Splitwise "
              "pools without --tp-prompt / --tp-token): GPUs per instance, dividing the "
              "machine's GPUs.", count(1, MAX_GPUS_PER_INSTANCE), metavar="N",
        default_text="searched (simulate: the whole machine)", outcome=False)
    tp_prompt: Optional[int] = option(
        None, "Tensor parallelism of Splitwise prompt pools.", count(1, MAX_GPUS_PER_INSTANCE),
        metavar="N", default_text="searched", outcome=False)
    tp_token: Optional[int] = option(
        None, "Tensor parallelism of Splitwise token pools.", count(1, MAX_GPUS_PER_INSTANCE),
        metavar="N", default_text="searched", outcome=False)
    pp: Optional[int] = option(
        None, "Pipeline parallelism of every pool: machines one instance spans.",
        count(1, MAX_PIPELINE), metavar="N",
        default_text="the fewest machines that hold the model", outcome=False)
    ep: Optional[int] = option(
        None, "Expert parallelism of every pool (a mixture-of-experts model): GPUs of one "
              "expert-parallel group, each holding experts / N whole experts; attention runs "
              "on N / --tp data-parallel ranks of --tp GPUs (--tp 1, the default: DEP; --tp "
              "N: TEP). 1: experts split by TP, no expert parallelism.",
        count(1, MAX_EXPERT_PARALLEL), metavar="N",
        default_text="searched (TEP at each TP, DEP 8-64; simulate: none)", outcome=False)
    ep_prompt: Optional[int] = option(
        None, "Expert parallelism of Splitwise prompt pools.", count(1, MAX_EXPERT_PARALLEL),
        metavar="N", default_text="searched", outcome=False)
    ep_token: Optional[int] = option(
        None, "Expert parallelism of Splitwise token pools.", count(1, MAX_EXPERT_PARALLEL),
        metavar="N", default_text="searched", outcome=False)


@dataclass(frozen=True)
class FailureOptions:
    """Machine failures (DejaVu) and how requests recover from them."""
    mtbf_hours: Optional[float] = option(
        None, "Random failures: mean hours between failures of each machine (exponential, "
              "seeded by --seed).", positive(1e6), metavar="H", outcome=True)
    repair_minutes: float = option(30.0, "Minutes a failed machine stays down (with "
                                         "--mtbf-hours).", positive(1e6), metavar="M", outcome=True)
    recovery: str = option(
        "restart", "After a failure: restart (rebuild the KV as --restart says) or replicate "
                   "(resume from the KV streamed to a replica as tokens are generated).",
        OneOf(RECOVERIES), outcome=True)
    restart: str = option(
        "recompute", "How a restarted request (--recovery restart, or a lost replica) rebuilds "
                     "its KV: recompute (the default, what engines such as vLLM do today: one "
                     "prefill over the prompt plus the tokens already generated) or regenerate "
                     "(DejaVu's baseline: a prefill over the prompt only, then the tokens already "
                     "sent decoded again one iteration each, not sent twice).", OneOf(RESTARTS),
        outcome=True)
    replica_target: str = option(
        "host", "replicate: KV replicas in remote host memory, or in a peer token machine's HBM "
                "(a ring; halves every decoding machine's KV capacity).", OneOf(REPLICA_TARGETS), outcome=True)
    detection_s: float = option(5.0, "Seconds before a failure is detected (heartbeat timeout) "
                                     "and its requests recovered.", Number(0.0, 3600.0), outcome=True)


@dataclass(frozen=True)
class Constraints:
    """Upper limits applied by the OR-Tools selection (and used to bound the search)."""
    max_machines: Optional[int] = option(None, "At most this many machines in all.",
                                         count(1, MAX_MACHINES), outcome=False)
    max_gpus: Optional[int] = option(None, "At most this many GPUs.", count(1, 64 * MAX_MACHINES), outcome=False)
    max_prompt: Optional[int] = option(None, "At most this many prompt machines.",
                                       count(1, MAX_MACHINES), outcome=False)
    max_token: Optional[int] = option(None, "At most this many token machines.",
                                      count(1, MAX_MACHINES), outcome=False)


@dataclass(frozen=True)
class SearchSettings:
    """How the search explores (the last four are fixed: echoed, not options)."""
    exhaustive: bool = option(False, "Evaluate every grid point and report non-monotone cells.",
                              Flag(), outcome=False)
    search_limit: int = option(
        SEARCH_LIMIT, "Largest pool the search grows to (it doubles the pools from 1 until the "
                      "SLOs hold); a design still infeasible there is reported with the limit.",
        count(1, MAX_MACHINES), outcome=False)
    rate_tolerance: float = option(0.02, "max-rate: relative precision of the rate.", fraction(), outcome=False)
    verify_seeds: int = option(
        20, "Independent workload samples (seeds --seed, --seed+1, ...) the optimum must meet "
            "every SLO on; the search screens on the first and verifies its candidates on "
            "all.", count(1, 100), outcome=False)
    verify_margin: float = option(
        0.05, "Guard band: on every verification sample the optimum must beat each SLO limit "
              "by this fraction (tail percentiles vary more between samples than the samples "
              "show).", fraction(low_open=False), outcome=False)
    sensitivity: bool = option(
        False, "Also re-derive every optimum with one assumption changed (rate +-10%, HBM "
               "reserve, KV transfer, burstier arrivals, +-15% latency on uncalibrated "
               "hardware): a few extra searches.", Flag(), outcome=False)
    slo_confidence: float = option(
        0.5, "Check each SLO percentile's one-sided upper confidence bound at this level "
             "(an order-statistic bound over the sample's requests) instead of the percentile "
             "itself (0.5).", Number(0.5, 0.999), outcome=True)
    start_rate: float = option(8.0, "max-rate: first rate tried.", positive(), cli=False,
                               spec=False, outcome=False)
    min_rate: float = option(0.05, "max-rate: lowest rate tried.", positive(), cli=False,
                             spec=False, echo=False, outcome=False)
    max_rate: float = option(100_000.0, "max-rate: highest rate tried.", positive(), cli=False,
                             spec=False, echo=False, outcome=False)
    load_sweep: tuple = option((0.5, 0.75, 1.25), "Extra rates (x optimum) for the figure.",
                               NumberList(positive(100.0)), cli=False, spec=False, outcome=False)


@dataclass(frozen=True)
class Execution:
    """Where and how the evaluations run; nothing here changes a result."""
    out: str = option("provision-report", "Report directory.", Text(), short="-o",
                      metavar="DIR", echo=False)
    jobs: Optional[int] = option(None, "Parallel evaluations.", count(1, MAX_JOBS), short="-j",
                                 default_text="one per core", echo=False)
    backend: str = option("threads", "Where evaluations run: threads of this process (the "
                                     "compiled core releases the GIL), local processes (loky), "
                                     "a dask or a ray cluster.", OneOf(BACKENDS), echo=False)
    address: Optional[str] = option(None, "Scheduler of a dask or ray cluster (dask without it: "
                                          "a local cluster).", Text(), metavar="ADDRESS",
                                  echo=False)
    cache_dir: Optional[str] = option(None, "Evaluation cache directory.", Text(),
                                      default_text="the platform's user cache folder, per "
                                                   "project", metavar="DIR", echo=False)
    no_cache: bool = option(False, "Neither read nor write the evaluation cache.", Flag(),
                            flag="--no-cache", echo=False)
    quiet: bool = option(False, "No progress or compile notice on stderr (results, warnings "
                                "and errors still print).", Flag(), short="-q",
                         flag="--quiet", echo=False)


# --ttft-p99-ms 500, --tpot-p99-ms 50, ...: one option per (metric, percentile) of
# slo_profiles.MS_OPTIONS, generated here from that table
_MS_WHAT = {"ttft": "time to first token", "tpot": "time per output token after the first, a "
            "request's mean (the profile's tbt)", "e2e": "end-to-end latency",
            "itl": "inter-token latency, every gap of every request"}


def _ms_option(name: str, pct: str):
    metric = name.split("_")[0]
    return option(
        None, f"{pct.upper()} limit in ms on {metric.upper()} ({_MS_WHAT[metric]}); replaces "
              f"--slo's limits of {metric.upper()}, other metrics keep the profile's.",
        positive(MAX_SLO_MS), metavar="MS", outcome=True, default_text="--slo's",
        short=f"--tbt-{pct}-ms" if metric == "tpot" else None)


SloLimits = make_dataclass(
    "SloLimits", [(name, Optional[float], _ms_option(name, pct)) for name, _, pct in MS_OPTIONS],
    frozen=True)
SloLimits.__doc__ = "SLO limits in milliseconds given as options, over the --slo profile."
SloLimits.__module__ = __name__


def ms_limits(limits: Any) -> dict[tuple[str, str], float]:
    """The (metric, percentile) -> ms limits given (slo_profiles.with_ms_limits takes them)."""
    return {(metric, pct): getattr(limits, name) for name, metric, pct in MS_OPTIONS
            if getattr(limits, name) is not None}


@dataclass(frozen=True)
class SearchOptions:
    """`provision search`: the question, its limits, the search and its execution."""
    study: StudyOptions = StudyOptions()
    slo_limits: SloLimits = SloLimits()
    question: QuestionOptions = QuestionOptions()
    layout: LayoutOptions = LayoutOptions()
    resilience: FailureOptions = FailureOptions()
    constraints: Constraints = Constraints()
    settings: SearchSettings = SearchSettings()
    execution: Execution = Execution()


@dataclass(frozen=True)
class ClusterOptions:
    """`provision simulate`: one cluster."""
    design: Optional[str] = option(None, "Design name (see `provision catalog`) or "
                                         "PROMPT_SKU/TOKEN_SKU.", Text(), short="-d",
                                   required=True, spec=False, metavar="NAME")
    prompt: Optional[int] = option(None, "Prompt machines (Splitwise designs).",
                                   count(1, MAX_MACHINES))
    token: Optional[int] = option(None, "Token machines (Splitwise designs).",
                                  count(1, MAX_MACHINES))
    machines: Optional[int] = option(None, "Pool size (baseline designs).",
                                     count(1, MAX_MACHINES))
    mixed_pool: Optional[bool] = option(None, "Override the design's mixed-pool setting.", Flag(),
                                        default_text="the design's")
    requests_csv: Optional[str] = option(
        None, "Write per-request latencies to this CSV (never one of the run's inputs; in a "
              "spec file, relative to the current folder like --out).", Text(), metavar="FILE")
    failures: Optional[str] = option(
        None, "Failure schedule CSV: time_s, pool (prompt|token|any), machine (index in the "
              "pool), down_s (a number or inf).", Text(), path=True, metavar="CSV")
    load_curve: Optional[str] = option(
        None, "Replay a load curve (CSV time_s,rate_rps, as search --load-curve takes) on "
              "this cluster: Poisson arrivals following it, the SLOs per planning window "
              "(--curve-window) and over the whole curve. Instead of --rate and --duration.",
        Text(), path=True, metavar="CSV")
    curve_window: float = option(3600.0, "--load-curve: the window the SLOs are checked per.",
                                 positive(MAX_DURATION))
    curve_shape: str = option(
        "step", "--load-curve: the rate between the curve's rows: step (each row's rate holds "
                "until the next) or linear (interpolated).", OneOf(CURVE_SHAPES))
    plan: Optional[str] = option(
        None, "--load-curve: resize the pools during the run as this plan says: a search's "
              "plan.csv (its rows of --design), or a CSV start_s,prompt_machines,"
              "token_machines, each row the pools serving from then on (a machine added was "
              "ordered its provisioning delay before; one removed finishes its work). The "
              "cluster is the plan's largest pools unless given.",
        Text(), path=True, metavar="CSV")


@dataclass(frozen=True)
class SimulateOptions:
    study: StudyOptions = StudyOptions()
    slo_limits: SloLimits = SloLimits()
    cluster: ClusterOptions = ClusterOptions()
    layout: LayoutOptions = LayoutOptions()
    resilience: FailureOptions = FailureOptions()


# ------------------------------------------------------------------------------- walking it
def leaves(tree: type) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(path, field) of every option of a tree class, depth first, in declaration order."""
    for f in fields(tree):
        if is_dataclass(f.type if isinstance(f.type, type) else f.default):
            for path, leaf in leaves(type(f.default)):
                yield (f.name, *path), leaf
        else:
            yield (f.name,), f


def option_fields(tree: type) -> dict[str, Any]:
    """Flat name -> field; option names are unique across a tree."""
    return {path[-1]: f for path, f in leaves(tree)}


def flag_of(f) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def check_value(f, value: Any, where: str, source: str | None = None) -> Any:
    """The value in canonical form, or an InputError naming the option as the user wrote it."""
    if value is None:
        return None
    check = f.metadata.get("check")
    if check is None:
        return value
    try:
        return check(value)
    except Invalid as err:
        if source is not None:
            raise InputError(str(err), source=source, field=where) from None
        raise InputError(f"{where} {err}") from None


def build(tree: type, values: dict[str, Any]) -> Any:
    """An instance of `tree` with `values` (flat names, already checked) over its defaults."""
    kwargs = {}
    for f in fields(tree):
        if is_dataclass(f.default):
            kwargs[f.name] = build(type(f.default), values)
        elif f.name in values:
            kwargs[f.name] = values[f.name]
    return tree(**kwargs)


def from_keywords(tree: type, keywords: dict[str, Any]) -> dict[str, Any]:
    """Python API keywords (the option names), checked; errors name `rate=`. None is the
    option left out where that is its default (`rate=None`), and refused elsewhere
    (`goal=None` has no meaning)."""
    known = option_fields(tree)
    checked = {}
    for name, value in keywords.items():
        if name not in known or not (known[name].metadata["cli"] or known[name].metadata["spec"]):
            raise InputError(f"unknown option {name}=; known: {', '.join(public_names(tree))}")
        if value is None and known[name].default is not None:
            raise InputError(f"{name}=None is not a value; leave {name} out to use its default "
                             f"({known[name].default!r})")
        checked[name] = _checked_keyword(known[name], value, f"{name}=")
    return checked


def _checked_keyword(f, value, where: str):
    if f.name == "designs" and not isinstance(value, str):
        # Python callers may pass Design records next to names
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        for item in items:
            if isinstance(item, str):
                check_value(f, item, where)
        return tuple(items)
    return check_value(f, value, where)


def public_names(tree: type) -> list[str]:
    return [name for name, f in option_fields(tree).items()
            if f.metadata["cli"] or f.metadata["spec"]]


# ------------------------------------------------------------------------------ spec files
def read_spec(path: str | Path, tree: type = SearchOptions) -> dict[str, Any]:
    """A spec file's options (keys as the option names, with - or _), checked; the names of
    input files in it are resolved against the spec file's folder (a spec travels with its
    data), outputs (`out`, `requests_csv`, `cache_dir`) against the current folder, as on the
    command line. Null values are refused: a key is removed to use its default."""
    data = read_yaml(Path(path))
    if not isinstance(data, dict):
        raise InputError("a spec file must be a mapping of option names to values",
                         source=str(path))
    known = {name: f for name, f in option_fields(tree).items() if f.metadata["spec"]}
    options = {}
    for raw_key, value in data.items():   # keys are strings (read_yaml)
        key = raw_key.replace("-", "_")
        if key not in known:
            raise InputError(f"unknown option; expected one of {', '.join(sorted(known))}",
                             source=str(path), field=raw_key)
        if value is None:   # `goal: ~` means nothing; every option has a non-null default
            raise InputError(NULL_HINT, source=str(path), field=raw_key)
        options[key] = check_value(known[key], value, raw_key, source=str(path))
        if key == "custom_designs":
            _check_custom_designs(options[key], str(path), raw_key)
        if known[key].metadata["path"] and options[key] is not None:
            options[key] = _relative_to(options[key], Path(path).resolve().parent)
    return options


def _check_custom_designs(entries: dict, source: str, key: str) -> None:
    """The shape of a spec's own designs, with errors naming the spec file (their fields are
    checked against the catalog where the designs are built)."""
    for name, entry in entries.items():
        where = f"{key}.{name}"
        try:
            Text()(name)
        except Invalid as err:
            raise InputError(f"design name {err}", source=source, field=key) from None
        if not isinstance(entry, dict):
            raise InputError(f"must be a mapping of fields (prompt_sku, token_sku, ...), got "
                             f"{entry!r}"[:120], source=source, field=where)
        for name_of_field, value in entry.items():
            if value is None:
                raise InputError(NULL_HINT, source=source, field=f"{where}.{name_of_field}")


def _relative_to(value: str, base_dir: Path) -> str:
    """A spec's file names are relative to the spec file (built-in names stay as they are)."""
    check_path(base_dir / value, None)   # a name too long to look up: one line, not OSError
    if Path(value).is_absolute() or not (base_dir / value).exists():
        return value
    return os.path.relpath(base_dir / value)


# ---------------------------------------------------------------------------- command line
def command_parameters(tree: type, exclude: tuple[str, ...] = ()) -> list[inspect.Parameter]:
    """typer parameters for every command-line option of `tree` (all default None, so a
    command knows which options were given and a spec file can fill the rest)."""
    import typer  # the CLI's library; the Python API never needs it

    parameters = []
    for name, f in option_fields(tree).items():
        if not f.metadata["cli"] or name in exclude:
            continue
        decls = [_flag_decl(f)] + ([f.metadata["short"]] if f.metadata["short"] else [])
        default = ... if f.metadata["required"] else None
        parameters.append(inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[_cli_type(f)],
            default=typer.Option(default, *decls, help=_help(f), show_default=False,
                                 metavar=_metavar(f))))
    return parameters


def _flag_decl(f) -> str:
    flag = flag_of(f)
    if isinstance(f.metadata["check"], Flag) and not f.metadata["flag"]:
        return f"{flag}/--no-{flag[2:]}"
    return flag


def _cli_type(f) -> type:
    check = f.metadata["check"]
    if isinstance(check, OneOf):
        return enum.Enum(f.name.title().replace("_", ""), {c: c for c in check.choices},
                         type=str)
    if isinstance(check, Flag):
        return bool
    if check is not None and hasattr(check, "integer"):
        return int if check.integer else float
    return str


def _metavar(f) -> str | None:
    """The declared metavar, else N (whole number), X (number) or TEXT; choices list themselves."""
    check = f.metadata["check"]
    if f.metadata["metavar"] or isinstance(check, (OneOf, Flag)):
        return f.metadata["metavar"]
    if check is not None and hasattr(check, "integer"):
        return "N" if check.integer else "X"
    return "TEXT"


def _help(f) -> str:
    text = f.metadata["help"]
    default = f.metadata["default_text"]
    if (default is None and f.default is not None and f.default is not False
            and f.default is not MISSING and not f.metadata["required"]):
        default = f.default
    return f"{text} (default: {default})" if default is not None else text


def given_options(tree: type, cli_values: dict[str, Any]) -> dict[str, Any]:
    """The options given on the command line, checked; errors name `--rate`."""
    known = option_fields(tree)
    return {name: check_value(known[name], value, flag_of(known[name]))
            for name, value in cli_values.items() if name in known and value is not None}


# ------------------------------------------------------------------ typed Python keywords
KEYWORDS_MODULE = "provisioner/keywords.py"   # written by scripts/generate_keywords.py


def _keyword_type(f) -> str:
    """The type a Python caller may pass for an option (what `from_keywords` accepts)."""
    text = str(f.type).replace("typing.", "")
    optional = text.startswith("Optional[")
    inner = text[len("Optional["):-1] if optional else text
    if inner == "Any":
        return "Any"
    inner = {"tuple": "str | Sequence[Any]", "dict": "dict[str, Any]"}.get(inner, inner)
    if isinstance(f.metadata.get("check"), OneOf) and inner == "str":
        inner = "Literal[" + ", ".join(repr(c) for c in f.metadata["check"].choices) + "]"
    if f.metadata.get("path") and inner == "str":
        inner = "str | PathLike[str]"
    return inner + (" | None" if optional else "")


def keywords_source() -> str:
    """The source of provisioner/keywords.py: a TypedDict per group of options (StudyOptions
    -> StudyKeywords, ...), every public option with the type `from_keywords` accepts and its
    help's first sentence, and per command one that inherits its groups', so that
    `search(**options: Unpack[SearchKeywords])` is typed from the declarations."""
    lines = ['"""Typed keyword arguments of `provisioner.search` and `provisioner.simulate`.',
             "", "Generated from the option declarations (provisioner/options.py) by",
             "`python scripts/generate_keywords.py`; tests/test_keywords.py fails when it is stale.",
             "Every key is optional: a key left out takes the option's default.", '"""',
             "from __future__ import annotations", "", "from os import PathLike",
             "from typing import Any, Literal, Sequence, TypedDict"]
    written: set[str] = set()
    for command, tree in (("SearchKeywords", SearchOptions), ("SimulateKeywords",
                                                             SimulateOptions)):
        bases = []
        for group in fields(tree):
            name = type(group.default).__name__.removesuffix("Options") + "Keywords"
            bases.append(name)
            if name not in written:
                written.add(name)
                lines += ["", "", f"class {name}(TypedDict, total=False):",
                          *_keyword_lines(type(group.default))]
        lines += ["", "", f"class {command}(", *(f"        {base}," for base in bases),
                  "        total=False):",
                  f'    """Every keyword of `provisioner.{command[:-8].lower()}`."""']
    return "\n".join(lines) + "\n"


def _keyword_lines(group: type) -> list[str]:
    lines = []
    for _path, f in leaves(group):
        if not (f.metadata["cli"] or f.metadata["spec"]):
            continue
        first = " ".join(f.metadata["help"].split()).split(". ")[0].rstrip(".")
        line, comment = f"    {f.name}: {_keyword_type(f)}", f"  # {first}"
        if len(line + comment) > 99:
            comment = comment[:99 - len(line) - 1] + "…"
        lines.append(line + comment)
    return lines or ["    pass"]
