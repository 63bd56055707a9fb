"""Iteration times and KV transfers for the compiled core: `simcore.latency`'s
LatencyCurves (prompt_time, token_time, mixed_time, chunk_extra) and
`simcore.cluster.kv_transfer_seconds` on the padded curves of `records.Curves`, and the ITL bin
(`simcore.cluster.itl_bin`, compiled in as it is).

Compiles the reference's iteration cost (its `_begin`) and KV transfer time (`_prompt_done`).
Knots are near-uniform grids, so a query's bucket of the range gives its knot within a few steps
instead of a binary search (`_first_knot_at_or_above`).
"""
from __future__ import annotations

import numpy as np

from simcore.cluster import itl_bin
from .compiler import _compiled, _inlined
from .records import KNOT_BUCKETS


_itl_bin = _inlined(itl_bin)


@_compiled
def _first_knot_at_or_above(x, xs, n, index, scale):
    """np.searchsorted(xs[:n], x) for xs[0] < x <= xs[n - 1]: the knot is between the starts of
    x's bucket and of the next one (checked, so rounding at a bucket edge cannot mislead it;
    `scale`, buckets per unit of x, is multiplied: a division would cost more than the rest)."""
    b = min(int((x - xs[0]) * scale), KNOT_BUCKETS - 1)
    lo, hi = index[b], index[b + 1]
    if (lo > 0 and xs[lo - 1] >= x) or xs[hi] < x:
        return np.searchsorted(xs[:n], x)
    while xs[lo] < x:
        lo += 1
    return lo


@_compiled
def _piecewise_linear(x, xs, ys, n, index, scale):
    """Same rule as simcore.latency.piecewise_linear, on the first n knots."""
    if x <= xs[0]:
        return ys[0]
    if x > xs[n - 1]:
        slope = (ys[n - 1] - ys[n - 2]) / (xs[n - 1] - xs[n - 2])
        return ys[n - 1] + slope * (x - xs[n - 1])
    j = _first_knot_at_or_above(x, xs, n, index, scale)
    if xs[j] == x:
        return ys[j]
    slope = (ys[j] - ys[j - 1]) / (xs[j] - xs[j - 1])
    return slope * (x - xs[j - 1]) + ys[j - 1]


@_inlined
def _prompt_time(curves, kind, tokens):
    return _piecewise_linear(float(tokens), curves.prompt_x[kind], curves.prompt_y[kind],
                             curves.prompt_n[kind], curves.prompt_index[kind],
                             curves.prompt_scale[kind])


@_inlined
def _decode_time(curves, kind, batch):
    """A decode iteration of `batch` requests at zero context."""
    return _piecewise_linear(float(batch), curves.decode_x[kind], curves.decode_y[kind],
                             curves.decode_n[kind], curves.decode_index[kind],
                             curves.decode_scale[kind])


@_inlined
def _host_time(curves, kind, sequences):
    """LatencyCurves.host_time: the engine's host time of an iteration."""
    return curves.iteration_overhead[kind] + curves.sequence_overhead[kind] * float(sequences)


@_inlined
def _combined(gpu, host, overlap):
    """LatencyCurves.with_host's rule: host time after the GPU work, or beside it."""
    if overlap:
        return max(gpu, host)
    return gpu + host


@_inlined
def _with_host(curves, kind, gpu, sequences):
    """LatencyCurves.with_host: an iteration's GPU time with the engine's host time."""
    return _combined(gpu, _host_time(curves, kind, sequences), curves.overlap_host[kind])


@_inlined
def _chunk_extra(curves, kind, piece, before):
    """LatencyCurves.chunk_extra: attention over the `before` tokens already prefilled."""
    if before <= 0:
        return 0.0
    c, c0 = float(piece), float(before)
    attention = c0 * max(curves.chunk_attention[kind] * c, curves.chunk_kv_read[kind])
    knee = (_prompt_time(curves, kind, c0 + c) - _prompt_time(curves, kind, c0)
            - _prompt_time(curves, kind, c))
    return max(attention, knee)


@_inlined
def _iteration_time(curves, kind, tokens, batch, context):
    """LatencyCurves' prompt_time, token_time or mixed_time for SKU `kind`."""
    c = curves
    if batch == 0:
        return _piecewise_linear(float(tokens), c.prompt_x[kind], c.prompt_y[kind],
                                 c.prompt_n[kind], c.prompt_index[kind], c.prompt_scale[kind])
    decode = _decode_time(curves, kind, batch)
    if tokens == 0:
        return decode + c.context_s[kind] * float(context)
    prompt = c.mixed_factor[kind] * _piecewise_linear(
        float(tokens + batch * c.decode_q[kind]), c.prompt_x[kind], c.prompt_y[kind], c.prompt_n[kind],
        c.prompt_index[kind], c.prompt_scale[kind])
    return max(prompt, decode) + c.context_s[kind] * float(context)


@_compiled
def _kv_transfer(settings, prompt, src, dst):
    """Same rule as simcore.cluster.kv_transfer_seconds, between machine records."""
    size = np.int64(prompt) * settings.kv_bytes  # (an int32 record field: 64-bit product)
    bandwidth = min(src.link, dst.link)
    if prompt < settings.layerwise_min:
        return size / bandwidth
    return max(src.visible, dst.visible) + size / (settings.layers * bandwidth)
