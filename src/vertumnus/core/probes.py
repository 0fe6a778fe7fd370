"""What one look of the what-if check replays: its probes, within a budget (issue 12).

A **probe** is a composition along the split or the merge path from the
current layout (:func:`vertumnus.core.planner.free_path`), with the steps
that lead to it; the check estimates each probe on a window's requests
(:mod:`vertumnus.core.whatif`) and judges them
(:class:`vertumnus.core.control.Controller`). This module decides which
probes a look estimates (:func:`along`, :func:`affordable`) and runs their
replays (:class:`Replays`, :func:`start`, :func:`estimates`): with the
transition that leads to the probe, and steady when the estimate weighs a
horizon in, on one thread or on a pool. The estimates are the same either
way. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

import numpy as np

from vertumnus.core import changepoint, planner, whatif
from vertumnus.core.memory import DIRECTIONS
from vertumnus.core.placement import PlacementParams
from vertumnus.core.plannersettings import PlannerSettings
from vertumnus.core.types import Composition

__all__ = ["Heirs", "Probes", "Replays", "Started", "affordable", "along", "estimates", "start"]

Probes = Mapping[str, list[list[planner.PathStep]]]
"""Per direction (``split``, ``merge``), the steps to each composition a look probes."""


class Replays:
    """One window's what-if replays (:func:`whatif.estimate` on one table), each
    started as soon as it is known. On ``threads`` > 1 they run on a pool: the
    compiled replay runs without the GIL, so the replays overlap each other and
    the Python work between them (walking the paths). The estimates are the
    same either way."""

    def __init__(
        self,
        table: whatif.RequestTable,
        params: PlacementParams,
        threads: int,
        current: Composition,
        change: changepoint.Change | None = None,
        since_s: float | None = None,
        heirs: Heirs | None = None,
    ) -> None:
        self.table = table
        self._params = params
        self.change = change
        """The change of arrivals the table starts at (None: the table is the whole window)."""
        self.since_s = since_s
        """Seconds the table's requests span after that change."""
        self._pool = ThreadPoolExecutor(threads, "whatif") if threads > 1 else None
        self._heirs = heirs
        """Where the layout's cached prefixes go along its paths, when each replay
        starts with what the pool held before the table (``whatif_held``); else None."""
        self._held = None
        """Per prefix id, the row of :meth:`Heirs.after`'s tables (the layout's worker,
        by id) that held it before the table (-1: none)."""
        if heirs is not None:
            self._held = whatif.holder_rows(table.held_before(), heirs.workers)
        self.current = self.start(current, None, self.heirs(()))
        """The current composition's estimate, to be waited for."""

    def heirs(self, steps: Sequence[planner.PathStep]) -> np.ndarray | None:
        """:meth:`Heirs.after` ``steps`` when the replays start with the pool's cached
        prefixes (``whatif_held``), else None."""
        return None if self._heirs is None else self._heirs.after(steps)

    def _run(
        self,
        comp: Composition,
        starts: Mapping[int, Sequence[float]] | None,
        inherit: np.ndarray | None,
    ) -> whatif.Estimate:
        held = None
        if inherit is not None and self._held is not None:
            held = whatif.holders_on(self._held, inherit)
        return whatif.estimate(self.table, comp, self._params, starts, held=held)

    def per_probe(self, horizon: int) -> int:
        """Replays one probe costs on this table: the one with the transition, and
        the steady one when the estimate weighs one in (a horizon, or the
        requests since a change)."""
        return 2 if horizon > 1 or self.since_s is not None else 1

    @property
    def threaded(self) -> bool:
        """The replays run on a pool (started ones run while the caller goes on)."""
        return self._pool is not None

    def start(
        self,
        comp: Composition,
        starts: Mapping[int, Sequence[float]] | None = None,
        inherit: np.ndarray | None = None,
    ) -> Future[whatif.Estimate]:
        """The estimate of ``comp`` (with a transition's ``starts``), to be waited for;
        ``inherit``: where the pool's cached prefixes are on it (:meth:`heirs`; None:
        nowhere, the replay starts cold)."""
        if self._pool is None:
            done: Future[whatif.Estimate] = Future()
            done.set_result(self._run(comp, starts, inherit))
            return done
        return self._pool.submit(self._run, comp, starts, inherit)

    def __enter__(self) -> Replays:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            # What was started and not waited for is not needed (the check is over).
            self._pool.shutdown(wait=True, cancel_futures=True)


Started = list[
    tuple[list[planner.PathStep], Future[whatif.Estimate], Future[whatif.Estimate] | None]
]
"""Probes whose replays are started: the steps, the replay with the transition and
the steady one (if the estimate weighs one in)."""


def along(
    layout: planner.Layout,
    workers: Sequence[planner.WorkerObservation],
    direction: str,
    settings: PlannerSettings,
    target: Composition | None = None,
) -> list[list[planner.PathStep]]:
    """The steps to each composition the check estimates along the ``direction``
    path from ``layout`` (after 1, 2, 4, ... operations, and the last), or to
    ``target`` only."""
    path = planner.free_path(
        layout, (), direction, settings, workers, target=target, limit=settings.max_walk
    )
    if target is not None:
        ks = [len(path)] if path and path[-1].composition == target else []
    else:
        # At most four probes per direction on a small pool: every step of a
        # path of up to 4, steps 1, 2, 4 and 5 of a path of 5 (from the
        # lattice's end); on a longer one (a large pool, where one operation
        # moves little) steps 1, 4, 16, 64 and the end: a few replays per
        # direction however long the path. Each probe more is one more
        # chance for a noisy estimate to pay (docs/benchmarks/adaptive.md,
        # "Every step of a short path").
        n = len(path)
        steps = (1, 2, 3) if n <= 4 else (1, 2, 4) if n <= 5 else (1, 4, 16, 64)
        ks = sorted({k for k in steps if k < n} | {n}) if n else []
    return [path[:k] for k in ks]


def walk(
    layout: planner.Layout,
    workers: Sequence[planner.WorkerObservation],
    settings: PlannerSettings,
) -> dict[str, list[list[planner.PathStep]]]:
    """:func:`along` both ways: per direction, the steps to each composition probed."""
    return {d: along(layout, workers, d, settings) for d in DIRECTIONS}


def ends(
    found: Mapping[str, list[list[planner.PathStep]]],
) -> dict[str, dict[Composition, list[planner.PathStep]]]:
    """Per direction, each composition :func:`along` probes (``found``: as
    :func:`walk` gives them), with the steps there (the neighbours the shadow pools
    follow)."""
    return {d: {steps[-1].composition: steps for steps in found[d]} for d in DIRECTIONS}


def start(
    replays: Replays, found: list[list[planner.PathStep]], settings: PlannerSettings
) -> Started:
    """Every replay of :func:`estimates` for the probes ``found``, started."""
    steadily = replays.per_probe(settings.whatif_horizon) == 2
    started: Started = []
    for steps in found:
        starts = whatif.transition_starts(
            [(st.drain_s, st.made) for st in steps], settings.switch_s, settings.max_concurrent_ops
        )
        comp = steps[-1].composition
        inherit = replays.heirs(steps)
        steady = replays.start(comp, None, inherit) if steadily else None
        started.append((steps, replays.start(comp, starts, inherit), steady))
    return started


def estimates(
    replays: Replays,
    found: list[list[planner.PathStep]],
    settings: PlannerSettings,
    started: Started | None = None,
) -> list[tuple[list[planner.PathStep], whatif.Estimate]]:
    """Each probe's estimate: its replay with the transition (its drain and
    switch) and, with a horizon, its replay from the window's start weighed in
    (``whatif_horizon`` − 1) times: the transition is paid once, the composition
    serves on after it. On the requests since a change, which span less than a
    window, the replay with the transition weighs what they span of the
    horizon's ``whatif_horizon`` windows. Every replay is started before any is
    waited for (``started``: already, by :func:`start`)."""
    h = settings.whatif_horizon
    since = replays.since_s
    out = []
    for steps, made, steady in start(replays, found, settings) if started is None else started:
        e = made.result()
        if steady is not None:
            s = steady.result()
            if since is None:
                mean = (e.mean_s + (h - 1) * s.mean_s) / h
                p90 = (e.p90_s + (h - 1) * s.p90_s) / h
            else:
                w = min(1.0, since / (h * settings.window_s))
                mean = w * e.mean_s + (1.0 - w) * s.mean_s
                p90 = w * e.p90_s + (1.0 - w) * s.p90_s
            e = replace(e, mean_s=mean, p90_s=p90)
        out.append((steps, e))
    return out


class Heirs:
    """Where the cached prefixes of ``layout``'s workers are after the steps of a path
    from it (:meth:`after`), for the replays that start from the pool's cache
    (``PlannerSettings.whatif_held``). The layout's part is worked out once: a look
    asks it for every probe of both its tables (a 704-worker pool's table in
    ~0.05 ms)."""

    def __init__(self, layout: planner.Layout) -> None:
        ids = np.array([s.worker for s in layout.slots], dtype=np.int64)
        deg = np.array([s.degree for s in layout.slots], dtype=np.int64)
        self.workers = np.sort(ids)
        """The layout's workers by id: row i of a table is the i-th of them."""
        self._at = {w: i for i, w in enumerate(ids.tolist())}  # worker -> layout position
        self._degree = dict(zip(ids.tolist(), deg.tolist(), strict=True))
        self._order = np.argsort(deg, kind="stable")  # by degree, then layout order
        self._sorted_degrees = deg[self._order]
        self._row = np.searchsorted(self.workers, ids)  # layout position -> row
        self._counts = Counter(deg.tolist())
        self._alone = self._table(())

    def after(self, steps: Sequence[planner.PathStep]) -> np.ndarray:
        """Row i (the layout's i-th worker by id): the workers of the composition the
        ``steps`` lead to that hold its prefixes, one per column (a prefix goes to
        column ``id % columns``), numbered as :func:`whatif.estimate` numbers a
        replay's workers: degree by degree, ascending; in each, the layout's workers
        left, in its order, then those the steps create, in order. As the
        reconciliation plans it (:mod:`vertumnus.core.reconcile`): a split deals its
        worker's prefixes between its halves, a merge's worker holds both buddies';
        a worker the steps leave alone keeps its own."""
        return self._table(steps) if steps else self._alone

    def _table(self, steps: Sequence[planner.PathStep]) -> np.ndarray:
        made: dict[int, int] = {}  # the workers the steps create and leave, in order
        heirs_of: dict[int, list[int]] = {}  # a layout worker the steps take -> holders
        holds: dict[int, set[int]] = {}  # a holder -> the layout workers it holds for
        for st in steps:
            op = st.op
            for m in (op.worker,) if isinstance(op, planner.Split) else op.workers:
                if m in self._at and m not in heirs_of:
                    heirs_of[m], holds[m] = [m], {m}
                made.pop(m, None)
                for w in holds.pop(m, ()):
                    now = heirs_of[w]
                    at = now.index(m)
                    now[at : at + 1] = [h for h in st.made_ids if h not in now]
                    for h in st.made_ids:
                        holds.setdefault(h, set()).add(w)
            made.update(zip(st.made_ids, st.made, strict=True))
        kept = np.ones(len(self._at), dtype=bool)
        kept[[self._at[w] for w in heirs_of]] = False
        # A worker left is numbered by the workers left before it (by degree, then
        # layout order) and the new ones of lower degrees; a new one after its
        # degree's workers left and the new ones of its degree before it.
        left = dict(self._counts)
        for w in heirs_of:
            left[self._degree[w]] -= 1
        new_of = Counter(made.values())
        degrees = sorted(set(left) | set(new_of))
        lower, base, n = {}, {}, 0
        for d in degrees:
            lower[d] = sum(new_of[e] for e in degrees if e < d)
            base[d] = n + left.get(d, 0)
            n += left.get(d, 0) + new_of[d]
        index: dict[int, int] = {}
        for w, d in made.items():
            index[w], base[d] = base[d], base[d] + 1
        ks = kept[self._order]
        ranked = self._sorted_degrees[ks]
        shift = np.array([lower[d] for d in degrees], dtype=np.int64)
        own = np.arange(ranked.size) + shift[np.searchsorted(degrees, ranked)]
        width = max((len(h) for h in heirs_of.values()), default=1) or 1
        table = np.full((len(self._at), width), -1, dtype=np.int64)
        table[self._row[self._order[ks]]] = own[:, None]
        for w, hs in heirs_of.items():
            if hs:
                table[self._row[self._at[w]]] = [index[hs[j % len(hs)]] for j in range(width)]
        return table


def affordable(
    found: Probes, replays: Replays, since: Replays | None, settings: PlannerSettings
) -> dict[str, list[list[planner.PathStep]]]:
    """The probes this look can replay within ``PlannerSettings.whatif_rows``
    request replays (the current composition's replays counted first),
    handed out one per direction in turn, each direction keeping its longest
    steps. At least one probe per direction stays; a rules' move that is not
    probed is estimated on its own (one probe more).

    Only a large pool's window reaches the bound (in the benchmarks, the
    look after a change of arrivals at 1,024 GPUs). One operation there
    moves a sliver of the pool, so its shortest steps are the ones that can
    least pay the margin."""
    tables = [r for r in (replays, since) if r is not None]
    per_probe = sum(r.table.n * r.per_probe(settings.whatif_horizon) for r in tables)
    spare = settings.whatif_rows - sum(r.table.n for r in tables)
    if per_probe == 0 or sum(map(len, found.values())) * per_probe <= spare:
        return dict(found)
    left = max(0, spare // per_probe)
    keep = {d: min(1, len(steps)) for d, steps in found.items()}
    left -= sum(keep.values())
    while left > 0 and any(keep[d] < len(steps) for d, steps in found.items()):
        for d, steps in found.items():
            if left > 0 and keep[d] < len(steps):
                keep[d] += 1
                left -= 1
    return {d: steps[len(steps) - keep[d] :] for d, steps in found.items()}
