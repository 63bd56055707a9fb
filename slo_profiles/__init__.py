"""SLO profiles: limits on P50/P90/P99 of TTFT, TBT, E2E and ITL, as slowdowns or absolute times.

A slowdown profile (the Splitwise Table VI kind) compares each request with the same request
alone on a DGX-A100; an absolute profile gives milliseconds. Any subset of the (metric,
percentile) pairs may be limited. TBT is a request's mean gap between its output tokens (TPOT);
ITL is every inter-token gap of every request (where a prompt batched beside decodes stalls
them), and has no per-request reference, so its limits are milliseconds in either kind.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Mapping

from hardware_catalog import InputError, check_path, read_yaml
from hardware_catalog.checks import Invalid, positive

DATA_DIR = Path(__file__).resolve().parent
REQUEST_METRICS = ("ttft", "tbt", "e2e")  # one value per request
METRICS = REQUEST_METRICS + ("itl",)
ABSOLUTE_METRICS = ("itl",)  # limited in milliseconds whatever the profile's kind
PERCENTILES = {"p50": 50.0, "p90": 90.0, "p99": 99.0}
KINDS = ("slowdown", "absolute_ms")
MAX_LIMIT = 1e7  # a slowdown factor, or milliseconds (about 2.8 hours): beyond it, a typo

__all__ = ["SloProfile", "load_slo_profile", "builtin_slo_profiles", "METRICS", "REQUEST_METRICS",
           "PERCENTILES", "MS_OPTIONS", "with_ms_limits"]


@dataclass(frozen=True)
class SloProfile:
    name: str
    kind: str                                   # "slowdown" or "absolute_ms"
    limits: Mapping[tuple[str, str], float]     # (metric, "p50"/"p90"/"p99") -> limit
    description: str = ""
    # request metrics limited in milliseconds although the profile's kind is slowdown: those
    # given on the command line (`with_ms_limits`, --ttft-p99-ms ...)
    absolute: tuple[str, ...] = ()

    def unit(self, metric: str) -> str:
        """"x" (a slowdown) or "ms", the unit of the metric's limits and values."""
        return "x" if self.slowdown(metric) else "ms"

    def slowdown(self, metric: str) -> bool:
        """Is the metric limited (and measured) as a slowdown against the reference?"""
        return (self.kind == "slowdown" and metric not in ABSOLUTE_METRICS
                and metric not in self.absolute)

    def as_dict(self) -> dict:
        nested: dict[str, dict[str, float]] = {}
        for (metric, pct), limit in self.limits.items():
            nested.setdefault(metric, {})[pct] = limit
        record = {"name": self.name, "kind": self.kind, "description": self.description,
                  "limits": nested}
        if self.absolute:
            record["ms_metrics"] = list(self.absolute)
        return record


# Limits in milliseconds given on the command line (--ttft-p99-ms 500, ...): (option name,
# the profile's metric, percentile). TPOT is the profile's tbt (a request's mean gap between
# its output tokens, vLLM's TPOT); --tbt-P-ms is the same option.
MS_OPTION_METRICS = {"ttft": "ttft", "tpot": "tbt", "e2e": "e2e", "itl": "itl"}
MS_OPTIONS = tuple((f"{name}_{pct}_ms", metric, pct)
                   for name, metric in MS_OPTION_METRICS.items() for pct in PERCENTILES)


def with_ms_limits(profile: SloProfile, limits: Mapping[tuple[str, str], float]) -> SloProfile:
    """The profile with limits in milliseconds given per (metric, percentile): a metric given
    any replaces all of that metric's profile limits (its unit becomes ms, whatever the
    profile's kind); the metrics not given keep the profile's. The name says what changed:
    `splitwise+ttft-p99-500ms`."""
    if not limits:
        return profile
    given = {metric for metric, _ in limits}
    merged = {key: value for key, value in profile.limits.items() if key[0] not in given}
    merged.update(limits)
    ordered = {k: merged[k] for m in METRICS for p in PERCENTILES if (k := (m, p)) in merged}
    absolute = tuple(m for m in REQUEST_METRICS
                     if profile.kind == "slowdown" and (m in given or m in profile.absolute))
    label = "+".join(f"{'tpot' if m == 'tbt' else m}-{p}-{v:g}ms" for (m, p), v in
                     ordered.items() if (m, p) in limits)
    return SloProfile(name=f"{profile.name}+{label}", kind=profile.kind, limits=ordered,
                      description=f"{profile.description}; limits in ms given: "
                                  f"{label.replace('+', ', ')}".lstrip("; "),
                      absolute=absolute)


def parse_slo_profile(name: str, data, source: str) -> SloProfile:
    if not isinstance(data, dict):
        raise InputError("an SLO profile must be a mapping with 'kind' and 'limits'", source=source)
    unknown = sorted(set(data) - {"kind", "limits", "description"})
    if unknown:
        raise InputError("unknown key; expected kind, limits, description", source=source,
                         field=unknown[0])
    kind = data.get("kind")
    if kind not in KINDS:
        raise InputError(f"must be one of {', '.join(KINDS)}, got {kind!r}", source=source,
                         field="kind")
    raw = data.get("limits")
    if not isinstance(raw, dict) or not raw:
        raise InputError("must map metrics (ttft, tbt, e2e, itl) to percentile limits",
                         source=source, field="limits")
    limits: dict[tuple[str, str], float] = {}
    for metric in raw:
        if metric not in METRICS:
            raise InputError(f"unknown metric '{metric}'; use {', '.join(METRICS)}", source=source,
                             field="limits")
        per_pct = raw[metric]
        if not isinstance(per_pct, dict) or not per_pct:
            raise InputError(f"'{metric}' must map p50/p90/p99 to limits", source=source,
                             field=f"limits.{metric}")
        for pct, limit in per_pct.items():
            key = f"limits.{metric}.{pct}"
            if pct not in PERCENTILES:
                raise InputError(f"unknown percentile '{pct}'; use p50, p90, p99", source=source,
                                 field=key)
            try:
                limits[(metric, pct)] = positive(MAX_LIMIT)(limit)
            except Invalid as err:
                raise InputError(f"limit {err}", source=source, field=key) from None
    description = data.get("description", "")
    if not isinstance(description, str):
        raise InputError(f"must be a string, got {'null' if description is None else description!r}"[:120],
                         source=source, field="description")
    ordered = {k: limits[k] for m in METRICS for p in PERCENTILES if (k := (m, p)) in limits}
    return SloProfile(name=name, kind=kind, limits=ordered,
                      description=description)


@lru_cache(maxsize=None)
def builtin_slo_profiles() -> dict[str, SloProfile]:
    return {path.stem: parse_slo_profile(path.stem, read_yaml(path), str(path))
            for path in sorted(DATA_DIR.glob("*.yaml"))}


def load_slo_profile(name_or_path: str) -> SloProfile:
    """A built-in profile by name, or a YAML file with the same fields."""
    builtins = builtin_slo_profiles()
    if name_or_path in builtins:
        return builtins[name_or_path]
    check_path(name_or_path, "slo")
    path = Path(name_or_path)
    if path.suffix.lower() in (".yaml", ".yml") or path.exists():
        return parse_slo_profile(path.stem, read_yaml(path), str(path))
    raise InputError(f"unknown SLO profile '{name_or_path}'; built-in: {', '.join(builtins)} "
                     "(or give a YAML file)")
