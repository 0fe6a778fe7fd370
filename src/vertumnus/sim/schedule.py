"""A pool that follows a given schedule of compositions: no controller, the same executor.

Where ``vertumnus-adaptive`` decides when to move and where to, a schedule says
it: at each :class:`Move` the pool heads for that composition along the
planner's free path (:func:`vertumnus.core.planner.free_path`: the splits or
merges the controller would rank first), carried out by the simulator's
:class:`~vertumnus.sim.reconfig.Executor` — drains, switches and the commit's
re-placement, exactly as for an adaptive pool.

Benchmarks use it for the **lagged oracle** (``bench/time_varying.py``): each
phase's best fixed composition, reached ``lag`` seconds after the phase
begins. That is the best a controller that needs ``lag`` seconds to see a
change could do, and so a yardstick for the adaptive pool's own lag.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace

from vertumnus.core import planner, transition
from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.types import Composition
from vertumnus.sim.engine import Simulation
from vertumnus.sim.reconfig import AdaptiveOptions, Executor
from vertumnus.sim.traces import Trace

__all__ = ["Move", "ScheduledMoves", "build_scheduled", "check_schedule"]


@dataclass(frozen=True)
class Move:
    """At ``at_s`` seconds, head for ``composition``."""

    at_s: float
    composition: Composition


class ScheduledMoves:
    """Starts the operations toward the latest scheduled composition, and the next
    ones at each commit, until the pool is there. A move scheduled while the pool
    is still on its way to the previous one takes over at the next commit."""

    def __init__(
        self,
        sim: Simulation,
        executor: Executor,
        layout: planner.Layout,
        moves: Sequence[Move],
        settings: planner.PlannerSettings,
    ) -> None:
        self.sim = sim
        self.executor = executor
        self.settings = settings
        self.state = planner.initial_state(layout)
        self.target: Composition | None = None
        # startable() only reads κ to keep capacity above zero: any positive profile does.
        self._capacity = planner.CapacityProfile({d: 1.0 for d in settings.degrees})
        for move in sorted(moves, key=lambda m: m.at_s):
            sim.at(move.at_s, functools.partial(self._head_for, move.composition))

    def _head_for(self, composition: Composition) -> None:
        self.target = composition
        self._advance()

    def _advance(self) -> None:
        st, target = self.state, self.target
        if target is None:
            return
        if st.layout.composition == target and not st.pending:
            self.target = None
            return
        workers = [
            planner.WorkerObservation(w, rest) for w, rest in self.sim.running_remaining().items()
        ]
        for direction in ("split", "merge"):
            path = planner.free_path(
                st.layout, st.pending, direction, self.settings, workers, target=target
            )
            if path and path[-1].composition == target:
                break
        else:
            if not st.pending:
                raise ValueError(
                    f"scheduled composition {target} cannot be reached from "
                    f"{st.layout.composition} by splits alone or merges alone"
                )
            return  # wait for the operations in flight, then plan again
        ops = planner.startable(
            [s.op for s in path], st.layout, st.pending, self._capacity, self.settings
        )
        ops = tuple(replace(op, reason=f"scheduled: {target}") for op in ops)
        self.state = replace(st, pending=st.pending + ops)
        for op in ops:
            self.executor.execute(op, self._committed)

    def _committed(self, commit: transition.Commit) -> None:
        assert not isinstance(commit.op, transition.Replace)  # the simulator's engines never fail
        self.state = planner.commit(self.state, commit.new_ids, commit.op)
        self._advance()


def check_schedule(moves: Sequence[Move], options: AdaptiveOptions) -> None:
    """ValueError naming the first move a pool of ``options`` cannot follow: the schedule
    must start at 0 s (no move before it), and every composition must be one of the
    pool's lattice."""
    ps = options.control
    if not moves or min(m.at_s for m in moves) != 0.0:
        raise ValueError("a schedule needs a move at 0 s: the composition the pool starts with")
    lattice = set(planner.enumerate_lattice(options.gpus, ps.degrees, ps.domain_size))
    for m in moves:
        if m.composition not in lattice:
            raise ValueError(
                f"scheduled composition {m.composition} is not a {options.gpus}-GPU composition "
                f"of degrees {list(ps.degrees)} in {ps.domain_size}-GPU domains"
            )


def build_scheduled(
    trace: Trace,
    model: PrefillModel,
    moves: Sequence[Move],
    options: AdaptiveOptions | None = None,
) -> Simulation:
    """A Simulation whose pool starts at the move at 0 s and follows ``moves``.

    ``options`` as for :func:`~vertumnus.sim.reconfig.build_adaptive` (its
    ``control`` gives the domain size, the degrees and ``max_concurrent_ops``;
    history, initial composition and capacity are not used). The schedule hangs
    off the simulation as ``sim.attachments["schedule"]``, the executor as
    ``sim.attachments["executor"]``.
    """
    from vertumnus.core.policies.vertumnus import CostModelPolicy

    opts = options or AdaptiveOptions()
    ps = opts.control
    check_schedule(moves, opts)
    first = min(moves, key=lambda m: m.at_s).composition
    sim = Simulation(opts.pool(first, model, trace.block_size), CostModelPolicy(opts.placement))
    layout = planner.layout_for(first, ps.domain_size)
    executor = Executor(sim, opts.executor, pool=transition.initial_pool(layout))
    later = [m for m in moves if m.at_s > 0]
    sim.attachments["schedule"] = ScheduledMoves(sim, executor, layout, later, ps)
    sim.attachments["executor"] = executor
    return sim
