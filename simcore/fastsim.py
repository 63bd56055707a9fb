"""The fast simulator core's public names, kept where callers import them from: the core is
the package `simcore.fast` (see its docstring for its parts)."""
from simcore.fast import (
    CORE, CORE_SOURCES, ENTRY_POINTS, MACHINE, REQUEST, State, TooManyInFlight, installed_builds,
    new_state, run_streamed, simulate_fast, source_digest)

__all__ = ["CORE", "CORE_SOURCES", "ENTRY_POINTS", "MACHINE", "REQUEST", "State",
           "TooManyInFlight", "installed_builds", "new_state", "run_streamed", "simulate_fast",
           "source_digest"]
