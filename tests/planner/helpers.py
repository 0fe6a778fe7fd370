"""Workloads shared by the planner tests."""

from __future__ import annotations

import numpy as np

from vertumnus.core.types import Request
from vertumnus.sim.traces import Trace


def two_phase_trace(seed: int = 0) -> Trace:
    """60 s of many short requests, then 60 s of few, mostly long ones (no prefix reuse)."""
    rng = np.random.default_rng(seed)
    reqs = []
    t = 0.0
    while t < 60.0:
        t += rng.exponential(1 / 40)
        reqs.append((t, int(rng.integers(500, 4000))))
    while t < 120.0:
        t += rng.exponential(1 / 3)
        long = rng.random() < 0.6
        reqs.append((t, int(rng.integers(40000, 90000)) if long else int(rng.integers(500, 4000))))
    out = [
        Request(i, at, n, tuple(range(i * 1000, i * 1000 + (n + 511) // 512)))
        for i, (at, n) in enumerate(reqs)
    ]
    return Trace("two-phase", tuple(out), 512)
