"""SplitwiseSim's latency model as `LatencyCurves` (the `splitwise-sim` assumption preset).

SplitwiseSim (the simulator of the Splitwise paper; shared/design/splitwise-sim-semantics.md,
rows 7-11) prices an iteration from two 1-D curves per (model, hardware, tensor parallelism),
x = "batch tokens" = prompt_size x batch_size of its profile rows, y = the median latency per x,
interpolated linearly and extrapolated linearly on both sides:
- a prompt-only iteration: the prompt curve at the batch's prompt tokens (row 8);
- a decode-only iteration: the token curve at x = the number of decodes (row 9): the curve was
  measured against prompt x batch tokens, so decode time is almost flat in the batch size
  (BLOOM-176B on H100: 35.3 ms at batch 1, 36.2 ms at 512; measured at batch 64: 63.8 ms), and
  no context term;
- a mixed iteration: 1.1 x the prompt curve at the batch's prompt tokens + one per decode (row 10);
- SLO references: the prompt curve at the prompt size, and the token curve at x = prompt size
  (row 11; `LatencyCurves.reference_token_time`).
Our engines take exactly this as `LatencyCurves`: the prompt knots, the token knots as the decode
curve (decode_axis "batch_tokens"), context 0, mixed_prompt_factor 1.1; a knot at x = 1 carries
the linear extrapolation below the first profiled x (our curves hold the first value there, and
x >= 1 is all the engines look up); beyond the last knot both continue the last segment, as
SplitwiseSim does. The curves are derived data (`simcore/data/splitwise_sim_curves.json`, written
by `scripts/derive_splitwise_sim_curves.py` from its public 2023 profiles).

A (model, machine) pair is covered when the profiles have the model's perf_profile (or name) on
the machine's perf_profile hardware at the model's tensor parallelism and the machine is
calibrated (DGX-A100, DGX-H100 and DGX-H100-cap, whose catalog prompt_slowdown 1.3 is the
profiles' h100-80gb-pcap prompt rows over the h100-80gb ones); other pairs keep the base model.
"""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from hardware_catalog import MachineSku, ModelSpec
from simcore.latency import LatencyCurves
from simcore.performance import PerformanceModel

CURVES_PATH = Path(__file__).resolve().parent / "data" / "splitwise_sim_curves.json"
MIXED_PROMPT_FACTOR = 1.1   # SplitwiseSim get_iteration_duration: mixed batch = 1.1 x prompt


@lru_cache(maxsize=1)
def curves_sha256() -> str:
    return hashlib.sha256(CURVES_PATH.read_bytes()).hexdigest()


@lru_cache(maxsize=1)
def _groups() -> dict[tuple[str, str, int], dict]:
    document = json.loads(CURVES_PATH.read_text())
    return {(g["model"], g["hardware"], int(g["tensor_parallel"])): g
            for g in document["groups"]}


def _from_one(x: list, y: list) -> tuple[np.ndarray, np.ndarray]:
    """The knots, with one at x = 1 on the first segment's line when the first is above 1."""
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if xs[0] > 1.0:
        slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
        xs, ys = np.r_[1.0, xs], np.r_[ys[0] + slope * (1.0 - xs[0]), ys]
    return xs, ys


def splitwise_sim_curves(model: ModelSpec, machine: MachineSku,
                         tp: int | None = None) -> LatencyCurves | None:
    """SplitwiseSim's uncapped curves for the pair, or None when its profiles do not cover it."""
    if not machine.calibrated:
        return None
    groups = _groups()
    for name in (model.perf_profile, model.name):
        group = groups.get((name, machine.perf_profile, tp or machine.instance_tp))
        if group is not None:
            break
    else:
        return None
    prompt_x, prompt_y = _from_one(group["batch_tokens"], group["prompt_s"])
    token_x, token_y = _from_one(group["batch_tokens"], group["token_s"])
    return LatencyCurves(prompt_x, prompt_y, token_x, token_y, 0.0,
                         decode_axis="batch_tokens", mixed_prompt_factor=MIXED_PROMPT_FACTOR)


class SplitwiseSimPerformance(PerformanceModel):
    """A performance model answering with SplitwiseSim's curves where its profiles cover the
    pair (chunked-prefill terms and the power cap applied as the base model applies them to a
    table), and with `base` elsewhere."""

    def __init__(self, base):
        self.base = base
        self._cache: dict[tuple[str, str], LatencyCurves] = {}

    def curves(self, model: ModelSpec, machine: MachineSku, tp: int | None = None) -> LatencyCurves:
        key = (model.name, machine.name, tp or machine.instance_tp)
        if key not in self._cache:
            own = splitwise_sim_curves(model, machine, tp)
            if own is None:
                self._cache[key] = self.base.curves(model, machine, tp)
            else:
                attention_s, kv_read_s = self.base.chunk_terms(model, machine, tp)
                self._cache[key] = own.with_chunk_terms(attention_s, kv_read_s).scaled(
                    prompt_factor=machine.prompt_slowdown)
        return self._cache[key]

    def chunk_terms(self, model: ModelSpec, machine: MachineSku,
                    tp: int | None = None) -> tuple[float, float]:
        return self.base.chunk_terms(model, machine, tp)

    def is_calibrated(self, model: ModelSpec, machine: MachineSku, tp: int | None = None) -> bool:
        return (splitwise_sim_curves(model, machine, tp) is not None
                or self.base.is_calibrated(model, machine, tp))

    def coefficients(self, model: ModelSpec, machine: MachineSku, tp: int | None = None):
        return None if splitwise_sim_curves(model, machine, tp) is not None else \
            self.base.coefficients(model, machine, tp)
