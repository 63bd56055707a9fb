"""Workloads: requests as arrays (arrival time, prompt tokens, output tokens)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, eq=False)
class Workload:
    """Requests sorted by arrival. Times in seconds from the first arrival window's start."""
    name: str
    arrival_s: np.ndarray       # float64, non-decreasing
    prompt_tokens: np.ndarray   # int64, >= 1
    output_tokens: np.ndarray   # int64, >= 1 (the first output token comes from the prompt phase)
    notes: tuple[str, ...] = field(default=())

    def __len__(self) -> int:
        return len(self.arrival_s)
