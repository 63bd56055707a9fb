"""Fit the engine-overhead terms of the simulators to public measured serving runs.

Source: aiconfigurator's silicon corpus, github.com/ai-dynamo/aiconfigurator at commit
095f58a51c4ca8e61b66ec108d86f223f8d559ce, aic-core/src/aiconfigurator_core/systems/
silicon_sample.csv (NVIDIA, Apache-2.0): measured closed-loop serving runs (TTFT and TPOT at a
concurrency `batch_size`, per engine, engine version, GPU system, model, precision and layout).
The corpus is not copied into this repository: pass it with `--silicon PATH` (a clone's
`git show 095f58a5:aic-core/src/aiconfigurator_core/systems/silicon_sample.csv`, or the file
aiconfigurator-core 0.12.0 installs, identical; it is the default when that package is there).

Method (docs/engine-overheads.md): every aggregated, TP-only run (attention DP 1, expert
parallelism 1, pipeline 1) of a catalog model on a catalog machine whose kernel tables exist is
priced with `KernelPerformanceModel(engine, dtype, kv_dtype=engine default).curves(model,
machine, tp)` (SGLang runs without SGLang tables: vLLM's, KERNEL_FALLBACK): a decode step
D = token_time(c, C), C = c x (isl + osl/2), a prefill P = prompt_time(isl) and what a prompt
adds to a decode step, M = mixed_time(isl, c, C) - D. A closed loop of c users starts c prompts
per osl decode steps: a share f = min(1, c/osl) of the steps carries n = max(1, c/osl) prompts
(INTERFERENCE), so the kernel TPOT is D + c/osl x M. The engine's host time per step is
h = iteration_s + sequence_s x sequences, and a step costs combine(kernels, h): kernels + h
("serial") or max(kernels, h) ("overlap": the engine prepares step n + 1 while step n runs).
Per engine and composition, a robust (soft-L1 on relative residuals) non-negative fit of
TPOT_measured = (1 - f) x combine(D, h(c)) + f x combine(D + n x M, h(c + n)) over the runs with
little predicted interference (FIT_MAX_INTERFERENCE), and, over the runs at c <= 4,
TTFT_measured = combine(P, h(1)) + first_token (first_token a constant or
first_token_s_per_layer x layers: the form with the smaller held-out error; the other is 0).
The composition with the smaller held-out TPOT error is kept. TensorRT-LLM's MoE runs are left
out (EXCLUDE_MOE). Held-out errors: leave one (model, system) group out, refit on the rest,
predict the group.

`python scripts/fit_engine_overheads.py --silicon PATH` writes simcore/data/engine_overheads.json;
`--check` re-derives it and compares with the shipped file (writes nothing, exit 1 on a
difference). Licence of this script: the repository's; of the data it reads: Apache-2.0.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hardware_catalog import InputError, load_catalog  # noqa: E402
from provisioner.study import kv_dtype_of, model_in_dtype  # noqa: E402
from simcore.engine_overheads import combine_host  # noqa: E402
from simcore.kernels import KernelPerformanceModel  # noqa: E402

OUT = ROOT / "simcore" / "data" / "engine_overheads.json"
REPO = "github.com/ai-dynamo/aiconfigurator"
COMMIT = "095f58a51c4ca8e61b66ec108d86f223f8d559ce"
CORPUS_PATH = "aic-core/src/aiconfigurator_core/systems/silicon_sample.csv"
ENGINES = ("vllm", "sglang", "trtllm")
SYSTEMS = {"h100_sxm": "dgx-h100", "h200_sxm": "h200", "b200_sxm": "b200", "b300_sxm": "b300",
           "gb200": "gb200-nvl72", "gb300": "gb300-nvl72"}
MODELS = {"meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
          "nvidia/Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b",
          "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
          "Qwen/Qwen3-235B-A22B-FP8": "qwen3-235b-a22b",
          "openai/gpt-oss-120b": "gpt-oss-120b",
          "deepseek-ai/DeepSeek-R1": "deepseek-r1", "nvidia/DeepSeek-R1-NVFP4": "deepseek-r1",
          "deepseek-ai/DeepSeek-V3": "deepseek-v3"}
DTYPES = ("bf16", "fp8", "fp4")
LOW_CONCURRENCY = 4         # TTFT is fitted on runs with at most this many users (little queueing)
MIN_VERSION_RUNS = 20       # per-version errors are reported from this many runs on
# Leave the MoE models out of an engine's fit: with them in, TensorRT-LLM's held-out TTFT error
# on its dense runs grows from 0.11 to 0.37 (median; P90 0.67 to 1.17): the kernel model prices
# its DeepSeek runs 1.5-2.5x slower than measured (docs/engine-overheads.md).
EXCLUDE_MOE = frozenset({"trtllm"})
RESOLUTION_S = 1e-7         # constants below 0.1 us are 0
# SGLang's tables cover few of its corpus runs (no H200 tables, no fp8 tables on B200/B300): those
# runs are priced on vLLM's tables of the same GPU and dtype (docs/engine-overheads.md).
KERNEL_FALLBACK = {"sglang": "vllm"}
# Prefill interference per decode step: c/osl x (what a prompt adds to a mixed iteration,
# LatencyCurves.mixed_time - token_time) ("mixed"), or c/osl x P ("alone").
INTERFERENCE = "mixed"
TPOT_FIT_MAX_C = None      # fit the iteration terms on runs with at most this many users
# ... and on runs whose predicted prefill interference c/osl x M is below this share of the
# decode step D: where it dominates, wave-started closed loops (equal isl/osl, users starting
# together: all prefills, then all decodes) measure far less of it than the steady state predicts
FIT_MAX_INTERFERENCE = 0.25
COMPOSITIONS = ("serial", "overlap")
OVERLAP_REFINEMENTS = 3     # finer grids after the first in the overlap fit
SOFT_L1_SCALE = 0.1         # relative residual where the robust loss turns linear
RTOL = 1e-3                 # --check: relative tolerance of a re-derived constant


@dataclass
class Run:
    """One measured run priced with the kernel curves (seconds)."""
    engine: str
    version: str
    tables: str             # whose kernel tables priced it (the engine's, or its fallback's)
    group: str              # "model@system": the held-out unit
    moe: bool
    c: float                # concurrency (closed-loop users)
    isl: float
    osl: float
    tp: int
    layers: int
    decode: float           # D: one decode step of c requests
    prefill: float          # P: one prompt-only iteration of isl tokens
    mixed: float            # M: what one prompt of isl tokens adds to the decode step
    tpot: float             # measured
    ttft: float             # measured


def default_corpus() -> Path | None:
    """The copy aiconfigurator-core installs (identical to the file at COMMIT), if installed."""
    try:
        import aiconfigurator_core
    except ImportError:
        return None
    path = Path(aiconfigurator_core.__file__).parent / "systems" / "silicon_sample.csv"
    return path if path.is_file() else None


def read_corpus(path: Path) -> list[dict]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def number(text: str, default: float) -> float:
    return float(text) if text not in ("", None) else default


def dtype_of(row: dict) -> str | None:
    """Our weight dtype for a run: its precision; no precision and no GEMM quantisation: bf16."""
    if row["precision"] in DTYPES:
        return row["precision"]
    if not row["precision"] and not row["gemm_quant_mode"]:
        return "bf16"
    return None


def reject_reason(row: dict) -> str | None:
    """Why a corpus row is not a run our TP-only kernel model prices (None: it is)."""
    if row["mode"] != "agg":
        return "disaggregated"
    if row["backend"] not in ENGINES:
        return "other engine"
    if row["model_path"] not in MODELS:
        return "model not in catalog"
    if row["system"] not in SYSTEMS:
        return "system not in catalog"
    if dtype_of(row) is None:
        return f"precision {row['precision']}"
    if (number(row["attention_dp_size"], 1) != 1 or number(row["moe_ep_size"], 1) != 1
            or number(row["pp_size"], 1) != 1):
        return "attention DP, EP or PP layout"
    return None


def kernel_curves(row: dict, catalog, kernel_models: dict, engine: str):
    """The run's model record and kernel curves on `engine`'s tables (InputError: none)."""
    dtype = dtype_of(row)
    kv = kv_dtype_of(row["backend"], dtype, "auto")
    key = (engine, dtype, kv)
    if key not in kernel_models:
        kernel_models[key] = KernelPerformanceModel(engine, dtype, kv_dtype=kv)
    machine = catalog.machines[SYSTEMS[row["system"]]]
    model = model_in_dtype(catalog.models[MODELS[row["model_path"]]], dtype, kv)
    tp = int(float(row["tp_size"]))
    if not kernel_models[key].is_calibrated(model, machine, tp):
        raise InputError(f"no kernel tables for {row['system']}/{engine}/{dtype}")
    return model, kernel_models[key].curves(model, machine, tp)


def price(row: dict, catalog, kernel_models: dict) -> Run:
    """The run's kernel-only decode step and prefill: on its engine's tables, else on
    KERNEL_FALLBACK's (raises InputError when neither covers it)."""
    engine = row["backend"]
    try:
        model, curves = kernel_curves(row, catalog, kernel_models, engine)
        tables = engine
    except InputError:
        if engine not in KERNEL_FALLBACK:
            raise
        tables = KERNEL_FALLBACK[engine]
        model, curves = kernel_curves(row, catalog, kernel_models, tables)
    c, isl, osl = (float(row[k]) for k in ("batch_size", "isl", "osl"))
    context = c * (isl + osl / 2)
    decode = float(curves.token_time(c, context))
    return Run(engine, row["backend_version"] or "unrecorded", tables,
               f"{MODELS[row['model_path']]}@{row['system']}", model.is_moe, c, isl, osl,
               int(float(row["tp_size"])), model.layers, decode, float(curves.prompt_time(isl)),
               float(curves.mixed_time(isl, c, context)) - decode,
               float(row["silicon_tpot_ms"]) / 1e3, float(row["silicon_ttft_ms"]) / 1e3)


def load_runs(path: Path) -> tuple[list[Run], Counter]:
    """Priced runs and the count of skipped corpus rows per reason."""
    catalog, kernel_models = load_catalog(), {}
    runs, skipped = [], Counter()
    for row in read_corpus(path):
        reason = reject_reason(row)
        if reason is None:
            try:
                runs.append(price(row, catalog, kernel_models))
                continue
            except InputError as error:
                reason = "kernel tables: " + str(error).split(";")[0].split(" in the ")[0]
        skipped[reason] += 1
    return runs, skipped


def kernel_tpot(run: Run) -> float:
    """Kernel-only TPOT: a decode step plus the prefill interference, c/osl prompts per step."""
    each = run.mixed if INTERFERENCE == "mixed" else run.prefill
    return run.decode + run.c / run.osl * each


def interference_share(run: Run) -> float:
    """The predicted prefill interference relative to the decode step, c/osl x M / D."""
    return run.c / run.osl * run.mixed / run.decode


def host(terms: dict, sequences: float) -> float:
    return terms["iteration_s"] + terms["sequence_s"] * sequences


def combine(composition: str, kernels, host_s):
    """One iteration: host work after the kernels (serial) or beside them (overlap)."""
    return combine_host(kernels, host_s, composition == "overlap")


def tpot_after(run: Run, terms: dict, composition: str) -> float:
    """TPOT with the host terms: a share f = min(1, c/osl) of the steps carries the prompts
    (n = max(1, c/osl) of them: D + n x M, c + n sequences), the others are plain decode steps
    (D, c sequences); each step is combine(kernels, host). Without host time both compositions
    give kernel_tpot."""
    each = run.mixed if INTERFERENCE == "mixed" else run.prefill
    share, prompts = min(1.0, run.c / run.osl), max(1.0, run.c / run.osl)
    decode = combine(composition, run.decode, host(terms, run.c))
    mixed = combine(composition, run.decode + prompts * each, host(terms, run.c + prompts))
    return float((1.0 - share) * decode + share * mixed)


def ttft_after(run: Run, terms: dict, composition: str) -> float:
    """TTFT at low concurrency: the prompt's own iteration, combine(P, host of 1 sequence),
    and the first-token term."""
    return float(combine(composition, run.prefill, host(terms, 1.0)) + terms["first_token_s"]
                 + terms["first_token_s_per_layer"] * run.layers)


def robust_nonneg(features: np.ndarray, base: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """x >= 0 minimising the soft-L1 loss of (base + features @ x) / measured - 1 (0 without
    data)."""
    if len(measured) == 0:
        return np.zeros(features.shape[1])
    scale = np.maximum(np.abs(features).max(axis=0), 1e-30)
    f = features / scale

    def residuals(x):
        return (base + f @ x) / measured - 1.0

    x0 = np.full(f.shape[1], float(np.median(measured)) * 1e-2)
    fit = least_squares(residuals, x0, bounds=(0.0, np.inf), loss="soft_l1",
                        f_scale=SOFT_L1_SCALE, method="trf", xtol=1e-12, ftol=1e-12)
    return fit.x / scale


def soft_l1(residuals: np.ndarray) -> np.ndarray:
    """scipy's soft_l1 loss at SOFT_L1_SCALE, summed over the last axis."""
    z = (residuals / SOFT_L1_SCALE) ** 2
    return (2.0 * (np.sqrt(1.0 + z) - 1.0)).sum(axis=-1)


def overlap_tpot_grid(runs: list[Run], iteration_s: np.ndarray,
                      sequence_s: np.ndarray) -> np.ndarray:
    """tpot_after(..., "overlap") over a grid of terms (axis 0, 1) for every run (axis 2)."""
    each = np.array([r.mixed if INTERFERENCE == "mixed" else r.prefill for r in runs])
    c = np.array([r.c for r in runs])
    ratio = c / np.array([r.osl for r in runs])
    share, prompts = np.minimum(1.0, ratio), np.maximum(1.0, ratio)
    decode = np.array([r.decode for r in runs])
    a, b = iteration_s[:, None, None], sequence_s[None, :, None]
    return ((1.0 - share) * np.maximum(decode, a + b * c)
            + share * np.maximum(decode + prompts * each, a + b * (c + prompts)))


def fit_overlap_terms(runs: list[Run]) -> tuple[float, float]:
    """iteration_s, sequence_s >= 0 minimising the soft-L1 loss of the relative TPOT residuals
    under max(kernels, host). The loss is flat wherever the host is hidden, so a gradient
    method started at small terms does not move: a grid over both terms (0, and 0.1 us-30 ms
    per iteration, 1 ns-1 ms per sequence, log-spaced), then finer grids between the best
    point's neighbours."""
    if not runs:
        return 0.0, 0.0
    measured = np.array([r.tpot for r in runs])
    iteration = np.concatenate([[0.0], np.geomspace(1e-7, 3e-2, 80)])
    sequence = np.concatenate([[0.0], np.geomspace(1e-9, 1e-3, 80)])
    for _ in range(OVERLAP_REFINEMENTS + 1):
        loss = soft_l1(overlap_tpot_grid(runs, iteration, sequence) / measured - 1.0)
        i, j = np.unravel_index(int(np.argmin(loss)), loss.shape)
        best = float(iteration[i]), float(sequence[j])
        iteration = np.linspace(iteration[max(i - 1, 0)],
                                iteration[min(i + 1, len(iteration) - 1)], 41)
        sequence = np.linspace(sequence[max(j - 1, 0)],
                               sequence[min(j + 1, len(sequence) - 1)], 41)
    return best


def in_iteration_fit(run: Run) -> bool:
    """Whether the iteration terms are fitted on the run: its predicted prefill interference is
    below FIT_MAX_INTERFERENCE of the decode step (and it has at most TPOT_FIT_MAX_C users)."""
    return ((TPOT_FIT_MAX_C is None or run.c <= TPOT_FIT_MAX_C)
            and interference_share(run) < FIT_MAX_INTERFERENCE)


def iteration_fit_runs(runs: list[Run]) -> list[Run]:
    return [r for r in runs if in_iteration_fit(r)]


def fit_iteration_terms(runs: list[Run], composition: str) -> tuple[float, float]:
    """iteration_s, sequence_s from the TPOT of the runs with little predicted interference."""
    runs = iteration_fit_runs(runs)
    if composition == "overlap":
        return fit_overlap_terms(runs)
    features = np.array([[1.0, r.c + r.c / r.osl] for r in runs]).reshape(-1, 2)
    base = np.array([kernel_tpot(r) for r in runs])
    measured = np.array([r.tpot for r in runs])
    x = robust_nonneg(features, base, measured)
    return float(x[0]), float(x[1])


def fit_first_token(runs: list[Run], iteration_s: float, sequence_s: float,
                    per_layer: bool, composition: str) -> float:
    """The first-token term (a constant, or per layer) from the TTFT of low-concurrency runs."""
    low = [r for r in runs if r.c <= LOW_CONCURRENCY]
    if not low:
        return 0.0
    terms = {"iteration_s": iteration_s, "sequence_s": sequence_s, "first_token_s": 0.0,
             "first_token_s_per_layer": 0.0}
    features = np.array([[float(r.layers) if per_layer else 1.0] for r in low]).reshape(-1, 1)
    base = np.array([ttft_after(r, terms, composition) for r in low])
    measured = np.array([r.ttft for r in low])
    return float(robust_nonneg(features, base, measured)[0])


def fit_terms(runs: list[Run], per_layer: bool, composition: str) -> dict:
    iteration_s, sequence_s = fit_iteration_terms(runs, composition)
    first = fit_first_token(runs, iteration_s, sequence_s, per_layer, composition)
    return {"iteration_s": iteration_s, "sequence_s": sequence_s,
            "first_token_s": 0.0 if per_layer else first,
            "first_token_s_per_layer": first if per_layer else 0.0}


def held_out_terms(runs: list[Run], per_layer: bool, composition: str) -> list[dict]:
    """Per run, the terms fitted without its (model, system) group."""
    groups = sorted({r.group for r in runs})
    fitted = {g: fit_terms([r for r in runs if r.group != g], per_layer, composition)
              for g in groups}
    return [fitted[r.group] for r in runs]


def error_stats(predicted, measured) -> dict:
    errors = np.abs(np.asarray(predicted) / np.asarray(measured) - 1.0)
    if errors.size == 0:
        return {"median": None, "p90": None}
    return {"median": round(float(np.median(errors)), 3),
            "p90": round(float(np.percentile(errors, 90)), 3)}


def errors(runs: list[Run], terms: list[dict], composition: str) -> dict:
    """Before (kernels only) and after (with the held-out terms): TPOT over all runs, TTFT over
    the low-concurrency runs."""
    low = [i for i, r in enumerate(runs) if r.c <= LOW_CONCURRENCY]
    return {
        "tpot": {"before": error_stats([kernel_tpot(r) for r in runs], [r.tpot for r in runs]),
                 "after": error_stats([tpot_after(r, t, composition)
                                       for r, t in zip(runs, terms)], [r.tpot for r in runs])},
        "ttft": {"before": error_stats([runs[i].prefill for i in low],
                                       [runs[i].ttft for i in low]),
                 "after": error_stats([ttft_after(runs[i], terms[i], composition) for i in low],
                                      [runs[i].ttft for i in low])}}


def version_key(version: str):
    parts = version.replace("rc", ".").replace(".post", ".").split(".")
    return tuple(int(p) if p.isdigit() else -1 for p in parts)


def version_range(runs: list[Run]) -> str:
    versions = sorted({r.version for r in runs})
    numbered = sorted((v for v in versions if v[:1].isdigit()), key=version_key)
    other = [v for v in versions if not v[:1].isdigit()]
    text = "-".join(dict.fromkeys([numbered[0], numbered[-1]])) if numbered else ""
    return ", ".join([text] + other) if other else text


def sig(x: float, digits: int = 3) -> float:
    """Three significant digits; below RESOLUTION_S, 0."""
    return 0.0 if abs(x) < RESOLUTION_S else float(f"{x:.{digits}g}")


def tpot_score(err: dict) -> float:
    """What the composition is chosen by: the held-out TPOT error after the terms, median +
    P90 (both matter: the host floor moves a minority of the runs, the tail)."""
    return err["tpot"]["after"]["median"] + err["tpot"]["after"]["p90"]


def fit_composition(runs: list[Run], composition: str) -> dict:
    """Terms and held-out errors of one composition (the first-token form with the smaller
    held-out median TTFT error)."""
    held = {form: held_out_terms(runs, form, composition) for form in (False, True)}
    ttft_error = {form: errors(runs, held[form], composition)["ttft"]["after"]["median"] or 0.0
                  for form in held}
    per_layer = ttft_error[True] < ttft_error[False]
    fit = [i for i, r in enumerate(runs) if in_iteration_fit(r)]
    return {"terms": fit_terms(runs, per_layer, composition), "held": held[per_layer],
            "errors": errors(runs, held[per_layer], composition),
            "fit_rows": errors([runs[i] for i in fit], [held[per_layer][i] for i in fit],
                               composition)}


def fit_engine(runs: list[Run]) -> tuple[dict, dict]:
    """The engine's JSON entry, and what the summary and the docs report besides: per
    composition its terms and held-out errors (all runs, and the iteration fit's runs), the
    rows the iteration terms are fitted on, and the chosen composition's per-version errors."""
    fits = {composition: fit_composition(runs, composition) for composition in COMPOSITIONS}
    composition = min(COMPOSITIONS, key=lambda k: tpot_score(fits[k]["errors"]))
    chosen = fits[composition]
    entry = {"versions": version_range(runs), "composition": composition,
             **{k: sig(v) for k, v in chosen["terms"].items()},
             "runs": len(runs), "held_out": chosen["errors"]}
    by_version = {}
    for version in sorted({r.version for r in runs}, key=version_key):
        idx = [i for i, r in enumerate(runs) if r.version == version]
        if len(idx) >= MIN_VERSION_RUNS:
            by_version[version] = (len(idx), errors([runs[i] for i in idx],
                                                    [chosen["held"][i] for i in idx],
                                                    composition))
    report = {"versions": by_version, "fit_rows": len(iteration_fit_runs(runs)),
              "compositions": {k: {"terms": v["terms"], "errors": v["errors"],
                                   "fit_rows": v["fit_rows"]} for k, v in fits.items()}}
    return entry, report


def engine_runs(runs: list[Run], engine: str) -> list[Run]:
    return [r for r in runs if r.engine == engine
            and not (r.moe and engine in EXCLUDE_MOE)]


METHOD = (
    "Each aggregated TP-only run (attention DP, expert and pipeline parallelism 1) of a catalog "
    "model on a catalog machine is priced with KernelPerformanceModel(engine, dtype, "
    "kv_dtype=the engine's default) at the run's TP (SGLang runs its tables do not cover: on "
    "vLLM's tables of the same GPU and dtype): decode step D = token_time(c, C) with C = c x "
    "(isl + osl/2), prefill P = prompt_time(isl), M = mixed_time(isl, c, C) - D what a prompt "
    "adds to a decode step. A closed loop of c users starts c prompts per osl decode steps: a "
    "share f = min(1, c/osl) of the steps carries n = max(1, c/osl) prompts (kernels D + n x M, "
    "c + n sequences), the others are decode steps (D, c sequences); the kernel-only TPOT is "
    "D + c/osl x M. Host time per step h = iteration_s + sequence_s x sequences, and an "
    "iteration is combine(kernels, h): 'serial' kernels + h, or 'overlap' max(kernels, h) (an "
    "engine preparing step n + 1 while step n runs); TPOT = (1 - f) x combine(D, h(c)) + f x "
    "combine(D + n x M, h(c + n)). Per engine and composition, iteration_s and sequence_s >= 0 "
    "minimise a soft-L1 loss of the relative TPOT residuals (serial: non-negative least "
    "squares; overlap: a grid search, the loss being flat where the host is hidden) over the "
    "engine's runs whose predicted interference c/osl x M is below 25% of D (where it "
    "dominates, wave-started closed loops measure far less of it); then over its runs at c <= "
    "4 TTFT = combine(P, h(1)) + first_token, first_token a constant (first_token_s) or "
    "first_token_s_per_layer x layers, whichever has the smaller held-out median TTFT error "
    "(the other is 0). 'composition' is the one with the smaller held-out TPOT error (median + "
    "P90 over all the engine's runs); the terms and held_out are that composition's. "
    "TensorRT-LLM: dense models only (its DeepSeek runs are 1.5-2.5x faster than the kernel "
    "model; with them the held-out errors grow). held_out: leave one (model, system) group "
    "out, refit, predict it; absolute relative errors, TPOT over all runs, TTFT over runs at c "
    "<= 4; before = kernels only. Versions 'unrecorded': corpus rows without a "
    "backend_version. scripts/fit_engine_overheads.py, docs/engine-overheads.md.")


def build(path: Path) -> tuple[dict, dict, Counter]:
    """The JSON document, per-engine reports (fit_engine), and the skipped-row counts."""
    runs, skipped = load_runs(path)
    engines, reports, used = {}, {}, 0
    for engine in ENGINES:
        selected = engine_runs(runs, engine)
        skipped["MoE left out of this engine's fit"] += len(
            [r for r in runs if r.engine == engine]) - len(selected)
        engines[engine], reports[engine] = fit_engine(selected)
        used += len(selected)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    source = (f"{REPO} commit {COMMIT}, {CORPUS_PATH} (Apache-2.0; sha256 {digest}); "
              f"{used} measured serving runs used")
    return {"source": source, "method": METHOD, "engines": engines}, reports, skipped


def summary(document: dict, reports: dict, skipped: Counter) -> str:
    lines = [f"{'engine':8} {'runs':>5} {'compos.':>8} {'iter ms':>8} {'seq us':>7} "
             f"{'1st ms':>7} {'1st/layer ms':>12}  TPOT med/p90 before->after   "
             f"TTFT med/p90 before->after"]
    for engine, e in document["engines"].items():
        report = reports[engine]
        for composition, fit in report["compositions"].items():
            t = fit["terms"]
            mark = "*" if composition == e["composition"] else " "
            lines.append(f"{engine:8} {e['runs']:5d} {composition + mark:>8} "
                         f"{t['iteration_s'] * 1e3:8.3f} {t['sequence_s'] * 1e6:7.1f} "
                         f"{t['first_token_s'] * 1e3:7.2f} "
                         f"{t['first_token_s_per_layer'] * 1e3:12.3f}  {_pair(fit['errors'])}")
            lines.append(f"  {'iteration-fit runs':>38} {report['fit_rows']:4d} {' ' * 28}"
                         f"{_pair(fit['fit_rows'])}")
        scores = {k: tpot_score(v["errors"]) for k, v in report["compositions"].items()}
        other = next(k for k in scores if k != e["composition"])
        lines.append(f"  -> {e['composition']}: held-out TPOT median + P90 "
                     f"{scores[e['composition']]:.3f} vs {other} {scores[other]:.3f} "
                     f"({scores[other] - scores[e['composition']]:.3f} better)")
        for version, (n, err) in report["versions"].items():
            lines.append(f"  {version:28} {n:4d} runs {' ' * 37}{_pair(err)}")
    lines.append("skipped rows: " + ", ".join(f"{k} {v}" for k, v in skipped.most_common() if v))
    return "\n".join(lines)


def _pair(err: dict) -> str:
    def one(k):
        b, a = err[k]["before"], err[k]["after"]
        if b["median"] is None:
            return f"{'-':>27}"
        return f"{b['median']:.2f}/{b['p90']:.2f} -> {a['median']:.2f}/{a['p90']:.2f}".rjust(27)
    return f"{one('tpot')}   {one('ttft')}"


def differences(new: dict, old: dict, path: str = "") -> list[str]:
    """Where two documents differ (numbers within RTOL are equal; the sha256 must match)."""
    if isinstance(new, dict) and isinstance(old, dict):
        out = [f"{path}/{k}: missing" for k in set(new) ^ set(old)]
        for k in sorted(set(new) & set(old)):
            out += differences(new[k], old[k], f"{path}/{k}")
        return out
    if isinstance(new, float) and isinstance(old, (int, float)):
        return [] if math.isclose(new, old, rel_tol=RTOL, abs_tol=1e-12) else \
            [f"{path}: {old} -> {new}"]
    return [] if new == old else [f"{path}: {old!r} -> {new!r}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--silicon", type=Path, default=default_corpus(),
                        help="aiconfigurator's silicon_sample.csv (default: the installed "
                             "aiconfigurator-core's copy)")
    parser.add_argument("--check", action="store_true",
                        help="re-derive and compare with the shipped file; write nothing")
    args = parser.parse_args(argv)
    if args.silicon is None or not args.silicon.is_file():
        parser.error("--silicon PATH: aiconfigurator's silicon_sample.csv "
                     "(docs/engine-overheads.md)")
    document, reports, skipped = build(args.silicon)
    print(summary(document, reports, skipped))
    if args.check:
        diff = differences(document, json.loads(OUT.read_text()))
        print("\n".join(diff) if diff else f"{OUT.relative_to(ROOT)} is up to date")
        return 1 if diff else 0
    OUT.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
