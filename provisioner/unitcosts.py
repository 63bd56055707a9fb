"""Unit costs of each design's optimum: tokens/s, tokens/s per GPU and per user, $ and kWh per
million tokens (issue 40), in the units API prices are quoted in.

The token rates are the rate served (the optimum's rate; a trace replayed as it is: its requests
over its span) times the mean prompt and output tokens of the *base sample* (seed --seed, the
sample the optimum's latencies were measured on): deterministic, so `provision check` re-derives
the same figures. Per user: 1000 / the optimum's TPOT P50 in ms on that sample. Costs are the
optimum's catalog $/h and provisioned power (GPUs x TDP x cap) spread over the tokens of an hour.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

TOKENS_FROM = "base sample"   # what the mean tokens per request are the mean over
PER_USER_FROM = "tpot_p50"    # output tokens/s per user: 1000 / this latency in ms


def unit_costs(*, rate_rps: float, mean_prompt_tokens: float, mean_output_tokens: float,
               cost_per_hour: float, power_kw: float, gpus: int,
               tpot_p50_ms: float | None = None,
               pool_costs: dict[str, float] | None = None, requests: int | None = None,
               sample_seed: int | None = None) -> dict:
    """The unit-cost record of one optimum (unrounded; reports round it to 6 digits).

    `pool_costs`: a disaggregated design's {"prompt": $/h, "token": $/h} (the split a planner
    compares with API input and output prices); None for a colocated design."""
    input_tps = rate_rps * mean_prompt_tokens
    output_tps = rate_rps * mean_output_tokens
    total_tps = input_tps + output_tps

    def per_million(per_hour: float, tokens_per_s: float) -> float | None:
        return per_hour / (tokens_per_s * 3600.0) * 1e6 if tokens_per_s > 0 else None

    record = {
        "basis": {"rate_rps": rate_rps, "tokens_from": TOKENS_FROM,
                  "sample_seed": sample_seed, "requests": requests,
                  "mean_prompt_tokens": mean_prompt_tokens,
                  "mean_output_tokens": mean_output_tokens,
                  "per_user_from": PER_USER_FROM},
        "input_tokens_per_s": input_tps,
        "output_tokens_per_s": output_tps,
        "total_tokens_per_s": total_tps,
        "tokens_per_s_per_gpu": total_tps / gpus if gpus else None,
        "output_tokens_per_s_per_gpu": output_tps / gpus if gpus else None,
        "output_tokens_per_s_per_user": (1000.0 / tpot_p50_ms
                                         if tpot_p50_ms else None),
        "usd_per_m_tokens_blended": per_million(cost_per_hour, total_tps),
        "usd_per_m_output_tokens_all_cost": per_million(cost_per_hour, output_tps),
    }
    if pool_costs is not None:
        record["prompt_pool_usd_per_m_input_tokens"] = per_million(pool_costs["prompt"],
                                                                   input_tps)
        record["token_pool_usd_per_m_output_tokens"] = per_million(pool_costs["token"],
                                                                   output_tps)
    record["kwh_per_m_tokens"] = per_million(power_kw, total_tps)
    return record


def optimum_unit_costs(result, study) -> dict | None:
    """`unit_costs` of a DesignResult's optimum on the study's base sample (None without one)."""
    from provisioner.samples import study_sample
    o = result.optimum
    if o is None:
        return None
    sample = study_sample(study, o.rate_rps, study.seed)
    requests = len(sample)
    if not requests:
        return None
    rate = o.rate_rps
    if study.goal.closed is not None:   # the throughput the users achieved on it
        rate = (result.verification or {}).get("closed_loop", {}).get("throughput_rps")
        if rate is None:
            return None
    elif rate is None:   # a trace replayed as it is: its requests over its span
        span = float(np.max(sample.arrival_s))
        rate = requests / span if span > 0 else None
        if rate is None:
            return None
    latency = (result.verification or {}).get("latency_ms") or {}
    tpot = (latency.get("tpot") or {}).get("p50")
    design = result.design
    pool_costs = None
    if not design.is_baseline and not design.is_chunked:   # separate prompt and token pools
        costs = {pool.role: pool.sku.cost_per_hour * n
                 for pool, n in design.counts(o.prompt_machines, o.token_machines)}
        if set(costs) == {"prompt", "token"}:
            pool_costs = costs
    return unit_costs(rate_rps=rate,
                      mean_prompt_tokens=float(np.mean(sample.prompt_tokens)),
                      mean_output_tokens=float(np.mean(sample.output_tokens)),
                      cost_per_hour=o.cost_per_hour, power_kw=o.power_kw, gpus=o.gpus,
                      tpot_p50_ms=tpot, pool_costs=pool_costs, requests=requests,
                      sample_seed=study.seed)


def attach_unit_costs(results: Sequence, study) -> None:
    """Each result's `unit_costs` (`optimum_unit_costs`)."""
    for result in results:
        result.unit_costs = optimum_unit_costs(result, study)


# ------------------------------------------------------------------- the terminal and the page
TITLE = "Unit costs (rate x base sample's mean tokens; out/user = 1000 / TPOT P50 ms)"
HTML_TITLE = ("Unit costs of each optimum (tokens/s: rate x the base sample's mean prompt and "
              "output tokens; per user: 1000 / TPOT P50 ms; $/M, kWh/M: per million tokens)")
COLUMNS = ("tok/s", "out tok/s", "tok/s/GPU", "out tok/s/GPU", "out tok/s/user",
           "$/M blended", "$/M out (all cost)", "prompt pool $/M in", "token pool $/M out",
           "kWh/M")
KEYS = ("total_tokens_per_s", "output_tokens_per_s", "tokens_per_s_per_gpu",
        "output_tokens_per_s_per_gpu", "output_tokens_per_s_per_user",
        "usd_per_m_tokens_blended", "usd_per_m_output_tokens_all_cost",
        "prompt_pool_usd_per_m_input_tokens", "token_pool_usd_per_m_output_tokens",
        "kwh_per_m_tokens")


def rate_text(value: float | None) -> str:
    """A token rate: whole above 100 ("11,882"), else 3 significant digits ("45.8")."""
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def money_text(value: float | None, unit: str = "$") -> str:
    """A price per million tokens: whole from $100 ("$199"), cents from $1 ("$1.80"), else
    3 significant digits ("$0.0421")."""
    if value is None:
        return "-"
    if value >= 100:
        return f"{unit}{value:,.0f}"
    return f"{unit}{value:.2f}" if value >= 1 else f"{unit}{value:.3g}"


def cells(record: dict) -> list[str]:
    """The record's figures, one per COLUMNS ("-" where it has none)."""
    out = []
    for key in KEYS:
        value = record.get(key)
        if key.startswith(("usd", "prompt_pool", "token_pool")):
            out.append(money_text(value))
        elif key == "kwh_per_m_tokens":
            out.append("-" if value is None else f"{value:.3g}")
        else:
            out.append(rate_text(value))
    return out


def unit_cost_lines(document: dict) -> list[str]:
    """The terminal's unit costs: two lines per optimum (three for a disaggregated design: the
    prompt and token pools' own prices per million input and output tokens), each under 80
    columns for the catalog's design names."""
    lines = []
    for entry in document["designs"]:
        uc = (entry["optimum"] or {}).get("unit_costs")
        if not uc:
            continue
        c = dict(zip(KEYS, cells(uc)))
        user = ("" if uc.get("output_tokens_per_s_per_user") is None
                else f", {c['output_tokens_per_s_per_user']} out/user")
        lines.append(f"  {entry['design']}: {c['total_tokens_per_s']} tok/s "
                     f"({c['output_tokens_per_s']} out), {c['tokens_per_s_per_gpu']}/GPU "
                     f"({c['output_tokens_per_s_per_gpu']} out){user}")
        lines.append(f"    {c['usd_per_m_tokens_blended']}/M blended, "
                     f"{c['usd_per_m_output_tokens_all_cost']}/M out with all the cost on "
                     f"output, {c['kwh_per_m_tokens']} kWh/M")
        if "prompt_pool_usd_per_m_input_tokens" in uc:
            lines.append(f"    split: prompt pool {c['prompt_pool_usd_per_m_input_tokens']}/M "
                         f"in, token pool {c['token_pool_usd_per_m_output_tokens']}/M out")
    return [TITLE + ":", *lines] if lines else []


def unit_cost_rows(document: dict) -> list[tuple[str, list[str]]]:
    """(design, cells) per optimum with unit costs: report.html's table."""
    return [(entry["design"], cells(entry["optimum"]["unit_costs"]))
            for entry in document["designs"]
            if (entry["optimum"] or {}).get("unit_costs")]
