"""κ that follows the workload: the capacity profile corrected online from the pool's own windows.

The shipped capacity profile κ_C (:class:`~vertumnus.core.planner.CapacityProfile`)
was measured on one workload (the Mooncake conversation trace). κ depends on
the request mix: measured the same way (``python -m vertumnus.sim.capacity``)
on other families, κ_4 is 0.75× the shipped value on ``toolagent`` and 1.7×
on the Azure code trace (docs/benchmarks/adaptive.md, "κ that follows the
workload"). The rules compare window demand with κ, so a wrong κ moves the
utilization thresholds.

The pool runs the profiling experiment all the time: in each window the
workers of degree C receive some demand (Σ Ê of the requests first placed on
them) and serve those requests with some SLO attainment. A **sample** is one
degree's window (disjoint windows of the controller's ``window_s``, the
profile's time scale, even when the controller evaluates sliding windows
every hop): its demand rate per worker d (demand / workers / window seconds)
and the token-weighted attainment a of its requests, each held to
τ_i = max(floor, scale · E_C(L_i, 0)) on *its own* degree, as the profile
does (:mod:`vertumnus.sim.capacity`).

The learner assumes the workload changes the **scale** of the profile's
attainment curve, not its shape: a(d) = f_C(d / (m_C · κ_C)), where f_C is the
shipped curve of degree C (its ``levels``, demand normalised by κ_C) and m_C
the unknown correction. It fits m_C by weighted least squares over the
samples, with a log-normal prior centred on 1 (the shipped profile; σ 0.5 in
log m, its penalty weighted by ``prior_weight``), over a fixed grid of m
(2^(k/32), from 0.35 to 2.8), and reports κ̂_C = m̂_C · κ_C. Samples at low load, where the
curve is flat, say little; samples near the knee say most. Old samples fade
(each new sample of a degree discounts the earlier ones by 2^(−1/half_life)),
so the estimate follows a workload that changes.

Samples are binned by d / κ_C (60 bins up to 3 κ_C), so memory and the fit's
cost are fixed however long the pool runs. :class:`SampleBook` turns
placements and completions into samples: a degree's window becomes one when
every request first placed on its workers in that window has finished. In an
operator-run pool each router replica keeps a :class:`ReplicaBook` and reports
its sums per (hop, degree); the operator's book adds them up. Pure: no clock,
no I/O.

The controller reads it with ``PlannerSettings.learn_capacity`` (off by
default: the rules' thresholds were calibrated on the shipped κ; measured in
docs/benchmarks/adaptive.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vertumnus.core.planner import CapacityProfile

__all__ = [
    "CapacityLearner",
    "LearnedBins",
    "LearnerSettings",
    "Part",
    "ReplicaBook",
    "Sample",
    "SampleBook",
    "default_curve",
]

_BINS = 60
_R_MAX = 3.0
_NEGLIGIBLE = 1e-9
"""A bin whose decayed weight is this small is out of the fit (and, since weights
only decay, stays out): it is not kept either."""
_GRID = tuple(2.0 ** (k / 32) for k in range(-48, 49))
"""The corrections m tried (0.35 … 2.83, 2.2 % apart; 1.0 is on the grid)."""


@dataclass(frozen=True)
class LearnerSettings:
    prior_weight: float = 1.0
    """Weight of the prior's penalty (log m / prior_sigma)² / 2 against the samples'
    squared errors (each sample of ≥ 10 requests weighs 1)."""
    prior_sigma: float = 0.5
    """Spread of the prior on log m (0.5: a factor of 1.65 is one standard deviation)."""
    half_life: float = 200.0
    """Samples of a degree after which an old one counts half."""
    min_requests: int = 1
    """A worker's hop with fewer requests is not a sample."""

    def __post_init__(self) -> None:
        if self.prior_weight <= 0 or self.prior_sigma <= 0 or self.half_life <= 0:
            raise ValueError(f"capacity learner needs positive settings, got {self}")


def default_curve(target: float) -> tuple[tuple[float, float], ...]:
    """The attainment curve assumed when a profile has no measured levels:
    1 − (1 − target)·r², which meets the target at r = 1 (d = κ)."""
    return tuple((r / 10, max(0.0, 1.0 - (1.0 - target) * (r / 10) ** 2)) for r in range(0, 31))


class _Curve:
    """f_C: attainment against d/κ_C, piecewise linear and non-increasing."""

    def __init__(self, points: Sequence[tuple[float, float]]) -> None:
        pts = sorted(points)
        if not pts or pts[0][0] > 0:
            pts.insert(0, (0.0, 1.0))
        xs, ys, low = [], [], 1.0
        for x, y in pts:
            low = min(low, y)  # measured curves wobble; the fit needs a monotone one
            xs.append(x)
            ys.append(low)
        self.xs, self.ys = xs, ys

    def __call__(self, r: float) -> float:
        xs, ys = self.xs, self.ys
        if r >= xs[-1]:
            if len(xs) < 2:
                return ys[-1]
            # Beyond the last level: on along the last segment, down to 0.
            slope = (ys[-1] - ys[-2]) / max(xs[-1] - xs[-2], 1e-12)
            return max(0.0, ys[-1] + slope * (r - xs[-1]))
        lo, hi = 0, len(xs) - 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if xs[mid] <= r:
                lo = mid
            else:
                hi = mid
        t = (r - xs[lo]) / max(xs[hi] - xs[lo], 1e-12)
        return ys[lo] + t * (ys[hi] - ys[lo])


@dataclass(frozen=True)
class LearnedBins:
    """What a :class:`CapacityLearner` has learned, to give back to a new one (a shell
    that restarts): per degree the decayed sums of the demand bins the fit uses, and
    the samples counted."""

    bins: Mapping[int, tuple[tuple[int, float, float, float, float], ...]]
    """Degree → (bin, Σ w, Σ w·a, Σ w·a², Σ w·r) of each bin with weight."""
    samples: int = 0

    def __post_init__(self) -> None:
        if self.samples < 0:
            raise ValueError(f"learned samples must be >= 0, got {self.samples}")
        for d, rows in self.bins.items():
            for i, w, a, a2, r in rows:
                sums = (w, a, a2, r)
                if not 0 <= i < _BINS:
                    raise ValueError(f"learned bins of CP{d}: bin {i} is not in 0..{_BINS - 1}")
                if not all(math.isfinite(x) and x >= 0 for x in sums) or a > w or a2 > w:
                    raise ValueError(
                        f"learned bins of CP{d}, bin {i}: sums must be finite, >= 0, with "
                        f"attainment sums <= the weight, got {sums}"
                    )


class _Bins:
    """Decayed sums of one degree's samples per demand bin: weight, Σ w·a, Σ w·a², Σ w·r."""

    __slots__ = ("a", "a2", "r", "w")

    def __init__(self) -> None:
        self.w = [0.0] * _BINS
        self.a = [0.0] * _BINS
        self.a2 = [0.0] * _BINS
        self.r = [0.0] * _BINS

    def add(self, r: float, a: float, w: float, decay: float) -> None:
        for arr in (self.w, self.a, self.a2, self.r):
            for i in range(_BINS):
                arr[i] *= decay
        i = min(_BINS - 1, int(r / _R_MAX * _BINS))
        self.w[i] += w
        self.a[i] += w * a
        self.a2[i] += w * a * a
        self.r[i] += w * r

    @property
    def total(self) -> float:
        return sum(self.w)


class CapacityLearner:
    """κ̂ per degree from window samples (module docstring), starting at ``prior``."""

    def __init__(
        self,
        prior: CapacityProfile,
        settings: LearnerSettings | None = None,
        learned: LearnedBins | None = None,
    ) -> None:
        """The curve of each degree is the prior's measured ``levels``, or
        :func:`default_curve` for a degree without them. ``learned``: what a previous
        learner of the pool had (:meth:`learned`); bins of a degree the prior lacks
        are dropped, as its samples would be."""
        self.prior = prior
        self.settings = settings or LearnerSettings()
        self._decay = 0.5 ** (1.0 / self.settings.half_life)
        self._curves: dict[int, _Curve] = {}
        for d, k in prior.kappa_per_s.items():
            pts = prior.levels.get(d)
            if pts and k > 0:
                self._curves[d] = _Curve([(dem / k, att) for dem, att in pts])
            else:
                self._curves[d] = _Curve(default_curve(prior.target_attainment))
        self._bins: dict[int, _Bins] = {}
        self._m: dict[int, float] = {}
        self.samples = 0
        if learned is not None:
            self.samples = learned.samples
            for d, rows in learned.bins.items():
                if d not in self._curves:
                    continue
                bins = self._bins.setdefault(d, _Bins())
                for i, w, a, a2, r in rows:
                    bins.w[i], bins.a[i], bins.a2[i], bins.r[i] = w, a, a2, r

    def learned(self) -> LearnedBins:
        """What this learner has learned (:class:`LearnedBins`), for a new one."""
        return LearnedBins(
            {
                d: tuple(
                    (i, b.w[i], b.a[i], b.a2[i], b.r[i])
                    for i in range(_BINS)
                    if b.w[i] > _NEGLIGIBLE
                )
                for d, b in sorted(self._bins.items())
            },
            self.samples,
        )

    def add(self, degree: int, demand_per_s: float, attainment: float, requests: int = 1) -> None:
        """One worker's hop: its demand rate, its token-weighted attainment, its requests."""
        if requests < self.settings.min_requests or degree not in self._curves:
            return
        if not (math.isfinite(demand_per_s) and demand_per_s >= 0 and 0 <= attainment <= 1):
            raise ValueError(
                f"capacity sample needs demand >= 0 and attainment in [0, 1], "
                f"got {demand_per_s!r}, {attainment!r}"
            )
        k = self.prior.kappa(degree)
        bins = self._bins.setdefault(degree, _Bins())
        bins.add(demand_per_s / k, attainment, min(1.0, requests / 10), self._decay)
        self._m.pop(degree, None)
        self.samples += 1

    def correction(self, degree: int) -> float:
        """m̂_C: κ̂_C / κ_C (1.0 without samples)."""
        m = self._m.get(degree)
        if m is None:
            m = self._fit(degree)
            self._m[degree] = m
        return m

    def _fit(self, degree: int) -> float:
        bins = self._bins.get(degree)
        if bins is None or bins.total <= 0:
            return 1.0
        s = self.settings
        curve = self._curves[degree]
        used = [i for i in range(_BINS) if bins.w[i] > _NEGLIGIBLE]
        centres = [bins.r[i] / bins.w[i] for i in used]
        best, best_loss = 1.0, math.inf
        for m in _GRID:
            loss = s.prior_weight * (math.log(m) / s.prior_sigma) ** 2 / 2
            for i, rc in zip(used, centres, strict=True):
                f = curve(rc / m)
                # Σ w (a − f)² over the bin, from its sums.
                loss += bins.a2[i] - 2 * f * bins.a[i] + f * f * bins.w[i]
            if loss < best_loss - 1e-12:
                best, best_loss = m, loss
        return best

    def profile(self) -> CapacityProfile:
        """The prior with κ̂_C = m̂_C · κ_C for every degree."""
        return CapacityProfile(
            {d: k * self.correction(d) for d, k in self.prior.kappa_per_s.items()},
            self.prior.target_attainment,
            self.prior.levels,
        )


@dataclass(frozen=True, slots=True)
class Sample:
    """One degree's workers over one sample span (a window), complete (module docstring)."""

    degree: int
    demand_s: float
    """Σ Ê of the requests first placed on a worker of the degree in the hop,
    per worker of the degree."""
    requests: int
    attainment: float
    """Token-weighted share of those requests whose TTFT met their τ."""


class _Bucket:
    __slots__ = ("count", "demand_s", "done", "met_tokens", "requests", "tokens")

    def __init__(self) -> None:
        self.demand_s = 0.0
        self.requests = 0
        self.done = 0
        self.tokens = 0.0
        self.met_tokens = 0.0
        self.count = 0
        """Workers of the degree in the pool during the span (0: the span is open)."""


class SampleBook:
    """Per (span, degree) buckets of first placements, waiting for their completions
    (a span: ``hops_per_sample`` consecutive hops, one window).

    A sample is a degree's span, not a worker's: placement spreads a burst over
    the workers, so one worker's span measures where placement sent the burst
    as much as the worker's capacity, and the pool's rules read κ summed over
    the workers anyway. When a transition commits (:meth:`reshaped`) the open
    span gives no samples, nor does any bucket still waiting for requests (a
    drain and a switch are not the steady state κ describes); neither does a
    bucket still incomplete ``max_age`` spans later (a request that never
    finished: failed, or abandoned by its client).

    Shells that see every request use :meth:`placed` and :meth:`completed`; the
    operator, which sees the router replicas' sums, uses :meth:`add_placed` and
    :meth:`add_done` with the hop each sum belongs to.
    """

    def __init__(self, max_age: int = 20, hops_per_sample: int = 1) -> None:
        self.max_age = max_age
        self.hops_per_sample = hops_per_sample
        """Hops one sample spans (a window's worth: the profile's time scale, so that
        sliding windows' short hops do not make every sample a burst)."""
        self.hop = 0
        """The open hop."""
        self._buckets: dict[tuple[int, int], _Bucket] = {}
        self._pending: dict[int, tuple[int, int, int, float]] = {}
        """request id → (hop, degree, tokens, τ)."""
        self._reshaped = False
        self._dropped = False
        """An incomplete bucket was dropped since the last purge of ``_pending``."""

    def placed(
        self, request_id: int, degree: int, estimate_s: float, tokens: int, tau_s: float
    ) -> None:
        """A request's first placement, in the open hop, on a worker of ``degree``."""
        self.add_placed(self.hop, degree, estimate_s, 1)
        self._pending[request_id] = (self.hop, degree, tokens, tau_s)

    def completed(self, request_id: int, ttft_s: float) -> None:
        """A tracked request finished with this TTFT (unknown ids are ignored)."""
        entry = self._pending.pop(request_id, None)
        if entry is not None:
            hop, degree, tokens, tau = entry
            self.add_done(hop, degree, 1, tokens, tokens if ttft_s <= tau else 0)

    def add_placed(self, hop: int, degree: int, demand_s: float, requests: int) -> None:
        """``requests`` first placements with Σ Ê ``demand_s`` in ``hop`` (≤ the open hop)."""
        key = (hop // self.hops_per_sample, degree)
        if hop > self.hop or (hop < self.hop and key not in self._buckets):
            return  # a closed span's bucket is complete or gone: too late to add to it
        b = self._buckets.get(key)
        if b is None:
            b = self._buckets[key] = _Bucket()
        b.demand_s += demand_s
        b.requests += requests

    def add_done(self, hop: int, degree: int, done: int, tokens: float, met_tokens: float) -> None:
        """``done`` of the requests placed in ``hop`` finished; ``met_tokens`` of their
        ``tokens`` met their τ."""
        b = self._buckets.get((hop // self.hops_per_sample, degree))
        if b is not None:
            b.done += done
            b.tokens += tokens
            b.met_tokens += met_tokens

    def reshaped(self) -> None:
        """A transition committed (see the class docstring)."""
        self._reshaped = True
        for key in [k for k, b in self._buckets.items() if b.done < b.requests]:
            del self._buckets[key]
            self._dropped = True

    def close_hop(self, counts: Mapping[int, int]) -> list[Sample]:
        """The open hop ends (``counts``: the pool's workers per degree): the samples of
        every bucket now complete."""
        out: list[Sample] = []
        n = self.hops_per_sample
        span, last = self.hop // n, self.hop % n == n - 1
        for key in sorted(self._buckets):
            b = self._buckets[key]
            if key[0] == span:
                if self._reshaped or not counts.get(key[1]):
                    del self._buckets[key]
                    self._dropped = True
                    continue
                if not last:
                    continue  # the sample's span is still open
                b.count = counts[key[1]]
            if b.done >= b.requests:
                out.append(
                    Sample(
                        key[1], b.demand_s / b.count, b.requests, b.met_tokens / max(b.tokens, 1.0)
                    )
                )
            elif key[0] > span - self.max_age:
                continue
            else:
                self._dropped = True
            del self._buckets[key]
        if self._dropped:
            # Requests whose bucket is gone will never make a sample: forget them.
            self._pending = {
                r: e for r, e in self._pending.items() if (e[0] // n, e[1]) in self._buckets
            }
            self._dropped = False
        if last:
            self._reshaped = False
        self.hop += 1
        return out


@dataclass(frozen=True, slots=True)
class Part:
    """A router replica's sums for one (hop, degree), as the operator receives them."""

    hop: int
    degree: int
    demand_s: float = 0.0
    requests: int = 0
    done: int = 0
    tokens: float = 0.0
    met_tokens: float = 0.0


class ReplicaBook:
    """A router replica's side of the capacity samples when the operator runs the
    controller: it sets each request's τ (the replica has the prefill model) and
    reports sums per (hop, degree) with every window (:meth:`take`), so that the
    operator's :class:`SampleBook` can add up the replicas."""

    def __init__(self, max_age: int = 64) -> None:
        self.max_age = max_age
        self._open: dict[int, list[float]] = {}
        """degree → [demand, requests, done, tokens, met] of the open hop's placements."""
        self._late: dict[tuple[int, int], list[float]] = {}
        """(hop, degree) → [done, tokens, met] of earlier hops' requests finished since."""
        self._pending: dict[int, tuple[int | None, int, int, float]] = {}
        """request id → (hop it was placed in, None while that hop is open; degree; tokens; τ)."""
        self._open_ids: list[int] = []

    def placed(
        self, request_id: int, degree: int, estimate_s: float, tokens: int, tau_s: float
    ) -> None:
        row = self._open.setdefault(degree, [0.0, 0, 0, 0.0, 0.0])
        row[0] += estimate_s
        row[1] += 1
        self._pending[request_id] = (None, degree, tokens, tau_s)
        self._open_ids.append(request_id)

    def completed(self, request_id: int, ttft_s: float) -> None:
        entry = self._pending.pop(request_id, None)
        if entry is None:
            return
        hop, degree, tokens, tau = entry
        met = tokens if ttft_s <= tau else 0
        if hop is None:
            row = self._open[degree]
            row[2] += 1
            row[3] += tokens
            row[4] += met
        else:
            late = self._late.setdefault((hop, degree), [0, 0.0, 0.0])
            late[0] += 1
            late[1] += tokens
            late[2] += met

    def take(self, hop: int) -> list[Part]:
        """The open hop ends as ``hop``: its parts and the late completions since the last take."""
        parts = [
            Part(hop, d, row[0], int(row[1]), int(row[2]), row[3], row[4])
            for d, row in sorted(self._open.items())
        ]
        parts += [
            Part(h, d, done=int(v[0]), tokens=v[1], met_tokens=v[2])
            for (h, d), v in sorted(self._late.items())
        ]
        self._open, self._late = {}, {}
        for rid in self._open_ids:
            entry = self._pending.get(rid)
            if entry is not None:
                self._pending[rid] = (hop, *entry[1:])
        self._open_ids = []
        # A request that never finished (failed, abandoned): forget it after max_age hops.
        stale = [
            r for r, e in self._pending.items() if e[0] is not None and e[0] <= hop - self.max_age
        ]
        for r in stale:
            del self._pending[r]
        return parts
