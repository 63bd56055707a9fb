"""What provision shows on the terminal: rich tables and progress (no files, no computation)."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Iterator, Sequence

from rich.console import Console
from rich.markup import escape
from rich import box
from rich.table import Table

from provisioner.study import window_text
from provisioner.tables import (answer_sentence, best_line, closed_loop_text, layout_label,
                                no_optimum_text, optimum_rate)
from provisioner.unitcosts import unit_cost_lines
from provisioner.tables import (RESILIENCE_COLUMNS, SAVINGS_COLUMNS, resilience_rows,
                                resilience_title, savings_rows, savings_title,
                                pools_text, sensitivity_cells, spares_k)


# ------------------------------------------------------------------------------- first run
COMPILE_NOTICE_S = 1.5   # a warm simulation takes milliseconds: longer means numba is compiling


@contextmanager
def compile_notice(enabled: bool = True) -> Iterator[None]:
    """Say what is happening when the first simulation is slow: without the install-time
    build of the simulator core (simcore/aot.py), numba compiles it (~25 s, cached on disk for
    every later run)."""
    if not enabled:
        yield
        return
    status = None
    lock = threading.Lock()

    def show():
        nonlocal status
        with lock:
            if status is None:
                status = Console(stderr=True).status(
                    "compiling the simulator core with numba (it was not compiled at install, "
                    "or its sources changed; cached for later runs)...")
                status.start()

    timer = threading.Timer(COMPILE_NOTICE_S, show)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with lock:
            if status is not None:
                status.stop()
            status = False


# ------------------------------------------------------------------------------------ search
ETA_AFTER_S = 3.0   # the time-left line appears after this long: shorter runs look as before


def eta_seconds(elapsed: float, fraction: float) -> float | None:
    """Seconds left when `fraction` of the work took `elapsed` seconds; None before
    ETA_AFTER_S, or with nothing (or everything) done to go by."""
    if elapsed < ETA_AFTER_S or not 0.0 < fraction < 1.0:
        return None
    return elapsed * (1.0 - fraction) / fraction


def _time_left_column():
    from rich.progress import ProgressColumn
    from rich.text import Text

    class TimeLeft(ProgressColumn):
        """The ETA, counting down between updates; blank while unknown."""

        def render(self, task) -> Text:
            until = task.fields.get("until")
            if until is None or task.finished:
                return Text("")
            left = timedelta(seconds=round(max(0.0, until - task.get_time())))
            return Text(f"about {left} left", style="progress.remaining")
    return TimeLeft()


@dataclass
class SearchProgress:
    """Rich progress on stderr: one spinner per design with its evaluation count (over all of
    the run's searches: --sensitivity's, --load-curve's and --survive-failures' too), and from
    ETA_AFTER_S on, once some work is done, a last line with the time left.

    The work done is the share of the `searches` (api.planned_searches) behind us: a finished
    search counts whole, the running one by its designs, a finished design whole and another
    by its evaluations against its count in the run's first search (none in the first)."""
    designs: Sequence[str]
    enabled: bool = True
    searches: int = 1
    console: Console | None = None   # default: stderr
    clock: Callable[[], float] | None = None   # default: rich's (tests give their own)

    def __enter__(self) -> "SearchProgress":
        self._progress = None
        if self.enabled:
            # imported here: `simulate` and `catalog` never show progress (10 ms of start-up)
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                      TextColumn("{task.completed:>4.0f} evaluations"),
                                      TimeElapsedColumn(), _time_left_column(),
                                      console=self.console or Console(stderr=True),
                                      transient=False, get_time=self.clock)
            self._progress.__enter__()
            self._tasks = {name: self._progress.add_task(name, total=None)
                           for name in self.designs}
            whole = "all" if self.searches == 1 else f"all {self.searches} searches"
            self._overall = self._progress.add_task(whole, total=None, visible=False,
                                                    until=None)
            self._started = self._progress.get_time()
        self._counts = {name: 0 for name in self.designs}
        self._before: dict[str, int] = {}      # counts of the searches finished
        self._first: dict[str, int] | None = None   # each design's count in the first search
        self._search, self._last, self._done, self._shown = None, {}, 0, False
        return self

    def update(self, asked: dict[str, int]) -> None:
        if self._progress is None:
            return
        search = getattr(asked, "search", None)   # study.Asked: one object per search
        if search is not self._search:
            if self._last:
                for name, count in self._last.items():
                    self._before[name] = self._before.get(name, 0) + count
                self._first = self._last if self._first is None else self._first
                self._done += 1
            self._search = search
        self._last = dict(asked)
        for name, count in asked.items():   # one design's step changes one count
            count += self._before.get(name, 0)
            if name in self._counts and count != self._counts[name]:
                self._counts[name] = count
                self._progress.update(self._tasks[name], completed=count)
        self._show_time_left(getattr(asked, "finished", frozenset()))

    def fraction(self, finished: frozenset[str]) -> float:
        """The share of the run's work done (see the class docstring)."""
        first = self._first or {}
        parts = [1.0 if name in finished else
                 min(1.0, count / first[name]) if first.get(name) else 0.0
                 for name, count in self._last.items()]
        running = sum(parts) / len(parts) if parts else 0.0
        return min(1.0, (self._done + running) / max(1, self.searches))

    def _show_time_left(self, finished: frozenset[str]) -> None:
        now = self._progress.get_time()
        left = eta_seconds(now - self._started, self.fraction(finished))
        self._shown = self._shown or left is not None   # once shown, kept (blank when done)
        self._progress.update(self._overall, completed=sum(self._counts.values()),
                              visible=self._shown, until=None if left is None else now + left)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            for name, task in self._tasks.items():  # a known total stops the spinner
                self._progress.update(task, total=max(1, self._counts[name]))
            self._progress.update(self._overall, total=max(1, sum(self._counts.values())),
                                  completed=sum(self._counts.values()), until=None)
            self._progress.__exit__(*exc)


NARROW = 100   # below this many columns the table drops columns (`_narrow_table`), or gives
#                each design a block when even those do not fit (`_block_table`)


def optimum_table(document: dict, width: int | None = None) -> Table:
    """The optimum per design: a row each (below NARROW columns, fewer columns), or a block
    each where even those do not fit the width."""
    if width is not None and width < NARROW:
        table = _narrow_table(document)
        return table if _natural_width(table) <= width else _block_table(document)
    goal = document["inputs"]["goal"]
    seeds = document["inputs"]["options"]["verify_seeds"]
    table = Table(title=f"Optimum per design — {goal['name']} ({goal['paper_name']}); "
                        "* best", caption="P prompt / T token machines (baselines: P machines); "
                        "under each design its layout: TP (xPP machines per instance) and "
                        "instances per machine (prompt / token); "
                        f"{_expert_parallel_legend(document)}"
                        f"verified on {seeds} workload sample(s); binding SLO: the smallest "
                        "margin 1 - value/limit over the samples; headroom: highest rate the "
                        "optimum sustains on the base sample" + _closed_caption(goal))
    # numbers never shrink below their width (rich would cut "2,587.20" to "2,58…"); the
    # words wrap instead: design names, the binding SLO and headroom break at their spaces
    widths = _number_widths(document)
    table.add_column("design", overflow="fold")
    for column in ("P", "T", "req/s", "$/h", "kW", "GPUs"):
        table.add_column(column, justify="right", no_wrap=True,
                         min_width=max(len(column), widths.get(column, 1)))
    for column in ("binding SLO / margin", "headroom"):
        table.add_column(column, justify="right", overflow="fold")
    k = spares_k(document)
    if k:  # --survive-failures: the price of resilience (cost against no failures)
        what = "rate" if goal["name"] == "max-rate" else "cost"
        table.add_column(f"N+{k} {what}", justify="right")
        table.caption += (f"; N+{k} {what}: the failure-aware optimum's {what} against the "
                          "plain one, restart / replicate")
    best = document["summary"]["best_design"]
    for entry in document["designs"]:
        name = f"[bold]{entry['design']}[/] *" if entry["design"] == best else entry["design"]
        if entry.get("uncalibrated_skus"):
            name += " [yellow]![/]"
        o = entry["optimum"]
        if o is not None and o.get("layout"):
            name += f"\n[dim]{layout_label(o['layout'])}[/]"
        price = [_price(entry)] if k else []
        if o is None:
            table.add_row(name, "-", "-", "-", "-", "-", "-", "-", _no_optimum(entry), *price)
            continue
        table.add_row(name, *_figures(o).values(), _binding(o), _headroom(o), *price)
    return table


def _narrow_table(document: dict) -> Table:
    """Below NARROW columns: still a row per design, with the fewest columns that answer (the
    rate in the title when every design has the same, the layout under the design's name) and
    no vertical rules, so that 80 columns hold it without a word broken."""
    goal = document["inputs"]["goal"]
    optima = [e["optimum"] for e in document["designs"] if e["optimum"] is not None]
    rates = {_fmt(optimum_rate(o), ".4g") for o in optima}
    title = f"Optimum per design — {goal['name']}"
    if len(rates) == 1:
        title += f", {next(iter(rates))} req/s"
    table = Table(title=title + "; * best", box=box.SIMPLE_HEAD, pad_edge=False,
                  caption="P prompt / T token machines; layout: TP (xPP) and instances per "
                          "machine (prompt / token); binding: the SLO with the smallest margin")
    table.add_column("design", overflow="fold")
    table.add_column("machines", justify="right", no_wrap=True)
    columns = ([] if len(rates) == 1 else ["req/s"]) + ["$/h", "kW", "GPUs"]
    for column in columns:
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("binding", justify="right", overflow="fold")
    best = document["summary"]["best_design"]
    for entry in document["designs"]:
        name = f"[bold]{entry['design']}[/] *" if entry["design"] == best else entry["design"]
        o = entry["optimum"]
        if o is None:
            table.add_row(name, "-", *["-"] * len(columns), _no_optimum(entry))
            continue
        if o.get("layout"):
            name += f"\n[dim]{layout_label(o['layout'])}[/]"
        pools = (f"{o['machines']}" if "machines" in o
                 else f"{o['prompt_machines']} P + {o['token_machines']} T")
        cell = _figures(o)
        table.add_row(name, pools, *(cell[c] for c in columns), _binding(o))
    return table


def _natural_width(table: Table) -> int:
    """The columns a table takes when nothing in it wraps."""
    from rich.measure import Measurement
    console = Console(width=10_000)
    return Measurement.get(console, console.options, table).maximum


def _block_table(document: dict) -> Table:
    """Where `_narrow_table` does not fit: a block per design (the label and the figures, which wrap only
    between figures)."""
    goal = document["inputs"]["goal"]
    table = Table(title=f"Optimum per design — {goal['name']}; * best", show_header=False,
                  caption="P prompt / T token machines; layout: TP (xPP) and instances per "
                          "machine (prompt / token)")
    table.add_column("design", overflow="fold")
    table.add_column("answer", overflow="fold")
    best = document["summary"]["best_design"]
    for entry in document["designs"]:
        name = f"[bold]{entry['design']}[/] *" if entry["design"] == best else entry["design"]
        o = entry["optimum"]
        if o is None:
            table.add_row(name, _no_optimum(entry))
            continue
        pools = (f"{o['machines']} machines" if "machines" in o
                 else f"{o['prompt_machines']} P + {o['token_machines']} T")
        cell = _figures(o)
        figures = [pools, f"{cell['req/s']} req/s", f"${cell['$/h']}/h", f"{cell['kW']} kW",
                   f"{cell['GPUs']} GPUs", f"binding {_binding(o)}", f"headroom {_headroom(o)}"]
        if o.get("layout"):
            figures.insert(1, f"layout {layout_label(o['layout'])}")
        table.add_row(name, "\n".join(figures))
    return table



def _closed_caption(goal: dict) -> str:
    """A closed loop's req/s column: what its users achieved (no rate was asked)."""
    loop = goal.get("closed_loop")
    if loop is None:
        return ""
    return (f"; req/s: the throughput {closed_loop_text(loop)} achieved on the base sample "
            "(a closed loop: no rate asked, no headroom)")


def _no_optimum(entry: dict) -> str:
    """A design without an optimum: infeasible (red) or, --hardware, pruned (dim)."""
    text = escape(no_optimum_text(entry))
    kind, _, why = text.partition(":")
    return f"[dim]{kind}[/]:{why}" if entry.get("status") == "pruned" else f"[red]{kind}[/]:{why}"


def _figures(o: dict) -> dict[str, str]:
    """The numeric cells of an optimum, by column of `optimum_table`."""
    return {"P": str(o.get("machines", o.get("prompt_machines"))),
            "T": "-" if "machines" in o else str(o["token_machines"]),
            "req/s": _fmt(optimum_rate(o), ".4g"), "$/h": _fmt(o["cost_per_hour"], ",.2f"),
            "kW": _fmt(o["power_kw"], ",.1f"), "GPUs": str(o["gpus"])}


def _number_widths(document: dict) -> dict[str, int]:
    """The widest figure of each numeric column of `optimum_table`."""
    widths: dict[str, int] = {}
    for entry in document["designs"]:
        if entry["optimum"] is not None:
            for column, text in _figures(entry["optimum"]).items():
                widths[column] = max(widths.get(column, 0), len(text))
    return widths


def _price(entry: dict) -> str:
    """The failure-aware optimum's cost (max-rate: rate) against the plain one, restart /
    replicate."""
    resilience = entry.get("resilience") or {}
    cells = []
    for policy in ("restart", "replicate"):
        o = resilience.get(policy)
        ratio = o.get("rate_ratio", o.get("cost_ratio")) if o else None
        cells.append("-" if ratio is None else f"{ratio - 1:+.0%}")
    return " / ".join(cells)


def comparison_lines(document: dict) -> list[str]:
    """Disaggregated vs chunked colocated: the best of each kind side by side, and the verdict."""
    view = document["summary"].get("disaggregated_vs_chunked")
    if view is None:
        return []
    searched = " searched" if view.get("pruned") else ""   # --hardware prunes designs
    lines = [f"[bold]Disaggregated vs chunked colocated[/] (best of each{searched} for "
             f"{view['goal']}; same workload and SLOs):"]
    for kind in ("disaggregated", "chunked"):
        side = view[kind]
        if side is None:
            lines.append(f"  {kind:<13} none feasible")
            continue
        counts = (f"{side['machines']} machines, chunk {side['chunk_tokens']}" if "machines" in side
                  else f"{side['prompt_machines']} prompt + {side['token_machines']} token")
        headroom = (f", headroom {side['headroom_rps']:.4g} req/s"
                    if side.get("headroom_rps") is not None else "")
        lines.append(f"  {kind:<13} {side['design']} ({counts}): ${side['cost_per_hour']:,.2f}/h, "
                     f"{side['power_kw']:,.1f} kW, {side['gpus']} GPUs{headroom}")
    lines.append(f"  {view['sentence']}")
    return lines


HARDWARE_SHOWN = 8   # a hardware search's table: the best few designs, then a count


def hardware_view(document: dict) -> dict:
    """The document as the terminal shows a hardware search: its best HARDWARE_SHOWN feasible
    designs (and the best catalog design, if not among them), best first."""
    hardware = document["summary"].get("hardware")
    if hardware is None:
        return document
    key = {"min-cost": lambda o: (o["cost_per_hour"], o["power_kw"]),
           "min-power": lambda o: (o["power_kw"], o["cost_per_hour"]),
           "max-rate": lambda o: (-o["rate_rps"], o["cost_per_hour"])}[
        document["inputs"]["goal"]["name"]]
    feasible = sorted((d for d in document["designs"] if d["status"] == "feasible"),
                      key=lambda d: key(d["optimum"]))
    shown = feasible[:HARDWARE_SHOWN]
    shown += [d for d in feasible[HARDWARE_SHOWN:]
              if d["design"] == hardware["best_catalog_design"]]
    return {**document, "designs": shown}


def hardware_lines(document: dict) -> list[str]:
    """The answer of a hardware search and a count of the designs the table leaves out."""
    hardware = document["summary"].get("hardware")
    if hardware is None:
        return []
    shown = len(hardware_view(document)["designs"])
    early = hardware["pruned_before_simulation"]
    how = (f" ({early} by their capacity bound before any simulation, "
           f"{hardware['pruned'] - early} when no pools that could beat the best met the "
           "SLOs)" if hardware["pruned"] else "")
    return [f"[bold]Best over these machines:[/] {hardware['answer']}",
            f"{hardware['designs']} design shapes: {hardware['feasible']} feasible ({shown} "
            f"shown), {hardware['pruned']} pruned{how}, {hardware['infeasible']} "
            "infeasible; every one with its status and reason in "
            "report.json (designs[].status) and its points in evaluations.csv"]


def best_lines(document: dict) -> list[str]:
    """A plain search's last line: the best design, its pools, $/h and $ per million tokens
    blended (`provisioner.tables.best_line`; --hardware prints its own answer)."""
    if document["summary"].get("hardware") is not None:
        return []
    line = best_line(document)
    return [] if line is None else [f"[bold]{escape(line)}[/]"]


def headline_lines(document: dict) -> list[str]:
    """The line above the table: a load curve's answer (the plan, what it saves and whether
    it held over the whole curve, then the static cluster the table shows per design)."""
    if document.get("load_curve") is None:
        return []
    return [f"[bold]{escape(answer_sentence(document))}[/]"]


def load_curve_lines(document: dict) -> list[str]:
    """--load-curve: per design its static cluster, its plan's cost and what it saves, then
    the best design's plan window by window (equal windows merged)."""
    curve = document.get("load_curve")
    if curve is None:
        return []
    spans = curve["windows"]
    hours = (spans[-1]["end_s"] - spans[0]["start_s"]) / 3600.0
    peaks = [w["peak_rps"] for w in spans]
    lines = [f"[bold]Load curve[/]: {len(spans)} windows over {hours:g} h, "
             f"{min(peaks):.4g}-{max(peaks):.4g} req/s; the static cluster is sized for the "
             f"busiest window, the plan window by window (scale-up "
             f"{curve['rules']['scale_up_s'] / 60:g} min, at least "
             f"{curve['rules']['min_machines']} machine(s) a pool, no flapping)"]
    for name, entry in curve["designs"].items():
        if not entry["feasible"]:
            lines.append(f"  {name}: no plan: {entry['reason']}")
            continue
        cost, hours_used = entry["cost_usd"], entry["machine_hours"]
        lines.append(f"  {name}: static {pools_text(*entry['static'])} "
                     f"${cost['static']:,.0f}; plan ${cost['plan']:,.0f} "
                     f"({entry['saves']:.0%} less; "
                     f"${cost['plan_without_delay']:,.0f} with no provisioning delay); "
                     f"{hours_used['plan']:,.0f} vs {hours_used['static']:,.0f} machine-hours, "
                     f"{entry['energy_kwh']['plan']:,.0f} vs "
                     f"{entry['energy_kwh']['static']:,.0f} kWh")
        lines += whole_curve_lines(entry.get("whole_curve"), len(spans))
    best = document["summary"]["best_design"]
    entry = curve["designs"].get(best) or {}
    if entry.get("feasible"):
        runs = []
        for window, pools in zip(spans, entry["plan"]):
            if runs and runs[-1][2] == pools:
                runs[-1][1] = window["end_s"]
            else:
                runs.append([window["start_s"], window["end_s"], pools])
        lines.append(f"  plan for {best} (plan.csv): " + ", ".join(
            f"{_clock(a)}-{_clock(b)} {pools_text(*p)}" for a, b, p in runs))
    return lines


def whole_curve_lines(checked: dict | None, windows: int) -> list[str]:
    """The static cluster and the plan, each run over the whole curve in one simulation."""
    if checked is None:
        return []
    lines = []
    names = {"static": ("static (its mixed pool absorbing bursts, the paper's answer)"
                        if checked.get("static_mixed_pool") else "static"), "plan": "plan"}
    for label in ("static", "plan"):
        run = checked[label]
        label = names[label]
        if not run["feasible"]:
            lines.append(f"    whole curve, {label}: infeasible: {run['reason']}")
            continue
        failures = run["failures"]
        whole = run["whole_curve"]
        miss = run["first_miss"]
        lines.append(
            f"    whole curve, {label}: {run['windows_met']} of {windows} windows met every SLO "
            f"({run['requests']:,} requests in one run; {failures['machine_failures']} machine "
            f"failure(s) drawn at MTBF {failures['mtbf_hours']:,.0f} h"
            + (f", {failures['requests_affected']:,} requests affected" if
               failures["machine_failures"] else "") + "); over the whole curve "
            + ("met" if whole["passed"] else f"missed: {whole['reason']}")
            + ("" if miss is None else f"; first miss: window {miss['window']}: "
               f"{miss['reason']}") + _curve_prefix_text(run))
    if checked["stepped_up_windows"]:
        lines.append("    plan stepped up where a window missed: windows "
                     + ", ".join(map(str, checked["stepped_up_windows"])))
    return lines


def _clock(seconds: float) -> str:
    """h:mm from the curve's start (days past the first as +Nd)."""
    minutes = int(round(seconds / 60.0))
    days, minutes = divmod(minutes, 24 * 60)
    return f"{'+%dd ' % days if days else ''}{minutes // 60:d}:{minutes % 60:02d}"


SENSITIVITY_TITLE = ("What moves the answer (each optimum re-derived with one assumption "
                     "changed; verified on 3 samples)")


def sensitivity_table(document: dict, width: int | None = None) -> Table | None:
    """What moves the answer: per assumption, each design's optimum and its cost change. A
    column per design when they fit `width`; else a block per assumption with a row per
    design, wrapping only between words, so no number is ever cut."""
    names, rows = sensitivity_cells(document)
    if not rows:
        return None
    label_width = max(len(label) for label, _ in rows)
    widths = [max(len(name), *(len(cells[i]) for _, cells in rows))
              for i, name in enumerate(names)]
    if width is None or label_width + sum(widths) + 3 * len(names) + 4 <= width:
        table = Table(title=SENSITIVITY_TITLE)
        table.add_column("assumption", no_wrap=True)
        for name in names:
            table.add_column(name, justify="right", no_wrap=True)
        for label, cells in rows:
            table.add_row(label, *cells)
        return table
    return _sensitivity_blocks(names, rows)


def _sensitivity_blocks(names: list[str], rows: list[tuple[str, list[str]]]) -> Table:
    table = Table(title=SENSITIVITY_TITLE, show_header=False)
    longest = max([len(name) + 2 for name in names]
                  + [len(word) for label, _ in rows for word in label.split()])
    table.add_column("design", min_width=longest)
    table.add_column("optimum", min_width=max(len(word) for _, cells in rows
                                              for cell in cells for word in cell.split()))
    for label, cells in rows:
        table.add_row(f"[bold]{label}[/]", "", end_section=False)
        for name, cell in zip(names, cells):
            table.add_row(f"  {name}", cell, end_section=name == names[-1])
    return table


def asked_input_lines(inputs: dict) -> list[str]:
    """The workload when --isl/--osl or a result file made it, and the SLO limits when some
    were given in ms (--ttft-p99-ms ...): nothing for a question without them."""
    lines = []
    workload, options = inputs.get("workload", {}), inputs.get("options", {})
    rate = inputs.get("goal", {}).get("rate_rps")
    at = f"at {rate:g} req/s" if rate is not None else "at the searched rate"
    loop = inputs.get("goal", {}).get("closed_loop")
    if loop is not None:
        at = f"sent by {loop['users']:,} users in a closed loop"
        bound = ("no rate: the pools grow from one machine" if loop["bound_rps"] is None else
                 f"{loop['bound_rps']:g} req/s, proven below what any cluster meeting the "
                 "SLOs processes")
        lines.append(f"Load: a closed loop of {closed_loop_text(loop)}, "
                     f"{loop['requests']:,} requests a sample; the capacity bounds size for "
                     f"{bound} (docs/closed-loop.md)")
    if workload.get("prefix_model"):
        lines.append(f"Workload: sessions {workload['prefix_model']} over the sizes of "
                     f"{workload.get('name')}, {at} (requests; sessions start as a Poisson "
                     f"process, turns cut at {workload.get('context_tokens'):,} tokens; each "
                     "sample draws its own sessions)")
    elif workload.get("kind") == "lengths":
        lines.append(f"Workload: prompt lengths {options.get('isl')}, output lengths "
                     f"{options.get('osl')} tokens (--isl/--osl, drawn independently), Poisson "
                     f"arrivals {at}")
    elif workload.get("kind") == "bench" and rate is None:
        lines.append(f"Workload: the successful requests of {workload.get('name')} (a "
                     f"serving-benchmark result) at their recorded send times (no --rate: "
                     f"replayed; other samples redraw their lengths)")
    elif workload.get("kind") == "bench":
        lines.append(f"Workload: the per-request prompt and output lengths of "
                     f"{workload.get('name')} (a serving-benchmark result), resampled under "
                     f"Poisson arrivals {at}")
    elif workload.get("kind") == "mooncake":
        lines.append(f"Workload: the requests of {workload.get('name')} (a Mooncake trace) with "
                     "their prompt blocks, " + (
                         "replayed (no --rate; other samples shift it cyclically in time)"
                         if rate is None and inputs.get("goal", {}).get("name") != "max-rate"
                         else f"its timeline scaled to {at[3:]}, a --duration window of it "
                         "(from the start; other samples from other offsets)"))
    if workload.get("prefix_reuse_bound"):
        from provisioner.mooncake import reuse_line
        lines.append(reuse_line(workload["prefix_reuse_bound"]))
    profile = inputs.get("slo_profile", {})
    if any(value is not None for key, value in options.items() if key.endswith("_ms")
           and key.split("_")[0] in ("ttft", "tpot", "e2e", "itl")):
        in_ms = set(profile.get("ms_metrics", ())) | {"itl"}
        slowdown = profile.get("kind") == "slowdown"
        limits = [f"{metric.upper()} {pct.upper()} {value:g}"
                  + (" ms" if not slowdown or metric in in_ms else "x")
                  for metric, per in profile.get("limits", {}).items()
                  for pct, value in per.items()]
        lines.append(f"SLOs: {profile.get('name')}: {', '.join(limits)}")
    return lines


def search_notes(document: dict) -> list[str]:
    """Lines under the table: KV capacity per machine, then a warning per uncalibrated design."""
    kv = document["inputs"].get("kv_capacity_tokens", {})
    reserve = document["inputs"]["sim_options"]["memory_reserve_fraction"]
    lines = []
    source = next((a["value"] for a in document.get("assumptions", [])
                   if a["name"] == "latency_source"), None)
    if source is not None:
        lines.append(f"Latencies: {source}")
    lines += asked_input_lines(document["inputs"])
    window = window_text(document["inputs"].get("window"),
                         document["inputs"]["options"].get("duration"))
    if window:
        lines.append(f"Window: {window}")
    if kv:
        lines.append(f"KV capacity per machine ({reserve:.0%} HBM reserve): "
                     + ", ".join(f"{sku} {tokens:,} tokens" for sku, tokens in kv.items()))
    lines += mixed_pool_lines(document)
    lines += latency_lines(document) + unit_cost_lines(document) + layout_lines(document)
    lines += bound_lines(document)
    lines += comparison_lines(document)
    lines += _table_lines(document, resilience_title, RESILIENCE_COLUMNS,
                          resilience_rows(document))
    lines += _table_lines(document, savings_title, SAVINGS_COLUMNS, savings_rows(document))
    spares = document["summary"].get("survive_failures_auto")
    if spares is not None:
        lines.append(f"Spares (--survive-failures auto): k = {spares['k']}: MTBF "
                     f"{spares['mtbf_hours']:,.0f} h ({spares['mtbf_source']}), repair "
                     f"{spares['repair_hours']:g} h, a machine down {spares['down_fraction']:.2g}"
                     f" of the time; in the largest pool ({spares['largest_pool']} machines) "
                     f"more than {spares['k']} down at once has probability "
                     f"{spares['p_more_than_k_down']:.2g} < {spares['target']:g}")
    lines += [f"[yellow]! {w}[/]" for w in document.get("warnings", [])]
    return lines


def mixed_pool_lines(document: dict) -> list[str]:
    """Whether the disaggregated designs ran with the mixed pool (--mixed-pool / --no-mixed-pool,
    else each design's own setting); nothing when no design has separate pools."""
    split = [d for d in document["inputs"].get("designs", []) if d.get("token_sku")]
    if not split:
        return []
    asked = document["inputs"]["options"].get("mixed_pool")
    if asked is not None:
        return [f"Mixed pool: {'on' if asked else 'off'} "
                + ("(--mixed-pool): prompt machines decode and token machines prefill when "
                   "their own pool is loaded" if asked else
                   "(--no-mixed-pool): pure prefill and decode pools, as Dynamo and llm-d run "
                   "them")]
    on = [d["name"] for d in split if d.get("mixed_pool")]
    off = [d["name"] for d in split if not d.get("mixed_pool")]
    if not off or not on:
        which = f"{'on' if on else 'off'} for {'every' if len(split) > 1 else 'the'} " \
                "disaggregated design"
    else:
        which = f"on for {', '.join(on)}; off for {', '.join(off)}"
    return [f"Mixed pool: each design's own ({which}; --no-mixed-pool runs pure prefill and "
            "decode pools)"]


def latency_lines(document: dict) -> list[str]:
    """Each optimum's latencies in milliseconds on the base sample (beside the slowdowns the
    SLOs may be stated in): TTFT, TPOT, E2E and ITL P50 / P99."""
    lines = []
    for entry in document["designs"]:
        ms = (entry["optimum"] or {}).get("latency_ms")
        if not ms:
            continue
        cells = []
        for metric in ("ttft", "tpot", "e2e", "itl"):
            if metric not in ms:  # (a report written before ITL was measured)
                continue
            p50, p99 = ms[metric]["p50"], ms[metric]["p99"]
            if p50 is not None:
                cells.append(f"{metric.upper()} {_ms(p50)} / {_ms(p99)}")
        lines.append(f"  {entry['design']}: " + ", ".join(cells))
    return ["Latencies of each optimum, ms P50 / P99 (base sample; TPOT: a request's mean gap "
            "between tokens; ITL: every gap):", *lines] if lines else []


def markdown_table(document: dict) -> str:
    """The optimum per design as a paste-ready Markdown table: few columns, units in the
    header, formatted numbers; the best design in bold, infeasible ones with their reason,
    and the goal and rate in a line above it."""
    inputs, best = document["inputs"], document["summary"].get("best_design")
    header = ["design", "machines", "layout", "GPUs", "$/h", "kW", "rate (req/s)",
              "binding SLO (margin)", "TTFT P99 (ms)", "TPOT P99 (ms)", "$/M tokens"]
    rows = []
    for entry in document["designs"]:
        optimum, name = entry["optimum"], entry["design"]
        if not optimum:
            rows.append([name, "-", "-", "-", "-", "-", "-",
                         _escape(entry.get("reason") or entry.get("status", "")), "-", "-", "-"])
            continue
        name = f"**{name}**" if name == best else name
        latency, units = optimum.get("latency_ms") or {}, optimum.get("unit_costs") or {}
        margin = optimum.get("binding_margin")
        rows.append([
            name, _machines(optimum), _layout_cell(optimum.get("layout") or {}),
            f"{optimum['gpus']:,}", f"{optimum['cost_per_hour']:,.2f}",
            f"{optimum['power_kw']:,.1f}", _fmt(optimum_rate(optimum), ",.4g"),
            f"{optimum.get('binding_slo') or '-'}"
            + (f" ({margin:+.1%})" if margin is not None else ""),
            _ms_cell(latency, "ttft"), _ms_cell(latency, "tpot"),
            f"{units['usd_per_m_tokens_blended']:,.2f}"
            if units.get("usd_per_m_tokens_blended") is not None else "-"])
    goal = inputs["goal"]["name"] if isinstance(inputs.get("goal"), dict) else inputs.get("goal")
    lines = [f"Optimum per design ({goal}; best in bold)", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _machines(optimum: dict) -> str:
    if optimum.get("machines") is not None:
        return f"{optimum['machines']:,}"
    return f"{optimum['prompt_machines']:,} P + {optimum['token_machines']:,} T"


def _layout_cell(layout: dict) -> str:
    """TP/PP/EP of each pool (prompt / token), as the terminal table shows them."""
    def one(pool: dict) -> str:
        text = f"TP{pool.get('tp', 1)}"
        if pool.get("pp", 1) > 1:
            text += f" PP{pool['pp']}"
        if pool.get("ep", 1) > 1:
            text += f" EP{pool['ep']}"
        return text
    pools = [layout[k] for k in ("pool", "prompt", "token") if k in layout]
    return " / ".join(one(p) for p in pools) or "-"


def _ms_cell(latency: dict, metric: str) -> str:
    value = (latency.get(metric) or {}).get("p99")
    return "-" if value is None else _ms(value)


def _escape(text: str) -> str:
    return str(text).replace("|", "\\|")


def _ms(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def bound_lines(document: dict) -> list[str]:
    """One line: each design's capacity bound beside its optimum (min-cost / min-power)."""
    goal = document["inputs"]["goal"]["name"]
    if goal == "max-rate":
        return []
    key, unit = ("power_kw", "kW") if goal == "min-power" else ("cost_per_hour", "$/h")
    cells = []
    for e in document["designs"]:
        bound = (e.get("capacity_bound") or {}).get("value") or 0
        if e["optimum"] and bound > 0:
            cells.append(f"{e['design']} {bound:,.0f} ({e['optimum'][key] / bound:.1f}x)")
    if not cells:
        return []
    return [f"Capacity bound, {unit} (no queueing, no SLO; the optimum is that many times it): "
            + ", ".join(cells)]


def layout_lines(document: dict) -> list[str]:
    """One line per design that tried more than one layout: the one chosen, what the others
    cost, and how many were pruned by their bound, too slow alone or infeasible."""
    lines = []
    for entry in document["designs"]:
        tried = entry.get("layouts", [])
        if len(tried) < 2:
            continue
        parts = [f"chosen {line['layout']}" for line in tried if line["status"] == "chosen"]
        lost = [line for line in tried if line["status"] == "lost"]
        money = "power_kw" if document["inputs"]["goal"]["name"] == "min-power" else \
            "cost_per_hour"
        parts += [f"{line['layout']} lost at " + (f"{line[money]:,.1f} kW" if money == "power_kw"
                                                  else f"${line[money]:,.0f}/h")
                  for line in lost[:3]]
        for status, what in (("pruned", "pruned by their capacity bound"),
                             ("infeasible", "infeasible or unable to beat it"),
                             ("too slow", "too slow even alone")):
            count = sum(line["status"] == status for line in tried)
            if count:
                parts.append(f"{count} {what}")
        lines.append(f"  {entry['design']}: " + "; ".join(parts))
    return ["Layouts tried (report.json: designs[].layouts):", *lines] if lines else []


def _binding(optimum: dict) -> str:
    key = optimum.get("binding_slo")
    if key is None:
        return _fmt(optimum["worst_margin"], "+.1%")
    return f"{key.replace('_', ' ').upper()} {optimum['binding_margin']:+.1%}"


def _headroom(optimum: dict) -> str:
    headroom, rate = optimum.get("headroom_rps"), optimum["rate_rps"]
    if headroom is None or rate is None:
        return "-"
    return f"{headroom:.4g} ({headroom / rate - 1:+.0%})"


def _fmt(value, spec: str) -> str:
    return "trace" if value is None else format(value, spec)


# ----------------------------------------------------------------------------------- catalog
def catalog_tables(cat, profiles) -> list[Table]:
    """Machines, models, SLO profiles and designs; names never wrap, long text columns fold."""
    from simcore.kernels import covers
    machines = _table("Machine SKUs (per machine; * uncalibrated: neither vLLM kernel tables "
                      "nor 2023 profiles, latencies scaled from datasheets)", ("SKU / GPU", "GPUs", "HBM\nGiB", "HBM\nTB/s", "FP16\nTFLOPS",
                                      "kW", "$/h", "KV link\nGb/s"),
                      names=[m.name + " *" for m in cat.machines.values()])
    for m in cat.machines.values():
        measured = m.calibrated or covers(m)   # the default engine's view of the SKU
        name = m.name if measured else f"{m.name} [yellow]*[/]"
        machines.add_row(f"{name}\n[dim]{m.gpu}[/]", str(m.gpus), f"{m.gpus * m.hbm_gib:,.0f}",
                         f"{m.gpus * m.hbm_bandwidth_gbs / 1000:.1f}",
                         f"{m.gpus * m.fp16_tflops:g}", f"{m.power_kw:.2f}",
                         f"{m.cost_per_hour:.2f}", f"{m.gpus * m.kv_link_gbps:g}")
    models = _table("Models", ("model", "layers", "hidden", "heads/\nKV heads", "params B",
                               "weights\nGB", "KV KiB/\ntoken"), names=list(cat.models))
    for m in cat.models.values():
        models.add_row(m.name, str(m.layers), str(m.hidden), f"{m.heads}/{m.kv_heads}",
                       f"{m.params_b:g}" + (f" ({m.active_params_b:g} active)"
                                            if m.active_params_b else ""),
                       f"{m.weight_bytes / 1e9:.0f}", f"{m.kv_bytes_per_token / 1024:.0f}")
    slos = _table("SLO profiles", ("profile", "kind", "limits"), names=list(profiles),
                  text=("kind", "limits"))
    for p in profiles.values():
        unit = "x" if p.kind == "slowdown" else " ms"
        slos.add_row(p.name, p.kind, ", ".join(f"{m.upper()} {q.upper()} {v:g}{unit}"
                                               for (m, q), v in p.limits.items()))
    designs = _table("Designs", ("design", "prompt machines", "token machines", "mixed pool"),
                     names=list(cat.designs),
                     text=("prompt machines", "token machines", "mixed pool"))
    for d in cat.designs.values():
        same = ("(same machines; chunked prefill, "
                f"{d.chunk_tokens} tokens)" if d.is_chunked else "(same machines)")
        designs.add_row(d.name, d.prompt_sku, d.token_sku or same,
                        "-" if d.is_baseline else ("on" if d.mixed_pool else "off"))
    return [machines, models, slos, designs]


def _table(title: str, columns: Sequence[str], names: Sequence[str],
           text: Sequence[str] = ()) -> Table:
    """The first column is as wide as the longest name (names are never cut); the other
    columns fold when the screen is narrow."""
    table = Table(title=title)
    table.add_column(columns[0], min_width=max(map(len, names), default=4), overflow="fold")
    for col in columns[1:]:
        table.add_column(col, overflow="fold", justify="left" if col in text else "right")
    return table


# --------------------------------------------------------------------------------- calibrate
def calibration_table(result, seed: int) -> Table:
    table = Table(title=f"Held-out error (random 80:20 split, seed {seed})")
    for col in ("model", "hardware", "TP", "phase", "fit", "held out", "MAPE %", "max %"):
        text = col in ("model", "hardware", "phase")
        table.add_column(col, justify="left" if text else "right", no_wrap=text)
    for e in result.errors:
        table.add_row(e.model, e.hardware, str(e.tensor_parallel), e.phase, str(e.train_rows),
                      str(e.test_rows), "-" if e.mape_pct is None else f"{e.mape_pct:.2f}",
                      "-" if e.max_ape_pct is None else f"{e.max_ape_pct:.1f}")
    return table


# ---------------------------------------------------------------------------------- simulate
def _curve_prefix_text(run: dict) -> str:
    """A whole-curve check's prefix hit rate and its windows' range (nothing without the
    cache)."""
    if run.get("prefix_hit_rate") is None:
        return ""
    rates = [r for r in run["window_prefix_hit_rates"] if r is not None]
    return (f"; prefix cache: {run['prefix_hit_rate']:.1%} of prefill tokens cached (windows "
            f"{min(rates):.1%} to {max(rates):.1%})")


def print_simulation(console: Console, err_console: Console, summary: dict, run) -> None:
    report = run.report
    for note in (run.notes if hasattr(run, "plan") else run.workload.notes):
        err_console.print(f"note: {note}", highlight=False)
    if run.uncalibrated:
        err_console.print(f"[yellow]warning:[/] {', '.join(run.uncalibrated)}: "
                          f"{run.calibration_hint}", highlight=False, soft_wrap=True)
    if summary.get("plan"):
        _print_plan(console, summary)
    else:
        counts = (f"{summary['prompt_machines']} machines" if summary["token_machines"] == 0
                  else f"{summary['prompt_machines']} prompt + {summary['token_machines']} token")
        console.print(f"[bold]{summary['design']}[/] ({counts}), {summary['model']}, "
                      f"{summary['workload']}: {summary['requests']:,} requests, "
                      f"${summary['cost_per_hour']:.2f}/h, {summary['power_kw']:.2f} kW, "
                      f"{summary['gpus']} GPUs", highlight=False)
    if summary.get("latency_source"):
        console.print(f"Latencies: {summary['latency_source']}", highlight=False,
                      soft_wrap=True)
    if summary.get("window") and run.report is not None and summary.get("requests"):
        console.print(f"Window: {window_text(summary['window'])}", highlight=False,
                      soft_wrap=True)
    if summary.get("prefix_reuse_bound"):
        from provisioner.mooncake import reuse_line
        console.print(reuse_line(summary["prefix_reuse_bound"]), highlight=False,
                      soft_wrap=True)
    if summary.get("prefix_hit_rate") is not None:
        pools = "; ".join(f"{label} {pool['prefix_hit_rate']:.1%}"
                          for label, pool in summary.get("pools", {}).items()
                          if "prefix_hit_rate" in pool)
        console.print(f"prefix cache: {summary['prefix_hit_rate']:.1%} of prefill tokens found "
                      f"cached ({pools})", highlight=False, soft_wrap=True)
        if summary.get("prefix_host_hit_rate") is not None:
            console.print(f"  of which in host memory (loaded over PCIe): "
                          f"{summary['prefix_host_hit_rate']:.1%} of prefill tokens",
                          highlight=False, soft_wrap=True)
    elif getattr(run, "prefix_cache", False) and report.feasible:
        err_console.print("note: --prefix-cache: these requests carry no prompt blocks (only a "
                          "Mooncake trace's requests do), so nothing is cached",
                          highlight=False, soft_wrap=True)
    if not report.feasible:
        console.print(f"[bold red]infeasible:[/] {report.reason}", highlight=False)
        return
    console.print(_slo_table(report))
    if summary.get("closed_loop"):
        loop = summary["closed_loop"]
        console.print(f"closed loop: {loop['users']:,} users, mean think time "
                      f"{loop['think_time_s']:g} s: {loop['throughput_rps']:.3f} requests/s "
                      "achieved", highlight=False)
    ms = summary["latency_ms"]
    console.print("latencies, ms P50 / P90 / P99: " + "; ".join(
        f"{metric.upper()} " + " / ".join("-" if v is None else _ms(v) for v in values.values())
        for metric, values in ms.items()) + " (TPOT: a request's mean gap; ITL: every gap)",
        highlight=False, soft_wrap=True)
    planned = bool(summary.get("plan"))   # pools resized: as many as the plan ever asks for
    for label, pool in summary["pools"].items():
        count = f"up to {pool['count']}" if planned else str(pool["count"])
        console.print(f"{label} pool: {count}x {pool['sku']}"
                      f"{' (resized by the plan)' if planned else ''}, utilization "
                      f"{pool['utilization']:.0%}{' over the whole run' if planned else ''}, "
                      f"mean batch {pool['mean_batch']:.1f}, KV "
                      f"capacity {pool['kv_capacity_tokens']:,} tokens/instance (peak "
                      f"{pool['peak_kv_fraction']:.0%}), mixed pool {pool['mixed_pool_s']:.1f} s"
                      + (f", {pool['preemptions']:,} preemptions (paged KV)"
                         if "preemptions" in pool else ""),
                      highlight=False)
    prefill = summary.get("prefill")
    if prefill and "chunks_per_prompt" in prefill:
        overhead = prefill["chunking_overhead"]
        console.print(f"chunked prefill: budget {prefill['chunk_tokens']} prompt tokens per "
                      f"iteration, {prefill['chunks_per_prompt']:.2f} chunks per prompt, "
                      "chunking overhead "
                      + ("-" if overhead is None else f"{overhead:+.1%}")
                      + " (prefill work chunked vs whole)", highlight=False)
    _print_failures(console, summary)
    if "windows" in summary:
        for entry in summary["windows"]:
            verdict = ("[green]met[/]" if entry["passed"] else
                       f"[bold red]missed[/]: {entry['reason']}")
            pools = (" " + " then ".join(pools_text(*p) for p in entry["pools"])
                     if entry.get("pools") else "")
            cached = ("" if entry.get("prefix_hit_rate") is None else
                      f", {entry['prefix_hit_rate']:.1%} of prefill tokens cached")
            console.print(f"  window {_clock(entry['start_s'])}-{_clock(entry['end_s'])}{pools}: "
                          f"{entry['requests']:,} requests, peak {entry['peak_rps']:.4g} "
                          f"req/s{cached}, SLOs {verdict}", highlight=False)
        met = sum(entry["passed"] for entry in summary["windows"])
        console.print(f"per window: {met} of {len(summary['windows'])} met every SLO; over the "
                      "whole curve:", highlight=False)
    console.print("[green]all SLOs met[/]" if report.passed else
                  f"[bold red]{len(report.failing)} SLO(s) missed[/]")


def _print_plan(console: Console, summary: dict) -> None:
    """simulate --plan: the design and the run, what the plan costs over the curve, then its
    pools per change (no one cluster serves the whole curve)."""
    totals, steps = summary["plan_totals"], summary["plan"]
    changes = []   # equal consecutive steps (a search's plan.csv has a row per window) merged
    for step in steps:
        pools = (step["prompt_machines"], step["token_machines"])
        if changes and changes[-1][2] == pools:
            changes[-1][1] = step["end_s"]
        else:
            changes.append([step["start_s"], step["end_s"], pools, step])
    low, high = totals["cost_per_hour_min"], totals["cost_per_hour_max"]
    rates = f"${low:,.2f}/h" + ("" if low == high else f" to ${high:,.2f}/h")
    console.print(f"[bold]{summary['design']}[/] resized by the plan ({len(changes)} "
                  f"step{'' if len(changes) == 1 else 's'} over the curve), "
                  f"{summary['model']}, {summary['workload']}: {summary['requests']:,} "
                  f"requests; the plan: ${totals['cost_usd']:,.2f} for its machines' "
                  f"serving time over {totals['hours']:,.4g} h ({rates}), "
                  f"{totals['energy_kwh']:,.1f} kWh, {totals['machine_hours']:,.1f} "
                  "machine-hours", highlight=False)
    console.print("plan: " + ", ".join(
        f"{_clock(a)}-{_clock(b)} {pools_text(*pools)} ${step['cost_per_hour']:,.2f}/h "
        f"{step['power_kw']:,.1f} kW {step['gpus']} GPUs" for a, b, pools, step in changes),
        highlight=False, soft_wrap=True)


def _print_failures(console: Console, summary: dict) -> None:
    failures = summary.get("failures")
    if not failures or "requests_affected" not in failures:
        return
    if "goodput_rps" not in failures:   # a load curve's run: totals only
        console.print(f"failures: {failures['failures']} drawn, "
                      f"{failures['requests_affected']:,} requests affected, "
                      f"{failures['tokens_recomputed']:,} tokens recomputed, recovery "
                      f"{failures['recovery_s_mean']:.2f} s mean / "
                      f"{failures['recovery_s_max']:.2f} s max per affected request",
                      highlight=False)
        return
    console.print(f"failures: {failures['failures']} ({failures['machine_down_s']:.1f} "
                  f"machine-seconds down), {failures['requests_affected']} requests "
                  f"affected, {failures['tokens_recomputed']:,} tokens recomputed, "
                  f"recovery {failures['recovery_s_mean']:.2f} s mean / "
                  f"{failures['recovery_s_max']:.2f} s max per affected request; goodput "
                  f"{failures['goodput_rps']:.2f} req/s within the SLO "
                  f"({failures['goodput_requests']} of {summary['requests']})",
                  highlight=False)


def _slo_table(report) -> Table:
    table = Table(title=f"SLO profile '{report.profile}'")
    for col in ("metric", "percentile", "value", "limit", "margin", "status"):
        table.add_column(col, justify="left" if col in ("metric", "percentile") else "right")
    for check in report.checks:
        value = "-" if check.value is None else f"{check.value:.3f}{check.unit}"
        table.add_row(check.metric.upper(), check.percentile.upper(), value,
                      f"{check.limit:g}{check.unit}", f"{check.margin:+.1%}",
                      "[green]pass[/]" if check.passed else "[bold red]FAIL[/]")
    return table


def _expert_parallel_legend(document: dict) -> str:
    """The legend of expert-parallel layouts, when an optimum has one: attention ranks / EP
    group, and the machines a group spans."""
    for design in document.get("designs", []):
        layout = (design.get("optimum") or {}).get("layout") or {}
        if any("ep" in pool for pool in layout.values()):
            return ("expert-parallel pools: attention (TP, or DP ranks) / EP group, 'on N': the "
                    "machines a group spans; ")
    return ""


def _table_lines(document: dict, title, columns: tuple[str, ...], rows: list) -> list[str]:
    """A titled table of (design, cells) rows as summary lines, one per design ([] without
    rows; `title(document)` is read only with rows, from the inputs they come with)."""
    if not rows:
        return []
    return [title(document) + ":"] + [
        f"  {name}: " + "; ".join(f"{label} {cell}" for label, cell in zip(columns, cells))
        for name, cells in rows]
