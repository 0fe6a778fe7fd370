"""``vertumnus router``: run one router replica in front of a pool's engines.

Registered into the main ``vertumnus`` parser by :func:`register`; gRPC and
Redis are imported only when the command runs. Exit codes: 0 after a clean
stop (SIGINT, SIGTERM), 2 for bad input (a message naming it on stderr), 1
if the pool cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import sys


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
        "--engine",
        action="append",
        required=True,
        metavar="HOST:PORT",
        help="rank 0's address of one engine (an NVLink domain); repeat once per domain, in domain order",
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:50050",
        help="HOST:PORT of the public API (default %(default)s)",
    )
    p.add_argument(
        "--metrics-listen",
        default="127.0.0.1:9464",
        help="HOST:PORT of /metrics (default %(default)s; empty for none)",
    )
    p.add_argument(
        "--pool",
        default="local",
        help="the pool's name, part of the index's namespace (default %(default)s)",
    )
    p.add_argument(
        "--profile",
        default="cpu-tiny",
        help="prefill-time profile placement predicts with: bundled name or .json path (default %(default)s)",
    )
    p.add_argument(
        "--redis-url",
        default=None,
        help="share the prefix index and the load through Redis (redis://host:port/db); the password "
        "comes from VERTUMNUS_REDIS_PASSWORD(_FILE), never from the command line",
    )
    p.add_argument(
        "--index-source",
        choices=("workers", "store"),
        default="workers",
        help="follow the engines' cache events (default), or the shared store's changes (a second replica)",
    )
    p.add_argument(
        "--router-id", default="router-0", help="this replica's name in metrics and the load board"
    )
    p.add_argument(
        "--admission-limit",
        type=int,
        default=1024,
        help="requests accepted and not finished, at most (default %(default)s)",
    )
    p.add_argument(
        "--no-cache-manager",
        action="store_true",
        help="run without the global prefix-cache manager",
    )
    p.add_argument(
        "--controller",
        action="store_true",
        help="run the composition controller here (no operator): split and merge by window demand",
    )
    p.add_argument(
        "--log-format",
        choices=("json", "text"),
        default="json",
        help="log lines (default %(default)s)",
    )
    p.set_defaults(func=cmd_router)


def cmd_router(args: argparse.Namespace) -> int:
    from vertumnus.core.cachesettings import CacheManagerSettings
    from vertumnus.core.planner import PlannerSettings
    from vertumnus.router.logs import configure_logging
    from vertumnus.router.serve import serve
    from vertumnus.router.settings import RouterSettings

    try:
        settings = RouterSettings(
            listen=args.listen,
            metrics_listen=args.metrics_listen,
            pool=args.pool,
            profile=args.profile,
            admission_limit=args.admission_limit,
            cache_manager=None if args.no_cache_manager else CacheManagerSettings(),
            controller=PlannerSettings() if args.controller else None,
            index_source=args.index_source,
        )
    except ValueError as e:
        print(f"vertumnus: error: {e}", file=sys.stderr)
        return 2
    configure_logging(args.log_format)
    store = None
    if args.redis_url:
        from vertumnus.router.mirror import redis_store_for

        store = redis_store_for(
            args.redis_url, settings.pool, settings.profile, follow=args.index_source == "store"
        )
    try:
        return asyncio.run(serve(settings, args.engine, store=store, router_id=args.router_id))
    except OSError as e:
        print(f"vertumnus: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
