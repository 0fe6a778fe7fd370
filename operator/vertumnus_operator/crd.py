"""The CPPool spec as the operator reads it: parsing, defaults, validation.

The API server already applies the CRD's defaults and CEL rules (``crds/cppool.yaml``),
so a stored CPPool is valid as far as its schema can tell. This module turns that
camelCase ``spec`` into typed settings (:class:`PoolSpec`) and checks what only the
operator can: the degrees against the prefill-time and capacity profiles, the planner's
own constraints. Every error names the field (``spec.controller.lower: ...``) the way the
API server does, so a condition or Event reads like an admission error.

The defaults here are the CRD's (``tests/operator/test_crd.py`` compares the two), so a
spec that did not pass through the API server (unit tests, ``--dry-run=client``) parses
the same way.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from vertumnus.core import planner
from vertumnus.core.lattice import enumerate_lattice, layout_for
from vertumnus.core.placement import PlacementParams
from vertumnus.core.types import Composition

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "CacheManagerSpec",
    "ControllerSpec",
    "EngineSpec",
    "GangSpec",
    "ModelSpec",
    "PlacementSpec",
    "PoolSpec",
    "RedisSpec",
    "RouterSpec",
    "SchedulingSpec",
    "SpecError",
    "UpdateStrategySpec",
    "parse_spec",
]

GROUP = "vertumnus.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "CPPool"
PLURAL = "cppools"

_POW2 = (1, 2, 4, 8, 16, 32, 64)

UPDATE_STRATEGIES = ("RollingUpdate", "OnDelete")
"""``spec.updateStrategy.type`` (:class:`UpdateStrategySpec`)."""


class SpecError(ValueError):
    """A spec the operator cannot run; ``field`` is the offending path (``spec.gpus``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class ModelSpec:
    name: str = "qwen3-30b-a3b"
    path: str = ""
    profile: str = "qwen3-30b-a3b/h200"
    host_path: str = ""
    """``model.volume.hostPath``: a node directory mounted read-only at ``path``."""
    claim_name: str = ""
    """``model.volume.claimName``: a PersistentVolumeClaim mounted read-only at ``path``."""


@dataclass(frozen=True)
class EngineSpec:
    image: str
    kind: str = "torch"
    block_size: int = 16
    dtype: str = "bfloat16"
    max_tokens: int = 131072
    base_port: int = 50051
    transfer_backend: str = "mooncake"
    """SGLang's KV transfer to the decode servers (``--disaggregation-transfer-backend``)."""
    rdma_resource: str = ""
    """A device-plugin resource with the pod's RDMA NICs (e.g. ``rdma/rdma_shared_device_a``);
    empty: none requested."""
    rdma_count: int = 1
    transfer_from: tuple[Mapping[str, Any], ...] | None = field(default=None, hash=False)
    """The decode servers that reach the engines for their KV (NetworkPolicyPeers, as in a
    NetworkPolicy's ``from``): the pool's engine policy lets them in on every port (SGLang's
    bootstrap and transfer ports). None: anyone may (engine.kind sglang); empty: none."""


PEER_KEYS = ("podSelector", "namespaceSelector", "ipBlock")
"""What a NetworkPolicyPeer holds (``spec.engine.transfer.from``)."""

RESOURCE_NAME = re.compile(
    r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
"""An extended resource name (what a device plugin advertises): DOMAIN/NAME."""
GPU = "nvidia.com/gpu"

TRANSFER_BACKENDS = ("mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp")
"""= vertumnus.worker.sglang.command.TRANSFER_BACKENDS (the operator does not import it)."""


@dataclass(frozen=True)
class PlacementSpec:
    beta: float = 1.0
    beta_busy: float = 10.0
    lam: float = 0.1


@dataclass(frozen=True)
class ControllerSpec:
    enabled: bool = True
    window_seconds: int = 20
    hop_seconds: int = 0
    upper: float = 0.9
    lower: float = 0.45
    merge_admit: float = 0.8
    persist_windows: int = 2
    drain_timeout_seconds: int = 60
    learn_capacity: bool = False
    whatif: bool = True
    checks_per_window: int = 8
    whatif_threads: int = 1
    whatif_rows: int = 350_000
    shadow: bool = True
    shadow_max_gpus: int = 1024
    shadow_memory_mib: int = 256
    damp_flaps: int = 2

    @property
    def hop(self) -> int:
        """Seconds between two of the rules' windows (``hopSeconds`` 0 means the window)."""
        return self.hop_seconds or self.window_seconds

    @property
    def check_hops(self) -> int:
        """Evaluations per window: ``checksPerWindow`` with the what-if check and disjoint
        windows (it looks between the rules' windows), else 1."""
        return self.checks_per_window if self.whatif and self.hop_seconds == 0 else 1


@dataclass(frozen=True)
class CacheManagerSpec:
    enabled: bool = True
    theta_inter: float = 0.03
    theta_intra: float = 5.0
    theta_reclaim: float = 1.0
    decay: float = 0.8
    scan_interval_seconds: float = 1.0


@dataclass(frozen=True)
class RouterSpec:
    replicas: int = 1
    image: str = "ghcr.io/vertumnus/vertumnus:0.1.0"
    port: int = 50050
    admin_port: int = 50060
    """The Admin API's own port: the operator dials it; a NetworkPolicy can keep clients,
    who need only ``port``, off it."""
    metrics_port: int = 9090
    admission_limit: int = 1024
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    admin_tls: bool = True
    """The routers serve Admin over TLS with a certificate the operator issues from its CA
    (:mod:`vertumnus.admintls`; an operator without a CA leaves it plaintext). False: a
    pool whose traffic a service mesh already encrypts, or whose stand-in router speaks
    plaintext."""
    tls_secret: str = ""
    """A ``kubernetes.io/tls`` Secret in the pool's namespace (``tls.crt``, ``tls.key``;
    e.g. cert-manager's): the routers serve the public port (Prefill) over TLS with it,
    and are probed on ``health_port``. Empty: plaintext."""
    health_port: int = 50070
    """With ``tls_secret``: the plaintext port with gRPC health alone, for the kubelet's
    probes (they speak no TLS)."""


DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
"""A Secret's name (RFC 1123 subdomain, at most 253 characters)."""


@dataclass(frozen=True)
class RedisSpec:
    mode: str = "managed"
    url: str = ""
    image: str = "redis:7.4-alpine"
    secret_name: str = ""
    secret_key: str = "password"


@dataclass(frozen=True)
class UpdateStrategySpec:
    type: str = "RollingUpdate"
    """How domain pods that run an older spec (a new engine image, engine settings,
    scheduling) are replaced: ``RollingUpdate``, by the operator, ``max_unavailable`` at
    a time, each after its workers are drained at the routers; ``OnDelete``, only when
    deleted by hand (StatefulSet's two strategies)."""
    max_unavailable: int = 1
    """``rollingUpdate.maxUnavailable``: domain pods replaced at once, at most."""
    partition: int = 0
    """``rollingUpdate.partition``: only domains at or above it are replaced (a canary);
    those below keep their older spec until it is lowered (StatefulSet's partition)."""


@dataclass(frozen=True)
class GangSpec:
    backend: str = "native"
    queue: str = "default"


@dataclass(frozen=True)
class SchedulingSpec:
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    priority_class_name: str = ""


@dataclass(frozen=True)
class PoolSpec:
    """A parsed, checked CPPool spec."""

    gpus: int
    engine: EngineSpec
    gpus_per_domain: int = 8
    degrees: tuple[int, ...] = (4, 8)
    composition: Composition | None = None
    """The pinned composition, if the spec fixes one."""
    model: ModelSpec = field(default_factory=ModelSpec)
    placement: PlacementSpec = field(default_factory=PlacementSpec)
    controller: ControllerSpec = field(default_factory=ControllerSpec)
    cache_manager: CacheManagerSpec = field(default_factory=CacheManagerSpec)
    router: RouterSpec = field(default_factory=RouterSpec)
    redis: RedisSpec = field(default_factory=RedisSpec)
    gang: GangSpec = field(default_factory=GangSpec)
    scheduling: SchedulingSpec = field(default_factory=SchedulingSpec)
    update_strategy: UpdateStrategySpec = field(default_factory=UpdateStrategySpec)

    @property
    def domains(self) -> int:
        """Pool pods: one per NVLink domain."""
        return self.gpus // self.gpus_per_domain

    def planner_settings(self) -> planner.PlannerSettings:
        c = self.controller
        return planner.PlannerSettings(
            window_s=float(c.window_seconds),
            hop_s=float(c.hop_seconds),
            # The operator reads the routers every window / check_hops (PlannerSettings.hop).
            check_hops=c.check_hops,
            upper=c.upper,
            lower=c.lower,
            merge_admit=c.merge_admit,
            persist_windows=c.persist_windows,
            learn_capacity=c.learn_capacity,
            whatif=c.whatif,
            whatif_threads=c.whatif_threads,
            whatif_rows=c.whatif_rows,
            shadow=c.shadow,
            shadow_max_gpus=c.shadow_max_gpus,
            shadow_memory_mib=c.shadow_memory_mib,
            damp_flaps=c.damp_flaps,
            domain_size=self.gpus_per_domain,
            degrees=self.degrees,
        )

    def placement_params(self) -> PlacementParams:
        p = self.placement
        return PlacementParams(beta=p.beta, lam=p.lam, beta_busy=p.beta_busy)

    def initial_composition(self) -> Composition:
        """The pinned composition, else the lattice point with the most large-degree
        workers (the planner's choice without a history, design.md section 4)."""
        if self.composition is not None:
            return self.composition
        lattice = enumerate_lattice(self.gpus, self.degrees, self.gpus_per_domain)
        return lattice[0]


# ---------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------


def _peers(raw: Any, path: str) -> tuple[Mapping[str, Any], ...]:
    """NetworkPolicyPeers: each a mapping of some of :data:`PEER_KEYS` (the API server
    checks the selectors when the policy is applied)."""
    if not isinstance(raw, list):
        raise SpecError(path, f"Invalid value: expected a list of peers, got {raw!r}")
    for i, peer in enumerate(raw):
        if not isinstance(peer, Mapping) or not peer or set(peer) - set(PEER_KEYS):
            raise SpecError(
                f"{path}[{i}]",
                f"Invalid value: {peer!r}: a NetworkPolicyPeer of {', '.join(PEER_KEYS)}",
            )
        for key, value in peer.items():
            if not isinstance(value, Mapping):
                raise SpecError(
                    f"{path}[{i}].{key}", f"Invalid value: expected an object, got {value!r}"
                )
    return tuple(dict(p) for p in raw)


def _obj(raw: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(f"{path}.{key}", f"must be an object, got {type(value).__name__}")
    return value


def _int(
    raw: Mapping[str, Any],
    key: str,
    path: str,
    default: int | None,
    lo: int | None = None,
    hi: int | None = None,
) -> int:
    value = raw.get(key, default)
    where = f"{path}.{key}"
    if value is None:
        raise SpecError(where, "Required value")
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise SpecError(where, f"must be an integer, got {value!r}")
    if lo is not None and value < lo:
        raise SpecError(where, f"must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise SpecError(where, f"must be <= {hi}, got {value}")
    return value


def _float(
    raw: Mapping[str, Any],
    key: str,
    path: str,
    default: float,
    lo: float | None = None,
    lo_open: bool = False,
    hi: float | None = None,
    hi_open: bool = False,
) -> float:
    value = raw.get(key, default)
    where = f"{path}.{key}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(where, f"must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise SpecError(where, f"must be finite, got {value}")
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise SpecError(where, f"must be {'>' if lo_open else '>='} {lo}, got {value}")
    if hi is not None and (value >= hi if hi_open else value > hi):
        raise SpecError(where, f"must be {'<' if hi_open else '<='} {hi}, got {value}")
    return value


def _str(
    raw: Mapping[str, Any],
    key: str,
    path: str,
    default: str,
    choices: tuple[str, ...] | None = None,
) -> str:
    value = raw.get(key, default)
    where = f"{path}.{key}"
    if not isinstance(value, str):
        raise SpecError(where, f"must be a string, got {value!r}")
    if choices is not None and value not in choices:
        raise SpecError(
            where, f"Unsupported value: {value!r}: supported values: {', '.join(choices)}"
        )
    return value


def _bool(raw: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise SpecError(f"{path}.{key}", f"must be true or false, got {value!r}")
    return value


def _selector(raw: Mapping[str, Any], key: str, path: str) -> dict[str, str]:
    value = _obj(raw, key, path)
    out = {}
    for k, v in value.items():
        if not isinstance(v, str):
            raise SpecError(f"{path}.{key}.{k}", f"must be a string, got {v!r}")
        out[str(k)] = v
    return out


def _tolerations(raw: Mapping[str, Any], key: str, path: str) -> tuple[Mapping[str, Any], ...]:
    value = raw.get(key) or []
    if not isinstance(value, list) or not all(isinstance(t, Mapping) for t in value):
        raise SpecError(f"{path}.{key}", "must be a list of tolerations (objects)")
    return tuple(dict(t) for t in value)


DEFAULT_ROUTER_IMAGE = "ghcr.io/vertumnus/vertumnus:0.1.0"
DEFAULT_REDIS_IMAGE = "redis:7.4-alpine"


def parse_spec(
    raw: Mapping[str, Any],
    capacity_degrees: tuple[int, ...] | None = None,
    *,
    router_image: str = DEFAULT_ROUTER_IMAGE,
    redis_image: str = DEFAULT_REDIS_IMAGE,
) -> PoolSpec:
    """Parse a CPPool ``spec`` (as stored: defaults applied, or not) into a :class:`PoolSpec`.

    ``capacity_degrees``: the degrees the capacity profile covers, if known; a degree
    outside it is refused (the controller could not weigh it). ``router_image`` and
    ``redis_image``: the installation's defaults for what the spec leaves unset (the
    chart's values, through the operator's environment). Raises :class:`SpecError`
    naming the field.
    """
    p = "spec"
    domain = _int(raw, "gpusPerDomain", p, 8)
    if domain not in _POW2:
        raise SpecError(
            f"{p}.gpusPerDomain",
            f"Unsupported value: {domain}: supported values: {', '.join(map(str, _POW2))}",
        )
    gpus = _int(raw, "gpus", p, None, 1, 4096)
    if gpus % domain:
        raise SpecError(
            f"{p}.gpus", f"gpus must be a multiple of gpusPerDomain ({gpus} % {domain} != 0)"
        )

    raw_degrees = raw.get("degrees", [4, 8])
    if not isinstance(raw_degrees, list) or not raw_degrees:
        raise SpecError(f"{p}.degrees", "must be a non-empty list of integers")
    degrees: list[int] = []
    for i, d in enumerate(raw_degrees):
        if isinstance(d, bool) or not isinstance(d, int) or d not in _POW2:
            raise SpecError(
                f"{p}.degrees[{i}]", f"Unsupported value: {d!r}: must be a power of two <= 64"
            )
        if domain % d:
            raise SpecError(
                f"{p}.degrees",
                f"every degree must divide gpusPerDomain ({d} does not divide {domain})",
            )
        if d in degrees:
            raise SpecError(f"{p}.degrees[{i}]", f"Duplicate value: {d}")
        degrees.append(d)
    if capacity_degrees is not None:
        missing = sorted(set(degrees) - set(capacity_degrees))
        if missing:
            raise SpecError(
                f"{p}.degrees",
                f"degrees {missing} are not in the capacity profile "
                f"(it covers {sorted(capacity_degrees)})",
            )
    deg = tuple(sorted(degrees))
    try:
        enumerate_lattice(gpus, deg, domain)
    except ValueError as e:
        raise SpecError(f"{p}.degrees", str(e)) from None

    composition = _composition(raw.get("composition"), gpus, deg, domain)

    m = _obj(raw, "model", p)
    model = _model(m, f"{p}.model")
    eng = _obj(raw, "engine", p)
    image = _str(eng, "image", f"{p}.engine", "")
    if not image:
        raise SpecError(f"{p}.engine.image", "Required value")
    tp = f"{p}.engine.transfer"
    transfer = _obj(eng, "transfer", f"{p}.engine")
    rdma = _obj(transfer, "rdma", tp)
    engine = EngineSpec(
        image=image,
        kind=_str(eng, "kind", f"{p}.engine", "torch", ("torch", "sglang")),
        block_size=_int(eng, "blockSize", f"{p}.engine", 16, 1, 4096),
        dtype=_str(eng, "dtype", f"{p}.engine", "bfloat16", ("float64", "float32", "bfloat16")),
        max_tokens=_int(eng, "maxTokens", f"{p}.engine", 131072, 1),
        base_port=_int(eng, "basePort", f"{p}.engine", 50051, 1024, 65000),
        transfer_backend=_str(transfer, "backend", tp, "mooncake", TRANSFER_BACKENDS),
        rdma_resource=_str(rdma, "resource", f"{tp}.rdma", ""),
        rdma_count=_int(rdma, "count", f"{tp}.rdma", 1, 1, 64),
    )
    if rdma and not engine.rdma_resource:
        raise SpecError(f"{tp}.rdma.resource", "Required value")
    if engine.rdma_resource and (
        not RESOURCE_NAME.fullmatch(engine.rdma_resource) or engine.rdma_resource == GPU
    ):
        raise SpecError(
            f"{tp}.rdma.resource",
            f"Invalid value: {engine.rdma_resource!r}: an extended resource of the cluster's "
            "RDMA device plugin, DOMAIN/NAME (e.g. rdma/rdma_shared_device_a), not nvidia.com/gpu",
        )
    if engine.rdma_resource and engine.kind != "sglang":
        raise SpecError(
            f"{tp}.rdma",
            "Forbidden: RDMA devices are for SGLang's KV transfer engine (engine.kind: sglang)",
        )
    if "from" in transfer:
        engine = replace(engine, transfer_from=_peers(transfer["from"], f"{tp}.from"))
        if engine.kind != "sglang":
            raise SpecError(
                f"{tp}.from",
                "Forbidden: decode servers fetch KV from SGLang engines only (engine.kind: sglang)",
            )
    if engine.kind == "sglang":
        # What an SGLang server cannot take (vertumnus.worker.sglang.command).
        if engine.dtype == "float64":
            raise SpecError(
                f"{p}.engine.dtype", "Unsupported value: 'float64': SGLang has no float64 dtype"
            )
        if not model.path:
            raise SpecError(
                f"{p}.model.path", "Required value: an SGLang engine loads the model at model.path"
            )
    pl = _obj(raw, "placement", p)
    placement = PlacementSpec(
        beta=_float(pl, "beta", f"{p}.placement", 1.0, lo=1.0),
        beta_busy=_float(pl, "betaBusy", f"{p}.placement", 10.0, lo=1.0),
        lam=_float(pl, "lambda", f"{p}.placement", 0.1, lo=0.0),
    )
    if placement.beta_busy < placement.beta:
        raise SpecError(f"{p}.placement.betaBusy", "betaBusy must be >= beta")

    c = _obj(raw, "controller", p)
    cp = f"{p}.controller"
    controller = ControllerSpec(
        enabled=_bool(c, "enabled", cp, True),
        window_seconds=_int(c, "windowSeconds", cp, 20, 1, 86400),
        hop_seconds=_int(c, "hopSeconds", cp, 0, 0, 86400),
        upper=_float(c, "upper", cp, 0.9, lo=0.0, lo_open=True),
        lower=_float(c, "lower", cp, 0.45, lo=0.0, lo_open=True),
        merge_admit=_float(c, "mergeAdmit", cp, 0.8, lo=0.0, lo_open=True),
        persist_windows=_int(c, "persistWindows", cp, 2, 1, 1000),
        drain_timeout_seconds=_int(c, "drainTimeoutSeconds", cp, 60, 1, 3600),
        learn_capacity=_bool(c, "learnCapacity", cp, False),
        whatif=_bool(c, "whatif", cp, True),
        checks_per_window=_int(c, "checksPerWindow", cp, 8, 1, 64),
        whatif_threads=_int(c, "whatifThreads", cp, 1, 1, 16),
        whatif_rows=_int(c, "whatifRows", cp, 350_000, 1, 1_000_000_000),
        shadow=_bool(c, "shadow", cp, True),
        shadow_max_gpus=_int(c, "shadowMaxGpus", cp, 1024, 0, 1_000_000),
        shadow_memory_mib=_int(c, "shadowMemoryMiB", cp, 256, 1, 1_048_576),
        damp_flaps=_int(c, "dampFlaps", cp, 2, 0, 100),
    )
    if not controller.lower < controller.upper:
        raise SpecError(f"{cp}.lower", "lower must be < upper")
    if controller.merge_admit > controller.upper:
        raise SpecError(f"{cp}.mergeAdmit", "mergeAdmit must be <= upper")
    h, w = controller.hop_seconds, controller.window_seconds
    if h and (h > w or w % h):
        raise SpecError(
            f"{cp}.hopSeconds", "hopSeconds must be 0 (= windowSeconds) or divide windowSeconds"
        )

    k = _obj(raw, "cacheManager", p)
    kp = f"{p}.cacheManager"
    cache = CacheManagerSpec(
        enabled=_bool(k, "enabled", kp, True),
        theta_inter=_float(k, "thetaInter", kp, 0.03, lo=0.0),
        theta_intra=_float(k, "thetaIntra", kp, 5.0, lo=0.0),
        theta_reclaim=_float(k, "thetaReclaim", kp, 1.0, lo=0.0),
        decay=_float(k, "decay", kp, 0.8, lo=0.0, lo_open=True, hi=1.0, hi_open=True),
        scan_interval_seconds=_float(k, "scanIntervalSeconds", kp, 1.0, lo=0.0, lo_open=True),
    )
    if not cache.theta_reclaim < cache.theta_intra:
        raise SpecError(f"{kp}.thetaReclaim", "thetaReclaim must be < thetaIntra")

    r = _obj(raw, "router", p)
    rp = f"{p}.router"
    router = RouterSpec(
        replicas=_int(r, "replicas", rp, 1, 1, 64),
        image=_str(r, "image", rp, "") or router_image,
        port=_int(r, "port", rp, 50050, 1, 65535),
        admin_port=_int(r, "adminPort", rp, 50060, 1, 65535),
        metrics_port=_int(r, "metricsPort", rp, 9090, 1, 65535),
        admission_limit=_int(r, "admissionLimit", rp, 1024, 1),
        node_selector=_selector(r, "nodeSelector", rp),
        tolerations=_tolerations(r, "tolerations", rp),
        admin_tls=_bool(r, "adminTLS", rp, True),
        tls_secret=_str(_obj(r, "tls", rp), "secretName", f"{rp}.tls", ""),
        health_port=_int(r, "healthPort", rp, 50070, 1, 65535),
    )
    if "tls" in r and not router.tls_secret:
        raise SpecError(f"{rp}.tls.secretName", "Required value")
    if router.tls_secret and (
        len(router.tls_secret) > 253 or not DNS_SUBDOMAIN.fullmatch(router.tls_secret)
    ):
        raise SpecError(
            f"{rp}.tls.secretName",
            f"Invalid value: {router.tls_secret!r}: a Secret's name (lower case letters, "
            "digits, '-' and '.')",
        )
    if router.tls_secret and router.health_port in (
        router.port,
        router.admin_port,
        router.metrics_port,
    ):
        raise SpecError(
            f"{rp}.healthPort",
            f"must differ from port, adminPort and metricsPort ({router.port}, "
            f"{router.admin_port}, {router.metrics_port})",
        )
    if router.port == router.metrics_port:
        raise SpecError(f"{rp}.metricsPort", f"must differ from port ({router.port})")
    if router.admin_port in (router.port, router.metrics_port):
        raise SpecError(
            f"{rp}.adminPort",
            f"must differ from port ({router.port}) and metricsPort ({router.metrics_port})",
        )

    rd = _obj(raw, "redis", p)
    dp = f"{p}.redis"
    secret = _obj(rd, "secretRef", dp)
    redis = RedisSpec(
        mode=_str(rd, "mode", dp, "managed", ("managed", "external", "none")),
        url=_str(rd, "url", dp, ""),
        image=_str(rd, "image", dp, "") or redis_image,
        secret_name=_str(secret, "name", f"{dp}.secretRef", ""),
        secret_key=_str(secret, "key", f"{dp}.secretRef", "password"),
    )
    if redis.mode == "external" and not redis.url:
        raise SpecError(
            f"{dp}.url", "Required value: mode external needs url (redis://host:port/db)"
        )
    if secret and not redis.secret_name:
        raise SpecError(f"{dp}.secretRef.name", "Required value")

    g = _obj(raw, "gang", p)
    gang = GangSpec(
        backend=_str(g, "backend", f"{p}.gang", "native", ("native", "volcano", "none")),
        queue=_str(g, "queue", f"{p}.gang", "default"),
    )
    s = _obj(raw, "scheduling", p)
    sp = f"{p}.scheduling"
    scheduling = SchedulingSpec(
        node_selector=_selector(s, "nodeSelector", sp),
        tolerations=_tolerations(s, "tolerations", sp),
        priority_class_name=_str(s, "priorityClassName", sp, ""),
    )
    u = _obj(raw, "updateStrategy", p)
    up = f"{p}.updateStrategy"
    ru = _obj(u, "rollingUpdate", up)
    update_strategy = UpdateStrategySpec(
        _str(u, "type", up, "RollingUpdate", UPDATE_STRATEGIES),
        _int(ru, "maxUnavailable", f"{up}.rollingUpdate", 1, 1, 4096),
        _int(ru, "partition", f"{up}.rollingUpdate", 0, 0, 4096),
    )
    spec = PoolSpec(
        gpus=gpus,
        engine=engine,
        gpus_per_domain=domain,
        degrees=deg,
        composition=composition,
        model=model,
        placement=placement,
        controller=controller,
        cache_manager=cache,
        router=router,
        redis=redis,
        gang=gang,
        scheduling=scheduling,
        update_strategy=update_strategy,
    )
    try:
        spec.planner_settings()
        spec.placement_params()
    except ValueError as err:  # the core's own checks, in case the schema lets one through
        raise SpecError(cp, str(err)) from None
    return spec


def _model(m: Mapping[str, Any], where: str) -> ModelSpec:
    vol = _obj(m, "volume", where)
    vp = f"{where}.volume"
    unknown = sorted(set(vol) - {"hostPath", "claimName"})
    if unknown:
        raise SpecError(f"{vp}.{unknown[0]}", "unknown field: a volume is hostPath or claimName")
    if vol and len(vol) != 1:
        raise SpecError(vp, "exactly one of hostPath, claimName")
    model = ModelSpec(
        name=_str(m, "name", where, "qwen3-30b-a3b"),
        path=_str(m, "path", where, ""),
        profile=_str(m, "profile", where, "qwen3-30b-a3b/h200"),
        host_path=_str(vol, "hostPath", vp, ""),
        claim_name=_str(vol, "claimName", vp, ""),
    )
    if "hostPath" in vol and not model.host_path:
        raise SpecError(f"{vp}.hostPath", "Required value")
    if "claimName" in vol and not model.claim_name:
        raise SpecError(f"{vp}.claimName", "Required value")
    if vol and not model.path.startswith("/"):
        raise SpecError(
            f"{where}.path",
            f"Required value: model.volume is mounted at model.path, which must be an absolute "
            f"path, got {model.path!r}",
        )
    return model


def _composition(raw: Any, gpus: int, degrees: tuple[int, ...], domain: int) -> Composition | None:
    where = "spec.composition"
    if raw is None or raw == []:
        return None
    if not isinstance(raw, list):
        raise SpecError(where, "must be a list of {count, degree}")
    out: list[int] = []
    for i, term in enumerate(raw):
        if not isinstance(term, Mapping):
            raise SpecError(f"{where}[{i}]", "must be an object {count, degree}")
        count = _int(term, "count", f"{where}[{i}]", None, 1, 4096)
        degree = _int(term, "degree", f"{where}[{i}]", None, 1, 64)
        if degree not in degrees:
            raise SpecError(
                f"{where}[{i}].degree", f"{degree} is not one of spec.degrees {list(degrees)}"
            )
        out.extend([degree] * count)
    comp = Composition(tuple(out))
    if comp.gpus != gpus:
        raise SpecError(
            where,
            f"the composition must use exactly the GPU budget: "
            f"{comp} uses {comp.gpus} GPUs, spec.gpus is {gpus}",
        )
    try:
        layout_for(comp, domain)
    except ValueError as e:
        raise SpecError(where, str(e)) from None
    return comp
