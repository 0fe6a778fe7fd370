"""Settings of the composition controller: the planner's rules and the what-if check (design.md section 4).

One frozen dataclass, :class:`PlannerSettings`, validated on construction,
read by :mod:`vertumnus.core.planner` (the rules), :mod:`vertumnus.core.control`
(the check and what it remembers) and every shell; the CPPool's
``spec.controller`` and the CLI's ``--planner K=V`` set its fields. Each field
says what it does and where its default was chosen
(docs/benchmarks/adaptive.md). :mod:`vertumnus.core.planner` re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PlannerSettings"]


@dataclass(frozen=True)
class PlannerSettings:
    """How the composition controller reads its windows. Defaults: docs/benchmarks/adaptive.md."""

    window_s: float = 20.0
    """H: length of one observation window, seconds (20 s since multi-step
    transitions; 30 s for the one-step controller, docs/benchmarks/adaptive.md)."""
    upper: float = 0.9
    """Split when utilization u = D/(H·K) stays above this (0 < lower < upper)."""
    lower: float = 0.45
    """Merge when utilization stays below this."""
    merge_admit: float = 0.8
    """A merge is admitted only if utilization under the *merged* composition
    stays at or below this (≤ upper, so a merge never triggers a split back)."""
    persist_windows: int = 2
    """Consecutive windows (evaluations) a condition must hold before the controller
    acts. With ``hop_s`` < ``window_s`` consecutive windows overlap, so a change is
    confirmed after ``window_s`` + (``persist_windows`` − 1)·``hop_s`` seconds."""
    hop_s: float = 0.0
    """Seconds between two evaluations (sliding windows): each evaluation reads the
    last ``window_s`` seconds. 0 (the default) means ``window_s``: consecutive,
    non-overlapping windows. Otherwise 0 < ``hop_s`` ≤ ``window_s`` and
    ``window_s`` a multiple of it (docs/benchmarks/adaptive.md, "Sliding
    windows"). The shell evaluates at this period (:attr:`hop`); the planner
    itself only needs it to count long requests and pool the long share over
    distinct time (the observations' ``fresh_*`` fields)."""
    follow_through: bool = True
    """Once a sustained change has been confirmed and acted on, a further step
    in the same direction needs one window, not ``persist_windows``, as long
    as every window since still asks for it: the persistence test guards
    against acting on noise, and this change has already passed it. One
    window that asks for anything else ends the follow-through."""
    multi_step: bool = True
    """Move to the target composition in one decision (multi-step transitions,
    :mod:`vertumnus.core.planner`): the controller returns every operation
    toward the target that may start now, and
    :func:`~vertumnus.core.planner.advance` hands out the rest as operations commit. False: one
    operation per decision, the next one only at a later window."""
    max_walk: int = 16
    """The most operations one planner call looks ahead toward the target. A
    target further away is reached in legs: :func:`~vertumnus.core.planner.advance` plans the next leg
    as the last one commits. Bounds one call's cost on very large pools; on a
    40-GPU CP4/CP8 lattice (at most 5 operations apart) it never binds."""
    max_concurrent_ops: int = 4
    """Operations in flight at once (on disjoint workers) in a multi-step transition."""
    transition_admit: float = 0.9
    """A second (third, ...) concurrent operation starts only if the workers
    that stay in service keep the confirming demand at or below this
    utilization: capacity precedence during the transition. The first
    operation is never held back by it (the one-step controller's rule)."""
    long_threshold: int = 32768
    """A request longer than this many tokens counts as long."""
    mix_margin: float = 0.2
    """How far the long requests' share of the demand may drift from the
    largest-degree workers' share of the capacity before it counts as a
    substantial change of the long-request fraction (see :func:`~vertumnus.core.planner.step`)."""
    min_requests: int = 20
    """Windows with fewer requests give no long-fraction signal (too noisy)."""
    mix_evidence: bool = True
    """A change that reads the long share (every one except a split for
    u > ``upper``, and a low-utilization merge with ``mix_below_lower`` off)
    is confirmed only once the streak's windows hold enough long requests
    for the share to be known to within ``mix_margin``/2 — at least
    ⌈1/(4·``mix_margin``²)⌉ of them (7 at the default margin;
    :func:`~vertumnus.core.planner.min_long_requests`) — and is then planned with the streak's
    pooled long share (Σ long demand / Σ demand) instead of each window's
    own: persistence scales with how thin the windows are
    (docs/benchmarks/adaptive.md, "Thin windows"). False: ``persist_windows``
    windows, each read on its own, as before."""
    mix_below_lower: bool = True
    """Below ``lower`` the long-share signal still counts (see :func:`~vertumnus.core.planner.step`):
    a low-utilization merge is an efficiency preference, not a capacity
    requirement, so it yields to a long share that asks for a split, and a
    merge it asks for is admitted only if the merged composition's
    large-degree capacity share stays at or below the long share (a full
    ``mix_margin`` clear of a split back; :func:`~vertumnus.core.planner._merge_admitted`). Capacity
    keeps precedence where it is
    a requirement: above ``upper`` (split regardless of the mix) and in
    merge admission. False: the earlier rule, under which a low
    utilization overrode the long share (an all-CP8 pool at low load could
    never split)."""
    drain_tie_s: float = 0.25
    """Operations whose predicted drain times are within this many seconds of
    the shortest are ranked by KV-reconciliation traffic instead."""
    domain_size: int = 8
    """GPUs per NVLink domain (node); no worker spans two."""
    degrees: tuple[int, ...] = (4, 8)
    """Degrees the lattice may use; each must be in the prefill-time profile
    (the shell checks). Default CP4/CP8, the paper's 40-GPU lattice; the
    bundled profile also has CP1/CP2, which can be allowed here at the price
    of a larger lattice (286 compositions on 40 GPUs instead of 6)."""
    history_quantile: float = 0.9
    """Initial composition: the window demand of the history this quantile
    must fit under ``upper`` times the composition's capacity."""
    whatif: bool = True
    """The what-if check (:mod:`vertumnus.core.whatif`; needs the shell to give
    the controller the prefill model and the window's requests): before a move
    the rules asked for, estimate with the cost model the mean TTFT the
    window's requests would have had on the current composition and on the
    move's target, the transition's drain and switch included, and make the
    move only if it pays by ``whatif_margin``; and when the rules ask for
    nothing but a composition along the split or merge path pays by the
    margin for ``persist_windows`` windows in a row (one window if it pays by
    ``whatif_decisive``), move there. The initial
    composition is the lattice point with the lowest estimate on the
    history. False: the rules alone (docs/benchmarks/adaptive.md)."""
    whatif_margin: float = 0.03
    """The estimated mean-TTFT gain (a fraction of the current composition's
    estimate) a move must bring; its estimated P90 TTFT may not be worse than
    the current one's by more than this fraction either."""
    whatif_decisive: float = 0.15
    """An estimated gain this large needs one window, not ``persist_windows``:
    persistence guards against acting on noise, and a window whose requests
    would have been served this much faster elsewhere is a change, not noise
    (the first window after a phase change). 0.1 until the look between
    windows became twice as frequent (``check_hops`` 8): more looks give noise
    more chances, and 0.15 keeps the cycling long-context family from
    following its cycle (docs/benchmarks/adaptive.md, "A look every 2.5 s")."""
    whatif_accumulate: bool = True
    """Small gains that add up: a candidate that gains less than
    ``whatif_margin`` but gains, the same way, on average over window after
    window is taken as the persistence rule takes one above it, once ``k`` ≥
    2·``persist_windows`` disjoint windows of that lean gained
    ``whatif_margin`` · √(``persist_windows`` / ``k``) on average (each
    window's best candidate that way by its gain, the mean's and the P90's
    weighed by ``whatif_lean_p90``, its P90 within the margin;
    a window where that way loses counts its loss while no other way gains;
    ``k`` is at most 8·``persist_windows``, so the gain needed never falls
    below a third of the margin): the margin guards one window's estimate
    against noise, and the noise of an average of ``k`` shrinks as 1/√k.
    Meets the phases whose best composition is 1–3 % better, which the margin
    alone never does. False: the margin's persistence only
    (docs/benchmarks/adaptive.md, "Small gains that add up" and "The lean
    counts the windows it loses")."""
    whatif_lean_p90: float = 0.5
    """The weight of the P90's gain in each window's gain the lean adds up
    (``whatif_accumulate``): (1 − w)·(mean's gain) + w·(P90's gain), each a
    fraction of the current composition's estimate. A lasting small gain that a
    pool's tail feels more than its mean (compositions within 1 % on the mean
    whose P90s differ by 3–5 %) adds up sooner, and the P90 is a second, noisier
    but independent reading of the same gain. Chosen on the calibration mix
    (18 draws: 82.4 % of the per-phase oracle's gain at 0, 84.2 % at 0.25,
    85.1 % at 0.5, 84.0 % at 0.75, 83.8 % at 1; docs/benchmarks/adaptive.md,
    "The lean reads the P90 too"). 0: the mean alone."""
    whatif_agree: bool = True
    """A move by persistence also needs the looks between its windows to agree.
    Persistence counts whole disjoint windows, every ``check_hops``-th look, and
    two of them can each pay the margin while most looks between (on windows
    that share most of their requests) estimate that the same move loses: a
    gain at the edge of the estimate's noise. With this, the best estimated
    gain of the move's direction, averaged over every look on the current
    composition in the last ``persist_windows`` windows, must not be negative
    either. Decisive gains and small gains that add up are not affected. False:
    the whole windows alone (docs/benchmarks/adaptive.md, "Three draws of
    every family cell, and the looks between must agree")."""
    whatif_change: float = 25.0
    """When the window's arrivals changed within it, the what-if check judges on
    the requests since the change, not on the whole window: the likelihood-ratio
    statistic of the most likely change point (:mod:`vertumnus.core.changepoint`)
    must reach this, and both sides must hold ``min_requests`` requests. Such a
    look moves only on a decisive gain (``whatif_decisive``, or the smaller
    ``whatif_change_decisive`` where the change moved the mix the move's way) and
    never counts toward persistence; once the pool has moved on those requests, the
    whole window (mostly from before the change) moves it no further while
    the change is in it (verdict ``hold``). 0: always the whole window
    (docs/benchmarks/adaptive.md, "Judging on the requests since a change" and
    "The requests since a change decide")."""
    whatif_change_over: float = 3.0
    """A change of arrivals must also stand out of the traffic's own bursts: its
    statistic at least this many times the median statistic of the looks of the
    last ``whatif_change_memory_s`` (once a window's worth of looks is in). The
    statistic grows with the window's count, so bursty but stationary traffic
    reaches ``whatif_change`` at most looks: at 256 GPUs 9 of the 15 family
    cells do, and each such look restarted the shadows' comparison and judged on
    a burst's 2.5 s. The mixes' phase changes are 5–68 times the median at their
    first look. At 3 the 256-GPU families meet 1 % on mean and P90 in 10 of 15
    cells (8 at 0, 9 at 2 and at 5), and the 40-GPU families and the mixes are
    the same to the bit (docs/benchmarks/adaptive.md, "A change must stand out
    of the bursts"). 0: ``whatif_change`` alone."""
    whatif_cached_before: bool = False
    """The window replays count a prefix cached before the window as held by every
    worker at its first reuse (:func:`vertumnus.core.whatif.cached_before_anywhere`);
    off, they start cold and charge it uncached everywhere. A cold window reuses
    a third or less of what the pool reuses (mooncake: 1,081 tokens per request
    against 3,696), and at heavy load the extra work queues: at 1,024 GPUs on
    mooncake heavy the cold windows find a split 3.3 % better where the
    simulator finds it 2.9 % worse, and with this −2.5 %; that pool goes from
    1.074 / 1.057 to 1.025 / 1.052 of the best fixed composition (one copy). At 40
    GPUs it estimates the neighbours worse (mean |bias| 2.2 → 3.8 %), and 39 of
    the 45 cells stay within 1 % on mean and P90 where 44 do without it
    (longcontext makes round trips). Off (docs/benchmarks/adaptive.md, "κ is one
    worker's; 1,024 GPUs heavy: the estimate's cold windows")."""
    whatif_held: bool = False
    """The window replays start with each prefix cached before the window held where
    the pool held it (the worker that served its first reuse in the window, as the
    shell reported it: :meth:`vertumnus.core.whatif.RequestTable.held_before`),
    carried through each candidate's transition as the reconciliation plans it (a
    split deals a worker's prefixes between its halves, a merge keeps both
    buddies'): the pool's cache, where ``whatif_cached_before`` credits it
    everywhere. Requests whose worker the shell did not report start cold as
    before. On 1,024 GPUs at heavy mooncake load 1.074 / 1.057 of the best fixed
    composition → 1.018 / 1.045; but the thresholds (margin, decisive gain,
    persistence, recall) were chosen on cold estimates, and with warm ones the
    time-varying mixes capture 79.6 % of the oracle's gain (85.7 % cold) and 42 of
    the 45 40-GPU cells stay within 1 % (44 cold). Off (docs/benchmarks/adaptive.md,
    "Window replays that start where the pool's cache was")."""
    whatif_change_memory_s: float = 240.0
    """The span of the looks whose median statistic ``whatif_change_over`` reads
    (as long as the shadows compare before they move, ``shadow_min_s``)."""
    whatif_change_decisive: float = 0.10
    """The estimated gain on the requests since a change of arrivals that moves the
    pool at once when the change moved the mix the move's way: the share of long
    requests at least doubled for a merge, at least halved for a split
    (``whatif_decisive`` otherwise, and on the whole window). Such a change is
    evidence that the best composition moved, and each look spent on the old one
    while the new phase's queue builds costs more than a look at a stationary
    window. Chosen on the calibration mix (82.4 % of the per-phase oracle's gain
    on 18 draws, 77.8 % at 0.15; docs/benchmarks/adaptive.md, "The requests since
    a change decide"). At or below ``whatif_margin``, every candidate that pays
    there moves at once."""
    whatif_recall_s: float = 200.0
    """Recall, against a load that cycles: a merge the whole window leads to (the
    rules' or the check's own; one decided on the requests since a change of
    arrivals only while the pool flaps, ``damp_flaps``) is made only if the looks
    on the current composition over the last this many seconds, back to the first whose window's long fraction differs from
    this one's by a factor of 2 or more (another mix), do not estimate on average
    that its target loses (verdict ``recall``). A merge pays in a trough of the
    load and loses at its crest, where undoing it needs a drained split under the
    very load that makes it wrong; a window alone cannot tell a trough from a
    phase, and the looks of the last cycle can. A phase whose mix changed starts
    the recall afresh: a merge decided on the requests since a change is recalled
    at their long fraction, not the window's. Splits are never held back. 0: off
    (docs/benchmarks/adaptive.md, "Recall: a merge must not lose over the last
    cycle")."""
    damp_flaps: int = 2
    """Flap damping, as an autoscaler's scale-down stabilization: once the
    controller has reversed a move within ``flap_s`` this many times in the last
    ``damp_s``, the what-if check makes no merge but one that pays decisively on
    the requests since a change of arrivals and that the recall
    (``whatif_recall_s``) does not refute: on a large pool the change-point test
    sees a change at every crest and trough of a rate that cycles within a window,
    and such merges flapped every 10 s (docs/benchmarks/adaptive.md, "Families
    at 256 GPUs"). A workload whose light stretches
    last less than the check's horizon (a rate that cycles) otherwise merges on
    each and splits back under the returning load, drained, at its tail
    latency's cost. Splits are never damped, and neither is a merge once every
    look of the check's horizon (``whatif_horizon`` windows) on the current
    composition estimated that a merge pays ``whatif_margin``: a light stretch
    that lasted the horizon is what the check's estimate assumes, a phase and not
    a cycle's trough. 0: off (docs/benchmarks/adaptive.md, "Flap damping" and
    "A light phase that outlasts the horizon")."""
    flap_s: float = 120.0
    """A move opposite to the previous one within this many seconds is a flap."""
    damp_s: float = 1200.0
    """The flaps of the last this many seconds count toward ``damp_flaps``."""
    switch_s: float = 0.5
    """Seconds a split or merge keeps its GPUs out of service after the drain
    (the executor's switch), charged by the what-if check."""
    whatif_horizon: int = 5
    """Windows over which the what-if check weighs a move: the move's transition
    (drain and switch) is paid in the first, and the composition serves the
    window's requests from the start in the other ``whatif_horizon − 1``; the
    estimate is their mean. 1: the window alone, so that a move whose gain
    lasts but whose transition costs up front looks worse than it is."""
    check_hops: int = 8
    """With disjoint windows (``hop_s`` = 0): evaluations per window. The rules
    read the disjoint windows only (every ``window_s``), and at the evaluations
    between, the what-if check alone looks at the last ``window_s`` for a
    decisive gain (``whatif_decisive``), so that a phase change is met within
    ``window_s / check_hops`` seconds while persistence is still counted on
    disjoint windows (docs/benchmarks/adaptive.md, "Faster than a window").
    1: once per window. With sliding windows (``hop_s`` > 0) the rules read
    every hop themselves and this is not used."""
    whatif_threads: int = 1
    """Threads the what-if check replays its candidates on (the compiled replay
    runs without the GIL; the estimates are the same with any number). 1: in
    the caller's thread. A shell with cores to spare for its controller gives
    it more: a 1,024-GPU window's check takes about half as long on two
    (docs/benchmarks/adaptive.md, "Decision time")."""
    whatif_rows: int = 350_000
    """The most request replays one look of the what-if check spends on its
    probes: the table's requests times the replays (each candidate's, with and
    without its transition, on the window and on the requests since a change).
    The compiled replay takes 0.1–0.13 µs per request on one core (more with
    more degrees), so the default holds a look's replays near 35–40 ms at
    1,024 GPUs and 0.75 requests/s per GPU: a whole look of 26 ms (CP4/CP8) to
    60 ms (degrees 1–8, after a change of arrivals) on one core in
    2026-12 (the request tables it does not bound grow with the window); past
    it the shortest steps of each path are not probed
    (:func:`vertumnus.core.probes.affordable`). A 40-GPU
    pool's look needs a tenth of it (docs/benchmarks/adaptive.md, "A bound on a
    look's replays")."""
    shadow: bool = True
    """Shadow pools (:mod:`vertumnus.core.shadow`; needs a shell that hands the
    controller each request with its block keys, and the cache size): the
    current composition and its neighbours each serve the pool's requests
    alongside it, continuously, and at each window boundary with nothing else
    decided, a neighbour whose pooled TTFTs over the last ``shadow_horizon_s``
    beat the current one's by ``shadow_margin`` (the mean's gain and the P90's,
    weighed by ``whatif_lean_p90``; neither worse by more than the margin) is
    moved to; a move of the window estimate toward one they find worse (or past
    one on its way) is held back: on their last comparison, or, when the
    estimate is decisive, on the window's own requests. On by default since
    2026-12-06 for pools up to
    ``shadow_max_gpus`` (docs/benchmarks/adaptive.md, "Shadow pools that
    scale"). False: the window replays alone."""
    shadow_horizon_s: float = 600.0
    """Seconds of requests the shadows' comparison pools (since the last move
    they did not decide, and since the last change of arrivals the what-if
    check found that moved the mix, or the rate for ``shadow_restart_s``)."""
    shadow_min_s: float = 240.0
    """A comparison needs this many seconds of requests both shadows served warm,
    and the pool this many seconds since its last move. Chosen on mooncake (a
    calibration family): 180, 240 and 300 s meet 8, 8 and 7 of its 9 cells."""
    shadow_restart_s: float = 60.0
    """A change of arrivals that moved the rate alone (not the mix) restarts the
    shadows' comparison only if, over this many seconds after it, the rate still
    differs from the rate over as long before it by a factor 2 (a phase, not a
    burst; :meth:`vertumnus.core.control.Controller._restart`), and then from
    the change on. 0: every change restarts it at once (as before 2026-12-07)."""
    shadow_warmup_s: float = 60.0
    """A new shadow starts cold: its first this many seconds are not compared."""
    shadow_margin: float = 0.005
    """The weighed gain a neighbour's shadow must show over the current one's
    (chosen on mooncake: 0.01, 0.005 and 0.0025 meet 6, 7 and 6 of its cells
    at ``shadow_min_s`` 300)."""
    shadow_max_gpus: int = 1024
    """Shadows only for a pool of at most this many GPUs: their upkeep grows with the
    pool. Every request is placed once per shadow (~3–10 µs compiled, 30–85 µs in
    the Python twin), and a comparison pools the horizon's requests: at 1,024 GPUs
    and 0.75 requests/s per GPU the seven shadows the controller follows take ~4 %
    of a core, and their comparison adds ~10 ms to a steady look
    (``bench/shadow_speed.py``, ``bench/decision_tick.py --shadows``;
    docs/benchmarks/adaptive.md, "Compiled shadows"). Was 64 while the shadows were
    Python only."""
    shadow_memory_mib: int = 256
    """The shadows' caches take about at most this much memory: each shadow caches
    as many tokens as the pool, ~100 bytes per block of
    :data:`vertumnus.core.shadow.SHADOW_BLOCK_TOKENS` tokens (~450 in the Python
    twin), and a pool whose shadows would take more counts its reuse in blocks of
    twice, four times, … as many tokens (:func:`vertumnus.core.shadow.block_tokens`).
    With 512K tokens cached per GPU, pools of up to ~300 GPUs keep 512-token blocks."""
    learn_capacity: bool = False
    """κ that follows the workload (:mod:`vertumnus.core.kappa`): the rules read
    the shipped κ corrected online from the workers' own hops (demand against
    SLO attainment; needs the shell to report completions). False: the
    shipped κ as it is."""

    def __post_init__(self) -> None:
        if self.window_s <= 0:
            raise ValueError(f"window must be > 0 s, got {self.window_s}")
        if self.check_hops < 1:
            raise ValueError(f"check_hops must be >= 1, got {self.check_hops}")
        if self.whatif_threads < 1:
            raise ValueError(f"whatif_threads must be >= 1, got {self.whatif_threads}")
        if self.whatif_rows < 1:
            raise ValueError(f"whatif_rows must be >= 1, got {self.whatif_rows}")
        if self.whatif_horizon < 1:
            raise ValueError(f"whatif_horizon must be >= 1 window, got {self.whatif_horizon}")
        if not 0 < self.lower < self.upper:
            raise ValueError(f"need 0 < lower < upper, got lower={self.lower} upper={self.upper}")
        if not self.merge_admit <= self.upper:
            raise ValueError(f"merge_admit ({self.merge_admit}) must be <= upper ({self.upper})")
        if self.persist_windows < 1:
            raise ValueError("persist_windows must be >= 1")
        if self.hop_s != 0:
            ratio = self.window_s / self.hop_s if self.hop_s > 0 else 0.0
            if not 0 < self.hop_s <= self.window_s or abs(ratio - round(ratio)) > 1e-9:
                raise ValueError(
                    f"hop_s must be 0 (= window_s) or in (0, window_s] with window_s a "
                    f"multiple of it, got hop_s={self.hop_s} window_s={self.window_s}"
                )
        if self.mix_margin <= 0:
            raise ValueError("mix_margin must be > 0")
        if self.max_walk < 1:
            raise ValueError("max_walk must be >= 1")
        if self.max_concurrent_ops < 1:
            raise ValueError("max_concurrent_ops must be >= 1")
        if self.transition_admit <= 0:
            raise ValueError("transition_admit must be > 0")
        if not self.degrees or any(d < 1 or d > self.domain_size for d in self.degrees):
            raise ValueError(f"degrees {self.degrees} must lie in 1..{self.domain_size}")
        if not 0 < self.history_quantile <= 1:
            raise ValueError("history_quantile must be in (0, 1]")
        if not 0 <= self.whatif_margin < 1:
            raise ValueError(f"whatif_margin must be in [0, 1), got {self.whatif_margin}")
        if not self.whatif_margin <= self.whatif_decisive <= 1:
            raise ValueError(
                f"whatif_decisive must be in [whatif_margin, 1], got {self.whatif_decisive}"
            )
        if not 0 < self.whatif_change_decisive <= 1:
            raise ValueError(
                f"whatif_change_decisive must be in (0, 1], got {self.whatif_change_decisive}"
            )
        if self.switch_s < 0:
            raise ValueError(f"switch_s must be >= 0, got {self.switch_s}")
        if not 0 <= self.whatif_lean_p90 <= 1:
            raise ValueError(f"whatif_lean_p90 must be in [0, 1], got {self.whatif_lean_p90}")
        if not self.whatif_recall_s >= 0:
            raise ValueError(f"whatif_recall_s must be >= 0 (0: off), got {self.whatif_recall_s}")
        if self.damp_flaps < 0:
            raise ValueError(f"damp_flaps must be >= 0 (0: off), got {self.damp_flaps}")
        if not (self.flap_s > 0 and self.damp_s > 0):
            raise ValueError(f"flap_s and damp_s must be > 0, got {self.flap_s}, {self.damp_s}")
        if not self.whatif_change_over >= 0:
            raise ValueError(
                f"whatif_change_over must be >= 0 (0: off), got {self.whatif_change_over}"
            )
        if not self.whatif_change_memory_s > 0:
            raise ValueError(
                f"whatif_change_memory_s must be > 0, got {self.whatif_change_memory_s}"
            )
        if not self.whatif_change >= 0:
            raise ValueError(f"whatif_change must be >= 0 (0: off), got {self.whatif_change}")
        if not (self.shadow_horizon_s > 0 and 0 < self.shadow_min_s <= self.shadow_horizon_s):
            raise ValueError(
                f"need 0 < shadow_min_s <= shadow_horizon_s, got {self.shadow_min_s}, "
                f"{self.shadow_horizon_s}"
            )
        if not self.shadow_restart_s >= 0:
            raise ValueError(f"shadow_restart_s must be >= 0, got {self.shadow_restart_s}")
        if self.shadow_max_gpus < 0:
            raise ValueError(f"shadow_max_gpus must be >= 0, got {self.shadow_max_gpus}")
        if self.shadow_memory_mib < 1:
            raise ValueError(f"shadow_memory_mib must be >= 1, got {self.shadow_memory_mib}")
        if self.shadow_warmup_s < 0 or not 0 <= self.shadow_margin < 1:
            raise ValueError(
                f"shadow_warmup_s must be >= 0 and shadow_margin in [0, 1), got "
                f"{self.shadow_warmup_s}, {self.shadow_margin}"
            )
        object.__setattr__(self, "degrees", tuple(sorted(set(self.degrees))))

    @property
    def hop(self) -> float:
        """Seconds between evaluations: ``hop_s``, or ``window_s / check_hops`` if it is 0."""
        return self.hop_s or self.window_s / self.check_hops

    @property
    def rules_at_boundaries(self) -> bool:
        """The rules read only every ``hops_per_window``-th evaluation's window
        (disjoint windows evaluated ``check_hops`` times each)."""
        return self.hop_s == 0 and self.check_hops > 1

    @property
    def hops_per_window(self) -> int:
        """How many hops one window spans (1: disjoint windows)."""
        return max(1, round(self.window_s / self.hop))
