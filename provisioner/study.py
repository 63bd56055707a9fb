"""Records of a study: the question, resolved to records once, and the answers.

The question (`Study`) holds records, never names: the catalog, the design records (with their
machine records), the model, the SLO profile, the workload and performance-model sources. The
answers are plain picklable records: `Point` (one cluster at one load), `Outcome` (what its
simulation said), `Metrics` (outcome plus prices) and `DesignResult` (one design's search).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from hardware_catalog import Catalog, Design, InputError, MachineSku, ModelSpec, check_path
from hardware_catalog.errors import option_ref
from provisioner.files import file_sha256
from provisioner.options import LEGACY_ENGINE, Constraints, SearchSettings
from simcore import SimOptions, splitwise_sim
from simcore.engine_overheads import NO_OVERHEADS, EngineOverheads
from simcore.kernels import (EnginePerformanceModel, KernelPerformanceModel,
                             kernel_data_version, tables_sha256)
from simcore.perfmodel import (FittedPerformanceModel, default_performance_model,
                               load_performance_model, perf_model_version)
from simcore.performance import PerformanceModel
from simcore.workload import (BUILTIN_TABLES_PATH, SyntheticSizes, Workload, arrival_count,
                              builtin_workload_names, check_trace_size, closed_loop, cyclic_window,
                              draw_requests, load_trace, parse_lengths, resample_sizes,
                              synthesize)
from slo_profiles import METRICS, PERCENTILES, SloProfile

SLO_KEYS = tuple(f"{m}_{p}" for m in METRICS for p in PERCENTILES)  # the twelve, report order
BUDGET_UNITS = {"power": "kW", "cost": "$/h"}


# ------------------------------------------------------------------------------ the question
@dataclass(frozen=True)
class Budget:
    """A power (kW) or cost ($/h) budget, optionally stated as the draw of N machines of a SKU."""
    kind: str
    value: float
    like: str | None = None   # e.g. "dgx-h100:40"

    def of(self, cost_per_hour: float, power_kw: float) -> float:
        return power_kw if self.kind == "power" else cost_per_hour

    def as_dict(self) -> dict:
        return {"kind": self.kind, "value": self.value, "unit": BUDGET_UNITS[self.kind],
                "like": self.like}


@dataclass(frozen=True)
class ClosedLoad:
    """--concurrency: `users` users sending `requests` requests in a closed loop, each
    thinking an exponential time of mean `think_time_s` between a request's last token and
    its next (docs/closed-loop.md). Every sample of a search is this loop over its seed's
    sizes and think times (`sample`), as `provision simulate --concurrency` builds it.

    `bound_rps` is what the search's capacity bounds size for instead of a rate: a rate every
    cluster that meets the SLOs on the base sample is proven to process at least
    (`provisioner.closedloop.safe_rate`), None when the SLOs prove none (then the bounds size
    for no load: the pools grow from one machine); `bound_why` says how it was derived."""
    users: int
    think_time_s: float
    requests: int
    bound_rps: float | None = None
    bound_why: str = ""

    def sample(self, workload: "WorkloadSource", seed: int) -> Workload:
        """The loop over the sizes `workload` draws with `seed` and think times drawn from it."""
        return closed_loop(workload.closed(self.requests, seed), self.users,
                           self.think_time_s, seed)

    def identity(self) -> dict:
        """What changes a simulated sample (the bound only steers the search)."""
        return {"users": self.users, "think_time_s": self.think_time_s,
                "requests": self.requests}

    def as_dict(self) -> dict:
        return {**self.identity(), "bound_rps": self.bound_rps, "bound_why": self.bound_why}


@dataclass(frozen=True)
class Goal:
    name: str                       # min-cost, min-power or max-rate
    rate_rps: float | None = None   # min-cost / min-power (None: replay a trace as it is, or
    #                                 a closed loop's own load)
    budget: Budget | None = None    # max-rate
    closed: ClosedLoad | None = None   # --concurrency: hold these users instead of a rate

    def __post_init__(self):
        if self.name == "max-rate" and self.budget is None:
            raise InputError(f"{option_ref('goal')} max-rate needs a budget: "
                             f"{option_ref('power_budget_kw')}, "
                             f"{option_ref('cost_budget_per_hour')} or "
                             f"{option_ref('budget_like')} SKU:N", field="goal")
        if self.name != "max-rate" and self.budget is not None:
            raise InputError(f"a budget applies to {option_ref('goal')} max-rate, not "
                             f"{self.name}; limit min-cost/min-power with "
                             f"{option_ref('max_machines')}/{option_ref('max_gpus')}",
                             field="goal")

    @property
    def paper_name(self) -> str:
        if self.closed is not None:
            return f"iso-concurrency {self.name.split('-')[1]}-optimized"
        if self.name == "max-rate":
            return f"iso-{self.budget.kind} throughput-optimized"
        return f"iso-throughput {self.name.split('-')[1]}-optimized"

    def as_dict(self) -> dict:
        record = {"name": self.name, "paper_name": self.paper_name, "rate_rps": self.rate_rps,
                  "budget": self.budget.as_dict() if self.budget else None}
        if self.closed is not None:   # (an open-loop goal's record as before)
            record["closed_loop"] = self.closed.as_dict()
        return record

    def identity(self) -> dict | None:
        """The goal's part of the cache key: a closed loop's users, think time and requests
        (a point's rate is the point's own; the name and budget only steer the search). An
        open-loop goal has none: None, leaving the key as it was."""
        return None if self.closed is None else self.closed.identity()

    @property
    def sizing_rate_rps(self) -> float | None:
        """The rate the capacity bounds and pool floors size for: the goal's, or a closed
        loop's proven lower bound on its throughput (0 without one: no load, floors of one)."""
        if self.closed is not None:
            return self.closed.bound_rps or 0.0
        return self.rate_rps


@dataclass(frozen=True)
class WorkloadSource:
    """A built-in size distribution by name, a CSV trace (identified by its content), lengths
    given as numbers (--isl/--osl) or a serving benchmark's result file (its per-request
    lengths). Built-in, given lengths and a result file are sizes only: their arrivals are
    always synthesized (`SYNTHESIZED`)."""
    name: str                 # as the user wrote it
    kind: str                 # "builtin", "trace", "lengths", "bench" or "mooncake"
    sha256: str               # of the built-in tables file, the trace or result file, the lengths
    path: str | None = None   # the file to read (trace and bench only)
    burstiness_cv: float = 1.0  # synthesized arrivals: Poisson (1) or gamma with this CV
    isl: str | None = None    # "lengths": --isl and --osl, canonical
    osl: str | None = None
    # --prefix-model: sessions over these sizes (simcore.sessions), canonical, and the most
    # tokens a turn may hold (the model's context: `with_context`); None: independent requests
    prefix_model: str | None = None
    context_tokens: int | None = None

    def identity(self) -> dict:
        identity = {"name": self.name, "kind": self.kind, "sha256": self.sha256}
        if self.burstiness_cv != 1.0:
            identity["burstiness_cv"] = self.burstiness_cv
        if self.prefix_model is not None:   # (without one: the key of before)
            identity.update(prefix_model=self.prefix_model, context_tokens=self.context_tokens)
        return identity

    def with_context(self, model: ModelSpec) -> "WorkloadSource":
        """Sessions are cut at the model's context (its longest sequence; a model without
        one: MAX_REQUEST_TOKENS)."""
        if self.prefix_model is None:
            return self
        from hardware_catalog.csvschema import MAX_REQUEST_TOKENS
        from simcore.sessions import parse_prefix_model, session_rate_per_request
        context = model.context_tokens or MAX_REQUEST_TOKENS
        try:   # refused here, before any simulation, naming the option
            session_rate_per_request(self.sizes(), parse_prefix_model(self.prefix_model),
                                     context)
        except InputError as error:
            raise InputError(f"{option_ref('prefix_model')} {self.prefix_model}: "
                             f"{error}") from None
        return replace(self, context_tokens=context)

    @property
    def timed(self) -> bool:
        """Does it record arrival times, replayed when no rate is asked? A trace does; a result
        file when it records its requests' send times (vLLM's start_times)."""
        if self.prefix_model is not None:   # sessions: arrivals always drawn
            return False
        if self.kind in ("trace", "mooncake"):
            return True
        return self.kind == "bench" and _bench(self.path, self.sha256)[1]

    def requests_at(self, rate_rps: float | None, duration_s: float, seed: int,
                    base_seed: int | None = None) -> int:
        """How many requests `at` gives, without drawing their sizes."""
        if rate_rps is None:
            return len(self.sizes())
        if self.kind == "mooncake" or self.prefix_model is not None:
            return len(self.at(rate_rps, duration_s, seed, base_seed))
        return arrival_count(rate_rps, duration_s, seed, **self._arrival())

    def _arrival(self) -> dict:
        return {} if self.burstiness_cv == 1.0 else {"arrival": "gamma",
                                                     "burstiness_cv": self.burstiness_cv}

    def sizes(self):
        """What requests draw their sizes from: a built-in name, a trace or a result file's
        lengths (a `Workload`), or the given lengths (`SyntheticSizes`)."""
        if self.kind == "builtin":
            return self.name
        if self.kind == "lengths":
            return SyntheticSizes(parse_lengths(self.isl), parse_lengths(self.osl))
        if self.kind == "bench":
            return _bench(self.path, self.sha256)[0]
        if self.kind == "mooncake":
            return _mooncake(self.path, self.sha256).workload
        return _trace(self.path, self.sha256)

    def echo(self) -> dict:
        """report.json's workload: its identity, and for a workload with prefixes (a Mooncake
        trace) the prefix-reuse bound (what `--prefix-cache` simulates per instance)."""
        echo = self.identity()
        if self.kind == "mooncake":
            from provisioner.mooncake import reuse_bounds
            echo["prefix_reuse_bound"] = reuse_bounds(self.path, self.sha256)
        if self.prefix_model is not None:
            echo["prefix_reuse_bound"] = self.session_bounds()
        return echo

    def session_bounds(self) -> dict:
        """report.json's echo of a session model's prefix-reuse bound, on a sample of
        BOUND_SAMPLE_S at BOUND_SAMPLE_RATE (the share depends on the rate only through the
        warm-up's cold start, negligible over a long window)."""
        return _session_bounds(self.sizes(), self.prefix_model, self.context_tokens)

    def closed(self, count: int, seed: int, base_seed: int | None = None):
        """`count` requests for a closed loop (arrivals made by the run): sizes drawn from the
        seed as `at` draws them; a workload with prefix blocks (a Mooncake trace) gives its
        first `count` real requests, blocks and all (whatever the seed)."""
        if self.kind != "mooncake":
            return draw_requests(self.sizes(), count, seed)
        trace = self.sizes()
        if count > len(trace):
            raise InputError(f"{option_ref('requests')} {count:,} is more than the "
                             f"{len(trace):,} requests of {self.name}", field="requests")
        return trace.head(count)

    def at(self, rate_rps: float | None, duration_s: float, seed: int, base_seed: int | None = None):
        """One sample of the workload: a built-in distribution, the given lengths or a result
        file's lengths under Poisson arrivals at `rate_rps`, or the trace with its sizes under
        new arrivals. A trace replayed as it is
        (rate None) is itself for the base seed; any other seed keeps its arrival times and
        redraws its (prompt, output) pairs, so the burstiness of the real trace is kept while
        the sizes vary as they would on another day.

        A workload with prefix blocks (a Mooncake trace) keeps its real requests, blocks and
        all, in every sample (`cyclic_window`): without a rate, the trace itself for the base
        seed and the trace shifted cyclically in time for any other; with a rate, a window of
        `duration_s` of its timeline scaled to that rate (from 0 for the base seed, from an
        offset drawn from the seed for any other)."""
        arrival = self._arrival()
        base = seed == (base_seed if base_seed is not None else seed)
        if self.prefix_model is not None:
            from simcore.sessions import parse_prefix_model, synthesize_sessions
            return synthesize_sessions(self.sizes(),
                                       parse_prefix_model(self.prefix_model),
                                       self.context_tokens, rate_rps, duration_s, seed)
        if self.kind == "mooncake":
            trace = self.sizes()
            if rate_rps is None and base:
                return trace
            return cyclic_window(trace, None if base else seed, rate_rps, duration_s)
        if self.kind in SYNTHESIZED and (rate_rps is not None or not self.timed):
            return synthesize(self.sizes(), rate_rps, duration_s, seed, **arrival)
        trace = self.sizes()
        if rate_rps is not None:
            return synthesize(trace, rate_rps, duration_s, seed, **arrival)
        return trace if base else resample_sizes(trace, seed)


# sizes to draw under Poisson arrivals at a rate (a result file's recorded send times are
# replayed only when no rate is asked: `timed`)
SYNTHESIZED = ("builtin", "lengths", "bench")


BOUND_SAMPLE_RATE = 10.0     # req/s of the sample report.json's session bound is measured on
BOUND_SAMPLE_S = 3600.0


def _session_bounds(sizes, prefix_model: str, context: int) -> dict:
    from simcore.sessions import (BLOCK_TOKENS, infinite_cache_hit_share, parse_prefix_model,
                                  synthesize_sessions)
    sample = synthesize_sessions(sizes, parse_prefix_model(prefix_model), context,
                                 BOUND_SAMPLE_RATE, BOUND_SAMPLE_S, 0)
    share = infinite_cache_hit_share(sample.prefix_blocks, sample.prefix_offsets,
                                     sample.prompt_tokens, BLOCK_TOKENS)
    return {"block_tokens": BLOCK_TOKENS, "requests": len(sample),
            "infinite_cache": round(share, 4),
            "simulated": f"a bound (one global cache, a {BOUND_SAMPLE_S:g} s sample at "
                         f"{BOUND_SAMPLE_RATE:g} req/s, seed 0); each sample's notes give its "
                         "own; --prefix-cache on or aware simulates each instance's cache"}


@lru_cache(maxsize=4)
def _trace(path: str, sha256: str):
    return load_trace(path)


@lru_cache(maxsize=4)
def _mooncake(path: str, sha256: str):
    from provisioner.mooncake import read_mooncake
    return read_mooncake(path)


@lru_cache(maxsize=4)
def _bench(path: str, sha256: str) -> tuple[Workload, bool]:
    """A result file's successful requests as a workload (their lengths; their recorded send
    times from the first, when the file has them), and whether it has them."""
    from provisioner.benchfiles import read_bench_lengths
    lengths = read_bench_lengths(path)
    prompt = np.asarray(lengths.prompt_tokens, dtype=np.int64)
    output = np.asarray(lengths.output_tokens, dtype=np.int64)
    note = (f"{len(prompt)} successful requests of {lengths.runs} "
            f"{'benchmark(s)' if lengths.format == 'guidellm' else 'run(s)'} in "
            f"{Path(path).name} ({lengths.format})")
    if lengths.start_times is None:
        return Workload(Path(path).name, np.zeros(len(prompt)), prompt, output, (note,)), False
    times = np.asarray(lengths.start_times, dtype=np.float64)
    order = np.argsort(times, kind="stable")
    note += ", at their recorded send times (start_times) from the first"
    return Workload(Path(path).name, times[order] - times.min(), prompt[order], output[order],
                    (note,)), True


def lengths_source(isl: str, osl: str) -> WorkloadSource:
    """--isl / --osl: a workload of those lengths (canonical spellings, checked)."""
    isl, osl = parse_lengths(isl).text, parse_lengths(osl).text
    name = f"isl={isl},osl={osl}"
    return WorkloadSource(name, "lengths", hashlib.sha256(name.encode()).hexdigest(),
                          isl=isl, osl=osl)


def workload_source(name: str, base_dir: Path | None = None) -> WorkloadSource:
    """A built-in name wins over a file of the same name in the working directory. A JSON or
    YAML file holding a `vllm bench serve` or GuideLLM result is a result file; JSON lines with
    the Mooncake keys a Mooncake trace (`provisioner.mooncake`); others are CSV traces."""
    if name in builtin_workload_names():
        return WorkloadSource(name, "builtin", file_sha256(BUILTIN_TABLES_PATH))
    check_path(name, "workload")
    path = Path(name)
    if not path.exists() and base_dir is not None and (base_dir / name).exists():
        path = base_dir / name
    if not path.is_file():
        raise InputError(f"workload '{name}' is neither a built-in workload "
                         f"({', '.join(builtin_workload_names())}) nor an existing file",
                         field="workload")
    check_trace_size(path)   # before hashing it
    from provisioner.mooncake import is_mooncake
    if is_mooncake(path):
        return WorkloadSource(name, "mooncake", file_sha256(path), str(path))
    if path.suffix.lower() in BENCH_SUFFIXES:
        from provisioner.benchfiles import bench_format
        if bench_format(path) is not None:
            return WorkloadSource(name, "bench", file_sha256(path), str(path))
    return WorkloadSource(name, "trace", file_sha256(path), str(path))


BENCH_SUFFIXES = (".json", ".jsonl", ".yaml", ".yml")


DTYPE_BYTES = {"bf16": 2, "fp8": 1}   # bytes per value of a KV cache, and of bf16/fp8 weights
# NVFP4 weights: a 4-bit value plus one fp8 scale per block of 16 values (NVIDIA's
# TensorRT Model Optimizer NVFP4 format) = 0.5625 bytes per value
FP4_WEIGHT_BYTES = 0.5 + 1.0 / 16
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}


# --kv-dtype auto: the KV cache data type each engine uses by default, given the weights'
# --dtype. vLLM and SGLang: `--kv-cache-dtype auto` stores the KV in the model's data type,
# bf16 also with fp8 weights (docs.vllm.ai: Engine Arguments, Quantized KV Cache; SGLang docs:
# Quantized KV Cache); fp8 KV is opt-in. TensorRT-LLM: `KvCacheConfig(dtype="auto")` follows
# the checkpoint's kv_cache_quant_algo (NVIDIA/TensorRT-LLM#16240), FP8 in NVIDIA's ModelOpt
# fp8 and fp4 checkpoints (AIConfigurator assumes the same for fp8 checkpoints).
KV_DEFAULT = {"vllm": lambda dtype: "bf16", "sglang": lambda dtype: "bf16",
              "trtllm": lambda dtype: "bf16" if dtype == "bf16" else "fp8",
              LEGACY_ENGINE: lambda dtype: "bf16"}


def kv_dtype_of(engine: str, dtype: str, kv_dtype: str) -> str:
    """--kv-dtype resolved: as given, or (auto) what the engine does with `dtype` weights."""
    return KV_DEFAULT[engine](dtype) if kv_dtype == "auto" else kv_dtype


def model_in_dtype(model: ModelSpec, dtype: str, kv_dtype: str | None = None) -> ModelSpec:
    """The model record with its weights in `dtype` and its KV cache in `kv_dtype` (default:
    `dtype`, fp8 for fp4 weights); bf16: as the catalog states it, fp8: one byte per value,
    fp4: FP4_WEIGHT_BYTES per value (a stated weight size scaled alike; the record's
    bytes_per_value says 1, what its activations and an fp4 checkpoint's other tensors use)."""
    kv = kv_dtype or ("fp8" if dtype == "fp4" else dtype)
    kv_size = model.bytes_per_value if kv == "bf16" else DTYPE_BYTES[kv]
    size = FP4_WEIGHT_BYTES if dtype == "fp4" else DTYPE_BYTES[dtype]
    if dtype != "bf16" and model.bytes_per_value != size:
        weights = (model.params_b * 1e9 if model.weights_bytes is None
                   else model.weights_bytes / model.bytes_per_value) * size
        if dtype != "fp4" and model.weights_bytes is None:
            weights = None      # fp8: params x bytes per value, as before
        model = replace(model, bytes_per_value=min(int(size) or 1, model.bytes_per_value),
                        weights_bytes=weights)
    if kv_size != model.bytes_per_value:
        model = replace(model, kv_bytes_per_value=kv_size)
    return model


@dataclass(frozen=True)
class PerfSource:
    """Whose latencies: an engine's kernel tables (vllm, sglang, trtllm; the 2023 model where
    they have no data), the model fitted to the 2023 Splitwise profiles (splitwise-2023), or a
    user's file identified by its content (it wins over the engine)."""
    path: str | None = None     # the file to read
    sha256: str | None = None
    name: str = "default"       # as the user wrote it
    latency_factor: float = 1.0   # every latency scaled (sensitivity to a model error)
    # "splitwise-sim": the default model answers with SplitwiseSim's latency curves where its
    # profiles cover the pair (simcore.splitwise_sim; the preset, without --perf-model)
    latency_model: str = "provision"
    engine: str = LEGACY_ENGINE   # --engine (the option's default is vllm)
    dtype: str = "bf16"           # --dtype
    kv_dtype: str = "bf16"        # --kv-dtype, resolved (never "auto")
    # the engine's time around its kernels, on kernel-composed pairs (`uses_kernels` only)
    overheads: EngineOverheads = NO_OVERHEADS

    @property
    def uses_kernels(self) -> bool:
        """The engine's kernel tables answer (no user file, no preset curves)."""
        return (self.path is None and self.latency_model == "provision"
                and self.engine != LEGACY_ENGINE)

    def identity(self) -> dict:
        identity = {"name": self.name, "sha256": self.sha256, "version": perf_model_version(),
                    "engine": self.engine, "dtype": self.dtype}
        if (self.dtype, self.kv_dtype) != ("bf16", "bf16"):   # all-bf16 reports unchanged
            identity["kv_dtype"] = self.kv_dtype
        if self.uses_kernels:
            identity["engine_overheads"] = self.overheads.as_dict()
            identity["kernel_data"] = kernel_data_version()
            identity["kernel_tables_sha256"] = tables_sha256(self.engine, self.dtype,
                                                             self.kv_dtype)[:16]
        if self.latency_model != "provision":
            identity["latency_model"] = (f"{self.latency_model} curves "
                                         f"{splitwise_sim.curves_sha256()[:12]}")
        if self.latency_factor != 1.0:
            identity["latency_factor"] = self.latency_factor
        return identity

    def load(self, catalog: Catalog):
        """Built once per process (workers included); the hash makes an edited file new."""
        model = self._load(catalog)
        return model if self.latency_factor == 1.0 else _Scaled(model, self.latency_factor)

    def _load(self, catalog: Catalog):
        if self.path is None:
            if self.latency_model == "splitwise-sim":
                return _splitwise_sim_model()
            if self.engine == LEGACY_ENGINE:
                return default_performance_model()
            return _engine_model(self.engine, self.dtype, self.kv_dtype, self.overheads)
        # keyed by the names a table is checked against (a Catalog holds dicts: not hashable)
        key = (self.path, self.sha256, tuple(catalog.machines), tuple(catalog.models))
        if key not in _LOADED_MODELS:
            _LOADED_MODELS[key] = load_performance_model(self.path, catalog)
        return _LOADED_MODELS[key]


_LOADED_MODELS: dict = {}  # one load per file and catalog per process (workers included)


def _own_default_model() -> FittedPerformanceModel:
    """A copy of the default model with a curve cache of its own: the caches are keyed by
    names, and a preset's or an fp8 model's record (weights, KV bytes) differs from the
    catalog's."""
    default = default_performance_model()
    return FittedPerformanceModel(default.groups, transfer=default.transfer, source=default.source)


@lru_cache(maxsize=1)
def _splitwise_sim_model():
    """SplitwiseSim's curves, over its own copy of the default model (`_own_default_model`)."""
    return splitwise_sim.SplitwiseSimPerformance(_own_default_model())


@lru_cache(maxsize=None)
def _engine_model(engine: str, dtype: str, kv_dtype: str = "bf16",
                  overheads: EngineOverheads = NO_OVERHEADS) -> EnginePerformanceModel:
    """The engine's kernel model, its overheads on the curves it composes, with the 2023 model
    for the pairs it does not cover (for fp8, its own copy of it: `_own_default_model`; the
    2023 profiles are measured iterations, overheads included)."""
    fallback = (default_performance_model() if (dtype, kv_dtype) == ("bf16", "bf16")
                else _own_default_model())
    return EnginePerformanceModel(KernelPerformanceModel(engine, dtype, kv_dtype=kv_dtype,
                                                         overheads=overheads), fallback)


@dataclass(frozen=True)
class _Scaled(PerformanceModel):
    """A performance model whose every latency is `factor` times the model's."""
    model: PerformanceModel
    factor: float

    def curves(self, model, machine, tp=None):
        return self.model.curves(model, machine, tp).scaled(self.factor, self.factor)

    def is_calibrated(self, model, machine, tp=None) -> bool:
        return self.model.is_calibrated(model, machine, tp)

    def prices_expert_parallelism(self, model, machine) -> bool:
        return self.model.prices_expert_parallelism(model, machine)

    def expert_parallel_curves(self, model, machine, layout):
        return self.model.expert_parallel_curves(model, machine, layout).scaled(self.factor,
                                                                                self.factor)


def perf_source(path: str | None, base_dir: Path | None = None, engine: str = LEGACY_ENGINE,
                dtype: str = "bf16", kv_dtype: str = "bf16") -> PerfSource:
    if path is None:
        return PerfSource(engine=engine, dtype=dtype, kv_dtype=kv_dtype)
    check_path(path, "perf_model")
    resolved = Path(path)
    if not resolved.exists() and base_dir is not None and (base_dir / path).exists():
        resolved = base_dir / path
    if not resolved.is_file():
        raise InputError(f"performance model file not found: {path}", field="perf_model")
    return PerfSource(str(resolved), file_sha256(resolved), name=path, engine=engine,
                      dtype=dtype, kv_dtype=kv_dtype)


@dataclass(frozen=True)
class Window:
    """The arrival window a question runs (`provisioner.question.resolve_window`): --duration
    as given, or derived from the workload (its tail lengths, their time alone)."""
    duration_s: float
    source: str                 # "given" (--duration) or "derived"
    why: str                    # one clause: the option, or the rule's figures
    alone_s: float | None = None      # derived: a tail request's time alone on the reference
    tail_prompt: int | None = None    # derived: the workload's P99 prompt tokens
    tail_output: int | None = None    # and output tokens

    def as_dict(self) -> dict:
        record = {"duration_s": self.duration_s, "source": self.source, "why": self.why}
        if self.source == "derived":
            record.update(tail_prompt_tokens=self.tail_prompt,
                          tail_output_tokens=self.tail_output, alone_s=self.alone_s)
        return record


def window_text(window: dict | None, duration: float | None = None) -> str:
    """The window a report used and why, for the terminal and report.html (a report written
    before windows were derived has no record: its echoed --duration)."""
    if not window:
        return f"{duration:g} s" if duration is not None else ""
    if window["source"] == "given":
        return f"{window['duration_s']:g} s (--duration)"
    return f"{window['duration_s']:g} s ({window['why']})"


OUTCOME = {"outcome": True}   # a Study field that changes a simulated outcome (cache identity)


@dataclass(frozen=True)
class Study:
    """Everything a search simulates and optimises, as records. The fields marked `OUTCOME`
    change what a simulated sample says and make up the evaluation cache's identity
    (`provisioner.question.identity`); the others (designs, constraints) are carried by the
    points or only steer the search, and so does the goal but for its closed loop, if any.
    `options` is the question as asked, for the echo."""
    catalog: Catalog
    model: ModelSpec = field(metadata=OUTCOME)
    workload: WorkloadSource = field(metadata=OUTCOME)
    duration_s: float = field(metadata=OUTCOME)
    seed: int = field(metadata=OUTCOME)   # the base sample (a replayed trace is itself there)
    slo: SloProfile = field(metadata=OUTCOME)
    perf: PerfSource = field(metadata=OUTCOME)
    reference: MachineSku = field(metadata=OUTCOME)   # slowdowns are against this machine
    designs: tuple[Design, ...]
    goal: Goal = field(metadata=OUTCOME)   # its closed loop, if any (`Goal.identity`)
    constraints: Constraints
    settings: SearchSettings = field(metadata=OUTCOME)   # its outcome options: slo_confidence
    sim_options: SimOptions = field(default=SimOptions(), metadata=OUTCOME)
    chunk_tokens: int | str | None = None   # --chunk-tokens as given ("auto": searched)
    assumptions: str = "provision"   # the preset the catalog and options were resolved under
    survive_failures: int = field(default=0, metadata=OUTCOME)  # N+k: pass with k machines down
    survive_auto: bool = False   # --survive-failures auto: k chosen from MTBF and repair time
    layout: Any = None    # LayoutOptions: pinned tp / pp (None: every layout that fits)
    options: Any = None   # the SearchOptions the study was resolved from
    hardware: bool = False   # --hardware: designs generated over SKUs, searched by bound
    load_curve: Any = None   # --load-curve: (planning windows, PlanRules, LoadCurve); goal at
    #                          the busiest window
    window: Window | None = None   # duration_s as given (--duration) or derived, and why

    def auxiliary(self, **changes) -> "Study":
        """This study, with `changes`, for a search another one runs (a sensitivity variant,
        a plain search beside N+k, a window rate of a load curve, a trial of spares): its
        optima only, so no sensitivity table, no load sweep and no load-curve plan of its own."""
        settings = replace(self.settings, sensitivity=False, load_sweep=())
        return replace(self, settings=settings, load_curve=None, **changes)


class Asked(dict):
    """What `on_batch` receives: the points asked so far per search name (a plain dict to
    read), with `finished`, the names whose search has returned, and `search`, one object per
    `frontier.drive` call, so that a listener tells one search from the next (the progress ETA)."""

    def __init__(self, asked: dict[str, int], finished=(), search: object = None):
        super().__init__(asked)
        self.finished = frozenset(finished)
        self.search = search


# ------------------------------------------------------------------------------- the answers
@dataclass(frozen=True, order=True)
class Point:
    """One cluster at one load: P prompt + T token machines (baselines: P machines, T = 0).

    rate_rps None replays a trace as it is (no resampling).
    """
    design: Design   # the record itself; points are only ordered within one design
    prompt_machines: int
    token_machines: int
    rate_rps: float | None

    def __repr__(self) -> str:   # the design's name, not its whole record (notebooks)
        pools = self.design.pools_text(self.prompt_machines, self.token_machines)
        rate = "trace" if self.rate_rps is None else f"{self.rate_rps:g} req/s"
        return f"Point({self.design.name} {pools} at {rate})"


@dataclass(frozen=True)
class Outcome:
    """What a simulation says about a point (the cacheable part of `Metrics`)."""
    meets_slos: bool               # every request finished and every SLO held
    completed: bool                # every request finished
    reason: str
    slo: tuple[tuple[str, float | None, float | None], ...]  # (key, value, limit) for the nine
    worst_margin: float | None     # min over the limited SLOs of 1 - value/limit
    requests: int


@dataclass(frozen=True)
class Metrics:
    """One evaluated point: its outcome over the samples evaluated, and its prices."""
    point: Point
    outcome: Outcome
    cost_per_hour: float
    power_kw: float
    gpus: int
    samples: tuple[tuple[int, Outcome], ...] = ()   # (seed, outcome) of each sample evaluated

    def __repr__(self) -> str:
        verdict = "meets the SLOs" if self.meets_slos else f"fails: {self.outcome.reason}"
        return (f"Metrics({self.point!r}, ${self.cost_per_hour:,.2f}/h, {self.power_kw:,.1f} kW,"
                f" {len(self.samples)} sample(s), {verdict})")

    @classmethod
    def of(cls, point: Point, outcome: Outcome,
           samples: tuple[tuple[int, Outcome], ...] = ()) -> "Metrics":
        d, p, t = point.design, point.prompt_machines, point.token_machines
        return cls(point, outcome, d.cost_per_hour(p, t), d.power_kw(p, t), d.gpus(p, t),
                   samples)

    @property
    def meets_slos(self) -> bool:
        return self.outcome.meets_slos

    @property
    def prompt_machines(self) -> int:
        return self.point.prompt_machines

    @property
    def token_machines(self) -> int:
        return self.point.token_machines

    @property
    def rate_rps(self) -> float | None:
        return self.point.rate_rps


@dataclass
class DesignResult:
    design: Design
    goal: Goal
    optimum: Metrics | None
    reason: str                                  # why nothing is feasible (optimum None)
    points: list[Metrics]                        # every point this search evaluated
    frontier: list[tuple[int, int]] = field(default_factory=list)  # corners or budget candidates
    non_monotone: list[dict] = field(default_factory=list)
    box: tuple[int, int] | None = None          # largest (P, T) the search considered
    headroom_rps: float | None = None           # highest rate the optimum sustains (verified)
    chunk_search: list[dict] = field(default_factory=list)  # --chunk-tokens auto: every budget
    verification: dict | None = None            # per-sample SLO values, intervals, binding SLO
    uncalibrated: list[str] = field(default_factory=list)  # SKUs with datasheet-scaled latencies
    rejected: list[dict] = field(default_factory=list)  # candidates that failed a verification seed
    resilience: dict | None = None   # --survive-failures: the plain and failure-aware optima
    # --prefix-cache on|aware: the optimum of the same question with the cache off, and what
    # the cache saved against it (`provisioner.api.cache_savings`)
    prefix_savings: dict | None = None
    layout: dict | None = None   # each pool's layout (provisioner.layouts.layout_record)
    capacity_bound: dict | None = None  # the chosen layout's bound: value, pool floors
    layouts: list[dict] = field(default_factory=list)   # every layout combination: its fate
    layouts_skipped: list[dict] = field(default_factory=list)   # pool layouts that cannot run
    pruned: bool = False   # --hardware: not searched (or not to the end): it cannot win
    # and why: {"by": "capacity_bound" | "search", "cannot_beat": the objective it cannot
    # do better than (its bound; or the best found when it was searched only where it could
    # win), "answer": {"design", "value"}: the search's answer}
    pruned_by: dict | None = None
    unit_costs: dict | None = None   # the optimum's tokens/s, $ and kWh per M tokens (unitcosts)

    @property
    def status(self) -> str:
        """feasible, infeasible, or pruned (by a bound: it cannot beat the best design)."""
        return "pruned" if self.pruned else "feasible" if self.feasible else "infeasible"

    def __repr__(self) -> str:   # one line, not every evaluated point (notebooks)
        if self.optimum is None:
            return f"DesignResult({self.design.name}: {self.status}, {len(self.points)} points)"
        return (f"DesignResult({self.design.name}: {self.optimum!r}, "
                f"{len(self.points)} points)")

    @property
    def feasible(self) -> bool:
        """An optimum exists: some configuration meets the SLOs within the constraints."""
        return self.optimum is not None
