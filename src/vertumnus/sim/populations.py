"""More users, not faster ones: a trace served by several populations side by side.

A trace recorded on a small pool carries the load of its users. A larger pool
serves more users, each with the same habits: the same think time between a
conversation's turns, the same few seconds between an agent's tool calls.
Compressing the trace in time (``--rate-scale``) gets the rate, but makes every
user faster too: a tool-agent workload loaded for 40 GPUs and compressed 6.4
times more for 256 has a session's next step come 0.15 s after its last (the
median, from 0.9 s), before that step's prefill has ended, and the queues that
builds are an artefact (docs/benchmarks/adaptive.md, "Larger pools from more
users").

:func:`populations` lays ``n`` copies of a trace over one another instead, each
copy one population of users (:func:`population`): its arrivals rotated by its
share of the trace's period, so the copies' bursts do not coincide, and its
block keys salted, so no population hits on another's prefixes (a shared system
prompt is then one per population, as a cycled phase's is one per cycle,
:mod:`vertumnus.sim.phases`). The rate is ``n`` times the trace's; each
conversation keeps its pace.
"""

from __future__ import annotations

from dataclasses import replace

from vertumnus.core.keys import remap_keys, salt_of
from vertumnus.sim.traces import Trace

__all__ = ["population", "populations"]


def population(trace: Trace, c: int, n: int) -> Trace:
    """Population ``c`` of ``n``: ``trace`` rotated by ``c / n`` of its period, its
    block keys salted by ``c``; population 0 is ``trace`` itself.

    The period is :attr:`Trace.period_s`, as
    :func:`~vertumnus.sim.phases.apply_phases` cycles the trace; arrivals stay
    within a period of the trace's first.
    """
    if not 0 <= c < n:
        raise ValueError(f"population {c} of {n}: expected 0 <= population < {n}")
    if c == 0:
        return trace
    src = trace.requests
    if len(src) < 2 or trace.duration_s <= 0:
        raise ValueError(f"trace {trace.name!r} spans no time; cannot rotate it into populations")
    t0 = src[0].arrival_s
    period = trace.period_s
    shift = c * period / n
    salt = salt_of(f"vertumnus.sim.populations/{c}")
    moved = [
        replace(
            r,
            arrival_s=t0 + (r.arrival_s - t0 - shift) % period,
            block_keys=remap_keys(r.block_keys, salt),
        )
        for r in src
    ]
    return Trace.from_requests(f"{trace.name}/population{c}", moved, trace.block_size)


def populations(trace: Trace, n: int) -> Trace:
    """``n`` populations of ``trace``'s users side by side: ``n`` times its rate, each
    conversation at its own pace; ids renumbered in arrival order."""
    if not (isinstance(n, int) and n >= 1):
        raise ValueError(f"populations must be a whole number >= 1, got {n!r}")
    if n == 1:
        return trace
    merged = (r for c in range(n) for r in population(trace, c, n).requests)
    return Trace.from_requests(f"{trace.name}x{n}", merged, trace.block_size)
