"""Rolling updates of a pool's domain pods (``spec.updateStrategy.type: RollingUpdate``).

A domain pod's spec is fixed for its life (:mod:`vertumnus.operator.reconcile`). When
the CPPool's spec changes what the pods run — a new engine image, engine settings, the
model, scheduling — the pods that run the older spec are **outdated**, and the pool
replaces them one domain at a time, the way a StatefulSet rolls:

1. wait until every domain pod is ready and no split or merge is in flight;
2. **drain** the domain's workers at every router replica (each stops placing there
   and places its queued requests on the other domains; a running prefill finishes);
3. **delete** the pod; the reconciler creates it again with the current spec and the
   grouping in force (its annotations), as it recreates a lost one;
4. once every pod is ready again, **resume** the domain's workers at the routers (the
   routers see the engine's new incarnation and rebuild its part of the prefix index);
5. the next outdated domain.

No request is lost: queued ones move before the pod goes, running ones finish first.
The pool serves on the other domains meanwhile, and the controller takes no decision
until the update is over (its windows would read a pool short of a domain).

What is in flight is kept in memory (:class:`Rollout`). An operator restarted in
between starts the domain again if its pod is still outdated (the drain is idempotent),
and resumes any worker the routers report draining that no transition holds
(:func:`orphans`): what a rollout stopped by the restart left drained.

:func:`next_action` is the pure decision; ``Pool`` (:mod:`vertumnus.operator.pool`)
carries it out.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Delete", "Drain", "Resume", "Rollout", "Wait", "next_action", "orphans"]


@dataclass
class Rollout:
    """The domain pod a rolling update is replacing, if any."""

    domain: int | None = None
    workers: tuple[int, ...] = ()
    """Its workers when the update began: drained, to be resumed."""
    deleted: bool = False
    """Its outdated pod was deleted (the reconciler creates the new one)."""
    replaced: int = 0
    """Domain pods this operator has replaced so far (for the events)."""

    def begin(self, domain: int, workers: Sequence[int]) -> None:
        self.domain, self.workers, self.deleted = domain, tuple(workers), False

    def finish(self) -> None:
        self.domain, self.workers, self.deleted = None, (), False
        self.replaced += 1


@dataclass(frozen=True)
class Wait:
    """Nothing to do this step; ``why`` is what the update waits for."""

    why: str


@dataclass(frozen=True)
class Drain:
    """Drain ``workers`` at every router, then delete the domain's pod."""

    domain: int
    workers: tuple[int, ...]


@dataclass(frozen=True)
class Delete:
    """Delete the domain's pod again (its workers are drained already): the pod the
    update made runs an older spec than the current one (the spec changed again)."""

    domain: int


@dataclass(frozen=True)
class Resume:
    """The domain's new pod is ready: admit at ``workers`` again."""

    domain: int
    workers: tuple[int, ...]


Action = Wait | Drain | Delete | Resume


def next_action(
    rollout: Rollout,
    outdated: Sequence[int],
    workers_of: Mapping[int, Sequence[int]],
    all_ready: bool,
    busy: bool,
    routed: bool,
) -> Action | None:
    """What the update does next (None: there is nothing to update).

    ``outdated``: the domains whose pod runs an older spec; ``workers_of``: each
    domain's workers in the pool's layout; ``all_ready``: every domain pod is ready;
    ``busy``: a transition is in flight; ``routed``: a router address is known."""
    d = rollout.domain
    if d is None:
        if not outdated:
            return None
        if not routed:
            return Wait("no router address yet (its workers must be drained first)")
        if busy:
            return Wait("a split or merge in flight finishes first")
        if not all_ready:
            return Wait("every domain pod must be ready before the next one is replaced")
        first = min(outdated)
        return Drain(first, tuple(workers_of.get(first, ())))
    if not rollout.deleted:
        return Drain(d, rollout.workers)
    if d in outdated:
        return Delete(d)
    if not all_ready:
        return Wait(f"the new pod of domain {d} is starting")
    return Resume(d, rollout.workers)


def orphans(draining: Collection[int], in_transitions: Collection[int]) -> list[int]:
    """The workers a router reports draining that no transition holds: left drained by
    a rolling update that an operator restart cut short."""
    return sorted(set(draining) - set(in_transitions))
