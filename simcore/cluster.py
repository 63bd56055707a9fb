"""Cluster description and the per-instance arrays both simulators run on.

Machines are numbered: a Splitwise cluster has its prompt machines first (0..P-1), then its
token machines (P..P+T-1); a baseline cluster has N machines that serve both phases. Each pool's
layout (`hardware_catalog.Layout`, `simcore.layout`) cuts its machines into instances: pipeline
groups of pp consecutive machines, each holding gpus / tp instances. The simulators schedule
instances (their "machines" are the instances numbered here, prompt pool first); a machine
failure takes down every instance on it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hardware_catalog import Design, InputError, Layout, MachineSku, ModelSpec
from simcore import layout as layouts
from simcore.latency import LatencyCurves

ROLE_PROMPT, ROLE_TOKEN, ROLE_BOTH = 0, 1, 2


# Inter-token latency (ITL: every gap between two output tokens of a request) is kept as a
# histogram, not per gap: the fast core never walks a decode per token. The bins are DDSketch's
# (Masson et al., VLDB 2019): bin i holds the gaps in (floor x g^(i-1), floor x g^i] with
# g = (1 + a) / (1 - a), and reads back as floor x 2 g^i / (g + 1), within a relative error a
# of every gap in it. a = 0.5%, floor 1 us, 2,304 bins reach 10^4 s; both simulators bin alike.
ITL_ACCURACY = 0.005
# Prefix caching's host tier (SimOptions.prefix_host_gb): the bytes/s one GPU loads KV from host
# memory at. PCIe 5.0 x16 carries 64 GB/s per direction raw (PCI-SIG); pinned host-to-device
# copies reach about 50 GB/s of it, the effective rate assumed here (an assumption, not a
# measurement). The catalog has no PCIe figure, so every SKU gets it (A100 machines are PCIe
# 4.0, half of it: their host loads are priced optimistically). An instance loads over all
# its GPUs' links at once (its KV is sharded over them).
HOST_LINK_BYTES_PER_S = 50e9
ITL_GAMMA = (1.0 + ITL_ACCURACY) / (1.0 - ITL_ACCURACY)
ITL_LOG_GAMMA = float(np.log(ITL_GAMMA))
ITL_FLOOR_S = 1e-6
ITL_BINS = 2304


def itl_bin(gap: float) -> int:
    """The histogram bin of a gap of `gap` seconds (compiled into the fast core as it is)."""
    if gap <= ITL_FLOOR_S:
        return 0
    i = int(np.ceil(np.log(gap / ITL_FLOOR_S) / ITL_LOG_GAMMA))
    return i if i < ITL_BINS else ITL_BINS - 1


def itl_bin_values() -> np.ndarray:
    """Each bin's value in seconds (the read-back of any gap in it)."""
    return ITL_FLOOR_S * 2.0 * ITL_GAMMA ** np.arange(ITL_BINS) / (ITL_GAMMA + 1.0)


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
    # pools resized mid-run: ((start_s, prompt machines, token machines), ...) by start time,
    # the counts serving from each start on (baseline: token machines 0); the cluster holds
    # the largest counts; empty: every machine serves throughout
    pool_plan: tuple = ()
    recovery: str = "restart"                # restart | replicate (KV streamed as generated)
    replica_target: str = "host"             # replicate: remote host memory, or a peer's HBM
    # how a restart rebuilds a request's KV: "recompute" (what engines do today, vLLM's
    # recompute preemption) prefills its prompt plus the tokens it generated in one pass;
    # "regenerate" (DejaVu's baseline) prefills its prompt only, then decodes the tokens
    # already sent again, one iteration each, silently (not sent, no inter-token gap)
    restart: str = "recompute"
    # KV admission: "reserve" holds a request's prompt + full output from admission on (the
    # paper's reference implementation); "paged" holds the blocks of its context as generated
    # (vLLM: blocks of kv_block_tokens, a kv_watermark fraction of the blocks left free at
    # admission, recompute preemption of the latest admitted when blocks run out)
    kv_admission: str = "reserve"
    kv_block_tokens: int = 16
    kv_watermark: float = 0.01
    # an iteration without chunks on a machine that has running decodes and waiting prompts:
    # False mixes them (continuous batching: vLLM V1, TensorRT-LLM's in-flight batching, the
    # Splitwise simulator); True runs the prompts alone and the decodes wait (prefill first:
    # SGLang's default scheduler, vLLM V0 and Vidur's vLLM scheduler)
    prefill_first: bool = False
    # prefix caching (issue 41; simcore.refsim "Prefix caching"): each instance keeps the KV
    # blocks of the prompts it prefilled in an LRU cache in its free KV memory, and a prefill
    # computes only the tokens past its longest cached prefix; only workloads that carry prompt
    # blocks (Workload.prefix_blocks: Mooncake traces) can hit
    prefix_cache: bool = False
    prefix_routing: bool = False  # with prefix_cache: route to the longest cached prefix
    # with prefix_cache: each instance's host-memory tier for its cache, GB (1e9 bytes; 0: no
    # tier): blocks evicted from HBM move to a host LRU of this size, and a lookup that
    # continues there loads them back over PCIe (HOST_LINK_BYTES_PER_S per GPU)
    prefix_host_gb: float = 0.0
    # speculative decoding (issue 39; simcore.specdecode.SpecDecode, None: off): the decode
    # curves price its steps, each request's steps drawn with spec_seed
    spec_decode: object = None
    spec_seed: int = 0

    def __post_init__(self):
        if self.kv_admission not in ("reserve", "paged"):
            raise InputError("kv_admission must be reserve or paged")
        if self.kv_block_tokens < 1 or not 0 <= self.kv_watermark < 1:
            raise InputError("kv_block_tokens must be >= 1 and kv_watermark in [0, 1)")
        if self.prompt_token_limit < 1:
            raise InputError("prompt_token_limit must be >= 1")
        if self.recovery not in ("restart", "replicate"):
            raise InputError("recovery must be restart or replicate")
        if self.replica_target not in ("host", "peer"):
            raise InputError("replica_target must be host or peer")
        if self.restart not in ("recompute", "regenerate"):
            raise InputError("restart must be recompute or regenerate")
        if self.detection_s < 0 or self.mtbf_hours < 0 or self.repair_s < 0:
            raise InputError("detection_s, mtbf_hours and repair_s must be >= 0")
        if not 0 <= self.memory_reserve_fraction < 1:
            raise InputError("memory_reserve_fraction must be in [0, 1)")
        if not 0 <= self.prefix_host_gb < float("inf"):
            raise InputError("prefix_host_gb must be a finite number of GB >= 0")

    @property
    def has_failures(self) -> bool:
        return bool(self.failures) or self.mtbf_hours > 0


@dataclass(frozen=True, eq=False)
class MachineArrays:
    """Everything the simulators need about the instances, as arrays indexed by instance (the
    simulators call them machines: with one instance per machine they are)."""
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
    regenerate: bool = False    # a restart: False recompute, True regenerate (SimOptions)
    replica_peer: np.ndarray | None = None  # per machine: the peer holding its replicas, -1 host
    # where the instances are: the machines each spans (one, or pp for a pipeline)
    spans: tuple[tuple[int, ...], ...] = ()
    # pools resized mid-run: rows (time_s, instance, +1 joins | -1 leaves) sorted by (time,
    # instance); empty: every instance serves throughout
    resizes: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    # KV admission (SimOptions.kv_admission): False reserves prompt + output up front; True
    # pages it (blocks of kv_block_tokens as generated, vLLM's watermark, recompute preemption)
    kv_paged: bool = False
    kv_block_tokens: int = 16
    kv_watermark: float = 0.01
    prefill_first: bool = False  # SimOptions.prefill_first
    prefix_cache: bool = False   # SimOptions.prefix_cache
    prefix_routing: bool = False  # SimOptions.prefix_routing
    # the prefix cache's host tier (SimOptions.prefix_host_gb): bytes per instance (0: none),
    # and per instance the host-to-GPU bytes/s its loads take (None: no tier)
    prefix_host_bytes: float = 0.0
    host_link_bytes_per_s: np.ndarray | None = None

    @property
    def count(self) -> int:
        return len(self.role)

    def kv_watermark_tokens(self) -> np.ndarray:
        """Per machine, the KV tokens paged admission leaves free: vLLM's watermark, a fraction
        of its whole blocks (0 when it reserves up front)."""
        if not self.kv_paged:
            return np.zeros(self.count, np.int64)
        blocks = np.asarray(self.kv_capacity, np.int64) // self.kv_block_tokens
        return (blocks * self.kv_watermark).astype(np.int64) * self.kv_block_tokens


def host_cache_blocks(m: MachineArrays, block_tokens: int) -> int:
    """Prefix caching's host tier: the blocks of `block_tokens` tokens each instance's host
    memory holds (0: no tier)."""
    if m.prefix_host_bytes <= 0:
        return 0
    if m.host_link_bytes_per_s is None:
        raise ValueError("a prefix cache host tier needs host_link_bytes_per_s")
    return int(m.prefix_host_bytes // (m.kv_bytes_per_token * block_tokens))


def host_link_integers(m: MachineArrays) -> np.ndarray:
    """Per instance, its host link in whole bytes/s (int64: both simulators price a load as
    float(tokens x KV bytes per token) / float(link), the same on both)."""
    return np.asarray(m.host_link_bytes_per_s, dtype=np.float64).astype(np.int64)


def kv_capacity_tokens(machine, model: ModelSpec, reserve_fraction: float,
                       layout: Layout | None = None) -> int:
    """KV tokens one instance holds beside the weights (the whole machine by default)."""
    return layouts.kv_capacity(model, machine, layout or Layout(machine.instance_tp),
                               reserve_fraction)


def pool_layouts(design: Design, model: ModelSpec, reserve_fraction: float) -> tuple[Layout, ...]:
    """Each pool's layout: the design's, or the whole machine on as few machines as hold the
    model (`simcore.layout.default_layout`) where the design leaves it open."""
    pools = (design.prompt,) if design.is_baseline else (design.prompt, design.token)
    return tuple(chosen if chosen is not None
                 else layouts.default_layout(model, machine, reserve_fraction)
                 for chosen, machine in zip(design.layouts, pools))


def pool_problem(cluster: Cluster, pool_layout: tuple[Layout, ...]) -> str:
    """Why a pool holds no instance at all ("" when every pool holds one)."""
    sizes = (cluster.prompt_machines, cluster.token_machines)
    names = ("machines",) if cluster.design.is_baseline else ("prompt machines", "token machines")
    machines = (cluster.design.prompt, cluster.design.token)
    for size, name, chosen, machine in zip(sizes, names, pool_layout, machines):
        if size < chosen.span(machine):
            return (f"{size} {name} cannot hold one instance of {chosen.label}: it spans "
                    f"{chosen.span(machine)} machines")
    return ""


def instance_spans(cluster: Cluster, pool_layout: tuple[Layout, ...]):
    """(pool of each instance, machines each spans): instances in machine order, a pool's
    groups of `span` machines (a pipeline's stages, an expert-parallel group's machines) each
    holding `instances_per_span` instances (leftover machines idle)."""
    pools, spans, first = [], [], 0
    sizes = (cluster.prompt_machines, cluster.token_machines)
    machines = (cluster.design.prompt, cluster.design.token)
    for pool, (size, chosen) in enumerate(zip(sizes, pool_layout)):
        per_group = chosen.instances_per_span(machines[pool])
        span = chosen.span(machines[pool])
        for group in range(size // span):
            members = tuple(range(first + group * span, first + (group + 1) * span))
            pools += [pool] * per_group
            spans += [members] * per_group
        first += size
    return pools, tuple(spans)


def build_machine_arrays(cluster: Cluster, model: ModelSpec, perf, options: SimOptions,
                         pool_layout: tuple[Layout, ...] | None = None) -> MachineArrays:
    """The instances' arrays; `pool_layout`: the pools' layouts when the caller has them
    (`pool_layouts`)."""
    design = cluster.design
    baseline = design.is_baseline
    pool_layout = pool_layout or pool_layouts(design, model, options.memory_reserve_fraction)
    pools, spans = instance_spans(cluster, pool_layout)
    records = (design.prompt, design.token)
    kinds = list(dict.fromkeys((records[p].name, pool_layout[p]) for p in pools))
    kind = np.array([kinds.index((records[p].name, pool_layout[p])) for p in pools],
                    dtype=np.int64)
    by_name = {m.name: m for m in design.machines()}
    role = np.array([ROLE_BOTH if baseline else (ROLE_PROMPT, ROLE_TOKEN)[p] for p in pools],
                    dtype=np.int64)
    mixed = (not baseline) and (design.mixed_pool if options.mixed_pool is None
                                else options.mixed_pool)
    per_kind = [layouts.kv_capacity(model, by_name[name], chosen, options.memory_reserve_fraction)
                for name, chosen in kinds]
    capacity = np.array([per_kind[k] for k in kind], dtype=np.int64)
    # an instance sends KV over its own GPUs' links (every GPU has its own NIC)
    link = np.array([by_name[name].kv_link_gbps * 1e9 / 8.0 * chosen.gpus
                     for name, chosen in kinds])[kind]
    visible = np.array([by_name[name].kv_layerwise_visible_ms / 1000.0
                        for name, _ in kinds])[kind]
    host_link = np.array([HOST_LINK_BYTES_PER_S * chosen.gpus for _, chosen in kinds])[kind]
    peer = np.full(len(pools), -1, np.int64)
    if options.has_failures and options.recovery == "replicate" and options.replica_target == "peer":
        # a ring over the decoding instances, each holding its own KV plus its predecessor's
        # replica; the peer is on another machine where there is one (a machine failure takes
        # both of its instances' copies)
        decoders = np.flatnonzero(role != ROLE_PROMPT)
        step = next((i for i in range(1, len(decoders))
                     if not set(spans[decoders[i]]) & set(spans[decoders[0]])), 1)
        peer[decoders] = np.roll(decoders, -step)
        capacity[decoders] //= 2
    return MachineArrays(
        role=role, kind=kind, kv_capacity=capacity, link_bytes_per_s=link,
        layerwise_visible_s=visible,
        curves=tuple(_spec_curves(layouts.curves(perf, model, by_name[name], chosen), options)
                     for name, chosen in kinds),
        kv_bytes_per_token=model.kv_bytes_per_token,
        layers=model.layers, mixed_pool=mixed,
        prompt_token_limit=options.prompt_token_limit,
        queue_threshold=options.mixed_pool_queue_threshold,
        layerwise_min_prompt_tokens=options.layerwise_min_prompt_tokens,
        chunk_tokens=design.chunk_tokens if design.is_chunked else 0,
        tbt_per_output_token=options.tbt_per_output_token,
        detection_s=float(options.detection_s), replicate=options.recovery == "replicate",
        regenerate=options.restart == "regenerate",
        replica_peer=peer, spans=spans, kv_paged=options.kv_admission == "paged",
        kv_block_tokens=int(options.kv_block_tokens), kv_watermark=float(options.kv_watermark),
        prefill_first=bool(options.prefill_first), prefix_cache=bool(options.prefix_cache),
        prefix_routing=bool(options.prefix_cache and options.prefix_routing),
        prefix_host_bytes=float(options.prefix_host_gb) * 1e9 if options.prefix_cache else 0.0,
        host_link_bytes_per_s=host_link)


def _spec_curves(curves: LatencyCurves, options: SimOptions) -> LatencyCurves:
    """The curves of a speculative run's steps (`LatencyCurves.with_spec_decode`), or as
    they are."""
    spec = options.spec_decode
    if spec is None:
        return curves
    from simcore.specdecode import CONTEXT_UNITS
    return curves.with_spec_decode(spec.tokens, spec.draft_fraction, CONTEXT_UNITS)


def instance_failures(machine_rows: np.ndarray, spans) -> np.ndarray:
    """Machine failure rows (time_s, machine, down_s) as instance rows: each failure takes down
    every instance on the machine; an instance spanning machines is down while any of them is
    (overlapping outages merged), so no instance fails while it is down."""
    on_machine = _instances_on(spans)
    outages: dict[int, list[list[float]]] = {}
    for t, machine, down in sorted(map(tuple, machine_rows)):
        for instance in on_machine.get(int(machine), ()):
            runs = outages.setdefault(instance, [])
            if runs and t < runs[-1][1]:
                runs[-1][1] = max(runs[-1][1], t + down)
            else:
                runs.append([t, t + down])
    rows = sorted((start, instance, end - start)
                  for instance, runs in outages.items() for start, end in runs)
    return np.array(rows, dtype=np.float64).reshape(-1, 3)


def _instances_on(spans) -> dict[int, list[int]]:
    """machine -> the instances it holds a part of."""
    on_machine: dict[int, list[int]] = {}
    for instance, members in enumerate(spans):
        for machine in members:
            on_machine.setdefault(machine, []).append(instance)
    return on_machine


def plan_resizes(cluster: Cluster, plan) -> np.ndarray:
    """Machine rows (time_s, machine, +1 joins | -1 leaves) of a pool plan (`SimOptions.
    pool_plan`): the lowest indices of each pool serve, so a pool of n machines is machines
    0..n-1 of it; machines beyond the first step's counts leave at its start."""
    starts = [float(row[0]) for row in plan]
    if starts != sorted(starts) or len(set(starts)) != len(starts):
        raise InputError("a pool plan's start times must increase")
    sizes = (cluster.prompt_machines, cluster.token_machines)
    for _, *counts in plan:
        if any(not 0 <= int(n) <= size for n, size in zip(counts, sizes)) or int(counts[0]) < 1:
            raise InputError(f"a pool plan step asks for {int(counts[0])}+{int(counts[1])} "
                             f"machines; the cluster has {sizes[0]}+{sizes[1]}")
        if not cluster.design.is_baseline and int(counts[1]) < 1:
            raise InputError("a pool plan step leaves the token pool empty")
    rows = []
    serving = sizes
    for start, *counts in plan:
        for pool, (before, after) in enumerate(zip(serving, map(int, counts))):
            first = 0 if pool == 0 else sizes[0]
            for index in range(min(before, after), max(before, after)):
                rows.append((start, first + index, 1 if after > before else -1))
        serving = tuple(map(int, counts))
    rows.sort()
    return np.array(rows, dtype=np.float64).reshape(-1, 3)


def instance_resizes(machine_rows: np.ndarray, spans) -> np.ndarray:
    """Machine resize rows as instance rows: an instance serves while every machine it spans
    does (a pipeline needs all its stages)."""
    on_machine = _instances_on(spans)
    present: dict[int, bool] = {}
    rows = []
    for t, machine, change in machine_rows:
        present[int(machine)] = change > 0
        for instance in on_machine.get(int(machine), ()):
            rows.append((t, instance, 1 if all(present.get(m, True) for m in spans[instance])
                         else -1))
    # one row per instance and instant (its state after that instant's changes)
    last = {(t, i): change for t, i, change in rows}
    return np.array(sorted((t, i, c) for (t, i), c in last.items()),
                    dtype=np.float64).reshape(-1, 3)


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
