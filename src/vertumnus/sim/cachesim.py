"""The cache manager's shell in the simulator, and the ``vertumnus`` / ``vertumnus-nocm`` policies.

:class:`~vertumnus.core.cachemanager.CacheManager` plans; this module carries
the plan out in simulated time, the way a router-side executor would talk to
real workers:

- **per request**: :class:`CacheManagedPolicy` places with the cost model
  (``CostModelPolicy``), then tells the manager what the request matched,
  reused and preferred (``observe_request``), and unpins it on completion;
- **scan**: every ``scan_interval_s`` a callback (``Simulation.at``) runs
  ``manager.scan`` on the live pool and starts the operations it returns;
- **copy**: after the op's modeled transfer time, the path is inserted into the
  destination's :class:`~vertumnus.core.blockcache.BlockCache` and the
  resulting cache events go to the trie through ``Simulation.apply_cache_delta``
  — only then can placement see the replica (the install report). Copied
  blocks then compete in the destination's LRU like any other block. A copy
  whose source no longer holds the prefix, or whose destination left the
  candidate set, fails;
- **reclaim**: after ``reclaim_delay_s`` the worker deletes the block
  (``remove_subtree``) and reports it — unless, by then, a queued or running
  request there reuses it, or the worker has cached a child of it since the
  plan; then it refuses and the metadata stays as it is.

The scan chain stops when the pool is idle and nothing was placed since the
last scan (so a run ends), and restarts on the next placement.

Builders for the policy registry: :func:`build_vertumnus` and
:func:`build_vertumnus_nocm` take a :class:`~vertumnus.sim.engine.PoolConfig`
and return a ready :class:`~vertumnus.sim.engine.Simulation`. Another
placement policy gets the manager by being wrapped in
:class:`CacheManagedPolicy` (``inner=``) and :func:`attach_cache_manager`.
"""

from __future__ import annotations

import functools

from vertumnus.core.cachemanager import CacheManager, CacheManagerSettings, Copy, Reclaim, ScanPlan
from vertumnus.core.placement import PlacementParams
from vertumnus.core.policies.base import Decision, Policy, PoolView
from vertumnus.core.policies.vertumnus import CostModelPolicy
from vertumnus.core.types import Request
from vertumnus.sim.engine import PoolConfig, Simulation, SimWorker

__all__ = [
    "CacheManagedPolicy",
    "CacheManagerShell",
    "LocalLruPolicy",
    "attach_cache_manager",
    "build_vertumnus",
    "build_vertumnus_nocm",
]


class LocalLruPolicy(CostModelPolicy):
    """``vertumnus-nocm``: cost-model placement, worker-local LRU caches only."""

    name = "vertumnus-nocm"


class CacheManagedPolicy(Policy):
    """Any placement policy feeding the global prefix-cache manager.

    Wraps ``inner`` (default: :class:`CostModelPolicy`, which makes this the
    ``vertumnus`` policy): placement is ``inner``'s unchanged; every placement
    and completion is also reported to the manager. The adaptive policy wraps
    its own placement the same way (see :func:`attach_cache_manager`).
    """

    name = "vertumnus"

    def __init__(
        self,
        manager: CacheManager,
        params: PlacementParams | None = None,
        inner: Policy | None = None,
        name: str | None = None,
    ) -> None:
        self.inner = inner if inner is not None else CostModelPolicy(params)
        if name is not None:
            self.name = name
        self.manager = manager
        self.shell: CacheManagerShell | None = None
        # decide() and observe_placed() come in pairs from one submit(); the
        # preferred degree travels between them here.
        self._preferred_degree = 0

    def decide(self, request: Request, pool: PoolView) -> Decision | None:
        decision = self.inner.decide(request, pool)
        self._preferred_degree = 0 if decision is None else decision.preferred_degree
        return decision

    def observe_placed(self, request: Request, worker: int, pool: PoolView) -> None:
        self.inner.observe_placed(request, worker, pool)
        if self.shell is None:
            raise RuntimeError(
                "CacheManagedPolicy used without a CacheManagerShell (use attach_cache_manager)"
            )
        self.manager.observe_request(request, worker, self._preferred_degree, self.shell.sim)
        self.shell.placed(request, worker)

    def observe_completed(self, request: Request, worker: int) -> None:
        self.inner.observe_completed(request, worker)
        self.manager.request_done(request.id)


class CacheManagerShell:
    """Runs the manager's scans and executes its plans inside one Simulation."""

    def __init__(self, sim: Simulation, manager: CacheManager) -> None:
        self.sim = sim
        self.manager = manager
        self.settings: CacheManagerSettings = manager.settings
        self._scan_pending = False
        self._placed_since_scan = False
        self.plans: list[ScanPlan] = []
        """Every non-empty plan (for tests and reports); candidates lists are kept."""
        self.keep_plans = False
        """Set to keep plans; off by default so long runs do not hold memory."""
        self.installed: list[tuple[float, Copy]] = []
        """(time, op) of every installed copy."""
        self._fresh: set[tuple[int, int]] = set()
        """(destination, key) of installed copies not reused yet."""
        self.copies_reused = 0
        """Installed copies that a later placement reused (at least once) —
        how many copies paid off."""
        self._dropped: set[int] = set()
        """ids of operations abandoned by a reconfiguration."""
        sim.attachments["cache_manager"] = self
        sim.membership_listeners.append(self._membership_changed)

    # -- scan chain ---------------------------------------------------------------

    def placed(self, request: Request, worker: int) -> None:
        self._placed_since_scan = True
        if self._fresh:
            # Did this placement reuse a copy that no request had reused yet?
            nodes = self.sim.trie.nodes
            for k in request.block_keys:
                node = nodes.get(k)
                if node is None or worker not in node.holders:
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
        plan = self.manager.scan(self.sim)
        if self.keep_plans and (plan or plan.inter or plan.intra or plan.reclaim):
            self.plans.append(plan)
        now = self.sim.now
        for op in plan.copies:
            self.sim.at(now + op.transfer_s, functools.partial(self._install, op))
        for rop in plan.reclaims:
            self.sim.at(now + self.settings.reclaim_delay_s, functools.partial(self._delete, rop))
        if self._placed_since_scan or self._busy() or self.manager.copies_in_flight:
            self._placed_since_scan = False
            self._schedule_scan()

    def _membership_changed(self, removed: list[int], added: list[int]) -> None:
        # The trie already forgot the removed workers' blocks (remove_worker);
        # the manager forgets their pins and in-flight operations.
        del added
        self._dropped.update(id(op) for op in self.manager.workers_removed(removed))

    # -- operations -----------------------------------------------------------------

    def _install(self, op: Copy) -> None:
        if id(op) in self._dropped:
            self._dropped.discard(id(op))
            return
        sim = self.sim
        if not (sim.has_worker(op.source) and sim.has_worker(op.destination)):
            self.manager.copy_finished(op, installed=False)
            return
        src = sim.worker(op.source)
        dst = sim.worker(op.destination)
        ok = (
            dst.state.available
            and dst.degree == op.degree
            and src.cache.match(op.keys) == len(op.keys)
        )
        if ok:
            self.sim.apply_cache_delta(dst, dst.cache.insert(op.keys))
            self.installed.append((self.sim.now, op))
            self._fresh.add((op.destination, op.key))
        self.manager.copy_finished(op, installed=ok)

    def _delete(self, op: Reclaim) -> None:
        if id(op) in self._dropped:
            self._dropped.discard(id(op))
            return
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
        node = self.sim.trie.nodes.get(key)
        return node is not None and any(worker.id in c.holders for c in node.children.values())


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
    """Start the shell for a Simulation built with a :class:`CacheManagedPolicy`.

    ``Simulation(pool, CacheManagedPolicy(CacheManager(settings), inner=p))``
    then ``attach_cache_manager(sim)``: scans start with the first placement.
    """
    policy = sim.policy
    if not isinstance(policy, CacheManagedPolicy):
        raise TypeError(f"policy {policy.name!r} is not a CacheManagedPolicy")
    policy.shell = CacheManagerShell(sim, policy.manager)
    return policy.shell


def build_vertumnus(
    pool: PoolConfig,
    *,
    placement: PlacementParams | None = None,
    cache: CacheManagerSettings | None = None,
) -> Simulation:
    """A Simulation of ``vertumnus``: cost-model placement + global cache manager."""
    sim = Simulation(pool, CacheManagedPolicy(CacheManager(cache), placement))
    attach_cache_manager(sim)
    return sim


def build_vertumnus_nocm(
    pool: PoolConfig,
    *,
    placement: PlacementParams | None = None,
) -> Simulation:
    """A Simulation of ``vertumnus-nocm``: cost-model placement, worker-local LRU only."""
    return Simulation(pool, LocalLruPolicy(placement))
