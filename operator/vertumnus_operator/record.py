"""What the operator must not forget: the record it writes before it acts.

A :class:`Record` is the pool state of the transition state machine, the planner's state,
the controller's own memory (its flaps, streaks and a move's goal), the last hop the
controller took, when each transition began, and the domain pods a rolling update is
replacing. It lives in
``status.state`` of the CPPool (:class:`vertumnus.operator.status.StatusStore` writes it,
with a resourceVersion precondition) and is written **before** the operator acts on it:
the Drain calls of a transition only go out once the transition is recorded in Draining,
the Switch only once it is recorded in Switching (with its epoch), the next decision
only once the commit is recorded. An operator that dies anywhere restarts from the last
record and :func:`vertumnus.core.transition.resume` re-issues the recorded phase's
actions (idempotent at the router), so every transition commits exactly once.

``seq`` counts the writes; a writer that finds a different ``seq`` than the one it last
wrote knows that another operator has taken over, and stops (:class:`LostRecord`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from vertumnus.core import planner
from vertumnus.core import transition as tr
from vertumnus.core.memory import Memory
from vertumnus.operator import serialize
from vertumnus.operator.rollout import Recorded

__all__ = ["LostRecord", "MemoryStore", "Record", "RecordStore", "decode_record", "encode_record"]


class LostRecord(RuntimeError):
    """The recorded state changed under us: another operator writes it now."""


@dataclass(frozen=True)
class Record:
    pool: tr.PoolState
    controller: planner.ControllerState | None = None
    memory: Memory | None = None
    """The controller's memory besides ``controller`` (None: no controller, or a record
    written before the operator kept it), so that a restarted operator's controller
    stays damped, keeps its streaks and finishes a move toward the same goal."""
    hop: int = 0
    """The last hop number the controller read (``TakeWindow(hop)``)."""
    seq: int = 0
    started: tuple[tuple[int, float], ...] = ()
    """(transition id, wall-clock start) of the transitions in flight."""
    drained_at: tuple[tuple[int, float], ...] = ()
    """(transition id, wall-clock time all its workers were drained)."""
    rolling: Recorded = ()
    """The domain pods a rolling update is replacing: (domain, its workers, its pod
    deleted) (:mod:`vertumnus.operator.rollout`)."""
    last_transition: dict[str, Any] | None = field(default=None, compare=False)
    """The last committed transition, for the status (and the benchmark)."""
    last_check: dict[str, Any] | None = field(default=None, compare=False)
    """The controller's last what-if check (hop, verdict, estimates), for the status."""

    def started_at(self, tid: int) -> float | None:
        return dict(self.started).get(tid)

    def drained_time(self, tid: int) -> float | None:
        return dict(self.drained_at).get(tid)

    def with_started(self, tid: int, when: float) -> Record:
        return replace(self, started=(*self.started, (tid, when)))

    def with_drained(self, tid: int, when: float) -> Record:
        return replace(self, drained_at=(*[x for x in self.drained_at if x[0] != tid], (tid, when)))

    def forget(self, tid: int) -> Record:
        return replace(
            self,
            started=tuple(x for x in self.started if x[0] != tid),
            drained_at=tuple(x for x in self.drained_at if x[0] != tid),
        )


def encode_record(r: Record) -> dict[str, Any]:
    return {
        "pool": serialize.encode_pool(r.pool),
        "controller": None if r.controller is None else serialize.encode_controller(r.controller),
        "memory": None if r.memory is None else serialize.encode_memory(r.memory),
        "hop": r.hop,
        "seq": r.seq,
        # Lists, not maps keyed by transition id: the status is written as a JSON merge
        # patch, which keeps every key it does not name, so a map would keep the ids of
        # every transition ever made and grow the CPPool toward etcd's size limit.
        "started": [[t, when] for t, when in r.started],
        "drainedAt": [[t, when] for t, when in r.drained_at],
        "rolling": [
            {"domain": d, "workers": list(workers), "deleted": deleted}
            for d, workers, deleted in r.rolling
        ],
    }


def _times(raw: Any, in_flight: set[int]) -> tuple[tuple[int, float], ...]:
    """(transition id, time) pairs of the transitions in flight, from a list of pairs or
    from the map a record written before 2026-12-05 holds (with the ids of transitions
    long over: dropped here, and gone from the status at the next write)."""
    pairs = raw.items() if isinstance(raw, dict) else (raw or ())
    return tuple((int(t), float(w)) for t, w in pairs if int(t) in in_flight)


def decode_record(raw: dict[str, Any], last_transition: dict[str, Any] | None = None) -> Record:
    ctrl = raw.get("controller")
    memory = raw.get("memory")
    pool = serialize.decode_pool(raw["pool"])
    in_flight = {t.id for t in pool.transitions}
    return Record(
        pool=pool,
        controller=None if ctrl is None else serialize.decode_controller(ctrl),
        memory=None if memory is None else serialize.decode_memory(memory),
        hop=int(raw.get("hop", 0)),
        seq=int(raw.get("seq", 0)),
        started=_times(raw.get("started"), in_flight),
        drained_at=_times(raw.get("drainedAt"), in_flight),
        rolling=_rolling(raw.get("rolling")),
        last_transition=last_transition,
    )


def _rolling(raw: Any) -> Recorded:
    where = "status.state.rolling"
    if raw is None:
        return ()  # a record written before rolling updates were recorded
    if not isinstance(raw, list):
        raise serialize.StateError(f"{where}: expected a list, got {raw!r}")
    out = []
    for i, r in enumerate(raw):
        try:
            out.append((int(r["domain"]), tuple(int(w) for w in r["workers"]), bool(r["deleted"])))
        except (KeyError, TypeError, ValueError):
            raise serialize.StateError(
                f"{where}[{i}]: expected {{domain, workers, deleted}}, got {r!r}"
            ) from None
    return tuple(out)


class RecordStore(Protocol):
    async def write(self, record: Record) -> None:
        """Persist ``record`` (its ``seq`` already bumped) or raise; :class:`LostRecord` if
        another writer got there first."""
        ...


class MemoryStore:
    """Records kept in a list (unit tests): ``records[-1]`` is the durable state."""

    def __init__(self, first: Record | None = None) -> None:
        self.records: list[Record] = [] if first is None else [first]
        self.fail_next: BaseException | None = None

    async def write(self, record: Record) -> None:
        if self.fail_next is not None:
            err, self.fail_next = self.fail_next, None
            raise err
        if self.records and record.seq != self.records[-1].seq + 1:
            raise LostRecord(f"seq {record.seq} does not follow {self.records[-1].seq}")
        self.records.append(record)

    @property
    def last(self) -> Record:
        return self.records[-1]
