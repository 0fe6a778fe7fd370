"""The composition controller: the planner's steps, the what-if check, and what they remember (design.md section 4).

The planner (:mod:`vertumnus.core.planner`) decides from one
:class:`~vertumnus.core.planner.WindowObservation` at a time; :class:`Controller`
builds those observations from what the pool does, the same way in every
shell (:class:`vertumnus.core.windows.ControlWindows`), runs the planner's
steps and passes every decision through the what-if check
(:mod:`vertumnus.core.whatif`). What it keeps between looks:

- **change points** (``settings.whatif_change``): where the window's
  arrivals changed, if they did (:mod:`vertumnus.core.changepoint`), so that
  the what-if check judges on the requests since the change, and the
  statistic of each look of the last minutes, which a change must stand out
  of (``settings.whatif_change_over``);
- **flaps** (``settings.damp_flaps``): the moves the check let start, and
  which of them reversed the one before within ``flap_s``; while the pool
  flaps, merges wait for a decisive gain since a change of arrivals that the
  recall allows;
- **recall** (``settings.whatif_recall_s``): each look's estimated gain of
  every merge candidate, so that a merge the whole window leads to is made
  only where the looks on this composition at the same mix, lately, do not
  estimate on average that it loses;
- **capacity samples** (``settings.learn_capacity``): each degree's window of
  placements and the TTFTs its requests got (:meth:`Controller.placed`,
  :meth:`Controller.completed`, or a router replica's sums,
  :meth:`Controller.capacity_reported`), from which κ is corrected
  (:mod:`vertumnus.core.kappa`).

Which compositions a look estimates, and their replays within its budget,
is :mod:`vertumnus.core.probes`; what it keeps between looks, as one record a
restarted shell hands back, is :class:`vertumnus.core.memory.Memory`. Where
the pool starts is :mod:`vertumnus.core.start`. The shell calls
:meth:`Controller.tick` every ``settings.hop`` seconds of its own time and
:meth:`Controller.committed` after each commit, and starts the operations
they return (through :mod:`vertumnus.core.transition`). Pure: no clock (the
shell measures the planner's time if it wants to), no I/O.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from vertumnus.core import changepoint, kappa, planner, probes, shadow, whatif
from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.memory import DIRECTIONS, Look, Memory
from vertumnus.core.metrics import SloRule
from vertumnus.core.placement import PlacementParams
from vertumnus.core.types import Composition, Request
from vertumnus.core.windows import ControlWindows

__all__ = [
    "Controller",
    "Tick",
    "WhatIf",
]


@dataclass(frozen=True)
class Tick:
    """One evaluation of the controller: what it saw and what it decided."""

    observation: planner.WindowObservation
    utilization: float
    ops: tuple[planner.Op, ...]
    target: str | None
    """Where the transition in progress is heading (multi-step), if anywhere."""
    whatif: WhatIf | None = None
    """The what-if check of this window (None: not made)."""
    kappa: Mapping[int, float] | None = None
    """κ per degree the rules read this window (the learned one with
    ``learn_capacity``, else the shipped one)."""
    shadow: tuple[shadow.Comparison, ...] = ()
    """The shadow pools' comparisons this window (``PlannerSettings.shadow``; at
    window boundaries only)."""


@dataclass(frozen=True)
class WhatIf:
    """The what-if check of one window (:mod:`vertumnus.core.whatif`)."""

    current: whatif.Estimate
    candidates: tuple[tuple[str, whatif.Estimate], ...]
    """(direction, estimate) of the compositions along the split and merge paths."""
    proposed: whatif.Estimate | None
    """The estimate of the target the rules asked for, if they asked."""
    verdict: str
    """``agree`` (the rules' move pays), ``extend`` (it pays, and going further
    the same way pays more: the check's target replaces the rules'), ``veto``
    (it does not pay; not made), ``trigger`` (the check moves on its own: a
    candidate paid for ``persist_windows`` windows, or by ``whatif_decisive``
    in one, or small gains one way added up: ``whatif_accumulate``), ``wait``
    (a candidate pays, not yet long enough), ``stay``,
    ``damped`` (a merge the rules or the check chose, not made while the pool
    flaps: ``PlannerSettings.damp_flaps``), ``hold`` (a move the whole window
    led to, not made: the pool already moved on the requests since a change of
    arrivals within the window, ``PlannerSettings.whatif_change``), or ``recall``
    (a merge the whole window led to, not made: the looks on this composition at
    the same mix lately estimated on average that it loses,
    ``PlannerSettings.whatif_recall_s``)."""
    change: changepoint.Change | None = None
    """The change of arrivals found within the window (None: none, or
    ``PlannerSettings.whatif_change`` is 0)."""
    since_s: float | None = None
    """Seconds of the window after that change, when the requests since it decided
    (a decisive move or a veto; the estimates are theirs). None: the whole window's."""

    @property
    def best(self) -> whatif.Estimate | None:
        return min((e for _, e in self.candidates), key=lambda e: e.mean_s, default=None)

    def to_dict(self) -> dict[str, object]:
        best = self.best
        return {
            "verdict": self.verdict,
            "current": self.current.to_dict(),
            "best": None if best is None else best.to_dict(),
            "proposed": None if self.proposed is None else self.proposed.to_dict(),
            "candidates": [dict(e.to_dict(), direction=d) for d, e in self.candidates],
            "since_s": self.since_s,
            "change_statistic": None if self.change is None else round(self.change.statistic, 2),
        }


def _tallies(
    counts: Sequence[tuple[int, int]], hops: int
) -> tuple[tuple[int, int], tuple[int, int]]:
    """The requests and the long ones among them (``counts``: the window's short and
    long requests per hop, oldest first) before its last ``hops`` hops, and in them."""
    before, since = counts[:-hops], counts[-hops:]
    return (
        (sum(s + lg for s, lg in before), sum(lg for _, lg in before)),
        (sum(s + lg for s, lg in since), sum(lg for _, lg in since)),
    )


def _nothing_started(state: planner.ControllerState) -> planner.ControllerState:
    """``state`` with its streaks reset: what a window that starts nothing leaves
    (a vetoed move, a move that cannot start yet)."""
    return replace(state, split_streak=0, merge_streak=0, confirming=(), momentum=None)


_Path = tuple[str, list[planner.PathStep], whatif.Estimate]
"""A candidate of the check: its direction, the steps to it and its estimate."""

_LEAN_MAX = 8
"""Windows (times ``persist_windows``) a lean of small gains adds up at most:
at 8, the average gain it needs is at least ``whatif_margin``/√8 ≈ a third of
the margin, so that a gain far below the noise of one window never moves the
pool however long it lasts."""


_SHIFT = 2.0
"""The factor by which the share of long requests must have changed at a change of
arrivals for ``whatif_change_decisive`` to decide a move on the requests since it:
up for a merge, down for a split. The calibration mix's phase changes move it 5–17
times; the bursts of the long-context family at heavy load, which also pass the
detection and on which a merge looked 10–12 % better, move it the other way or by
1.6 at most (docs/benchmarks/adaptive.md, "The requests since a change decide")."""


_RATE_SHIFT = 2.0
"""The factor by which the median hop's arrivals over ``shadow_restart_s`` after a
change of arrivals must differ from the median over as long before it for the
change to restart the shadows' comparison (a change of the share of long requests
by :data:`_SHIFT` does at once). The time-varying mixes' phase changes move it 2.8–4.3
times; the bursty Azure code trace at 256 GPUs, whose bursts pass the detection
every minute or two (its rate 0.07–12.6 times as high after them as before within
the window), 0.8–1.75 times past its first minute (docs/benchmarks/adaptive.md,
"Bursts do not restart the shadows")."""


def _direction(ops: Sequence[planner.Op]) -> str:
    """``split`` or ``merge``: the way the operations of one move go."""
    return "split" if isinstance(ops[0], planner.Split) else "merge"


@dataclass(frozen=True)
class _Weighed:
    """The check's estimates on one set of replays (:meth:`Controller._weigh`)."""

    replays: probes.Replays
    current: whatif.Estimate
    candidates: tuple[tuple[str, whatif.Estimate], ...]
    paths: Mapping[str, list[tuple[list[planner.PathStep], whatif.Estimate]]]
    best: _Path | None
    """The candidate with the lowest mean among those that pay by the margin."""
    decisive: _Path | None
    """``best`` if it pays by ``whatif_decisive``."""

    def report(self, check: WhatIf) -> WhatIf:
        """``check`` as judged on these replays (their change of arrivals, if any)."""
        return replace(check, change=self.replays.change, since_s=self.replays.since_s)


class Controller:
    """The planner's state and its windows, stepped by a shell.

    With a prefill ``model`` (and ``settings.whatif``) every decision passes the
    what-if check (:meth:`_check`): the rules' moves are made only if the
    cost model says they pay on the window's requests, and a move the rules
    do not ask for is made when it pays for ``persist_windows`` windows.
    Without a model (a shell that reports no requests) the rules decide alone.
    """

    def __init__(
        self,
        state: planner.ControllerState,
        capacity: planner.CapacityProfile,
        settings: planner.PlannerSettings,
        model: PrefillModel | None = None,
        params: PlacementParams | None = None,
        block_size: int = 512,
        slo: SloRule | None = None,
        memory: Memory | None = None,
        cache_blocks_per_gpu: int | None = None,
    ) -> None:
        """``memory``: what a previous controller of this pool remembered
        (:meth:`memory`), when a shell restarts it; None: a new pool's.
        ``cache_blocks_per_gpu``: the workers' prefix-cache size, for the shadow
        pools (``settings.shadow``; None: no shadows)."""
        self.state = state
        self.block_size = block_size
        self.capacity = capacity
        """κ the rules read: the shipped profile, or its online correction."""
        self.settings = settings
        self.windows = ControlWindows(settings, block_size)
        self.model = model
        self.params = params or PlacementParams()
        self._streak: tuple[str, int] = ("", 0)
        """Direction of the what-if candidate that paid in the last windows, and for how many."""
        self._lean: tuple[str, tuple[float, ...]] = ("", ())
        """Direction the best candidate gained in over the last windows, and each
        window's gain (``whatif_accumulate``; the last ``_LEAN_MAX`` · ``persist_windows``),
        margin or not."""
        self._looks: tuple[str, tuple[tuple[float, float], ...]] = ("", ())
        """The composition the last looks were on, and at each (the last
        ``persist_windows`` or ``whatif_horizon`` windows' worth, the more) the best
        estimated gain toward a split and toward a merge (``whatif_agree``, and a
        light stretch that outlasts flap damping: :meth:`_outlasted`)."""
        self._recall: tuple[Look, ...] = ()
        """The last looks on the composition ``_looks`` names, for
        ``whatif_recall_s`` (:meth:`_recalled`)."""
        self._evaluations = 0
        """Windows evaluated so far (one per hop once the first window is full)."""
        self._goal: tuple[str, Composition] | None = None
        """Direction and target of a move the what-if check started."""
        self._flaps: deque[int] = deque()
        """Evaluations at which a move reversed the previous one within ``flap_s``."""
        self._last_move: tuple[str, int] | None = None
        """Direction and evaluation of the last move the check let start."""
        self.slo = slo or SloRule()
        learned = None if memory is None else memory.kappa
        self.learner = (
            kappa.CapacityLearner(capacity, learned=learned) if settings.learn_capacity else None
        )
        """The online correction of κ (None: the shipped κ as it is). Its samples come
        from :meth:`placed` / :meth:`completed` (a shell with the prefill model, which
        sets each request's τ) or as sums (:meth:`capacity_reported`)."""
        self.samples = kappa.SampleBook(hops_per_sample=settings.hops_per_window)
        self.shadows: shadow.ShadowBank | None = None
        """The shadow pools (``settings.shadow``, once the cache size is known: the
        constructor's or :meth:`shadow_cache`'s), fed by :meth:`placed` or
        :meth:`shadow_serve`; not part of :meth:`memory`: a restarted controller's start cold."""
        if cache_blocks_per_gpu is not None:
            self.shadow_cache(cache_blocks_per_gpu)
        self._moved_s = -math.inf
        """When (the shadows' clock: the latest arrival) the last move started."""
        self._anchor_s = -math.inf
        """When the last move the shadows did not decide started, or the last change of
        arrivals that moved the load as a phase does: they compare since."""
        self._provisional: dict[int, float] = {}
        """Changes of arrivals that moved the rate alone, not yet found to have lasted
        or not (:meth:`_restart`): the first hop after each (a number of
        :attr:`_hop_totals`) → when it started on the shadows' clock."""
        self._hop_totals: deque[int] = deque(
            maxlen=2 * math.ceil(settings.shadow_restart_s / settings.hop) + 1
        )
        """Requests per hop, the latest hops (enough to weigh a minute either side of a
        change); the open hop's is appended at each :meth:`tick`."""
        self._hops = 0
        """Hops recorded in :attr:`_hop_totals` so far (the open one's number + 1)."""
        self._compared: tuple[shadow.Comparison, ...] = ()
        """The shadows' last comparisons (at the last boundary)."""
        self._compared_with: Composition | None = None
        """The composition those compared against (the pool's at that boundary)."""
        self._statistics: deque[float] = deque(
            maxlen=max(1, round(settings.whatif_change_memory_s / settings.hop))
        )
        """The change-point statistic of each of the last looks (``whatif_change_over``);
        not part of :meth:`memory`: a restarted controller relearns it in a window."""
        self._walked: (
            tuple[planner.Layout, object, dict[str, list[list[planner.PathStep]]]] | None
        ) = None
        """The look's paths (:meth:`_along`), with the layout and workers they start from."""
        self._heirs: tuple[planner.Layout, probes.Heirs] | None = None
        """Where the layout's cached prefixes go along its paths (``whatif_held``)."""
        self._degrees: tuple[planner.Layout, dict[int, int]] | None = None
        if self.learner is not None and learned is not None:
            self.capacity = self.learner.profile()
        if memory is not None:
            self._evaluations = memory.evaluations
            self._flaps = deque(memory.flaps)
            self._last_move = memory.last_move
            self._streak = memory.streak
            self._lean = memory.lean
            self._looks = memory.looks
            self._recall = memory.recall
            self._goal = memory.goal

    def memory(self) -> Memory:
        """What this controller remembers besides :attr:`state` (:class:`Memory`), for
        a shell to keep and give back to the controller that replaces it."""
        return Memory(
            evaluations=self._evaluations,
            flaps=tuple(self._flaps),
            last_move=self._last_move,
            streak=self._streak,
            lean=self._lean,
            looks=self._looks,
            recall=self._recall,
            goal=self._goal,
            kappa=None if self.learner is None else self.learner.learned(),
        )

    def placed(
        self, request: Request, worker: int, estimate_s: float, cached_tokens: int = 0
    ) -> None:
        """A request's first placement, on ``worker``: its demand counts in the open hop
        (:meth:`ControlWindows.placed`), and it is tracked for the capacity samples."""
        self.windows.placed(request, estimate_s, cached_tokens, worker)
        self.track(request, worker, estimate_s)
        self.shadow_serve((request,))

    def shadow_cache(self, blocks_per_gpu: int) -> None:
        """The workers' prefix-cache size, in blocks per GPU, as the shell learns it:
        with ``settings.shadow`` and a model the shadow pools start (cold) with caches
        that size, and start over if it changes; not for a pool of more than
        ``settings.shadow_max_gpus`` GPUs."""
        ps = self.settings
        if self.shadows is not None and self.shadows.cache_blocks_per_gpu == blocks_per_gpu:
            return  # the shells report it every hop
        if not ps.shadow or self.model is None or blocks_per_gpu < 1:
            return
        gpus = sum(s.degree for s in self.state.layout.slots)
        if gpus > ps.shadow_max_gpus:
            return
        tokens = blocks_per_gpu * self.block_size * gpus
        self.shadows = shadow.ShadowBank(
            self.model,
            self.params,
            blocks_per_gpu,
            self.block_size,
            ps.shadow_horizon_s,
            ps.shadow_warmup_s,
            shadow.block_tokens(tokens, ps.shadow_memory_mib * 2**20),
        )

    def shadow_serve(self, requests: Iterable[Request]) -> None:
        """The shadow pools serve ``requests``, the pool's, in arrival order (a shell
        that does not call :meth:`placed`)."""
        if self.shadows is not None:
            for request in requests:
                self.shadows.serve(request)

    def shadow_gap(self) -> None:
        """Some of the pool's requests went unseen (a report cut short): the shadows'
        queues and caches are no longer the pool's, so they start over, cold."""
        if self.shadows is not None:
            self.shadows.follow(())

    def track(self, request: Request, worker: int, estimate_s: float) -> None:
        """Track a first placement for the capacity samples only (a shell that counts
        demand with :meth:`ControlWindows.add`)."""
        if self.learner is None or self.model is None:
            return
        layout = self.state.layout
        if self._degrees is None or self._degrees[0] is not layout:
            self._degrees = (layout, {s.worker: s.degree for s in layout.slots})
        degree = self._degrees[1].get(worker)
        if degree is None:
            return
        tau = self.slo.tau(self.model, request.length, degree)
        self.samples.placed(request.id, degree, estimate_s, request.length, tau)

    def completed(self, request_id: int, ttft_s: float) -> None:
        """A request tracked by :meth:`placed` got its first token after ``ttft_s``."""
        if self.learner is not None:
            self.samples.completed(request_id, ttft_s)

    def capacity_reported(self, parts: Iterable[kappa.Part], hop: int) -> None:
        """Capacity sums of router replicas (:class:`~vertumnus.core.kappa.ReplicaBook`)
        taken as the shell's hop number ``hop``, which is the open hop here."""
        if self.learner is None:
            return
        book = self.samples
        for p in parts:
            h = book.hop - (hop - p.hop)
            if h < 0 or p.hop > hop:
                continue  # before this controller started, or a replica ahead of it
            if p.requests:
                book.add_placed(h, p.degree, p.demand_s, p.requests)
            if p.done:
                book.add_done(h, p.degree, p.done, p.tokens, p.met_tokens)

    def workers(
        self, running_remaining_s: Mapping[int, float]
    ) -> tuple[planner.WorkerObservation, ...]:
        """Observations of the workers ``running_remaining_s`` names (id → seconds left
        of its running prefill), with their reuse weights."""
        return tuple(
            planner.WorkerObservation(w, rest, self.windows.reuse_weight(w))
            for w, rest in running_remaining_s.items()
        )

    def tick(self, running_remaining_s: Mapping[int, float], reconfiguring: bool) -> Tick | None:
        """One hop ended: evaluate the window (once a whole one has been seen), close the
        hop, and return what was decided (None while the first window fills)."""
        if self.learner is not None:
            counts = Counter(sl.degree for sl in self.state.layout.slots)
            for sample in self.samples.close_hop(counts):
                self.learner.add(
                    sample.degree,
                    sample.demand_s / self.settings.window_s,
                    sample.attainment,
                    sample.requests,
                )
            self.capacity = self.learner.profile()
        self._hop_totals.append(self.windows.open_hop_requests)
        self._hops += 1
        if not self.windows.ready:
            self.windows.close_hop()
            return None
        ps = self.settings
        # With sliding windows a window starting at a multiple of window_s is a
        # "boundary": the disjoint windows among the overlapping ones.
        boundary = self._evaluations % ps.hops_per_window == 0
        self._evaluations += 1
        obs = self.windows.observation(self.workers(running_remaining_s), reconfiguring)
        before = self.state
        # The check's first replay (the current composition) starts now, so that on
        # threads it runs while the rules decide.
        replays = self._replays(before, reconfiguring)
        goal = self._goal
        change = self._change()
        since = None if replays is None else self._since_change(before, replays, change)
        with contextlib.ExitStack() as stack:
            for r in (replays, since):
                if r is not None:
                    stack.enter_context(r)
            if not ps.rules_at_boundaries:
                self.state, ops = planner.step(before, obs, self.capacity, ps)
            elif boundary:
                # The rules read disjoint windows: every request of this one is new to them.
                disjoint = replace(
                    obs, fresh_demand_s=None, fresh_long_requests=None, fresh_long_demand_s=None
                )
                self.state, ops = planner.step(before, disjoint, self.capacity, ps)
            else:
                ops = ()
            check = None
            if replays is not None:
                check, ops = self._check(before, obs, ops, replays, boundary, since)
                check, ops = self._damp(before, goal, check, ops)
        if self.shadows is not None:
            self._restart(None if since is None else since.change)
        compared: tuple[shadow.Comparison, ...] = ()
        # Every look's move, not only a window's: a decisive estimate between two
        # windows undid the shadows' move within a minute, again and again (the
        # toolagent moderate cell at 256 GPUs, docs/benchmarks/adaptive.md).
        if (
            self.shadows is not None
            and ops
            and not reconfiguring
            and self._shadow_veto(before, obs, ops, check)
        ):
            self._stand(before, goal)
            ops = ()
            if check is not None:
                check = replace(check, verdict="shadow-veto")
        if self.shadows is not None and boundary and not reconfiguring:
            compared, shadowed = self._shadow_look(before, obs, ops)
            if shadowed:
                ops = shadowed
                if check is not None:
                    check = replace(check, verdict="shadow")
            elif ops:
                # A move the shadows did not decide (a phase change, the rules): the
                # evidence before it was another pool's.
                self._anchor_s = self.shadows.now_s
        if ops and self.shadows is not None:
            self._moved_s = self.shadows.now_s
        k_cap = self.capacity.capacity_per_s(s.degree for s in self.state.layout.slots)
        tick = Tick(
            obs,
            obs.demand_s / (self.settings.window_s * k_cap),
            ops,
            None if self.state.target is None else str(self.state.target),
            check,
            dict(self.capacity.kappa_per_s),
            compared,
        )
        self.windows.close_hop()
        return tick

    def _shadow_veto(
        self,
        before: planner.ControllerState,
        obs: planner.WindowObservation,
        ops: tuple[planner.Op, ...],
        check: WhatIf | None,
    ) -> bool:
        """A move the shadows find worse than staying: its target, or a composition
        on its way there (along the path), weighed gain below 0. The window's
        estimate against the pool's own requests served warm, the estimate loses.
        Asked at every look that moves, between windows too (a decisive estimate
        moves there; the shadows' own look and move are a window's).

        - Every move is held to their comparison against the composition the pool
          has, over ``shadow_min_s`` at least: the last look's, or one made now if
          the pool moved since.
        - A move the window's estimate finds decisive (``whatif_decisive``, on the
          whole window) is also held to the shadows' comparison on that window's
          requests alone: the shadows served the same requests warm, so a shift
          within the window shows there too and a cold replay's bias does not
          (docs/benchmarks/adaptive.md, "A decisive estimate asks the shadows about
          its own window"). With no change of arrivals found, such a gain is a
          burst of a steady load, and minutes say whether it lasts ("A burst's
          decisive estimate is held to minutes").
        - After a change of arrivals that moved the share of long requests
          (:meth:`_mix_moved`; the estimate on the requests since it) none is held:
          the shadows have not compared enough of the new load. One that moved the
          rate alone is held as a burst is: such a change restarts their
          comparison only once it has lasted (:meth:`_restart`), and on a bursty
          trace a burst's first seconds are such a change (the 256-GPU azure-code
          light cell split at a burst's peak, paid the transition there and stood
          split after it; docs/benchmarks/adaptive.md, "A burst's change of rate
          is held to minutes too").

        The shadows follow a few steps of each path, not every one (three merges on
        a path of five land where none is); along a path the TTFT rises on both
        sides of its best point, so a step on the way that is worse than here says
        the target is worse too."""
        ps = self.settings
        assert self.shadows is not None
        if check is not None and check.since_s is not None and self._mix_moved(check.change, None):
            return False
        target = self.state.target or self._after(before.layout, ops)
        decisive = False
        if check is not None:
            found = [e for _, e in check.candidates if e.composition == target]
            if check.proposed is not None and check.proposed.composition == target:
                found.append(check.proposed)
            cur = check.current.mean_s
            decisive = bool(found) and cur > 0 and 1.0 - found[0].mean_s / cur >= ps.whatif_decisive
        there = probes.along(before.layout, obs.workers, _direction(ops), ps, target=target)
        on_way = {target, *(st.composition for steps in there for st in steps)}
        # Their comparison against the composition the pool has now: the last look's,
        # or, between a move and the next window's look (the last look's is against
        # the composition it left), one made now since the anchor (nothing yet after
        # a move the shadows did not decide). Without it, a decisive window one hop
        # after the shadows' own move undid it (the 256-GPU azure-code light cell).
        current = before.layout.composition
        if self._compared_with == current:
            minutes = list(self._compared)
        else:
            minutes = self.shadows.compare(current, self._anchor_s)
        views = [(minutes, ps.shadow_min_s)]
        if decisive:
            window = self.shadows.compare(current, self.shadows.now_s - ps.window_s)
            views.append((window, ps.window_s / 2))
        return any(
            c.composition in on_way and c.span_s >= min_s and c.weighed(ps.whatif_lean_p90) < 0.0
            for compared, min_s in views
            for c in compared
        )

    def _along(
        self, layout: planner.Layout, workers: Sequence[planner.WorkerObservation]
    ) -> dict[str, list[list[planner.PathStep]]]:
        """:func:`probes.walk` from ``layout``: walked once per look, for the check and
        the shadows (a 704-worker pool's walks take ~9 ms)."""
        walked = self._walked
        if walked is None or walked[0] is not layout or walked[1] is not workers:
            walked = self._walked = (layout, workers, probes.walk(layout, workers, self.settings))
        return walked[2]

    def _shadow_look(
        self,
        before: planner.ControllerState,
        obs: planner.WindowObservation,
        ops: tuple[planner.Op, ...],
    ) -> tuple[tuple[shadow.Comparison, ...], tuple[planner.Op, ...]]:
        """The shadow pools' look (``settings.shadow``): follow the current composition
        and the compositions along its split and merge paths, compare them, and
        move to the neighbour that beats the current one by ``shadow_margin`` if
        nothing else moves (``ops``) and the pool has stood long enough."""
        assert self.shadows is not None
        ps = self.settings
        layout = before.layout
        current = layout.composition
        if before.pending or self._goal is not None or self.state.pending:
            return (), ()
        paths = probes.ends(self._along(layout, obs.workers))
        self.shadows.follow({current, *paths["split"], *paths["merge"]})
        compared = self._compared = tuple(self.shadows.compare(current, self._anchor_s))
        self._compared_with = current
        if ops or self.shadows.now_s - self._moved_s < ps.shadow_min_s:
            return compared, ()
        w, m = ps.whatif_lean_p90, ps.shadow_margin
        best = max(
            (
                c
                for c in compared
                if c.span_s >= ps.shadow_min_s and c.mean_gain >= -m and c.p90_gain >= -m
            ),
            key=lambda c: c.weighed(w),
            default=None,
        )
        if best is None or best.weighed(w) < m:
            return compared, ()
        direction = "split" if best.composition in paths["split"] else "merge"
        steps = paths[direction][best.composition]
        start = planner.startable([st.op for st in steps], layout, (), self.capacity, ps)
        if not start:
            return compared, ()
        why = (
            f"shadow: {best.composition} {best.mean_gain:+.1%} mean, {best.p90_gain:+.1%} P90 "
            f"over {current} on the last {best.span_s:.0f} s"
        )
        return compared, self._begin(before, direction, best.composition, start, why)

    def _restart(self, change: changepoint.Change | None) -> None:
        """The shadows' comparison after this look's ``change`` of arrivals (None:
        none): what they served before a change was another load's, unless the
        change was a burst. A change that moved the share of long requests by
        :data:`_SHIFT` restarts the comparison at once. One that moved the rate
        alone restarts it only if it lasted: ``shadow_restart_s`` later the median
        hop's requests over that long since the change must differ by
        :data:`_RATE_SHIFT` from the median over as long before it (a phase: the
        comparison then starts at the change), or nothing changes (a burst,
        shorter than half of that). Until then the shadows compare as before: a
        restart at each burst left them blind to it, their veto holding nothing
        while the rules split on its utilization."""
        assert self.shadows is not None
        ps = self.settings
        if change is not None:
            at = self.shadows.now_s - change.hops * ps.hop
            if ps.shadow_restart_s <= 0 or self._mix_moved(change, None):
                self._anchor_s = max(self._anchor_s, at)
            else:
                self._provisional.setdefault(self._hops - change.hops, at)
        span = math.ceil(ps.shadow_restart_s / ps.hop)
        due = [f for f in self._provisional if self._hops - f >= span]
        totals = list(self._hop_totals) if due else []
        for first in due:
            at = self._provisional.pop(first)
            cut = len(totals) - (self._hops - first)  # the first hop after the change
            # The median hop's requests: a burst of less than half the span on
            # either side moves neither (the window's hops precede the change, so
            # there is one before it at least).
            earlier = statistics.median(totals[max(0, cut - span) : cut])
            since = statistics.median(totals[cut : cut + span])
            if since >= _RATE_SHIFT * earlier or _RATE_SHIFT * since <= earlier:
                self._anchor_s = max(self._anchor_s, at)

    def _replays(
        self, before: planner.ControllerState, reconfiguring: bool
    ) -> probes.Replays | None:
        """The what-if replays of this window, the current composition's started;
        None when the check does not look at this window (no model, switched off,
        a transition in flight, too few requests, or not all of them seen)."""
        ps = self.settings
        if (
            self.model is None
            or not ps.whatif
            or reconfiguring
            or before.pending
            or self._goal is not None
            or not self.windows.whole
        ):
            return None
        columns = self.windows.columns()
        if len(columns.arrivals) < ps.min_requests:
            return None
        degrees = sorted(set(ps.degrees) | {s.degree for s in before.layout.slots})
        return self._replaying(whatif.RequestTable.of_columns(columns, self.model, degrees), before)

    def _replaying(
        self,
        table: whatif.RequestTable,
        before: planner.ControllerState,
        change: changepoint.Change | None = None,
    ) -> probes.Replays:
        """Replays of ``table`` (the requests since ``change``, if given)."""
        # A small window's replays take well under a millisecond each: threads
        # would cost more than they save.
        ps = self.settings
        threads = ps.whatif_threads if table.n >= 2000 else 1
        since = None if change is None else change.hops * ps.hop
        if ps.whatif_cached_before:
            # Prefixes cached before the table's first request: held everywhere at
            # their first reuse (a cut at a change counts from the cut).
            table = whatif.cached_before_anywhere(table)
        layout = before.layout
        heirs = None
        if ps.whatif_held:
            # Each replay starts with the pool's cache, carried through the candidate's
            # transition from this layout (worked out once per layout).
            if self._heirs is None or self._heirs[0] is not layout:
                self._heirs = (layout, probes.Heirs(layout))
            heirs = self._heirs[1]
        return probes.Replays(table, self.params, threads, layout.composition, change, since, heirs)

    def _change(self) -> changepoint.Change | None:
        """The window's change of arrivals (``settings.whatif_change``), if it has one
        that stands out of the statistics of the last looks (``whatif_change_over``)."""
        ps = self.settings
        if not ps.whatif_change:
            return None
        change = changepoint.last_change(self.windows.hop_counts())
        if change is None:
            return None
        # A window's worth of looks at least, so that one change is not its own usual.
        seen = len(self._statistics) >= ps.hops_per_window
        usual = statistics.median(self._statistics) if seen else 0.0
        self._statistics.append(change.statistic)
        if change.statistic < max(ps.whatif_change, ps.whatif_change_over * usual):
            return None
        return change

    def _since_change(
        self,
        before: planner.ControllerState,
        window: probes.Replays,
        change: changepoint.Change | None,
    ) -> probes.Replays | None:
        """Replays of the requests since ``change`` (:meth:`_change`), if it has
        ``min_requests`` requests on either side: the window's table cut at the change."""
        ps = self.settings
        if change is None:
            return None
        (first, _), (after, _) = _tallies(self.windows.hop_counts(), change.hops)
        if first < ps.min_requests or after < ps.min_requests:
            return None
        return self._replaying(window.table.since(first), before, change)

    def _check(
        self,
        before: planner.ControllerState,
        obs: planner.WindowObservation,
        ops: tuple[planner.Op, ...],
        replays: probes.Replays,
        boundary: bool = True,
        since: probes.Replays | None = None,
    ) -> tuple[WhatIf, tuple[planner.Op, ...]]:
        """The what-if check of this window: the rules' ``ops`` kept or vetoed, or the
        check's own move (module docstring of :mod:`vertumnus.core.whatif`).

        After a change of arrivals within the window (``since``: the replays of the
        requests since it), those requests have the last word: a decisive gain on
        them moves at once, and a move the whole window leads to (the rules' or
        the check's own) is made only if it pays on them too. Persistence is
        counted on whole disjoint windows only."""
        ps = self.settings
        layout = before.layout
        probed = probes.affordable(self._along(layout, obs.workers), replays, since, ps)
        recent, early = None, None
        if since is not None:
            first = {d: probes.start(since, found, ps) for d, found in probed.items()}
            if replays.threaded:
                # On threads the whole window's replays queue behind those since the
                # change: they run while those are weighed, and those left queued
                # are dropped if a decisive gain there decides.
                early = {d: probes.start(replays, found, ps) for d, found in probed.items()}
            recent = self._weigh(since, probed, first)
        if recent is not None and recent.decisive:
            moved = self._move(
                before,
                recent.decisive,
                recent.current,
                recent.candidates,
                None,
                "trigger",
                recent.replays,
            )
            return recent.report(moved[0]), moved[1]
        goal = self._goal
        check, out = self._check_window(before, obs, ops, replays, boundary, probed, early)
        change = None if recent is None else recent.replays.change
        if not out:
            return replace(check, change=change), out
        direction = _direction(out)
        target = self.state.target or self._after(layout, out)
        if direction == "merge" and not self._recalled(target):
            # Lately, at this mix, the looks here estimated that the merge loses:
            # this window is a trough of a load that cycles, not a phase.
            self._stand(before, goal)
            return replace(check, verdict="recall", change=change), ()
        if recent is None:
            return check, out
        if self._moved_since(recent.replays.change):
            # The pool already moved on the requests since the change: the whole
            # window, mostly from before it, moves it no further (draw 14 of the
            # calibration mix: a decisive merge at the start of a light phase, split
            # back by the whole window 10 s later, then held by flap damping).
            self._stand(before, goal)
            return recent.report(WhatIf(recent.current, recent.candidates, None, "hold")), ()
        found = [e for _, e in recent.paths[direction] if e.composition == target]
        if not found:
            probe = probes.along(layout, obs.workers, direction, ps, target)
            found = [e for _, e in probes.estimates(recent.replays, probe, ps)]
        if found and not self._pays(found[0], recent.current):
            # The whole window's move does not pay on the requests since the change.
            self._stand(before, goal)
            veto = WhatIf(recent.current, recent.candidates, found[0], "veto")
            return recent.report(veto), ()
        return replace(check, change=change), out

    def _stand(self, before: planner.ControllerState, goal: tuple[str, Composition] | None) -> None:
        """Undo what this look started: the planner back at ``before`` with nothing
        pending, and the check's goal as it was before the look (``goal``)."""
        self._goal = goal
        self.state = _nothing_started(before)

    def _recalled(self, target: Composition, since: changepoint.Change | None = None) -> bool:
        """A merge toward ``target`` is not refuted by the recall
        (``PlannerSettings.whatif_recall_s``): the looks on the current composition,
        from this one back while their window's long fraction stays within a
        factor :data:`_SHIFT` of this one's (the same mix), estimated on average
        that ``target`` does not lose. True without such a look.

        ``since``: the merge was decided on the requests since this change of
        arrivals, and their long fraction is the mix the looks are read at. The
        window's own, mostly from before the change, would hold a phase change's
        merge to the looks at the phase before it (the calibration mix's draws 7
        and 16: damped for two minutes into a long-heavy phase;
        docs/benchmarks/adaptive.md, "The recall reads the mix since the change")."""
        if self.settings.whatif_recall_s <= 0 or not self._recall:
            return True
        name = str(target)
        now = self._recall[-1].long_fraction
        if since is not None:
            _, (n, long) = _tallies(self.windows.hop_counts(), since.hops)
            if n:
                now = long / n
        gains = []
        for look in reversed(self._recall):
            if not (now <= _SHIFT * look.long_fraction and look.long_fraction <= _SHIFT * now):
                break
            gains += [g for comp, g in look.merges if comp == name]
        return not gains or sum(gains) >= 0.0

    def _mix_moved(self, change: changepoint.Change | None, direction: str | None) -> bool:
        """At ``change``, the share of long requests moved ``direction``'s way by
        :data:`_SHIFT`: up for a merge (larger degrees serve long requests), down
        for a split, either for None. Counted on the window's hops before and since it."""
        if change is None:
            return False
        tallies = _tallies(self.windows.hop_counts(), change.hops)
        (n_before, long_before), (n_since, long_since) = tallies
        # Shares compared without dividing: long_since / n_since vs long_before / n_before.
        after, earlier = long_since * n_before, long_before * n_since
        up = long_since > 0 and after >= _SHIFT * earlier
        down = long_before > 0 and _SHIFT * after <= earlier
        if direction is None:
            return up or down
        return up if direction == "merge" else down

    def _moved_since(self, change: changepoint.Change | None) -> bool:
        """A move started at a look after ``change`` (made on the requests since it)."""
        last = self._last_move
        return change is not None and last is not None and last[1] > self._evaluations - change.hops

    def _damp(
        self,
        before: planner.ControllerState,
        goal: tuple[str, Composition] | None,
        check: WhatIf,
        ops: tuple[planner.Op, ...],
    ) -> tuple[WhatIf, tuple[planner.Op, ...]]:
        """Flap damping (``PlannerSettings.damp_flaps``): while the pool has flapped
        ``damp_flaps`` times in the last ``damp_s``, a merge starts only on a decisive
        gain since a change of arrivals that the recall does not refute (the verdict
        is otherwise ``damped``); every move that starts is recorded, a reversal
        within ``flap_s`` as a flap. Counted in evaluations (``hop`` seconds each):
        no clock."""
        ps = self.settings
        if not ops:
            return check, ops
        now = self._evaluations
        direction = _direction(ops)
        while self._flaps and now - self._flaps[0] > ps.damp_s / ps.hop:
            self._flaps.popleft()
        if (
            ps.damp_flaps
            and direction == "merge"
            and len(self._flaps) >= ps.damp_flaps
            and not self._outlasted()
            # A move with since_s was decided on the requests since a change of
            # arrivals. On a large pool a rate that cycles within a window is such a
            # change at every crest and trough (the change-point test has the counts
            # to see it); the looks on this composition at the same mix say whether
            # this merge lost lately (the 256-GPU longcontext heavy cell merged and
            # split back every 10 s; docs/benchmarks/adaptive.md, "Families at 256 GPUs").
            # The mix they are read at is that of the requests since the change.
            and (
                check.since_s is None
                or not self._recalled(
                    self.state.target or self._after(before.layout, ops), check.change
                )
            )
        ):
            self._stand(before, goal)
            return replace(check, verdict="damped"), ()
        last = self._last_move
        if last is not None and last[0] != direction and now - last[1] <= ps.flap_s / ps.hop:
            self._flaps.append(now)
        self._last_move = (direction, now)
        return check, ops

    def _pays(self, e: whatif.Estimate, current: whatif.Estimate) -> bool:
        """``e`` improves on ``current`` by the margin, its P90 no worse by more than it."""
        m = self.settings.whatif_margin
        return e.mean_s <= current.mean_s * (1.0 - m) and e.p90_s <= current.p90_s * (1.0 + m)

    def _weigh(
        self,
        replays: probes.Replays,
        probed: probes.Probes,
        started: Mapping[str, probes.Started] | None = None,
    ) -> _Weighed:
        """The estimates of ``probed`` on ``replays`` (``started``: their replays, by
        direction, if started already), and the best that pays."""
        paths = {
            d: probes.estimates(
                replays, found, self.settings, None if started is None else started[d]
            )
            for d, found in probed.items()
        }
        current = replays.current.result()
        paying = [
            (d, steps, e)
            for d, found in paths.items()
            for steps, e in found
            if self._pays(e, current)
        ]
        best = min(paying, key=lambda c: (c[2].mean_s, len(c[1])), default=None)
        ps = self.settings
        threshold = ps.whatif_decisive
        if best is not None and self._mix_moved(replays.change, best[0]):
            threshold = ps.whatif_change_decisive
        decisive = best is not None and best[2].mean_s <= current.mean_s * (1.0 - threshold)
        candidates = tuple((d, e) for d, found in paths.items() for _, e in found)
        return _Weighed(replays, current, candidates, paths, best, best if decisive else None)

    def _check_window(
        self,
        before: planner.ControllerState,
        obs: planner.WindowObservation,
        ops: tuple[planner.Op, ...],
        replays: probes.Replays,
        boundary: bool,
        probed: probes.Probes,
        started: Mapping[str, probes.Started] | None = None,
    ) -> tuple[WhatIf, tuple[planner.Op, ...]]:
        """The check on the whole window (:meth:`_check`)."""
        ps = self.settings
        layout = before.layout
        weighed = self._weigh(replays, probed, started)
        paths, current, candidates = weighed.paths, weighed.current, weighed.candidates
        best, decisive = weighed.best, weighed.decisive is not None
        self._look(paths, current, obs.long_fraction)
        if ops:
            direction = _direction(ops)
            target = self.state.target or self._after(layout, ops)
            found = [e for _, e in paths[direction] if e.composition == target]
            if not found:
                probe = probes.along(layout, obs.workers, direction, ps, target)
                found = [e for _, e in probes.estimates(replays, probe, ps)]
            proposed = found[0] if found else None
            self._streak = ("", 0)
            if proposed is not None and self._pays(proposed, current):
                # The rules' move pays. Going further the same way pays more? Then there.
                if (
                    best is not None
                    and best[0] == direction
                    and best[2].mean_s <= proposed.mean_s * (1.0 - ps.whatif_margin)
                ):
                    return self._move(
                        before, best, current, candidates, proposed, "extend", replays
                    )
                return WhatIf(current, candidates, proposed, "agree"), ops
            if decisive and best is not None:
                return self._move(before, best, current, candidates, proposed, "trigger", replays)
            # Veto: the rules' move does not pay on this window; nothing starts.
            self.state = _nothing_started(before)
            return WhatIf(current, candidates, proposed, "veto"), ()
        if not decisive and not boundary:
            # Sliding windows: a decisive gain acts at any hop, but persistence is
            # counted on disjoint windows only (every hops_per_window-th
            # evaluation), since overlapping windows share most of their requests.
            return WhatIf(current, candidates, None, "stay" if best is None else "wait"), ()
        if best is None:
            self._streak = ("", 0)
        else:
            n = self._streak[1] + 1 if self._streak[0] == best[0] else 1
            self._streak = (best[0], n)
            if decisive or (n >= ps.persist_windows and self._agree(best[0])):
                return self._move(before, best, current, candidates, None, "trigger", replays)
        leaning = self._leaning(paths, current)
        if leaning is not None:
            return self._move(before, leaning, current, candidates, None, "trigger", replays)
        return WhatIf(current, candidates, None, "stay" if best is None else "wait"), ()

    def _look(
        self,
        paths: Mapping[str, list[tuple[list[planner.PathStep], whatif.Estimate]]],
        current: whatif.Estimate,
        long_fraction: float,
    ) -> None:
        """Record this look's best estimated gain each way (``whatif_agree``) and,
        with its window's ``long_fraction``, each merge candidate's
        (``whatif_recall_s``); the looks on another composition are dropped, their
        gains were against it. A direction with no candidate counts 0: that look
        says nothing of it."""
        if current.mean_s <= 0:
            return
        split, merge = (
            max((1.0 - e.mean_s / current.mean_s for _, e in paths[d]), default=0.0)
            for d in DIRECTIONS
        )
        on = str(current.composition)
        same = self._looks[0] == on
        kept = self._looks[1] if same else ()
        ps = self.settings
        last = max(ps.persist_windows, ps.whatif_horizon) * ps.hops_per_window
        self._looks = (on, (*kept, (split, merge))[-last:])
        if ps.whatif_recall_s > 0:
            gains = (
                (str(e.composition), 1.0 - e.mean_s / current.mean_s) for _, e in paths["merge"]
            )
            merges = tuple(sorted(gains))
            recalled = self._recall if same else ()
            keep = max(1, round(ps.whatif_recall_s / ps.hop))
            self._recall = (*recalled, Look(long_fraction, merges))[-keep:]

    def _agree(self, direction: str) -> bool:
        """The looks of the last ``persist_windows`` windows do not, on average,
        estimate that a move ``direction`` loses (``whatif_agree``)."""
        ps = self.settings
        looks = self._looks[1][-ps.persist_windows * ps.hops_per_window :]
        if not ps.whatif_agree or not looks:
            return True
        i = DIRECTIONS.index(direction)
        return sum(look[i] for look in looks) / len(looks) >= 0.0

    def _outlasted(self) -> bool:
        """Every look of the check's horizon (``whatif_horizon`` windows) on the
        current composition estimated that a merge pays ``whatif_margin``: a light
        stretch that lasted the horizon, which flap damping does not hold back
        (``PlannerSettings.damp_flaps``)."""
        ps = self.settings
        n = ps.whatif_horizon * ps.hops_per_window
        looks = self._looks[1][-n:]
        i = DIRECTIONS.index("merge")
        return len(looks) == n and all(look[i] >= ps.whatif_margin for look in looks)

    def _leaning(
        self,
        paths: Mapping[str, list[tuple[list[planner.PathStep], whatif.Estimate]]],
        current: whatif.Estimate,
    ) -> _Path | None:
        """Small gains that add up (``PlannerSettings.whatif_accumulate``): each
        window, the best candidate of each direction by its gain, the mean's and
        the P90's weighed by ``whatif_lean_p90`` (its P90 within the margin). The
        lean's direction keeps its lean and appends its gain, a loss included, as
        long as it gains or no direction does; otherwise the best gaining
        candidate starts a new lean, and with none the lean ends. The candidate
        moves once the lean's ``k`` ≥ 2·``persist_windows`` windows
        gained ``whatif_margin`` · √(``persist_windows`` / ``k``) on average and
        this window's gain is positive. The lean keeps the last
        ``_LEAN_MAX``·``persist_windows`` windows, so the gain needed never falls
        below a third of the margin.

        Why a loss is counted rather than ending the lean: a lean that ended at
        every window without a gain averaged only the windows that happened to
        gain, an average biased upward, and restarted on the noise of one
        window; counting them averages every window, the mean a small true gain
        needs to be found (docs/benchmarks/adaptive.md, "The lean counts the
        windows it loses")."""
        ps = self.settings
        if not ps.whatif_accumulate or current.mean_s <= 0:
            return None
        best: dict[str, tuple[float, _Path]] = {}
        w = ps.whatif_lean_p90 if current.p90_s > 0 else 0.0
        for d, found in paths.items():
            for steps, e in found:
                gain = (1.0 - w) * (1.0 - e.mean_s / current.mean_s)
                if w:
                    gain += w * (1.0 - e.p90_s / current.p90_s)
                p90_ok = e.p90_s <= current.p90_s * (1.0 + ps.whatif_margin)
                if p90_ok and (d not in best or gain > best[d][0]):
                    best[d] = (gain, (d, steps, e))
        way = self._lean[0]
        gaining = [g for g in best.values() if g[0] > 0]
        if way in best and (best[way][0] > 0 or not gaining):
            gain, chosen = best[way]
        elif gaining:
            gain, chosen = max(gaining, key=lambda g: g[0])
        else:
            self._lean = ("", ())
            return None
        gains = (*self._lean[1], gain) if way == chosen[0] else (gain,)
        gains = gains[-_LEAN_MAX * ps.persist_windows :]
        self._lean = (chosen[0], gains)
        k = len(gains)
        needed = ps.whatif_margin * math.sqrt(ps.persist_windows / k)
        if gain > 0 and k >= 2 * ps.persist_windows and sum(gains) / k >= needed:
            return chosen
        return None

    def _move(
        self,
        before: planner.ControllerState,
        chosen: _Path,
        current: whatif.Estimate,
        candidates: tuple[tuple[str, whatif.Estimate], ...],
        proposed: whatif.Estimate | None,
        verdict: str,
        replays: probes.Replays,
    ) -> tuple[WhatIf, tuple[planner.Op, ...]]:
        """Start the what-if check's own move toward ``chosen`` (direction, path, estimate)
        in place of whatever the rules decided."""
        ps = self.settings
        direction, steps, best = chosen
        self._streak = ("", 0)
        self._lean = ("", ())
        start = planner.startable([st.op for st in steps], before.layout, (), self.capacity, ps)
        if not start:
            self.state = _nothing_started(before)
            return WhatIf(current, candidates, proposed, "wait"), ()
        why = (
            f"what-if: {best.composition} {best.mean_s:.3f} s vs {current.mean_s:.3f} s "
            f"on {current.composition}"
        )
        if replays.since_s is not None:
            why += f", on the last {replays.since_s:g} s (a change of arrivals)"
        start = self._begin(before, direction, best.composition, start, why)
        return WhatIf(current, candidates, proposed, verdict), start

    def _begin(
        self,
        before: planner.ControllerState,
        direction: str,
        target: Composition,
        start: Sequence[planner.Op],
        why: str,
    ) -> tuple[planner.Op, ...]:
        """A move the controller decided itself (the what-if check's or the shadows'):
        its first operations ``start``, with ``why`` as their reason, pending toward
        ``target``, and the streaks that led to it reset."""
        start = tuple(replace(op, reason=why) for op in start)
        self._streak = ("", 0)
        self._lean = ("", ())
        self._goal = (direction, target)
        self.state = replace(
            before,
            split_streak=0,
            merge_streak=0,
            confirming=(),
            pending=start,
            momentum=None,
            target=target,
            plan=(),
            history=before.history + (why,),
        )
        return start

    @staticmethod
    def _after(layout: planner.Layout, ops: Sequence[planner.Op]) -> Composition:
        """The composition ``ops`` (on existing workers) lead to."""
        degree = {s.worker: s.degree for s in layout.slots}
        degrees = list(degree.values())
        for op in ops:
            if isinstance(op, planner.Split):
                d = degree[op.worker]
                degrees.remove(d)
                degrees += [d // 2, d // 2]
            else:
                d = degree[op.workers[0]]
                degrees.remove(d)
                degrees.remove(d)
                degrees.append(2 * d)
        return Composition.of(degrees)

    def committed(
        self,
        op: planner.Op,
        new_ids: Sequence[int],
        removed: Sequence[int],
        running_remaining_s: Mapping[int, float],
    ) -> tuple[planner.Op, ...]:
        """``op`` committed, creating ``new_ids`` in place of ``removed``: the next
        operations of the transition in progress (empty: none now)."""
        self.state = planner.commit(self.state, new_ids, op)
        self.windows.forget(removed)
        self.samples.reshaped()
        workers = self.workers(running_remaining_s)
        if self._goal is not None:
            return self._toward_goal(workers)
        self.state, more = planner.advance(self.state, workers, self.capacity, self.settings)
        return more

    def _toward_goal(self, workers: Sequence[planner.WorkerObservation]) -> tuple[planner.Op, ...]:
        """The next operations of a move the what-if check started (none: it is over,
        or it cannot be reached from here and stops where it is)."""
        assert self._goal is not None
        direction, goal = self._goal
        st = self.state
        path = planner.free_path(
            st.layout, st.pending, direction, self.settings, workers, target=goal,
            limit=self.settings.max_walk,
        )  # fmt: skip
        reached = st.layout.composition == goal and not st.pending
        if reached or not path or path[-1].composition != goal:
            if not st.pending:
                self._goal = None
                self.state = replace(st, target=None, plan=())
            return ()
        ops = planner.startable(
            [s.op for s in path], st.layout, st.pending, self.capacity, self.settings
        )
        reason = st.history[-1] if st.history else ""
        ops = tuple(replace(o, reason=reason) for o in ops)
        self.state = replace(st, pending=st.pending + ops)
        return ops
