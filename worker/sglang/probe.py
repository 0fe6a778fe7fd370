"""The SGLang domain pod's readiness probe: every server of the grouping in force is healthy.

::

    python3 -m vertumnus.worker.sglang.probe --degrees-file /etc/vertumnus/pod/degrees \\
        [--http-base-port 30000] [--timeout 25]

A pod runs one SGLang server per worker, and a kubelet probe can name only one
port, so this exec probe asks each server's ``/health`` itself (in parallel), at
``127.0.0.1:(http base + the worker's first GPU)`` (the port rule of
:mod:`vertumnus.worker.sglang.command`). The grouping is the pod's downward-API
file, so after a regroup the probe follows the new servers without a new pod.

SGLang's ``/health`` answers 503 while the server starts and, by default, runs a
one-token generation to prove the scheduler answers, giving up after
``SGLANG_HEALTH_CHECK_TIMEOUT`` (20 s) (``sglang/srt/entrypoints/http_server.py:218,
721-797``): hence the 25 s default here and the pod's 30 s probe timeout.

Exit 0: all healthy; 1: one is not (named on stderr); 2: bad arguments. Standard
library only: it runs every few seconds in the engine container.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["check", "main", "offsets"]


def offsets(degrees: Sequence[int]) -> list[int]:
    """The first GPU of each worker, left to right (ValueError on a misaligned degree)."""
    out, offset = [], 0
    for d in degrees:
        if d < 1 or d & (d - 1) or offset % d:
            raise ValueError(
                f"degrees {list(degrees)}: a CP{d} worker cannot start at GPU {offset}"
            )
        out.append(offset)
        offset += d
    return out


def _health(url: str, timeout: float) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return None if r.status == 200 else f"{url}: HTTP {r.status}"
    except urllib.error.HTTPError as e:
        return f"{url}: HTTP {e.code}"
    except (OSError, ValueError) as e:  # refused, timed out, reset
        return f"{url}: {e}"


def check(
    degrees: Sequence[int], http_base_port: int, timeout: float, host: str = "127.0.0.1"
) -> list[str]:
    """The problems found, one per unhealthy server (empty: all healthy)."""
    urls = [f"http://{host}:{http_base_port + o}/health" for o in offsets(degrees)]
    with ThreadPoolExecutor(max_workers=len(urls)) as pool:
        return [p for p in pool.map(lambda u: _health(u, timeout), urls) if p]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m vertumnus.worker.sglang.probe")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--degrees-file", type=Path, help="the pod's downward-API degrees file")
    src.add_argument("--degrees", help="the grouping as degrees, e.g. 4,2,2")
    p.add_argument("--http-base-port", type=int, default=30000)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--timeout", type=float, default=25.0, help="seconds per /health call")
    args = p.parse_args(argv)
    try:
        text = args.degrees_file.read_text() if args.degrees_file else args.degrees
        degrees = [int(x) for x in text.strip().split(",") if x.strip()]
        if not degrees:
            raise ValueError("no degrees")
        problems = check(degrees, args.http_base_port, args.timeout, args.host)
    except (OSError, ValueError) as e:
        print(f"sglang probe: {e}", file=sys.stderr)
        return 2
    for problem in problems:
        print(f"sglang probe: not healthy: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
