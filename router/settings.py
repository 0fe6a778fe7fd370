"""The router's settings: one frozen dataclass, a docstring per field, checked on construction.

Every number the router uses that is not a placement or cache-manager
parameter of the core lives here, with its default and the reason for it.
The command line (``vertumnus router``, ``vertumnus up``) and the operator's
ConfigMap both end up as one of these.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vertumnus.core.cachesettings import CacheManagerSettings
from vertumnus.core.placement import PlacementParams
from vertumnus.core.planner import PlannerSettings

__all__ = ["RouterSettings"]


@dataclass(frozen=True)
class RouterSettings:
    """How one router replica serves its pool."""

    listen: str = "127.0.0.1:50050"
    """host:port of the public API (Prefill, health, reflection; Admin too unless
    ``admin_listen`` gives it a port of its own)."""
    admin_listen: str = ""
    """host:port of the Admin API on a port of its own (empty: Admin is served on
    ``listen`` beside Prefill). Admin drains workers and regroups engines: a
    deployment gives it its own port, so that a NetworkPolicy lets every client reach
    Prefill and only the operator reach Admin (the operator's router pods do)."""
    admin_token_file: str = ""
    """A file whose first line is the token every Admin call must carry (metadata
    ``authorization: Bearer <token>``; :mod:`vertumnus.router.adminauth`), read again
    when it changes. Empty: Admin needs no token (a router on the loopback, or one
    whose admin port only a NetworkPolicy guards)."""
    admin_tls_cert_file: str = ""
    admin_tls_key_file: str = ""
    """A certificate (chain) and its key, PEM: the Admin port serves TLS with them, read
    again when they change (:class:`vertumnus.router.certfiles.CertFiles`). Both or
    neither, and only with ``admin_listen``. In an operator's pool, the certificate the
    operator issues the pool's routers (:mod:`vertumnus.admintls`)."""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    """A certificate (chain) and its key, PEM: the public port (``listen``: Prefill, health,
    reflection, and Admin when it has no port of its own) serves TLS with them, read again
    when they change. Both or neither. In an operator's pool, the Secret
    ``spec.router.tls.secretName`` names (e.g. cert-manager's)."""
    health_listen: str = ""
    """host:port of a plaintext port that serves only gRPC health (empty: none): the
    kubelet's gRPC probe speaks no TLS, so a router whose public port serves TLS is probed
    here."""
    metrics_listen: str = "127.0.0.1:9464"
    """host:port of the Prometheus ``/metrics`` endpoint (empty: none)."""
    pool: str = "local"
    """The pool's name: part of the prefix index's namespace."""
    profile: str = "cpu-tiny"
    """The prefill-time profile placement predicts with (bundled name or .json path)."""
    placement: PlacementParams = field(default_factory=PlacementParams)
    cache_manager: CacheManagerSettings | None = field(default_factory=CacheManagerSettings)
    """The global prefix-cache manager's settings (None: no manager)."""
    controller: PlannerSettings | None = None
    """The composition controller, when this router runs one itself (``vertumnus
    up``); None: the composition changes only when asked (Admin.Reconfigure), or
    through ``external_controller``."""
    long_threshold: int = PlannerSettings().long_threshold
    """Without a controller of its own: a request longer than this many tokens counts
    as long in the windows the router reports (the operator's controller reads the
    long share from them). A local controller counts with its own ``long_threshold``."""
    report_requests: int = 65536
    """Without a controller of its own: the most first placements one hop's window
    report lists one by one (arrival, length, cached tokens, block keys), for the
    operator's what-if check; beyond it they are only counted, and the operator
    skips the check of a window with a hop that was cut. 0: none listed."""
    external_controller: bool = False
    """An external controller (the operator) runs this pool's transitions, step by
    step through Admin.Drain and Admin.Switch; Admin.Reconfigure is then refused
    (the operator records each step in the CPPool's status, and a split the router
    made behind its back would contradict it). False: the router carries out
    splits and merges itself, on Admin.Reconfigure or from ``controller``."""
    admission_limit: int = 1024
    """Requests accepted and not finished, at most; beyond it RESOURCE_EXHAUSTED.
    Bounds the router's memory and the wait of what it accepted."""
    request_timeout_s: float = 120.0
    """Longest a request may take when its client set no deadline."""
    attempt_timeout_factor: float = 20.0
    """One attempt at a worker is given this multiple of its predicted service
    time (plus ``attempt_timeout_floor_s``) before the router gives up on that
    worker and places the request again: a stuck worker costs a bounded delay."""
    attempt_timeout_floor_s: float = 10.0
    forward_ahead: bool = True
    """Forward a worker's next request while it still runs one, so that it waits
    at the worker and starts there at once: without it the worker idles for a
    router round trip between requests (on the tiny CPU model, a fifth of its
    time). The placement does not change: the request was placed there already."""
    max_attempts: int = 3
    """Placements of one request (the first and the ones after worker failures)."""
    switch_timeout_s: float = 60.0
    """Seconds an engine has to regroup its workers on an ``Epoch`` (a split's or a
    merge's switch). The torch engine regroups its process groups in seconds; an
    SGLang engine restarts the changed servers, which load the weights again from
    the node's disk: a router.json with ``engine.kind: sglang`` gets 900 s."""
    drain_timeout_s: float = 300.0
    """Longest a drain waits for the running prefill of a worker."""
    worker_retry_s: float = 0.5
    """How often an unreachable worker is probed again."""
    worker_forget_s: float = 10.0
    """A worker unreachable this long leaves the prefix index (its cache is gone
    or stale); it rejoins with a fresh snapshot when it answers again."""
    scan_interval_s: float | None = None
    """Seconds between cache-manager scans (None: the manager's own setting)."""
    share_load: bool = True
    """With a shared store, publish this replica's outstanding work per worker and
    count the other replicas' in placement, so that two replicas do not pile onto
    the same worker (off: each sees only its own requests; for measuring what
    sharing buys)."""
    load_share_interval_s: float = 0.05
    """How often replicas exchange their outstanding work through Redis."""
    store_retry_s: float = 1.0
    """How often a router that lost Redis tries it again."""
    index_source: str = "workers"
    """Where this replica's prefix index comes from: ``workers`` (it follows every
    worker's cache events, and writes them to the shared store if there is one) or
    ``store`` (it follows the shared store's change stream: a second replica)."""

    def __post_init__(self) -> None:
        optional = [n for n in ("admin_listen", "health_listen") if getattr(self, n)]
        for name in ["listen", *optional]:
            host, sep, port = getattr(self, name).rpartition(":")
            if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
                raise ValueError(
                    f"{name}: expected HOST:PORT with a port in 0..65535, got {getattr(self, name)!r}"
                )
        port = self.listen.rpartition(":")[2]
        if self.admin_listen and port != "0" and self.admin_listen.rpartition(":")[2] == port:
            raise ValueError(
                f"admin_listen: {self.admin_listen!r} has the public API's port ({self.listen!r}); "
                "leave it empty to serve Admin there"
            )
        ports = {n: getattr(self, n).rpartition(":")[2] for n in ["listen", *optional]}
        if self.health_listen and ports["health_listen"] != "0":
            for other in ("listen", "admin_listen"):
                if ports.get(other) == ports["health_listen"]:
                    raise ValueError(
                        f"health_listen: {self.health_listen!r} has the port of {other} "
                        f"({getattr(self, other)!r})"
                    )
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tls_cert_file and tls_key_file go together")
        if bool(self.admin_tls_cert_file) != bool(self.admin_tls_key_file):
            raise ValueError("admin_tls_cert_file and admin_tls_key_file go together")
        if self.admin_tls_cert_file and not self.admin_listen:
            raise ValueError(
                "admin TLS needs the Admin API on a port of its own (admin_listen); on the "
                "public port Admin takes that port's TLS (tls_cert_file)"
            )
        if self.admission_limit < 1:
            raise ValueError(f"admission_limit must be >= 1, got {self.admission_limit}")
        if self.report_requests < 0:
            raise ValueError(f"report_requests must be >= 0, got {self.report_requests}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        for name in (
            "request_timeout_s",
            "attempt_timeout_factor",
            "attempt_timeout_floor_s",
            "drain_timeout_s",
            "switch_timeout_s",
            "worker_retry_s",
            "worker_forget_s",
            "load_share_interval_s",
            "store_retry_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.index_source not in ("workers", "store"):
            raise ValueError(
                f"index_source must be 'workers' or 'store', got {self.index_source!r}"
            )
        if not self.pool or any(c in self.pool for c in "{}: \t\n"):
            raise ValueError(
                f"pool name {self.pool!r} must be non-empty without braces, colons or spaces"
            )
