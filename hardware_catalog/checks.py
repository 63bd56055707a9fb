"""One small vocabulary of value checks, shared by every edge that reads input.

A check is a callable that returns the value in its canonical type or raises `Invalid` with a
message that does not name the field: the caller knows how the field was spelled (`--rate` on
the command line, `rate:` in a spec file, an entry's key in a catalog file) and wraps the message
in an `InputError` that names it. So the rule "a finite number > 0" is written once, here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence


MAX_INT = 2**63 - 1  # every whole number fits numpy's int64
CHUNK_TOKENS_MIN, CHUNK_TOKENS_MAX = 16, 1_048_576  # a chunked-prefill budget (prompt tokens)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} digits)"


class Invalid(ValueError):
    """A value broke a check; the message says why and what is allowed."""


@dataclass(frozen=True)
class Number:
    """A finite real (or whole, with `integer`) number within [low, high] (or (low, high])."""
    low: float | None = None
    high: float | None = None
    integer: bool = False
    low_open: bool = False   # low itself is not allowed (e.g. "> 0")

    def __call__(self, value: Any) -> float | int:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Invalid(f"must be {self.describe()}, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise Invalid(f"must be {self.describe()}, got {value!r}")
        if isinstance(value, int) and not -MAX_INT <= value <= MAX_INT:
            # beyond int64 a whole number wraps in numpy, and float() of it may overflow
            raise Invalid(f"must be {self.describe()}, got {_short(value)}")
        if self.integer and (isinstance(value, float) and not value.is_integer()):
            raise Invalid(f"must be {self.describe()}, got {value!r}")
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            raise Invalid(f"must be {self.describe()}, got {_short(value)}")
        if self.high is not None and value > self.high:
            raise Invalid(f"must be {self.describe()}, got {_short(value)}")
        return int(value) if self.integer else float(value)

    def describe(self) -> str:
        what = "a whole number" if self.integer else "a number"
        bounds = []
        if self.low is not None:
            bounds.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            bounds.append(f"<= {self.high:g}")
        return f"{what} {' and '.join(bounds)}".strip()


def positive(high: float | None = None) -> Number:
    return Number(0, high, low_open=True)


def count(low: int = 1, high: float | None = None) -> Number:
    return Number(low, high, integer=True)


def fraction(low_open: bool = True) -> Number:
    """In (0, 1) by default; with low_open False in [0, 1)."""
    return _OpenAbove(0, 1, low_open=low_open)


@dataclass(frozen=True)
class _OpenAbove(Number):
    """A number strictly below `high` (fractions: 1 is not allowed)."""

    def __call__(self, value: Any) -> float:
        checked = super().__call__(value)
        if checked >= self.high:
            raise Invalid(f"must be {self.describe()}, got {value!r}")
        return checked

    def describe(self) -> str:
        return f"a number {'>' if self.low_open else '>='} {self.low:g} and < {self.high:g}"


@dataclass(frozen=True)
class Text:
    """A non-empty string on one line."""

    def __call__(self, value: Any) -> str:
        if not isinstance(value, str) or not value.strip() or "\n" in value or "\x00" in value:
            raise Invalid(f"must be {self.describe()}, got {value!r}")
        return value

    def describe(self) -> str:
        return "a non-empty one-line string"


@dataclass(frozen=True)
class Flag:
    def __call__(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise Invalid(f"must be true or false, got {value!r}")
        return value

    def describe(self) -> str:
        return "true or false"


@dataclass(frozen=True)
class OneOf:
    choices: Sequence[str]

    def __call__(self, value: Any) -> str:
        value = getattr(value, "value", value)  # an Enum member from the CLI is its value
        if value not in self.choices:
            raise Invalid(f"must be {self.describe()}, got {value!r}")
        return value

    def describe(self) -> str:
        return "one of " + ", ".join(self.choices)


@dataclass(frozen=True)
class Mapping:
    """A mapping (e.g. a spec file's custom designs); its entries are checked where they are used."""

    def __call__(self, value: Any) -> dict:
        if not isinstance(value, dict):
            raise Invalid(f"must be {self.describe()}, got {value!r}")
        return value

    def describe(self) -> str:
        return "a mapping"


@dataclass(frozen=True)
class Names:
    """A comma-separated string or a list of names (the Python API's Design records are taken
    apart from names before this check)."""

    def __call__(self, value: Any) -> tuple:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)) or not value:
            raise Invalid(f"must be {self.describe()}, got {_short(value)}")
        seen = set()
        for item in value:
            if not isinstance(item, str):
                raise Invalid(f"must be {self.describe()}; item {_short(item)} is not a name")
            Text()(item)
            if item in seen:   # a list is a set of choices: a repeat is a typo, not a weight
                raise Invalid(f"names {item!r} twice; give each name once")
            seen.add(item)
        return tuple(value)

    def describe(self) -> str:
        return "a comma-separated list of names"


@dataclass(frozen=True)
class NumberList:
    """A list of numbers, each one `item` accepts (e.g. the load sweep's factors)."""
    item: Number

    def __call__(self, value: Any) -> tuple:
        if not isinstance(value, (list, tuple)):
            raise Invalid(f"must be {self.describe()}, got {_short(value)}")
        try:
            return tuple(self.item(v) for v in value)
        except Invalid:
            raise Invalid(f"must be {self.describe()}, got {_short(value)}") from None

    def describe(self) -> str:
        return f"a list of numbers, each {self.item.describe().removeprefix('a number ')}"


@dataclass(frozen=True)
class Prices:
    """Machine prices per hour by SKU: "SKU=USD,SKU=USD" (a command line), a mapping (a spec
    file or Python) or the echo's [[SKU, USD], ...]; returned as ((SKU, USD), ...) in SKU
    order, each price a number > 0."""

    def __call__(self, value: Any) -> tuple:
        pairs = self._pairs(value)
        price = positive(1e9)
        checked = {}
        for sku, usd in pairs:
            Text()(sku)
            if sku in checked:
                raise Invalid(f"gives {sku} twice")
            try:
                checked[sku] = price(float(usd) if isinstance(usd, str) else usd)
            except (Invalid, ValueError):
                raise Invalid(f"{sku}: the price must be a number of USD per hour > 0, "
                              f"got {_short(usd)}") from None
        return tuple(sorted(checked.items()))

    def _pairs(self, value: Any) -> list:
        if isinstance(value, dict):
            return list(value.items())
        if isinstance(value, str):
            items = [item.strip() for item in value.split(",") if item.strip()]
            if not all("=" in item for item in items):
                raise Invalid(f"must be {self.describe()}, got {_short(value)}")
            return [tuple(part.strip() for part in item.split("=", 1)) for item in items]
        if isinstance(value, (list, tuple)) and all(
                isinstance(v, (list, tuple)) and len(v) == 2 for v in value):
            return [tuple(v) for v in value]
        raise Invalid(f"must be {self.describe()}, got {_short(value)}")

    def describe(self) -> str:
        return "SKU=USD_PER_HOUR pairs, comma-separated (e.g. dgx-h100=30.5)"


@dataclass(frozen=True)
class OrAuto:
    """The word "auto", or a value `inner` accepts (a command line's digits count as a number)."""
    inner: Number

    def __call__(self, value: Any):
        if value == "auto":
            return "auto"
        if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
            value = int(value)
        try:
            return self.inner(value)
        except Invalid:
            raise Invalid(f"must be {self.describe()}, got {_short(value)}") from None

    def describe(self) -> str:
        return f"{self.inner.describe()}, or auto"
