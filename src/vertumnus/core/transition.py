"""A split, merge or replacement as a pure state machine: the epoch transition every shell executes (design.md section 5).

The planner (:mod:`vertumnus.core.planner`) says *what* to change ("split
worker 7"); this module says *how*, as steps that emit the actions a shell
performs, so that the simulator, the router and the operator carry out a
transition the same way:

``Draining``
    :func:`begin` takes the op's workers out of the candidate set: the shell
    stops admitting there, places their queued requests elsewhere (the
    routing core's ``withdraw`` + ``schedule``) and lets the running prefills
    finish under the old geometry (:class:`Drain`). The shell reports each
    drained worker with :func:`drained`.
``Switching``
    Once every participant is drained, the pool's epoch advances and the
    domain's new grouping is handed out (:class:`Switch`): the ranks activate
    the communication groups created in advance, keeping weights and KV. The
    shell reports the switch done with :func:`switched`.
``Committed``
    The new workers exist: the shell applies the reconciliation plan
    (:mod:`vertumnus.core.reconcile`), makes them schedulable and reports the
    commit to the planner (:class:`Commit`).

Every state is a plain value (:class:`PoolState`, :class:`Transition`), so a
shell can record it (the operator keeps it in the CPPool status) and, after
a restart, :func:`resume` returns the actions of the recorded phase again.
Every action is idempotent for the shell that executes it: draining a
drained worker, or switching ranks to the epoch and grouping they already
have, changes nothing. Worker ids for new workers are allocated here, once,
when the transition begins.

A :class:`Replace` is the third kind: a worker whose engine failed for good (an
SGLang server that exited) is swapped for a fresh worker of the same degree in the
same place, under a new id, through the same three phases. The planner never asks
for one (it is not a composition change); the operator does, when a router reports
the worker failed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from vertumnus.core.lattice import Layout, Slot, merge_slots, split_slot
from vertumnus.core.planner import Op as PlannerOp
from vertumnus.core.planner import Split

__all__ = [
    "SWITCH_TIMEOUT_S",
    "Action",
    "Commit",
    "Drain",
    "Phase",
    "Op",
    "PoolState",
    "Replace",
    "Switch",
    "Transition",
    "TransitionError",
    "begin",
    "drained",
    "kind_of",
    "initial_pool",
    "resume",
    "switched",
]


class TransitionError(ValueError):
    """A transition step that does not fit the recorded state (named in the message)."""


@dataclass(frozen=True)
class Replace:
    """Swap the failed ``worker`` for a new worker of the same degree in the same place."""

    worker: int
    reason: str = ""


Op = PlannerOp | Replace
"""What a transition carries out: the planner's split or merge, or a replacement."""


class Phase(StrEnum):
    DRAINING = "Draining"
    SWITCHING = "Switching"
    COMMITTED = "Committed"


@dataclass(frozen=True)
class Transition:
    """One split, merge or replacement in progress."""

    id: int
    """Sequence number of the transition in its pool, from 1."""
    op: Op
    """The planner's operation (handed back to ``planner.commit``)."""
    removed: tuple[Slot, ...]
    """The workers that leave: one for a split or a replacement, two buddies for a merge."""
    added: tuple[Slot, ...]
    """The workers it creates, ids allocated at :func:`begin`."""
    phase: Phase = Phase.DRAINING
    drained: frozenset[int] = frozenset()
    """Participants reported drained so far."""
    epoch: int = 0
    """The epoch the switch commits to (0 until the switch starts)."""

    @property
    def kind(self) -> str:
        return kind_of(self.op)

    @property
    def members(self) -> tuple[int, ...]:
        return tuple(s.worker for s in self.removed)

    @property
    def domain(self) -> int:
        return self.removed[0].domain


@dataclass(frozen=True)
class PoolState:
    """The pool's grouping, epoch and transitions in flight (the CPPool status)."""

    layout: Layout
    """Workers and where they sit, as of the last switch."""
    epoch: int = 1
    """The configuration epoch: 1 for the initial grouping, +1 per switch."""
    next_worker: int = 0
    """The id the next new worker gets."""
    next_transition: int = 1
    transitions: tuple[Transition, ...] = ()
    """In flight, in the order they began."""

    def transition(self, tid: int) -> Transition:
        for t in self.transitions:
            if t.id == tid:
                return t
        raise TransitionError(
            f"no transition {tid} is in flight (in flight: {[t.id for t in self.transitions]})"
        )

    def busy(self) -> frozenset[int]:
        """Workers taking part in a transition in flight."""
        return frozenset(w for t in self.transitions for w in t.members)


@dataclass(frozen=True, slots=True)
class Drain:
    """Stop admitting at ``workers``, place their queued requests elsewhere, and
    report each one with :func:`drained` once its running prefill is done."""

    transition: int
    workers: tuple[int, ...]


SWITCH_TIMEOUT_S = {"": 60.0, "torch": 60.0, "sglang": 900.0}
"""Seconds an engine of each kind gets to carry out a :class:`Switch` (its ``Epoch``):
the torch engine regroups its process groups in seconds; an SGLang engine restarts
the changed servers, which load the weights again from the node's disk or page
cache (minutes for a large model). "" is an engine of unknown kind."""


@dataclass(frozen=True, slots=True)
class Switch:
    """Regroup the ranks of ``domain`` to ``grouping`` (all of the domain's workers)
    under ``epoch``; report with :func:`switched`."""

    transition: int
    epoch: int
    domain: int
    grouping: tuple[Slot, ...]
    removed: tuple[int, ...]
    added: tuple[Slot, ...]


@dataclass(frozen=True, slots=True)
class Commit:
    """The new workers exist under ``epoch``: reconcile their KV metadata, make them
    schedulable, and tell the planner (``planner.commit(state, new_ids, op)``)."""

    transition: int
    epoch: int
    kind: str
    op: Op
    removed: tuple[Slot, ...]
    added: tuple[Slot, ...]

    @property
    def new_ids(self) -> list[int]:
        return [s.worker for s in self.added]


Action = Drain | Switch | Commit


def kind_of(op: Op) -> str:
    """``split``, ``merge`` or ``replace``: the kind a Switch names to the router."""
    if isinstance(op, Replace):
        return "replace"
    return "split" if isinstance(op, Split) else "merge"


def initial_pool(layout: Layout, epoch: int = 1) -> PoolState:
    """The state of a pool that starts with ``layout`` (new ids continue after its largest)."""
    next_id = max((s.worker for s in layout.slots), default=-1) + 1
    return PoolState(layout=layout, epoch=epoch, next_worker=next_id)


def begin(pool: PoolState, op: Op) -> tuple[PoolState, Transition, list[Action]]:
    """Start ``op``: its workers drain. Raises :class:`TransitionError` if a worker is
    not in the pool, already in a transition, or the op does not fit the topology."""
    members = (op.worker,) if isinstance(op, Split | Replace) else op.workers
    busy = pool.busy()
    slots = []
    for w in members:
        try:
            slots.append(pool.layout.slot(w))
        except KeyError:
            raise TransitionError(f"{kind_of(op)}: worker {w} is not in the pool") from None
        if w in busy:
            raise TransitionError(f"worker {w} is already being reconfigured")
    nid = pool.next_worker
    try:
        if isinstance(op, Replace):
            added: tuple[Slot, ...] = (replace(slots[0], worker=nid),)
        elif isinstance(op, Split):
            added = split_slot(slots[0], (nid, nid + 1))
        else:
            added = (merge_slots(slots[0], slots[1], nid),)
    except ValueError as e:
        raise TransitionError(str(e)) from None
    t = Transition(pool.next_transition, op, tuple(slots), added)
    pool = replace(
        pool,
        next_worker=nid + len(added),
        next_transition=pool.next_transition + 1,
        transitions=(*pool.transitions, t),
    )
    return pool, t, [Drain(t.id, t.members)]


def drained(pool: PoolState, tid: int, worker: int) -> tuple[PoolState, list[Action]]:
    """``worker`` of transition ``tid`` has no work left. Once all are, the switch starts."""
    t = pool.transition(tid)
    if worker not in t.members:
        raise TransitionError(
            f"worker {worker} is not part of transition {tid} ({t.kind} of {t.members})"
        )
    if t.phase is not Phase.DRAINING:
        return pool, []  # a repeated report (e.g. after a restart): nothing left to do
    t = replace(t, drained=t.drained | {worker})
    if t.drained != frozenset(t.members):
        return _put(pool, t), []
    return _switch(pool, t)


def _switch(pool: PoolState, t: Transition) -> tuple[PoolState, list[Action]]:
    epoch = pool.epoch + 1
    layout = _applied(pool.layout, t)
    t = replace(t, phase=Phase.SWITCHING, epoch=epoch)
    pool = replace(_put(pool, t), layout=layout, epoch=epoch)
    return pool, [_switch_action(pool, t)]


def _switch_action(pool: PoolState, t: Transition) -> Switch:
    return Switch(t.id, t.epoch, t.domain, pool.layout.domain(t.domain), t.members, t.added)


def switched(pool: PoolState, tid: int) -> tuple[PoolState, list[Action]]:
    """Every rank of transition ``tid`` adopted its epoch: commit."""
    t = pool.transition(tid)
    if t.phase is not Phase.SWITCHING:
        raise TransitionError(f"transition {tid} is {t.phase.value}, not Switching")
    rest = tuple(x for x in pool.transitions if x.id != tid)
    commit = Commit(t.id, t.epoch, t.kind, t.op, t.removed, t.added)
    return replace(pool, transitions=rest), [commit]


def resume(pool: PoolState) -> list[Action]:
    """The actions that carry every transition in flight on from its recorded phase
    (after a restart of the shell that was executing them)."""
    out: list[Action] = []
    for t in pool.transitions:
        if t.phase is Phase.DRAINING:
            out.append(Drain(t.id, t.members))
        else:
            out.append(_switch_action(pool, t))
    return out


def _applied(layout: Layout, t: Transition) -> Layout:
    gone = set(t.members)
    slots = [s for s in layout.slots if s.worker not in gone] + list(t.added)
    slots.sort(key=lambda s: (s.domain, s.offset))
    return Layout(tuple(slots), layout.domain_size)


def _put(pool: PoolState, t: Transition) -> PoolState:
    return replace(pool, transitions=tuple(t if x.id == t.id else x for x in pool.transitions))
