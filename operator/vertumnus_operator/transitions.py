"""Executing split/merge/replace as epoch transitions: the core's state machine, the router's Admin API.

:class:`TransitionRunner` owns one pool's :class:`~vertumnus.operator.record.Record` and
carries each transition through the phases of :mod:`vertumnus.core.transition`:

``Draining``
    recorded first; then ``Admin.Drain(worker)`` for every participant, on every router
    replica (re-sent until each says drained; the router re-places queued requests).
``Switching``
    once all are drained the state machine assigns the epoch; recorded first; then
    ``Admin.Switch(epoch, domain, grouping, removed, kind)`` on every replica (they
    regroup the domain's ranks), and the domain pod's annotations are rewritten
    (``vertumnus.io/epoch``, ``vertumnus.io/grouping``) — the pod itself stays.
``Committed``
    recorded with the planner's commit (:meth:`Controller.committed`), which may hand
    out the next operations of a multi-step transition; those begin at once.

Because every phase is recorded before its actions go out and every action is idempotent
at the router, a runner built from the last record after a crash (:meth:`resume`)
completes each transition exactly once: same worker ids, same epoch, one commit.

A look of the controller that decides nothing is not recorded at once
(``record_looks_s``): what it changes (the hop number, the controller's per-look memory,
the check's estimates in ``status.lastCheck``) goes with the next write, at most that
many seconds later, or when the pool stops (:meth:`flush`). A look that starts an
operation, or changes the planner's state or what the controller decided (a streak, a
lean, a goal, a flap), is recorded before anything is acted on, as before.

State changes happen under one lock (a decision, a drain report, a commit), so what is
recorded is always a state the state machine produced; the RPCs run outside it, several
transitions at once (disjoint workers).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

from vertumnus.core import planner
from vertumnus.core import transition as tr
from vertumnus.core.control import Controller, Tick
from vertumnus.core.lattice import Layout, Slot
from vertumnus.core.types import Composition
from vertumnus.operator import controller as ctl
from vertumnus.operator.events import EventSink
from vertumnus.operator.metrics import PoolMetrics
from vertumnus.operator.record import Record, RecordStore
from vertumnus.operator.rollout import Recorded
from vertumnus.operator.routerapi import AdminError, Window

__all__ = ["Admin", "Annotator", "TransitionRunner"]

log = logging.getLogger(__name__)


class Admin(Protocol):
    """The part of :class:`~vertumnus.operator.routerapi.RouterAdmin` a runner uses."""

    async def drain(self, worker: int, timeout_s: float) -> bool: ...

    async def switch(self, action: tr.Switch, kind: str, engine_timeout_s: float) -> float: ...


Annotator = Callable[[int, Sequence[Slot], int], Awaitable[None]]
"""``annotate(domain, grouping, epoch)``: write the grouping onto the domain's pod."""


def _timed_feed(
    controller: Controller, window: Window, layout: Layout, in_flight: bool
) -> tuple[Tick | None, float]:
    """:func:`~vertumnus.operator.controller.feed`, and its wall time on the thread that
    ran it (what ``vertumnus_controller_decision_seconds`` reports: not the wait for it,
    nor the shadow pools' upkeep, which grows with the hop's requests, not the look)."""
    began = time.perf_counter()
    requests = ctl.observe(controller, window)
    observed = time.perf_counter() - began
    controller.shadow_serve(requests)
    began = time.perf_counter()
    tick = ctl.decide(controller, window, layout, in_flight)
    return tick, observed + time.perf_counter() - began


def _last_check(hop: int, tick: Tick) -> dict[str, Any]:
    """``status.lastCheck``: the hop's what-if check and the shadow pools' comparisons
    (each neighbour's gain over the current composition, pooled)."""
    out: dict[str, Any] = {"hop": hop}
    if tick.whatif is not None:
        out.update(tick.whatif.to_dict())
    if tick.shadow:
        out["shadow"] = [c.to_dict() for c in tick.shadow]
    return out


def _ids(slots: Sequence[Slot]) -> str:
    return ",".join(f"{s.worker}(CP{s.degree})" for s in slots)


class TransitionRunner:
    def __init__(
        self,
        record: Record,
        store: RecordStore,
        admin_for: Callable[[], Admin],
        events: EventSink,
        annotate: Annotator,
        *,
        controller: Controller | None = None,
        drain_timeout_s: float = 60.0,
        switch_timeout_s: float = 60.0,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        metrics: PoolMetrics | None = None,
        record_looks_s: float = 0.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.record = record
        self.store = store
        self.admin_for = admin_for
        self.events = events
        self.annotate = annotate
        self.controller = controller
        self.drain_timeout_s = drain_timeout_s
        self.switch_timeout_s = switch_timeout_s
        """The router's own deadline for the engine's regroup (its ``switch_timeout_s``)."""
        self.retry_s = retry_s
        self.clock = clock
        self.metrics = metrics
        self.lock = asyncio.Lock()
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._annotated: dict[int, int] = {}
        self.failure: BaseException | None = None
        """The first error that stopped a transition task (the runner must be rebuilt)."""
        self.record_looks_s = record_looks_s
        """The longest a look that decides nothing waits to be recorded (0: every look is
        recorded). Each write is a PATCH of the CPPool's status that etcd keeps and every
        watcher of CPPools receives; a look comes every 2.5 s by default."""
        self.monotonic = monotonic
        self._recorded_at = monotonic()
        """When the record was last written (the record a runner starts from is as
        recorded)."""
        self.unrecorded = False
        """``record`` holds looks that are not written yet (:meth:`flush`)."""

    # ---- recording -------------------------------------------------------------------------

    async def _write(self, record: Record) -> None:
        """Persist ``record`` (seq bumped) and make it current. Call under the lock."""
        record = replace(
            record,
            seq=self.record.seq + 1,
            controller=None if self.controller is None else self.controller.state,
            memory=None if self.controller is None else self.controller.memory(),
        )
        await self.store.write(record)
        self.record = record
        self.unrecorded = False
        self._recorded_at = self.monotonic()

    def _look_due(self, record: Record) -> bool:
        """Whether a look that started nothing must be recorded now: its interval is up,
        or it changed more than the hop (the pool, by a refused operation), the
        planner's state or what the controller decided."""
        if self.monotonic() - self._recorded_at >= self.record_looks_s:
            return True
        if replace(record, hop=self.record.hop) != self.record:
            return True
        c, recorded = self.controller, self.record.memory
        return c is not None and (
            c.state != self.record.controller
            or recorded is None
            or c.memory().decisions() != recorded.decisions()
        )

    async def flush(self) -> None:
        """Write the looks not recorded yet (the pool's loop stops: an operator that takes
        over, or this one restarted, goes on from the last look)."""
        async with self.lock:
            if self.unrecorded:
                await self._write(self.record)

    async def checkpoint(self) -> None:
        """Record the current state (e.g. after the controller changed its streaks)."""
        async with self.lock:
            await self._write(self.record)

    async def record_rolling(self, rolling: Recorded) -> None:
        """Record the domain pods a rolling update is replacing (before acting on them)."""
        async with self.lock:
            if rolling != self.record.rolling:
                await self._write(replace(self.record, rolling=rolling))

    @property
    def busy(self) -> bool:
        return bool(self.record.pool.transitions)

    @property
    def running(self) -> int:
        return sum(1 for t in self._tasks.values() if not t.done())

    # ---- starting --------------------------------------------------------------------------

    async def decide(self, window: Window) -> Tick | None:
        """One hop of the controller: feed ``window``, tick, begin what it decides, record —
        all under the lock, so a recorded controller state never has an operation
        pending that the pool state does not hold."""
        if self.controller is None:
            raise RuntimeError("no controller: the composition is pinned or the controller is off")
        async with self.lock:
            pool = self.record.pool
            # On a thread: at 1,024 GPUs the what-if check replays for tens of ms, every
            # look, and the event loop serves every other pool meanwhile (the compiled
            # replay releases the GIL). The controller is only touched under the lock.
            tick, seconds = await asyncio.to_thread(
                _timed_feed, self.controller, window, pool.layout, bool(pool.transitions)
            )
            if self.metrics is not None and tick is not None:
                self.metrics.decided(
                    seconds, None if tick.whatif is None else tick.whatif.verdict, tick.kappa
                )
            ops = tick.ops if tick is not None else ()
            record = replace(self.record, hop=window.hop)
            if tick is not None and (tick.whatif is not None or tick.shadow):
                record = replace(record, last_check=_last_check(window.hop, tick))
            if tick is not None and tick.whatif is not None:
                check = tick.whatif
                best = check.best
                log.info(
                    "hop %d what-if %s: %s %.3f s (P90 %.3f s) over %d requests%s; "
                    "best candidate %s",
                    window.hop,
                    check.verdict,
                    check.current.composition,
                    check.current.mean_s,
                    check.current.p90_s,
                    check.current.requests,
                    "" if check.since_s is None else f" (the last {check.since_s:g} s: a change)",
                    "none" if best is None else f"{best.composition} {best.mean_s:.3f} s",
                )
            if tick is not None and tick.shadow:
                log.info(
                    "hop %d shadows: %s",
                    window.hop,
                    "; ".join(
                        f"{c.composition} {c.mean_gain:+.1%} mean, {c.p90_gain:+.1%} P90 "
                        f"over {c.span_s:.0f} s"
                        for c in tick.shadow
                    ),
                )
            if tick is not None and ops:
                await self.events.post(
                    "Normal",
                    "Split" if isinstance(ops[0], planner.Split) else "Merge",
                    f"utilization {tick.utilization:.2f} over the last window "
                    f"(demand {tick.observation.demand_s:.2f} s, {tick.observation.requests} "
                    f"requests): {len(ops)} operation(s) toward {tick.target or 'a new composition'}"
                    f" ({ops[0].reason})",
                )
            record, started = await self._begin(record, ops)
            if started or self._look_due(record):
                await self._write(record)
            else:
                self.record, self.unrecorded = record, True
        self._spawn(started)
        return tick

    async def pin(self, target: Composition, degrees: tuple[int, ...]) -> planner.Op | None:
        """Begin the next step toward a pinned composition, if one can start now."""
        async with self.lock:
            pool = self.record.pool
            op = ctl.next_pinned_op(pool.layout, target, degrees, pool.busy())
            if op is None:
                return None
            record, started = await self._begin(self.record, (op,))
            await self._write(record)
        self._spawn(started)
        return op

    async def manual(self, op: tr.Op) -> bool:
        """Begin an operation the planner did not ask for (the CPPool's
        ``vertumnus.io/split`` or ``vertumnus.io/merge`` annotation, or a replacement);
        False if the state machine refuses it (an Event says why)."""
        async with self.lock:
            record, started = await self._begin(self.record, (op,), by_hand=True)
            if not started:
                return False
            await self._write(record)
        self._spawn(started)
        return True

    async def replace(self, worker: int, failure: str) -> bool:
        """Begin swapping a failed worker for a new one of the same degree in the same
        place (a router reported it FAILED: ``failure`` says why); False if the state
        machine refuses (an Event says why)."""
        return await self.manual(tr.Replace(worker, f"worker failed: {failure}"))

    async def _begin(
        self, record: Record, ops: Sequence[tr.Op], by_hand: bool = False
    ) -> tuple[Record, list[tr.Action]]:
        started: list[tr.Action] = []
        pool = record.pool
        now = self.clock()
        for op in ops:
            try:
                pool, t, actions = tr.begin(pool, op)
            except tr.TransitionError as e:
                # The planner and the pool disagree (a hand-made change): start afresh.
                await self.events.post("Warning", "TransitionRefused", f"{op}: {e}")
                if self.controller is not None and not by_hand:
                    self.controller.state = planner.initial_state(record.pool.layout)
                continue
            record = replace(record, pool=pool).with_started(t.id, now)
            await self.events.post(
                "Normal",
                "Draining",
                f"transition {t.id}: {t.kind} of worker(s) {_ids(t.removed)} into "
                f"{_ids(t.added)} in domain {t.domain}: draining",
            )
            started.extend(actions)
        return replace(record, pool=pool), started

    def resume(self) -> list[tr.Action]:
        """Carry on every recorded transition from its recorded phase (after a restart)."""
        actions = [a for a in tr.resume(self.record.pool) if a.transition not in self._tasks]
        self._spawn(actions)
        return actions

    def _spawn(self, actions: Sequence[tr.Action]) -> None:
        for action in actions:
            task = asyncio.create_task(self._carry(action), name=f"transition-{action.transition}")
            self._tasks[action.transition] = task
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        for tid, t in list(self._tasks.items()):
            if t is task:
                del self._tasks[tid]
        if not task.cancelled() and task.exception() is not None and self.failure is None:
            self.failure = task.exception()

    async def wait(self) -> None:
        """Until no transition task runs (re-raises the first failure)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)
        if self.failure is not None:
            raise self.failure

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---- carrying --------------------------------------------------------------------------

    async def _carry(self, action: tr.Action) -> None:
        current: tr.Action | None = action
        while current is not None:
            if isinstance(current, tr.Drain):
                current = await self._drain(current)
            elif isinstance(current, tr.Switch):
                await self._switch(current)
                current = None
            else:  # a Commit is handled inside _switch
                current = None

    async def _drain(self, action: tr.Drain) -> tr.Action | None:
        results = await asyncio.gather(
            *(self._drain_one(action.transition, w) for w in action.workers)
        )
        switches = [a for r in results for a in r]
        return switches[0] if switches else None

    async def _drain_one(self, tid: int, worker: int) -> list[tr.Action]:
        while True:
            try:
                done = await self.admin_for().drain(worker, self.drain_timeout_s)
            except AdminError as e:
                if e.code == "NOT_FOUND":
                    raise
                done = False
                log.warning("drain of worker %d: %s; retrying", worker, e)
            if done:
                break
            await asyncio.sleep(self.retry_s)
        async with self.lock:
            pool, more = tr.drained(self.record.pool, tid, worker)
            record = replace(self.record, pool=pool)
            if not more:
                self.record = record  # a merge's first buddy: nothing to record yet
                return []
            switch = more[0]
            assert isinstance(switch, tr.Switch)
            record = record.with_drained(tid, self.clock())
            await self._write(record)
            await self.events.post(
                "Normal",
                "Switching",
                f"transition {tid}: drained; switching domain {switch.domain} to "
                f"{_ids(switch.grouping)} under epoch {switch.epoch}",
            )
            return more

    async def _drain_again(self, action: tr.Switch) -> None:
        """Drain the workers ``action`` removes at every router replica once more. A
        replica that restarted since their drain rebuilt its workers from the engines, so
        they serve there again, and it refuses the switch (FAILED_PRECONDITION) until they
        are drained; at the others a drain of a drained worker answers at once. The
        workers (two for a merge) are drained together: each waits for its running
        prefill."""
        admin = self.admin_for()

        async def drain(worker: int) -> None:
            try:
                await admin.drain(worker, self.drain_timeout_s)
            except AdminError as e:
                log.warning("drain of worker %d again: %s", worker, e)

        await asyncio.gather(*(drain(w) for w in action.removed))

    async def _switch(self, action: tr.Switch) -> None:
        t = self.record.pool.transition(action.transition)
        while True:
            try:
                await self.admin_for().switch(action, t.kind, self.switch_timeout_s)
                break
            except AdminError as e:
                if e.code in ("INVALID_ARGUMENT", "NOT_FOUND"):
                    raise
                log.warning("switch of transition %d: %s; retrying", action.transition, e)
                if e.code == "FAILED_PRECONDITION":
                    await self._drain_again(action)
                await asyncio.sleep(self.retry_s)
        if self._annotated.get(action.domain, 0) < action.epoch:
            await self.annotate(action.domain, action.grouping, action.epoch)
            self._annotated[action.domain] = action.epoch
        async with self.lock:
            pool, (commit,) = tr.switched(self.record.pool, action.transition)
            assert isinstance(commit, tr.Commit)
            record = replace(self.record, pool=pool)
            more: Sequence[planner.Op] = ()
            if self.controller is not None and commit.op in self.controller.state.pending:
                running = ctl.running_of(pool.layout, {})
                more = self.controller.committed(
                    commit.op, commit.new_ids, [s.worker for s in commit.removed], running
                )
            elif self.controller is not None and not self.controller.state.pending:
                # A hand-made operation: the planner starts over from the new layout (it
                # decided nothing while the transition was in flight).
                self.controller.state = planner.initial_state(pool.layout)
            now = self.clock()
            began = record.started_at(commit.transition)
            started = now if began is None else began
            drained_at = record.drained_time(commit.transition)
            drained = started if drained_at is None else drained_at
            last: dict[str, Any] = {
                "id": commit.transition,
                "kind": commit.kind,
                "removed": [s.worker for s in commit.removed],
                "added": commit.new_ids,
                "epoch": commit.epoch,
                "reason": commit.op.reason,
                "drainSeconds": round(drained - started, 4),
                "switchSeconds": round(now - drained, 4),
                "totalSeconds": round(now - started, 4),
                "composition": str(pool.layout.composition),
            }
            record = replace(record.forget(commit.transition), last_transition=last)
            record, started_actions = await self._begin(record, more)
            await self._write(record)
            if self.metrics is not None:
                self.metrics.committed(
                    commit.kind, last["drainSeconds"], last["switchSeconds"], last["totalSeconds"]
                )
            await self.events.post(
                "Normal",
                "Committed",
                f"transition {commit.transition}: {commit.kind} committed under epoch "
                f"{commit.epoch}; composition {pool.layout.composition} "
                f"(drain {last['drainSeconds']:.2f} s, switch {last['switchSeconds']:.2f} s)",
            )
        self._spawn(started_actions)
