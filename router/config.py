"""``router.json``: the router's settings file, in the shape the operator writes it.

The operator renders each pool's ConfigMap ``<pool>-router`` with a ``router.json``
(``router_config`` in operator/vertumnus_operator/resources.py) and mounts it in the
router pod; ``vertumnus router --config PATH`` reads it, flags given on the command line
overriding it. The router may not import the operator (the layer contract,
tests/test_architecture.py), so the shape is spelled out here again, and
tests/router/test_config.py feeds the operator's own output through this parser: that
test is the contract between the two.

:func:`parse_router_config` is pure (the parsed JSON in, a :class:`RouterConfig` out);
:func:`load_router_config` reads the file. Every key is optional (a missing one keeps
:class:`~vertumnus.router.settings.RouterSettings`' default); an unknown key, a value of
the wrong type or out of range raises :class:`ConfigError`, whose message starts with
the key's path (``placement.beta must be >= 1, got 0.5``).

What the router reads:

- ``pool``: the pool's name (the prefix index's namespace);
- ``port``, ``adminPort``, ``metricsPort``: the public API (Prefill), the Admin API and
  ``/metrics`` listen on every interface at these ports (``0.0.0.0:PORT``: a Service
  reaches the pod from outside); without ``adminPort``, Admin is served on ``port``;
- ``adminTokenFile``: the file holding the token every Admin call must carry (the pool's
  Secret ``<pool>-router-admin``, mounted; :mod:`vertumnus.router.adminauth`);
  ``adminTlsCertFile``, ``adminTlsKeyFile``: the certificate and key the Admin port
  serves TLS with (the same Secret's, when the operator has a CA);
- ``tlsCertFile``, ``tlsKeyFile``: the certificate and key the public port serves TLS
  with (``spec.router.tls.secretName``'s, mounted); ``healthPort``: a plaintext port
  with gRPC health alone, for the kubelet's probes;
- ``admissionLimit``: requests accepted and not finished, at most;
- ``model.profile``: the prefill-time profile placement predicts with;
- ``placement.beta``, ``placement.betaBusy``, ``placement.lambda``: β, β_busy, λ
  (:class:`~vertumnus.core.placement.PlacementParams`);
- ``cacheManager.enabled`` (false: no cache manager), ``thetaInter``, ``thetaIntra``,
  ``thetaReclaim``, ``decay``, ``scanIntervalSeconds``
  (:class:`~vertumnus.core.cachesettings.CacheManagerSettings`);
- ``redis.mode`` (``managed`` or ``external``: ``url`` is required; ``none``: no Redis),
  ``redis.url`` (never with a password in it), ``redis.passwordEnv`` (the environment
  variable holding the password, instead of ``VERTUMNUS_REDIS_PASSWORD``);
- ``engines[].host`` and ``engines[].basePort``: rank 0's address of each domain's engine,
  ordered by ``engines[].domain`` (which must be 0, 1, ... once each);
- ``controller.external``: must be true. The operator runs the composition controller;
  a router that runs it itself is started with ``--controller`` instead.

Informational, type-checked and otherwise ignored: ``namespace``; ``model.name`` and
``model.path`` (the engines load the model); ``engine.kind``, ``engine.blockSize``,
``engine.maxTokens`` and ``domainSize`` (the router asks the engines for their block size,
capacity and world size when it discovers them); ``controller.windowSeconds`` and
``controller.hopSeconds`` (the operator's controller takes the windows at that period);
``engines[].pod``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from vertumnus.core.cachesettings import CacheManagerSettings
from vertumnus.core.placement import PlacementParams
from vertumnus.core.transition import SWITCH_TIMEOUT_S
from vertumnus.router.settings import RouterSettings

__all__ = ["ConfigError", "RouterConfig", "load_router_config", "parse_router_config"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ConfigError(ValueError):
    """A bad ``router.json``; ``key`` is the offending path (``placement.beta``)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key} {message}" if key else message)
        self.key = key


@dataclass(frozen=True)
class RouterConfig:
    """What ``vertumnus router`` runs with: its settings and what is not a setting."""

    settings: RouterSettings = field(default_factory=RouterSettings)
    engines: tuple[str, ...] = ()
    """Rank 0's ``host:port`` of each domain's engine, in domain order."""
    redis_url: str | None = None
    """The shared store (None: this replica's own index only)."""
    redis_password_env: str | None = None
    """The variable holding the Redis password (None: ``VERTUMNUS_REDIS_PASSWORD``)."""


class _Section:
    """One JSON object of the file: typed reads that name the key, unknown keys refused."""

    def __init__(self, raw: Any, path: str, known: tuple[str, ...]) -> None:
        if not isinstance(raw, Mapping):
            raise ConfigError(path, f"must be an object, got {_kind(raw)}")
        for key in raw:
            if key not in known:
                where = path or "the top level"
                raise ConfigError(
                    self._at(path, str(key)),
                    f"is not a known key ({where} takes {', '.join(known)})",
                )
        self.raw = raw
        self.path = path

    @staticmethod
    def _at(path: str, key: str) -> str:
        return f"{path}.{key}" if path else key

    def where(self, key: str) -> str:
        """The path of ``key`` in this section, for a message."""
        return self._at(self.path, key)

    def section(self, key: str, known: tuple[str, ...]) -> _Section:
        return _Section(self.raw.get(key, {}), self.where(key), known)

    def string(self, key: str, default: str) -> str:
        value = self.raw.get(key, default)
        if not isinstance(value, str):
            raise ConfigError(self.where(key), f"must be a string, got {value!r}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(self.where(key), f"must be true or false, got {value!r}")
        return value

    def integer(self, key: str, default: int, lo: int, hi: int | None = None) -> int:
        value = self.raw.get(key, default)
        # bool is an int to Python, never to a reader of the file.
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(self.where(key), f"must be an integer, got {value!r}")
        if value < lo:
            raise ConfigError(self.where(key), f"must be >= {lo}, got {value}")
        if hi is not None and value > hi:
            raise ConfigError(self.where(key), f"must be <= {hi}, got {value}")
        return value

    def number(
        self,
        key: str,
        default: float,
        *,
        ge: float | None = None,
        gt: float | None = None,
        lt: float | None = None,
    ) -> float:
        value = self.raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(self.where(key), f"must be a number, got {value!r}")
        value = float(value)
        # Python's json reads NaN and Infinity; no setting means either.
        if not math.isfinite(value):
            raise ConfigError(self.where(key), f"must be finite, got {value}")
        if ge is not None and value < ge:
            raise ConfigError(self.where(key), f"must be >= {ge:g}, got {value:g}")
        if gt is not None and value <= gt:
            raise ConfigError(self.where(key), f"must be > {gt:g}, got {value:g}")
        if lt is not None and value >= lt:
            raise ConfigError(self.where(key), f"must be < {lt:g}, got {value:g}")
        return value


def _kind(value: Any) -> str:
    return {list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), f"a {type(value).__name__}"
    )


# The bounds below are the core's own (PlacementParams, CacheManagerSettings), checked here
# first so that the message names the file's key; the core checks again on construction.


def _placement(doc: _Section) -> PlacementParams:
    sec = doc.section("placement", ("beta", "betaBusy", "lambda"))
    default = PlacementParams()
    beta = sec.number("beta", default.beta, ge=1.0)
    beta_busy = sec.number("betaBusy", default.beta_busy, ge=1.0)
    lam = sec.number("lambda", default.lam, ge=0.0)
    if beta_busy < beta:
        raise ConfigError(
            sec.where("betaBusy"), f"must be >= placement.beta ({beta:g}), got {beta_busy:g}"
        )
    return _build(sec.path, PlacementParams, beta=beta, beta_busy=beta_busy, lam=lam)


def _cache_manager(doc: _Section) -> CacheManagerSettings | None:
    sec = doc.section(
        "cacheManager",
        ("enabled", "thetaInter", "thetaIntra", "thetaReclaim", "decay", "scanIntervalSeconds"),
    )
    default = CacheManagerSettings()
    # Checked even when disabled: a bad threshold is a mistake whether or not it runs.
    enabled = sec.boolean("enabled", True)
    theta_inter = sec.number("thetaInter", default.theta_inter, ge=0.0)
    theta_intra = sec.number("thetaIntra", default.theta_intra, ge=0.0)
    theta_reclaim = sec.number("thetaReclaim", default.theta_reclaim, ge=0.0)
    decay = sec.number("decay", default.decay, gt=0.0, lt=1.0)
    scan = sec.number("scanIntervalSeconds", default.scan_interval_s, gt=0.0)
    if not theta_reclaim < theta_intra:
        raise ConfigError(
            sec.where("thetaReclaim"),
            f"must be below cacheManager.thetaIntra ({theta_intra:g}), got {theta_reclaim:g} "
            "(or replicas flap between copy and reclaim)",
        )
    settings = _build(
        sec.path,
        CacheManagerSettings,
        theta_inter=theta_inter,
        theta_intra=theta_intra,
        theta_reclaim=theta_reclaim,
        decay=decay,
        scan_interval_s=scan,
    )
    return settings if enabled else None


def _redis(doc: _Section) -> tuple[str | None, str | None]:
    """(url, password variable) of the shared store."""
    sec = doc.section("redis", ("mode", "url", "passwordEnv"))
    has_url = "url" in sec.raw
    mode = sec.string("mode", "external" if has_url else "none")
    if mode not in ("managed", "external", "none"):
        raise ConfigError(
            sec.where("mode"), f"must be one of managed, external, none, got {mode!r}"
        )
    env = sec.raw.get("passwordEnv")
    if env is not None and (not isinstance(env, str) or not _ENV_NAME.fullmatch(env)):
        raise ConfigError(
            sec.where("passwordEnv"), f"must name an environment variable, got {env!r}"
        )
    if mode == "none":
        if has_url:
            raise ConfigError(sec.where("url"), "must be absent with redis.mode none")
        return None, env
    if not has_url:
        raise ConfigError(sec.where("url"), f"is required with redis.mode {mode}")
    return _redis_url(sec), env


def _redis_url(sec: _Section) -> str:
    url = sec.string("url", "")
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError as e:
        raise ConfigError(sec.where("url"), f"is not a URL: {e}") from None
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise ConfigError(
            sec.where("url"), f"must be redis://host:port/db (or rediss://), got {url!r}"
        )
    # A password here would sit in a ConfigMap anyone reading the namespace can see.
    if password is not None:
        raise ConfigError(
            sec.where("url"),
            "embeds a password: remove it and give it in the variable redis.passwordEnv "
            "names (default VERTUMNUS_REDIS_PASSWORD) or in VERTUMNUS_REDIS_PASSWORD_FILE",
        )
    return url


def _engines(doc: _Section) -> tuple[str, ...]:
    raw = doc.raw.get("engines", [])
    if not isinstance(raw, list):
        raise ConfigError("engines", f"must be a list, got {_kind(raw)}")
    by_domain: dict[int, str] = {}
    for i, item in enumerate(raw):
        sec = _Section(item, f"engines[{i}]", ("domain", "pod", "host", "basePort"))
        domain = sec.integer("domain", i, 0)
        sec.string("pod", "")
        host = sec.string("host", "")
        if not host:
            raise ConfigError(sec.where("host"), "is required (rank 0's host name or address)")
        if "basePort" not in sec.raw:
            raise ConfigError(sec.where("basePort"), "is required (rank 0's port)")
        port = sec.integer("basePort", 0, 1, 65535)
        if domain in by_domain:
            raise ConfigError(sec.where("domain"), f"repeats domain {domain}")
        # An IPv6 literal needs brackets to be told from its port.
        by_domain[domain] = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if sorted(by_domain) != list(range(len(by_domain))):
        raise ConfigError(
            "engines",
            f"must cover domains 0..{len(by_domain) - 1} once each, got {sorted(by_domain)}",
        )
    return tuple(by_domain[d] for d in sorted(by_domain))


def _controller(doc: _Section) -> None:
    sec = doc.section("controller", ("external", "windowSeconds", "hopSeconds"))
    if not sec.boolean("external", True):
        raise ConfigError(
            sec.where("external"),
            "must be true: the router does not take its controller's settings from "
            "router.json; run `vertumnus router --controller` to run the controller here",
        )
    sec.integer("windowSeconds", 1, 1)
    sec.integer("hopSeconds", 0, 0)


def _informational(doc: _Section) -> None:
    """Type-check what the router does not use, so a garbled file is still noticed."""
    doc.string("namespace", "")
    doc.integer("domainSize", 1, 1)
    model = doc.section("model", ("name", "path", "profile"))
    model.string("name", "")
    model.string("path", "")
    engine = doc.section("engine", ENGINE_KEYS)
    engine.integer("blockSize", 1, 1)
    engine.integer("maxTokens", 1, 1)


ENGINE_KEYS = ("kind", "blockSize", "maxTokens")


def _switch_timeout(doc: _Section) -> float:
    kind = doc.section("engine", ENGINE_KEYS).string("kind", "")
    try:
        return SWITCH_TIMEOUT_S[kind]
    except KeyError:
        raise ConfigError(
            doc.where("engine") + ".kind",
            f"must be one of {sorted(k for k in SWITCH_TIMEOUT_S if k)}, got {kind!r}",
        ) from None


def _build(path: str, cls: Any, **kwargs: Any) -> Any:
    """``cls(**kwargs)``, its own check's error naming the file's section."""
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise ConfigError(path, f"is refused: {e}") from None


_TOP_LEVEL = (
    "pool",
    "namespace",
    "port",
    "adminPort",
    "adminTokenFile",
    "adminTlsCertFile",
    "adminTlsKeyFile",
    "tlsCertFile",
    "tlsKeyFile",
    "healthPort",
    "metricsPort",
    "admissionLimit",
    "model",
    "engine",
    "placement",
    "cacheManager",
    "controller",
    "redis",
    "domainSize",
    "engines",
)
"""Every key the operator's ``router_config`` writes at the top level, and nothing else."""


def parse_router_config(raw: Any) -> RouterConfig:
    """The settings in a parsed ``router.json`` (see the module's docstring for the keys).

    Raises :class:`ConfigError` naming the key for an unknown key or a bad value.
    """
    doc = _Section(raw, "", _TOP_LEVEL)
    _informational(doc)
    _controller(doc)
    defaults = RouterSettings()
    model = doc.section("model", ("name", "path", "profile"))
    profile = model.string("profile", defaults.profile)
    if not profile:
        raise ConfigError(model.where("profile"), "must not be empty")
    placement = _placement(doc)
    cache_manager = _cache_manager(doc)
    redis_url, password_env = _redis(doc)
    engines = _engines(doc)
    listen = _listen(doc, "port", defaults.listen)
    admin_listen = _listen(doc, "adminPort", defaults.admin_listen)
    metrics_listen = _listen(doc, "metricsPort", defaults.metrics_listen)
    health_listen = _listen(doc, "healthPort", defaults.health_listen)
    for key in ("adminPort", "metricsPort", "healthPort"):
        if key in doc.raw and doc.raw[key] == doc.raw.get("port"):
            raise ConfigError(key, f"must differ from port ({doc.raw['port']})")
    try:
        settings = RouterSettings(
            listen=listen,
            admin_listen=admin_listen,
            admin_token_file=doc.string("adminTokenFile", defaults.admin_token_file),
            admin_tls_cert_file=doc.string("adminTlsCertFile", defaults.admin_tls_cert_file),
            admin_tls_key_file=doc.string("adminTlsKeyFile", defaults.admin_tls_key_file),
            tls_cert_file=doc.string("tlsCertFile", defaults.tls_cert_file),
            tls_key_file=doc.string("tlsKeyFile", defaults.tls_key_file),
            health_listen=health_listen,
            metrics_listen=metrics_listen,
            pool=doc.string("pool", defaults.pool),
            profile=profile,
            placement=placement,
            cache_manager=cache_manager,
            admission_limit=doc.integer("admissionLimit", defaults.admission_limit, 1),
            switch_timeout_s=_switch_timeout(doc),
            # The operator's pool: its controller runs the transitions (Admin.Drain and
            # Admin.Switch), and a Reconfigure sent to the router is refused.
            external_controller=True,
        )
    except ConfigError:
        raise
    except ValueError as e:  # what only RouterSettings checks (the pool name's characters)
        raise ConfigError("", str(e)) from None
    return RouterConfig(settings, engines, redis_url, password_env)


def _listen(doc: _Section, key: str, default: str) -> str:
    """``0.0.0.0:PORT``: in a pod the Service reaches the router from outside it."""
    if key not in doc.raw:
        return default
    return f"0.0.0.0:{doc.integer(key, 0, 1, 65535)}"


def load_router_config(path: str | Path) -> RouterConfig:
    """:func:`parse_router_config` of the JSON file at ``path``; a ValueError starting with
    the path for a file that cannot be read, is not JSON, or does not parse."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{path}: cannot read the router config: {e.strerror or e}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from None
    try:
        return parse_router_config(raw)
    except ConfigError as e:
        raise ValueError(f"{path}: {e}") from None
