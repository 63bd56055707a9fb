"""`PerformanceModel`: the contract every performance model answers.

What the simulators and the search ask of a performance model, and nothing more: a pair's
`LatencyCurves` at a tensor-parallel degree (`simcore.layout.curves`, which both simulators,
`simcore.longrun` and the search's layout bounds call), and whether those latencies are
measured (`provisioner.api.uncalibrated_skus`, `provisioner.sensitivity`). The curves answer
the per-iteration questions (`prompt_time`, `token_time`, `mixed_time`, `chunk_extra`).

Implementations:

- `simcore.perfmodel.FittedPerformanceModel`: the 2023 Splitwise profiles' fit (the default),
  coefficients `provision calibrate` fitted, and a user's latency tables (`simcore.perftables`);
- `simcore.kernels.KernelPerformanceModel`: iterations composed from measured kernel tables;
- `simcore.kernels.EnginePerformanceModel`: an engine's kernel model, the 2023 fit elsewhere;
- `simcore.enginecalib.CalibratedEngineModel`: that, with overheads and per-phase scales
  `provision calibrate` fitted to serving benchmarks on one (model, machine) pair;
- `simcore.splitwise_sim.SplitwiseSimPerformance`: the paper simulator's 2023 curves;
- `provisioner.study._Scaled`: any of these with every latency scaled (`--sensitivity`).

This module imports nothing at run time, so every implementation can declare it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from hardware_catalog import MachineSku, ModelSpec
    from simcore.latency import LatencyCurves

__all__ = ["PerformanceModel"]


@runtime_checkable
class PerformanceModel(Protocol):
    """Iteration latencies of a model on a machine. Implementations cache per pair: the fast
    core stacks curve objects and the reference prices requests once per curve object."""

    def curves(self, model: ModelSpec, machine: MachineSku,
               tp: int | None = None) -> LatencyCurves:
        """The pair's latency curves in seconds at tensor-parallel degree `tp` (the whole
        machine when None), the machine's power cap applied to prompt latencies. Raises
        `InputError` when the model cannot price the pair (the search then skips the layout)."""
        ...

    def is_calibrated(self, model: ModelSpec, machine: MachineSku,
                      tp: int | None = None) -> bool:
        """Whether the pair's latencies are measured (kernel tables, a table or coefficients
        fitted to this pair) rather than scaled from another pair by datasheet ratios; the
        report marks the others uncalibrated."""
        ...

    def prices_expert_parallelism(self, model: ModelSpec, machine: MachineSku) -> bool:
        """Whether `expert_parallel_curves` can answer for the pair at all (the search tries
        expert-parallel layouts only then, and says nothing of them otherwise)."""
        return False

    def expert_parallel_curves(self, model: ModelSpec, machine: MachineSku,
                               layout) -> LatencyCurves:
        """The latency curves of one attention rank of an expert-parallel layout
        (`hardware_catalog.Layout` with ep > 1). Only models with measured MoE layers at
        expert parallelism and measured all-to-all (the kernel tables) can; the others
        refuse, and the search skips the layout with this reason."""
        from hardware_catalog import InputError
        raise InputError(f"the {type(self).__name__} latencies cannot price expert "
                         f"parallelism ({layout.label}); the kernel tables (--engine) can")
