"""``vertumnus router``: run one router replica in front of a pool's engines.

Registered into the main ``vertumnus`` parser by :func:`register`; gRPC and
Redis are imported only when the command runs. Exit codes: 0 after a clean
stop (SIGINT, SIGTERM), 2 for bad input (a message naming it on stderr), 1
if the pool cannot be reached.

The settings come from ``--config router.json`` (what the operator writes into
the pool's ConfigMap, :mod:`vertumnus.router.config`), then from the flags: a
flag given on the command line overrides the file, a flag left out keeps it
(flags therefore default to None here, and :func:`router_config_from_args`
fills in the file's value, else the settings' default).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from vertumnus.flags import add_placement_flags, placement_from

if TYPE_CHECKING:
    from vertumnus.router.config import RouterConfig


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "router",
        help="run a router replica in front of a pool's CP engines",
        description=(
            "Serve the public API (vertumnus.v1.Prefill and Admin, gRPC health and reflection) for a "
            "pool of CP engines: cost-model placement, the global prefix index from the engines' cache "
            "events, the cache manager, drains and epoch switches."
        ),
    )
    p.add_argument(
        "--config",
        default=None,
        metavar="ROUTER_JSON",
        help="read the settings from this router.json, the operator's ConfigMap <pool>-router "
        "(pool, port, adminPort, metricsPort, admissionLimit, model.profile, placement, cacheManager, redis, "
        "engines; namespace, model.name/path, engine, domainSize and controller's window are "
        "informational and ignored); flags given here override it",
    )
    p.add_argument(
        "--engine",
        action="append",
        default=None,
        metavar="HOST:PORT",
        help="rank 0's address of one engine (an NVLink domain); repeat once per domain, in domain "
        "order; replaces the file's engines (required without --config)",
    )
    p.add_argument(
        "--listen",
        default=None,
        help="HOST:PORT of the public API (default 127.0.0.1:50050; the file's port on 0.0.0.0)",
    )
    p.add_argument(
        "--admin-listen",
        default=None,
        help="HOST:PORT of the Admin API on a port of its own (default: on --listen; the file's "
        "adminPort on 0.0.0.0; empty: on --listen whatever the file says)",
    )
    p.add_argument(
        "--admin-token-file",
        default=None,
        metavar="PATH",
        help="refuse Admin calls without the token on this file's first line (metadata "
        "'authorization: Bearer <token>'; read again when the file changes; default: the "
        "file's adminTokenFile, else no token needed; empty: none whatever the file says)",
    )
    p.add_argument(
        "--admin-tls-cert-file",
        default=None,
        metavar="PATH",
        help="serve the Admin port (--admin-listen) over TLS with this PEM certificate (chain), "
        "read again when it changes (default: the file's adminTlsCertFile; empty: plaintext)",
    )
    p.add_argument(
        "--admin-tls-key-file",
        default=None,
        metavar="PATH",
        help="the certificate's PEM key (default: the file's adminTlsKeyFile)",
    )
    p.add_argument(
        "--tls-cert-file",
        default=None,
        metavar="PATH",
        help="serve the public port (--listen: Prefill, health, reflection) over TLS with this "
        "PEM certificate (chain), read again when it changes (default: the file's tlsCertFile; "
        "empty: plaintext)",
    )
    p.add_argument(
        "--tls-key-file",
        default=None,
        metavar="PATH",
        help="the public certificate's PEM key (default: the file's tlsKeyFile)",
    )
    p.add_argument(
        "--health-listen",
        default=None,
        help="HOST:PORT of a plaintext port with gRPC health alone, for probes that speak no "
        "TLS (default: the file's healthPort on 0.0.0.0, else none)",
    )
    p.add_argument(
        "--metrics-listen",
        default=None,
        help="HOST:PORT of /metrics (default 127.0.0.1:9464; empty for none)",
    )
    p.add_argument(
        "--pool",
        default=None,
        help="the pool's name, part of the index's namespace (default local)",
    )
    p.add_argument(
        "--profile",
        default=None,
        help="prefill-time profile placement predicts with: bundled name or .json path (default cpu-tiny)",
    )
    add_placement_flags(p)
    p.add_argument(
        "--redis-url",
        default=None,
        help="share the prefix index and the load through Redis (redis://host:port/db); the password "
        "comes from VERTUMNUS_REDIS_PASSWORD(_FILE) (or the variable the file's redis.passwordEnv "
        "names), never from the command line",
    )
    p.add_argument(
        "--index-source",
        choices=("workers", "store"),
        default=None,
        help="follow the engines' cache events (default), or the shared store's changes (a second replica)",
    )
    p.add_argument(
        "--router-id", default="router-0", help="this replica's name in metrics and the load board"
    )
    p.add_argument(
        "--admission-limit",
        type=int,
        default=None,
        help="requests accepted and not finished, at most (default 1024)",
    )
    p.add_argument(
        "--shutdown-grace",
        type=float,
        default=None,
        help="seconds a SIGTERM lets the requests in flight finish (default 30)",
    )
    p.add_argument(
        "--no-cache-manager",
        action="store_true",
        help="run without the global prefix-cache manager (whatever the file says)",
    )
    p.add_argument(
        "--no-share-load",
        action="store_true",
        help="with Redis: do not exchange outstanding work with the other replicas",
    )
    p.add_argument(
        "--controller",
        action="store_true",
        help="run the composition controller here (no operator): split and merge by window demand",
    )
    p.add_argument(
        "--no-shadow",
        action="store_true",
        help="with --controller: no shadow pools (by default the current composition and its "
        "neighbours serve the requests alongside the pool, up to 64 GPUs, and a neighbour "
        "better over the last minutes is moved to)",
    )
    p.add_argument(
        "--log-format",
        choices=("json", "text"),
        default="json",
        help="log lines (default %(default)s)",
    )
    p.set_defaults(func=cmd_router)


def router_config_from_args(args: argparse.Namespace) -> RouterConfig:
    """The file's settings (if ``--config``) with the flags given over them.

    Raises ValueError (a message naming the file's key or the flag) for bad input.
    """
    from vertumnus.router.config import RouterConfig, load_router_config

    base = load_router_config(args.config) if args.config else RouterConfig()
    s = base.settings
    changes: dict[str, Any] = {
        name: value
        for name, value in (
            ("listen", args.listen),
            ("admin_listen", args.admin_listen),
            ("admin_token_file", args.admin_token_file),
            ("admin_tls_cert_file", args.admin_tls_cert_file),
            ("admin_tls_key_file", args.admin_tls_key_file),
            ("tls_cert_file", args.tls_cert_file),
            ("tls_key_file", args.tls_key_file),
            ("health_listen", args.health_listen),
            ("metrics_listen", args.metrics_listen),
            ("pool", args.pool),
            ("profile", args.profile),
            ("admission_limit", args.admission_limit),
            ("index_source", args.index_source),
        )
        if value is not None
    }
    try:
        placement = placement_from(args, s.placement)
    except ValueError as e:
        over = f" over {args.config}'s placement" if args.config else ""
        raise ValueError(f"--beta/--beta-busy/--lambda{over}: {e}") from None
    if placement is not s.placement:
        changes["placement"] = placement
    if args.no_cache_manager:
        changes["cache_manager"] = None
    if args.no_share_load:
        changes["share_load"] = False
    if args.controller:
        import os

        from vertumnus.core.planner import PlannerSettings

        # The what-if check replays a large window's candidates on two threads
        # where the host has the cores (the estimates are the same either way).
        changes["controller"] = PlannerSettings(
            whatif_threads=min(2, os.cpu_count() or 1), shadow=not args.no_shadow
        )
    elif args.no_shadow:
        raise ValueError(
            "--no-shadow needs --controller (an operator's pool: spec.controller.shadow)"
        )
    engines = tuple(args.engine) if args.engine else base.engines
    if not engines:
        raise ValueError(
            "no engines: give --engine HOST:PORT once per domain, or --config with engines"
        )
    return RouterConfig(
        settings=replace(s, **changes),
        engines=engines,
        redis_url=args.redis_url or base.redis_url,
        redis_password_env=base.redis_password_env,
    )


def cmd_router(args: argparse.Namespace) -> int:
    from vertumnus.router.logs import configure_logging
    from vertumnus.router.serve import SHUTDOWN_GRACE_S, guard_files, serve

    grace = SHUTDOWN_GRACE_S if args.shutdown_grace is None else args.shutdown_grace
    if not grace >= 0:  # also refuses nan
        print(f"vertumnus: error: --shutdown-grace must be >= 0, got {grace}", file=sys.stderr)
        return 2
    try:
        config = router_config_from_args(args)
        guard_files(config.settings)  # the ports' files: a clear error now, before the start
        store = _store(config)
    except ValueError as e:
        print(f"vertumnus: error: {e}", file=sys.stderr)
        return 2
    settings = config.settings
    configure_logging(args.log_format)
    from vertumnus.gcfreeze import freeze_startup

    freeze_startup()  # the imports' objects, out of every full collection's walk
    try:
        return asyncio.run(
            serve(settings, config.engines, grace, store=store, router_id=args.router_id)
        )
    except OSError as e:
        print(f"vertumnus: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


def _store(config: RouterConfig) -> Any:
    """The shared store, or None without a Redis URL (a RedisConfigError is a ValueError)."""
    if not config.redis_url:
        return None
    from vertumnus.router.mirror import redis_store_for

    # Never a password here: it stays in the environment (or a file) redis_client reads.
    s = config.settings
    return redis_store_for(
        config.redis_url,
        s.pool,
        s.profile,
        follow=s.index_source == "store",
        password_env=config.redis_password_env,
    )
