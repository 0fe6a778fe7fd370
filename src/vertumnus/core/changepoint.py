"""Where the window's arrivals changed, if they did (issue 12): the what-if check's forecast.

The what-if check (:mod:`vertumnus.core.whatif`) replays a window's requests
on candidate compositions, taking the window as a forecast of the next ones.
Right after a phase change, most of the window still holds the old phase,
so the replay judges the future on the past. The lagged oracle in
``bench/time_varying.py`` measures what that costs: on a mix whose high phase
saturates the low phase's composition, a move 2.5 s after the change keeps
80.8 % of the per-phase oracle's gain, and one after 10 s keeps 10 %.

This module finds the most likely **change point** among a window's hops.
It treats the arrivals of short and of long requests as two independent
Poisson streams, each with one rate before the change and another after it.
The likelihood-ratio statistic of such a split against one rate for the
whole window is

    G = 2 Σ_streams [ n_a ln(n_a / (N t_a / T)) + n_b ln(n_b / (N t_b / T)) ],

where n_a and n_b are the counts before and after, t_a and t_b the two
spans, N = n_a + n_b, and T = t_a + t_b. The caller compares G with its
threshold (``PlannerSettings.whatif_change``, 25 by default). Under one
constant rate, G of a fixed split is about χ² with 2 degrees of freedom. The
maximum over a window's seven splits has a 99th percentile near 12.5 and
reached 25 in none of 10,000 simulated windows (``tests/core/test_changepoint.py``).
Real traces are burstier than Poisson, and G grows with the window's count:
on a stationary but bursty trace it measures the bursts. At 40 GPUs the
bursty Azure code trace reaches 25 at 85–100 % of its looks; at 256 GPUs
(six times the requests per window) 9 of the 15 cells of
``bench/families.py`` reach it at most looks, the tool agent's and the
long-context preset's among them. So the controller also asks a change to
stand out of the traffic's own bursts: G at least
``PlannerSettings.whatif_change_over`` times the median G of its looks of
the last four minutes (``Controller._change`` in
:mod:`vertumnus.core.control`). A phase change of the three time-varying
mixes is 5–68 times that median at the first look after it, and 14–107
times at its peak. The check's other conditions carry the rest: a decisive
gain on the requests since the change, and enough requests on both sides.
Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Change", "last_change"]


@dataclass(frozen=True, slots=True)
class Change:
    """The most likely change point of a window."""

    hops: int
    """Hops since the change: the window's last ``hops`` hops are after it."""
    statistic: float
    """G, the likelihood-ratio statistic of the split (module docstring)."""


def _term(n: int, share: float, total: int) -> float:
    """n ln(n / (total · share)), 0 for n = 0."""
    return n * math.log(n / (total * share)) if n else 0.0


def last_change(counts: Sequence[tuple[int, int]]) -> Change | None:
    """The split of ``counts`` (per hop, oldest first: short and long requests that
    arrived in it; hops of equal length) with the largest G, or None for a window
    of fewer than two hops or without requests."""
    n_hops = len(counts)
    if n_hops < 2:
        return None
    total_short = sum(c[0] for c in counts)
    total_long = sum(c[1] for c in counts)
    if total_short + total_long == 0:
        return None
    best: Change | None = None
    after_short = after_long = 0
    for k in range(1, n_hops):  # k hops after the change
        s, lg = counts[n_hops - k]
        after_short += s
        after_long += lg
        share_after = k / n_hops
        g = 2.0 * (
            _term(total_short - after_short, 1.0 - share_after, total_short)
            + _term(after_short, share_after, total_short)
            + _term(total_long - after_long, 1.0 - share_after, total_long)
            + _term(after_long, share_after, total_long)
        )
        if best is None or g > best.statistic:
            best = Change(k, g)
    return best
