"""CSV inputs as cells: every value a string, where it stood (row, column), for one-line errors.

The header decides how many columns a file has. A trailing comma on every row (a common export
artefact) is an empty column beyond the header and is accepted; a value in a column the header
does not name (beyond its end, or under an empty name) is refused naming its row and column,
instead of pandas silently taking the first column as the index and shifting the others.
"""
from __future__ import annotations

import csv
import io
import re
from typing import TYPE_CHECKING

from hardware_catalog.errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd


def read_csv_cells(text: str, source: str) -> tuple[list[str], "pd.DataFrame"]:
    """(the header's names, the rows' cells): columns by position (0 = the first), the index
    is each row's line number in the file (the header is row 1), blank lines are kept as rows
    of empty cells and a short row's missing cells are empty."""
    import pandas as pd  # ~0.5 s to import; only CSV inputs need it
    try:
        header = next(csv.reader(io.StringIO(text)), [])
    except csv.Error as err:
        raise InputError(f"malformed CSV header: {_one_line(err)}", source=source,
                         row=1) from None
    width = len(header)
    try:
        table = pd.read_csv(io.StringIO(text), header=None, names=range(width + 1), dtype=str,
                            keep_default_na=False, skip_blank_lines=False, index_col=False)
    except pd.errors.EmptyDataError:
        raise InputError("file is empty", source=source) from None
    except pd.errors.ParserError as err:
        raise _malformed(err, source, width) from None
    table = table.iloc[1:].fillna("")   # the header's own row
    table.index = table.index + 1       # line numbers: the header is line 1
    for i in [i for i, name in enumerate(header) if not name.strip()] + [width]:
        filled = (table[i] != "").to_numpy()
        if filled.any():
            first = int(filled.argmax())
            where = "beyond the header's last column" if i == width else \
                "whose name in the header is empty"
            raise InputError(f"a value {table[i].iloc[first][:40]!r} in column {i + 1}, "
                             f"{where}; name the column in the header or remove the value",
                             source=source, row=int(table.index[first]),
                             field=f"column {i + 1}")
    return header, table.drop(columns=[width])


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


def _malformed(err: Exception, source: str, width: int) -> InputError:
    """The tokenizer counts file lines from 1, header included: the same numbering as ours."""
    ragged = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", str(err))
    if ragged is None:
        return InputError(f"malformed CSV: {_one_line(err)}", source=source)
    _, row, seen = map(int, ragged.groups())
    return InputError(f"malformed CSV: expected {width} fields, found {seen} (the header names "
                      f"{width} columns); name the columns in the header or remove the values",
                      source=source, row=row, field=f"column {width + 1}")
