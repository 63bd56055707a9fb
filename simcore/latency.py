"""Latency curves: what the simulators consume from a performance model, for one (model, machine).

Every curve is piecewise linear between knots, so the fast core and the reference simulator
evaluate exactly the same function. The extrapolation rule, stated once for every curve:
below the first knot the first value holds (no extrapolation towards zero); beyond the last knot
the last segment continues linearly (work keeps growing at the last measured rate).

Chunked prefill (Sarathi-Serve) adds one term per prompt chunk. A chunk of c tokens whose
prompt already has c0 tokens in the KV cache is priced as c prompt tokens (on the prompt curve,
inside its iteration like any prompt work) plus

    chunk_extra(c, c0) = max(c0 * max(A * c, R),  W(c0 + c) - W(c0) - W(c))

with W the prompt curve. The first term is the attention over the c0 cached tokens, which a
fresh c-token pass does not do: its FLOPs (A seconds per chunk token x cached token; QK^T and AV
are 4 x layers x hidden FLOPs per pair) or, when larger, re-reading the cached KV from HBM (R
seconds per cached token: "the first chunk's KV is loaded N-1 times"). The second term is what
the measured whole-prompt curve charges for extending a prompt from c0 to c0 + c tokens beyond a
fresh c-token pass (the curve's superlinear part, which grows with the prompt's length, so
chunking does not escape it). Summed over a prompt's chunks the second term telescopes: a
chunked prompt never costs less than the same prompt run whole, W(P). The other chunking costs
come from the curve itself: every chunk pays the fixed per-iteration costs (launches,
collectives) and small chunks run at the lower efficiency of small passes. A first chunk
(c0 = 0) and a whole prompt add nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from simcore.engine_overheads import combine_host
from simcore.interp import PiecewiseLinear, piecewise_linear


@dataclass(frozen=True, eq=False)
class LatencyCurves:
    """Iteration latencies of one model on one machine, in seconds."""
    prompt_tokens: np.ndarray        # knots: total prompt tokens in the iteration (increasing)
    prompt_seconds: np.ndarray       # prompt-only iteration latency at those knots
    decode_batch: np.ndarray         # knots: requests in a decode iteration (increasing)
    decode_seconds: np.ndarray       # decode iteration latency at zero context
    context_seconds_per_token: float # added per context token held by the decode batch
    chunk_attention_s: float = 0.0   # A: per (chunk token x cached token) of a prompt chunk
    chunk_kv_read_s: float = 0.0     # R: per cached token a prompt chunk reads
    # SplitwiseSim's latency model (the `splitwise-sim` preset, simcore.splitwise_sim): its
    # token curve was measured against "batch tokens" (prompt x batch) but is looked up at the
    # number of decodes; decode_axis "batch_tokens" says the decode knots are such a curve (the
    # engines look it up at the batch size all the same; only the SLO reference reads it at x =
    # prompt size). Its mixed iterations cost mixed_prompt_factor x the prompt curve.
    decode_axis: str = "batch"       # batch | batch_tokens
    mixed_prompt_factor: float = 1.0
    # What an engine does around its kernels (`simcore.engine_overheads`; 0 for measured
    # iteration times, which hold it already): host time of iteration_overhead_s plus
    # sequence_overhead_s per sequence (each decode, each prompt or chunk) per iteration, after
    # its GPU work or, with overlap_host, beside it (`with_host`); and every request's first
    # token reaches the client first_token_s later (tokenization, admission, first sampling).
    iteration_overhead_s: float = 0.0
    sequence_overhead_s: float = 0.0
    first_token_s: float = 0.0
    overlap_host: bool = False
    # Speculative decoding (`with_spec_decode`, simcore.specdecode): each decode puts this many
    # tokens into an iteration's forward pass (k + 1: its drafts and the token they follow;
    # 1 without), which a mixed pass and the chunk budget count.
    decode_query_tokens: int = 1

    def __post_init__(self):
        for x, y, what in ((self.prompt_tokens, self.prompt_seconds, "prompt"),
                           (self.decode_batch, self.decode_seconds, "decode")):
            if len(x) < 2 or len(x) != len(y):
                raise ValueError(f"{what} curve needs >= 2 knots with one latency each")
            if np.any(np.diff(x) <= 0) or np.any(~np.isfinite(y)) or np.any(y <= 0):
                raise ValueError(f"{what} curve knots must increase and latencies be positive")
        if self.context_seconds_per_token < 0:
            raise ValueError("context_seconds_per_token must be >= 0")
        if self.chunk_attention_s < 0 or self.chunk_kv_read_s < 0:
            raise ValueError("chunk terms must be >= 0")
        if self.decode_axis not in ("batch", "batch_tokens"):
            raise ValueError("decode_axis must be batch or batch_tokens")
        if not self.mixed_prompt_factor > 0:
            raise ValueError("mixed_prompt_factor must be > 0")
        if min(self.iteration_overhead_s, self.sequence_overhead_s, self.first_token_s) < 0:
            raise ValueError("engine overheads must be >= 0")

    def prompt_time(self, tokens):
        return self._prompt_curve(np.asarray(tokens, dtype=np.float64))

    @cached_property
    def _prompt_curve(self) -> PiecewiseLinear:
        """`piecewise_linear` on the prompt knots, bit for bit, with a bucketed look-up: a
        simulation prices every request's prompt alone (slowdowns, chunking overhead)."""
        return PiecewiseLinear(self.prompt_tokens, self.prompt_seconds, extrapolate=True)

    def token_time(self, batch, context_tokens):
        """One decode iteration of `batch` requests holding `context_tokens` tokens in all."""
        return (piecewise_linear(np.asarray(batch, dtype=np.float64), self.decode_batch,
                                 self.decode_seconds)
                + self.context_seconds_per_token * np.asarray(context_tokens, dtype=np.float64))

    def reference_token_time(self, prompt_tokens, output_tokens):
        """SplitwiseSim's TBT reference on these curves: the time per output token of a request
        alone (batch of one), never divided by its output count. On its own curves
        (decode_axis "batch_tokens") literally its token curve at x = prompt size. On batch-axis
        curves, the request's mean uncontended gap: decode k (k = 1..gaps) attends over
        prompt + k tokens, so the mean is at prompt + (gaps + 1) / 2; a 1-token output (no gap)
        takes its would-be first gap."""
        if self.decode_axis == "batch_tokens":
            return self.token_time(prompt_tokens, 0.0)
        gaps = np.maximum(np.asarray(output_tokens, dtype=np.float64) - 1.0, 1.0)
        return self.token_time(1, np.asarray(prompt_tokens, dtype=np.float64) + (gaps + 1) / 2)

    def mixed_time(self, prompt_tokens, batch, context_tokens):
        """A mixed iteration: prompts and decodes in one forward pass.

        Each decode adds one token to the pass, so the pass costs at least a prompt pass over
        prompt_tokens + batch tokens (times mixed_prompt_factor: 1.1 in SplitwiseSim, 1 in ours)
        and at least a plain decode of the batch; attention over the decodes' context comes on
        top. Reduces to prompt_time / token_time when one side is empty.
        """
        pt = np.asarray(prompt_tokens, dtype=np.float64)
        b = np.asarray(batch, dtype=np.float64)
        ctx = self.context_seconds_per_token * np.asarray(context_tokens, dtype=np.float64)
        prompt = self.mixed_prompt_factor * piecewise_linear(pt + b * self.decode_query_tokens,
                                                             self.prompt_tokens,
                                                             self.prompt_seconds)
        decode = piecewise_linear(b, self.decode_batch, self.decode_seconds)
        both = np.maximum(prompt, decode) + ctx
        return np.where(b <= 0, piecewise_linear(pt, self.prompt_tokens, self.prompt_seconds),
                        np.where(pt <= 0, decode + ctx, both))

    def host_time(self, sequences):
        """The engine's host time for an iteration of `sequences` sequences."""
        return self.iteration_overhead_s + self.sequence_overhead_s * sequences

    def with_host(self, gpu_seconds, sequences):
        """An iteration whose GPU work (kernels, context attention, chunk extras) takes
        `gpu_seconds`, with the engine's host work: after it (serial), or beside it (an engine
        that prepares step n + 1 while step n runs: the longer of the two)."""
        return combine_host(gpu_seconds, self.host_time(sequences), self.overlap_host)

    def with_engine_overheads(self, iteration_s: float, sequence_s: float,
                              first_token_s: float, overlap: bool = False) -> "LatencyCurves":
        return replace(self, iteration_overhead_s=float(iteration_s),
                       sequence_overhead_s=float(sequence_s), first_token_s=float(first_token_s),
                       overlap_host=bool(overlap))

    def chunk_extra(self, chunk_tokens: float, cached_tokens: float) -> float:
        """Seconds a prompt chunk adds beyond its tokens on the prompt curve (see the module
        docstring); 0 for a first chunk."""
        if cached_tokens <= 0:
            return 0.0
        c, c0 = float(chunk_tokens), float(cached_tokens)
        attention = c0 * max(self.chunk_attention_s * c, self.chunk_kv_read_s)
        w = self.prompt_time(np.array([c0 + c, c0, c]))
        return max(attention, float(w[0] - w[1] - w[2]))

    def with_spec_decode(self, tokens: int, draft_fraction: float,
                         context_units: int) -> "LatencyCurves":
        """The curves of speculative decoding with `tokens` (k) drafted tokens per step
        (simcore.specdecode): a decode step of b requests costs the zero-context decode of
        b (k + 1) tokens (the verification) plus k x draft_fraction x the decode of b (the
        drafting); the context term stays once per request, counted in 1 / context_units of a
        token. The new decode knots are the old ones and the old ones / (k + 1), so the
        verification term is the old curve exactly."""
        q = tokens + 1
        x0 = self.decode_batch
        x = np.union1d(x0, x0[x0 / q >= x0[0]] / q)
        verify = piecewise_linear(x * q, x0, self.decode_seconds)
        draft = tokens * draft_fraction * piecewise_linear(x, x0, self.decode_seconds)
        return replace(self, decode_batch=x, decode_seconds=verify + draft,
                       context_seconds_per_token=self.context_seconds_per_token / context_units,
                       decode_query_tokens=q)

    def with_chunk_terms(self, attention_s: float, kv_read_s: float) -> "LatencyCurves":
        return replace(self, chunk_attention_s=float(attention_s),
                       chunk_kv_read_s=float(kv_read_s))

    def scaled(self, prompt_factor: float = 1.0, decode_factor: float = 1.0,
               overhead_factor: float = 1.0) -> "LatencyCurves":
        """The same curves slowed down (e.g. a power cap slows prompt iterations only; chunk
        attention is prompt work; the engine's overheads, host time, only when asked)."""
        return replace(self, prompt_seconds=self.prompt_seconds * prompt_factor,
                       iteration_overhead_s=self.iteration_overhead_s * overhead_factor,
                       sequence_overhead_s=self.sequence_overhead_s * overhead_factor,
                       first_token_s=self.first_token_s * overhead_factor,
                       decode_seconds=self.decode_seconds * decode_factor,
                       context_seconds_per_token=self.context_seconds_per_token * decode_factor,
                       chunk_attention_s=self.chunk_attention_s * prompt_factor,
                       chunk_kv_read_s=self.chunk_kv_read_s * prompt_factor)
