"""An engine calibration file (`provision calibrate RESULTS.json ... --out calib.json`) as a
performance model: the engine's kernel model with the calibrated overheads and per-phase scales
on the calibrated (model, machine) pair, the engine's fitted defaults on every other pair it
covers, and the 2023 model where its tables have no data (as `--engine` alone).

The file (JSON, `kind: engine-calibration`, FORMAT_VERSION):

    {"kind": "engine-calibration", "format_version": 1,
     "engine": "vllm", "dtype": "bf16", "kv_dtype": "bf16",
     "model": "llama-3.1-8b", "machine": "dgx-h100", "tp": 1,
     "composition": "serial" | "overlap",
     "terms": {"iteration_s": s, "sequence_s": s, "first_token_s": s},
     "scales": {"prompt_scale": x, "decode_scale": x},
     "fitted": [names of the fitted parameters], "source": {...}, "held_out": {...},
     "runs": [...], "method": "..."}

`source`, `held_out`, `runs` and `method` are the fit's record (labels, not read back). The
scales multiply the prompt curve (and the chunk terms) and the decode curve (and its context
attention) of the pair at every TP; the terms are its engine host time and first-token term.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hardware_catalog import Catalog, InputError, MachineSku, ModelSpec
from simcore.engine_overheads import EngineOverheads, fitted_overheads
from simcore.kernels import EnginePerformanceModel, KernelPerformanceModel
from simcore.latency import LatencyCurves

KIND = "engine-calibration"
FORMAT_VERSION = 1
ENGINES = ("vllm", "sglang", "trtllm")
DTYPES = ("bf16", "fp8", "fp4")
KEYS = {"kind", "format_version", "engine", "dtype", "kv_dtype", "model", "machine", "tp",
        "composition", "terms", "scales", "fitted", "source", "held_out", "runs", "method",
        "command"}


class CalibratedEngineModel(EnginePerformanceModel):
    """`EnginePerformanceModel` whose curves for one (model, machine) pair carry calibrated
    overheads and scales."""

    def __init__(self, document: dict, fallback, source: str):
        engine, dtype, kv = document["engine"], document["dtype"], document["kv_dtype"]
        super().__init__(KernelPerformanceModel(engine, dtype, kv_dtype=kv,
                                                overheads=fitted_overheads(engine)), fallback)
        terms, scales = document["terms"], document["scales"]
        self.document, self.path = document, source
        self.pair = (document["model"], document["machine"])
        self.overheads = EngineOverheads(
            terms["iteration_s"], terms["sequence_s"], terms["first_token_s"], 0.0,
            overlap=document["composition"] == "overlap",
            source=f"calibrated: {Path(source).name}")
        self.calibrated = KernelPerformanceModel(engine, dtype, kv_dtype=kv,
                                                 overheads=self.overheads)
        self.prompt_scale, self.decode_scale = scales["prompt_scale"], scales["decode_scale"]
        self._scaled: dict = {}

    def applies(self, model: ModelSpec, machine: MachineSku) -> bool:
        return (model.name, machine.name) == self.pair

    def curves(self, model: ModelSpec, machine: MachineSku, tp: int | None = None) -> LatencyCurves:
        if not (self.applies(model, machine) and self.covers(model, machine, tp)):
            return super().curves(model, machine, tp)
        key = (model, machine, tp)
        if key not in self._scaled:
            self._scaled[key] = self.calibrated.curves(model, machine, tp).scaled(
                self.prompt_scale, self.decode_scale)
        return self._scaled[key]

    def text(self, model: ModelSpec) -> str:
        """The report's latency source."""
        d = self.document
        held = d.get("held_out") or {}
        errors = ""
        if held.get("tpot"):
            errors = (f", held-out median error TPOT {held['tpot']['after']['median']:.1%}, "
                      f"TTFT {held['ttft']['after']['median']:.1%}")
        return (f"{Path(self.path).name}: {d['engine']} {d['dtype']} kernel tables with terms "
                f"and scales fitted to {len(d.get('runs') or [])} measured serving runs of "
                f"{d['model']} on {d['machine']} (TP {d['tp']}{errors}): "
                f"{self.overheads.text(0)}, prompt x{self.prompt_scale:.3g}, decode "
                f"x{self.decode_scale:.3g}; other pairs: the engine's kernel tables with its "
                f"fitted defaults")


def calibration_header(path: str | Path) -> dict | None:
    """The calibration document of a --perf-model file, None for another kind of file (its
    own loader reports what is wrong with it)."""
    from simcore.perfmodel import _read_document
    try:
        document = _read_document(Path(path))
    except InputError:
        return None
    return document if is_calibration(document) else None


def is_calibration(document: Any) -> bool:
    return isinstance(document, dict) and document.get("kind") == KIND


def parse_calibration(document: dict, source: str, catalog: Catalog, fallback):
    """Validated once; errors name the file and field."""
    unknown = sorted(set(document) - KEYS)
    if unknown:
        raise InputError(f"unknown key; expected {', '.join(sorted(KEYS))}", source=source,
                         field=unknown[0])
    if document.get("format_version") != FORMAT_VERSION:
        raise InputError(f"must be {FORMAT_VERSION}", source=source, field="format_version")
    for key, allowed in (("engine", ENGINES), ("dtype", DTYPES), ("kv_dtype", ("bf16", "fp8")),
                         ("composition", ("serial", "overlap"))):
        if document.get(key) not in allowed:
            raise InputError(f"must be one of {', '.join(allowed)}", source=source, field=key)
    if document.get("model") not in catalog.models:
        raise InputError("not a model of the catalog", source=source, field="model")
    if document.get("machine") not in catalog.machines:
        raise InputError("not a machine of the catalog", source=source, field="machine")
    tp = document.get("tp")
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise InputError("must be a whole number >= 1", source=source, field="tp")
    for group, names, low in (("terms", ("iteration_s", "sequence_s", "first_token_s"), 0.0),
                              ("scales", ("prompt_scale", "decode_scale"), None)):
        values = document.get(group)
        if not isinstance(values, dict):
            raise InputError("must be a mapping", source=source, field=group)
        for name in names:
            value = values.get(name)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not 0 <= value < 1e3 or (low is None and value == 0)):
                raise InputError(f"must be a number {'>= 0' if low == 0 else '> 0'} (seconds "
                                 "for terms)", source=source, field=f"{group}.{name}")
    return CalibratedEngineModel(document, fallback, source)
