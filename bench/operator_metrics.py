"""What the operator's metrics cost: a status render's gauges, and a scrape of many pools.

Each pool's loop sets its gauges every time its status is rendered
(:meth:`PoolMetrics.status`), and a scrape copies every pool's series under the
registry's lock, then renders them outside it (a pool's loop, or a controller's
look, only ever waits for the copy). Timed here for ``--pools`` pools of
``--gpus`` GPUs (``128xCP4+64xCP8`` at 1,024), each with ``--looks`` looks and
transitions recorded, median of ``--repeat``::

    python bench/operator_metrics.py [--pools 100] [--gpus 1024] [--repeat 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

from prometheus_client import generate_latest

from vertumnus.core import transition as tr
from vertumnus.core.lattice import layout_for
from vertumnus.core.types import Composition
from vertumnus.operator.metrics import OperatorMetrics, _Copy
from vertumnus.operator.record import Record
from vertumnus.operator.status import Observation, build_status


def _ms(f, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        f()
        times.append(time.perf_counter() - began)
    return 1e3 * statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pools", type=int, default=100)
    p.add_argument("--gpus", type=int, default=1024, help="a multiple of 16")
    p.add_argument("--looks", type=int, default=50, help="looks and transitions per pool")
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args()
    if args.gpus < 16 or args.gpus % 16:
        p.error(f"--gpus must be a positive multiple of 16, got {args.gpus}")

    cp4, cp8 = args.gpus // 8, args.gpus // 16
    layout = layout_for(Composition.parse(f"{cp4}xCP4+{cp8}xCP8"), 8)
    domains = args.gpus // 8
    record = Record(tr.initial_pool(layout))
    ready = Observation(domains=domains, ready_domains=set(range(domains)))
    view = build_status(record, ready, [], 0.0)

    metrics = OperatorMetrics()
    pools = [metrics.pool("bench", f"pool-{i}") for i in range(args.pools)]
    for pool in pools:
        pool.status(view, [])
        for _ in range(args.looks):
            pool.decided(0.03, "stay", {4: 1.0, 8: 2.0})
            pool.committed("split", 1.0, 0.5, 1.5)

    render = _ms(lambda: build_status(record, ready, [], 0.0), args.repeat)
    gauges = _ms(lambda: pools[0].status(view, []), args.repeat)

    def copy() -> None:
        with metrics.lock:
            [_Copy.of(p) for p in pools]

    held = _ms(copy, args.repeat)
    scrape = _ms(lambda: generate_latest(metrics.registry), args.repeat)
    size = len(generate_latest(metrics.registry))
    print(
        f"{args.gpus} GPUs ({len(layout.slots)} workers) per pool, {args.pools} pools, median of "
        f"{args.repeat}:\n"
        f"  a status render {render:.3f} ms; setting its gauges {gauges:.3f} ms more\n"
        f"  a scrape {scrape:.1f} ms ({size / 1e3:.0f} kB), the lock held {held:.2f} ms of it"
    )


if __name__ == "__main__":
    main()
