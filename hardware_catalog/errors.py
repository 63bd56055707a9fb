"""The one error type for bad input anywhere at the edge (files, names, options).

Its message is a single line naming the file, row and field where they are known; the CLI prints
it and exits with code 2.

A message that names an option writes it as `option_ref("rate")`; the entry point that read the
options says how to spell it (`naming`): `--rate` on the command line, `rate` in a spec file,
`rate=` from Python, `inputs.options.rate` in a report given to `provision check`. The message
is rendered when the error is raised, inside the entry point's `naming` block.
"""
from __future__ import annotations

import contextvars
import re
from contextlib import contextmanager
from typing import Callable, Iterator

_REF = re.compile("\x1f([a-z_]+)\x1f")
_NAMING: contextvars.ContextVar = contextvars.ContextVar("provision_option_naming", default=None)


def cli_flag(name: str) -> str:
    """The command line's spelling of an option (the default naming)."""
    return "--" + name.replace("_", "-")


def option_ref(name: str) -> str:
    """An option named in an error message, spelled as the caller wrote it (see `naming`)."""
    return f"\x1f{name}\x1f"


@contextmanager
def naming(spell: Callable[[str], str]) -> Iterator[None]:
    """Inside this block, errors spell the options they name with `spell(name)`."""
    token = _NAMING.set(spell)
    try:
        yield
    finally:
        _NAMING.reset(token)


def spelled(text: str) -> str:
    """`text` with every `option_ref` spelled the current entry point's way."""
    spell = _NAMING.get() or cli_flag
    return _REF.sub(lambda match: spell(match.group(1)), text)


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
        message = spelled(message)
        super().__init__(f"{prefix}: {message}" if prefix else message)
