"""Report tables as text, shared by the terminal (terminal.py) and report.html (figures.py):
each is computed once from report.json's content, so the two views cannot disagree."""
from __future__ import annotations
from provisioner.unitcosts import money_text


RESILIENCE_COLUMNS = ("no failures", "restart", "replicate")


def resilience_rows(document: dict) -> list[tuple[str, list[str]]]:
    """--survive-failures: per design, the plain optimum and the failure-aware optimum under
    restart and replicate, with the price of resilience (cost and power against plain; for
    max-rate, the rate given up within the same budget)."""
    max_rate = document["inputs"]["goal"]["name"] == "max-rate"
    rows = []
    for entry in document["designs"]:
        r = entry.get("resilience")
        if r is None:
            continue
        cells = []
        for label in ("plain", "restart", "replicate"):
            o = r[label]
            text = optimum_cell(o, max_rate)
            if o is not None and max_rate and o.get("rate_ratio") is not None:
                text += f" ({o['rate_ratio'] - 1:+.1%} rate)"
            elif o is not None and not max_rate and o.get("cost_ratio") is not None:
                text += (f" ({o['cost_ratio'] - 1:+.1%} cost, {o['power_ratio'] - 1:+.1%} "
                         "power)")
            cells.append(text)
        rows.append((entry["design"], cells))
    return rows


SAVINGS_COLUMNS = ("without the cache", "with the cache", "saved")


def savings_rows(document: dict) -> list[tuple[str, list[str]]]:
    """--prefix-cache on|aware: per design, its optimum with the cache off and on, and what
    the cache saved (cost and power; for max-rate, the rate it adds in the same budget)."""
    max_rate = document["inputs"]["goal"]["name"] == "max-rate"
    rows = []
    for entry in document["designs"]:
        s = entry.get("prefix_cache_savings")
        if s is None:
            continue
        cells = [optimum_cell(s[label], max_rate) for label in ("without_cache", "with_cache")]
        hit_rate = (entry["optimum"] or {}).get("prefix_hit_rate")
        if s["with_cache"] is not None and hit_rate is not None:
            cells[-1] += f", {hit_rate:.1%} of prefill tokens cached"
        if max_rate:
            cells.append("-" if "rate_gain" not in s else f"{s['rate_gain']:+.1%} rate")
        else:
            cells.append("-" if "cost_saved" not in s else
                         f"${s['cost_saved_per_hour']:,.0f}/h ({s['cost_saved']:.1%} cost, "
                         f"{s['power_saved']:.1%} power)")
        rows.append((entry["design"], cells))
    return rows


def savings_title(document: dict) -> str:
    routing = document["inputs"]["sim_options"].get("prefix_routing")
    return ("What the prefix cache saved (--prefix-cache "
            f"{'aware' if routing else 'on'} against the same question with it off)")


def optimum_cell(o: dict | None, max_rate: bool) -> str:
    """An optimum in a table cell: its pools and cost, with its rate for max-rate (the goal's
    answer) or its power otherwise; "infeasible" for none."""
    if o is None:
        return "infeasible"
    machines = pools_text(o.get("machines", o.get("prompt_machines")), o.get("token_machines", 0))
    if max_rate:
        return f"{machines} {o['rate_rps']:g} req/s ${o['cost_per_hour']:,.0f}/h"
    return f"{machines} ${o['cost_per_hour']:,.0f}/h {o['power_kw']:,.1f} kW"


def optimum_rate(o: dict) -> float | None:
    """The requests per second an optimum serves: its rate, or the throughput a closed loop's
    users achieved on it (None: a trace replayed at its own rate)."""
    if o.get("rate_rps") is not None:
        return o["rate_rps"]
    return (o.get("closed_loop") or {}).get("throughput_rps")


def closed_loop_text(loop: dict) -> str:
    """A closed loop as reports say it: "16 users, mean think time 2 s"."""
    return f"{loop['users']:,} users, mean think time {loop['think_time_s']:g} s"


def pools_text(prompt: int, token: int) -> str:
    """A cluster's pools in a table cell: "15P+3T", or "38" for a colocated pool."""
    return f"{prompt}" if not token else f"{prompt}P+{token}T"


def spares_k(document: dict):
    """The k of N+k sizing: as asked, or the one --survive-failures auto chose."""
    chosen = document["summary"].get("survive_failures_auto")
    return document["inputs"]["options"]["survive_failures"] if chosen is None else chosen["k"]


def resilience_title(document: dict) -> str:
    k = spares_k(document)
    target = document["inputs"]["sim_options"].get("replica_target", "host")
    return (f"Price of resilience (N+{k}: any {k} machine(s) failing; replicas in "
            f"{target} memory)")


def sensitivity_cells(document: dict) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The sensitivity table as text: (design names, [(assumption, one cell per design)]);
    a cell is the optimum's pools and cost, with its change against the run as it is."""
    rows = document.get("sensitivity") or []
    names = list(rows[0]["designs"]) if rows else []
    changed = "rate_change" if document["inputs"]["goal"]["name"] == "max-rate" else "cost_change"
    table = []
    for row in rows:
        cells = []
        for name in names:
            o = row["designs"].get(name, {})
            if not o.get("feasible"):
                cells.append("infeasible")
                continue
            size = pools_text(o["prompt_machines"], o["token_machines"])
            change = o.get(changed)
            cells.append(f"{size} ${o['cost_per_hour']:,.0f}/h"
                         + ("" if change is None or row is rows[0] else f" ({change:+.0%})"))
        table.append((row["assumption"], cells))
    return names, table


def layout_label(record: dict | None) -> str | None:
    """'TP2' for one pool, 'TP2 / TP8' for a prompt and a token pool (terminal, `check`)."""
    if not record:
        return None
    return " / ".join(_pool_layout_label(entry) for entry in record.values())


def _pool_layout_label(entry: dict) -> str:
    """TP4 x2 (two instances per machine), TP8xPP2; an expert-parallel pool by its label and
    the machines one group spans: DP8/EP8, DP32/EP32 on 4."""
    if "label" in entry:
        span = entry.get("machines_per_group", 1)
        return entry["label"] + (f" on {span}" if span > 1 else "")
    return (f"TP{entry['tp']}" + (f"xPP{entry['pp']}" if entry["pp"] > 1 else "")
            + (f" x{entry['instances_per_machine']}" if entry["instances_per_machine"] > 1
               else ""))


def answer_sentence(document: dict) -> str:
    """The answer in one sentence: the best design, its machines per pool with their SKUs and
    layouts, cost, power, and the SLO that binds it (report.html's first line, the reprs). A
    load curve's answer is its plan: that first (`plan_sentence`), then the static cluster."""
    plan = plan_sentence(document)
    static = _static_sentence(document)
    if plan is None:
        return static
    if document["summary"]["best_design"] is None:
        return f"{plan} {static}"
    return f"{plan} Static cluster, sized for the busiest window: {static[len('Best: '):]}"


def plan_sentence(document: dict) -> str | None:
    """--load-curve: the plan (the cheapest of the designs' plans; min-power: the least
    energy), what it saves against its static cluster, and whether it held over the whole
    curve in its one-run check. None for a search without a load curve."""
    curve = document.get("load_curve")
    if curve is None:
        return None
    key = "energy_kwh" if document["inputs"]["goal"]["name"] == "min-power" else "cost_usd"
    best = document["summary"]["best_design"]
    plans = [(entry[key]["plan"], name != best, name) for name, entry in curve["designs"].items()
             if entry["feasible"]]
    if not plans:
        reasons = "; ".join(f"{name}: {entry['reason']}" for name, entry
                            in curve["designs"].items())
        return f"No plan: {reasons}."
    name = min(plans)[2]
    entry = curve["designs"][name]
    spans = curve["windows"]
    hours = (spans[-1]["end_s"] - spans[0]["start_s"]) / 3600.0
    cost, energy = entry["cost_usd"], entry["energy_kwh"]
    changes = sum(1 for a, b in zip(entry["plan"], entry["plan"][1:]) if a != b)
    sentence = (f"Plan: {name} resized over the curve's {len(spans)} windows ({changes} "
                f"change{'' if changes == 1 else 's'}, plan.csv), ${cost['plan']:,.0f} over "
                f"{hours:,.4g} h against ${cost['static']:,.0f} for its static "
                f"{pools_text(*entry['static'])}: {entry['saves']:.0%} less"
                + (f" ({energy['plan']:,.0f} vs {energy['static']:,.0f} kWh)"
                   if key == "energy_kwh" else "")
                + "; " + _held(entry.get("whole_curve"), len(spans)) + ".")
    return sentence


def _held(checked: dict | None, windows: int) -> str:
    """Whether the plan held in its whole-curve run."""
    run = (checked or {}).get("plan")
    if run is None:
        return "not run over the whole curve"
    if not run["feasible"]:
        return f"it did not hold over the whole curve: {run['reason']}"
    whole = run["whole_curve"]
    held = run["windows_met"] == windows and whole["passed"]
    stepped = checked.get("stepped_up_windows") or []
    after = (f" after stepping up window{'' if len(stepped) == 1 else 's'} "
             + ", ".join(map(str, stepped)) if stepped else "")
    if held:
        return (f"it held over the whole curve{after} (every window met every SLO in one run "
                f"of {run['requests']:,} requests)")
    miss = run["first_miss"]
    return (f"it did not hold over the whole curve{after}: {run['windows_met']} of {windows} "
            "windows met every SLO"
            + (f", first miss window {miss['window']}: {miss['reason']}" if miss else "")
            + ("" if whole["passed"] else f"; over the whole curve: {whole['reason']}"))


def _static_sentence(document: dict) -> str:
    best = document["summary"]["best_design"]
    if best is None:
        return "No design meets every SLO within the constraints (see each design's reason)."
    entry = next(e for e in document["designs"] if e["design"] == best)
    o = entry["optimum"]
    layout = o.get("layout") or {}

    def pool(count, role, sku, key):
        shape = layout.get(key)
        how = "" if not shape else f" ({layout_label({key: shape})})"
        return f"{count} {role}{sku}{how}"

    if "machines" in o:
        pools = pool(o["machines"], "", entry["prompt_sku"], "pool")
    else:
        pools = (pool(o["prompt_machines"], "prompt ", entry["prompt_sku"], "prompt") + " + "
                 + pool(o["token_machines"], "token ", entry["token_sku"], "token"))
    rate = "" if o["rate_rps"] is None else f" at {o['rate_rps']:g} req/s"
    if o.get("closed_loop") and o["closed_loop"].get("throughput_rps") is not None:
        rate = (f" holding {closed_loop_text(o['closed_loop'])} "
                f"({o['closed_loop']['throughput_rps']:.4g} req/s achieved)")
    binding = ""
    if o.get("binding_slo"):
        binding = (f"; binding SLO {o['binding_slo'].replace('_', ' ').upper()}, margin "
                   f"{o['binding_margin']:+.1%}")
    hardware = document["summary"].get("hardware")
    margin = ""
    if hardware is not None and hardware["comparison"]:   # --hardware: against the catalog's
        margin = f" {hardware['comparison'][0].upper()}{hardware['comparison'][1:]}."
    return (f"Best: {best}, {pools}{rate}: ${o['cost_per_hour']:,.2f}/h, "
            f"{o['power_kw']:,.1f} kW, {o['gpus']} GPUs{binding}.{margin}")


def pools_words(entry: dict) -> str:
    """A report.json optimum's pools with their SKUs, as `Design.pools_text(..., "skus")` says
    them (the --hardware answer's form): "12 x dgx-h100", "3 dgx-h100 prompt + 9 dgx-a100
    token"."""
    o = entry["optimum"]
    if "machines" in o:
        return f"{o['machines']} x {entry['prompt_sku']}"
    return (f"{o['prompt_machines']} {entry['prompt_sku']} prompt + {o['token_machines']} "
            f"{entry['token_sku']} token")


def best_line(document: dict) -> str | None:
    """The answer in one line: "Best: DESIGN POOLS at $X/h ($Y per M tokens blended)" (max-rate:
    and the rate it serves); None when no design is feasible."""
    best = document["summary"]["best_design"]
    if best is None:
        return None
    entry = next(e for e in document["designs"] if e["design"] == best)
    o = entry["optimum"]
    blended = (o.get("unit_costs") or {}).get("usd_per_m_tokens_blended")
    per_token = "" if blended is None else f" ({money_text(blended)} per M tokens blended)"
    rate = ("" if document["inputs"]["goal"]["name"] != "max-rate" or o["rate_rps"] is None
            else f", serving {o['rate_rps']:g} req/s")
    return f"Best: {best} {pools_words(entry)} at ${o['cost_per_hour']:,.2f}/h{per_token}{rate}"


def no_optimum_text(entry: dict) -> str:
    """A report.json design without an optimum, as a table cell: "infeasible: why", or for a
    design a --hardware search pruned (it cannot beat the answer; whether it is feasible was
    never settled) its reason, "pruned: bound $X/h above the answer ..."."""
    reason = entry["reason"]
    if entry.get("status") != "pruned":
        return f"infeasible: {reason}"
    return reason if reason.startswith("pruned") else f"pruned: {reason}"
