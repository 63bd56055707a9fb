"""Workloads with prefixes, synthesized from a stated model (issue 41): shared system prompts
and multi-turn sessions, so that prefix caching can be sized without a Mooncake trace.

The model (`--prefix-model system=N:TOKENS,turns=T|LOW-HIGH,think=SECONDS`):
- N distinct system prompts of TOKENS tokens each; every session picks one, uniformly;
- sessions start as a Poisson process; a session has T turns (or a whole number uniform in
  LOW-HIGH, both ends included);
- turn t's prompt is the system prompt, then every earlier turn's new user text and output,
  then its own new user text; each turn's (new user text, output) pair is drawn from the
  workload's sizes (its prompt and output tokens, as a request of that workload would be);
- turn t + 1 arrives an exponential think time (mean SECONDS) after turn t's arrival: an open
  loop, every arrival time fixed in advance, whatever the cluster does;
- a session ends before the first turn whose prompt + output would exceed the context (the
  model's longest sequence): a server refuses such a turn. A session whose first turn does
  not fit has none.

The rate counts requests (turns), not sessions: sessions start at rate / E[turns], E[turns]
the mean turns a session keeps under the context, measured on PILOT_SESSIONS sessions drawn
with a fixed seed (the same for every sample). Sessions start from WARMUP before the window,
so that it opens on sessions in progress as a steady stream would (their earlier turns, before
the window, are not simulated: a cache starts cold).

Prompt blocks (`Workload.prefix_blocks`, as a Mooncake trace's hash_ids): one id per started
block of `BLOCK_TOKENS` prompt tokens (ceil(prompt / BLOCK_TOKENS), as the Mooncake release
counts them), an id standing for the whole prefix up to its block's end: a full block that
holds system prompt tokens only is the system prompt's (shared by every session with it);
any other full block is its session's (shared by the session's later turns, whose prompts
hold it whole); a partial last block is its request's own (a later turn's block at that
place holds more tokens, so it differs). A block straddling the system prompt and a
session's text is the session's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hardware_catalog.checks import Invalid
from hardware_catalog.csvschema import MAX_REQUEST_TOKENS
from hardware_catalog.errors import InputError
from simcore.workload import (MAX_SYNTHESIZED_REQUESTS, Workload, _arrival_times,
                              _check_synthesis_options, _size_sampler)

BLOCK_TOKENS = 512        # tokens per prompt block: the Mooncake release's, vLLM-scale blocks
PILOT_SESSIONS = 4096     # sessions drawn to measure the mean turns a session keeps
PILOT_BATCHES = 64
PILOT_SEED = 41           # their seed: fixed, so every sample's session rate is the same
MAX_SYSTEMS = 1_000_000
MAX_TURNS = 1000
MAX_THINK_S = 86_400.0    # a day between turns: beyond it, a typo
WARMUP_SDS = 8            # warm-up: the longest session's mean span plus 8 standard deviations
PREFIX_MODEL_GRAMMAR = ("system=N:TOKENS,turns=T|LOW-HIGH,think=SECONDS (N system prompts of "
                        "TOKENS tokens; T turns a session, or uniform from LOW to HIGH; "
                        "SECONDS the mean think time between turns)")


@dataclass(frozen=True)
class PrefixModel:
    """The stated session model; `text` is its canonical spelling."""
    systems: int
    system_tokens: int
    turns_low: int
    turns_high: int
    think_s: float

    @property
    def text(self) -> str:
        turns = (f"{self.turns_low}" if self.turns_low == self.turns_high
                 else f"{self.turns_low}-{self.turns_high}")
        return f"system={self.systems}:{self.system_tokens},turns={turns},think={self.think_s:g}"

    def warmup_s(self) -> float:
        """How long before the window sessions start: the longest session's span (the sum of
        turns_high - 1 exponential think times) at its mean plus WARMUP_SDS deviations."""
        gaps = self.turns_high - 1
        return self.think_s * (gaps + WARMUP_SDS * math.sqrt(gaps)) if gaps else 0.0


def parse_prefix_model(value) -> PrefixModel:
    """`system=4:2000,turns=1-8,think=30` (PREFIX_MODEL_GRAMMAR); Invalid otherwise."""
    if not isinstance(value, str) or not value.strip() or "\n" in value:
        raise Invalid(f"must be {PREFIX_MODEL_GRAMMAR}, got {value!r}"[:300])
    parts = {}
    for item in value.strip().split(","):
        key, sep, arg = item.strip().partition("=")
        if not sep or key not in ("system", "turns", "think") or key in parts:
            raise Invalid(f"must be {PREFIX_MODEL_GRAMMAR}, got {value!r}"[:300])
        parts[key] = arg.strip()
    missing = [key for key in ("system", "turns", "think") if key not in parts]
    if missing:
        raise Invalid(f"lacks {', '.join(missing)}: must be {PREFIX_MODEL_GRAMMAR}")
    count, sep, tokens = parts["system"].partition(":")
    if not sep:
        raise Invalid(f"system must be N:TOKENS (N prompts of TOKENS tokens), got "
                      f"{parts['system']!r}"[:200])
    systems = _whole("system prompts", count, 1, MAX_SYSTEMS)
    system_tokens = _whole("system prompt tokens", tokens, 1, MAX_REQUEST_TOKENS)
    low, dash, high = parts["turns"].partition("-")
    turns_low = _whole("turns", low, 1, MAX_TURNS)
    turns_high = _whole("turns", high, 1, MAX_TURNS) if dash else turns_low
    if turns_high < turns_low:
        raise Invalid(f"turns {parts['turns']}: LOW must not exceed HIGH")
    try:
        think = float(parts["think"])
    except ValueError:
        think = math.nan
    if not 0 < think <= MAX_THINK_S:   # (NaN fails too)
        raise Invalid(f"think must be seconds > 0 and <= {MAX_THINK_S:g}, got "
                      f"{parts['think']!r}"[:200])
    return PrefixModel(systems, system_tokens, turns_low, turns_high, think)


def _whole(label: str, text: str, low: int, high: int) -> int:
    text = text.strip()
    if not text.isdigit() or not low <= int(text) <= high:
        raise Invalid(f"{label} must be a whole number from {low} to {high:,}, got {text!r}")
    return int(text)


# ------------------------------------------------------------------------------ sessions
@dataclass(frozen=True, eq=False)
class Sessions:
    """Drawn sessions, their turns flat in session order: turn i of session `session[i]`,
    its prompt (system prompt + history + new text) and output tokens, its arrival."""
    system: np.ndarray      # per session: which system prompt
    session: np.ndarray     # per turn
    prompt: np.ndarray
    output: np.ndarray
    arrival_s: np.ndarray
    drawn_turns: int        # turns drawn before the context cut sessions short


def _draw_sessions(rng: np.random.Generator, sampler, model: PrefixModel, context: int,
                   starts: np.ndarray) -> Sessions:
    """Sessions starting at `starts`: their system prompts, turns, sizes and think times drawn
    from `rng` in that order, then each cut before its first turn beyond the context."""
    n = len(starts)
    system = rng.integers(0, model.systems, size=n)
    turns = rng.integers(model.turns_low, model.turns_high + 1, size=n)
    total = int(turns.sum())
    new_text, output = sampler(rng, total)
    think = rng.exponential(model.think_s, size=total)
    session = np.repeat(np.arange(n), turns)
    first = np.zeros(n + 1, np.int64)
    np.cumsum(turns, out=first[1:])
    # prompt = system + history (earlier turns' text and output) + this turn's text
    grown = np.cumsum(new_text + output)
    before = grown - (new_text + output)              # history + earlier sessions' turns
    history = before - np.repeat(before[first[:-1]], turns)
    prompt = model.system_tokens + history + new_text
    think[first[:-1]] = 0.0                           # a session's first turn: its start
    since = np.cumsum(think)
    arrival = starts[session] + since - np.repeat(since[first[:-1]], turns)
    # keep each session's turns up to its first that does not fit (prompts only grow)
    fits = prompt + output <= context
    cut = np.cumsum(~fits) - np.repeat(np.cumsum(~fits)[first[:-1]] - (~fits[first[:-1]]),
                                       turns)
    keep = cut == 0
    return Sessions(system, session[keep], prompt[keep], output[keep], arrival[keep], total)


def mean_turns(sampler, model: PrefixModel, context: int) -> float:
    """The mean turns a session keeps under the context, over batches of PILOT_SESSIONS
    sessions drawn with PILOT_SEED until they keep PILOT_SESSIONS turns (at most
    PILOT_BATCHES batches: a context that cuts most sessions short needs more of them)."""
    rng = np.random.default_rng(PILOT_SEED)
    kept = sessions = 0
    while kept < PILOT_SESSIONS and sessions < PILOT_BATCHES * PILOT_SESSIONS:
        kept += len(_draw_sessions(rng, sampler, model, context,
                                   np.zeros(PILOT_SESSIONS)).prompt)
        sessions += PILOT_SESSIONS
    return kept / sessions


def session_rate_per_request(sizes, model: PrefixModel, context: int) -> float:
    """Sessions per request (1 / the mean turns a session keeps); InputError (naming no
    option: the edge does) when no turn fits the context."""
    if model.system_tokens + 2 > context:
        raise InputError(f"system prompts of {model.system_tokens:,} tokens leave no room in "
                         f"the model's context of {context:,} tokens for a turn; shorten them")
    per_session = mean_turns(_size_sampler(sizes)[0], model, context)
    if per_session == 0:
        raise InputError(f"no session's first turn fits the model's context of {context:,} "
                         f"tokens (system prompt {model.system_tokens:,} tokens + the "
                         "workload's prompt and output); shorten the system prompts")
    return 1.0 / per_session


def synthesize_sessions(sizes, model: PrefixModel, context: int, rate_rps: float,
                        duration_s: float, seed: int) -> Workload:
    """The requests arriving in [0, duration_s) of sessions following `model` at `rate_rps`
    requests per second (module docstring), with their prompt blocks. `context`: the most
    tokens (prompt + output) a turn may hold. The same inputs give identical arrays."""
    _check_synthesis_options(rate_rps, duration_s, seed, "poisson", 1.0)
    per_session = 1.0 / session_rate_per_request(sizes, model, context)
    sampler, base_name, size_note = _size_sampler(sizes)
    warmup = model.warmup_s()
    session_rate = rate_rps / per_session
    if session_rate * (duration_s + warmup) * model.turns_high > 2 * MAX_SYNTHESIZED_REQUESTS:
        raise InputError(f"the sessions of {rate_rps:g} req/s over {duration_s:g} s and their "
                         f"{warmup:g} s warm-up ask for too many turns; lower the rate, the "
                         "duration, the think time or the turns")
    rng = np.random.default_rng(seed)
    starts = _arrival_times(rng, session_rate, duration_s + warmup, "poisson", 1.0) - warmup
    drawn = _draw_sessions(rng, sampler, model, context, starts)
    inside = np.flatnonzero((drawn.arrival_s >= 0) & (drawn.arrival_s < duration_s))
    if len(inside) == 0:
        raise InputError(f"rate x duration ({rate_rps:g} req/s x {duration_s:g} s) is too "
                         f"small: the sessions produced no request with seed {seed}")
    order = inside[np.argsort(drawn.arrival_s[inside], kind="stable")]
    prompt = drawn.prompt[order]
    blocks, offsets = session_blocks(drawn.system[drawn.session[order]], drawn.session[order],
                                     prompt, model.system_tokens)
    kept = len(drawn.prompt) / max(drawn.drawn_turns, 1)
    name = f"{base_name}+sessions({model.text})@{rate_rps:g}rps/{duration_s:g}s/seed{seed}"
    notes = (size_note,
             f"sessions {model.text} (context {context:,} tokens: {kept:.1%} of turns drawn "
             f"fit, {per_session:.3g} a session) starting at {session_rate:.4g}/s, warm-up "
             f"{warmup:.0f} s: {len(order)} requests in {duration_s:g} s (seed {seed})",
             reuse_note(infinite_cache_hit_share(blocks, offsets, prompt, BLOCK_TOKENS)))
    return Workload(name, drawn.arrival_s[order], prompt, drawn.output[order], notes,
                    blocks, offsets, BLOCK_TOKENS)


def _block_keys(system: np.ndarray, session: np.ndarray, number: np.ndarray,
                prompt: np.ndarray, system_tokens: int, block: int):
    """Each request's started blocks as (kind, owner, place): kinds 0 its system prompt's,
    1 its session's, 2 its own (owner `number[i]`: request i's number), the block's place in
    its prompt; and the offsets of each request's blocks (module docstring)."""
    count = -(-prompt // block)                       # started blocks
    offsets = np.zeros(len(prompt) + 1, np.int64)
    np.cumsum(count, out=offsets[1:])
    request = np.repeat(np.arange(len(prompt)), count)
    j = np.arange(offsets[-1]) - offsets[request]     # the block's place in its prompt
    full = (j + 1) * block <= prompt[request]
    system_only = full & ((j + 1) * block <= system_tokens)
    kind = np.where(system_only, 0, np.where(full, 1, 2)).astype(np.int64)
    owner = np.where(system_only, system[request],
                     np.where(full, session[request], number[request])).astype(np.int64)
    return kind, owner, j, offsets


def session_blocks(system: np.ndarray, session: np.ndarray, prompt: np.ndarray,
                   system_tokens: int, block: int = BLOCK_TOKENS
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Each request's block ids (module docstring), dense 0..B-1 in the order of their keys,
    and the offsets of each request's ids: request i has system prompt `system[i]`, belongs to
    session `session[i]` and has `prompt[i]` tokens."""
    kind, owner, j, offsets = _block_keys(system, session, np.arange(len(prompt)), prompt,
                                          system_tokens, block)
    # a key per distinct prefix: (kind, owner, place)
    places = int(j.max(initial=0)) + 1
    owners = int(max(system.max(initial=0), session.max(initial=0), len(prompt))) + 1
    key = (kind * owners + owner) * places + j
    _, dense = np.unique(key, return_inverse=True)
    return dense.astype(np.int64).reshape(-1), offsets


# global block ids (`session_block_ids`): the kind in bits 61-62, the owner's number (system
# prompt, session or request, counted over the whole run) in bits 21-60, the place in bits 0-20
_PLACE_BITS, _OWNER_BITS = 21, 40


def session_block_ids(system: np.ndarray, session: np.ndarray, request: np.ndarray,
                      prompt: np.ndarray, system_tokens: int,
                      block: int = BLOCK_TOKENS) -> tuple[np.ndarray, np.ndarray]:
    """Each request's block ids keyed as `session_blocks` keys them, but global to a run (not
    dense per sample; `request`: the requests' numbers in the run), so a session crossing the
    chunks of a streamed run keeps its blocks."""
    kind, owner, j, offsets = _block_keys(system, session, request, prompt, system_tokens,
                                          block)
    ids = (kind << (_OWNER_BITS + _PLACE_BITS)) | (owner << _PLACE_BITS) | j
    return ids.astype(np.int64), offsets


def infinite_cache_hit_share(blocks: np.ndarray, offsets: np.ndarray, prompt: np.ndarray,
                             block: int) -> float:
    """The share of prompt tokens one infinite cache of every earlier request's blocks would
    hit, requests in order (as `provisioner.mooncake.prefix_reuse` counts it: min(leading
    blocks seen x block tokens, prompt)). Ids stand for whole prefixes, so a block seen before
    has its leading blocks seen before too: the hit is the count of blocks an earlier request
    had."""
    request = np.repeat(np.arange(len(prompt)), np.diff(offsets))
    first_seen = np.full(int(blocks.max(initial=-1)) + 1, len(prompt), np.int64)
    np.minimum.at(first_seen, blocks, request)
    seen = np.bincount(request[first_seen[blocks] < request], minlength=len(prompt))
    hit = np.minimum(seen * block, prompt)
    return float(hit.sum() / prompt.sum()) if prompt.sum() else 0.0


def reuse_note(share: float) -> str:
    return (f"prefix reuse bound: {share:.1%} of this sample's prompt tokens seen before "
            "(one infinite cache, requests in arrival order)")
