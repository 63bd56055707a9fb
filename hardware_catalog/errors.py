"""The one error type for bad input anywhere at the edge (files, names, options).

Its message is a single line naming the file, row and field where they are known; the CLI prints
it and exits with code 2.
"""


class InputError(ValueError):
    """Bad user input: a malformed file, an unknown name or an out-of-range option."""

    def __init__(self, message: str, *, source: str | None = None, row: int | None = None,
                 field: str | None = None):
        where = []
        if source is not None:
            where.append(str(source))
        if row is not None:
            where.append(f"row {row}")
        if field is not None:
            where.append(f"field '{field}'")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)
