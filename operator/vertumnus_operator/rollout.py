"""Rolling updates of a pool's domain pods (``spec.updateStrategy.type: RollingUpdate``).

A domain pod's spec is fixed for its life (:mod:`vertumnus.operator.reconcile`). When
the CPPool's spec changes what the pods run — a new engine image, engine settings, the
model, scheduling — the pods that run the older spec are **outdated**, and the pool
replaces them, at most ``spec.updateStrategy.maxUnavailable`` domains at a time (1 by
default), the way a StatefulSet rolls:

1. a domain starts while fewer are being replaced, no split or merge is in flight, and
   every other domain pod is ready (the lowest outdated domain first);
2. **drain** its workers at every router replica (each stops placing there and places
   its queued requests on the other domains; a running prefill finishes);
3. **delete** its pod; the reconciler creates it again with the current spec and the
   grouping in force (its annotations), as it recreates a lost one;
4. once the new pod is ready, **resume** the domain's workers at the routers (the
   routers see the engine's new incarnation and rebuild its part of the prefix index).

No request is lost: queued ones move before the pod goes, running ones finish first.
The pool serves on the other domains meanwhile, and the controller takes no decision
until the update is over (its windows would read a pool short of a domain).

What is in flight (:class:`Rollout`) is recorded in ``status.state.rolling`` before it
is acted on: a domain before its first drain, its deletion before the pod is deleted, its
end after its workers are resumed. An operator restarted in between carries on from the
record (:meth:`Rollout.restore`): a domain whose new pod is still starting stays
``Updating``, not lost; one whose pod is still outdated is drained (idempotent) and
deleted again; one that was resumed already is resumed again (idempotent). Once per
operator it also resumes any worker the routers report draining that neither a
transition nor the update holds (:func:`orphans`): one left drained by an operator
older than the record, or drained by hand.

:func:`next_actions` is the pure decision; ``PoolRuntime`` (:mod:`vertumnus.operator.pool`)
carries it out.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "Delete", "Drain", "Recorded", "Resume", "Rollout", "Wait", "next_actions", "orphans",
]  # fmt: skip

Recorded = tuple[tuple[int, tuple[int, ...], bool], ...]
"""What ``status.state.rolling`` keeps: (domain, its workers, its pod deleted) by domain."""


@dataclass
class Replacing:
    """One domain pod being replaced."""

    workers: tuple[int, ...]
    """Its workers when it began: drained, to be resumed."""
    began: float = 0.0
    """When it began, on the caller's clock (for the update's duration)."""
    deleted: bool = False
    """Its outdated pod was deleted (the reconciler creates the new one)."""


@dataclass
class Rollout:
    """The domain pods a rolling update is replacing, by domain."""

    domains: dict[int, Replacing] = field(default_factory=dict)
    replaced: int = 0
    """Domain pods this operator has replaced so far (for the events)."""

    @property
    def workers(self) -> tuple[int, ...]:
        """Every worker of the domains being replaced."""
        return tuple(w for d in sorted(self.domains) for w in self.domains[d].workers)

    def begin(self, domain: int, workers: Sequence[int], now: float = 0.0) -> None:
        self.domains[domain] = Replacing(tuple(workers), now)

    def recorded(self) -> Recorded:
        return tuple((d, r.workers, r.deleted) for d, r in sorted(self.domains.items()))

    def restore(self, recorded: Recorded, now: float) -> None:
        """The domains of ``recorded`` being replaced (an operator restarted mid-update,
        or reloading after a failed step); one not known here counts as begun at ``now``."""
        began = {d: r.began for d, r in self.domains.items()}
        self.domains = {
            d: Replacing(tuple(ws), began.get(d, now), deleted) for d, ws, deleted in recorded
        }

    def finish(self, domain: int) -> None:
        del self.domains[domain]
        self.replaced += 1


@dataclass(frozen=True)
class Wait:
    """Nothing to do this step; ``why`` is what the update waits for."""

    why: str


@dataclass(frozen=True)
class Drain:
    """Drain ``workers`` at every router, then delete the domain's pod (the first
    time: the domain's replacement begins)."""

    domain: int
    workers: tuple[int, ...]


@dataclass(frozen=True)
class Delete:
    """Delete the domain's pod again (its workers are drained already): the pod the
    update made runs an older spec than the current one (the spec changed again)."""

    domain: int


@dataclass(frozen=True)
class Resume:
    """The domain's new pod is ready (or its old pod is no longer outdated): admit at
    ``workers`` again."""

    domain: int
    workers: tuple[int, ...]


Action = Wait | Drain | Delete | Resume


def next_actions(
    rollout: Rollout,
    outdated: Sequence[int],
    workers_of: Mapping[int, Sequence[int]],
    ready: Collection[int],
    domains: int,
    max_unavailable: int,
    busy: bool,
    routed: bool,
    partition: int = 0,
) -> list[Action]:
    """What the update does this step (empty: there is nothing to update).

    ``outdated``: the domains whose pod runs an older spec; ``workers_of``: each
    domain's workers in the pool's layout; ``ready``: the domains whose pod is ready,
    of ``domains``; ``max_unavailable``: domains replaced at once, at most; ``busy``: a
    transition is in flight; ``routed``: a router address is known; ``partition``: the
    domains below it keep their older spec (a domain below it still draining when it
    is raised is resumed, as when the spec reverts)."""
    outdated = [d for d in outdated if d >= partition]
    out: list[Action] = []
    for d, r in sorted(rollout.domains.items()):
        if not r.deleted:
            # Its pod no longer outdated before it went (the spec reverted, or the update
            # called off: OnDelete): the update of this domain ends where it is.
            out.append(Drain(d, r.workers) if d in outdated else Resume(d, r.workers))
        elif d in outdated:
            out.append(Delete(d))
        elif d in ready:
            out.append(Resume(d, r.workers))
    waiting = sorted(set(outdated) - set(rollout.domains))
    if not waiting:
        if rollout.domains and not out:
            return [Wait(f"the new pod of domain(s) {sorted(rollout.domains)} is starting")]
        return out
    others_ready = all(d in ready for d in range(domains) if d not in rollout.domains)
    why = (
        "no router address yet (the workers must be drained first)"
        if not routed
        else "a split or merge in flight finishes first"
        if busy
        else "every other domain pod must be ready first"
        if not others_ready
        else ""
    )
    if not why:
        free = max_unavailable - len(rollout.domains)
        out += [Drain(d, tuple(workers_of.get(d, ()))) for d in waiting[: max(0, free)]]
    if not out:
        out.append(Wait(why or f"{len(rollout.domains)} domain(s) being replaced already"))
    return out


def orphans(draining: Collection[int], in_transitions: Collection[int]) -> list[int]:
    """The workers a router reports draining that no transition holds: left drained by
    a rolling update that an operator restart cut short."""
    return sorted(set(draining) - set(in_transitions))
