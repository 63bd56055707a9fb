"""The workload samples a search draws, kept while they are among the latest drawn: a search
simulates the same few samples (a rate, the seeds) on many clusters. Below the evaluator,
so that the capacity bounds and unit costs read the same samples without importing it."""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable

from provisioner.study import Study
from simcore import Workload


class LatestRequests:
    """The latest values put, up to `limit` requests in all (`size(value)` each; a single
    larger value is not kept): a thread-safe LRU that keeps its running total, since summing
    hundreds of entries at every put cost a search more than 1% of its time."""

    def __init__(self, limit: int, size: Callable[[Any], int]):
        self.limit, self.size = limit, size
        self._entries: OrderedDict = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()   # simulations may run on several threads

    def get(self, key):
        with self._lock:
            if key not in self._entries:
                return None
            self._entries.move_to_end(key)
            return self._entries[key]

    def put(self, key, value) -> None:
        with self._lock:
            if key in self._entries:
                self._held -= self.size(self._entries.pop(key))
            self._entries[key] = value
            self._held += self.size(value)
            while self._held > self.limit:
                self._held -= self.size(self._entries.popitem(last=False)[1])

    def __len__(self) -> int:
        return len(self._entries)


# A search simulates the same few workload samples (a rate, the seeds) on many clusters; drawing
# one costs about a fifth of a 2-minute simulation, so the latest samples are kept, up to
# SAMPLE_CACHE_REQUESTS requests in all (a few MB per process; one huge window is not kept).
SAMPLE_CACHE_REQUESTS = 2_000_000
_SAMPLES = LatestRequests(SAMPLE_CACHE_REQUESTS, len)


def workload_sample(source, rate_rps: float | None, duration_s: float, seed: int,
                    base_seed: int, closed=None) -> Workload:
    """`source.at(...)`, or with a closed loop (`study.ClosedLoad`) its sample for the seed,
    the same object while it stays among the latest samples drawn."""
    key = (source, rate_rps, duration_s, seed, base_seed, closed)
    sample = _SAMPLES.get(key)
    if sample is None:
        sample = (closed.sample(source, seed) if closed is not None
                  else source.at(rate_rps, duration_s, seed, base_seed=base_seed))
        _SAMPLES.put(key, sample)
    return sample


def study_sample(study: Study, rate_rps: float | None, seed: int) -> Workload:
    """The study's sample `seed` at a point's rate (a closed loop: its users' loop)."""
    return workload_sample(study.workload, rate_rps, study.duration_s, seed, study.seed,
                           study.goal.closed)
