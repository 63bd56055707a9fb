"""Resolving command-line names into validated records (designs, performance models)."""
from __future__ import annotations

from pathlib import Path

from hardware_catalog import Catalog, Design, InputError


def resolve_design(name: str, catalog: Catalog) -> Design:
    """A catalog design by name, or an ad-hoc Splitwise design written PROMPT_SKU/TOKEN_SKU."""
    if "/" in name:
        prompt_sku, _, token_sku = name.partition("/")
        catalog.machine(prompt_sku)
        catalog.machine(token_sku)
        return Design(name, prompt_sku, token_sku)
    return catalog.design(name)


def resolve_perf_model(path: str | None):
    """The default calibrated model, or a user's file (piecewise-linear tables or coefficients)."""
    from simcore.perfmodel import default_performance_model, load_performance_model
    if path is None:
        return default_performance_model()
    if not Path(path).exists():
        raise InputError(f"performance model file not found: {path}")
    return load_performance_model(path)
