"""The performance model: iteration latencies of a model on a machine, as `LatencyCurves`.

Default model (physically based, calibrated; works with no file at all)
-----------------------------------------------------------------------
A prompt (prefill) iteration over T prompt tokens, split into n prompts, takes

    t_prompt = (o + smax_k(M, C * T * kappa(T))) * n**gamma
    kappa(T) = 1 + r * logistic(ln(T / T_knee) / w)

- o: fixed per-iteration overhead (kernel launches, tensor-parallel all-reduces);
- M: memory floor (reading the weights once; small prompts are memory/overhead bound);
- C: seconds per prompt token of the compute roofline, 2 x active parameters / (peak FLOP/s x a
  fitted efficiency);
- smax_k(a, b) = (a^k + b^k)^(1/k): the roofline max(memory, compute), with a fitted knee
  sharpness k (small iterations are memory bound, large ones compute bound);
- kappa: a documented correction. Every profile shows the per-token cost rising by r (40-100%)
  between ~2k and ~8k tokens per iteration (a GPU throughput knee the roofline lacks); kappa is a
  monotone logistic step in log tokens with fitted centre T_knee, width w and rise r;
- n**gamma: a batch-shape factor (|gamma| <= 0.1): at equal total tokens a batch of n prompts
  runs n**gamma times a single prompt (gamma < 0 where attention over one long prompt dominates,
  > 0 where per-sequence costs do). It keeps batched profile rows from biasing the single-prompt
  curve; `curves()` tabulates n = 1 (the simulator batches prompts only up to 2048 tokens and
  runs longer ones alone, so its large iterations are single prompts).

A decode iteration of b requests holding X context tokens in all takes

    t_decode = o_d + smax_k(M_d, C_d * b) + K * X

with o_d the per-iteration overhead, M_d the weight-read time, C_d the cost per request (the
memory-to-compute knee sits at b = M_d / C_d) and K the cost of reading one token's KV cache.
Decode latency therefore depends on the batch size, never on a prompt-token curve.

The coefficients per calibrated (model.perf_profile, machine.perf_profile, tensor parallelism)
pair are derived data in `simcore/data/perf_coefficients.json`, written by `provision calibrate`
from the public SplitwiseSim profiles (TP8 rows of llama2-70b and bloom-176b on a100-80gb and
h100-80gb; the synthetic h100-80gb-pcap rows are not fitted: capped machines use the H100 curves
with the catalog's `prompt_slowdown`).

Uncalibrated pairs (a model with perf_profile None, or a machine with calibrated: false) are
scaled from the closest calibrated pair: the pair of the machine's perf_profile hardware and
the calibrated model closest in active parameters (or the model's own perf_profile). Each term
scales by its datasheet ratio: prompt compute C by (active params / peak FLOP/s); the weight
terms M, M_d by (weight bytes / HBM bandwidth); decode per-request cost C_d by (active params /
HBM bandwidth), because the measured knee batch is about the same on A100 and H100 although
their FLOP/byte ratios differ by 2x (decode compute tracks bandwidth); the context term K by
(KV bytes per token / HBM bandwidth), so grouped-query attention shrinks it; the overheads o,
o_d by the layer count (per-layer launches and all-reduces). Knee shapes (k, kappa, gamma) are
kept. SPEC 3 warns that such datasheet transfer is good to 15-30% only.

Curves
------
`curves()` tabulates the closed form onto piecewise-linear knots (`simcore.latency`): prompt
every 16 tokens up to 32,768, decode every integer batch up to 512 and every 8 up to 4,096,
with knots added where the curve bends until every segment's midpoint is within 0.02%; the
tabulation stays within 0.1% of the closed form over that range (tests check it). Beyond the
last knot the last segment continues (the closed forms are asymptotically linear there). The power cap
(`machine.prompt_slowdown`) multiplies prompt latencies only; token iterations are unchanged.

Chunked prefill
---------------
A prompt chunk of c tokens whose prompt has c0 tokens cached adds
max(c0 x max(A x c, R), W(c0 + c) - W(c0) - W(c)) to its iteration, W the prompt curve
(attention over the earlier chunks: its compute or re-reading their KV, at least what the
whole-prompt curve charges for the longer context; see `simcore.latency`). A = C x 2 x layers x hidden / active params (C's fitted seconds per FLOP
times the 4 x layers x hidden attention FLOPs per token pair), R = K (the fitted KV read cost of
a decode). A latency table has no chunk dimension: its pairs take A and R from the default model
(or, for a pair the default model cannot cover, from the datasheet roofline at full efficiency).

Files (`load_performance_model`)
--------------------------------
- a coefficients document (JSON or YAML, the file `provision calibrate --out` writes): a mapping
  with `format: provision-perf-coefficients/1` and `groups`, one per (model, hardware,
  tensor_parallel), each with `prompt` and `decode` coefficients (seconds) and an optional
  `reference` (the datasheet figures the fit ran against). A group applies to a catalog model
  whose name or perf_profile equals `model`, with tensor_parallel equal, on a machine whose name
  equals `hardware` (or whose perf_profile does, when the machine is calibrated);
- a piecewise-linear latency table (YAML or CSV), see `simcore.perftables`.
Pairs a file does not cover fall back to the default model. Every source gives uncapped
latencies; `curves()` applies the power cap on top.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from hardware_catalog import Catalog, InputError, MachineSku, ModelSpec, read_json, read_yaml
from hardware_catalog.checks import Invalid, Number
from simcore import perftables
from simcore.latency import LatencyCurves
from simcore.performance import PerformanceModel

__all__ = ["perf_model_version", "CLOSED_FORM_VERSION", "COEFFICIENTS_FORMAT", "PromptCoefficients",
           "DecodeCoefficients", "Reference", "PairCoefficients", "FittedPerformanceModel",
           "default_performance_model", "load_performance_model", "coefficients_document",
           "parse_coefficients_document", "tabulate", "PROMPT_KNOTS", "DECODE_KNOTS"]

CLOSED_FORM_VERSION = "1"  # bump when the formulas change
COEFFICIENTS_FORMAT = "provision-perf-coefficients/1"
DEFAULT_COEFFICIENTS = Path(__file__).resolve().parent / "data" / "perf_coefficients.json"


@lru_cache(maxsize=1)
def perf_model_version() -> str:
    """Identifies the default model for result caches: the formulas and the packaged
    coefficients (hashed on first use, not at import)."""
    digest = hashlib.sha256(DEFAULT_COEFFICIENTS.read_bytes()).hexdigest()[:12]
    return f"{CLOSED_FORM_VERSION}-{digest}"

# Base knots of the tabulated curves, refined where the closed form bends (see `tabulate`).
PROMPT_KNOTS = np.concatenate(([1.0], np.arange(16.0, 32768.0 + 1, 16.0)))
DECODE_KNOTS = np.concatenate((np.arange(1.0, 512.0), np.arange(512.0, 4096.0 + 1, 8.0)))
TABULATION_TOLERANCE = 2e-4  # midpoint error bound; the whole curve stays within 0.1%


def tabulate(function, knots: np.ndarray, tolerance: float = TABULATION_TOLERANCE):
    """Knots and values of a piecewise-linear approximation of a smooth increasing function.

    Segments whose midpoint misses the function by more than `tolerance` (relative) are split
    until none does (linear interpolation errs most near a segment's middle).
    """
    x = np.asarray(knots, dtype=np.float64)
    y = function(x)
    for _ in range(30):
        mid = 0.5 * (x[:-1] + x[1:])
        bad = np.abs(0.5 * (y[:-1] + y[1:]) / function(mid) - 1.0) > tolerance
        if not bad.any():
            break
        x = np.sort(np.concatenate((x, mid[bad])))
        y = function(x)
    return x, y


def soft_max(a, b, k):
    """(a^k + b^k)^(1/k) for positive a, b, computed without overflow."""
    top = np.maximum(a, b)
    return top * ((a / top) ** k + (b / top) ** k) ** (1.0 / k)


def logistic(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # overflow-free form of 1 / (1 + e^-x)


@dataclass(frozen=True)
class PromptCoefficients:
    """Closed-form prefill latency; see the module docstring for the formula."""
    overhead_s: float
    memory_s: float
    compute_s_per_token: float
    sharpness: float
    knee_tokens: float
    knee_width: float
    knee_rise: float
    batch_exponent: float

    def seconds(self, tokens, prompts=1):
        """Latency of one prefill iteration of `tokens` tokens in all, over `prompts` prompts."""
        t = np.maximum(np.asarray(tokens, dtype=np.float64), 1e-9)
        kappa = 1.0 + self.knee_rise * logistic(np.log(t / self.knee_tokens) / self.knee_width)
        roofline = soft_max(self.memory_s, self.compute_s_per_token * t * kappa, self.sharpness)
        shape = np.asarray(prompts, dtype=np.float64) ** self.batch_exponent
        return (self.overhead_s + roofline) * shape


@dataclass(frozen=True)
class DecodeCoefficients:
    """Closed-form decode latency; see the module docstring for the formula."""
    overhead_s: float
    memory_s: float
    compute_s_per_request: float
    sharpness: float
    context_s_per_token: float

    def seconds(self, batch, context_tokens=0):
        """Latency of one decode iteration of `batch` requests holding `context_tokens` in all."""
        b = np.asarray(batch, dtype=np.float64)
        roofline = soft_max(self.memory_s, self.compute_s_per_request * b, self.sharpness)
        return (self.overhead_s + roofline
                + self.context_s_per_token * np.asarray(context_tokens, dtype=np.float64))


@dataclass(frozen=True)
class Reference:
    """Datasheet figures of the (model, machine) a fit ran against: the base of any transfer."""
    layers: int
    flops_params_b: float
    weight_bytes: float
    kv_bytes_per_token: float
    peak_flops: float          # machine total, FLOP/s (dense fp16)
    hbm_bytes_per_s: float     # machine total

    @classmethod
    def of(cls, model: ModelSpec, machine: MachineSku, gpus: int | None = None) -> "Reference":
        """The figures of `gpus` GPUs of the machine (all of them by default: an instance)."""
        gpus = gpus or machine.gpus
        return cls(model.layers, model.flops_params_b, model.weight_bytes,
                   float(model.kv_bytes_per_token), gpus * machine.fp16_tflops * 1e12,
                   gpus * machine.hbm_bandwidth_gbs * 1e9)


@dataclass(frozen=True)
class PairCoefficients:
    """Fitted coefficients of one (model, hardware, tensor_parallel) group of a profile."""
    model: str
    hardware: str
    tensor_parallel: int
    prompt: PromptCoefficients
    decode: DecodeCoefficients
    reference: Reference | None = None

    def transferred(self, model: ModelSpec, machine: MachineSku, tp: int) -> "PairCoefficients":
        """These coefficients scaled to another model/machine by datasheet ratios (see module doc)."""
        ref, new = self.reference, Reference.of(model, machine, tp)
        per_flop = (new.flops_params_b / new.peak_flops) / (ref.flops_params_b / ref.peak_flops)
        weights = (new.weight_bytes / new.hbm_bytes_per_s) / (ref.weight_bytes / ref.hbm_bytes_per_s)
        per_request = ((new.flops_params_b / new.hbm_bytes_per_s)
                       / (ref.flops_params_b / ref.hbm_bytes_per_s))
        kv = ((new.kv_bytes_per_token / new.hbm_bytes_per_s)
              / (ref.kv_bytes_per_token / ref.hbm_bytes_per_s))
        layers = new.layers / ref.layers
        p, d = self.prompt, self.decode
        prompt = replace(p, overhead_s=p.overhead_s * layers, memory_s=p.memory_s * weights,
                         compute_s_per_token=p.compute_s_per_token * per_flop)
        decode = replace(d, overhead_s=d.overhead_s * layers, memory_s=d.memory_s * weights,
                         compute_s_per_request=d.compute_s_per_request * per_request,
                         context_s_per_token=d.context_s_per_token * kv)
        return PairCoefficients(model.name, machine.name, tp, prompt, decode,
                                new)

    def curves(self) -> LatencyCurves:
        """The closed forms tabulated onto knots (single prompts; uncapped)."""
        prompt_x, prompt_y = tabulate(self.prompt.seconds, PROMPT_KNOTS)
        decode_x, decode_y = tabulate(self.decode.seconds, DECODE_KNOTS)
        return LatencyCurves(prompt_x, prompt_y, decode_x, decode_y,
                             self.decode.context_s_per_token)

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "hardware": self.hardware,
                "tensor_parallel": self.tensor_parallel,
                "prompt": _plain(self.prompt), "decode": _plain(self.decode),
                "reference": _plain(self.reference) if self.reference else None}


def _plain(record) -> dict[str, Any]:
    """Dataclass fields as plain Python numbers (full precision: files round-trip exactly)."""
    return {f.name: getattr(record, f.name) for f in fields(record)}


class FittedPerformanceModel(PerformanceModel):
    """Latency curves per (model, machine): from tables, fitted coefficients or the default
    (the `simcore.performance.PerformanceModel` of the 2023 fit, `calibrate` and user tables).

    Resolution for a pair: a table for (machine, model), then a table for the machine (any
    model); then a coefficient group that covers the pair directly; then, for the default model
    only, a transfer from the closest calibrated pair. Pairs a user file does not cover go to
    `fallback` (the default model). Results are cached per (model.name, machine.name).
    """

    def __init__(self, groups: Iterable[PairCoefficients] = (),
                 tables: Mapping[tuple[str, str | None], LatencyCurves] | None = None,
                 fallback: "FittedPerformanceModel | None" = None, transfer: bool = False,
                 source: str = "default"):
        self.groups = tuple(groups)
        self.tables = dict(tables or {})
        self.fallback = fallback
        self.transfer = transfer
        self.source = source
        self._cache: dict[tuple[str, str], LatencyCurves] = {}

    def curves(self, model: ModelSpec, machine: MachineSku,
               tp: int | None = None) -> LatencyCurves:
        """Latency curves in seconds, the power cap applied to prompt latencies only."""
        tp = tp or machine.instance_tp
        key = (model.name, machine.name, tp)
        if key not in self._cache:
            attention_s, kv_read_s = self.chunk_terms(model, machine, tp)
            self._cache[key] = self._uncapped(model, machine, tp).with_chunk_terms(
                attention_s, kv_read_s).scaled(prompt_factor=machine.prompt_slowdown)
        return self._cache[key]

    def chunk_terms(self, model: ModelSpec, machine: MachineSku,
                    tp: int | None = None) -> tuple[float, float]:
        """(A, R) of chunked prefill (see the module docstring), uncapped.

        From the coefficients used for the pair: A = C x 2 x layers x hidden / active params
        (the fitted seconds per FLOP of prompt compute, C / (2 x params), times the 4 x layers x
        hidden attention FLOPs per token pair); R = K, the fitted cost of reading one token's KV
        in a decode iteration. A pair covered by a latency table (which has no chunk dimension)
        takes them from the default model; a pair nothing covers, from the datasheet roofline
        (A = 4 x layers x hidden / peak FLOP/s, R = KV bytes per token / HBM bandwidth).
        """
        try:
            pair = self.coefficients(model, machine, tp)
            if pair is None:
                pair = default_performance_model().coefficients(model, machine, tp)
        except InputError:
            pair = None
        if pair is None:
            reference = Reference.of(model, machine, tp)
            return (4.0 * model.layers * model.hidden / reference.peak_flops,
                    reference.kv_bytes_per_token / reference.hbm_bytes_per_s)
        attention = (pair.prompt.compute_s_per_token * 2.0 * model.layers * model.hidden
                     / (model.flops_params_b * 1e9))
        return attention, pair.decode.context_s_per_token

    def is_calibrated(self, model: ModelSpec, machine: MachineSku,
                      tp: int | None = None) -> bool:
        """Are the pair's latencies measured (a table, or coefficients fitted to this pair),
        rather than scaled from another pair by datasheet ratios (15-30% error)?"""
        if self._table(model, machine, tp) is not None or self._direct(model, machine, tp) is not None:
            return True
        return self.fallback is not None and self.fallback.is_calibrated(model, machine, tp)

    def coefficients(self, model: ModelSpec, machine: MachineSku,
                     tp: int | None = None) -> PairCoefficients | None:
        """The closed-form coefficients used for the pair (None when a table covers it)."""
        if self._table(model, machine, tp) is not None:
            return None
        own = self._own(model, machine, tp)
        if own is not None:
            return own
        if self.fallback is not None:
            return self.fallback.coefficients(model, machine, tp)
        raise self._missing(model, machine, tp)

    def _uncapped(self, model: ModelSpec, machine: MachineSku,
                  tp: int | None = None) -> LatencyCurves:
        table = self._table(model, machine, tp)
        if table is not None:
            return table
        own = self._own(model, machine, tp)
        if own is not None:
            return own.curves()
        if self.fallback is not None:
            return self.fallback._uncapped(model, machine, tp)
        raise self._missing(model, machine, tp)

    def _own(self, model: ModelSpec, machine: MachineSku,
             tp: int | None = None) -> PairCoefficients | None:
        direct = self._direct(model, machine, tp)
        if direct is None and self.transfer:
            return self._transferred(model, machine, tp)
        return direct

    @staticmethod
    def _missing(model: ModelSpec, machine: MachineSku, tp: int | None) -> InputError:
        at = f" at TP {tp}" if tp and tp != machine.instance_tp else ""
        return InputError(f"no performance data for model '{model.name}' on machine "
                          f"'{machine.name}' (perf_profile '{machine.perf_profile}'){at}")

    def _table(self, model: ModelSpec, machine: MachineSku,
               tp: int | None = None) -> LatencyCurves | None:
        if (tp or machine.instance_tp) != machine.gpus:
            return None   # a latency table measures the whole machine
        return self.tables.get((machine.name, model.name)) or self.tables.get((machine.name, None))

    def _direct(self, model: ModelSpec, machine: MachineSku,
                tp: int | None = None) -> PairCoefficients | None:
        """A group measured on this model and machine (by name, or by profile when calibrated)."""
        models = {model.name, model.perf_profile} - {None}
        for hardware in (machine.name, machine.perf_profile if machine.calibrated else None):
            for group in self.groups:
                if (group.hardware == hardware and group.model in models
                        and group.tensor_parallel == (tp or machine.instance_tp)):
                    return group
        return None

    def _transferred(self, model: ModelSpec, machine: MachineSku,
                     tp: int | None = None) -> PairCoefficients | None:
        """The closest calibrated pair on the machine's perf_profile hardware, scaled."""
        candidates = [g for g in self.groups if g.reference is not None
                      and g.hardware == machine.perf_profile
                      and g.tensor_parallel == (tp or machine.instance_tp)]
        if not candidates:
            return None
        same = [g for g in candidates if g.model == model.perf_profile]
        closest = same[0] if same else min(candidates, key=lambda g: abs(
            math.log(g.reference.flops_params_b / model.flops_params_b)))
        return closest.transferred(model, machine, tp or machine.instance_tp)


@lru_cache(maxsize=None)
def default_performance_model() -> FittedPerformanceModel:
    """The calibrated physically based model from the packaged coefficients (no user file)."""
    document = json.loads(DEFAULT_COEFFICIENTS.read_text())
    groups = parse_coefficients_document(document, str(DEFAULT_COEFFICIENTS))
    return FittedPerformanceModel(groups, transfer=True, source="default")


def load_performance_model(path: str | Path, catalog: Catalog) -> PerformanceModel:
    """A user's coefficients file or piecewise-linear table file (YAML, JSON or CSV); table
    entries name machines and models of `catalog`; or an engine calibration (`kind:
    engine-calibration`, `simcore.enginecalib`: the engine's kernel model, calibrated on one pair).

    Pairs the file does not cover fall back to the default model. Bad files raise a one-line
    InputError naming the file, row or entry, and field.
    """
    path = Path(path)
    fallback = default_performance_model()
    if path.suffix.lower() == ".csv":
        return FittedPerformanceModel(tables=perftables.read_table_csv(path, catalog),
                                      fallback=fallback, source=str(path))
    document = _read_document(path)
    from simcore import enginecalib
    if enginecalib.is_calibration(document):   # provision calibrate on serving benchmarks
        if (document.get("dtype"), document.get("kv_dtype")) != ("bf16", "bf16"):
            fallback = FittedPerformanceModel(fallback.groups, transfer=fallback.transfer,
                                              source=fallback.source)
        return enginecalib.parse_calibration(document, str(path), catalog, fallback)
    if isinstance(document, dict) and "groups" in document:
        return FittedPerformanceModel(parse_coefficients_document(document, str(path)),
                                      fallback=fallback, source=str(path))
    if isinstance(document, dict) and "tables" in document:
        tables = perftables.parse_table_document(document, str(path), catalog)
        return FittedPerformanceModel(tables=tables, fallback=fallback, source=str(path))
    raise InputError("expected a coefficients file (key 'groups', from provision calibrate "
                     "PROFILE.csv), an engine calibration (kind: engine-calibration, from "
                     "provision calibrate RESULTS.json) or a latency table file (key 'tables')",
                     source=str(path))


def _read_document(path: Path) -> Any:
    return read_yaml(path) if path.suffix.lower() != ".json" else read_json(path)


def coefficients_document(groups: Iterable[PairCoefficients], *, source: str,
                          command: str) -> dict[str, Any]:
    """The coefficients file `provision calibrate --out` writes and `load_performance_model` reads."""
    return {"format": COEFFICIENTS_FORMAT, "closed_form_version": CLOSED_FORM_VERSION,
            "source": source, "command": command, "units": "seconds; tokens; requests",
            "groups": [g.as_dict() for g in groups]}


def parse_coefficients_document(document: Any, source: str) -> list[PairCoefficients]:
    """Validate a coefficients document into records; errors name the group and field."""
    if not isinstance(document, dict) or document.get("format") != COEFFICIENTS_FORMAT:
        raise InputError(f"not a coefficients file: expected format '{COEFFICIENTS_FORMAT}'",
                         source=source, field="format")
    for key in ("closed_form_version", "source", "command", "units"):
        value = document.get(key, "")
        if not isinstance(value, str):   # labels, but a null or a number is not one
            raise InputError(f"must be a string, got {'null' if value is None else value!r}"[:120],
                             source=source, field=key)
    unknown = sorted(set(document) - {"format", "closed_form_version", "source", "command",
                                      "units", "groups"})
    if unknown:
        raise InputError("unknown key; expected format, closed_form_version, source, command, "
                         "units, groups", source=source, field=unknown[0])
    groups = document.get("groups")
    if not isinstance(groups, list) or not groups:
        raise InputError("'groups' must be a non-empty list", source=source, field="groups")
    return [_parse_group(entry, source, i + 1) for i, entry in enumerate(groups)]


def _parse_group(entry: Any, source: str, index: int) -> PairCoefficients:
    where = f"group {index}"
    if not isinstance(entry, dict):
        raise InputError(f"{where} must be a mapping", source=source)
    names = {}
    for key in ("model", "hardware"):
        value = entry.get(key)
        if not isinstance(value, str) or not value:
            raise InputError(f"{where}: must be a non-empty string", source=source, field=key)
        names[key] = value
    tp = _number(entry, "tensor_parallel", f"{where}", source, positive=True)
    if tp != int(tp):
        raise InputError(f"{where}: must be a whole number", source=source, field="tensor_parallel")
    reference = entry.get("reference")
    return PairCoefficients(
        names["model"], names["hardware"], int(tp),
        _record(PromptCoefficients, entry.get("prompt"), f"{where} prompt", source),
        _record(DecodeCoefficients, entry.get("decode"), f"{where} decode", source),
        _record(Reference, reference, f"{where} reference", source) if reference else None)


# Coefficients that may be zero or negative; every other one must be > 0.
_SIGNED = {"batch_exponent"}
_NON_NEGATIVE = {"overhead_s", "knee_rise", "context_s_per_token"}


def _record(cls, mapping: Any, where: str, source: str):
    if not isinstance(mapping, dict):
        raise InputError(f"{where}: must be a mapping of coefficients", source=source)
    names = [f.name for f in fields(cls)]
    unknown = sorted(set(mapping) - set(names))
    if unknown:
        raise InputError(f"{where}: unknown field", source=source, field=unknown[0])
    values = {n: _number(mapping, n, where, source, positive=n not in _SIGNED | _NON_NEGATIVE,
                         non_negative=n in _NON_NEGATIVE) for n in names}
    if cls is Reference:
        values["layers"] = int(values["layers"])
    return cls(**values)


def _number(mapping: dict, key: str, where: str, source: str, *, positive: bool = False,
            non_negative: bool = False) -> float:
    if key not in mapping:
        raise InputError(f"{where}: missing required field", source=source, field=key)
    # |value| <= 1e18 (bytes and FLOPs of a reference included): beyond it, products overflow
    check = (Number(0, 1e18, low_open=True) if positive else Number(0, 1e18) if non_negative
             else Number(-1e18, 1e18))
    try:
        return check(mapping[key])
    except Invalid as err:
        raise InputError(f"{where}: {err}", source=source, field=key) from None
