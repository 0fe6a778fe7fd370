"""Workload shaping: build a time-varying workload from any trace (``--phases``).

The adaptive-composition experiments need load that changes character over
time: busy periods dominated by short requests, quiet periods with more long
ones. Rather than invent a second generator, we reshape an existing trace
(Mooncake, Azure or synthetic) phase by phase, so lengths and prefix reuse
stay those of real traffic.

Syntax
------
Phases are separated by ``;``. Each phase is a duration, optionally followed
by ``:`` and comma-separated options::

    300s:rate=2,long=0.3;300s:rate=0.5,long=3;repeat=3

- duration: a number with an optional unit, ``s`` (default), ``m`` or ``h``:
  ``300``, ``300s``, ``5m``, ``0.5h``;
- ``rate=X`` (default 1): arrival rate as a multiple of the source trace's
  mean rate (requests / second over its span), X > 0;
- ``long=F`` (default 1): sampling weight of a long request (longer than the
  long threshold, 32K tokens by default) relative to a short one, F >= 0. With
  a source long fraction p, the phase's long fraction becomes
  ``p F / (p F + 1 - p)``: ``long=3`` triples the odds, ``long=0.3`` cuts them;
- ``name=LABEL`` (default ``rate=X,long=F``): the phase's label in the
  boundaries and in per-phase reports; repeated phases share their label;
- a final ``repeat=N`` item repeats the whole sequence N times (cycling).

Semantics
---------
The source trace is read in arrival order, as if it repeated forever. Each
phase takes the next stretch of it: every request is kept with probability
proportional to its weight (so the length mix shifts, but conversation turns
stay in their order) until ``round(rate * source_rate * duration)`` requests
are kept. That stretch of source time is then mapped linearly onto the
phase, which preserves the source's burstiness within the phase while
setting its mean rate. A single phase with ``rate=1,long=1`` as long as the
source (including the mean gap after its last request) reproduces the source.

Kept requests keep their block keys, so prefix reuse survives. When the
phases consume more than the source holds, the source is cycled; each cycle's
keys are remapped with a per-cycle bijection, so reuse within a cycle stays
intact but a request never hits on its own copy from an earlier cycle. The
result gets new ids in arrival order. Seeded and deterministic.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from vertumnus.core.keys import remap_keys, salt_of
from vertumnus.core.types import Request
from vertumnus.sim.traces import Trace

__all__ = ["Phase", "PhaseBoundary", "apply_phases", "parse_phases"]

#: (start_s, end_s, label) of one phase in the shaped trace.
PhaseBoundary = tuple[float, float, str]


@dataclass(frozen=True)
class Phase:
    """One phase: ``duration_s`` seconds at ``rate`` x the source rate, long-request weight ``long``."""

    duration_s: float
    rate: float = 1.0
    long: float = 1.0
    label: str = ""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError(f"phase duration must be > 0 s, got {self.duration_s}")
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError(f"phase rate must be > 0, got {self.rate}")
        if not (math.isfinite(self.long) and self.long >= 0):
            raise ValueError(f"phase long weight must be >= 0, got {self.long}")
        if not self.label:
            object.__setattr__(self, "label", f"rate={self.rate:g},long={self.long:g}")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smh]?)\s*$", re.IGNORECASE)
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def _number(part: str, key: str, value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise ValueError(f"bad phase {part!r}: {key}={value!r} is not a number") from None
    return x


def parse_phases(spec: str) -> list[Phase]:
    """Parse a ``--phases`` string (syntax in the module docstring) into phases.

    ``repeat=N`` is expanded, so the result lists every phase in time order.
    Raises ValueError naming the bad part.
    """
    items = [p.strip() for p in spec.split(";")]
    if not any(items):
        raise ValueError("empty --phases; expected e.g. 300s:rate=2,long=0.3;300s:rate=0.5,long=3")
    repeat = 1
    phases: list[Phase] = []
    for idx, part in enumerate(items):
        if not part:
            raise ValueError(f"empty phase at position {idx + 1} in {spec!r}")
        if part.lower().startswith("repeat"):
            key, _, value = part.partition("=")
            if key.strip().lower() != "repeat" or idx != len(items) - 1:
                raise ValueError(f"bad phase {part!r}: repeat=N may only be the last item")
            if not value.strip().isdigit() or int(value) < 1:
                raise ValueError(f"bad phase {part!r}: repeat needs a whole number >= 1")
            repeat = int(value)
            continue
        head, _, opts = part.partition(":")
        m = _DURATION.match(head)
        if not m:
            raise ValueError(
                f"bad phase {part!r}: duration {head.strip()!r} is not like 300s, 5m or 0.5h"
            )
        duration = float(m.group(1)) * _UNIT[m.group(2).lower()]
        kwargs: dict[str, float] = {}
        label = ""
        for opt in opts.split(",") if opts.strip() else []:
            key, sep, value = (s.strip() for s in opt.partition("="))
            if not sep or not key or not value:
                raise ValueError(f"bad phase {part!r}: option {opt.strip()!r} is not KEY=VALUE")
            if key == "name":
                label = value
            elif key in ("rate", "long"):
                kwargs[key] = _number(part, key, value)
            else:
                raise ValueError(f"bad phase {part!r}: unknown option {key!r} (rate, long, name)")
        try:
            phases.append(Phase(duration, label=label, **kwargs))
        except ValueError as e:
            raise ValueError(f"bad phase {part!r}: {e}") from None
    if not phases:
        raise ValueError(f"no phases in {spec!r}; repeat=N needs phases before it")
    return phases * repeat


def apply_phases(
    trace: Trace,
    phases: str | Sequence[Phase],
    *,
    seed: int = 0,
    long_threshold: int = 32768,
) -> tuple[Trace, list[PhaseBoundary]]:
    """Reshape ``trace`` into consecutive phases; returns the trace and ``[(start_s, end_s, label)]``.

    ``phases`` is a ``--phases`` string or parsed :class:`Phase` objects. See
    the module docstring for what a phase does to rates and lengths.
    """
    plist = parse_phases(phases) if isinstance(phases, str) else list(phases)
    if not plist:
        raise ValueError("no phases given")
    src = trace.requests
    n = len(src)
    if n < 2 or trace.duration_s <= 0:
        raise ValueError(f"trace {trace.name!r} spans no time; cannot derive a rate to shape")
    t0 = src[0].arrival_s
    period = trace.period_s
    base_rate = n / period
    is_long = [r.length > long_threshold for r in src]
    has_long, has_short = any(is_long), not all(is_long)
    rng = np.random.default_rng(seed)

    out: list[Request] = []
    bounds: list[PhaseBoundary] = []
    cursor = 0  # unrolled index into the cycled source: cycle = j // n, i = j % n
    window_start = 0.0  # unrolled source time where the next phase's stretch begins
    start = 0.0
    for ph in plist:
        end = start + ph.duration_s
        bounds.append((start, end, ph.label))
        target = round(ph.rate * base_rate * ph.duration_s)
        # Acceptance probabilities: weights scaled so the heaviest class present
        # is always kept (scaling by an absent class could make every draw fail).
        w_max = max(ph.long if has_long else 0.0, 1.0 if has_short else 0.0)
        if w_max == 0:
            raise ValueError(
                f"phase {ph.label!r} has long=0 but every request of {trace.name!r} is long"
            )
        p_long, p_short = ph.long / w_max, 1.0 / w_max
        kept: list[tuple[float, int]] = []  # (unrolled time, unrolled index)
        # Draw acceptance in chunks: one rng call per candidate would dominate.
        while len(kept) <= target:  # one extra: its time closes the window
            chunk = rng.random(max(64, 2 * (target + 1 - len(kept))))
            for u in chunk:
                cycle, i = divmod(cursor, n)
                if u < (p_long if is_long[i] else p_short):
                    kept.append((src[i].arrival_s - t0 + cycle * period, cursor))
                    if len(kept) > target:
                        break
                cursor += 1
        window_end, next_index = kept.pop()
        span = window_end - window_start
        for k, (u_time, j) in enumerate(kept):
            if span > 0:
                t = start + (u_time - window_start) * ph.duration_s / span
            else:  # a stretch with no time in it: spread evenly
                t = start + ph.duration_s * k / max(1, len(kept))
            t = min(max(t, start), math.nextafter(end, start))
            cycle, i = divmod(j, n)
            r = src[i]
            # Each cycle a key space of its own: reuse within a cycle, none across.
            keys = (
                r.block_keys
                if cycle == 0
                else remap_keys(r.block_keys, salt_of(f"vertumnus.sim.phases/cycle/{cycle}"))
            )
            out.append(replace(r, id=len(out), arrival_s=t, block_keys=keys))
        window_start, cursor = window_end, next_index
        start = end
    shaped = Trace.from_requests(f"{trace.name}+phases", out, trace.block_size)
    return shaped, bounds
