"""Cluster description and the per-machine arrays both simulators run on.

Machines are numbered: a Splitwise cluster has its prompt machines first (0..P-1), then its
token machines (P..P+T-1); a baseline cluster has N machines that serve both phases.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hardware_catalog import Design, InputError, MachineSku, ModelSpec
from simcore.latency import LatencyCurves

ROLE_PROMPT, ROLE_TOKEN, ROLE_BOTH = 0, 1, 2


class Stalled(RuntimeError):
    """A simulation is left with requests that no event will ever serve."""


@dataclass(frozen=True)
class Cluster:
    """A design with its machine counts (a baseline uses prompt_machines as its pool size)."""
    design: Design
    prompt_machines: int
    token_machines: int = 0

    def __post_init__(self):
        if self.prompt_machines < 1:
            raise InputError(f"{'machines' if self.design.is_baseline else 'prompt machines'} "
                             f"must be >= 1, got {self.prompt_machines}")
        if self.design.is_baseline and self.token_machines != 0:
            raise InputError(f"design '{self.design.name}' is a baseline: give its pool size "
                             "only, not token machines")
        if not self.design.is_baseline and self.token_machines < 1:
            raise InputError(f"token machines must be >= 1, got {self.token_machines}")

    @property
    def machines(self) -> list[MachineSku]:
        """The machine record of every machine, by machine index."""
        if self.design.is_baseline:
            return [self.design.prompt] * self.prompt_machines
        return ([self.design.prompt] * self.prompt_machines
                + [self.design.token] * self.token_machines)

    @property
    def skus(self) -> list[str]:
        return [m.name for m in self.machines]

    @property
    def cost_per_hour(self) -> float:
        return self.design.cost_per_hour(self.prompt_machines, self.token_machines)

    @property
    def power_kw(self) -> float:
        return self.design.power_kw(self.prompt_machines, self.token_machines)

    @property
    def gpus(self) -> int:
        return self.design.gpus(self.prompt_machines, self.token_machines)


@dataclass(frozen=True)
class SimOptions:
    """Knobs of the simulation semantics (SPEC section 4); defaults follow the paper."""
    prompt_token_limit: int = 2048           # tokens per prompt batch (a longer prompt runs alone)
    mixed_pool: bool | None = None           # None: the design's own setting (on for Splitwise)
    mixed_pool_queue_threshold: int = 8192   # a prompt queue is "long" beyond this many tokens
    layerwise_min_prompt_tokens: int = 512   # serialized KV transfer below, layer-wise from here
    memory_reserve_fraction: float = 0.10    # HBM kept free for activations and fragmentation
    tbt_per_output_token: bool = False       # TBT over output tokens (SplitwiseSim), not gaps
    # machine failures (DejaVu; see simcore.failures): an explicit schedule of
    # (time_s, pool "prompt"|"token"|"any", index in the pool, down_s), and/or random failures
    # from a per-machine MTBF (hours, 0: none) with a repair time, drawn with `failure_seed`
    failures: tuple = ()
    mtbf_hours: float = 0.0
    repair_s: float = 0.0
    failure_seed: int = 0
    detection_s: float = 5.0                 # heartbeat timeout before the loss is acted on
    recovery: str = "restart"                # restart | replicate (KV streamed as generated)
    replica_target: str = "host"             # replicate: remote host memory, or a peer's HBM

    def __post_init__(self):
        if self.prompt_token_limit < 1:
            raise InputError("prompt_token_limit must be >= 1")
        if self.recovery not in ("restart", "replicate"):
            raise InputError("recovery must be restart or replicate")
        if self.replica_target not in ("host", "peer"):
            raise InputError("replica_target must be host or peer")
        if self.detection_s < 0 or self.mtbf_hours < 0 or self.repair_s < 0:
            raise InputError("detection_s, mtbf_hours and repair_s must be >= 0")
        if not 0 <= self.memory_reserve_fraction < 1:
            raise InputError("memory_reserve_fraction must be in [0, 1)")

    @property
    def has_failures(self) -> bool:
        return bool(self.failures) or self.mtbf_hours > 0


@dataclass(frozen=True, eq=False)
class MachineArrays:
    """Everything the simulators need about the machines, as arrays indexed by machine."""
    role: np.ndarray            # ROLE_PROMPT / ROLE_TOKEN / ROLE_BOTH
    kind: np.ndarray            # index into `curves` (one entry per distinct SKU)
    kv_capacity: np.ndarray     # KV tokens that fit in free HBM (int64)
    link_bytes_per_s: np.ndarray
    layerwise_visible_s: np.ndarray
    curves: tuple[LatencyCurves, ...]
    kv_bytes_per_token: int
    layers: int
    mixed_pool: bool
    prompt_token_limit: int
    queue_threshold: int
    layerwise_min_prompt_tokens: int
    chunk_tokens: int = 0       # chunked-prefill budget of the design (0: whole prompts)
    tbt_per_output_token: bool = False
    # failures (simcore.failures): rows (time_s, machine, down_s) sorted by (time, machine), no
    # machine failing while down; empty: no failure code runs at all
    failures: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    detection_s: float = 0.0
    replicate: bool = False     # recovery: False restart, True replicate
    replica_peer: np.ndarray | None = None  # per machine: the peer holding its replicas, -1 host

    @property
    def count(self) -> int:
        return len(self.role)


def kv_capacity_tokens(machine, model: ModelSpec, reserve_fraction: float) -> int:
    """KV tokens that fit beside the weights: GPUs x HBM x (1 - reserve) - weights."""
    free = machine.hbm_bytes * (1.0 - reserve_fraction) - model.weight_bytes
    return max(0, int(free // model.kv_bytes_per_token))


def build_machine_arrays(cluster: Cluster, model: ModelSpec, perf,
                         options: SimOptions) -> MachineArrays:
    skus = cluster.skus
    records = {m.name: m for m in cluster.design.machines()}
    distinct = list(records)
    baseline = cluster.design.is_baseline
    role = np.array([ROLE_BOTH if baseline else (ROLE_PROMPT if i < cluster.prompt_machines
                                                 else ROLE_TOKEN) for i in range(len(skus))],
                    dtype=np.int64)
    mixed = (not baseline) and (cluster.design.mixed_pool if options.mixed_pool is None
                                else options.mixed_pool)
    per_sku = {s: kv_capacity_tokens(records[s], model, options.memory_reserve_fraction)
               for s in distinct}
    capacity = np.array([per_sku[s] for s in skus], dtype=np.int64)
    peer = np.full(len(skus), -1, np.int64)
    if options.has_failures and options.recovery == "replicate" and options.replica_target == "peer":
        # a ring over the decoding machines: each holds its own KV plus its predecessor's replica
        decoders = np.flatnonzero(role != ROLE_PROMPT)
        peer[decoders] = np.roll(decoders, -1)
        capacity[decoders] //= 2
    return MachineArrays(
        role=role,
        kind=np.array([distinct.index(s) for s in skus], dtype=np.int64),
        kv_capacity=capacity,
        link_bytes_per_s=np.array([records[s].kv_link_bytes_per_s for s in skus]),
        layerwise_visible_s=np.array([records[s].kv_layerwise_visible_ms / 1000.0 for s in skus]),
        curves=tuple(perf.curves(model, records[s]) for s in distinct),
        kv_bytes_per_token=model.kv_bytes_per_token, layers=model.layers, mixed_pool=mixed,
        prompt_token_limit=options.prompt_token_limit,
        queue_threshold=options.mixed_pool_queue_threshold,
        layerwise_min_prompt_tokens=options.layerwise_min_prompt_tokens,
        chunk_tokens=cluster.design.chunk_tokens if cluster.design.is_chunked else 0,
        tbt_per_output_token=options.tbt_per_output_token,
        detection_s=float(options.detection_s), replicate=options.recovery == "replicate",
        replica_peer=peer)


def kv_transfer_seconds(prompt_tokens: int, src: int, dst: int, m: MachineArrays) -> float:
    """Time the KV transfer adds before the second token (SPEC 4).

    Serialized below the layer-wise threshold: the whole cache after the prompt, at the slower
    link. Layer-wise: overlapped with the prompt, so only the last layer's share plus the link's
    measured fixed visible time remain.
    """
    size = prompt_tokens * m.kv_bytes_per_token
    bandwidth = min(m.link_bytes_per_s[src], m.link_bytes_per_s[dst])
    if prompt_tokens < m.layerwise_min_prompt_tokens:
        return size / bandwidth
    visible = max(m.layerwise_visible_s[src], m.layerwise_visible_s[dst])
    return visible + size / (m.layers * bandwidth)
