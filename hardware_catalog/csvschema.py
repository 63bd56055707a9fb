"""Every CSV file kind provision reads, declared once, and the one reader they all go through.

A `CsvSchema` names a file kind's columns, each with the check its cells must pass (a number
within bounds, whole where it must be; one of a few words; a label; a timestamp). `read_table`
reads any of them the same way:
- the file through `read_text` (a directory, FIFO, device, /proc file, empty, binary, UTF-16 or
  non-UTF-8 file is refused before it is opened for reading, or when read);
- its header by name, never by position: names are matched ignoring case and surrounding
  spaces; a missing, unknown or duplicated name is refused, and so is a first line of numbers
  (a file with no header: its first row would otherwise be lost or read as names);
- every cell typed and bounded, an error naming the file, its row (the header is row 1) and
  the column;
- blank lines skipped; a trailing comma on every row accepted (`read_csv_cells`).

`SCHEMAS` holds every kind, so tests generate their bad inputs from it (tests/test_bad_input.py)
and a new kind cannot skip the edge: add it here and read it with `read_table`.
A kind with several accepted layouts (a trace: Azure, SplitwiseSim or plain columns) is a tuple
of schemas; `read_table` picks the layout whose columns the header holds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from hardware_catalog.csvcells import read_csv_cells
from hardware_catalog.errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

MAX_CSV_BYTES = 64 * 1024 * 1024   # a curve, plan, schedule, profile or table; traces say more
YEAR_S = 366 * 86400.0   # arrival times, and a timestamped column's span: one year


# ------------------------------------------------------------------------------ cell checks
@dataclass(frozen=True)
class Num:
    """Finite numbers within [low, high] ((low, high] with `low_open`), whole with `integer`;
    `words` are spellings of special values (e.g. {"inf": inf} for 'never repaired')."""
    low: float | None = None
    high: float | None = None
    integer: bool = False
    low_open: bool = False
    words: tuple[tuple[str, float], ...] = ()
    high_note: str = ""            # why the upper bound is what it is, said when it is broken

    def describe(self) -> str:
        what = "a whole number" if self.integer else "a number"
        bounds = []
        if self.low is not None:
            bounds.append(f"{'>' if self.low_open else '>='} {_shown(self.low)}")
        if self.high is not None:
            bounds.append(f"<= {_shown(self.high)}")
        words = f" (or {', '.join(w or 'empty' for w, _ in self.words)})" if self.words else ""
        return f"{what} {' and '.join(bounds)}".strip() + words

    def parse(self, cells: "pd.Series", where: "Where") -> np.ndarray:
        import pandas as pd
        text = cells.str.strip()
        numbers = np.array(pd.to_numeric(text, errors="coerce").to_numpy(
            dtype=np.float64, na_value=np.nan))   # a writable copy
        special = np.zeros(len(numbers), dtype=bool)
        lowered = text.str.lower().to_numpy()
        for word, value in self.words:
            hit = lowered == word
            numbers[hit], special[hit] = value, True
        checked = ~special
        where.reject(checked & ~np.isfinite(numbers), cells, "expected a finite number")
        if self.integer:
            where.reject(checked & (numbers != np.floor(numbers)), cells,
                         "expected a whole number")
        if self.low is not None:
            below = (numbers <= self.low) if self.low_open else (numbers < self.low)
            where.reject(checked & below, cells,
                         f"expected a number {'>' if self.low_open else '>='} "
                         f"{_shown(self.low)}")
        if self.high is not None:
            note = f" ({self.high_note})" if self.high_note else ""
            where.reject(checked & (numbers > self.high), cells,
                         f"expected a number <= {_shown(self.high)}{note}")
        return numbers


def _shown(bound: float) -> str:
    """A bound as people write it: 31622400, not 3.16224e+07."""
    return f"{bound:.0f}" if float(bound).is_integer() and abs(bound) < 1e15 else f"{bound:g}"


@dataclass(frozen=True)
class Word:
    """One of `choices`, any case; returned in lower case."""
    choices: tuple[str, ...]

    def describe(self) -> str:
        return "one of " + ", ".join(self.choices)

    def parse(self, cells: "pd.Series", where: "Where") -> np.ndarray:
        lowered = cells.str.strip().str.lower()
        where.reject(~lowered.isin(self.choices).to_numpy(), cells, f"expected {self.describe()}")
        return lowered.to_numpy(dtype=object)


@dataclass(frozen=True)
class Label:
    """A name on one line (a model, a machine); empty only with `blank`."""
    blank: bool = False

    def describe(self) -> str:
        return "a name" + (" or nothing" if self.blank else "")

    def parse(self, cells: "pd.Series", where: "Where") -> np.ndarray:
        text = cells.str.strip()
        if not self.blank:
            where.reject((text == "").to_numpy(), cells, "expected a name, not an empty cell")
        return text.to_numpy(dtype=object)


@dataclass(frozen=True)
class Stamp:
    """Wall-clock timestamps (ISO 8601), returned as seconds after the earliest one (kept in
    the table's `origins`); with `seconds`, plain numbers of seconds are accepted too (a whole
    column of them: a column mixes no kinds)."""
    seconds: Num | None = None

    def describe(self) -> str:
        if self.seconds is not None:
            return f"seconds ({self.seconds.describe()}) or an ISO timestamp"
        return "an ISO timestamp"

    def parse(self, cells: "pd.Series", where: "Where") -> np.ndarray:
        import pandas as pd
        text = cells.str.strip()
        if self.seconds is not None:
            numeric = pd.to_numeric(text, errors="coerce")
            if numeric.notna().all() or not _looks_like_stamps(text):
                return self.seconds.parse(cells, where)
        try:
            stamps = pd.to_datetime(text, format="ISO8601", errors="coerce")
        except (ValueError, TypeError) as err:  # e.g. a mix of time zones
            raise InputError(f"unparseable timestamps: {' '.join(str(err).split())}",
                             source=where.source, field=where.column) from None
        where.reject(stamps.isna().to_numpy(), cells, f"expected {self.describe()}")
        if stamps.dt.tz is not None:  # zone-aware stamps compare in UTC
            stamps = stamps.dt.tz_convert("UTC").dt.tz_localize(None)
        # microseconds since 1970 fit int64 for every year 1-9999 (nanoseconds wrap after 2262)
        micros = stamps.to_numpy().astype("datetime64[us]").astype(np.int64)
        first = micros.min()
        seconds = (micros - first) / 1e6
        where.reject(seconds > YEAR_S, cells, "expected timestamps within one year of the "
                     f"first ({np.datetime64(int(first), 'us')})")
        where.origins[where.column] = pd.Timestamp(np.datetime64(int(first), 'us'))
        return seconds


def _looks_like_stamps(text: "pd.Series") -> bool:
    """A column some of whose cells hold a date (a dash or colon after a digit)."""
    return bool(text.str.contains(r"\d[-:T]\d", regex=True).any())


Cell = Num | Word | Label | Stamp


# ------------------------------------------------------------------------------ the schema
@dataclass(frozen=True)
class Column:
    name: str
    cell: Cell
    required: bool = True


@dataclass(frozen=True)
class CsvSchema:
    """One CSV layout: its `columns` (read and checked), `ignored` names (accepted, not read:
    a known export's extra columns), an example file (docs and generated tests)."""
    kind: str                      # what the file is, as errors say it ("a load curve")
    columns: tuple[Column, ...]
    example: str                   # a valid file of this kind
    ignored: tuple[str, ...] = ()
    extra: bool = False            # other columns are accepted and named in `Table.unread`
    layout: str = ""               # a named layout of a kind that has several ("Azure 2023")
    row_noun: str = "rows"         # what a row is, as errors say it ("requests")
    max_bytes: int = MAX_CSV_BYTES
    max_rows: int = 1_000_000

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.required)

    def describe(self) -> str:
        optional = [c.name for c in self.columns if not c.required] + list(self.ignored)
        more = f" (and may have {', '.join(optional)})" if optional else ""
        return f"columns {', '.join(self.required)}{more}"


@dataclass
class Table:
    """A file's rows, checked: one array per column read (absent optional columns are
    missing from `values`), the file's line number of each row, and the first timestamp of
    each timestamp column (its values are seconds after it)."""
    source: str
    schema: CsvSchema
    rows: np.ndarray
    values: dict[str, np.ndarray]
    origins: dict[str, "pd.Timestamp"] = field(default_factory=dict)
    unread: tuple[str, ...] = ()   # columns of a schema with `extra` that it does not read

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.values[name]

    def error(self, index: int | None, column: str | None, message: str) -> InputError:
        """An error about row `index` of the table (not of the file) and `column`."""
        row = None if index is None else int(self.rows[index])
        return InputError(message, source=self.source, row=row, field=column)


@dataclass
class Where:
    """The file and column a cell check is reading, for its errors."""
    source: str
    column: str
    rows: np.ndarray
    origins: dict

    def reject(self, bad: np.ndarray, cells: "pd.Series", problem: str) -> None:
        """Raise for the first row flagged in `bad`, quoting its value and counting others."""
        if not bad.any():
            return
        where = np.flatnonzero(bad)
        value = cells.iloc[where[0]]
        others = len(where) - 1
        more = f" ({others} more bad row{'s' if others > 1 else ''} in this column)" \
            if others else ""
        shown = repr(value[:40]) if value.strip() else "an empty value"
        raise InputError(f"{problem}, got {shown}{more}", source=self.source,
                         row=int(self.rows[where[0]]), field=self.column)


# ------------------------------------------------------------------------------ the reader
def read_table(kind: CsvSchema | Sequence[CsvSchema], path: str | Path, *,
               text: str | None = None) -> Table:
    """Read `path` (or its already-read `text`) as `kind`: one layout, or several of which
    the header picks one. Every problem is one InputError naming the file, row and column."""
    from hardware_catalog import read_text
    layouts = (kind,) if isinstance(kind, CsvSchema) else tuple(kind)
    source = str(path)
    if text is None:
        try:
            text = read_text(path, max_bytes=max(s.max_bytes for s in layouts))
        except InputError as err:   # an empty or unreadable file: say what was expected
            raise InputError(f"{err}; expected {layouts[0].kind} (a CSV file with "
                             f"{layouts[0].describe()})") from None
    header, cells = read_csv_cells(text, source)
    positions = _header_positions(header, layouts[0], source)
    schema = _pick_layout(layouts, positions, source)
    unread = _check_names(schema, header, positions, source)
    cells = cells[~(cells == "").all(axis=1)]   # blank lines; the index keeps the file's rows
    if cells.empty:
        raise InputError(f"has a header but no {schema.row_noun}; {schema.kind} has "
                         f"{schema.describe()}", source=source)
    if len(cells) > schema.max_rows:
        raise InputError(f"{len(cells)} {schema.row_noun}; {schema.kind} may have at most "
                         f"{schema.max_rows}", source=source)
    rows = cells.index.to_numpy()
    table = Table(source, schema, rows, {}, unread=unread)
    for column in schema.columns:
        if column.name not in positions:
            continue
        where = Where(source, column.name, rows, table.origins)
        table.values[column.name] = column.cell.parse(cells[positions[column.name]], where)
    return table


def _header_positions(header: list[str], schema: CsvSchema, source: str) -> dict[str, int]:
    """Each named column's position (names in lower case); a name given twice, or a header
    that is a row of numbers, refused."""
    names = [name.strip() for name in header]
    filled = [name for name in names if name]
    if filled and all(_is_number(name) for name in filled):
        raise InputError(f"its first line ({','.join(names)[:60]}) holds numbers, not column "
                         f"names: {schema.kind} starts with a header line "
                         f"'{','.join(schema.required)}'; add it", source=source, row=1)
    positions: dict[str, int] = {}
    for position, name in enumerate(names):
        if not name:
            continue   # an empty name (a trailing comma): read_csv_cells refuses values there
        key = name.lower()
        if key in positions:
            raise InputError(f"column '{name}' appears twice in the header (columns "
                             f"{positions[key] + 1} and {position + 1}); keep one",
                             source=source, row=1, field=name)
        positions[key] = position
    return positions


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _pick_layout(layouts: tuple[CsvSchema, ...], positions: dict[str, int],
                 source: str) -> CsvSchema:
    """The layout whose required columns the header holds most of (the first on a tie)."""
    def held(schema: CsvSchema) -> int:
        return sum(name.lower() in positions for name in schema.required)
    best = max(layouts, key=held)
    if len(layouts) > 1 and held(best) == 0:
        accepted = "; ".join(f"{s.layout} ({', '.join(s.required)})" for s in layouts)
        shown = ", ".join(positions)[:120]
        raise InputError(f"unrecognised header '{shown}'; accepted formats of {best.kind}: "
                         f"{accepted}", source=source, row=1)
    return best


def _check_names(schema: CsvSchema, header: list[str], positions: dict[str, int],
                 source: str) -> tuple[str, ...]:
    """Refuse a missing column, and an unknown one unless the schema takes `extra` columns;
    return those extra columns' names."""
    layout = f" ({schema.layout} layout)" if schema.layout else ""
    known = {name.lower() for name in (*schema.names, *schema.ignored)}
    unread = tuple(header[position].strip() for name, position in positions.items()
                   if name not in known)
    for name, position in positions.items():
        if name not in known and not schema.extra:
            raise InputError(f"unknown column '{name}' (column {position + 1}); "
                             f"{schema.kind}{layout} has {schema.describe()}; rename or remove "
                             "it", source=source, row=1, field=name)
    for name in schema.required:
        if name.lower() not in positions:
            raise InputError(f"missing column '{name}'; {schema.kind}{layout} has "
                             f"{schema.describe()}", source=source, row=1, field=name)
    # every schema names its columns in lower case in `positions`: remap to declared names
    for column in schema.columns:
        if column.name.lower() in positions and column.name != column.name.lower():
            positions[column.name] = positions[column.name.lower()]
    return unread


# ------------------------------------------------------------------------------ the kinds
MAX_RATE = 1e6                  # requests per second (the --rate bound)
MAX_REQUEST_TOKENS = 10_000_000
MAX_MACHINES = 100_000
MAX_TRACE_REQUESTS = 5_000_000  # simcore.workload.MAX_REQUESTS
TRACE_BYTES_PER_ROW = 100       # the trace formats' rows are 20-40 bytes: generous

SECONDS = Num(0, YEAR_S, high_note="the 366-day limit of arrival times")
TOKENS = Num(1, MAX_REQUEST_TOKENS, integer=True)

LOAD_CURVE = CsvSchema(
    "a load curve",
    (Column("time_s", Stamp(seconds=SECONDS)), Column("rate_rps", Num(0, MAX_RATE))),
    example="time_s,rate_rps\n0,5\n600,10\n1200,20\n")

PLAN = CsvSchema(
    "a plan",
    (Column("start_s", SECONDS), Column("prompt_machines", Num(0, MAX_MACHINES, integer=True)),
     Column("token_machines", Num(0, MAX_MACHINES, integer=True)),
     Column("design", Label(blank=True), required=False)),
    example="start_s,prompt_machines,token_machines\n0,2,1\n600,3,2\n",
    # what a search's plan.csv adds beside each window's pools (read back as it is)
    ignored=("window", "end_s", "peak_rps", "mean_rps", "sized_rps", "static_prompt",
             "static_token", "whole_curve_margin", "whole_curve_prefix_hit_rate"))

FAILURE_POOLS = ("prompt", "token", "any")
FAILURE_SCHEDULE = CsvSchema(
    "a failure schedule",
    (Column("time_s", SECONDS), Column("pool", Word(FAILURE_POOLS)),
     Column("machine", Num(0, MAX_MACHINES, integer=True)),
     Column("down_s", Num(0, 1e9, low_open=True, words=(("inf", math.inf),
                                                          ("infinity", math.inf))))),
    example="time_s,pool,machine,down_s\n10,prompt,0,30\n")

PROFILE_MS = 1e7
CALIBRATION_PROFILE = CsvSchema(
    "a calibration profile",
    (Column("model", Label()), Column("hardware", Label()),
     Column("tensor_parallel", Num(1, 1024, integer=True)),
     Column("prompt_size", Num(1, 1e7, integer=True)),
     Column("batch_size", Num(1, 1e5, integer=True)),
     Column("token_size", Num(1, 1e7, integer=True)),
     Column("prompt_time", Num(0, PROFILE_MS, low_open=True)),
     Column("token_time", Num(0, PROFILE_MS, low_open=True)),
     Column("e2e_time", Num(0, PROFILE_MS, low_open=True), required=False)),
    example=("model,hardware,tensor_parallel,prompt_size,batch_size,token_size,prompt_time,"
             "token_time\nllama2-70b,a100,8,128,1,10,50,40\n"),
    ignored=("peak_power", "average_power"))   # SplitwiseSim's profile measures them too

PERF_TABLE = CsvSchema(
    "a latency table",
    (Column("machine", Label()), Column("model", Label(blank=True), required=False),
     Column("phase", Word(("prefill", "decode", "context"))),
     # a context row's x is empty: "not given" (NaN), refused on the other phases
     Column("x", Num(0, 1e9, words=(("", math.nan),))), Column("ms", Num(0, 1e9))),
    example="machine,model,phase,x,ms\ndgx-h100,,prefill,128,50\ndgx-h100,,prefill,2048,300\n"
            "dgx-h100,,decode,1,40\ndgx-h100,,decode,64,80\n")

# A trace export often carries more fields (ids, types, timings): a trace's own three columns
# are required by name, so an extra one cannot shift them; it is accepted and named in the
# workload's notes.
_TRACE_LIMITS = dict(max_bytes=MAX_TRACE_REQUESTS * TRACE_BYTES_PER_ROW,
                     max_rows=MAX_TRACE_REQUESTS, extra=True, row_noun="requests")
TRACE = (
    CsvSchema("a trace", (Column("TIMESTAMP", Stamp()), Column("ContextTokens", TOKENS),
                          Column("GeneratedTokens", TOKENS)),
              example="TIMESTAMP,ContextTokens,GeneratedTokens\n"
                      "2023-11-16 18:15:46.6805900,4808,10\n",
              layout="Azure 2023", **_TRACE_LIMITS),
    # SplitwiseSim's request ids, types, applications and batch sizes are not needed
    CsvSchema("a trace", (Column("arrival_timestamp", SECONDS), Column("prompt_size", TOKENS),
                          Column("token_size", TOKENS)),
              example="arrival_timestamp,prompt_size,token_size\n0.5,100,10\n",
              ignored=("request_id", "request_type", "application_id", "batch_size"),
              layout="SplitwiseSim", **_TRACE_LIMITS),
    CsvSchema("a trace", (Column("arrival_s", SECONDS), Column("prompt_tokens", TOKENS),
                          Column("output_tokens", TOKENS)),
              example="arrival_s,prompt_tokens,output_tokens\n0,10,5\n0.5,100,10\n",
              layout="plain", **_TRACE_LIMITS),
)

SCHEMAS: dict[str, CsvSchema | tuple[CsvSchema, ...]] = {
    "trace": TRACE, "load_curve": LOAD_CURVE, "plan": PLAN,
    "failure_schedule": FAILURE_SCHEDULE, "calibration_profile": CALIBRATION_PROFILE,
    "perf_table": PERF_TABLE,
}
