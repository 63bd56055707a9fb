"""simcore: the simulator (workloads, performance model, simulators, SLO metrics).

Public face::

    cluster = Cluster(design, prompt_machines, token_machines)
    result = simulate(cluster, workload, model, perf, catalog, SimOptions())
    report = evaluate_slos(result, slo_profile)

It imports nothing from `provisioner` and knows no CLI, terminal or report files.
"""
from simcore.cluster import Cluster, SimOptions
from simcore.latency import LatencyCurves
from simcore.metrics import SloCheck, SloReport, evaluate_slos
from simcore.simulate import SIMULATOR_VERSION, SimResult, simulate
from simcore.workload import Workload

__all__ = ["Cluster", "SimOptions", "LatencyCurves", "SloCheck", "SloReport", "evaluate_slos",
           "SIMULATOR_VERSION", "SimResult", "simulate", "Workload"]
