"""Fit an engine's overhead terms and per-phase scales to a user's serving benchmarks (issue 37).

Input: `provisioner.benchfiles.BenchRun`s of one (model, machine, engine, dtype, TP). Each run is
priced from the kernel curves (`KernelPerformanceModel(engine, dtype, kv_dtype).curves(model,
machine, tp)`, no overheads) at its concurrency c and mean prompt / output lengths (isl, osl),
with the steady-state formulas of scripts/fit_engine_overheads.py (docs/engine-overheads.md):

- a decode step of b = max(c, 1) requests D = decode_scale x token_time(b, b x (isl + osl/2));
- what a prompt adds to it M = mixed - D, mixed = max(prompt_scale x prompt(isl + b),
  decode_scale x decode(b)) + decode_scale x context attention (`LatencyCurves.mixed_time`
  with the prompt curve scaled by prompt_scale, the decode curve and context by decode_scale);
- TPOT = (1 - f) x combine(D, h(b)) + f x combine(D + n x M, h(b + n)), f = min(1, b/osl),
  n = max(1, b/osl) prompts per step, h(s) = iteration_s + sequence_s x s, combine = sum
  (serial) or max (overlap);
- TTFT = combine(the prompt's iteration beside the max(c - 1, 0) other requests' decodes,
  h(that + 1)) + first_token_s (no queueing: runs far past saturation are not this model).

Fit: iteration_s, sequence_s, first_token_s >= 0 and prompt_scale, decode_scale (in
[SCALE_MIN, SCALE_MAX], pulled towards 1 by a prior of width SCALE_PRIOR) minimise a soft-L1
loss (scale 0.1, as the engine fit) of the relative TPOT and TTFT residuals of every run;
overlap's loss is flat where the host is hidden, so it starts from a grid of host terms. With
fewer runs than FULL_FIT_RUNS the scales stay 1; with fewer than TERMS_FIT_RUNS only
iteration_s and first_token_s are fitted. Serial or overlap: the one with the smaller
leave-one-run-out error (TPOT and TTFT, median + P90). "Before" is the engine's fitted defaults
(simcore/data/engine_overheads.json) with scales 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import least_squares

from provisioner.benchfiles import BenchRun
from simcore.engine_overheads import EngineOverheads, combine_host
from simcore.latency import piecewise_linear

COMPOSITIONS = ("serial", "overlap")
TERMS = ("iteration_s", "sequence_s", "first_token_s")
SCALES = ("prompt_scale", "decode_scale")
PARAMETERS = TERMS + SCALES
UNITS = np.array([1e-3, 1e-6, 1e-3, 1.0, 1.0])   # the solver's units: ms, us, ms, 1, 1
FULL_FIT_RUNS = 5        # all five parameters from this many runs on
TERMS_FIT_RUNS = 3       # the three terms (scales 1) from this many; fewer: iteration + first
SCALE_MIN, SCALE_MAX = 0.25, 4.0
SCALE_PRIOR = 0.5        # width of the pull of a scale towards 1 (a residual (s - 1) / width)
SOFT_L1_SCALE = 0.1      # relative residual where the robust loss turns linear
OVERLAP_MARGIN = 0.01    # overlap is chosen when its held-out score is this much smaller


@dataclass(frozen=True)
class PricedRun:
    """A run and the kernel-curve pieces its predictions are made of (seconds)."""
    run: BenchRun
    layers: int
    batch: float            # b = max(c, 1): requests in a decode step
    decode: float           # decode curve at b (no context)
    context: float          # context attention of b requests
    mixed_prompt: float     # mixed_prompt_factor x prompt curve at isl + b
    first_batch: float      # decodes beside a request's prompt: max(c - 1, 0)
    first_decode: float
    first_context: float
    first_prompt: float


def price_runs(runs: list[BenchRun], curves, layers: int) -> list[PricedRun]:
    priced = []
    for run in runs:
        b = max(run.concurrency, 1.0)
        b0 = max(run.concurrency - 1.0, 0.0)
        held = run.input_tokens + run.output_tokens / 2.0

        def dec(x):
            return float(piecewise_linear(np.float64(x), curves.decode_batch,
                                          curves.decode_seconds)) if x > 0 else 0.0

        def prompt(tokens, factor=curves.mixed_prompt_factor):
            return factor * float(curves.prompt_time(tokens))
        priced.append(PricedRun(
            run, layers, b, dec(b), curves.context_seconds_per_token * b * held,
            prompt(run.input_tokens + b), b0, dec(b0),
            curves.context_seconds_per_token * b0 * held,
            prompt(run.input_tokens + b0) if b0 > 0 else prompt(run.input_tokens, 1.0)))
    return priced


def _combine(composition: str, kernels: float, host: float) -> float:
    return float(combine_host(kernels, host, composition == "overlap"))


def predict(p: PricedRun, t: dict, composition: str) -> tuple[float, float]:
    """(TPOT, TTFT) of the run with terms and scales `t` (module docstring)."""
    ps, ds = t["prompt_scale"], t["decode_scale"]

    def host(sequences):
        return t["iteration_s"] + t["sequence_s"] * sequences
    decode = ds * (p.decode + p.context)
    added = max(ps * p.mixed_prompt, ds * p.decode) + ds * p.context - decode
    osl = p.run.output_tokens
    share, prompts = min(1.0, p.batch / osl), max(1.0, p.batch / osl)
    tpot = ((1.0 - share) * _combine(composition, decode, host(p.batch))
            + share * _combine(composition, decode + prompts * added, host(p.batch + prompts)))
    first = max(ps * p.first_prompt, ds * p.first_decode) + ds * p.first_context
    ttft = _combine(composition, first, host(p.first_batch + 1.0)) + t["first_token_s"]
    return tpot, ttft


def defaults(overheads: EngineOverheads, layers: int) -> tuple[dict, str]:
    """The engine's fitted terms as this fit's parameters, and their composition."""
    return ({"iteration_s": overheads.iteration_s, "sequence_s": overheads.sequence_s,
             "first_token_s": overheads.first_token(layers), "prompt_scale": 1.0,
             "decode_scale": 1.0}, "overlap" if overheads.overlap else "serial")


def free_parameters(runs: int) -> tuple[str, ...]:
    if runs >= FULL_FIT_RUNS:
        return PARAMETERS
    if runs >= TERMS_FIT_RUNS:
        return TERMS
    return ("iteration_s", "first_token_s")


def _residuals(priced: list[PricedRun], t: dict, composition: str) -> np.ndarray:
    out = []
    for p in priced:
        tpot, ttft = predict(p, t, composition)
        out += [tpot / p.run.tpot_s - 1.0, ttft / p.run.ttft_s - 1.0]
    return np.array(out)


def fit(priced: list[PricedRun], composition: str, free: tuple[str, ...]) -> dict:
    """The parameters in `free` minimising the robust loss (the others: 0 terms, scales 1)."""
    base = {"iteration_s": 0.0, "sequence_s": 0.0, "first_token_s": 0.0, "prompt_scale": 1.0,
            "decode_scale": 1.0}
    index = [PARAMETERS.index(name) for name in free]
    units = UNITS[index]
    low = np.array([SCALE_MIN if name in SCALES else 0.0 for name in free])
    high = np.array([SCALE_MAX if name in SCALES else 1e4 for name in free])

    def terms(x):
        return {**base, **{name: float(v) for name, v in zip(free, np.asarray(x) * units)}}

    def residuals(x):
        t = terms(x)
        prior = [(t[name] - 1.0) / SCALE_PRIOR for name in free if name in SCALES]
        return np.concatenate([_residuals(priced, t, composition), prior])

    starts = [(0.0, 0.0)] if composition == "serial" else \
        [(a, b) for a in (0.0, 1.0, 3.0, 10.0) for b in (0.0, 10.0, 50.0)]
    best, best_cost = None, np.inf
    for a, b in starts:
        x0 = np.array([{"iteration_s": a + 0.1, "sequence_s": b + 1.0,
                        "first_token_s": 1.0}.get(name, 1.0) for name in free])
        x0 = np.clip(x0, low, high)
        solved = least_squares(residuals, x0, bounds=(low, high), loss="soft_l1",
                               f_scale=SOFT_L1_SCALE, method="trf", xtol=1e-10, ftol=1e-10,
                               x_scale=np.maximum(x0, 1.0))
        if solved.cost < best_cost:
            best, best_cost = solved.x, solved.cost
    return terms(best)


def error_stats(errors: list[float]) -> dict:
    if not errors:
        return {"median": None, "p90": None}
    e = np.asarray(errors)
    return {"median": round(float(np.median(e)), 4), "p90": round(float(np.percentile(e, 90)), 4)}


def _score(held: dict) -> float:
    return sum(held[k]["after"][s] or 0.0 for k in ("tpot", "ttft") for s in ("median", "p90"))


@dataclass
class Calibration:
    """What `fit_runs` found."""
    composition: str
    terms: dict                      # the five parameters (seconds; scales)
    free: tuple[str, ...]
    held_out: dict                   # tpot/ttft: before/after: median/p90 (+ runs)
    per_run: list[dict]
    compositions: dict               # per composition: terms, held-out errors, score
    notes: list[str] = field(default_factory=list)


def _held_out(priced: list[PricedRun], composition: str, free: tuple[str, ...],
              before: tuple[dict, str]) -> tuple[dict, list]:
    """Leave one run out: refit on the others, predict it. Before: the engine's defaults."""
    predictions = []
    for i in range(len(priced)):
        rest = priced[:i] + priced[i + 1:]
        t = fit(rest, composition, tuple(n for n in free if n in free_parameters(len(rest))))
        predictions.append(predict(priced[i], t, composition))
    old = [predict(p, before[0], before[1]) for p in priced]

    def errors(values, k):
        attr = ("tpot_s", "ttft_s")[k]
        return [abs(v[k] / getattr(p.run, attr) - 1.0) for v, p in zip(values, priced)]
    held = {name: {"before": error_stats(errors(old, k)), "after": error_stats(errors(predictions, k))}
            for k, name in enumerate(("tpot", "ttft"))}
    return held, predictions


def fit_runs(priced: list[PricedRun], overheads: EngineOverheads) -> Calibration:
    """Both compositions, each with its leave-one-run-out errors; the better one kept."""
    n = len(priced)
    free = free_parameters(n)
    before = defaults(overheads, priced[0].layers)
    notes = []
    if free != PARAMETERS:
        notes.append(f"{n} run{'s' if n != 1 else ''}: fewer than {FULL_FIT_RUNS}, so only "
                     f"{', '.join(free)} fitted (scales fixed at 1)")
    fits = {}
    for composition in COMPOSITIONS:
        terms = fit(priced, composition, free)
        if n >= 2:
            held, loo = _held_out(priced, composition, free, before)
        else:
            held, loo = None, None
        fits[composition] = {"terms": terms, "held_out": held, "loo": loo,
                             "score": _score(held) if held else None}
    if n < 2:
        notes.append("one run: no held-out error (leave-one-out needs 2 runs or more); "
                     "composition serial")
        composition = "serial"
    else:
        # overlap only when clearly better: on a tie the serial form (fewer regimes) stays
        better = fits["overlap"]["score"] < fits["serial"]["score"] - OVERLAP_MARGIN
        composition = "overlap" if better else "serial"
    chosen = fits[composition]
    per_run = []
    for i, p in enumerate(priced):
        tpot, ttft = predict(p, chosen["terms"], composition)
        tpot0, ttft0 = predict(p, *before)
        entry = {"file": p.run.file, "run": p.run.label, "concurrency": round(p.run.concurrency, 3),
                 "concurrency_from": p.run.concurrency_from,
                 "input_tokens": round(p.run.input_tokens, 1),
                 "output_tokens": round(p.run.output_tokens, 1),
                 "tpot_ms": {"measured": _ms(p.run.tpot_s), "before": _ms(tpot0),
                             "fitted": _ms(tpot)},
                 "ttft_ms": {"measured": _ms(p.run.ttft_s), "before": _ms(ttft0),
                             "fitted": _ms(ttft)}}
        if chosen["loo"] is not None:
            entry["tpot_ms"]["held_out"] = _ms(chosen["loo"][i][0])
            entry["ttft_ms"]["held_out"] = _ms(chosen["loo"][i][1])
        per_run.append(entry)
    held = chosen["held_out"]
    if held is not None:
        held = {"runs": n, "method": "leave one run out", **held}
    return Calibration(composition, chosen["terms"], free, held, per_run,
                       {k: {"terms": v["terms"], "held_out": v["held_out"], "score": v["score"]}
                        for k, v in fits.items()}, notes)


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 4)


METHOD = ("Each run priced from the kernel curves at its concurrency (closed loop: its users; "
          "otherwise Little's law) and mean prompt/output lengths with the steady-state "
          "formulas of scripts/fit_engine_overheads.py; iteration_s, sequence_s, first_token_s "
          ">= 0 and prompt_scale, decode_scale (pulled towards 1) fitted by soft-L1 least "
          "squares on relative TPOT and TTFT errors; serial or overlap by leave-one-run-out "
          "error. provisioner/servefit.py, docs/engine-overheads.md.")


def calibration_document(calibration: Calibration, *, engine: str, dtype: str, kv_dtype: str,
                         model: str, machine: str, tp: int, sources: list[dict],
                         command: str) -> dict:
    """The engine-calibration file `--perf-model` reads (simcore.enginecalib)."""
    t = calibration.terms
    return {"kind": "engine-calibration", "format_version": 1, "engine": engine,
            "dtype": dtype, "kv_dtype": kv_dtype, "model": model, "machine": machine, "tp": tp,
            "composition": calibration.composition,
            "terms": {k: float(f"{t[k]:.4g}") if t[k] >= 1e-9 else 0.0 for k in TERMS},
            "scales": {k: float(f"{t[k]:.4g}") for k in SCALES},
            "fitted": list(calibration.free), "source": {"files": sources, "command": command},
            "held_out": calibration.held_out, "runs": calibration.per_run, "method": METHOD}
