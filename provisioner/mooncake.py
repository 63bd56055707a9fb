"""Mooncake request traces at the input edge (issue 41, first slice).

The FAST'25 Mooncake release (`kvcache-ai/Mooncake`, FAST25-release/traces; a copy with its
README in ../shared/traces/mooncake) is JSON lines, one request a line:

    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, ...]}

- `timestamp`: arrival in milliseconds from the start of the trace; the released traces sit on a
  ~3 s grid with up to 28 requests on one timestamp. Those bursts never happened as such: the
  requests of one timestamp are spread **evenly** over the step to the next distinct timestamp
  (the k-th of n at t + k/n x step; the last timestamp's step is the median step), a
  deterministic spreading that needs no seed;
- `input_length`, `output_length`: the prompt and output tokens;
- `hash_ids`: one id per 512-token block of the prompt, an id standing for its whole prefix.
  They are kept (`MooncakeTrace.blocks`, and as dense ids on the workload,
  `Workload.prefix_blocks`), so that prefix caching (`SimOptions.prefix_cache`, off by default)
  can hit them; `prefix_reuse` computes the bound a cache could reach. Every workload sample
  of a search keeps real requests with their blocks (`simcore.workload.cyclic_window`).

A malformed line is refused with one `InputError` naming the file and the line.
"""
from __future__ import annotations

import json
import math
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

from hardware_catalog import read_text
from hardware_catalog.csvschema import MAX_REQUEST_TOKENS
from hardware_catalog.errors import InputError
from simcore.workload import MAX_REQUESTS, MAX_TRACE_BYTES, MAX_TRACE_SECONDS, Workload

BLOCK_TOKENS = 512                       # tokens per hash id (the Mooncake release's README)
KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
SUFFIXES = (".jsonl", ".json")
# the LRU cache sizes report.json echoes beside the infinite cache (tokens)
LRU_TOKENS = (10_000_000, 1_000_000)


@dataclass(frozen=True, eq=False)
class MooncakeTrace:
    """The trace as a workload (spread arrivals) and each request's block ids, in the same
    (arrival) order."""
    workload: Workload
    blocks: tuple[np.ndarray, ...]

    @property
    def input_tokens(self) -> np.ndarray:
        return self.workload.prompt_tokens


def is_mooncake(path: str | Path) -> bool:
    """A JSON-lines file whose first non-blank line names the Mooncake keys (by content: the
    suffix is .jsonl or .json). A malformed first line that names them is still this format,
    so that the reader refuses it with its line number."""
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        return False
    try:
        with open(path, "rb") as f:
            for _ in range(1000):
                line = f.readline(1 << 16)
                if not line:
                    return False
                if line.strip():
                    return b'"input_length"' in line and b'"timestamp"' in line
    except OSError:
        return False
    return False


def _integer(value, key: str, where: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not value.is_integer()):
        raise InputError(f"{where}: {key} must be an integer, not {json.dumps(value)}")
    if value < minimum:
        raise InputError(f"{where}: {key} must be at least {minimum}, not {value:g}")
    if value > MAX_REQUEST_TOKENS and key != "timestamp":
        raise InputError(f"{where}: {key} {value:g} is more than {MAX_REQUEST_TOKENS} tokens")
    return int(value)


def _parse(text: str, source: str):
    times, prompts, outputs, blocks = [], [], [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"{where} is not JSON ({err.msg}); fix or drop it",
                             source=source) from None
        try:
            if not isinstance(record, dict):
                raise InputError(f"{where} is not a JSON object")
            missing = [key for key in KEYS if key not in record]
            if missing:
                raise InputError(f"{where} lacks {', '.join(missing)} (a Mooncake request has "
                                 f"{', '.join(KEYS)})")
            stamp = record["timestamp"]
            if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or \
                    not math.isfinite(stamp) or stamp < 0 or stamp / 1000 > MAX_TRACE_SECONDS:
                raise InputError(f"{where}: timestamp must be milliseconds from 0 to "
                                 f"{MAX_TRACE_SECONDS * 1000:g}, not {json.dumps(stamp)}")
            prompt = _integer(record["input_length"], "input_length", where, minimum=1)
            output = _integer(record["output_length"], "output_length", where, minimum=1)
            ids = record["hash_ids"]
            if not isinstance(ids, list) or any(isinstance(i, bool) or not isinstance(i, int)
                                                for i in ids):
                raise InputError(f"{where}: hash_ids must be a list of integers")
        except InputError as err:
            raise InputError(err.args[0] if err.args else str(err), source=source) from None
        if len(times) >= MAX_REQUESTS:
            raise InputError(f"more than {MAX_REQUESTS} requests; at most {MAX_REQUESTS} can be "
                             "simulated: replay a shorter window of the trace", source=source)
        times.append(float(stamp))
        prompts.append(prompt)
        outputs.append(output)
        blocks.append(np.asarray(ids, dtype=np.int64))
    if not times:
        raise InputError("no requests (a Mooncake trace has one JSON object a line)",
                         source=source)
    return np.asarray(times), np.asarray(prompts, np.int64), np.asarray(outputs, np.int64), blocks


def spread(stamps_ms: np.ndarray) -> np.ndarray:
    """Arrival seconds: the n requests of one (sorted) timestamp t at t + k/n x step, k = 0..n-1,
    step the gap to the next distinct timestamp (the median gap for the last one; none when
    there is only one timestamp)."""
    distinct, first, counts = np.unique(stamps_ms, return_index=True, return_counts=True)
    gaps = np.diff(distinct)
    last = float(np.median(gaps)) if len(gaps) else 0.0
    steps = np.append(gaps, last)
    arrival = np.empty(len(stamps_ms))
    for t, start, n, step in zip(distinct, first, counts, steps):
        arrival[start:start + n] = t + step * np.arange(n) / n
    return arrival / 1000.0


def read_mooncake(path: str | Path) -> MooncakeTrace:
    """Read and check a Mooncake trace: its requests in timestamp order (stably sorted if the
    file is not), arrivals spread within each timestamp's step."""
    source = str(path)
    text = read_text(path, max_bytes=MAX_TRACE_BYTES)
    stamps, prompt, output, blocks = _parse(text, source)
    notes = []
    if np.any(np.diff(stamps) < 0):
        order = np.argsort(stamps, kind="stable")
        stamps, prompt, output = stamps[order], prompt[order], output[order]
        blocks = [blocks[i] for i in order]
        notes.append(f"timestamps were not sorted; sorted {len(order)} requests by timestamp")
    arrival = spread(stamps)
    most = int(np.unique(stamps, return_counts=True)[1].max())
    notes.insert(0, f"{len(prompt)} requests of a Mooncake trace; the requests of one timestamp "
                    f"(up to {most}) spread evenly to the next timestamp")
    dense, offsets = dense_blocks(blocks)
    workload = Workload(Path(path).name, arrival, prompt, output, tuple(notes),
                        prefix_blocks=dense, prefix_offsets=offsets,
                        prefix_block_tokens=BLOCK_TOKENS)
    return MooncakeTrace(workload, tuple(blocks))


def dense_blocks(blocks: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The requests' hash ids as one flat array of dense ids 0..B-1 (in order of the hash ids'
    values) and the offsets of each request's ids (len(blocks) + 1), as `Workload` keeps them
    (`Workload.prefix_blocks`, `prefix_offsets`)."""
    lengths = np.fromiter((len(b) for b in blocks), np.int64, count=len(blocks))
    offsets = np.zeros(len(blocks) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = (np.concatenate([np.asarray(b, np.int64) for b in blocks]) if offsets[-1]
            else np.zeros(0, np.int64))
    _, dense = np.unique(flat, return_inverse=True)
    return dense.astype(np.int64).reshape(-1), offsets


def prefix_reuse(blocks: Sequence[Sequence[int]], input_tokens: Sequence[int],
                 cache_tokens: int | None = None, block_tokens: int = BLOCK_TOKENS) -> float:
    """The share of input tokens whose block was seen before: requests in order, each hits the
    longest run of its leading blocks present in the cache (512 tokens a block, the prompt's
    remainder for its last), then all its blocks are inserted or refreshed. One cache of every
    block (`cache_tokens` None) or one LRU cache of cache_tokens // block_tokens blocks. A bound
    on what prefix caching could save: one global cache, whole prompts cached at arrival."""
    capacity = None if cache_tokens is None else cache_tokens // block_tokens
    cache: OrderedDict = OrderedDict()
    hit = total = 0
    for ids, tokens in zip(blocks, input_tokens):
        tokens = int(tokens)
        total += tokens
        k = 0
        for block in ids:
            if block not in cache:
                break
            k += 1
        hit += min(k * block_tokens, tokens)
        if capacity == 0:
            continue
        for block in ids:
            block = int(block)
            if block in cache:
                cache.move_to_end(block)
            else:
                cache[block] = None
                if capacity is not None and len(cache) > capacity:
                    cache.popitem(last=False)
    return hit / total if total else 0.0


@lru_cache(maxsize=4)
def reuse_bounds(path: str, sha256: str) -> dict:
    """report.json's echo of a Mooncake workload's prefix-reuse bound (the whole file)."""
    trace = read_mooncake(path)
    tokens = trace.input_tokens
    bounds = {"infinite_cache": round(prefix_reuse(trace.blocks, tokens), 4)}
    for size in LRU_TOKENS:
        bounds[f"lru_{size // 1_000_000}M_tokens"] = round(
            prefix_reuse(trace.blocks, tokens, size), 4)
    return {"block_tokens": BLOCK_TOKENS, "requests": len(tokens), **bounds,
            "simulated": "a bound (one global cache, the whole file); --prefix-cache on or "
                         "aware simulates each instance's cache on every sample"}


def reuse_line(bounds: dict) -> str:
    """The one line search and simulate print."""
    return (f"prefix reuse bound: {bounds['infinite_cache']:.0%} of input tokens seen before "
            f"(infinite cache); --prefix-cache on simulates each instance's cache")
