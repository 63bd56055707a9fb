"""Reference simulator: a plain-Python event loop that advances iteration by iteration.

It is written to be obviously correct, not fast; the fast core (`simcore.fastsim`) must agree
with it request by request. The semantics both implement (SPEC section 4):

Time advances to the earliest pending event. All events at the same instant are handled in a
fixed order: (1) iterations that end, by machine index; (2) KV caches that arrive at their token
machine, by (time, request index); (3) requests that arrive, by request index; (4) every idle
machine with work starts its next iteration, by machine index.

Routing happens on arrival (both machines at once). Splitwise: the prompt machine with the fewest
pending prompt tokens and the token machine with the fewest committed KV tokens (prompt + output
tokens of the unfinished requests routed to it); ties go to the lowest index. Baseline: the
machine with the least load (pending prompt tokens + committed KV tokens) does both phases.
With the mixed pool (Splitwise only): a prompt machine is *long* when it has queued prompts and
its pending tokens plus the new prompt exceed the threshold; a token machine is *loaded* when the
request's KV reservation would exceed its capacity. The router tries its own pool's best machine,
then the best machine already in the mixed pool, then moves the best machine of the other pool
into the mixed pool (for prompt work the token machine with the fewest committed tokens, for token
work the prompt machine with the fewest committed tokens that can hold the request); failing all
that, both phases run on the least-loaded machine that can hold the request. The prompt side is
decided first. A mixed-pool machine returns to its pool after an iteration that leaves it without
work of the other kind.

An iteration: first admit waiting decodes (FCFS, stop at the first whose reservation of prompt +
output tokens does not fit), then take queued prompts from the head while their tokens stay
within the prompt token limit (the first always fits the limit). A prompt's KV is held on the
machine that computes it: a prompt that will decode on this machine reserves its prompt + output
tokens, one that decodes elsewhere its prompt tokens, released when its KV cache has arrived at
the token machine; if that does not fit, the queue waits. Prompt-only iterations cost
prompt_time(tokens); decode-only token_time(batch, context); both mixed_time; chunk extras come
on top, and then the engine's host time (`LatencyCurves.with_host`, per iteration and per
sequence in it: each prompt, chunk and decode). At its end every
prompt yields its first token, every decode one more token; finished requests free their memory.
A prompt whose decode runs elsewhere starts its KV transfer then; the second token can come no
earlier than the transfer's end.

KV admission (`SimOptions.kv_admission`). "reserve" (the paper's reference implementation, the
default): as above, a decode holds its prompt + output tokens from admission on. "paged" (vLLM's
scheduler, `kv_block_tokens` 16, `kv_watermark` 0.01): a machine's KV is counted in blocks of
16 tokens; a running decode holds the blocks of its context (prompt + tokens generated, the
latest one included: its KV is computed by its next iteration), a prompt the blocks of its
prefill from its first piece (until transferred when it decodes elsewhere). Admission (waiting
decodes, then prompts, FCFS as above) takes what fits below the capacity less the watermark (a
whole-block share of it; waived on a machine that holds nothing). Each iteration end adds a
block for every decode whose new token starts one (memory may exceed the capacity until the
next start). An iteration starts by preempting: while the machine's blocks exceed its capacity,
its most recently admitted running decode (never the last one; a local prompt counts as admitted
when its prefill ends) loses its KV (recompute, vLLM's default) and goes back to the front of
that machine's prompt queue (behind a partly prefilled prompt), its prefill now its prompt plus
the tokens it generated; an iteration that preempted admits nothing and runs the decodes left.
The preempted request is recomputed on the machine that preempted it, a Splitwise token machine
included (as a prompt there: whole, or chunked when it has running decodes), as a restart
recomputes after a failure: the prefill yields no token, the next decode its next one, so the
gap to it includes the stall and the recompute; nothing is sent twice. Swapping to host memory
is not modelled. Each machine counts the decodes it preempted (result `preemptions`).

Prefill first (`SimOptions.prefill_first`; SGLang's scheduler, vLLM V0): an iteration without
chunks that takes prompts on a machine with running decodes runs the prompts alone; the decodes
gain no token and their next gap spans it. Otherwise (vLLM V1, TensorRT-LLM, the paper's
simulator) the prompts and the decodes share the iteration.

Chunked prefill (designs with prefill: chunked; Sarathi-Serve's stall-free batching): a machine
runs a chunked iteration when it serves both phases (a baseline machine) or, on a Splitwise
design, when it has running decodes or a partially prefilled prompt (a mixed-pool machine, or
the fallback); otherwise it batches whole prompts as above. A chunked iteration admits waiting
decodes as above and runs every running decode (stall-free), then takes prompt work from the
head of the queue within what the running decodes leave of a budget of `chunk_tokens` tokens
(Sarathi-Serve's Algorithm 3: the decodes' tokens count first; with as many decodes as the
budget, no prompt work joins): the ongoing partially prefilled prompt (always the head)
continues, then new prompts join, each with the largest piece that fits the leftover budget; a prompt's KV is held from its first piece on (as above: its
reservation, or its prompt tokens until transferred), and if that does not fit the queue waits.
A prompt whose last piece is not in the iteration stays at the head of its queue (still counted
as queued); pending prompt tokens fall by each piece at the end of its iteration. The iteration
costs the same as a mixed or prompt iteration over the pieces' tokens plus
`chunk_extra(piece, prefilled before it)` per piece (`simcore.latency`). A prompt yields its first
token when its last piece ends. A failure loses the prefilled pieces (a restart prefills anew).

Inter-token latency (ITL): every output token after a request's first ends a gap, from the
request's previous output token to the end of the iteration that produced it (a decode's first
gap on its token machine includes the KV transfer and any wait for memory; a gap across a
failure includes the loss and the recovery; a token regenerated after a loss, not sent again,
ends none). Each gap is counted in a histogram with
`simcore.cluster.itl_bin`.

Speculative decoding (`steps`, `simcore.specdecode`; none by default): a request's decodes
are counted in steps. Its `output` here is its steps + 1 (the first token, then S steps, each
emitting 1..k+1 tokens, drawn before the run), its reservation stays prompt + output tokens,
and its context after g >= 1 units is CONTEXT_UNITS x (prompt + 1) + context_rate x (g - 1),
in 1/CONTEXT_UNITS tokens (its mean tokens per step each step). The curves price the steps
(`LatencyCurves.with_spec_decode`; a decode puts `decode_query_tokens` tokens into a mixed pass
and into the chunk budget). Everything above reads "token" of a decode as "step": the tokens of
one step reach the client together, so each step ends one inter-token gap. Where KV counts
tokens (paged blocks, the prefill of a preempted or restarted request, a replica restored,
tokens recomputed) a request of L output tokens in S steps holds after g >= 1 units prompt + 1
+ floor((L - 1)(g - 1) / S) tokens (`_Request.kv_after`: the path its context follows, 1..k+1
tokens a step, prompt + L after its last); without speculative decoding, prompt + g.

Prefix caching (`SimOptions.prefix_cache`; only with a workload that carries prompt blocks,
`Workload.prefix_blocks`: a dense id per `prefix_block_tokens` tokens of the prompt, an id
standing for its whole prefix): every machine keeps an LRU cache of block ids, the KV of prompts
it prefilled. Its room is (capacity - KV held by its admitted requests) // block tokens, taken
from the memory count at that moment (never below 0), and it is trimmed to its room (least
recently used first) just before each lookup and just after each insertion, and only then (so
a block in the cache also held by a running request counts twice: a simplification). A lookup
is made when a prompt is taken into an iteration (after its KV hold is added: whole prompts as
they join, a chunked prompt at its first piece): the longest run of its leading blocks in the
cache is a hit of min(blocks x block tokens, prefill - 1) tokens (a prefill computes at least
one token); those blocks become most recently used (the first one last, so a prefix outlives
its own tail), its pending prompt tokens fall by the hit at once, and its prefill computes
only the rest: whole, an iteration is priced with the uncached tokens (attention over the
cached prefix is not priced; the prompt token limit still counts whole prompts); chunked, its
pieces start after the hit (`prefilled` starts there, so `chunk_extra` prices the attention
over the cached prefix). When its prefill ends, every block of its prompt (a recompute's too:
blocks cover the prompt only) is inserted or refreshed, last block first, so the first ends
most recently used. A machine that fails loses its cache. Each machine counts the tokens its
lookups hit and the prefill tokens looked up (results `prefix_hit_tokens`, `prefix_tokens`),
and so does each request over its lookups (`request_hit_tokens`, `request_looked_up`: a
recompute looks up again; the hit rate of the requests arriving in a window is their ratio);
a hit rate is their ratio. Prefix-aware routing (`SimOptions.prefix_routing`, with the cache):
a request's cached prefix on a machine is the hit a lookup there would find now (the longest
run of its leading blocks in the cache as it is, nothing trimmed or refreshed: min(blocks x
block tokens, prefill - 1)); a baseline routes to the machine with the smallest load (pending
+ committed tokens) minus that prefix among those that can hold it, a Splitwise prompt side
takes its own pool's machine with the fewest pending tokens minus that prefix (then as
before: the mixed pool when that one's queue is long); ties go to the lowest index. Without
a cached prefix anywhere, that is the choice without it. The fallback, the token side and
recoveries route as without it.

Host tier (`MachineArrays.prefix_host_bytes` > 0, with the cache): every machine also keeps a
host LRU of H = host bytes // (KV bytes per token x block tokens) blocks (`host_cache_blocks`);
a block is in the cache (HBM) or in the host tier, never both. Each block a trim evicts
becomes the host's most recently used, in eviction order, and then the host evicts its least
recently used down to H. A lookup's run is the leading blocks in HBM (k) then the next blocks
in the host tier (h); all k + h become most recently used in HBM as above (the host ones
leave the host tier), the hit is min((k + h) x block tokens, prefill - 1), its host part is
the hit less min(k x block tokens, hit), and when h > 0 the cache is trimmed again and the
host part is loaded: the iteration that takes the prompt waits for the host tokens of all
the lookups it made, their KV bytes (tokens x KV bytes per token) over the host link
(`host_link_bytes_per_s`, whole bytes/s), added after its chunk extras, before the host
time. An insertion's blocks leave the host tier.
Prefix-aware routing's cached prefix counts both runs. A machine that fails loses its host
tier. Each machine counts its hits' host part (result `prefix_host_hit_tokens`, only with a
tier).

A KV cache that arrives at its token machine (step (2): a transfer, a retarget or a replica
restored) seeds that machine's cache: its prompt's blocks enter (or are refreshed, leaving
the host tier) as in an insertion, last first, and then the cache is trimmed as above but
to the room of the machine's whole KV capacity (capacity // block tokens, whatever it holds:
the fast core's memory count may lag at that instant); the next lookup or insertion trims to
its free memory. So a cache never holds more than its capacity's blocks (plus its host tier's)
after any step, and the fast core keeps each cache in a pool of slots of that size.

Closed loop (`Workload.closed`, `simcore.workload.ClosedLoop`; open by default, arrivals as
given): N users each send a request, wait for its last token, think, and send the next. The
first N requests arrive at time 0; when request k finishes at t (in step (1)), its user's next
request is pending, to arrive at t + think_k (think_k drawn before the run). Requests are
numbered in arrival order: the next request arrives at the earliest pending time (ties: the
times are equal, so which user sends it does not matter), and takes the next sizes. A user
sent at the instant its request finished (think 0) arrives in step (3) of that instant. The
run ends when every request has arrived and finished; pending users then send nothing. Not
with failures or pool resizes.

Pools resized mid-run (only when `machines.resizes` has rows: a plan's changes of pool size,
`simcore.cluster.plan_resizes`): after step (2), at the same instant, (2r) machines leave and
join their pools, by index. A machine that leaves takes no new request (the router and the
mixed pool never pick it) but finishes everything it holds, and then sits idle: it has left.
A machine that joins can be picked from that instant on (its provisioning delay has passed:
a plan orders it that long before). With prefix caching a machine that joins starts with an
empty cache, HBM and host tier (it was off, or it was just provisioned): what a machine that
left cached, while draining too, is lost.

Failures (only when `machines.failures` has rows; DejaVu, SPEC 4): after step (2), at the same
instant, (2a) machines whose repair ends rejoin their pools empty, by index; (2b) machines fail,
by index: the iteration in flight is lost, and so is every request whose work or KV was on the
machine (queued or computing prompts, KV caches sent from it still in flight, decodes waiting or
running there). The router never picks a down machine. Lost requests are acted on when the
failure is detected (`detection_s` later), in step (2c), by (time, request): `restart` sends the
request back to the router, which re-prefills its prompt plus the tokens it already generated
(no token is produced again; its first token stays) when restarts recompute (the default, what
engines do today), or its prompt only when they regenerate (DejaVu's baseline): the prefill
yields its first token again and decodes then produce the tokens already sent once more, one
an iteration, silently (not sent: they end no inter-token gap and move no TTFT; `emitted`, the
most tokens it ever generated, survives further losses); the first token beyond those sent
ends the gap from the last one sent. Tokens recomputed: the prefill's, plus under regenerate
the decode tokens regenerated (emitted - 1); `replicate` restores a decoding request's
KV (prompt + generated tokens, replicated as generated, to remote host memory or to the peer
machine of a ring) on a token machine chosen as on arrival, taking size / link bandwidth, and
restarts it as above when the replica is gone (peer down or repaired since) or the KV never
reached a token machine. A KV cache in flight to a machine that failed, or whose prompt ended
after its token machine failed, stays on its prompt machine and is sent to a newly chosen token
machine at detection. A request the router cannot place (every machine that could hold it is
down) waits for the next repair.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from simcore.cluster import (ITL_BINS, ROLE_BOTH, ROLE_PROMPT, ROLE_TOKEN, MachineArrays,
                             Stalled, host_cache_blocks, host_link_integers, itl_bin,
                             kv_transfer_seconds)
from simcore.workload import Workload


@dataclass(eq=False)
class _Request:
    index: int
    arrival: float
    prompt: int
    output: int
    prompt_machine: int = -1
    token_machine: int = -1
    generated: int = 0
    emitted: int = 0             # tokens already sent: the most it ever generated (regenerate)
    first_token: float = np.nan
    last_token: float = np.nan   # when its latest output token came (ITL: the gap to the next)
    finish: float = np.nan
    kv_transfer: float = 0.0
    # failures
    prefill: int = 0             # tokens its next prefill computes (prompt; + generated after a
    #                              loss, unless restarts regenerate)
    kv_from: int = -1            # machine holding its KV until delivered (-1: a replica)
    from_epoch: int = 0
    token_epoch: int = 0         # its token machine's failure count when chosen
    recover_kind: int = 0        # 0 restart, 1 send the KV held on kv_from, 2 restore a replica
    lost_at: float = -1.0
    ready_at: float = 0.0        # when its KV last reached its token machine
    recoveries: int = 0
    recomputed: int = 0
    recovery_s: float = 0.0
    prefilled: int = 0           # tokens of its prefill computed so far (chunked prefill)

    reservation: int = 0         # KV tokens held while it decodes: prompt + output tokens
    # context after g >= 1 decode units: context_units x (prompt + 1) + context_rate x (g - 1)
    # (prompt + g; speculative decoding: units are steps, context in 1/CONTEXT_UNITS tokens)
    context_units: int = 1
    context_rate: int = 1
    blocks: tuple = ()           # prefix caching: its prompt's block ids
    cached: int = 0              # prefix caching: tokens of its current prefill found cached
    hit_tokens: int = 0          # prefix caching: tokens all its lookups found cached
    looked_up: int = 0           # prefix caching: prefill tokens all its lookups looked up

    @property
    def context(self) -> int:
        return self.context_units * (self.prompt + 1) + self.context_rate * (self.generated - 1)

    def kv_after(self, units: int) -> int:
        """Its KV's tokens after `units` decode units: prompt + units; speculative decoding:
        prompt + the tokens accepted, the first token and then its L - 1 others spread over
        its S steps, 1 + floor((L - 1) (g - 1) / S) after g >= 1 units (`reservation` is
        prompt + L, `output` S + 1)."""
        steps = self.output - 1
        if units <= 1 or steps <= 0:
            return self.prompt + units
        return self.prompt + 1 + (self.reservation - self.prompt - 1) * (units - 1) // steps

    @property
    def kv_tokens(self) -> int:
        """Its KV's tokens now (paged blocks, recompute, replicas)."""
        return self.kv_after(self.generated)


@dataclass(eq=False)
class _Machine:
    index: int
    role: int
    kind: int
    capacity: int
    prompt_queue: deque = field(default_factory=deque)
    decode_wait: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    batch_prompts: list = field(default_factory=list)
    batch_chunks: list = field(default_factory=list)   # (request, piece, prefilled before)
    batch_decodes: list = field(default_factory=list)
    busy_until: float | None = None
    memory_used: int = 0
    pending_prompt_tokens: int = 0
    committed: int = 0
    in_mixed: bool = False
    mixed_since: float = 0.0
    # statistics
    busy_time: float = 0.0
    iterations: int = 0
    batch_size_sum: int = 0
    max_memory_used: int = 0
    mixed_time: float = 0.0
    prompt_chunks: int = 0            # chunked designs: prompt pieces run (whole prompt: 1)
    chunked_prefill_s: float = 0.0    # chunked designs: those pieces each priced alone
    preemptions: int = 0              # paged KV: running decodes it preempted
    cache: OrderedDict = field(default_factory=OrderedDict)  # prefix caching: LRU first
    prefix_hits: int = 0              # prefix caching: tokens its lookups found cached
    prefix_tokens: int = 0            # prefix caching: prefill tokens it looked up
    host: OrderedDict = field(default_factory=OrderedDict)  # its host tier: LRU first
    prefix_host_hits: int = 0         # host tier: tokens of its hits loaded from host memory
    retired: bool = False          # out of its pool (a plan's resize): takes no new request
    # failures
    down: bool = False
    epoch: int = 0
    detect_at: float = 0.0
    up_since: float = 0.0


RESTART, RETARGET, RESTORE = 0, 1, 2


def simulate_reference(workload: Workload, machines: MachineArrays, trace: list | None = None,
                       steps=None):
    """Run the reference event loop; returns per-request arrays and per-machine statistics.
    `steps`: speculative decoding's per-request plan (`simcore.specdecode.step_plan`: decode
    units, reservations, context bases and rates); None: one token per decode."""
    if workload.closed is not None and (len(machines.failures) or len(machines.resizes)):
        raise ValueError("a closed loop runs without failures or pool resizes")
    sim = _ReferenceSimulation(workload, machines, trace, steps)
    return sim.run()


class _ReferenceSimulation:
    def __init__(self, workload: Workload, m: MachineArrays, trace: list | None = None,
                 steps=None):
        self.m = m
        self.trace = trace  # with a list: every iteration as a dict (machine, start, end,
        #                     decodes, chunks), for tests
        prompt, output = workload.prompt_tokens, workload.output_tokens
        units, reserve, rate, per_token = (steps if steps is not None else
                                           (output, prompt + output, np.ones(len(prompt)), 1))
        self.requests = [_Request(i, float(a), int(p), int(o), prefill=int(p),
                                  reservation=int(v), context_units=int(per_token),
                                  context_rate=int(c))
                         for i, (a, p, o, v, c) in enumerate(zip(
                             workload.arrival_s, prompt, units, reserve, rate))]
        self.machines = [_Machine(i, int(m.role[i]), int(m.kind[i]), int(m.kv_capacity[i]))
                         for i in range(m.count)]
        self.kv_arrivals: list[tuple[float, int]] = []
        self.next_arrival = 0
        # closed loop: the users, each request's think time, and the pending users' next
        # arrival times (the first `users` requests arrive at 0, the others when sent)
        loop = workload.closed
        self.users = 0 if loop is None else int(loop.users)
        self.think = None if loop is None else [float(t) for t in loop.think_s]
        self.pending_users: list[float] = []
        for req in self.requests[self.users:] if self.users else ():
            req.arrival = np.inf
        self.finished = 0
        self.failures = [(float(t), int(mc), float(d)) for t, mc, d in m.failures]
        self.repairs = sorted((t + d, mc) for t, mc, d in self.failures if np.isfinite(t + d))
        self.recoveries: list[tuple[float, int]] = []
        self.resizes = [(float(t), int(mc), int(change)) for t, mc, change in m.resizes]
        self.iteration_log: list[tuple[int, float, float]] = []  # (machine, start, end), tests
        self.itl = np.zeros(ITL_BINS, np.int64)  # every inter-token gap, binned (cluster.py)
        self.paged, self.block = bool(m.kv_paged), int(m.kv_block_tokens)
        self.watermark = [int(w) for w in m.kv_watermark_tokens()]
        self.prefix = bool(m.prefix_cache) and workload.has_prefix_blocks
        self.prefix_block = int(workload.prefix_block_tokens)
        self.routing = self.prefix and bool(m.prefix_routing)
        self.host_blocks = host_cache_blocks(m, self.prefix_block) if self.prefix else 0
        self.host_link = host_link_integers(m).tolist() if self.host_blocks else []
        if self.prefix:
            for req in self.requests:
                req.blocks = tuple(int(b) for b in workload.request_blocks(req.index))

    # ------------------------------------------------------------------ event loop
    def run(self):
        while self.finished < len(self.requests):
            now = self._next_event_time()
            for machine in self.machines:
                if machine.busy_until == now:
                    self._end_iteration(machine, now)
            arrived = sorted(e for e in self.kv_arrivals if e[0] == now)
            self.kv_arrivals = [e for e in self.kv_arrivals if e[0] != now]
            for _, r in arrived:
                req = self.requests[r]
                if req.kv_from >= 0:  # transferred
                    self.machines[req.kv_from].memory_used -= (
                        self._blocks(req.prefill) if self.paged else req.prefill)
                self._prefix_seed(req, self.machines[req.token_machine])
                self.machines[req.token_machine].decode_wait.append(req)
                self._recovered(req, now)
            while self.resizes and self.resizes[0][0] == now:  # (2r)
                _, index, change = self.resizes.pop(0)
                self.machines[index].retired = change < 0
                if change > 0:  # it joins cold
                    self.machines[index].cache.clear()
                    self.machines[index].host.clear()
            if self.failures or self.repairs or self.recoveries:
                self._failure_steps(now)
            self._next_user_arrival()
            while (self.next_arrival < len(self.requests)
                   and self.requests[self.next_arrival].arrival == now):
                req = self.requests[self.next_arrival]
                if self.users and req.index >= self.users:  # its user is no longer pending
                    heapq.heappop(self.pending_users)
                if not self._route(req, now):
                    self._lose(req, RESTART, now, self._next_repair())
                self.next_arrival += 1
                self._next_user_arrival()
            for machine in self.machines:
                if machine.busy_until is None:
                    self._start_iteration(machine, now)
        return self._results()

    def _next_user_arrival(self) -> None:
        """Closed loop: the next request to arrive (past the users' first ones) comes when the
        earliest pending user sends it (inf: none pending)."""
        if self.users and self.users <= self.next_arrival < len(self.requests):
            self.requests[self.next_arrival].arrival = (
                self.pending_users[0] if self.pending_users else np.inf)

    def _next_event_time(self) -> float:
        self._next_user_arrival()
        times = [mc.busy_until for mc in self.machines if mc.busy_until is not None]
        times += [t for t, _ in self.kv_arrivals]
        if self.next_arrival < len(self.requests):
            times.append(self.requests[self.next_arrival].arrival)
        times += [e[0] for e in self.failures[:1] + self.repairs[:1] + self.recoveries
                  + self.resizes[:1]]
        if not times:
            raise Stalled("simulation stalled with unfinished requests")
        return min(times)

    # ------------------------------------------------------------------ failures
    def _failure_steps(self, now: float) -> None:
        while self.repairs and self.repairs[0][0] == now:  # (2a)
            mc = self.machines[self.repairs.pop(0)[1]]
            mc.down, mc.up_since = False, now
        while self.failures and self.failures[0][0] == now:  # (2b)
            self._fail(self.machines[self.failures.pop(0)[1]], now)
        due = sorted(e for e in self.recoveries if e[0] == now)  # (2c)
        self.recoveries = [e for e in self.recoveries if e[0] != now]
        for _, r in due:
            self._recover(self.requests[r], now)

    def _fail(self, mc: _Machine, now: float) -> None:
        mc.down, mc.epoch, mc.detect_at = True, mc.epoch + 1, now + self.m.detection_s
        if mc.busy_until is not None:  # the iteration in flight is lost
            mc.busy_time -= mc.busy_until - now
            mc.busy_until = None
        if mc.in_mixed:
            mc.in_mixed = False
            mc.mixed_time += now - mc.mixed_since
        prefilling = mc.batch_prompts + [r for r, _, _ in mc.batch_chunks]
        lost = [(r, RESTART) for r in dict.fromkeys(prefilling + list(mc.prompt_queue))]
        decoding = RESTORE if self.m.replicate else RESTART
        lost += [(r, decoding) for r in mc.running + list(mc.decode_wait)]
        keep = []
        for t, r in self.kv_arrivals:
            req = self.requests[r]
            if req.kv_from == mc.index:      # sent from here: the KV is gone
                lost.append((req, RESTART))
            elif req.token_machine == mc.index:  # sent here: resend from where it is
                lost.append((req, RETARGET if req.kv_from >= 0 else RESTORE))
            else:
                keep.append((t, r))
        self.kv_arrivals = keep
        mc.prompt_queue.clear()
        mc.decode_wait.clear()
        mc.running, mc.batch_prompts, mc.batch_decodes, mc.batch_chunks = [], [], [], []
        mc.memory_used = mc.pending_prompt_tokens = mc.committed = 0
        mc.cache.clear()  # prefix caching: its cache is lost with its memory (and the
        mc.host.clear()   # host tier with its machine)
        for req, kind in lost:
            self._lose(req, kind, now, mc.detect_at)

    def _lose(self, req: _Request, kind: int, now: float, at: float) -> None:
        req.recover_kind = kind
        req.prefilled = 0
        req.lost_at = now
        req.recoveries += 1
        if np.isfinite(at):  # else nothing will ever take it: the run stalls
            self.recoveries.append((at, req.index))

    def _recovered(self, req: _Request, now: float) -> None:
        """Its KV reached its token machine; it has recovered unless it still regenerates
        tokens already sent (then when it has regenerated them: `_end_iteration`)."""
        req.ready_at = now
        if req.lost_at >= 0 and req.generated >= req.emitted:
            req.recovery_s += now - req.lost_at
            req.lost_at = -1.0

    def _release_token_machine(self, req: _Request, now: float) -> None:
        """Its token machine forgets it (unless that machine failed since it was chosen)."""
        if req.token_machine < 0:
            return
        t = self.machines[req.token_machine]
        if t.epoch == req.token_epoch:
            t.committed -= req.reservation
            self._maybe_leave_mixed(t, now)

    def _next_repair(self) -> float:
        return self.repairs[0][0] if self.repairs else np.inf

    def _recover(self, req: _Request, now: float) -> None:
        kind = req.recover_kind
        if kind == RETARGET and self.machines[req.kv_from].epoch != req.from_epoch:
            kind = RESTART
        if kind == RESTORE and self._peer(req.token_machine) >= 0:
            peer = self.machines[self.m.replica_peer[req.token_machine]]
            if peer.down or peer.up_since > req.ready_at:
                kind = RESTART
        if kind == RESTART:
            req.recover_kind = RESTART
            self._release_token_machine(req, now)
            if req.prompt_machine >= 0 and self.m.regenerate:  # prompt only, then re-decode
                req.prefill, req.generated = req.prompt, 0     # the tokens sent (silently)
                req.recomputed += max(req.kv_after(req.emitted) - 1, req.prompt)
            elif req.prompt_machine >= 0:  # (not an arrival that found every machine down)
                req.prefill = req.kv_tokens
                req.recomputed += req.prefill
            req.prompt_machine = req.token_machine = -1  # (a deferral must not release twice)
            if not self._route(req, now):
                return self._defer(req, now)
            return
        token = self._recovery_token_machine(req, now)
        if token is None:
            return self._defer(req, now)
        source = self._peer(req.token_machine)
        req.token_machine, req.token_epoch = token.index, token.epoch
        token.committed += req.reservation
        if kind == RETARGET:
            req.kv_transfer = kv_transfer_seconds(req.prefill, req.kv_from, token.index, self.m)
            due = now + req.kv_transfer
        else:
            req.kv_from = -1
            link = self.m.link_bytes_per_s[token.index]
            if source >= 0:
                link = min(link, self.m.link_bytes_per_s[source])
            due = now + req.kv_tokens * self.m.kv_bytes_per_token / link
        self.kv_arrivals.append((due, req.index))

    def _peer(self, machine: int) -> int:
        peers = self.m.replica_peer
        return -1 if peers is None else int(peers[machine])

    def _defer(self, req: _Request, now: float) -> None:
        """Nothing can take it now: wait for the next repair (none: the run stalls)."""
        at = self._next_repair()
        if np.isfinite(at):
            self.recoveries.append((at, req.index))

    def _recovery_token_machine(self, req: _Request, now: float) -> _Machine | None:
        if self.m.role[0] != ROLE_BOTH:
            token = self._choose_token_machine(req, now, [])
            if token is not None:
                return token
        return self._least_loaded(req)

    # ------------------------------------------------------------------ routing
    def _route(self, req: _Request, now: float) -> bool:
        """Place a request; False when no machine that can hold it is up."""
        ms = self.machines
        moved: list[_Machine] = []
        if self.m.role[0] == ROLE_BOTH:
            prompt = token = (self._least_loaded_aware(req) if self.routing
                              else self._least_loaded(req))
        else:
            prompt = self._choose_prompt_machine(req, now, moved)
            token = self._choose_token_machine(req, now, moved) if prompt is not None else None
            if prompt is None or token is None:
                prompt = token = self._least_loaded(req)
        if prompt is None:
            for mc in moved:
                self._maybe_leave_mixed(mc, now)
            return False
        req.prompt_machine, req.token_machine = prompt.index, token.index
        req.token_epoch, req.kv_from = token.epoch, prompt.index
        ms[req.prompt_machine].prompt_queue.append(req)
        ms[req.prompt_machine].pending_prompt_tokens += req.prefill
        ms[req.token_machine].committed += req.reservation
        if self.m.role[0] != ROLE_BOTH:
            for mc in moved:  # a move the fallback made useless is undone at once
                self._maybe_leave_mixed(mc, now)
        return True

    def _up(self):
        return [mc for mc in self.machines if not mc.down and not mc.retired]

    def _least_loaded(self, req: _Request) -> _Machine | None:
        fits = [mc for mc in self._up() if mc.capacity >= req.reservation]
        return min(fits, key=lambda mc: (mc.pending_prompt_tokens + mc.committed, mc.index),
                   default=None)

    @staticmethod
    def _matched_blocks(req: _Request, mc: _Machine) -> tuple[int, int]:
        """How many of the request's leading blocks mc's cache holds in HBM, and how many of
        the blocks after those its host tier holds (a run: 0 without the tier)."""
        k = 0
        while k < len(req.blocks) and req.blocks[k] in mc.cache:
            k += 1
        h = k
        while h < len(req.blocks) and req.blocks[h] in mc.host:
            h += 1
        return k, h - k

    def _cached_prefix(self, req: _Request, mc: _Machine) -> int:
        """Prefix-aware routing: the hit a lookup on mc would find now (nothing changed)."""
        return min(sum(self._matched_blocks(req, mc)) * self.prefix_block, req.prefill - 1)

    def _least_loaded_aware(self, req: _Request) -> _Machine | None:
        fits = [mc for mc in self._up() if mc.capacity >= req.reservation]
        return min(fits, key=lambda mc: (mc.pending_prompt_tokens + mc.committed
                                         - self._cached_prefix(req, mc), mc.index), default=None)

    def _is_long(self, mc: _Machine, req: _Request) -> bool:
        return (len(mc.prompt_queue) > 0
                and mc.pending_prompt_tokens + req.prefill > self.m.queue_threshold)

    def _is_loaded(self, mc: _Machine, req: _Request) -> bool:
        return mc.committed + req.reservation > mc.capacity

    def _choose_prompt_machine(self, req: _Request, now: float, moved: list) -> _Machine | None:
        def fewest_pending(pool):
            return min(pool, key=lambda mc: (mc.pending_prompt_tokens, mc.index), default=None)
        own_pool = [mc for mc in self._up() if mc.role == ROLE_PROMPT and not mc.in_mixed]
        own = (min(own_pool, key=lambda mc: (mc.pending_prompt_tokens
                                             - self._cached_prefix(req, mc), mc.index),
                   default=None) if self.routing else fewest_pending(own_pool))
        if not self.m.mixed_pool:
            return own
        if own is not None and not self._is_long(own, req):
            return own
        mixed = fewest_pending([mc for mc in self.machines if mc.in_mixed and not mc.retired])
        if mixed is not None and not self._is_long(mixed, req):
            return mixed
        other = min((mc for mc in self._up() if mc.role == ROLE_TOKEN and not mc.in_mixed),
                    key=lambda mc: (mc.committed, mc.index), default=None)
        if other is not None:
            self._enter_mixed(other, now)
            moved.append(other)
        return other

    def _choose_token_machine(self, req: _Request, now: float, moved: list) -> _Machine | None:
        def fewest_committed(pool):
            return min(pool, key=lambda mc: (mc.committed, mc.index), default=None)
        own = fewest_committed([mc for mc in self._up()
                                if mc.role == ROLE_TOKEN and not mc.in_mixed])
        if not self.m.mixed_pool:
            return own
        if own is not None and not self._is_loaded(own, req):
            return own
        mixed = fewest_committed([mc for mc in self.machines if mc.in_mixed and not mc.retired])
        if mixed is not None and not self._is_loaded(mixed, req):
            return mixed
        other = fewest_committed([mc for mc in self._up() if mc.role == ROLE_PROMPT
                                  and not mc.in_mixed and not self._is_loaded(mc, req)])
        if other is not None:
            self._enter_mixed(other, now)
            moved.append(other)
        return other

    def _enter_mixed(self, mc: _Machine, now: float) -> None:
        mc.in_mixed = True
        mc.mixed_since = now

    def _maybe_leave_mixed(self, mc: _Machine, now: float) -> None:
        other_work = mc.committed if mc.role == ROLE_PROMPT else mc.pending_prompt_tokens
        if mc.in_mixed and other_work == 0:
            mc.in_mixed = False
            mc.mixed_time += now - mc.mixed_since

    # ------------------------------------------------------------------ iterations
    # ------------------------------------------------------------------ KV memory
    def _blocks(self, tokens: int) -> int:
        """Paged KV: tokens rounded up to whole blocks."""
        return -(-tokens // self.block) * self.block

    def _decode_hold(self, req: _Request) -> int:
        """KV a running decode holds: its reservation, or (paged) its context's blocks."""
        return self._blocks(req.kv_tokens) if self.paged else req.reservation

    def _prompt_hold(self, req: _Request, mc: _Machine) -> int:
        """KV a prompt holds while computed: its reservation when it decodes here, its prompt
        tokens until transferred when it decodes elsewhere; paged, its prefill's blocks."""
        if self.paged:
            return self._blocks(req.prefill)
        return req.reservation if req.token_machine == mc.index else req.prefill

    def _fits(self, mc: _Machine, held: int) -> bool:
        """Admission: `held` more fits (paged: leaving the watermark free, unless the machine
        holds nothing)."""
        if self.paged and mc.memory_used > 0:
            return mc.memory_used + held <= mc.capacity - self.watermark[mc.index]
        return mc.memory_used + held <= mc.capacity

    def _preempt(self, mc: _Machine) -> bool:
        """Paged KV: while its running decodes' blocks exceed its memory, the most recently
        admitted of them (never the last one) loses its KV and goes back to the front of the
        machine's prompt queue (behind a partly prefilled prompt), to recompute its prompt and
        the tokens it generated as one prefill here. True when any was preempted."""
        preempted = False
        while mc.memory_used > mc.capacity and len(mc.running) > 1:
            req = mc.running.pop()
            mc.memory_used -= self._blocks(req.kv_tokens)
            mc.preemptions += 1
            req.prefill, req.prefilled = req.kv_tokens, 0
            head = 1 if mc.prompt_queue and mc.prompt_queue[0].prefilled > 0 else 0
            mc.prompt_queue.insert(head, req)
            mc.pending_prompt_tokens += req.prefill
            preempted = True
        return preempted

    def _start_iteration(self, mc: _Machine, now: float) -> None:
        if self.paged and self._preempt(mc):  # (vLLM: an iteration that preempts admits
            mc.batch_decodes = list(mc.running)  # nothing new; it runs the decodes left)
            self._begin(mc, now, 0, mc.batch_decodes, 0.0, [])
            return
        while mc.decode_wait and self._fits(mc, self._decode_hold(mc.decode_wait[0])):
            req = mc.decode_wait.popleft()
            mc.memory_used += self._decode_hold(req)
            mc.running.append(req)
        if self._chunks_now(mc):
            self._start_chunked_iteration(mc, now)
            return
        prompts, tokens = [], 0
        loaded = 0  # host tier: tokens of its prompts' cached blocks loaded from host memory
        while mc.prompt_queue:
            req = mc.prompt_queue[0]
            if prompts and tokens + req.prompt > self.m.prompt_token_limit:
                break
            # its KV is held here while computed: the whole reservation when it decodes here,
            # the prompt's tokens until transferred when it decodes elsewhere
            held = self._prompt_hold(req, mc)
            if not self._fits(mc, held):
                break
            mc.memory_used += held
            prompts.append(mc.prompt_queue.popleft())
            loaded += self._prefix_lookup(req, mc)
            tokens += req.prefill - req.cached
        # prefill first: prompts run alone, the running decodes wait (SimOptions.prefill_first)
        decodes = [] if prompts and self.m.prefill_first else list(mc.running)
        if not prompts and not decodes:
            return
        if self.m.chunk_tokens > 0:  # a chunked design's whole prompts count as one piece each
            curves = self.m.curves[mc.kind]
            mc.prompt_chunks += len(prompts)
            for req in prompts:
                mc.chunked_prefill_s += float(curves.prompt_time(req.prefill - req.cached))
        mc.batch_prompts, mc.batch_decodes = prompts, decodes
        self._begin(mc, now, tokens, decodes, self._load_seconds(mc, loaded),
                    [(req, req.prefill - req.cached, req.cached) for req in prompts])

    def _begin(self, mc: _Machine, now: float, tokens: int, decodes: list, extra: float,
               pieces: list) -> None:
        """Price the iteration (prompt, token or mixed time, plus chunk extras) and start it."""
        curves = self.m.curves[mc.kind]
        batch, context = len(decodes), sum(r.context for r in decodes)
        if tokens and decodes:
            duration = float(curves.mixed_time(tokens, batch, context))
        elif tokens:
            duration = float(curves.prompt_time(tokens))
        else:
            duration = float(curves.token_time(batch, context))
        duration += extra
        duration = float(curves.with_host(duration, len(pieces) + batch))
        mc.busy_until = now + duration
        self.iteration_log.append((mc.index, now, mc.busy_until))
        mc.busy_time += duration
        mc.iterations += 1
        mc.batch_size_sum += len(pieces) + batch
        mc.max_memory_used = max(mc.max_memory_used, mc.memory_used)
        if self.trace is not None:
            self.trace.append({"machine": mc.index, "start": now, "end": mc.busy_until,
                               "decodes": [r.index for r in decodes],
                               "chunks": [(r.index, piece, before) for r, piece, before in pieces]})

    def _chunks_now(self, mc: _Machine) -> bool:
        """Chunked designs: baseline machines always; Splitwise machines while they decode or
        finish a partially prefilled prompt."""
        if self.m.chunk_tokens <= 0:
            return False
        return (mc.role == ROLE_BOTH or bool(mc.running)
                or bool(mc.prompt_queue and mc.prompt_queue[0].prefilled > 0))

    def _start_chunked_iteration(self, mc: _Machine, now: float) -> None:
        q = self.m.curves[mc.kind].decode_query_tokens  # each decode's tokens in the pass
        budget, chunks = max(0, self.m.chunk_tokens - q * len(mc.running)), []
        loaded = 0  # host tier: tokens of its prompts' cached blocks loaded from host memory
        for req in mc.prompt_queue:
            if budget == 0:
                break
            if req.prefilled == 0:  # its KV is held here from its first piece
                held = self._prompt_hold(req, mc)
                if not self._fits(mc, held):
                    break
                mc.memory_used += held
                loaded += self._prefix_lookup(req, mc)
                req.prefilled = req.cached  # its pieces start after the cached prefix
            piece = min(req.prefill - req.prefilled, budget)
            chunks.append((req, piece, req.prefilled))
            budget -= piece
            if req.prefilled + piece < req.prefill:
                break  # the ongoing prompt: it stays at the head of the queue
        for req, piece, before in chunks:
            if before + piece == req.prefill:
                mc.prompt_queue.popleft()
        decodes = list(mc.running)
        if not chunks and not decodes:
            return
        curves = self.m.curves[mc.kind]
        extra = 0.0
        for _req, piece, before in chunks:
            piece_extra = curves.chunk_extra(piece, before)
            extra += piece_extra
            mc.chunked_prefill_s += float(curves.prompt_time(piece)) + piece_extra
        mc.prompt_chunks += len(chunks)
        mc.batch_chunks, mc.batch_decodes = chunks, decodes
        self._begin(mc, now, sum(piece for _, piece, _ in chunks), decodes,
                    extra + self._load_seconds(mc, loaded), chunks)

    def _end_iteration(self, mc: _Machine, now: float) -> None:
        for req in mc.batch_decodes:
            before = req.kv_tokens
            req.generated += 1
            if self.paged:  # its new tokens' KV: a new block when they start one
                mc.memory_used += self._blocks(req.kv_tokens) - self._blocks(before)
            if req.generated > req.emitted:  # (else a token sent before a loss: silent)
                req.emitted = req.generated
                self.itl[itl_bin(now - req.last_token)] += 1
                req.last_token = now
            elif req.generated == req.emitted and req.lost_at >= 0:  # regenerated them all:
                req.recovery_s += now - req.lost_at                  # back where it was lost
                req.lost_at = -1.0
            if req.generated == req.output:
                self._finish(req, mc, now)
        for req in mc.batch_prompts:
            mc.pending_prompt_tokens -= req.prefill - req.cached
            self._prompt_done(req, mc, now)
        for req, piece, _ in mc.batch_chunks:
            req.prefilled += piece
            mc.pending_prompt_tokens -= piece
            if req.prefilled == req.prefill:
                self._prompt_done(req, mc, now)
        mc.batch_prompts, mc.batch_decodes, mc.batch_chunks = [], [], []
        mc.busy_until = None
        self._maybe_leave_mixed(mc, now)

    def _prompt_done(self, req: _Request, mc: _Machine, now: float) -> None:
        """Its prefill's last piece ended: its first token (none after a loss); its decode
        continues here or, once its KV cache has arrived, on its token machine."""
        self._prefix_insert(req, mc)
        if req.generated == 0:  # (after a loss, a re-prefill yields no token, unless it
            req.generated = 1   # regenerates: then its first token again, silently)
            if req.emitted == 0:
                req.emitted = 1
                req.first_token = req.last_token = now
        local = req.token_machine == mc.index
        token = self.machines[req.token_machine]
        if req.generated == req.output:
            mc.memory_used -= self._prompt_hold(req, mc)
            self._finish(req, token, now)
        elif local:
            mc.memory_used += self._decode_hold(req) - self._prompt_hold(req, mc)
            mc.running.append(req)
            self._recovered(req, now)
        elif token.epoch != req.token_epoch:  # its token machine failed: choose another
            req.from_epoch = mc.epoch
            self._lose(req, RETARGET, now, max(now, token.detect_at))
        else:
            req.kv_transfer = kv_transfer_seconds(req.prefill, mc.index, req.token_machine,
                                                  self.m)
            self.kv_arrivals.append((now + req.kv_transfer, req.index))

    # ------------------------------------------------------------------ prefix caching
    def _trim_cache(self, mc: _Machine) -> None:
        """Evict least recently used blocks down to the room its free KV memory leaves; with a
        host tier, each evicted block becomes the host's most recently used, and the host
        evicts its least recently used beyond its capacity."""
        self._evict_to(mc, max(0, mc.capacity - mc.memory_used) // self.prefix_block)

    def _evict_to(self, mc: _Machine, room: int) -> None:
        """The cache's least recently used blocks leave HBM until `room` are left (to the host
        tier, which then evicts its least recently used beyond its capacity)."""
        while len(mc.cache) > room:
            block, _ = mc.cache.popitem(last=False)
            if self.host_blocks:
                mc.host[block] = None
        while len(mc.host) > self.host_blocks:
            mc.host.popitem(last=False)

    def _to_hbm(self, mc: _Machine, block: int) -> None:
        """The block becomes the cache's most recently used (leaving the host tier)."""
        mc.host.pop(block, None)
        mc.cache[block] = None
        mc.cache.move_to_end(block)

    def _prefix_lookup(self, req: _Request, mc: _Machine) -> int:
        """Its prefill starts on mc: the longest run of its leading blocks cached there (in
        HBM, then in the host tier) is a hit (`req.cached`; at most its prefill - 1 tokens);
        those blocks become most recently used in HBM, the first one last; its pending tokens
        fall by the hit. Returns the hit's host tokens to load (when any block came from the
        host tier; else 0)."""
        req.cached = 0
        if not self.prefix:
            return 0
        self._trim_cache(mc)
        k, h = self._matched_blocks(req, mc)
        for block in reversed(req.blocks[:k + h]):
            self._to_hbm(mc, block)
        req.cached = min((k + h) * self.prefix_block, req.prefill - 1)
        loaded = req.cached - min(k * self.prefix_block, req.cached)  # its host part
        mc.prefix_hits += req.cached
        mc.prefix_host_hits += loaded
        mc.prefix_tokens += req.prefill
        req.hit_tokens += req.cached
        req.looked_up += req.prefill
        mc.pending_prompt_tokens -= req.cached
        if h == 0:
            return 0
        self._trim_cache(mc)  # the loaded blocks may push others out of HBM
        return loaded

    def _load_seconds(self, mc: _Machine, tokens: int) -> float:
        """Host tier: what loading `tokens` tokens of KV over mc's host link takes (0.0 with
        no tier); whole bytes over whole bytes/s, as float64."""
        if not self.host_blocks:
            return 0.0
        return float(tokens * self.m.kv_bytes_per_token) / float(self.host_link[mc.index])

    def _prefix_insert(self, req: _Request, mc: _Machine) -> None:
        """Its prefill ended on mc: its blocks enter the cache (or are refreshed; leaving
        the host tier), the last first, so that its first block is the most recently used;
        then the cache is trimmed."""
        if not self.prefix:
            return
        for block in reversed(req.blocks):
            self._to_hbm(mc, block)
        self._trim_cache(mc)

    def _prefix_seed(self, req: _Request, mc: _Machine) -> None:
        """Its KV arrived at its token machine mc: its blocks enter mc's cache (or are
        refreshed), as a prefill's do, then it is trimmed to the room of its whole capacity
        (the next lookup or insertion trims to its free memory)."""
        if not self.prefix:
            return
        for block in reversed(req.blocks):
            self._to_hbm(mc, block)
        self._evict_to(mc, mc.capacity // self.prefix_block)

    def _finish(self, req: _Request, token_machine: _Machine, now: float) -> None:
        req.finish = now
        if self.users:  # closed loop: its user sends the next request after thinking
            heapq.heappush(self.pending_users, now + self.think[req.index])
        self._recovered(req, now)
        if token_machine.epoch == req.token_epoch:
            token_machine.committed -= req.reservation
        if req in token_machine.running:
            token_machine.running.remove(req)
            token_machine.memory_used -= self._decode_hold(req)
        self.finished += 1
        if token_machine.index != req.prompt_machine:
            self._maybe_leave_mixed(token_machine, now)

    # ------------------------------------------------------------------ results
    def _results(self) -> dict:
        reqs, ms = self.requests, self.machines
        end = max(r.finish for r in reqs) if reqs else 0.0
        for mc in ms:
            if mc.in_mixed:
                mc.mixed_time += end - mc.mixed_since
        return {
            **({} if not self.users else {
                "arrival_s": np.array([r.arrival for r in reqs])}),
            "first_token_s": np.array([r.first_token for r in reqs]),
            "finish_s": np.array([r.finish for r in reqs]),
            "prompt_machine": np.array([r.prompt_machine for r in reqs], dtype=np.int64),
            "token_machine": np.array([r.token_machine for r in reqs], dtype=np.int64),
            "kv_transfer_s": np.array([r.kv_transfer for r in reqs]),
            "busy_s": np.array([mc.busy_time for mc in ms]),
            "iterations": np.array([mc.iterations for mc in ms], dtype=np.int64),
            "batch_size_sum": np.array([mc.batch_size_sum for mc in ms], dtype=np.int64),
            "max_memory_tokens": np.array([mc.max_memory_used for mc in ms], dtype=np.int64),
            "mixed_pool_s": np.array([mc.mixed_time for mc in ms]),
            "prompt_chunks": np.array([mc.prompt_chunks for mc in ms], dtype=np.int64),
            "chunked_prefill_s": np.array([mc.chunked_prefill_s for mc in ms]),
            "end_s": np.float64(end),
            "itl_histogram": self.itl,
            **({} if not self.paged else {
                "preemptions": np.array([mc.preemptions for mc in ms], dtype=np.int64)}),
            **({} if not self.prefix else {
                "prefix_hit_tokens": np.array([mc.prefix_hits for mc in ms], dtype=np.int64),
                "prefix_tokens": np.array([mc.prefix_tokens for mc in ms], dtype=np.int64),
                "request_hit_tokens": np.array([r.hit_tokens for r in reqs], dtype=np.int64),
                "request_looked_up": np.array([r.looked_up for r in reqs], dtype=np.int64)}),
            **({} if not self.host_blocks else {
                "prefix_host_hit_tokens": np.array([mc.prefix_host_hits for mc in ms],
                                                   dtype=np.int64)}),
            **({} if not len(self.m.failures) else {
                "recoveries": np.array([r.recoveries for r in reqs], dtype=np.int64),
                "recomputed_tokens": np.array([r.recomputed for r in reqs], dtype=np.int64),
                "recovery_s": np.array([r.recovery_s for r in reqs])}),
        }
