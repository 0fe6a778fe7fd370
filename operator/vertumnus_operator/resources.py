"""Rendering a CPPool into the Kubernetes objects that run it (pure: dicts in, dicts out).

For a pool ``P`` in namespace ``N`` (every object labelled ``vertumnus.io/pool: P`` and
owned by the CPPool, so deleting it lets the garbage collector remove them all):

- ``P-d0`` … ``P-d{n-1}``: one **domain pod** per NVLink domain, holding all its GPUs
  (``nvidia.com/gpu: gpusPerDomain``) and running one rank process per GPU
  (``vertumnus serve --ranks G``). Its workers — groups of ranks — and the epoch are
  annotations (``vertumnus.io/grouping: 0:CP4@0,1:CP4@4``, ``vertumnus.io/epoch``,
  ``vertumnus.io/degrees: 4,4``, ``vertumnus.io/workers: 0,1``). The container reads
  the degrees and the worker ids from downward-API files, so the pod spec never depends
  on the grouping: a split or merge rewrites annotations and leaves the pod (and its
  UID) alone; a restarted container rejoins with the grouping in force, under the ids
  the routers and the status know. With ``engine.kind: sglang`` the container runs the SGLang
  adapter instead, one SGLang server per worker (:mod:`vertumnus.operator.sglang_pod`);
  ``model.volume`` (hostPath or PVC) is mounted read-only at ``model.path`` for both.
- the gang object (:mod:`vertumnus.operator.gang`), named ``P``;
- ``P-engines``: a headless Service giving each domain pod a DNS name
  (``P-d0.P-engines.N.svc``), which the router dials;
- ``P-router``: the router's ConfigMap (``router.json``: model, profile, placement β /
  β_busy / λ, cache manager, Redis, engines; ``layout.json``: the grouping in force),
  Deployment and Service;
- ``P-router-admin``: the Secret holding the pool's Admin token, which the router pods
  mount and require of every Admin call (derived from the operator's key:
  :func:`vertumnus.admintoken.pool_token`);
- with ``redis.mode: managed``: ``P-redis`` Secret (a generated password, created once,
  never rewritten), Deployment and Service.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from vertumnus.core.lattice import Layout, Slot
from vertumnus.operator import sglang_pod
from vertumnus.operator.crd import API_VERSION, KIND, PoolSpec
from vertumnus.operator.gang import GangBackend

__all__ = [
    "ANN_DEGREES",
    "ANN_EPOCH",
    "ANN_GROUPING",
    "ANN_MERGE",
    "ANN_ROUTER_ADDRESSES",
    "ANN_ROUTER_CONFIG_HASH",
    "ANN_SPLIT",
    "ANN_SPEC_HASH",
    "GPU_RESOURCE",
    "LABEL_COMPONENT",
    "LABEL_DOMAIN",
    "LABEL_POOL",
    "Owner",
    "admin_secret",
    "admin_secret_name",
    "configmap",
    "domain_pod",
    "domains_pdb",
    "engine_labels",
    "engines_service",
    "gang_group",
    "format_grouping",
    "parse_grouping",
    "pod_name",
    "redis_objects",
    "router_args",
    "router_config",
    "router_deployment",
    "router_labels",
    "router_pdb",
    "router_service",
]

GPU_RESOURCE = "nvidia.com/gpu"
LABEL_POOL = "vertumnus.io/pool"
LABEL_DOMAIN = "vertumnus.io/domain"
LABEL_COMPONENT = "app.kubernetes.io/component"
ANN_EPOCH = "vertumnus.io/epoch"
ANN_GROUPING = "vertumnus.io/grouping"
ANN_DEGREES = "vertumnus.io/degrees"
ANN_WORKERS = "vertumnus.io/workers"
"""The grouping's pool-level worker ids, left to right (with the degrees: what a
(re)started engine serves, so its workers keep the ids the routers and the status know)."""
ANN_SPEC_HASH = "vertumnus.io/pod-spec-hash"
ANN_ROUTER_ADDRESSES = "vertumnus.io/router-addresses"
"""On a CPPool: the router replicas' Admin addresses (``host:port,...``), instead of the
router Service's endpoints (for a router outside the cluster, or the e2e's stand-in)."""

ANN_SPLIT = "vertumnus.io/split"
"""On a CPPool: split this worker now (``"7"``); removed once the transition has begun."""
ANN_MERGE = "vertumnus.io/merge"
"""On a CPPool: merge these two buddies now (``"3,4"``)."""

PODINFO = "/etc/vertumnus/pod"
ROUTER_CONFIG = "/etc/vertumnus/router"
ROUTER_CONFIG_FILE = f"{ROUTER_CONFIG}/router.json"
"""Where the router pod reads :func:`router_config` (``vertumnus router --config``)."""
ROUTER_ADMIN = "/etc/vertumnus/admin"
ROUTER_ADMIN_TOKEN = f"{ROUTER_ADMIN}/token"
"""Where the router pod mounts its pool's Admin token (the Secret ``P-router-admin``), and
beside it the Admin port's certificate and key, when the operator issued them."""
ROUTER_TLS = "/etc/vertumnus/tls"
"""Where the router pod mounts ``spec.router.tls.secretName`` (the public port's
certificate)."""
ROUTER_PRESTOP_S = 5
"""Seconds a router pod being deleted keeps serving before its SIGTERM (endpoints
propagate meanwhile)."""
ANN_ROUTER_CONFIG_HASH = "vertumnus.io/router-config-hash"
"""On the router's pod template: a digest of ``router.json``, so that a spec change that
changes it rolls the router (a running router reads the file only at start)."""


class Owner:
    """The CPPool that owns the rendered objects."""

    def __init__(self, name: str, namespace: str, uid: str) -> None:
        self.name = name
        self.namespace = namespace
        self.uid = uid

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
        }

    def labels(self, component: str) -> dict[str, str]:
        return {
            "app.kubernetes.io/name": "vertumnus",
            "app.kubernetes.io/instance": self.name,
            "app.kubernetes.io/managed-by": "vertumnus-operator",
            LABEL_COMPONENT: component,
            LABEL_POOL: self.name,
        }

    def meta(self, name: str, component: str, **extra_labels: str) -> dict[str, Any]:
        return {
            "name": name,
            "namespace": self.namespace,
            "labels": {**self.labels(component), **extra_labels},
            "ownerReferences": [self.reference()],
        }


def pod_name(pool: str, domain: int) -> str:
    return f"{pool}-d{domain}"


def format_grouping(slots: Sequence[Slot]) -> str:
    """``0:CP4@0,1:CP4@4``: worker id, degree and first rank of each worker of a domain."""
    return ",".join(
        f"{s.worker}:CP{s.degree}@{s.offset}" for s in sorted(slots, key=lambda s: s.offset)
    )


def parse_grouping(text: str, domain: int) -> tuple[Slot, ...]:
    """The inverse of :func:`format_grouping` (ValueError naming the bad term)."""
    out = []
    for term in filter(None, text.split(",")):
        try:
            wid, rest = term.split(":")
            deg, off = rest.removeprefix("CP").split("@")
            out.append(Slot(int(wid), int(deg), domain, int(off)))
        except ValueError:
            raise ValueError(
                f"bad grouping term {term!r} in {text!r}; expected WORKER:CPDEGREE@OFFSET"
            ) from None
    return tuple(out)


def _degrees(slots: Sequence[Slot]) -> str:
    return ",".join(str(s.degree) for s in sorted(slots, key=lambda s: s.offset))


def _workers(slots: Sequence[Slot]) -> str:
    return ",".join(str(s.worker) for s in sorted(slots, key=lambda s: s.offset))


def grouping_annotations(slots: Sequence[Slot], epoch: int) -> dict[str, str]:
    return {
        ANN_EPOCH: str(epoch),
        ANN_GROUPING: format_grouping(slots),
        ANN_DEGREES: _degrees(slots),
        ANN_WORKERS: _workers(slots),
    }


def _engine_command(spec: PoolSpec) -> list[str]:
    e = spec.engine
    args = [
        "vertumnus",
        "serve",
        "--ranks",
        str(spec.gpus_per_domain),
        "--degrees",
        f'"$(cat {PODINFO}/degrees)"',
        "--worker-ids",
        f'"$(cat {PODINFO}/workers)"',
        "--host",
        "0.0.0.0",
        "--base-port",
        str(e.base_port),
        "--block-size",
        str(e.block_size),
        "--dtype",
        e.dtype,
        "--max-tokens",
        str(e.max_tokens),
        "--device",
        "cuda",
    ]
    if spec.model.path:
        args += ["--model", shlex.quote(spec.model.path)]
    # A shell reads the grouping in force at (re)start from the downward-API file.
    return ["sh", "-c", "exec " + " ".join(args)]


def _torch_container(spec: PoolSpec) -> dict[str, Any]:
    return {
        "name": "engine",
        "image": spec.engine.image,
        "command": _engine_command(spec),
        "env": [],
        "ports": [
            {"name": f"rank-{r}", "containerPort": spec.engine.base_port + r}
            for r in range(spec.gpus_per_domain)
        ],
        "resources": {"limits": {GPU_RESOURCE: str(spec.gpus_per_domain)}},
        "volumeMounts": [],
    }


def _model_volume(spec: PoolSpec) -> dict[str, Any] | None:
    """``model.volume``, if set: a hostPath or a PVC, mounted read-only at ``model.path``."""
    m = spec.model
    if m.host_path:
        return {"name": "model", "hostPath": {"path": m.host_path, "type": "Directory"}}
    if m.claim_name:
        return {
            "name": "model",
            "persistentVolumeClaim": {"claimName": m.claim_name, "readOnly": True},
        }
    return None


def pod_spec(spec: PoolSpec, owner: Owner, domain: int, gang: GangBackend) -> dict[str, Any]:
    """The domain pod's ``spec`` (everything that cannot change without a new pod)."""
    gang_spec, _ = gang.pod_fields(owner.name)
    sched = spec.scheduling
    sglang = spec.engine.kind == "sglang"
    engine = sglang_pod.container(spec, PODINFO) if sglang else _torch_container(spec)
    engine["env"] = [
        {"name": "VERTUMNUS_POOL", "value": owner.name},
        {"name": "VERTUMNUS_DOMAIN", "value": str(domain)},
        *engine["env"],
    ]
    engine["volumeMounts"] = [
        {"name": "podinfo", "mountPath": PODINFO, "readOnly": True},
        *engine["volumeMounts"],
    ]
    extra_volumes = sglang_pod.volumes(spec) if sglang else []
    model_volume = _model_volume(spec)
    if model_volume is not None:
        engine["volumeMounts"].append(
            {"name": "model", "mountPath": spec.model.path, "readOnly": True}
        )
        extra_volumes.append(model_volume)
    body: dict[str, Any] = {
        "hostname": pod_name(owner.name, domain),
        "subdomain": f"{owner.name}-engines",
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "containers": [engine],
        "volumes": [
            {
                "name": "podinfo",
                "downwardAPI": {
                    "items": [
                        {
                            "path": "degrees",
                            "fieldRef": {"fieldPath": f"metadata.annotations['{ANN_DEGREES}']"},
                        },
                        {
                            "path": "workers",
                            "fieldRef": {"fieldPath": f"metadata.annotations['{ANN_WORKERS}']"},
                        },
                        {
                            "path": "epoch",
                            "fieldRef": {"fieldPath": f"metadata.annotations['{ANN_EPOCH}']"},
                        },
                    ]
                },
            },
            *extra_volumes,
        ],
        **gang_spec,
    }
    if sched.node_selector:
        body["nodeSelector"] = dict(sched.node_selector)
    if sched.tolerations:
        body["tolerations"] = [dict(t) for t in sched.tolerations]
    if sched.priority_class_name:
        body["priorityClassName"] = sched.priority_class_name
    return body


def spec_hash(pod_spec_body: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(pod_spec_body, sort_keys=True).encode()).hexdigest()[:16]


def domain_pod(
    spec: PoolSpec, owner: Owner, domain: int, slots: Sequence[Slot], epoch: int, gang: GangBackend
) -> dict[str, Any]:
    body = pod_spec(spec, owner, domain, gang)
    _, gang_annotations = gang.pod_fields(owner.name)
    meta = owner.meta(pod_name(owner.name, domain), "engine", **{LABEL_DOMAIN: str(domain)})
    meta["annotations"] = {
        **grouping_annotations(slots, epoch),
        ANN_SPEC_HASH: spec_hash(body),
        **gang_annotations,
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}


def gang_group(spec: PoolSpec, owner: Owner, gang: GangBackend) -> dict[str, Any] | None:
    """The pool's gang group object (one member per NVLink domain), owned by the CPPool;
    None for a backend without one."""
    group = gang.group(
        owner.name, owner.namespace, spec.domains, spec.gpus, GPU_RESOURCE, owner.labels("gang")
    )
    if group is not None:
        group["metadata"]["ownerReferences"] = [owner.reference()]
    return group


def engine_labels(owner: Owner) -> dict[str, str]:
    """The labels that select the pool's domain pods (its Service, its disruption budget)."""
    return {LABEL_POOL: owner.name, LABEL_COMPONENT: "engine"}


def router_labels(owner: Owner) -> dict[str, str]:
    """The labels that select the pool's router pods (their Deployment, Service, spread
    and disruption budget)."""
    return {LABEL_POOL: owner.name, LABEL_COMPONENT: "router"}


def engines_service(owner: Owner, spec: PoolSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": owner.meta(f"{owner.name}-engines", "engine"),
        "spec": {
            "clusterIP": "None",
            # The router dials engines by DNS name before they report Ready (it probes them).
            "publishNotReadyAddresses": True,
            "selector": engine_labels(owner),
            "ports": [{"name": "rank-0", "port": spec.engine.base_port}],
        },
    }


def domains_pdb(owner: Owner, spec: PoolSpec) -> dict[str, Any]:
    """A PodDisruptionBudget over the domain pods: evictions (``kubectl drain`` of GPU
    nodes, a node-pool upgrade) take at most ``updateStrategy.rollingUpdate.maxUnavailable``
    domains at once, as many as a rolling update does. The operator's own deletions (a
    rolling update) are not evictions and do not consult it.

    Why ``minAvailable`` (the domains less that) and not ``maxUnavailable``: with
    ``maxUnavailable`` the disruption controller asks the pods' controller for its scale,
    and a CPPool has no scale subresource, so it would allow no eviction at all."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": owner.meta(f"{owner.name}-domains", "engine"),
        "spec": {
            "minAvailable": max(0, spec.domains - spec.update_strategy.max_unavailable),
            "selector": {"matchLabels": engine_labels(owner)},
        },
    }


def router_pdb(owner: Owner) -> dict[str, Any]:
    """A PodDisruptionBudget over the router replicas: a node drain evicts one at a time,
    so with two or more replicas the pool always has a router (each evicted one answers
    what it holds first, as on any deletion). One replica may be evicted too: a budget
    that refused it would block the node's drain for good."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": owner.meta(f"{owner.name}-router", "router"),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": router_labels(owner)}},
    }


def router_config(spec: PoolSpec, owner: Owner, admin_tls: bool = False) -> dict[str, Any]:
    """What the router reads at start (``router.json``); ``admin_tls``: the Admin port
    serves TLS with the certificate in the pool's Secret."""
    redis: dict[str, Any] = {"mode": spec.redis.mode}
    url = redis_url(spec, owner)
    if url:
        redis["url"] = url
    if _redis_env(spec, owner):
        redis["passwordEnv"] = REDIS_PASSWORD_ENV
    c, k, p = spec.controller, spec.cache_manager, spec.placement
    return {
        "pool": owner.name,
        "namespace": owner.namespace,
        "port": spec.router.port,
        "adminPort": spec.router.admin_port,
        "adminTokenFile": ROUTER_ADMIN_TOKEN,
        **(
            {
                "adminTlsCertFile": f"{ROUTER_ADMIN}/tls.crt",
                "adminTlsKeyFile": f"{ROUTER_ADMIN}/tls.key",
            }
            if admin_tls
            else {}
        ),
        **(
            {
                "tlsCertFile": f"{ROUTER_TLS}/tls.crt",
                "tlsKeyFile": f"{ROUTER_TLS}/tls.key",
                "healthPort": spec.router.health_port,
            }
            if spec.router.tls_secret
            else {}
        ),
        "metricsPort": spec.router.metrics_port,
        "admissionLimit": spec.router.admission_limit,
        "model": {"name": spec.model.name, "path": spec.model.path, "profile": spec.model.profile},
        "engine": {
            "kind": spec.engine.kind,
            "blockSize": spec.engine.block_size,
            "maxTokens": spec.engine.max_tokens,
        },
        "placement": {"beta": p.beta, "betaBusy": p.beta_busy, "lambda": p.lam},
        "cacheManager": {
            "enabled": k.enabled,
            "thetaInter": k.theta_inter,
            "thetaIntra": k.theta_intra,
            "thetaReclaim": k.theta_reclaim,
            "decay": k.decay,
            "scanIntervalSeconds": k.scan_interval_seconds,
        },
        # The operator runs the composition controller and calls Admin.Switch; the
        # router only reports windows (Admin.TakeWindow) and executes switches.
        "controller": {"external": True, "windowSeconds": c.window_seconds, "hopSeconds": c.hop},
        "redis": redis,
        "domainSize": spec.gpus_per_domain,
        "engines": [
            {
                "domain": d,
                "pod": pod_name(owner.name, d),
                "host": f"{pod_name(owner.name, d)}.{owner.name}-engines.{owner.namespace}.svc",
                "basePort": spec.engine.base_port,
            }
            for d in range(spec.domains)
        ],
    }


def layout_document(layout: Layout, epoch: int) -> dict[str, Any]:
    """``layout.json``: the grouping in force, for a router that (re)starts."""
    return {
        "epoch": epoch,
        "domainSize": layout.domain_size,
        "workers": [
            {"worker": s.worker, "degree": s.degree, "domain": s.domain, "offset": s.offset}
            for s in layout.slots
        ],
    }


def configmap(
    spec: PoolSpec, owner: Owner, layout: Layout, epoch: int, admin_tls: bool = False
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": owner.meta(f"{owner.name}-router", "router"),
        "data": {
            "router.json": json.dumps(
                router_config(spec, owner, admin_tls), indent=2, sort_keys=True
            ),
            "layout.json": json.dumps(layout_document(layout, epoch), indent=2, sort_keys=True),
        },
    }


REDIS_PASSWORD_ENV = "VERTUMNUS_REDIS_PASSWORD"
REDIS_CONF_DIR = "/etc/vertumnus-redis"
REDIS_UID = 999
"""The ``redis`` user of the official Redis images (Debian and Alpine alike)."""
"""Where the router (and the managed Redis) read the password (never a flag)."""


def redis_conf_script(conf: str) -> str:
    """The managed Redis's init container: write ``conf`` with the Secret's password, for
    the redis user alone (the operator's passwords are URL-safe: nothing to quote)."""
    return f'umask 077 && printf "requirepass %s\\n" "${REDIS_PASSWORD_ENV}" > {conf}'


def _redis_env(spec: PoolSpec, owner: Owner) -> list[dict[str, Any]]:
    if spec.redis.mode == "managed":
        ref = {"name": f"{owner.name}-redis", "key": "password"}
    elif spec.redis.mode == "external" and spec.redis.secret_name:
        ref = {"name": spec.redis.secret_name, "key": spec.redis.secret_key}
    else:
        return []
    return [{"name": REDIS_PASSWORD_ENV, "valueFrom": {"secretKeyRef": ref}}]


def redis_url(spec: PoolSpec, owner: Owner) -> str | None:
    if spec.redis.mode == "managed":
        return f"redis://{owner.name}-redis.{owner.namespace}.svc:6379/0"
    if spec.redis.mode == "external":
        return spec.redis.url
    return None


def router_args(spec: PoolSpec, owner: Owner) -> list[str]:
    """``vertumnus router`` (router/cli.py) for this pool: everything in ``router.json``
    (engines, ports, profile, admission limit, placement, cache manager, Redis: see
    :func:`router_config`), mounted from the ConfigMap, and the replica's name, which only
    the pod knows. The operator runs the transitions, so no ``--controller``; the Redis
    password is in the environment (``VERTUMNUS_REDIS_PASSWORD``), never here. A router
    shutting down waits for the requests in flight as long as a drain waits for a running
    prefill (``controller.drainTimeoutSeconds``)."""
    return [
        "vertumnus", "router", "--config", ROUTER_CONFIG_FILE, "--router-id", "$(POD_NAME)",
        "--shutdown-grace", str(spec.controller.drain_timeout_seconds),
    ]  # fmt: skip


def router_config_hash(spec: PoolSpec, owner: Owner, admin_tls: bool = False) -> str:
    """A digest of ``router.json`` (not ``layout.json``: an epoch switch must not restart
    the router, which learns the grouping from the engines)."""
    return spec_hash(router_config(spec, owner, admin_tls))


def router_deployment(spec: PoolSpec, owner: Owner, admin_tls: bool = False) -> dict[str, Any]:
    labels = owner.labels("router")
    r = spec.router
    pod: dict[str, Any] = {
        "containers": [
            {
                "name": "router",
                "image": r.image,
                "args": router_args(spec, owner),
                "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    *_redis_env(spec, owner),
                ],
                "ports": [
                    {"name": "grpc", "containerPort": r.port},
                    {"name": "admin", "containerPort": r.admin_port},
                    {"name": "metrics", "containerPort": r.metrics_port},
                    *([{"name": "health", "containerPort": r.health_port}] if r.tls_secret else []),
                ],
                # The kubelet's gRPC probe speaks no TLS: a TLS public port is probed on
                # the plaintext health port, which serves nothing else.
                "readinessProbe": {
                    "grpc": {"port": r.health_port if r.tls_secret else r.port},
                    "periodSeconds": 5,
                },
                # On deletion (a rollout of the router, a drained node): a few seconds
                # for the Service to stop sending new connections, then SIGTERM, on
                # which the router answers what it holds within its shutdown grace.
                "lifecycle": {"preStop": {"sleep": {"seconds": ROUTER_PRESTOP_S}}},
                # router.json: the pool's settings, which the router reads at start
                # (--config); layout.json: the grouping in force.
                # admin: the token every Admin call must carry, read again when the
                # kubelet updates the Secret.
                "volumeMounts": [
                    {"name": "config", "mountPath": ROUTER_CONFIG, "readOnly": True},
                    {"name": "admin", "mountPath": ROUTER_ADMIN, "readOnly": True},
                    *(
                        [{"name": "tls", "mountPath": ROUTER_TLS, "readOnly": True}]
                        if r.tls_secret
                        else []
                    ),
                ],
            }
        ],
        "volumes": [
            {"name": "config", "configMap": {"name": f"{owner.name}-router"}},
            {
                "name": "admin",
                # Every key: the token, and the certificate when the operator issues one.
                "secret": {"secretName": admin_secret_name(owner)},
            },
            *([{"name": "tls", "secret": {"secretName": r.tls_secret}}] if r.tls_secret else []),
        ],
        "terminationGracePeriodSeconds": (
            ROUTER_PRESTOP_S + spec.controller.drain_timeout_seconds + 10
        ),
    }
    if r.node_selector:
        pod["nodeSelector"] = dict(r.node_selector)
    if r.tolerations:
        pod["tolerations"] = [dict(t) for t in r.tolerations]
    # Replicas on different nodes where the scheduler can (a node lost takes one), never
    # left unscheduled for it.
    pod["topologySpreadConstraints"] = [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": router_labels(owner)},
        }
    ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": owner.meta(f"{owner.name}-router", "router"),
        "spec": {
            "replicas": r.replicas,
            # A rollout (a new router.json) starts each new replica before an old one
            # stops: the pool never has fewer routers than it asked for.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "selector": {"matchLabels": router_labels(owner)},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        ANN_ROUTER_CONFIG_HASH: router_config_hash(spec, owner, admin_tls)
                    },
                },
                "spec": pod,
            },
        },
    }


def router_service(spec: PoolSpec, owner: Owner) -> dict[str, Any]:
    r = spec.router
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": owner.meta(f"{owner.name}-router", "router"),
        "spec": {
            "selector": router_labels(owner),
            "ports": [
                {"name": "grpc", "port": r.port, "targetPort": "grpc"},
                # The operator dials each ready pod's Admin port through this Service's
                # EndpointSlices; clients need only grpc.
                {"name": "admin", "port": r.admin_port, "targetPort": "admin"},
                {"name": "metrics", "port": r.metrics_port, "targetPort": "metrics"},
            ],
        },
    }


def redis_objects(spec: PoolSpec, owner: Owner) -> list[dict[str, Any]]:
    """Deployment and Service of a managed Redis (its Secret is :func:`redis_secret`)."""
    if spec.redis.mode != "managed":
        return []
    name = f"{owner.name}-redis"
    conf = f"{REDIS_CONF_DIR}/redis.conf"
    pod: dict[str, Any] = {
        # The password goes into a config file on a memory volume, readable by the redis
        # user alone, not onto redis-server's command line (which anyone who can list the
        # pod's processes reads).
        "initContainers": [
            {
                "name": "config",
                "image": spec.redis.image,
                "command": ["sh", "-c", redis_conf_script(conf)],
                "env": _redis_env(spec, owner),
                "securityContext": {"runAsUser": REDIS_UID, "runAsNonRoot": True},
                "volumeMounts": [{"name": "config", "mountPath": REDIS_CONF_DIR}],
            }
        ],
        "containers": [
            {
                "name": "redis",
                "image": spec.redis.image,
                # An index cache: the router rebuilds it from the engines, so no persistence.
                "args": ["redis-server", conf, "--save", "", "--appendonly", "no"],
                "securityContext": {"runAsUser": REDIS_UID, "runAsNonRoot": True},
                "ports": [{"name": "redis", "containerPort": 6379}],
                "readinessProbe": {"tcpSocket": {"port": 6379}, "periodSeconds": 5},
                "volumeMounts": [{"name": "config", "mountPath": REDIS_CONF_DIR, "readOnly": True}],
            }
        ],
        "volumes": [{"name": "config", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}],
    }
    if spec.router.node_selector:
        pod["nodeSelector"] = dict(spec.router.node_selector)
    if spec.router.tolerations:
        pod["tolerations"] = [dict(t) for t in spec.router.tolerations]
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": owner.meta(name, "redis"),
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {LABEL_POOL: owner.name, LABEL_COMPONENT: "redis"}},
                "template": {"metadata": {"labels": owner.labels("redis")}, "spec": pod},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": owner.meta(name, "redis"),
            "spec": {
                "selector": {LABEL_POOL: owner.name, LABEL_COMPONENT: "redis"},
                "ports": [{"name": "redis", "port": 6379, "targetPort": "redis"}],
            },
        },
    ]


def admin_secret_name(owner: Owner) -> str:
    return f"{owner.name}-router-admin"


def admin_secret(
    owner: Owner, token: str, tls: tuple[bytes, bytes] | None = None
) -> dict[str, Any]:
    """The pool's Admin token (:mod:`vertumnus.admintoken`) and, with ``tls`` (certificate,
    key: PEM), the certificate the operator issued its routers (:mod:`vertumnus.admintls`),
    which its router pods mount. Applied like the pool's other objects: a Secret edited by
    hand is set back at the next full re-apply (within a minute), so that the routers hold
    what the operator sends and verifies."""
    data = {"token": token.encode()}
    if tls is not None:
        data["tls.crt"], data["tls.key"] = tls
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": owner.meta(admin_secret_name(owner), "router"),
        "type": "Opaque",
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


def redis_secret(owner: Owner, password: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": owner.meta(f"{owner.name}-redis", "redis"),
        "type": "Opaque",
        "stringData": {"password": password},
    }
