"""Calibration: fit the default model's coefficients to measured profiles and report held-out error.

Profile format (SplitwiseSim): CSV columns model, hardware, tensor_parallel, prompt_size,
batch_size, token_size, prompt_time, token_time (ms; token_time is ONE decode iteration of the
whole batch); e2e_time is optional. Row numbers in errors count the header as row 1.

Fitting, per (model, hardware, tensor_parallel) group (closed forms in `simcore.perfmodel`):
- prompt rows: total tokens T = prompt_size x batch_size in n = batch_size prompts;
- token rows: b = batch_size requests holding X = b x (prompt_size + token_size / 2) context
  tokens on average over the decode (token_size is the requested maximum; generation may stop
  earlier, which overstates X a little; the context term is a few % of a decode at most);
- the loss is robust (soft-L1, scale 2%) on log latencies, close to minimising the mean absolute
  percentage error; weak priors on the dimensionless shape parameters (knee positions, memory
  share, sharpness) keep parameters the data cannot identify near physical values;
- exact duplicate rows are counted once (the SplitwiseSim file repeats its centre point in each
  of its three sweeps), and preemption artefacts are dropped: rows whose e2e_time exceeds twice
  prompt_time + token_size x token_time (vLLM preempted and recomputed requests; in the public
  profile these are exactly the TP2 batch-64 rows, whose prompt_time covers part of the batch).
"""
from __future__ import annotations


from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
from scipy.optimize import least_squares  # robust bounded nonlinear least squares for the fit

from hardware_catalog import Catalog, InputError, load_catalog
from hardware_catalog.csvschema import CALIBRATION_PROFILE, read_table
from simcore.perfmodel import (DecodeCoefficients, PairCoefficients, PromptCoefficients,
                               Reference)

__all__ = ["PROFILE_COLUMNS", "read_profile_csv", "select_rows", "clean_profile", "fit_group", "fit_profile",
           "HeldOutError", "Calibration", "calibrate", "held_out_random", "grid_point_folds",
           "fold_errors", "value_folds", "prompt_features", "decode_features"]

PROFILE_COLUMNS = CALIBRATION_PROFILE.required
_WHOLE = ("tensor_parallel", "prompt_size", "batch_size", "token_size")
_TIMES = ("prompt_time", "token_time", "e2e_time")
GROUP = ["model", "hardware", "tensor_parallel"]
# Sane ranges (beyond them a row is a typo) are declared with the file kind's schema.
# A group's fit needs this many distinct measurements, over >= 2 prompt sizes and >= 2 batch
# sizes: the closed forms have 8 (prompt) and 5 (decode) parameters; fewer rows fit the priors.
MIN_GROUP_ROWS = 5


# ------------------------------------------------------------------------------ reading
def read_profile_csv(path: str | Path) -> pd.DataFrame:
    """Read and validate a profile CSV (`csvschema.CALIBRATION_PROFILE`: columns by name, each
    typed and bounded); every problem is a one-line InputError (file, row, field)."""
    table = read_table(CALIBRATION_PROFILE, path)
    profile = pd.DataFrame({c: table[c] for c in ("model", "hardware")})
    for column in _WHOLE + _TIMES:
        if column in table.values:
            profile[column] = table[column].astype(np.int64 if column in _WHOLE else np.float64)
    profile["row"] = table.rows
    return profile


def select_rows(profile: pd.DataFrame, tensor_parallel: int | None = None,
                exclude_hardware: tuple[str, ...] = (), source: str = "profile") -> pd.DataFrame:
    """Rows of one tensor parallelism (if given) without the excluded hardware."""
    keep = ~profile.hardware.isin(list(exclude_hardware))
    if tensor_parallel is not None:
        keep &= profile.tensor_parallel == tensor_parallel
    if not keep.any():
        raise InputError("no rows left after the tensor-parallel and hardware filters",
                         source=source)
    return profile[keep]


def clean_profile(profile: pd.DataFrame) -> tuple[pd.DataFrame, int, int]:
    """Drop exact duplicate measurements and preemption artefacts (see module doc).

    Returns (clean rows, duplicates dropped, artefacts dropped).
    """
    measured = [c for c in profile.columns if c != "row"]
    unique = profile.drop_duplicates(subset=measured)
    artefact = np.zeros(len(unique), dtype=bool)
    if "e2e_time" in unique.columns:
        budget = unique.prompt_time + unique.token_size * unique.token_time
        artefact = (unique.e2e_time > 2.0 * budget).to_numpy()
    return (unique[~artefact].reset_index(drop=True), len(profile) - len(unique),
            int(artefact.sum()))


# ------------------------------------------------------------------------------ fitting
def prompt_features(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(total prompt tokens, prompts) of each profile row's prefill."""
    return ((rows.prompt_size * rows.batch_size).to_numpy(np.float64),
            rows.batch_size.to_numpy(np.float64))


def decode_features(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(batch size, mean context tokens held by the batch) of each row's decode iterations."""
    b = rows.batch_size.to_numpy(np.float64)
    return b, b * (rows.prompt_size.to_numpy(np.float64) + rows.token_size.to_numpy(np.float64) / 2)


LOSS_SCALE = 0.02    # soft-L1 switches from squared to absolute log error at ~2%
PRIOR_WEIGHT = 0.03  # a prior residual of one sigma weighs like a 3% miss on one row


@dataclass(frozen=True)
class _Form:
    """A closed form in fit parameters: theta -> coefficients, with priors and bounds."""
    names: tuple[str, ...]
    prior: tuple[float, ...]     # prior centres (theta units); NaN: no prior
    sigma: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]


# Prompt theta: ln level (o + M, ms), logit memory share M/(o+M), ln roofline knee tokens M/C,
# ln sharpness, ln knee rise r, ln knee centre tokens, ln knee width, batch exponent.
_PROMPT = _Form(("level", "memory_share", "roofline_knee", "sharpness", "knee_rise",
                 "knee_tokens", "knee_width", "batch_exponent"),
                prior=(np.nan, np.log(0.3 / 0.7), np.log(200), np.log(4), np.log(0.5),
                       np.log(3000), np.log(0.35), 0.0),
                sigma=(np.nan, 1.5, 1.0, 0.7, 1.0, 0.7, 0.7, 0.1),
                low=(-np.inf, -6, 0.0, 0.0, np.log(1e-3), np.log(16), np.log(0.02), -0.5),
                high=(np.inf, 6, np.log(1e5), np.log(64), np.log(10), np.log(1e6), np.log(5), 0.5))
# Decode theta: ln level (o + M, ms), logit memory share, ln knee batch M/C, ln sharpness,
# ln (context ms per token / level).
_DECODE = _Form(("level", "memory_share", "knee_batch", "sharpness", "context_share"),
                prior=(np.nan, np.log(0.3 / 0.7), np.log(20), np.log(2), np.log(5e-6)),
                sigma=(np.nan, 1.5, 1.0, 0.7, 3.0),
                low=(-np.inf, -6, 0.0, 0.0, np.log(1e-12)),
                high=(np.inf, 6, np.log(1e4), np.log(64), np.log(1e-2)))


def _split_level(level_ms: float, share_logit: float) -> tuple[float, float]:
    memory = level_ms / (1.0 + np.exp(-share_logit))
    return (level_ms - memory) / 1000.0, memory / 1000.0


def _prompt_coefficients(theta: np.ndarray) -> PromptCoefficients:
    overhead, memory = _split_level(np.exp(theta[0]), theta[1])
    values = (overhead, memory, memory / np.exp(theta[2]), np.exp(theta[3]), np.exp(theta[5]),
              np.exp(theta[6]), np.exp(theta[4]), theta[7])
    return PromptCoefficients(*map(float, values))


def _decode_coefficients(theta: np.ndarray) -> DecodeCoefficients:
    overhead, memory = _split_level(np.exp(theta[0]), theta[1])
    values = (overhead, memory, memory / np.exp(theta[2]), np.exp(theta[3]),
              np.exp(theta[0] + theta[4]) / 1000.0)
    return DecodeCoefficients(*map(float, values))


def _fit(form: _Form, build, features: tuple, seconds: np.ndarray):
    """Robust MAP fit of one closed form to measured latencies (seconds)."""
    prior, sigma = np.array(form.prior), np.array(form.sigma)
    theta0 = np.where(np.isnan(prior), np.log(seconds.min() * 1000.0), prior)
    low = np.where(np.isinf(form.low), theta0 - 8, form.low)
    high = np.where(np.isinf(form.high), theta0 + 8, form.high)
    has_prior = ~np.isnan(prior)
    log_measured = np.log(seconds)

    def residuals(theta):
        predicted = build(theta).seconds(*features)
        return np.concatenate([np.log(predicted) - log_measured,
                               PRIOR_WEIGHT * (theta - prior)[has_prior] / sigma[has_prior]])

    solution = least_squares(residuals, np.clip(theta0, low, high), bounds=(low, high),
                             loss="soft_l1", f_scale=LOSS_SCALE, max_nfev=4000)
    return build(solution.x)


def fit_group(rows: pd.DataFrame) -> tuple[PromptCoefficients, DecodeCoefficients]:
    """Fit prompt and decode coefficients to one group's rows (times in ms)."""
    prompt = _fit(_PROMPT, _prompt_coefficients, prompt_features(rows),
                  rows.prompt_time.to_numpy(np.float64) / 1000.0)
    decode = _fit(_DECODE, _decode_coefficients, decode_features(rows),
                  rows.token_time.to_numpy(np.float64) / 1000.0)
    return prompt, decode


def reference_for(model: str, hardware: str, catalog: Catalog) -> Reference | None:
    """Datasheet figures of the catalog model/machine a profile group names (None if unknown).

    A model matches by name or perf_profile; hardware by machine name, or by perf_profile of a
    calibrated machine without a power cap.
    """
    specs = [m for m in catalog.models.values() if model in (m.name, m.perf_profile)]
    machines = [m for m in catalog.machines.values() if m.name == hardware or (
        m.perf_profile == hardware and m.calibrated and m.prompt_slowdown == 1.0)]
    if not specs or not machines:
        return None
    return Reference.of(specs[0], machines[0])


def fit_profile(profile: pd.DataFrame, catalog: Catalog | None = None) -> list[PairCoefficients]:
    """Coefficients for every (model, hardware, tensor_parallel) group of a cleaned profile."""
    catalog = catalog or load_catalog()
    groups = []
    for (model, hardware, tp), rows in profile.groupby(GROUP, sort=True):
        prompt, decode = fit_group(rows)
        groups.append(PairCoefficients(model, hardware, int(tp), prompt, decode,
                                       reference_for(model, hardware, catalog)))
    return groups


# ------------------------------------------------------------------------------ held-out error
@dataclass(frozen=True)
class HeldOutError:
    """Mean and max absolute percentage error of one group and phase on held-out rows."""
    model: str
    hardware: str
    tensor_parallel: int
    phase: str               # "prompt" or "token"
    train_rows: int
    test_rows: int
    mape_pct: float | None   # None when the group is too small to hold rows out
    max_ape_pct: float | None

    def as_dict(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def _ape(coefficients: tuple, rows: pd.DataFrame) -> dict[str, np.ndarray]:
    """Absolute percentage errors of fitted (prompt, decode) coefficients on rows, per phase."""
    prompt, decode = coefficients
    predicted = {"prompt": prompt.seconds(*prompt_features(rows)) * 1000.0,
                 "token": decode.seconds(*decode_features(rows)) * 1000.0}
    measured = {"prompt": rows.prompt_time.to_numpy(), "token": rows.token_time.to_numpy()}
    return {phase: 100.0 * np.abs(predicted[phase] - measured[phase]) / measured[phase]
            for phase in predicted}


def held_out_random(rows: pd.DataFrame, seed: int, test_fraction: float = 0.2):
    """Fit on a seeded random (1 - test_fraction) of one group's rows; APE on the rest per phase.

    Returns (train rows, test rows, {phase: APE array}) or None for groups under 5 rows.
    """
    n_test = int(round(len(rows) * test_fraction))
    if len(rows) < 5 or n_test == 0:
        return None
    order = np.random.default_rng(seed).permutation(len(rows))
    test, train = rows.iloc[order[:n_test]], rows.iloc[order[n_test:]]
    return len(train), len(test), _ape(fit_group(train), test)


def grid_point_folds(rows: pd.DataFrame) -> Iterator[tuple[str, np.ndarray]]:
    """Leave one grid value out: each distinct (prompt_size, batch_size) point in turn.

    A profile of one-dimensional sweeps holds each prompt_size out along the prompt sweep and
    each batch_size along the batch sweep; the shared centre point is one fold.
    """
    for (p, b), _ in rows.groupby(["prompt_size", "batch_size"], sort=True):
        yield f"prompt_size={p} batch_size={b}", ((rows.prompt_size == p)
                                                  & (rows.batch_size == b)).to_numpy()


def value_folds(rows: pd.DataFrame) -> Iterator[tuple[str, np.ndarray]]:
    """Stress variant: hold out EVERY row with a given prompt_size, then batch_size, value."""
    for column in ("prompt_size", "batch_size"):
        for value in sorted(rows[column].unique()):
            yield f"{column}={value}", (rows[column] == value).to_numpy()


def fold_errors(rows: pd.DataFrame, folds) -> dict[str, np.ndarray]:
    """APE of every held-out row over all folds (fit on the rest each time), per phase."""
    pooled: dict[str, list] = {"prompt": [], "token": []}
    for _, test in folds:
        errors = _ape(fit_group(rows[~test]), rows[test])
        for phase, ape in errors.items():
            pooled[phase].append(ape)
    return {phase: np.concatenate(parts) for phase, parts in pooled.items()}


@dataclass(frozen=True)
class Calibration:
    """The result of `calibrate`: coefficients fitted on all rows, and held-out errors."""
    groups: list[PairCoefficients]
    errors: list[HeldOutError]
    rows: int
    duplicates_dropped: int
    artefacts_dropped: int


def check_group_sizes(clean: pd.DataFrame, source: str = "profile") -> None:
    """Refuse to fit a group from too few measurements (it would echo the priors)."""
    for (model, hardware, tp), rows in clean.groupby(GROUP, sort=True):
        if (len(rows) < MIN_GROUP_ROWS or rows.prompt_size.nunique() < 2
                or rows.batch_size.nunique() < 2):
            raise InputError(
                f"group {model}/{hardware}/tp{tp} has {len(rows)} distinct rows over "
                f"{rows.prompt_size.nunique()} prompt sizes and {rows.batch_size.nunique()} "
                f"batch sizes; a fit needs >= {MIN_GROUP_ROWS} rows over >= 2 of each: measure "
                "more points, or leave the group out (tensor_parallel / hardware filters)",
                source=source)


def calibrate(profile: pd.DataFrame, seed: int = 0, test_fraction: float = 0.2,
              catalog: Catalog | None = None, source: str = "profile") -> Calibration:
    """Fit every group on all its clean rows; report error on a seeded random held-out split."""
    clean, duplicates, artefacts = clean_profile(profile)
    check_group_sizes(clean, source)
    errors = []
    for (model, hardware, tp), rows in clean.groupby(GROUP, sort=True):
        split = held_out_random(rows, seed, test_fraction)
        for phase in ("prompt", "token"):
            if split is None:
                errors.append(HeldOutError(model, hardware, int(tp), phase, len(rows), 0, None, None))
                continue
            train, test, ape = split
            errors.append(HeldOutError(model, hardware, int(tp), phase, train, test,
                                       float(ape[phase].mean()), float(ape[phase].max())))
    return Calibration(fit_profile(clean, catalog), errors, len(clean), duplicates, artefacts)
