"""The kopf handlers: a daemon per CPPool, a finalizer, the operator's settings.

Registered into a registry the caller owns (:func:`register`), not kopf's global one:
``python -m vertumnus.operator run`` builds its own. ``kopf run -m
vertumnus.operator.kopf_entry`` works too: that module registers them into kopf's default
registry on import, which is what ``kopf run`` reads.

- ``@kopf.daemon`` per CPPool: :class:`vertumnus.operator.pool.PoolRuntime` — reconcile,
  status, the controller's timer, transitions. kopf stops it when the CPPool is deleted
  and when this operator pauses for a peer (kopf peering: of the operators sharing a
  peering object only the one with the highest priority runs; same priorities all
  pause), so two replicas never both act.
- ``@kopf.on.delete``: the finalizer's work — delete what the pool made (owner references
  would let the garbage collector do it too, later; this makes it prompt and explicit).
- The operator's metrics (:class:`~vertumnus.operator.metrics.OperatorMetrics`) come in
  the operator-level memo (``kopf.run(memo=kopf.Memo(metrics=...))``), which kopf copies
  into every object's memo; without one, no pool exports series.
- The operator's key and CA (:mod:`.adminkeys`), from ``kopf.run(memo=...)`` or, under
  ``kopf run``, from the environment: each pool's Admin token and certificate come from them.
- ``@kopf.on.startup``: kopf's own bookkeeping goes to ``operator.vertumnus.io/*``
  annotations, its finalizer is ``vertumnus.io/finalizer``, and only its warnings become
  Events (the operator posts its own story, :mod:`vertumnus.operator.events`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import kopf

from vertumnus.operator import adminkeys, crdcheck, envnames
from vertumnus.operator import networkpolicy as netpol
from vertumnus.operator.crd import GROUP, PLURAL, VERSION
from vertumnus.operator.kube import KubeClient, connection_info
from vertumnus.operator.pool import PoolRuntime, record_looks_every
from vertumnus.operator.reconcile import Reconciler
from vertumnus.operator.resources import Owner

__all__ = ["FINALIZER", "configure", "register"]

FINALIZER = "vertumnus.io/finalizer"
ANNOTATION_PREFIX = "operator.vertumnus.io"


WAKE = "wake"
"""The id of the handler that wakes a pool's loop at every event of its CPPool."""


class _QuietWake(logging.Filter):
    """Drops kopf's ``Handler 'wake' succeeded.``: one line per event of every CPPool, the
    pool's own status writes included (one per look, 0.4/s per idle pool), that says
    nothing. The wake handler cannot fail (it sets an event)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != f"Handler {WAKE!r} succeeded."


_QUIET_WAKE = _QuietWake()


def configure(settings: kopf.OperatorSettings, peering_lifetime: int | None = None) -> None:
    logging.getLogger("kopf.objects").addFilter(_QUIET_WAKE)  # once: the same filter object
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    # A pool's loop, stopped, closes its watches and router channels: more than the few
    # zero-time event-loop cycles kopf waits by default, well under this.
    settings.background.instant_exit_timeout = 0.25
    if peering_lifetime is not None:
        settings.peering.lifetime = peering_lifetime


def _wake_event(memo: Any) -> asyncio.Event:
    """The per-object event that wakes a pool's loop (kopf's memo is per object)."""
    event = memo.get("wake")
    if event is None:
        event = memo["wake"] = asyncio.Event()
    return event


log = logging.getLogger(__name__)


async def _keep_checking_crd(
    kube: KubeClient, metrics: Any, every_s: float = crdcheck.CHECK_EVERY_S
) -> None:
    """Compare the installed CPPool CRD with this operator's now and every
    :data:`~vertumnus.operator.crdcheck.CHECK_EVERY_S`; say so when that changes."""
    said: str | None = ""
    while True:
        try:
            problem = await crdcheck.check(kube)
        except Exception as e:  # the API server away: the next round tries again
            log.warning("could not compare the installed CPPool CRD with this operator's: %s", e)
        else:
            if metrics is not None:
                metrics.crd_current = problem is None
            if problem != said:
                if problem is not None:
                    log.warning("%s", problem)
                elif said:
                    log.info("the installed CPPool CRD is this operator's again")
                said = problem
        await asyncio.sleep(every_s)


def register(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.startup(registry=registry, id="startup")
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        lifetime = os.environ.get(envnames.PEERING_LIFETIME)
        configure(settings, int(lifetime) if lifetime else None)
        if memo.get("admin_key") is None:  # kopf run -m ...kopf_entry: from the environment
            env = (
                os.environ.get(v, "")
                for v in (
                    envnames.ADMIN_KEY_FILE,
                    envnames.ADMIN_CA_FILE,
                    envnames.ADMIN_CA_KEY_FILE,
                )
            )
            try:
                memo["admin_key"], memo["admin_ca"] = adminkeys.load(*env)
            except ValueError as e:
                # Stop, saying why: retrying cannot make a missing key appear.
                raise kopf.PermanentError(f"vertumnus operator: {e}") from None
        if memo.get("record_looks_s") is None:  # kopf_entry: from the environment
            getenv = os.environ.get
            try:
                memo["record_looks_s"] = record_looks_every(getenv(envnames.RECORD_LOOKS_EVERY, ""))
                memo["policies"] = netpol.peers_from(
                    getenv(envnames.POOL_NETWORK_POLICIES, "") == "true",
                    getenv(envnames.POD_NAMESPACE, ""),
                    getenv(envnames.OPERATOR_POD_LABELS, ""),
                    getenv(envnames.ROUTER_METRICS_FROM, ""),
                )
            except ValueError as e:
                raise kopf.PermanentError(f"vertumnus operator: {e}") from None
        memo["kube"] = KubeClient(connection_info())
        if memo.get("metrics") is not None:  # OperatorMetrics, from kopf.run(memo=...)
            memo["metrics"].api_requests = memo["kube"].requests
        memo["crd_check"] = asyncio.create_task(
            _keep_checking_crd(memo["kube"], memo.get("metrics"))
        )

    @kopf.on.cleanup(registry=registry, id="cleanup")
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        task = memo.get("crd_check")
        if task is not None:
            task.cancel()
        kube = memo.get("kube")
        if kube is not None:
            await kube.close()

    @kopf.on.login(registry=registry, id="login")
    def login(**_: Any) -> kopf.ConnectionInfo:
        # kopf's watches and the operator's own calls use the same identity.
        info: kopf.ConnectionInfo = connection_info()
        return info

    @kopf.daemon(
        GROUP,
        VERSION,
        PLURAL,
        registry=registry,
        id="pool",
        # When the CPPool goes (or this operator pauses for a peer) the loop ends by itself
        # at its next step, which follows the stop flag at once (kopf waits
        # background.instant_exit_timeout for that, then looks again after this backoff);
        # kopf would otherwise cancel it at once and warn "Daemon 'pool' is cancelled. Will
        # escalate." every time.
        cancellation_backoff=2.0,
        cancellation_timeout=10.0,
        initial_delay=0,
    )
    async def pool(
        *,
        stopped: kopf.DaemonStopped,
        name: str,
        namespace: str | None,
        uid: str,
        memo: Any,
        **_: Any,
    ) -> None:
        metrics = memo.get("metrics")  # OperatorMetrics, from kopf.run(memo=...)
        runtime = PoolRuntime(
            memo["kube"],
            name,
            namespace or "default",
            uid,
            wake=_wake_event(memo),
            seen=lambda: memo.get("seen_version"),
            metrics=None if metrics is None else metrics.pool(namespace or "default", name),
            admin_key=memo["admin_key"],
            admin_ca=memo.get("admin_ca"),
            record_looks_s=memo["record_looks_s"],
            policies=memo.get("policies"),
        )
        await runtime.run(stopped)

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry, id=WAKE)
    def changed(*, memo: Any, meta: kopf.Meta, **_: Any) -> None:
        # A change of the CPPool (a spec edit, an annotation) wakes its loop at once
        # instead of at its next poll; the loop ignores the echo of its own status writes.
        memo["seen_version"] = meta.get("resourceVersion")
        _wake_event(memo).set()

    @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry, id="deleted")
    async def deleted(
        *,
        name: str,
        namespace: str | None,
        uid: str,
        spec: kopf.Spec,
        memo: Any,
        logger: logging.Logger | logging.LoggerAdapter[Any],
        **_: Any,
    ) -> None:
        backend = str((spec.get("gang") or {}).get("backend", "native"))
        owner = Owner(name, namespace or "default", uid)
        n = await Reconciler(memo["kube"], owner, policies=memo.get("policies")).delete_all(backend)
        logger.info("deleted %d objects of pool %s/%s", n, namespace, name)
