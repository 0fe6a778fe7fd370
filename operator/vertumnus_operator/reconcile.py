"""Making the cluster hold what a CPPool renders to, and looking at what it holds.

:meth:`Reconciler.apply` server-side-applies the pool's objects
(:mod:`vertumnus.operator.resources`) and creates the domain pods that are missing —
never replacing one: a pod's spec is fixed for its life, and the grouping it serves lives
in its annotations. It lists the pods that run an older spec (``outdated``); a rolling
update (:mod:`vertumnus.operator.rollout`) deletes them a few at a time, each after its
workers are drained, and the next :meth:`~Reconciler.apply` creates it anew. Before
the first pod of a gang, it checks that the gang API is served
(discovery) and that a dry-run pod keeps its gang fields (with the feature gate off the
API server drops them silently); if not, no pod is created and the CPPool says why.

:meth:`Reconciler.observe` reads the pods (a watched copy, :mod:`.informer`) and the gang
object back into an :class:`~vertumnus.operator.status.Observation`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from vertumnus.core.lattice import Layout
from vertumnus.operator import networkpolicy as netpol
from vertumnus.operator import resources as res
from vertumnus.operator.crd import PoolSpec
from vertumnus.operator.gang import GangBackend, GangStatus, backend_for
from vertumnus.operator.informer import Informer
from vertumnus.operator.kube import Conflict, KubeClient, KubeError, NotFound, object_path
from vertumnus.operator.status import Observation, Problem

__all__ = ["Reconciler", "pool_objects"]

log = logging.getLogger(__name__)


def pool_objects(
    spec: PoolSpec,
    owner: res.Owner,
    layout: Layout,
    epoch: int,
    admin_tls: bool = False,
    policies: netpol.Peers | None = None,
) -> list[dict[str, Any]]:
    """Every object of the pool except its pods, the gang object and its Secrets (its
    PodDisruptionBudgets, of the domain pods and of the routers, included, and with
    ``policies`` its NetworkPolicies); ``admin_tls``: the routers serve Admin over TLS."""
    objs = [
        res.engines_service(owner, spec),
        res.domains_pdb(owner, spec),
        res.configmap(spec, owner, layout, epoch, admin_tls),
        res.router_deployment(spec, owner, admin_tls),
        res.router_service(spec, owner),
        res.router_pdb(owner),
        *res.redis_objects(spec, owner),
        *([] if policies is None else netpol.pool_policies(spec, owner, policies)),
    ]
    return objs


def path_of(obj: Mapping[str, Any]) -> str:
    kind = obj["kind"]
    plural = {
        "Service": "services",
        "ConfigMap": "configmaps",
        "Deployment": "deployments",
        "Pod": "pods",
        "Secret": "secrets",
        "PodGroup": "podgroups",
        "PodDisruptionBudget": "poddisruptionbudgets",
        "NetworkPolicy": "networkpolicies",
    }[kind]
    meta = obj["metadata"]
    return object_path(obj["apiVersion"], plural, meta["namespace"], meta["name"])


class Reconciler:
    def __init__(
        self,
        kube: KubeClient,
        owner: res.Owner,
        admin_token: str = "",
        policies: netpol.Peers | None = None,
    ) -> None:
        self.kube = kube
        self.owner = owner
        self.policies = policies
        """Who the pool's NetworkPolicies let in (:mod:`.networkpolicy`); None: the operator
        makes none (``--pool-network-policies`` off; then it may not touch them either)."""
        self.admin_token = admin_token
        """The pool's Admin token, written into its Secret by :meth:`apply` (only
        :meth:`delete_all` goes without one)."""
        self.admin_cert: tuple[bytes, bytes] | None = None
        """The certificate and key (PEM) the operator issued the pool's routers, written
        into the same Secret (None: Admin in plaintext); its owner keeps it current."""
        self._applied: dict[str, str] = {}
        """path -> hash of what was last applied there (skip unchanged applies)."""
        self._secret_done = False
        self._redis_cleaned = False
        self.gang_ok: dict[str, bool] = {}
        """Backend name -> the cluster serves it and keeps its pod fields."""
        self.outdated: list[int] = []
        """Domains whose pod runs an older spec and that a rolling update may replace
        (found by the last :meth:`apply`; the gang object and the domains unchanged)."""
        self._listed: dict[int, dict[str, Any]] | None = None
        """The domain pods :meth:`apply` listed, for the :meth:`observe` that follows it
        (None: list again, e.g. after pods were created)."""
        self.pod_watch = Informer(
            kube,
            object_path("v1", "pods", owner.namespace),
            ",".join(f"{k}={v}" for k, v in res.engine_labels(owner).items()),
        )
        """The domain pods as watched once :meth:`watch_pods` starts it (until then, and
        while it is not synced, :meth:`pods` lists them)."""
        self._gang: GangStatus | None = None
        """The gang's status when every domain pod was last bound and ready."""
        self.stale: list[int] = []
        """Domains whose pod runs an older spec, whatever the update strategy (the status's
        ``updatedDomains`` is the rest)."""

    def gang(self, spec: PoolSpec) -> GangBackend:
        return backend_for(spec.gang.backend, spec.gang.queue)

    async def _apply(self, obj: dict[str, Any], force: bool = False) -> None:
        path = path_of(obj)
        digest = hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()
        if not force and self._applied.get(path) == digest:
            return
        await self.kube.apply(path, obj)
        self._applied[path] = digest

    def forget(self) -> None:
        """Re-apply everything next time (objects may have been deleted by hand), and read
        the gang again."""
        self._applied.clear()
        self._gang = None

    async def apply(self, spec: PoolSpec, layout: Layout, epoch: int) -> list[Problem]:
        """Apply the pool's objects and create missing domain pods; the problems found."""
        problems: list[Problem] = []
        owner = self.owner
        if not self.admin_token:
            raise ValueError("a pool's objects need its Admin token")
        tls = self.admin_cert
        objs = [
            res.admin_secret(owner, self.admin_token, tls),
            *pool_objects(spec, owner, layout, epoch, tls is not None, self.policies),
        ]
        await asyncio.gather(*(self._apply(o) for o in objs))
        if spec.redis.mode == "managed" and not self._secret_done:
            try:
                secret = res.redis_secret(owner, secrets.token_urlsafe(24))
                await self.kube.create(object_path("v1", "secrets", owner.namespace), secret)
            except Conflict:
                pass  # made earlier: the password is never rewritten
            self._secret_done = True
        if spec.redis.mode == "managed":
            self._redis_cleaned = False
        else:
            await self._delete_redis()

        self.outdated = []
        self.stale = []
        self._listed = None
        gang = self.gang(spec)
        if not await self._gang_usable(gang, spec, layout, epoch, problems):
            return problems
        group = res.gang_group(spec, owner, gang)
        gang_stuck = False
        if group is not None:
            try:
                await self._apply(group)
            except KubeError as e:
                if e.status != 422:
                    raise
                gang_stuck = True
                problems.append(
                    Problem(
                        "Degraded",
                        "NeedsNewPods",
                        f"the gang object cannot change in place ({e.message})",
                    )
                )
        existing = await self.pods()
        missing = [d for d in range(spec.domains) if d not in existing]
        if missing:
            await asyncio.gather(*(self._create_pod(spec, layout, epoch, d, gang) for d in missing))
        else:
            self._listed = existing  # observe() reads these instead of listing them again
        want = {d: res.domain_pod(spec, owner, d, layout.domain(d), epoch, gang) for d in existing}
        stale = sorted(
            d
            for d, pod in existing.items()
            if d in want
            and (pod["metadata"].get("annotations") or {}).get(res.ANN_SPEC_HASH)
            != want[d]["metadata"]["annotations"][res.ANN_SPEC_HASH]
        )
        self.stale = stale
        extra = sorted(d for d in existing if d >= spec.domains)
        rolling = spec.update_strategy.type == "RollingUpdate"
        if stale and rolling and not extra and not gang_stuck:
            self.outdated = stale  # the pool replaces them (vertumnus.operator.rollout)
        elif stale or extra:
            problems.append(
                Problem(
                    "Degraded",
                    "NeedsNewPods",
                    f"the spec changed what the domain pods run ({'pods ' + str(stale) if stale else ''}"
                    f"{' and ' if stale and extra else ''}{'extra domains ' + str(extra) if extra else ''}): "
                    + (
                        "updateStrategy OnDelete: a domain pod deleted by hand is recreated with "
                        "the current spec"
                        if stale and not extra and not rolling
                        else "that needs new pods, which the operator does not make on its own; "
                        "the pool keeps running as it was (recreate the CPPool to apply)"
                    ),
                )
            )
        return problems

    async def _gang_usable(
        self, gang: GangBackend, spec: PoolSpec, layout: Layout, epoch: int, problems: list[Problem]
    ) -> bool:
        if self.gang_ok.get(gang.name):
            return True
        if gang.api_version is not None and not await self.kube.has_api(gang.api_version):
            problems.append(
                Problem(
                    "GangScheduled",
                    "GangAPIUnavailable",
                    f"the cluster does not serve {gang.api_version} (gang backend {gang.name}); "
                    "no pod is created rather than have them scheduled one by one",
                )
            )
            return False
        probe = res.domain_pod(spec, self.owner, 0, layout.domain(0), epoch, gang)
        try:
            back = await self.kube.create(
                object_path("v1", "pods", self.owner.namespace), probe, dry_run=True
            )
        except Conflict:
            back = await self.kube.get(path_of(probe))
        why = gang.dropped(back, self.owner.name)
        if why is not None:
            problems.append(Problem("GangScheduled", "GangFieldDropped", why))
            return False
        self.gang_ok[gang.name] = True
        return True

    async def _create_pod(
        self, spec: PoolSpec, layout: Layout, epoch: int, domain: int, gang: GangBackend
    ) -> None:
        pod = res.domain_pod(spec, self.owner, domain, layout.domain(domain), epoch, gang)
        # Conflict: a pod of that name is terminating or was just made.
        with contextlib.suppress(Conflict):
            await self.kube.create(object_path("v1", "pods", self.owner.namespace), pod)

    def watch_pods(
        self, on_change: Callable[[], None], on_failure: Callable[[], None] = lambda: None
    ) -> None:
        """Keep a watched copy of the domain pods (one watch instead of a list per step);
        ``on_change`` is called at each change, ``on_failure`` when the watch breaks.
        :meth:`close` stops it."""
        self.pod_watch.on_change, self.pod_watch.on_failure = on_change, on_failure
        self.pod_watch.start()

    async def close(self) -> None:
        await self.pod_watch.close()

    async def pods(self) -> dict[int, dict[str, Any]]:
        """The domain pods by domain (terminating ones left out): the watched copy when it
        is synced, else a list."""
        out = {}
        for pod in await self.pod_watch.current():
            if pod["metadata"].get("deletionTimestamp"):
                continue
            try:
                out[int(pod["metadata"]["labels"][res.LABEL_DOMAIN])] = pod
            except (KeyError, ValueError):
                continue
        return out

    async def annotate(self, domain: int, grouping: Any, epoch: int) -> None:
        """Write a domain's grouping and epoch onto its pod (the pod stays)."""
        path = object_path(
            "v1", "pods", self.owner.namespace, res.pod_name(self.owner.name, domain)
        )
        body = {"metadata": {"annotations": res.grouping_annotations(grouping, epoch)}}
        # A pod that is gone (its node lost) is recreated from the recorded layout, which
        # already holds this grouping: nothing to annotate.
        with contextlib.suppress(NotFound):
            await self.kube.merge_patch(path, body)

    async def observe(self, spec: PoolSpec) -> Observation:
        """Pods and gang as they are now. The pods from the watched copy (while the watch
        is down: the list :meth:`apply` made, unless it created some), and the gang object
        read only while some domain pod is not bound and ready: an idle pool's step costs
        the API server no read beyond its CPPool's (at most every 5 s)."""
        pods, self._listed = (self._listed or await self.pods()), None
        obs = Observation(
            domains=spec.domains, pods=len(pods), gpus_per_domain=spec.gpus_per_domain
        )
        for d, pod in sorted(pods.items()):
            if d >= spec.domains:
                continue
            st = pod.get("status") or {}
            if (pod.get("spec") or {}).get("nodeName"):
                obs.bound += 1
            conds = {c.get("type"): c for c in st.get("conditions") or []}
            if st.get("phase") == "Running" and (conds.get("Ready") or {}).get("status") == "True":
                obs.ready_domains.add(d)
            sched = conds.get("PodScheduled") or {}
            if sched.get("status") == "False" and not obs.unschedulable:
                obs.unschedulable = (
                    f"{res.pod_name(self.owner.name, d)}: {sched.get('message', '')}"
                )
        gang = self.gang(spec)
        settled = obs.bound == obs.ready == spec.domains == len(pods)
        if settled and self._gang is not None and self._gang.scheduled:
            obs.gang = self._gang  # bound and ready: the gang can only have been scheduled
            return obs
        group = None
        if gang.api_version is not None and gang.plural is not None:
            try:
                group = await self.kube.get(
                    object_path(
                        gang.api_version, gang.plural, self.owner.namespace, self.owner.name
                    )
                )
            except NotFound:
                group = None
            except KubeError as e:
                if e.status != 404:
                    raise
        obs.gang = gang.status(group)
        self._gang = obs.gang if settled else None
        return obs

    async def _delete_redis(self) -> None:
        """A pool that no longer wants a managed Redis: remove the one it had (once)."""
        if self._redis_cleaned:
            return
        ns, name = self.owner.namespace, f"{self.owner.name}-redis"
        kinds = [("apps/v1", "deployments"), ("v1", "services"), ("v1", "secrets")]
        if self.policies is not None:
            kinds.append(("networking.k8s.io/v1", "networkpolicies"))
        for api, plural in kinds:
            path = object_path(api, plural, ns, name)
            self._applied.pop(path, None)
            await self.kube.delete(path)
        self._secret_done = False
        self._redis_cleaned = True

    async def delete_all(self, spec_backend: str) -> int:
        """Delete everything the pool made (the CPPool is going away); how many objects."""
        ns, name = self.owner.namespace, self.owner.name
        selector = f"{res.LABEL_POOL}={name}"
        n = 0
        paths = []
        kinds = [
            ("v1", "pods"),
            ("apps/v1", "deployments"),
            ("v1", "services"),
            ("v1", "configmaps"),
            ("policy/v1", "poddisruptionbudgets"),
        ]
        if self.policies is not None:
            kinds.append(("networking.k8s.io/v1", "networkpolicies"))
        for api, plural in kinds:
            for item in await self.kube.list(object_path(api, plural, ns), selector):
                refs = item["metadata"].get("ownerReferences") or []
                if any(r.get("uid") == self.owner.uid for r in refs):
                    paths.append(object_path(api, plural, ns, item["metadata"]["name"]))
        # The Secrets it makes have fixed names (it may not list or read secrets).
        paths.append(object_path("v1", "secrets", ns, f"{name}-redis"))
        paths.append(object_path("v1", "secrets", ns, res.admin_secret_name(self.owner)))
        gang = backend_for(spec_backend)
        if gang.api_version is not None and gang.plural is not None:
            paths.append(object_path(gang.api_version, gang.plural, ns, name))
        for p in paths:
            if await self.kube.delete(p) is not None:
                n += 1
        return n
