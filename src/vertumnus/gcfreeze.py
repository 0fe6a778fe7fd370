"""Keep a serving process's start-up heap out of Python's cyclic garbage collector.

A long-running process (a router, an engine's host, an engine rank, the operator)
imports its libraries and builds its state once, then serves. Everything alive at
that point lives as long as the process: torch's modules alone are ~330,000 objects
the collector tracks, a router's ~67,000, the operator's (kopf and the Kubernetes
client) ~87,000. A full collection walks all of them every time, and it runs on the
thread that serves: 140 ms in an engine rank, 20 ms in a router
(docs/benchmarks/peers.md, "Garbage-collector pauses"), in the TTFT of whatever
request it lands on; 26 ms in the operator, in the decision tick it lands on. :func:`freeze_startup` moves them into the collector's
permanent generation (``gc.freeze``), which it does not walk. Reference counting
still frees them; only a reference cycle among them would never be collected,
and a start-up heap has none worth the walks. Call it once, at the end of
start-up, in the process's own entry point (never in a library function a test
calls in-process: it would freeze the test runner's objects).
"""

from __future__ import annotations

import atexit
import gc

__all__ = ["freeze_startup"]


def freeze_startup() -> int:
    """Collect once, then freeze what is left; returns how many objects are frozen.

    At exit they are unfrozen again, so that the interpreter's last collection
    frees them as it would have (extensions built with nanobind otherwise report
    their objects as leaked)."""
    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)
    return gc.get_freeze_count()
