"""One CPPool's life in the operator: the loop a kopf daemon runs for it.

Each step (on every change of the CPPool, through a kopf watch event; else about once a
second, four times a second while pods are being placed, every 2 s for a pool stuck):

1. read the CPPool; parse and check its spec (an invalid one is reported, nothing else
   is done);
2. on the first step, load the :class:`~vertumnus.operator.record.Record` from
   ``status.state`` (or start one from the initial composition) and resume any recorded
   transition; on a new generation, say in Events what the change does (router settings:
   ConfigMap rewritten, the router Deployment rolls; controller settings: applied now; a
   pinned composition: reached by transitions; engine image or settings: the domain pods
   roll; GPU budget, domain size, gang backend: needs new pods, not done);
3. apply the pool's objects, create missing domain pods (:mod:`vertumnus.operator.reconcile`);
4. observe pods and gang, write the status if it changed;
5. while domain pods run an older spec: the next step of their rolling update
   (:mod:`vertumnus.operator.rollout`), and no decision;
6. once every domain pod is ready: replace a worker a router reports failed (its engine
   cannot serve it: an SGLang server that exited), or start a split or merge asked for
   by annotation, or every hop (``hopSeconds``, or ``windowSeconds / checksPerWindow``)
   read the window from the routers and let the controller decide, or take the next step
   toward a pinned composition; transitions run in the background
   (:mod:`vertumnus.operator.transitions`).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from vertumnus.admintls import AdminTLS, period_of, pool_certificate, router_name
from vertumnus.admintoken import pool_token
from vertumnus.core import planner
from vertumnus.core import transition as tr
from vertumnus.core.control import Controller
from vertumnus.core.lattice import Layout, layout_for
from vertumnus.core.transition import SWITCH_TIMEOUT_S
from vertumnus.operator import envnames, rollout
from vertumnus.operator import resources as res
from vertumnus.operator.crd import (
    DEFAULT_REDIS_IMAGE,
    DEFAULT_ROUTER_IMAGE,
    GROUP,
    PLURAL,
    VERSION,
    PoolSpec,
    SpecError,
    parse_spec,
)
from vertumnus.operator.events import KubeEvents
from vertumnus.operator.informer import Informer
from vertumnus.operator.kube import KubeClient, NotFound, object_path
from vertumnus.operator.metrics import PoolMetrics
from vertumnus.operator.networkpolicy import Peers
from vertumnus.operator.reconcile import Reconciler
from vertumnus.operator.record import LostRecord, Record, decode_record
from vertumnus.operator.repairs import Repairs
from vertumnus.operator.rollout import Rollout
from vertumnus.operator.routerapi import AdminError, RouterAdmin
from vertumnus.operator.serialize import StateError
from vertumnus.operator.status import (
    Observation,
    Problem,
    StatusStore,
    build_status,
    condition,
    ran_before,
)
from vertumnus.operator.transitions import TransitionRunner
from vertumnus.profiles import ProfileError, load_capacity, load_model

__all__ = [
    "PoolRuntime", "Stopped", "endpoint_addresses", "pinned_router_addresses", "router_addresses",
]  # fmt: skip

log = logging.getLogger(__name__)

RESYNC_S = 60.0
"""Seconds between two full re-applies of a pool's objects (between them, only changes)."""
OBJECT_MAX_AGE_S = 30.0
"""Seconds a step reuses the CPPool it read last while no watch event says it changed
(an idle pool reads it twice a minute, not every second; a missed event costs at most
this)."""
RECORD_LOOKS_S = 30.0
"""The default of ``--record-looks-every``: the longest a look that decides nothing waits
to be written into the status (:attr:`TransitionRunner.record_looks_s`)."""


def record_looks_every(text: str) -> float:
    """``--record-looks-every`` / ``$VERTUMNUS_RECORD_LOOKS_EVERY``: seconds, >= 0 (empty:
    the default)."""
    if not text.strip():
        return RECORD_LOOKS_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0.0 <= seconds < float("inf"):
        raise ValueError(
            f"--record-looks-every (${envnames.RECORD_LOOKS_EVERY}): expected seconds >= 0, got {text!r}"
        )
    return seconds


class Stopped(Protocol):
    """kopf's DaemonStopped, or an asyncio.Event."""

    def is_set(self) -> bool: ...

    async def wait(self, timeout: float | None = None) -> Any: ...


def pinned_router_addresses(obj: Mapping[str, Any]) -> list[str]:
    """The router addresses given by the CPPool's ``vertumnus.io/router-addresses``
    annotation, else by $VERTUMNUS_ROUTER_ADDRESSES ([]: none given)."""
    pinned = (obj["metadata"].get("annotations") or {}).get(
        res.ANN_ROUTER_ADDRESSES
    ) or os.environ.get(envnames.ROUTER_ADDRESSES, "")
    return [a.strip() for a in pinned.split(",") if a.strip()]


def router_slices(
    kube: KubeClient,
    namespace: str,
    name: str,
    on_change: Callable[[], None],
    on_failure: Callable[[], None],
) -> Informer:
    """A watched copy of the ``<pool>-router`` Service's EndpointSlices."""
    return Informer(
        kube,
        object_path("discovery.k8s.io/v1", "endpointslices", namespace),
        f"kubernetes.io/service-name={name}-router",
        on_change=on_change,
        on_failure=on_failure,
    )


async def router_addresses(obj: Mapping[str, Any], slices: Informer) -> list[str]:
    """Where the router replicas' Admin API listens: :func:`pinned_router_addresses`, else
    the ready endpoints of the ``<pool>-router`` Service (``slices``, see
    :func:`router_slices`, started here when first needed; :func:`endpoint_addresses`)."""
    pinned = pinned_router_addresses(obj)
    if pinned:
        return pinned
    slices.start()
    return endpoint_addresses(await slices.current())


def endpoint_addresses(
    slices: Iterable[Mapping[str, Any]], port_names: Sequence[str] = ("admin", "grpc")
) -> list[str]:
    """``host:port`` of each ready endpoint of ``slices`` (EndpointSlices), at their port
    named by the first of ``port_names`` they have (a router Service rendered before the
    Admin API had a port of its own has only ``grpc``); IPv6 hosts in brackets.

    A dual-stack Service has a slice per address family for the same pods, so only one
    family is read (IPv4 where there is one, then IPv6, then FQDN), lest each router be
    dialled twice. Only an endpoint's first address counts: the API defines no meaning for
    the others."""
    by_family: dict[str, list[str]] = {}
    for sl in slices:
        family = sl.get("addressType", "IPv4")
        ports = {p.get("name"): p.get("port") for p in sl.get("ports") or []}
        port = next((ports[n] for n in port_names if ports.get(n)), None)
        for ep in sl.get("endpoints") or []:
            addresses = ep.get("addresses") or []
            if port and addresses and (ep.get("conditions") or {}).get("ready", True):
                host = f"[{addresses[0]}]" if family == "IPv6" else addresses[0]
                by_family.setdefault(family, []).append(f"{host}:{port}")
    for family in ("IPv4", "IPv6", "FQDN"):
        if family in by_family:
            return sorted(by_family[family])
    return []


def _shape(layout: Layout) -> tuple[int, int]:
    return sum(s.degree for s in layout.slots), layout.domain_size


class PoolRuntime:
    def __init__(
        self,
        kube: KubeClient,
        name: str,
        namespace: str,
        uid: str,
        clock: Any = time.time,
        wake: asyncio.Event | None = None,
        seen: Any = None,
        metrics: PoolMetrics | None = None,
        *,
        admin_key: bytes,
        admin_ca: tuple[bytes, bytes] | None = None,
        record_looks_s: float = RECORD_LOOKS_S,
        policies: Peers | None = None,
    ) -> None:
        self.kube = kube
        self.record_looks_s = record_looks_s
        self.metrics = metrics
        """The pool's Prometheus series (:mod:`.metrics`; None: not exported)."""
        self.name = name
        self.namespace = namespace
        self.owner = res.Owner(name, namespace, uid)
        self.path = object_path(f"{GROUP}/{VERSION}", PLURAL, namespace, name)
        self.admin_token = pool_token(admin_key, namespace, name, uid)
        """What this pool's routers require of an Admin call: written into its Secret,
        sent on every call; derived, so that a restarted operator needs no Secret back."""
        self.reconciler = Reconciler(kube, self.owner, self.admin_token, policies)
        self.admin_ca = admin_ca
        """The operator's CA (certificate, key: PEM), which issues the pool's routers the
        Admin port's certificate; None: Admin in plaintext."""
        self.admin_key = admin_key
        """The operator's key: the pool's Admin token and certificates are derived from it."""
        self._issued_period: int | None = None
        self.events = KubeEvents(kube, name, namespace, uid)
        self.clock = clock
        self.wake = wake or asyncio.Event()
        """Set by a watch event on the CPPool: the next step comes at once."""
        self.watched = asyncio.Event()
        """Set when a domain pod or the router's endpoints change (:mod:`.informer`): the
        next step comes at once."""
        self.router_slices = router_slices(
            kube,
            namespace,
            name,
            on_change=self.watched.set,
            on_failure=lambda: self._watch_failed("endpointslices"),
        )
        self.seen = seen or (lambda: None)
        """The resourceVersion of the last watch event (ours, if it echoes our write)."""
        self._obj: dict[str, Any] | None = None
        """The CPPool as last read, or as a status write returned it
        (:data:`OBJECT_MAX_AGE_S`); None: read it next step."""
        self._obj_at = 0.0
        """When ``_obj`` was read (the read's start, or the write's sending), or forgotten."""
        self.runner: TransitionRunner | None = None
        self.store: StatusStore | None = None
        self.obs = Observation()
        self.conditions: list[dict[str, Any]] = []
        self.spec: PoolSpec | None = None
        self.generation: int | None = None
        self.spec_problems: list[Problem] = []
        self.router_problem: Problem | None = None
        self.router_unaddressed = False
        """``router_problem`` says that no router address is known (else: one did not answer)."""
        self.admin: RouterAdmin | None = None
        self.next_hop: float | None = None
        self.created = time.monotonic()
        self.settling_since = self.created
        self.applied_all = self.created
        self._said: set[str] = set()
        """Event keys already posted (an Event per change, not per step)."""
        self.was_ready = False
        """Every domain pod was ready once (a later loss is Degraded, not Pending)."""
        self.repairs = Repairs()
        self.rollout = Rollout()
        """The rolling update of outdated domain pods in progress (:mod:`.rollout`),
        recorded in ``status.state.rolling`` before each step is acted on."""
        self.loaded = False
        """The record was loaded once by this operator (a later load follows a reset)."""
        self.orphans_checked = False
        """This operator has resumed the workers a cut-short rolling update left drained."""

    # ---- the loop --------------------------------------------------------------------------

    async def run(self, stopped: Stopped) -> None:
        backoff = 1.0
        self.reconciler.watch_pods(self.watched.set, lambda: self._watch_failed("pods"))
        try:
            while not stopped.is_set():
                try:
                    interval = await self.step()
                    if backoff > 1.0:  # recovered: the same error later is reported again
                        self._said = {k for k in self._said if not k.startswith("error:")}
                    backoff = 1.0
                except LostRecord as e:
                    log.warning("%s/%s: %s; reloading", self.namespace, self.name, e)
                    await self.reset()
                    interval = 1.0
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # a step that failed is retried: log, report, back off
                    log.exception("%s/%s: step failed", self.namespace, self.name)
                    if self.metrics is not None:
                        self.metrics.step_failed(type(e).__name__)
                    await self._say_once(
                        f"error:{type(e).__name__}:{e}",
                        "Warning",
                        "ReconcileError",
                        f"{type(e).__name__}: {e}",
                    )
                    await self.reset()
                    interval = backoff
                    backoff = min(backoff * 2, 30.0)
                if interval is None:
                    return
                await self._sleep(stopped, interval)
            await self._flush()
        finally:
            await self.reset()
            await self.reconciler.close()
            await self.router_slices.close()
            if self.metrics is not None:
                self.metrics.forget()

    async def _flush(self) -> None:
        """The operator stops (or pauses for a peer): write the looks not recorded yet. A
        peer that already took over and wrote makes this a LostRecord: its record stands."""
        if self.runner is None:
            return
        try:
            await self.runner.flush()
        except LostRecord:
            pass
        except Exception as e:  # the next operator goes on from the last write instead
            log.warning("%s/%s: the last looks were not recorded: %s", self.namespace, self.name, e)

    def _watch_failed(self, collection: str) -> None:
        if self.metrics is not None:
            self.metrics.watch_failed(collection)

    async def _sleep(self, stopped: Stopped, seconds: float) -> None:
        """Until ``seconds`` pass, the daemon is stopped, or the CPPool changes (other
        than by this operator's own status write)."""
        deadline = time.monotonic() + seconds
        while not stopped.is_set():
            if self.wake.is_set():
                self.wake.clear()
                own = self.store is not None and self.seen() == self.store.resource_version
                if not own:
                    self._forget_obj()  # changed by someone else: the next step reads it
                    await asyncio.sleep(0.02)  # let a burst of watch events settle
                    return
            if self.watched.is_set():
                self.watched.clear()
                await asyncio.sleep(0.02)
                return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            waiters = [
                asyncio.ensure_future(stopped.wait(left)),
                asyncio.ensure_future(self.wake.wait()),
                asyncio.ensure_future(self.watched.wait()),
            ]
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()

    def _forget_obj(self) -> None:
        """The CPPool changed since it was last read or written: read it again (a status
        write returned before now is older too)."""
        self._obj, self._obj_at = None, time.monotonic()

    async def reset(self) -> None:
        """Forget the in-memory state; the next step reloads it from the status."""
        if self.runner is not None:
            await self.runner.close()
        self.runner = None
        self.store = None
        self._obj = None
        self.next_hop = None
        self.reconciler.forget()
        if self.admin is not None:
            await self.admin.close()
            self.admin = None

    async def _say_once(self, key: str, type_: str, reason: str, message: str) -> None:
        if key in self._said:
            return
        self._said.add(key)
        await self.events.post(type_, reason, message)

    def _capacity(self, spec_raw: Mapping[str, Any]) -> planner.CapacityProfile:
        profile = ((spec_raw.get("model") or {}).get("profile")) or "qwen3-30b-a3b/h200"
        try:
            return load_capacity(profile)
        except ProfileError as e:
            raise SpecError("spec.model.profile", str(e)) from None

    async def step(self) -> float | None:
        """One pass; returns the seconds until the next (None: stop)."""
        now = time.monotonic()
        store = self.store
        if store is not None and store.latest is not None and store.latest_at > self._obj_at:
            # A status write sent after the last read returns the CPPool with every change
            # made before it (spec, annotations): no need to read it again. A change after
            # it comes as a watch event (_forget_obj).
            self._obj, self._obj_at = store.latest, store.latest_at
        obj = self._obj
        if obj is None or self.runner is None or now - self._obj_at > OBJECT_MAX_AGE_S:
            try:
                obj = self._obj = await self.kube.get(self.path)
            except NotFound:
                return None  # the CPPool is gone
            self._obj_at = now
        meta = obj["metadata"]
        if meta.get("deletionTimestamp"):
            await self.reset()
            return None
        generation = int(meta.get("generation", 0))
        try:
            capacity = self._capacity(obj.get("spec") or {})
            spec = parse_spec(
                obj.get("spec") or {},
                tuple(sorted(capacity.kappa_per_s)),
                router_image=os.environ.get(envnames.ROUTER_IMAGE) or DEFAULT_ROUTER_IMAGE,
                redis_image=os.environ.get(envnames.REDIS_IMAGE) or DEFAULT_REDIS_IMAGE,
            )
        except SpecError as e:
            await self._invalid(obj, generation, e)
            return 2.0

        if self.runner is None:
            await self._load(obj, spec, capacity)
        assert self.runner is not None and self.store is not None
        if generation != self.generation:
            await self._spec_changed(spec, capacity)
            self.generation = generation
            self.settling_since = time.monotonic()
        runner = self.runner
        layout = runner.record.pool.layout
        effective = spec
        if _shape(layout) != (spec.gpus, spec.gpus_per_domain):
            # The budget or domain size changed: keep running the pods that exist.
            effective = replace(
                spec, gpus=_shape(layout)[0], gpus_per_domain=layout.domain_size, composition=None
            )
        if time.monotonic() - self.applied_all > RESYNC_S:
            self.reconciler.forget()  # re-apply everything now and then (hand-deleted objects)
            self.applied_all = time.monotonic()
        self._keep_admin_cert(spec)
        problems = await self.reconciler.apply(effective, layout, runner.record.pool.epoch)
        obs = await self.reconciler.observe(effective)
        obs.generation = generation
        obs.outdated = len(self.reconciler.stale)
        actions = rollout.next_actions(
            self.rollout,
            self.reconciler.outdated,
            {d: [s.worker for s in layout.domain(d)] for d in {s.domain for s in layout.slots}},
            obs.ready_domains,
            obs.domains,
            spec.update_strategy.max_unavailable,
            runner.busy,
            self.admin is not None,
            spec.update_strategy.partition,
        )
        obs.updating = self.rollout.workers
        obs.problems = (
            problems
            + self.spec_problems
            + ([self.router_problem] if self.router_problem else [])
            + self.repairs.problems()
            + ([self._rolling(actions)] if actions else [])
        )
        lost = set(range(obs.domains)) - obs.ready_domains - set(self.rollout.domains)
        if obs.all_ready:
            self.was_ready = True
        elif self.was_ready and lost:
            obs.problems.append(
                Problem(
                    "Degraded",
                    "DomainLost",
                    f"{len(lost)} of {obs.domains} domain pods are not ready (a node lost?): "
                    "missing pods are recreated with the grouping in force; no decision is taken "
                    "until every domain is back",
                )
            )
        await self._observed(obs)
        await self._write_status_if_changed()
        if runner.failure is not None:
            failure, runner.failure = runner.failure, None
            raise failure
        if self.was_ready:
            # Transitions in flight go on even while a domain is missing (they are per domain).
            await self._refresh_admin(obj)
            runner.resume()
        if (
            obs.all_ready
            and not runner.busy
            and not self.rollout.domains
            and not self.orphans_checked
        ):
            await self._resume_orphans()
        if actions:
            # A rolling update: no decision until it is over (the windows would read a
            # pool short of a domain).
            await self._roll(actions, spec)
            return 0.5
        if not obs.all_ready:
            # Fast while pods are being placed; a pool stuck for a while is polled gently.
            return 0.25 if time.monotonic() - self.settling_since < 30.0 else 2.0
        await self._control(obj, spec, effective)
        return self._interval(spec)

    def _interval(self, spec: PoolSpec) -> float:
        if self.runner is not None and self.runner.busy:
            return 0.5
        if self.next_hop is None:
            return 1.0
        return max(0.05, min(1.0, self.next_hop - time.monotonic()))

    # ---- loading and spec changes ----------------------------------------------------------

    async def _invalid(self, obj: Mapping[str, Any], generation: int, err: SpecError) -> None:
        await self._say_once(f"invalid:{generation}", "Warning", "InvalidSpec", str(err))
        status = dict(obj.get("status") or {})
        prev = status.get("conditions") or []
        now = self.clock()
        conds = [
            condition("Ready", False, "InvalidSpec", str(err), generation, prev, now),
            condition("Degraded", True, "InvalidSpec", str(err), generation, prev, now),
        ]
        others = [c for c in prev if c.get("type") not in ("Ready", "Degraded")]
        body = {
            "status": {
                "observedGeneration": generation,
                "phase": "Degraded",
                "conditions": conds + others,
            }
        }
        if status.get("phase") != "Degraded" or status.get("observedGeneration") != generation:
            await self.kube.merge_patch(self.path + "/status", body)
        await self.reset()

    async def _load(
        self, obj: Mapping[str, Any], spec: PoolSpec, capacity: planner.CapacityProfile
    ) -> None:
        status = obj.get("status") or {}
        raw = status.get("state")
        record: Record
        if raw:
            try:
                record = decode_record(raw, status.get("lastTransition"))
            except (StateError, KeyError, ValueError, TypeError) as e:
                raise RuntimeError(f"status.state cannot be read back: {e}") from None
        else:
            layout = layout_for(spec.initial_composition(), spec.gpus_per_domain)
            record = Record(tr.initial_pool(layout))
        self.conditions = list(status.get("conditions") or [])
        # A daemon restarted (a new operator, a pause of this one) while a node is lost
        # must still call it a loss.
        self.was_ready = self.was_ready or ran_before(status, record)
        self.rollout.restore(record.rolling, time.monotonic())
        first, self.loaded = not self.loaded, True
        self.store = StatusStore(
            self.kube,
            self.namespace,
            self.name,
            self._view,
            obj["metadata"]["resourceVersion"],
            written=None if self.metrics is None else self.metrics.written,
        )
        controller = self._controller(record, spec, capacity)
        self.runner = TransitionRunner(
            record,
            self.store,
            self._admin_now,
            self.events,
            self.reconciler.annotate,
            controller=controller,
            metrics=self.metrics,
            drain_timeout_s=float(spec.controller.drain_timeout_seconds),
            switch_timeout_s=SWITCH_TIMEOUT_S[spec.engine.kind],
            record_looks_s=self.record_looks_s,
        )
        if not raw:
            await self.runner.checkpoint()  # the initial layout is recorded before any pod exists
            await self.events.post(
                "Normal",
                "Created",
                f"pool of {spec.gpus} GPUs in {spec.domains} domain pods of {spec.gpus_per_domain}; "
                f"initial composition {record.pool.layout.composition} (epoch {record.pool.epoch}); "
                f"gang backend {spec.gang.backend}",
            )
        elif record.rolling and first:
            await self.events.post(
                "Normal",
                "Resumed",
                "operator (re)started during a rolling update of the domain pods: carrying on "
                f"with domain(s) {[d for d, _, _ in record.rolling]}",
            )
        elif record.pool.transitions:
            await self.events.post(
                "Normal",
                "Resumed",
                "operator (re)started with transition(s) in flight: "
                + ", ".join(f"{t.id} ({t.kind}, {t.phase.value})" for t in record.pool.transitions)
                + "; carrying on from the recorded phase",
            )
        self.generation = None  # the first step reads the spec as a change from nothing
        self.spec = None

    def _controller(
        self, record: Record, spec: PoolSpec, capacity: planner.CapacityProfile
    ) -> Controller | None:
        if spec.composition is not None or not spec.controller.enabled:
            return None
        state, memory = record.controller, record.memory
        if state is not None:
            in_flight = {t.op for t in record.pool.transitions}
            if any(op not in in_flight for op in state.pending) or (
                not state.pending and state.layout != record.pool.layout
            ):
                # Reshaped by hand or by a pinned composition since: the planner starts
                # over, remembering only what happened (the flaps), not what it planned.
                state = None
                memory = None if memory is None else memory.without_plans()
        model = None
        if spec.controller.whatif or spec.controller.shadow:
            # The what-if check replays the routers' listed placements, and the shadow
            # pools serve them, with the profile's prefill-time model.
            try:
                model = load_model(spec.model.profile)
            except ProfileError as e:
                raise SpecError("spec.model.profile", str(e)) from None
        return Controller(
            state or planner.initial_state(record.pool.layout),
            capacity,
            spec.planner_settings(),
            model,
            spec.placement_params(),
            spec.engine.block_size,
            memory=memory,
        )

    async def _spec_changed(self, spec: PoolSpec, capacity: planner.CapacityProfile) -> None:
        old = self.spec
        self.spec = spec
        assert self.runner is not None
        record = self.runner.record
        self.spec_problems = []
        shape = _shape(record.pool.layout)
        if shape != (spec.gpus, spec.gpus_per_domain):
            msg = (
                f"spec asks for {spec.gpus} GPUs in domains of {spec.gpus_per_domain}; the pool "
                f"runs {shape[0]} in domains of {shape[1]}. Changing the budget or the domain "
                "size needs new pods, which the operator does not make on its own: the pool keeps "
                "running as it was (recreate the CPPool to apply)"
            )
            self.spec_problems.append(Problem("Degraded", "NeedsNewPods", msg))  # an Event too
        if old is None:
            return
        if (old.placement, old.cache_manager, old.router, old.redis, old.model) != (
            spec.placement,
            spec.cache_manager,
            spec.router,
            spec.redis,
            spec.model,
        ):
            await self.events.post(
                "Normal",
                "RouterConfigUpdated",
                f"rewrote ConfigMap {self.name}-router (placement beta={spec.placement.beta}, "
                f"betaBusy={spec.placement.beta_busy}, lambda={spec.placement.lam}, cache manager, "
                f"router, Redis); Deployment {self.name}-router rolls to apply it (its pods read "
                "it at start; each finishes the requests it holds before it stops). The domain "
                "pods are not restarted",
            )
        # The decode servers' peers go into the engines' NetworkPolicy, not their pods.
        engines = replace(old.engine, transfer_from=None), replace(spec.engine, transfer_from=None)
        if (engines[0], old.gang, old.scheduling) != (engines[1], spec.gang, spec.scheduling):
            if spec.update_strategy.type == "RollingUpdate" and old.gang == spec.gang:
                partition = spec.update_strategy.partition
                await self.events.post(
                    "Normal",
                    "RollingUpdate",
                    "spec.engine or spec.scheduling changed: the domain pods are replaced, "
                    f"{spec.update_strategy.max_unavailable} at a time, each after its workers "
                    "are drained at the routers (updateStrategy RollingUpdate)"
                    + (
                        f"; only domains {partition} and above (rollingUpdate.partition): the "
                        "others keep the older spec until it is lowered"
                        if partition
                        else ""
                    ),
                )
            else:
                msg = (
                    "spec.engine, spec.gang or spec.scheduling changed: that needs new domain "
                    "pods, which the operator does not make on its own (the gang object cannot "
                    "change in place, or updateStrategy OnDelete: a pod deleted by hand is "
                    "recreated with the current spec); the pool keeps running as it was"
                )
                await self.events.post("Warning", "NeedsNewPods", msg)
        if (
            old.composition != spec.composition
            or old.controller != spec.controller
            or old.degrees != spec.degrees
            or old.placement != spec.placement
        ):
            self.runner.controller = self._controller(record, spec, capacity)
            self.next_hop = None
            if spec.composition is not None:
                await self.events.post(
                    "Normal",
                    "CompositionPinned",
                    f"composition pinned to {spec.composition}: reached from "
                    f"{record.pool.layout.composition} by split/merge transitions; the pods stay; "
                    "the controller makes no decision while it is pinned",
                )
            else:
                await self.events.post(
                    "Normal",
                    "ControllerUpdated",
                    f"controller {'on' if spec.controller.enabled else 'off'} (window "
                    f"{spec.controller.window_seconds} s, hop {spec.controller.hop} s, "
                    f"{spec.controller.check_hops} look(s) per window, thresholds "
                    f"{spec.controller.lower}/{spec.controller.upper}); applied now",
                )
        # No forget(): what the change alters renders differently and is applied next step.

    # ---- status ----------------------------------------------------------------------------

    def _view(self, record: Record) -> dict[str, Any]:
        """The status of ``record`` as last observed; the pool's gauges follow it (every
        status write renders it, the runner's at each phase of a transition too)."""
        view = build_status(record, self.obs, self.conditions, self.clock())
        if self.metrics is not None:
            self.metrics.status(view, self.obs.problems)
        return view

    async def _observed(self, obs: Observation) -> None:
        before = self.obs
        self.obs = obs
        if obs.all_ready and not before.all_ready:
            took = time.monotonic() - self.created
            await self._say_once(
                f"ready:{obs.generation}:{obs.domains}",
                "Normal",
                "Ready",
                f"all {obs.domains} domain pods bound as one gang and ready "
                f"({obs.ready * obs.gpus_per_domain} GPUs; {took:.1f} s after the "
                "operator took the pool)",
            )
        # A Warning per problem when it appears. Its key is forgotten once it is gone, so
        # one that comes back (a second node lost a week later) is reported again. A
        # rolling update is progress, not a problem: it posts its own Normal Events.
        warn = [(p.reason, p.message) for p in obs.problems if p.condition != "Progressing"]
        gang = obs.gang
        if gang is not None and gang.scheduled is False and gang.reason not in ("GangDisabled",):
            warn.append(("GangUnschedulable", f"{gang.reason}: {gang.message}"))
        active = {f"problem:{reason}:{message}" for reason, message in warn}
        self._said = {k for k in self._said if not k.startswith("problem:") or k in active}
        for reason, message in warn:
            await self._say_once(f"problem:{reason}:{message}", "Warning", reason, message)

    async def _write_status_if_changed(self) -> None:
        assert self.runner is not None and self.store is not None
        # lastCheck changes at every look; it goes out with the record's writes
        # (TransitionRunner.record_looks_s), not as a write of its own.
        view = {k: v for k, v in self._view(self.runner.record).items() if k != "lastCheck"}
        last = {k: v for k, v in self.store.last_status.items() if k not in ("state", "lastCheck")}
        if view != last:
            await self.runner.checkpoint()
            self.conditions = list(self.store.last_status.get("conditions") or [])

    # ---- control ---------------------------------------------------------------------------

    def admin_tls(self, spec: PoolSpec | None) -> AdminTLS | None:
        """How this operator verifies the routers' Admin port under ``spec`` (None:
        plaintext, for want of a CA or by ``spec.router.adminTLS: false``)."""
        if self.admin_ca is None or spec is None or not spec.router.admin_tls:
            return None
        return AdminTLS(self.admin_ca[0], router_name(self.name, self.namespace))

    def _keep_admin_cert(self, spec: PoolSpec) -> None:
        """Issue the routers' Admin certificate for the current period, and again when the
        period turns (every :data:`~vertumnus.admintls.PERIOD_DAYS` days; the routers read
        the renewed Secret without a restart); none while the pool's Admin is plaintext.
        Derived from the operator's key: a restarted operator issues the same bytes, so the
        Secret and the routers are left alone."""
        if self.admin_tls(spec) is None or self.admin_ca is None:
            self.reconciler.admin_cert = None
            return
        now = datetime.datetime.fromtimestamp(self.clock(), datetime.UTC)
        period = period_of(now)
        if self.reconciler.admin_cert is None or self._issued_period != period:
            o = self.owner
            issued = pool_certificate(
                self.admin_ca, self.admin_key, o.namespace, o.name, o.uid, now
            )
            self.reconciler.admin_cert = (issued.cert_pem, issued.key_pem)
            self._issued_period = period

    def _admin_now(self) -> RouterAdmin:
        if self.admin is None:
            raise AdminError("-", "UNAVAILABLE", "no router address known")
        return self.admin

    async def _refresh_admin(self, obj: Mapping[str, Any]) -> RouterAdmin | None:
        addresses = await router_addresses(obj, self.router_slices)
        tls = self.admin_tls(self.spec)
        if self.admin is not None and (self.admin.addresses, self.admin.tls) == (
            tuple(addresses),
            tls,
        ):
            return self.admin
        if self.admin is not None:
            await self.admin.close()
            self.admin = None
        if addresses:
            self.admin = RouterAdmin(addresses, self.admin_token, tls)
        return self.admin

    async def _control(self, obj: Mapping[str, Any], spec: PoolSpec, effective: PoolSpec) -> None:
        runner = self.runner
        assert runner is not None
        admin = await self._refresh_admin(obj)
        if admin is not None and self.router_unaddressed:
            # An address again (the Service's endpoints are watched): said at once, not at
            # the next window read. A router that does not answer shows at that read.
            self.router_problem, self.router_unaddressed = None, False
        pinned = spec.composition if effective.composition is not None else None
        if admin is not None and await self._repair(admin):
            return
        if await self._by_hand(obj, pinned is not None, admin is not None):
            return
        if pinned is not None:
            if runner.busy:
                return
            if admin is None:
                self._no_router()
                return
            self.router_problem = None  # a pinned pool reads no window: an address is enough
            op = await runner.pin(pinned, spec.degrees)
            if op is None and str(runner.record.pool.layout.composition) == str(pinned):
                await self._say_once(
                    f"pinned:{pinned}:{runner.record.pool.epoch}",
                    "Normal",
                    "CompositionReached",
                    f"the pool runs the pinned composition {pinned} "
                    f"(epoch {runner.record.pool.epoch})",
                )
            return
        if runner.controller is None:
            return
        # Every hop of the controller: a window (or hopSeconds), or window / checksPerWindow
        # when the what-if check looks between the rules' windows.
        hop = runner.controller.settings.hop
        now = time.monotonic()
        if self.next_hop is None:
            self.next_hop = now + hop
            return
        if now < self.next_hop:
            return
        self.next_hop = max(self.next_hop + hop, now + hop / 2)
        if admin is None:
            self._no_router()
            return
        try:
            window = await admin.take_window(runner.record.hop + 1)
        except AdminError as e:
            self._router_down(str(e), refused=e.code == "UNAUTHENTICATED")
            return
        self.router_problem = None
        await runner.decide(window)

    async def _repair(self, admin: RouterAdmin) -> bool:
        """Replace a worker a router reports FAILED (e.g. its SGLang server exited): a
        ``replace`` transition gives its GPUs a new worker of the same degree, which the
        engine starts afresh. One at a time, between other transitions, each place
        backed off after a replacement that failed again. True if one began."""
        runner = self.runner
        assert runner is not None
        now = time.monotonic()
        if runner.busy or not self.repairs.due(now):
            return False
        try:
            failed = await admin.failed_workers()
        except AdminError as e:
            # A router that does not answer is reported by the window reads (RouterUnavailable).
            log.debug("%s/%s: cannot read the workers' state: %s", self.namespace, self.name, e)
            return False
        layout = runner.record.pool.layout
        in_pool = {s.worker: s for s in layout.slots}
        self.repairs.seen({w: (in_pool[w], why) for w, why in failed.items() if w in in_pool})
        for worker, why in sorted(failed.items()):
            slot = in_pool.get(worker)
            if slot is None or not self.repairs.may_replace(slot, now):
                continue
            await self.events.post(
                "Warning",
                "WorkerFailed",
                f"worker {worker} (CP{slot.degree}, domain {slot.domain}, GPUs from "
                f"{slot.offset}) cannot serve: {why}; replacing it with a new worker in its place",
            )
            if await runner.replace(worker, why):
                self.repairs.replaced(slot, now)
                return True
        return False

    async def _by_hand(self, obj: Mapping[str, Any], pinned: bool, routed: bool) -> bool:
        """A split or merge asked for by annotation (``vertumnus.io/split: "7"``,
        ``vertumnus.io/merge: "3,4"``): begun (recorded) first, then the annotation is
        removed, so an operator restarted in between finds the workers busy or gone and
        only removes it. True if one was handled (no other decision this step)."""
        runner = self.runner
        assert runner is not None
        annotations = obj["metadata"].get("annotations") or {}
        key = next((k for k in (res.ANN_SPLIT, res.ANN_MERGE) if k in annotations), None)
        if key is None:
            return False
        value = str(annotations[key])
        op: planner.Op | None = None
        try:
            ids = [int(x) for x in value.split(",")]
            if key == res.ANN_SPLIT and len(ids) == 1:
                op = planner.Split(ids[0], "asked for by annotation")
            elif key == res.ANN_MERGE and len(ids) == 2:
                op = planner.Merge((ids[0], ids[1]), "asked for by annotation")
        except ValueError:
            op = None
        members = (
            set()
            if op is None
            else set(op.workers if isinstance(op, planner.Merge) else (op.worker,))
        )
        if op is None:
            await self.events.post(
                "Warning",
                "TransitionRefused",
                f"{key}={value!r}: expected a worker id (split) or two (merge, 'A,B')",
            )
        elif pinned:
            await self.events.post(
                "Warning",
                "TransitionRefused",
                f"{key}={value}: the composition is pinned (spec.composition); "
                "change the pin instead",
            )
        elif members & runner.record.pool.busy() or runner.busy:
            return True  # wait: its workers (or the pool) are in a transition
        elif not routed:
            self._no_router()  # wait, and say why (a window read may be an hour away)
            return True
        else:
            await runner.manual(op)
        await self.kube.merge_patch(self.path, {"metadata": {"annotations": {key: None}}})
        self._forget_obj()  # read again: the annotation is gone
        return True

    # ---- rolling update --------------------------------------------------------------------

    def _rolling(self, actions: list[rollout.Action]) -> Problem:
        """The Progressing condition of a rolling update at ``actions``."""
        doing = {
            rollout.Drain: "draining the workers of domain(s)",
            rollout.Delete: "deleting again the pod of domain(s)",
            rollout.Resume: "resuming the workers of domain(s)",
        }
        what = [a.why for a in actions if isinstance(a, rollout.Wait)]
        for kind, text in doing.items():
            ds = [a.domain for a in actions if isinstance(a, kind)]
            if ds:
                what.append(f"{text} {ds}")
        return Problem(
            "Progressing",
            "RollingUpdate",
            f"rolling update of the domain pods: {'; '.join(what)}; "
            f"{len(self.reconciler.outdated)} run an older spec",
        )

    async def _roll(self, actions: list[rollout.Action], spec: PoolSpec) -> None:
        """Carry out one step of the rolling update (:func:`rollout.next_actions`), its
        domains concurrently."""
        await asyncio.gather(*(self._roll_one(a, spec) for a in actions))

    async def _roll_one(self, action: rollout.Action, spec: PoolSpec) -> None:
        if isinstance(action, rollout.Wait):
            return
        r = self.rollout
        pod = res.pod_name(self.name, action.domain)
        try:
            if isinstance(action, rollout.Drain):
                if action.domain not in r.domains:
                    r.begin(action.domain, action.workers, time.monotonic())
                    await self._record_rollout()
                    await self.events.post(
                        "Normal",
                        "RollingUpdate",
                        f"domain pod {pod} runs an older spec: draining its workers "
                        f"{list(action.workers)} at the routers, then replacing it "
                        f"({len(self.reconciler.outdated)} outdated, at most "
                        f"{spec.update_strategy.max_unavailable} at a time)",
                    )
                admin = self._admin_now()
                # Short drains, retried each step: the status keeps being written meanwhile.
                timeout = min(5.0, float(spec.controller.drain_timeout_seconds))
                drained = await asyncio.gather(*(admin.drain(w, timeout) for w in action.workers))
                if all(drained):
                    r.domains[action.domain].deleted = True
                    await self._record_rollout()
                    await self._delete_pod(action.domain)
            elif isinstance(action, rollout.Delete):
                await self._delete_pod(action.domain)
            elif isinstance(action, rollout.Resume):
                admin = self._admin_now()
                await asyncio.gather(*(admin.resume(w) for w in action.workers))
                replacing = r.domains[action.domain]
                r.finish(action.domain)
                await self._record_rollout()
                if self.metrics is not None and replacing.deleted:
                    self.metrics.domain_replaced(time.monotonic() - replacing.began)
                await self.events.post(
                    "Normal",
                    "DomainPodReplaced",
                    f"domain pod {pod} runs the current spec; its workers {list(action.workers)} "
                    f"serve again ({r.replaced} replaced, {len(self.reconciler.outdated)} to go)",
                )
        except AdminError as e:
            log.warning(
                "%s/%s: rolling update of %s: %s; retrying", self.namespace, self.name, pod, e
            )

    async def _record_rollout(self) -> None:
        assert self.runner is not None
        await self.runner.record_rolling(self.rollout.recorded())

    async def _delete_pod(self, domain: int) -> None:
        path = object_path("v1", "pods", self.namespace, res.pod_name(self.name, domain))
        await self.kube.delete(path)

    async def _resume_orphans(self) -> None:
        """Once per operator: resume the workers the routers report draining that no
        transition holds (a rolling update cut short by a restart left them drained)."""
        assert self.runner is not None
        if self.admin is None:
            return
        try:
            draining = await self.admin.draining_workers()
            left = rollout.orphans(draining, self.runner.record.pool.busy())
            await asyncio.gather(*(self.admin.resume(w) for w in left))
        except AdminError as e:
            log.debug("%s/%s: cannot read the draining workers: %s", self.namespace, self.name, e)
            return
        self.orphans_checked = True
        if left:
            await self.events.post(
                "Normal",
                "WorkersResumed",
                f"workers {left} were left drained by a rolling update cut short (an operator "
                "restart); admitting at them again",
            )

    def _no_router(self) -> None:
        self._router_down(
            "no router address (no ready endpoint of Service "
            f"{self.name}-router, no {res.ANN_ROUTER_ADDRESSES} annotation)",
            unaddressed=True,
        )

    def _router_down(self, why: str, unaddressed: bool = False, refused: bool = False) -> None:
        """``refused``: a router answered, and refused the pool's Admin token: its token file
        is not (yet) what this operator derives (a new key, or a Secret the kubelet has not
        updated yet, which takes about a minute)."""
        self.router_unaddressed = unaddressed
        what = "refuse the operator's Admin token" if refused else "cannot be reached"
        self.router_problem = Problem(
            "Degraded",
            "RouterUnavailable",
            f"the routers {what} (no window read, no transition): {why}",
        )
