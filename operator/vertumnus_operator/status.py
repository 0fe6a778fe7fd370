"""The CPPool status: what users read (``kubectl get cpp``) and what the operator resumes from.

:func:`build_status` renders the user-facing part from the :class:`~vertumnus.operator.
record.Record` and the latest :class:`Observation` of the cluster: the workers (id,
degree, domain, offset, ranks, state), the compact composition (``4xCP4+3xCP8``), the
epoch, the transitions in flight, ``readyGPUs``, the phase of the printer column, and the
conditions ``Ready``, ``Progressing`` (a transition, pods being placed, or a rolling
update of the domain pods: phase ``Updating``), ``Degraded``, ``GangScheduled``. The
record itself goes to ``status.state``.

:class:`StatusStore` writes it through the ``/status`` subresource as a JSON merge patch
carrying the last resourceVersion it saw. On a conflict (the object changed: kopf's
annotations, a spec edit) it re-reads the object and retries if ``status.state.seq`` is
still the one it wrote last; if another writer moved it, it raises
:class:`~vertumnus.operator.record.LostRecord` instead of overwriting (two operators
never both advance the pool).
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vertumnus.core import transition as tr
from vertumnus.operator.crd import GROUP, PLURAL, VERSION
from vertumnus.operator.gang import GangStatus
from vertumnus.operator.kube import Conflict, KubeClient, object_path
from vertumnus.operator.record import LostRecord, Record, encode_record

__all__ = [
    "PHASES",
    "Observation",
    "Problem",
    "StatusStore",
    "build_status",
    "condition",
    "iso",
    "ran_before",
]

PHASES = ("Pending", "Unschedulable", "Ready", "Updating", "Degraded", "Draining", "Switching")
"""Every ``status.phase`` :func:`build_status` writes (the printer column's values)."""


def iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Problem:
    """Something that keeps the pool from its spec: a condition's reason and message."""

    condition: str
    """Which condition it sets False (Ready, GangScheduled) or True (Degraded, Progressing)."""
    reason: str
    message: str


@dataclass
class Observation:
    """What the operator last saw of the pool's objects."""

    domains: int = 0
    pods: int = 0
    bound: int = 0
    ready_domains: set[int] = field(default_factory=set)
    """The domains whose pod is ready."""
    gpus_per_domain: int = 8
    gang: GangStatus | None = None
    unschedulable: str = ""
    """Why a pod is not bound, as the scheduler says it (first one found)."""
    problems: list[Problem] = field(default_factory=list)
    generation: int = 0
    updating: tuple[int, ...] = ()
    """The workers whose domain pod a rolling update is replacing (state ``Updating``)."""
    outdated: int = 0
    """Domain pods that run an older spec (``updatedDomains`` = domains - outdated)."""

    @property
    def ready(self) -> int:
        """Domain pods ready."""
        return len(self.ready_domains)

    @property
    def all_ready(self) -> bool:
        return self.domains > 0 and self.ready == self.domains


def condition(
    type_: str,
    ok: bool,
    reason: str,
    message: str,
    generation: int,
    previous: Sequence[Mapping[str, Any]],
    now: float,
) -> dict[str, Any]:
    """A condition, keeping ``lastTransitionTime`` while its status does not change."""
    status = "True" if ok else "False"
    since = iso(now)
    for c in previous:
        if c.get("type") == type_ and c.get("status") == status and c.get("lastTransitionTime"):
            since = c["lastTransitionTime"]
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message[:1024],
        "lastTransitionTime": since,
        "observedGeneration": generation,
    }


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _workers(pool: tr.PoolState, updating: Sequence[int]) -> list[dict[str, Any]]:
    state: dict[int, str] = dict.fromkeys(updating, "Updating")
    for t in pool.transitions:
        for w in t.members:
            state[w] = "Draining"
        if t.phase is tr.Phase.SWITCHING:
            for s in t.added:
                state[s.worker] = "Switching"
    return [
        {
            "id": s.worker,
            "degree": s.degree,
            "domain": s.domain,
            "offset": s.offset,
            "ranks": list(s.ranks),
            "state": state.get(s.worker, "Serving"),
        }
        for s in pool.layout.slots
    ]


def build_status(
    record: Record, obs: Observation, previous_conditions: Sequence[Mapping[str, Any]], now: float
) -> dict[str, Any]:
    pool = record.pool
    gen = obs.generation
    prev = previous_conditions
    by_kind: dict[str, list[Problem]] = {}
    for p in obs.problems:
        by_kind.setdefault(p.condition, []).append(p)

    # GangScheduled
    gang_problem = by_kind.get("GangScheduled")
    if gang_problem:
        gang_ok, gang_reason, gang_msg = False, gang_problem[0].reason, gang_problem[0].message
    elif obs.gang is None:
        gang_ok, gang_reason, gang_msg = False, "Pending", "the gang object is not observed yet"
    elif obs.gang.scheduled is None:
        gang_ok, gang_reason, gang_msg = False, obs.gang.reason, obs.gang.message
    else:
        gang_ok, gang_reason, gang_msg = obs.gang.scheduled, obs.gang.reason, obs.gang.message
    if gang_ok is False and obs.gang is not None and obs.gang.reason == "GangDisabled":
        gang_reason, gang_msg = obs.gang.reason, obs.gang.message

    # Ready
    ready_problem = by_kind.get("Ready")
    if ready_problem:
        ready = condition(
            "Ready", False, ready_problem[0].reason, ready_problem[0].message, gen, prev, now
        )
    elif gang_problem:
        ready = condition("Ready", False, gang_reason, gang_msg, gen, prev, now)
    elif obs.all_ready:
        ready = condition(
            "Ready",
            True,
            "AllDomainsReady",
            f"{obs.ready}/{obs.domains} domain pods bound and ready",
            gen,
            prev,
            now,
        )
    elif obs.bound < obs.domains and obs.unschedulable:
        ready = condition(
            "Ready",
            False,
            "Unschedulable",
            f"{obs.bound}/{obs.domains} domain pods bound: {obs.unschedulable}",
            gen,
            prev,
            now,
        )
    else:
        ready = condition(
            "Ready",
            False,
            "PodsPending",
            f"{obs.ready}/{obs.domains} domain pods ready ({obs.bound} bound)",
            gen,
            prev,
            now,
        )

    # Progressing
    if pool.transitions:
        t = pool.transitions[0]
        progressing = condition(
            "Progressing",
            True,
            t.phase.value,
            f"{len(pool.transitions)} transition(s) in flight; transition {t.id} ({t.kind} of "
            f"{list(t.members)}) is {t.phase.value}",
            gen,
            prev,
            now,
        )
    elif by_kind.get("Progressing"):
        # A rolling update of the domain pods (vertumnus.operator.rollout).
        p = by_kind["Progressing"][0]
        progressing = condition("Progressing", True, p.reason, p.message, gen, prev, now)
    elif not obs.all_ready and not ready_problem and not gang_problem:
        progressing = condition("Progressing", True, "Placing", ready["message"], gen, prev, now)
    else:
        progressing = condition(
            "Progressing", False, "Stable", "no transition in flight", gen, prev, now
        )

    # Degraded
    degraded_problems = by_kind.get("Degraded", [])
    if degraded_problems:
        degraded = condition(
            "Degraded",
            True,
            degraded_problems[0].reason,
            "; ".join(p.message for p in degraded_problems),
            gen,
            prev,
            now,
        )
    else:
        degraded = condition(
            "Degraded", False, "AsSpecified", "the pool runs as specified", gen, prev, now
        )
    gang = condition("GangScheduled", gang_ok, gang_reason or "Unknown", gang_msg, gen, prev, now)

    if pool.transitions:
        phase = pool.transitions[0].phase.value
    elif (ready_problem and ready_problem[0].reason == "InvalidSpec") or any(
        p.reason == "DomainLost" for p in degraded_problems
    ):
        phase = "Degraded"
    elif by_kind.get("Progressing"):
        phase = "Updating"
    elif obs.all_ready:
        phase = "Degraded" if degraded_problems else "Ready"
    elif (
        gang_problem
        or ready["reason"] == "Unschedulable"
        or gang_ok is False
        and gang_reason == "Unschedulable"
    ):
        phase = "Unschedulable"
    else:
        phase = "Pending"

    return {
        "observedGeneration": gen,
        "phase": phase,
        "composition": str(pool.layout.composition),
        "epoch": pool.epoch,
        "readyGPUs": obs.ready * obs.gpus_per_domain,
        "domains": obs.domains,
        "updatedDomains": max(0, obs.domains - obs.outdated),
        "workers": _workers(pool, obs.updating),
        "transitions": [
            {
                "id": t.id,
                "kind": t.kind,
                "phase": t.phase.value,
                "removed": list(t.members),
                "added": [s.worker for s in t.added],
                "epoch": t.epoch,
                "started": iso(_or(record.started_at(t.id), now)),
                "reason": t.op.reason,
            }
            for t in pool.transitions
        ],
        "lastTransition": record.last_transition,
        "lastCheck": record.last_check,
        "conditions": [ready, progressing, degraded, gang],
    }


def ran_before(status: Mapping[str, Any], record: Record) -> bool:
    """Whether the pool had every domain pod ready once, judged from the status an earlier
    operator (or this one before a pause) wrote: a domain pod missing now is then a loss
    (``Degraded``/``DomainLost``), not a pool still being placed.

    Evidence: the ``Ready`` condition is True, a loss is already reported, or the record
    holds what only a pool that ran makes (a transition or a rolling update, in flight or
    committed).
    """
    conds = {c.get("type"): c for c in status.get("conditions") or ()}
    return (
        (conds.get("Ready") or {}).get("status") == "True"
        or (conds.get("Degraded") or {}).get("reason") == "DomainLost"
        or bool(record.pool.transitions or record.rolling or record.last_transition)
    )


class StatusStore:
    """Writes the status (view + record) with a resourceVersion precondition."""

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        name: str,
        view: Callable[[Record], dict[str, Any]],
        resource_version: str,
        written: Callable[[int], None] | None = None,
    ) -> None:
        self.kube = kube
        self.written = written
        """Told the size of the CPPool (JSON bytes) each write returns (the pool's gauge)."""
        self.path = object_path(f"{GROUP}/{VERSION}", PLURAL, namespace, name)
        self.view = view
        self.resource_version = resource_version
        self.last_status: dict[str, Any] = {}
        self.latest: dict[str, Any] | None = None
        """The CPPool the last write returned (spec and metadata as of that write)."""
        self.latest_at = 0.0
        """When that write was sent (time.monotonic()): the object holds every change the
        API server had made before then."""

    async def write(self, record: Record) -> None:
        status = {**self.view(record), "state": encode_record(record)}
        for _ in range(20):
            body = {"metadata": {"resourceVersion": self.resource_version}, "status": status}
            sent = time.monotonic()
            try:
                obj = await self.kube.merge_patch(self.path + "/status", body)
            except Conflict:
                obj = await self.kube.get(self.path)
                theirs = ((obj.get("status") or {}).get("state") or {}).get("seq", 0)
                if theirs != record.seq - 1:
                    raise LostRecord(
                        f"status.state.seq is {theirs}, this operator last wrote {record.seq - 1}: "
                        "another operator writes this pool"
                    ) from None
                self.resource_version = obj["metadata"]["resourceVersion"]
                continue
            self.resource_version = obj["metadata"]["resourceVersion"]
            self.last_status = status
            self.latest, self.latest_at = obj, sent
            if self.written is not None:
                self.written(len(json.dumps(obj, separators=(",", ":"))))
            return
        raise LostRecord("the CPPool kept changing under 20 status writes in a row")
