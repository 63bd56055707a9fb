"""What a serving engine does around its kernels, in three terms (issue 37).

The kernel tables time the GPU's work; an engine also spends host time on every iteration
(scheduling, preparing the inputs, sampling, handing the outputs back) and on every request
before its first token reaches the client (tokenization, admission, the first sampling step).
`provision` prices them as

    host       = iteration_s + sequence_s x (sequences in the iteration)
    iteration  = kernels + host          (serial: the engine prepares step n + 1 after step n)
               = max(kernels, host)      (overlap: it prepares step n + 1 while step n runs)
    TTFT, E2E += first_token_s + first_token_s_per_layer x layers     (per request)

with a sequence each decode and each prompt or chunk of the iteration, and kernels every GPU
term of the iteration (the curves' time, the decodes' context attention, chunk extras). The
iteration's time is the machine's busy time; the per-request term is host time outside the
GPUs' iterations, so it adds to the request's latencies and occupies no machine.

The fitted values per engine (`simcore/data/engine_overheads.json`) come from
`scripts/fit_engine_overheads.py`: a fit of the kernel model plus these terms to the public
measured serving runs of aiconfigurator's silicon corpus (docs/engine-overheads.md). They apply
only to latencies composed from kernel tables: measured iteration times (the 2023 Splitwise
profiles, a user's latency tables or calibrated coefficients) hold the engine's overheads
already.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from hardware_catalog import ModelSpec
    from simcore.latency import LatencyCurves

DATA_PATH = Path(__file__).resolve().parent / "data" / "engine_overheads.json"


def combine_host(gpu_seconds, host_seconds, overlap: bool):
    """An iteration's time from its GPU work and the engine's host work: the host work after
    the GPU's (serial), or beside it (an engine that prepares step n + 1 while step n runs:
    the longer of the two). Scalars or numpy arrays; the one rule the simulators, the
    calibration fit and the fit of the defaults share."""
    if overlap:
        return np.maximum(gpu_seconds, host_seconds)
    return gpu_seconds + host_seconds


@dataclass(frozen=True)
class EngineOverheads:
    """The three terms (seconds), and where they come from."""
    iteration_s: float = 0.0
    sequence_s: float = 0.0
    first_token_s: float = 0.0
    first_token_s_per_layer: float = 0.0
    overlap: bool = False    # host time beside the GPU work (max), not after it (sum)
    source: str = "none"

    def first_token(self, layers: int) -> float:
        """The per-request term of a model of `layers` layers."""
        return self.first_token_s + self.first_token_s_per_layer * layers

    def apply(self, curves: "LatencyCurves", model: "ModelSpec") -> "LatencyCurves":
        if self == NO_OVERHEADS:
            return curves
        return curves.with_engine_overheads(self.iteration_s, self.sequence_s,
                                            self.first_token(model.layers), self.overlap)

    def overridden(self, iteration_s: float | None = None, sequence_s: float | None = None,
                   first_token_s: float | None = None,
                   overlap: bool | None = None) -> "EngineOverheads":
        """Terms given by the user replace the fitted ones (a first-token term given is the
        whole per-request term, whatever the model's layers); the source says which."""
        given = {name: value for name, value in (("iteration_s", iteration_s),
                                                 ("sequence_s", sequence_s),
                                                 ("first_token_s", first_token_s),
                                                 ("overlap", overlap))
                 if value is not None}
        if not given:
            return self
        changed = replace(self, **given)
        if first_token_s is not None:
            changed = replace(changed, first_token_s_per_layer=0.0)
        return replace(changed, source=f"{self.source}; given: {', '.join(sorted(given))}")

    def as_dict(self) -> dict:
        """The report's echo (milliseconds and microseconds, as the options take them)."""
        return {"iteration_ms": round(self.iteration_s * 1e3, 6),
                "sequence_us": round(self.sequence_s * 1e6, 6),
                "composition": "overlap" if self.overlap else "serial",
                "source": self.source,
                "first_token_ms": round(self.first_token_s * 1e3, 6),
                "first_token_ms_per_layer": round(self.first_token_s_per_layer * 1e3, 6)}

    def text(self, layers: int) -> str:
        """One line for the report's latency source."""
        first = self.first_token(layers) * 1e3
        host = (f"{self.iteration_s * 1e3:.3g} ms per iteration + {self.sequence_s * 1e6:.3g} µs "
                f"per sequence, {'beside' if self.overlap else 'after'} the GPU work")
        return f"engine host time {host}; first token +{first:.3g} ms ({self.source})"


NO_OVERHEADS = EngineOverheads()


@lru_cache(maxsize=1)
def _document() -> dict:
    return json.loads(DATA_PATH.read_text())


def fitted_overheads(engine: str) -> EngineOverheads:
    """The engine's fitted terms (none for an engine the fit does not cover)."""
    entry = _document()["engines"].get(engine)
    if entry is None:
        return NO_OVERHEADS
    return EngineOverheads(float(entry["iteration_s"]), float(entry["sequence_s"]),
                           float(entry["first_token_s"]),
                           float(entry["first_token_s_per_layer"]),
                           overlap=entry.get("composition", "serial") == "overlap",
                           source=f"fitted to {entry['runs']} measured {engine} serving runs, "
                                  f"versions {entry['versions']} (docs/engine-overheads.md)")
