"""What the operator must not forget: the record it writes before it acts.

A :class:`Record` is the pool state of the transition state machine, the planner's state,
the controller's own memory (its flaps, streaks and a move's goal), the last hop the
controller took, and when each transition began. It lives in
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
        "started": {str(t): when for t, when in r.started},
        "drainedAt": {str(t): when for t, when in r.drained_at},
    }


def decode_record(raw: dict[str, Any], last_transition: dict[str, Any] | None = None) -> Record:
    ctrl = raw.get("controller")
    memory = raw.get("memory")
    return Record(
        pool=serialize.decode_pool(raw["pool"]),
        controller=None if ctrl is None else serialize.decode_controller(ctrl),
        memory=None if memory is None else serialize.decode_memory(memory),
        hop=int(raw.get("hop", 0)),
        seq=int(raw.get("seq", 0)),
        started=tuple((int(t), float(w)) for t, w in (raw.get("started") or {}).items()),
        drained_at=tuple((int(t), float(w)) for t, w in (raw.get("drainedAt") or {}).items()),
        last_transition=last_transition,
    )


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
