"""Speculative decoding (issue 39): MTP modules, EAGLE-style draft heads, draft models.

Each decode step of a request drafts k tokens and verifies them in one forward pass of the
target model; the step emits 1 + the accepted drafts (1..k+1 tokens). Acceptance follows a
per-position profile a_1..a_k: position i is accepted with probability a_i when every position
before it was (so a step emits 1 + a_1 + a_1 a_2 + ... tokens on average).

How the simulators see it (both alike; docs/semantics.md):
- A request of L output tokens emits its first token from its prefill as always; its other
  L - 1 tokens come from S <= L - 1 decode steps. S is drawn per request here, outside the
  simulators, from the profile (`decode_steps`: seeded by the run's seed, every step's accepted
  count drawn in request order, the last step truncated at the tokens left), so both
  simulators run the same steps. They count a request's decodes in steps (its `output` there is
  S + 1), reserve its KV for prompt + L tokens as always (KV reserved up front), and finish it
  after its S-th step. Paged KV counts tokens: after g >= 1 units a request holds prompt + 1 +
  floor((L - 1)(g - 1) / S) (its blocks, and what a preemption or a restart recomputes).
- Its context grows by its own mean tokens per step, (L - 1) / S, each step, in units of
  1 / CONTEXT_UNITS of a token (integers, so the fast core sums them exactly): the attention
  cost of a step is that of the tokens accepted so far, averaged over the request's steps.
- A step of b requests costs the target's verification of (k + 1) tokens per request, priced
  as a decode iteration of b (k + 1) tokens at zero context (its GEMMs and per-token work at
  that shape), plus the context term once per request (the KV is read once per step), plus
  the drafting: k times the drafter's decode of b tokens. `LatencyCurves.with_spec_decode`
  returns those curves; every engine overhead and mixed/chunked iteration prices them alike
  (a mixed iteration's prompt pass counts k + 1 tokens per decode, and so does the chunk
  budget).
- The drafter's decode, per drafted token, as a fraction of the target's decode at the same
  batch: mtp and eagle one decoder layer of the target plus its output head (DeepSeek-V3's MTP
  module is one transformer block sharing the embedding and output head with the model;
  EAGLE's draft head is one decoder layer using the target's LM head): 1 / layers + the LM
  head's share of the active parameters (vocab x hidden / active params); draft:MODEL the
  draft model's decode, in proportion to its active parameters (decode is memory bound where
  speculation pays: the weights read per step).
- TTFT is unchanged; TBT stays (E2E - TTFT) / (L - 1); the tokens of one step reach the
  client together, so the ITL histogram counts one gap per step (S gaps per request).

Default acceptance (the per-position rate when `--acceptance` is not given):
- mtp: 0.85, k = 1. DeepSeek-V3 technical report (arXiv 2412.19437, section 5.4.3): "the
  acceptance rate of the second token prediction ranges between 85% and 90%", giving 1.8x
  tokens per second.
- eagle: 0.75 per position, k = 3: EAGLE-2 (arXiv 2406.16858) and EAGLE-3 (arXiv 2503.01840)
  report average acceptance lengths of about 3.5-4.5 tokens per step at 5-7 drafted tokens on
  Llama-class chat models (MT-bench); 0.75 per position over 3 positions gives 1 + 0.75 +
  0.56 + 0.42 = 2.73 tokens per step, the lower end for a short draft.
- draft:MODEL: 0.7 per position, k = 3 (Leviathan et al., arXiv 2211.17192, report
  alpha = 0.6-0.8 for same-family draft models).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hardware_catalog import InputError

METHODS = ("mtp", "eagle", "draft")
DEFAULT_TOKENS = {"mtp": 1, "eagle": 3, "draft": 3}
DEFAULT_ACCEPTANCE = {"mtp": 0.85, "eagle": 0.75, "draft": 0.7}
SOURCES = {
    "mtp": "DeepSeek-V3 technical report (arXiv 2412.19437, 5.4.3): second-token acceptance "
           "85-90%, 1.8x TPS",
    "eagle": "EAGLE-2/3 (arXiv 2406.16858, 2503.01840): acceptance lengths ~3.5-4.5 at 5-7 "
             "drafted tokens",
    "draft": "Leviathan et al. (arXiv 2211.17192): per-token acceptance 0.6-0.8 for "
             "same-family drafts",
}
MAX_TOKENS = 16
CONTEXT_UNITS = 256   # a speculative run counts context in 1/256 of a token


@dataclass(frozen=True)
class SpecDecode:
    """Speculative decoding as the simulators take it: the method, k drafted tokens per step,
    the per-position acceptance (length k) and the drafting cost of one drafted token as a
    fraction of the target's decode at the same batch."""
    method: str
    tokens: int
    acceptance: tuple
    draft_fraction: float
    draft_model: str = ""

    def __post_init__(self):
        if self.method not in METHODS:
            raise InputError(f"speculative decoding method must be one of {', '.join(METHODS)}")
        if not 1 <= self.tokens <= MAX_TOKENS:
            raise InputError(f"spec tokens must be 1..{MAX_TOKENS}")
        if len(self.acceptance) != self.tokens or not all(0 <= a <= 1 for a in self.acceptance):
            raise InputError("acceptance needs one rate in [0, 1] per drafted token")
        if not self.draft_fraction >= 0:
            raise InputError("the drafting cost must be >= 0")

    @property
    def tokens_per_step(self) -> float:
        """Expected tokens a step emits (no truncation): 1 + a_1 + a_1 a_2 + ..."""
        return 1.0 + float(np.sum(np.cumprod(self.acceptance)))

    def describe(self) -> str:
        name = f"draft:{self.draft_model}" if self.method == "draft" else self.method
        rates = ",".join(f"{a:g}" for a in self.acceptance)
        return (f"{name}, k={self.tokens}, acceptance {rates} "
                f"({self.tokens_per_step:.2f} tokens/step)")

    def as_dict(self) -> dict:
        return {"method": self.method, "draft_model": self.draft_model or None,
                "tokens": self.tokens, "acceptance": list(self.acceptance),
                "tokens_per_step": round(self.tokens_per_step, 6),
                "draft_fraction": self.draft_fraction, "source": SOURCES[self.method]}


def resolve(method: str, tokens: int | None, acceptance: tuple | None, model,
            draft=None) -> SpecDecode:
    """The SpecDecode of the options: `method` mtp | eagle | draft (then `draft` is the draft
    model's ModelSpec); k and the profile default per method; a single rate applies to every
    position."""
    k = DEFAULT_TOKENS[method] if tokens is None else int(tokens)
    rates = (DEFAULT_ACCEPTANCE[method],) if not acceptance else tuple(map(float, acceptance))
    if len(rates) == 1:
        rates = rates * k
    elif len(rates) != k:
        raise InputError(f"acceptance gives {len(rates)} rates for {k} drafted tokens: give "
                         "one rate, or one per drafted token")
    if method == "draft":
        target = model.active_params_b or model.params_b
        fraction = (draft.active_params_b or draft.params_b) / target
        name = draft.name
    else:
        active = (model.active_params_b or model.params_b) * 1e9
        head = model.vocab_size * model.hidden / active if model.vocab_size else 0.0
        fraction, name = 1.0 / model.layers + head, ""
    return SpecDecode(method, k, rates, fraction, name)


STEP_BLOCK = 64   # at most this many steps drawn at once per unfinished request


def decode_steps(output_tokens: np.ndarray, spec: SpecDecode, seed: int,
                 stream: int | None = None) -> np.ndarray:
    """Per request, the decode steps its L - 1 tokens after the first take: each step's
    tokens (1 + accepted drafts: j + 1 with probability a_1 ... a_j (1 - a_(j+1))) drawn from
    the profile, seeded by `seed`, in blocks of steps for every unfinished request (request
    order within a block; a block is about the steps the mean request left needs, 2 to
    STEP_BLOCK); the last step is truncated at the tokens left. `stream` (a long run drawn
    chunk by chunk: the number of the chunk's first request) makes each chunk's draws its own,
    so a chunk's plan does not depend on how many requests came before it in the process."""
    left = np.maximum(np.asarray(output_tokens, dtype=np.int64) - 1, 0)
    steps = np.zeros(len(left), np.int64)
    entropy = [int(seed) & (2**63 - 1), 39] + ([] if stream is None else [int(stream)])
    rng = np.random.default_rng(entropy)
    # P(at least j drafts accepted), j = 1..k, ascending: a step emits 1 + the number of
    # them above its uniform draw
    reach = np.cumprod(np.asarray(spec.acceptance, dtype=np.float64))[::-1]
    most = spec.tokens + 1
    active = np.flatnonzero(left > 0)
    while len(active):
        need = left[active]
        block = int(min(STEP_BLOCK, max(2, np.ceil(need.mean() / spec.tokens_per_step) + 1)))
        draws = rng.random((len(active), block))
        emitted = most - np.searchsorted(reach, draws, side="right")  # tokens of each step
        total = np.cumsum(emitted, axis=1)
        done = total[:, -1] >= need
        first = np.argmax(total >= need[:, None], axis=1)        # the step that ends it
        steps[active] += np.where(done, first + 1, block)
        left[active] = np.where(done, 0, need - total[:, -1])
        active = active[~done]
    return steps


def step_plan(prompt_tokens: np.ndarray, output_tokens: np.ndarray, steps: np.ndarray):
    """What the simulators take: per request (decode units: steps + 1, KV reservation:
    prompt + output, context per step in 1/CONTEXT_UNITS tokens), and CONTEXT_UNITS. The
    context after g units (g >= 1: the first token and g - 1 steps) is CONTEXT_UNITS x
    (prompt + 1) + rate x (g - 1), rate the request's mean tokens per step."""
    prompt = np.asarray(prompt_tokens, dtype=np.int64)
    output = np.asarray(output_tokens, dtype=np.int64)
    rate = np.where(steps > 0, np.rint(CONTEXT_UNITS * (output - 1) / np.maximum(steps, 1)),
                    CONTEXT_UNITS).astype(np.int64)
    return steps + 1, prompt + output, rate, CONTEXT_UNITS
