"""The cache manager's shell in the simulator, and the ``vertumnus`` / ``vertumnus-nocm`` pools.

:class:`~vertumnus.core.cachemanager.CacheManager` plans and the routing
core feeds it every placement and completion; this module carries its plans
out in simulated time, the way the router's executor does with real workers:

- **scan**: every ``scan_interval_s`` a callback (``Simulation.at``) runs
  ``manager.scan`` on the pool's routing core and starts the operations it
  returns;
- **copy**: after the op's modelled transfer time, the path is inserted into
  the destination's :class:`~vertumnus.core.blockcache.BlockCache` and the
  resulting cache events go to the index — only then can placement see the
  replica (the install report). Copied blocks then compete in the
  destination's LRU like any other block. A copy whose source no longer holds
  the prefix, or whose destination left the candidate set, fails;
- **reclaim**: after ``reclaim_delay_s`` the worker deletes the block
  (``remove_subtree``) and reports it — unless, by then, a queued or running
  request there reuses it, or the worker has cached a child of it since the
  plan; then it refuses and the metadata stays as it is.

An operation the manager abandoned meanwhile (a worker it involved left the
pool) is not carried out when its time comes. The scan chain stops when the
pool is idle and nothing was placed since the last scan (so a run ends), and
restarts on the next placement.
"""

from __future__ import annotations

import functools

from vertumnus.core.cachemanager import CacheManager, CacheManagerSettings, Copy, Reclaim, ScanPlan
from vertumnus.core.decision import RouteDecision
from vertumnus.core.placement import PlacementParams
from vertumnus.core.policies.vertumnus import CostModelPolicy
from vertumnus.core.types import Request
from vertumnus.sim.engine import PoolConfig, Simulation, SimWorker

__all__ = ["CacheManagerShell", "attach_cache_manager", "build_vertumnus", "build_vertumnus_nocm"]


class CacheManagerShell:
    """Runs the manager's scans and executes its plans inside one Simulation."""

    def __init__(self, sim: Simulation, manager: CacheManager) -> None:
        self.sim = sim
        self.manager = manager
        self.settings: CacheManagerSettings = manager.settings
        self._scan_pending = False
        self._placed_since_scan = False
        self.plans: list[tuple[float, ScanPlan]] = []
        """(time, plan) of every non-empty scan (for tests and reports), when
        ``keep_plans`` is set; candidate lists are kept."""
        self.keep_plans = False
        """Set to keep plans; off by default so long runs do not hold memory."""
        self.installed: list[tuple[float, Copy]] = []
        """(time, op) of every installed copy."""
        self._fresh: set[tuple[int, int]] = set()
        """(destination, key) of installed copies not reused yet."""
        self.copies_reused = 0
        """Installed copies that a later placement reused (at least once) —
        how many copies paid off."""
        sim.attachments["cache_manager"] = self
        sim.placement_listeners.append(self._placed)

    # -- scan chain ---------------------------------------------------------------

    def _placed(self, request: Request, decision: RouteDecision, first: bool) -> None:
        self._placed_since_scan = True
        if self._fresh:
            # Did this placement reuse a copy that no request had reused yet?
            worker = decision.worker
            holders = self.sim.core.store.holders
            for k in request.block_keys:
                if worker not in holders(k):
                    break
                if (worker, k) in self._fresh:
                    self._fresh.discard((worker, k))
                    self.copies_reused += 1
        if not self._scan_pending:
            self._schedule_scan()

    def _schedule_scan(self) -> None:
        self._scan_pending = True
        self.sim.at(self.sim.now + self.settings.scan_interval_s, self._scan)

    def _busy(self) -> bool:
        return any(w.running is not None or w.queue for w in self.sim.sim_workers())

    def _scan(self) -> None:
        self._scan_pending = False
        plan = self.manager.scan(self.sim.core)
        now = self.sim.now
        if self.keep_plans and (plan or plan.inter or plan.intra or plan.reclaim):
            self.plans.append((now, plan))
        for op in plan.copies:
            self.sim.at(now + op.transfer_s, functools.partial(self.install, op))
        for rop in plan.reclaims:
            self.sim.at(now + self.settings.reclaim_delay_s, functools.partial(self.delete, rop))
        if self._placed_since_scan or self._busy() or self.manager.copies_in_flight:
            self._placed_since_scan = False
            self._schedule_scan()

    # -- operations -----------------------------------------------------------------

    def install(self, op: Copy) -> None:
        """The copy's transfer is done: install it at the destination (or fail)."""
        if not any(o is op for o in self.manager.copies_in_flight):
            return  # abandoned: a worker it involved left the pool
        sim = self.sim
        if not (sim.has_worker(op.source) and sim.has_worker(op.destination)):
            self.manager.copy_finished(op, installed=False)
            return
        src = sim.worker(op.source)
        dst = sim.worker(op.destination)
        ok = (
            sim.core.worker(dst.id).available
            and dst.degree == op.degree
            and src.cache.match(op.keys) == len(op.keys)
        )
        if ok:
            sim.apply_cache_delta(dst, dst.cache.insert(op.keys))
            self.installed.append((sim.now, op))
            self._fresh.add((op.destination, op.key))
        self.manager.copy_finished(op, installed=ok)

    def delete(self, op: Reclaim) -> None:
        """The worker deletes the reclaimed block, unless it is in use by now."""
        if not any(o is op for o in self.manager.reclaims_in_flight):
            return  # abandoned: its worker left the pool
        if not self.sim.has_worker(op.worker):
            self.manager.reclaim_finished(op, deleted=False)
            return
        worker = self.sim.worker(op.worker)
        ok = (
            op.key in worker.cache
            and not self.manager.in_use(op.worker, op.key)
            and not _in_use_by_jobs(worker, op.key)
            and not self._has_cached_child(worker, op.key)
        )
        if ok:
            self.sim.apply_cache_delta(worker, worker.cache.remove_subtree(op.key))
        self.manager.reclaim_finished(op, deleted=ok)

    def _has_cached_child(self, worker: SimWorker, key: int) -> bool:
        store = self.sim.core.store
        return any(worker.id in store.holders(c) for c in store.children(key))


def _in_use_by_jobs(worker: SimWorker, key: int) -> bool:
    """The worker-side check: does a queued or running job here reuse ``key``?"""
    jobs = list(worker.queue)
    if worker.running is not None:
        jobs.append(worker.running)
    for job in jobs:
        keys = job.request.block_keys
        n = worker.cache.match(keys)
        if key in keys[:n]:
            return True
    return False


def attach_cache_manager(sim: Simulation) -> CacheManagerShell:
    """Start the shell for a Simulation built with a cache manager
    (``Simulation(pool, policy, cache_manager=CacheManager(settings))``):
    scans start with the first placement."""
    manager = sim.core.cache_manager
    if manager is None:
        raise TypeError("this Simulation has no cache manager (pass cache_manager=...)")
    return CacheManagerShell(sim, manager)


def build_vertumnus(
    pool: PoolConfig,
    *,
    placement: PlacementParams | None = None,
    cache: CacheManagerSettings | None = None,
) -> Simulation:
    """A Simulation of ``vertumnus``: cost-model placement + global cache manager."""
    sim = Simulation(pool, CostModelPolicy(placement), cache_manager=CacheManager(cache))
    attach_cache_manager(sim)
    return sim


def build_vertumnus_nocm(
    pool: PoolConfig,
    *,
    placement: PlacementParams | None = None,
) -> Simulation:
    """A Simulation of ``vertumnus-nocm``: cost-model placement, worker-local LRU only."""
    return Simulation(pool, CostModelPolicy(placement))
