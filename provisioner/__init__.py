"""provision: size disaggregated LLM inference clusters (search, reports, CLI).

    import provisioner
    result = provisioner.search(designs="splitwise-hh", rate=70)

`search`, `simulate` and `SearchResult` live in `provisioner.api`; they are loaded on first use
so that `provision --version` and `--help` start without numpy, pandas or numba (~0.5 s).
"""
from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:  # type checkers see the typed API; at run time it loads on first use
    from hardware_catalog import InputError as InputError
    from provisioner.api import SearchResult as SearchResult
    from provisioner.api import SimulationRun as SimulationRun
    from provisioner.api import search as search
    from provisioner.api import simulate as simulate

_API = ("search", "simulate", "SearchResult", "SimulationRun")


def __getattr__(name: str):
    if name in _API:
        from provisioner import api
        return getattr(api, name)
    if name == "InputError":   # what every bad input raises: `except provisioner.InputError`
        from hardware_catalog import InputError
        return InputError
    raise AttributeError(f"module 'provisioner' has no attribute {name!r}")


__all__ = ["__version__", "InputError", *_API]
