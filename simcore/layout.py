"""Instance layouts: which (tp, pp) a pool may use, what an instance holds and how fast it runs.

A pool is N machines of one SKU; its `Layout` cuts them into instances of `tp` GPUs of one
machine, each spanning `pp` machines (pipeline stages). The simulators see instances only:
`simcore.cluster` numbers them, and everything an instance needs comes from here.

Memory. An instance's GPUs hold the weights (weights / (tp x pp) per GPU) and the reserve
(a fraction of HBM for activations and fragmentation); what is left holds KV. When TP exceeds
the model's KV heads, each KV head is stored on tp / kv_heads GPUs (a GPU holds at least one
head), so a token's KV costs that much more of the instance's memory; an MLA model's latent (one
vector for all heads) is held by every tensor-parallel GPU. Sliding-window layers (gpt-oss)
hold at most their window per request: an instance keeps room for WINDOW_SEQUENCES requests'
windows and counts the full-attention layers per token. A layout fits when its
KV room holds at least one of the longest request (prompt + output) the workload has.

Pipelines. An instance of pp > 1 runs one iteration at a time through its stages (no
micro-batch interleaving): an iteration costs the tensor-parallel compute of every layer, as at
pp = 1, plus pp - 1 stage hops (the activations of the iteration's tokens, hidden x 2 bytes
each, sent by every TP rank over its own machine link, plus a fixed hop latency). This is
exact for latency and a lower bound on a pipeline's throughput: each stage idles while the
others run (the decode bubble), which micro-batching would partly fill.
"""
from __future__ import annotations

import weakref
from dataclasses import replace

from hardware_catalog import InputError, Layout, MachineSku, ModelSpec
from simcore.latency import LatencyCurves

# The expert-parallel groups a search tries (issue 36): tensor-parallel attention over the
# group at each TP of a machine (TEP), and one-GPU data-parallel attention ranks (DEP) over
# groups of these sizes, within a machine or across machines (engines' common deployments:
# DEP 8 to 64; DeepSeek's published decode runs EP 144, prefill EP 32).
EXPERT_PARALLEL_SIZES = (8, 16, 32, 64)
PIPELINE_HOP_S = 20e-6        # one stage hop's fixed latency (an RDMA send and its completion)
ACTIVATION_BYTES = 2          # bf16 hidden states between stages
MAX_PIPELINE = 8              # the deepest pipeline a search tries


# Sliding-window layers (gpt-oss) hold at most their window per request: the instance keeps
# room for the windows of this many running requests (vLLM's max_num_seqs on large GPUs) and
# counts the full-attention layers' KV per token (issue 36).
WINDOW_SEQUENCES = 1024


def kv_replicas(model: ModelSpec, layout: Layout) -> float:
    """Copies of one token's KV in an instance: KV heads replicated when TP exceeds them; an
    MLA model's latent (one vector for all heads) on every tensor-parallel GPU."""
    if model.is_mla:
        return float(layout.tp)
    return max(1.0, layout.tp / model.kv_heads)


def kv_bytes_per_token(model: ModelSpec, layout: Layout) -> float:
    """One token's KV in an instance (its full-attention layers, all copies)."""
    return model.kv_bytes_per_token * kv_replicas(model, layout)


def window_reserve_bytes(model: ModelSpec, layout: Layout) -> float:
    """HBM an instance keeps for its requests' sliding-window KV (0 without such layers)."""
    return WINDOW_SEQUENCES * model.window_kv_bytes * kv_replicas(model, layout)


def instance_weight_bytes(model: ModelSpec, layout: Layout) -> float:
    """Weights one instance's GPUs hold: all of them, split over its GPUs; under expert
    parallelism, an attention rank's GPUs each hold the non-expert weights split by TP (every
    rank has a copy) and experts / ep whole experts."""
    if layout.ep == 1:
        return model.weight_bytes
    experts = model.expert_weight_bytes
    return (model.weight_bytes - experts) + experts * layout.tp / layout.ep


def kv_capacity(model: ModelSpec, machine: MachineSku, layout: Layout,
                reserve_fraction: float) -> int:
    """KV tokens one instance holds beside its share of the weights."""
    hbm = layout.gpus * machine.hbm_gib * 2**30
    free = hbm * (1.0 - reserve_fraction) - instance_weight_bytes(model, layout)
    if model.sliding_layers:
        free -= window_reserve_bytes(model, layout)
    return max(0, int(free // kv_bytes_per_token(model, layout)))


def fit_problem(model: ModelSpec, machine: MachineSku, layout: Layout, reserve_fraction: float,
                longest_request: int = 1) -> str:
    """Why the layout cannot serve the model on the machine ("" when it can)."""
    problem = layout.problem(machine)
    if problem:
        return problem
    if layout.tp > 1 and model.heads % layout.tp:
        return f"{model.heads} attention heads do not split over TP {layout.tp}"
    if layout.ep > 1 and not model.is_moe:
        return f"{model.name} has no experts to spread over EP {layout.ep}"
    if layout.ep > 1 and model.experts % layout.ep:
        return f"{model.experts} experts do not split over EP {layout.ep}"
    capacity = kv_capacity(model, machine, layout, reserve_fraction)
    if capacity < max(1, longest_request):
        per_gpu = instance_weight_bytes(model, layout) / layout.gpus / 1e9
        return (f"{per_gpu:.1f} GB of weights per GPU leave room for {capacity} KV tokens, "
                f"fewer than the longest request's {longest_request}")
    return ""


def fewest_machines(model: ModelSpec, machine: MachineSku, tp: int, reserve_fraction: float,
                    longest_request: int = 1) -> Layout | None:
    """The layout of `tp` GPUs on as few machines as hold the model (None: not within
    MAX_PIPELINE machines)."""
    return next((Layout(tp, pp) for pp in range(1, MAX_PIPELINE + 1)
                 if not fit_problem(model, machine, Layout(tp, pp), reserve_fraction,
                                    longest_request)), None)


def default_layout(model: ModelSpec, machine: MachineSku, reserve_fraction: float,
                   longest_request: int = 1) -> Layout:
    """The whole machine per instance (tp = its `instance_tp`: all its GPUs up to 8), on as few machines as hold the model:
    the layout of a design whose layout is not given (and of the SLO reference machine)."""
    return (fewest_machines(model, machine, machine.instance_tp, reserve_fraction,
                            longest_request)
            or Layout(machine.instance_tp, 1))   # nothing fits: the simulation reports why


def curves(perf, model: ModelSpec, machine: MachineSku, layout: Layout) -> LatencyCurves:
    """The instance's iteration latencies: the performance model's at the layout's TP, plus
    the pipeline's stage hops (linear in the iteration's tokens, so exact on the knots); an
    expert-parallel layout's, the performance model's for one attention rank."""
    if layout.ep > 1:
        return perf.expert_parallel_curves(model, machine, layout)
    base = perf.curves(model, machine, layout.tp)
    if layout.pp == 1:
        return base
    # one object per (base curves, pipeline): the fast core stacks curves, and simulate
    # prices the reference's requests, once per curve object, not once per simulation
    known = _PIPELINED.setdefault(base, {})
    key = (layout.pp, model.hidden, machine.kv_link_gbps)
    if key not in known:
        known[key] = _with_hops(base, model, machine, layout)
    return known[key]


_PIPELINED: "weakref.WeakKeyDictionary[LatencyCurves, dict]" = weakref.WeakKeyDictionary()


def _with_hops(base: LatencyCurves, model: ModelSpec, machine: MachineSku,
               layout: Layout) -> LatencyCurves:
    hops = layout.pp - 1
    per_token = ACTIVATION_BYTES * model.hidden / (machine.kv_link_gbps * 1e9 / 8.0)

    def hop(tokens):
        return hops * (PIPELINE_HOP_S + per_token * tokens)

    return replace(base, prompt_seconds=base.prompt_seconds + hop(base.prompt_tokens),
                   decode_seconds=base.decode_seconds + hop(base.decode_batch))


def latency_problem(perf, model: ModelSpec, machine: MachineSku, layout: Layout) -> str:
    """Why the performance model cannot price the layout ("" when it can)."""
    try:
        curves(perf, model, machine, layout)
    except InputError as err:
        return str(err)
    return ""


def candidate_layouts(model: ModelSpec, machine: MachineSku, perf, reserve_fraction: float,
                      longest_request: int, tp: int | None = None, pp: int | None = None,
                      ep: int | None = None):
    """(layouts to search, [(layout, why it is skipped)]) for one pool.

    Every TP that divides the machine's GPUs up to its `instance_tp` (or the pinned one)
    within one machine, and for a mixture of experts its expert-parallel layouts
    (`expert_parallel_layouts`); only when
    the model fits no instance of one machine, each TP at the smallest pipeline depth that
    holds it (or the pinned depth). A pipeline adds hops and its bubble to every iteration, so
    it is a way to hold a model, not to serve one faster. A pinned `ep` > 1 is the one
    expert-parallel layout of `tp`-GPU attention ranks (1 GPU when TP is not pinned); `ep` 1,
    the TP and PP layouts only.
    """
    if ep is not None and ep > 1:
        rank = tp or 1
        layout = Layout(rank, ep=ep, dp=ep // rank)
        problem = (fit_problem(model, machine, layout, reserve_fraction, longest_request)
                   or latency_problem(perf, model, machine, layout))
        return ([], [(layout, problem)]) if problem else ([layout], [])
    tps = [tp] if tp else [t for t in range(1, machine.instance_tp + 1) if machine.gpus % t == 0]
    chosen, skipped = [], []
    for t in tps:
        first = Layout(t, pp or 1)
        problem = first.problem(machine) or latency_problem(perf, model, machine, first)
        if problem:
            skipped.append((first, problem))
            continue
        why = fit_problem(model, machine, first, reserve_fraction, longest_request)
        layout = (None if why and pp else
                  first if not why else
                  fewest_machines(model, machine, t, reserve_fraction, longest_request))
        if layout is None:
            deeper = "" if pp else f" (nor over up to {MAX_PIPELINE} machines)"
            skipped.append((first, why + deeper))
            continue
        chosen.append(layout)
        if layout != first:   # say why the one-machine instance does not do
            skipped.append((first, f"{why}; runs as {layout.label}"))
    if not pp and ep is None:   # expert parallelism holds a MoE model without a pipeline
        experts, why_not = expert_parallel_layouts(model, machine, perf, reserve_fraction,
                                                   longest_request, tp)
        chosen += experts
        skipped += why_not
    if not pp and any(layout.pp == 1 for layout in chosen):
        for layout in [c for c in chosen if c.pp > 1]:
            chosen.remove(layout)
            skipped = [(s, why.replace(f"; runs as {layout.label}", "; a pipeline is only "
                                       "searched for a model one machine cannot hold"))
                       if s.tp == layout.tp else (s, why) for s, why in skipped]
    return chosen, skipped


def expert_parallel_candidates(model: ModelSpec, machine: MachineSku,
                               tp: int | None = None) -> list[Layout]:
    """The expert-parallel layouts a search tries for a MoE model (none for a dense one):
    TEP at every TP of the machine above 1, DEP of one-GPU ranks (of `tp`-GPU ranks when TP
    is pinned) over EXPERT_PARALLEL_SIZES; each where the experts split evenly."""
    if not model.is_moe:
        return []
    tps = [tp] if tp else [t for t in range(2, machine.instance_tp + 1)
                           if machine.gpus % t == 0]
    tep = [Layout(t, ep=t) for t in tps if t > 1]
    rank = tp or 1
    dep = [Layout(rank, ep=e, dp=e // rank) for e in EXPERT_PARALLEL_SIZES
           if e > rank and e % rank == 0]
    return [layout for layout in tep + dep if model.experts % layout.ep == 0
            and not layout.problem(machine)]


def expert_parallel_layouts(model: ModelSpec, machine: MachineSku, perf,
                            reserve_fraction: float, longest_request: int,
                            tp: int | None = None):
    """(expert-parallel layouts to search, [(layout, why it is skipped)]); none where the
    performance model cannot price expert parallelism at all."""
    chosen, skipped = [], []
    if not perf.prices_expert_parallelism(model, machine):
        return chosen, skipped
    for layout in expert_parallel_candidates(model, machine, tp):
        problem = (fit_problem(model, machine, layout, reserve_fraction, longest_request)
                   or latency_problem(perf, model, machine, layout))
        if problem:
            skipped.append((layout, problem))
        else:
            chosen.append(layout)
    return chosen, skipped
