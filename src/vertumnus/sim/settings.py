"""What a simulated run is made of: the run's settings and the policy spec (``KIND[:COMPOSITION]``).

Shared by :mod:`vertumnus.sim.registry` (which builds a Simulation for a
spec) and :mod:`vertumnus.sim.runner` (which parses specs and runs them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.metrics import SloRule
from vertumnus.core.placement import PlacementParams
from vertumnus.core.planner import PlannerSettings
from vertumnus.core.types import Composition
from vertumnus.sim.engine import PoolConfig

__all__ = ["PolicySpec", "RunSettings"]


@dataclass(frozen=True)
class RunSettings:
    """Everything a simulated run needs besides the policy and the trace."""

    model: PrefillModel
    gpus: int = 40
    """GPU budget of the pool; no composition may use more."""
    cache_blocks_per_gpu: int = 1000
    t_ext_s: float = 0.05
    slo: SloRule = field(default_factory=SloRule)
    placement: PlacementParams = field(default_factory=PlacementParams)
    seed: int = 0
    phases: tuple[tuple[float, float, str], ...] = ()
    """(start_s, end_s, label) of workload phases, for per-phase metrics."""
    planner: PlannerSettings = field(default_factory=PlannerSettings)
    """The composition controller's settings, for ``vertumnus-adaptive``."""

    def pool(self, composition: Composition, block_size: int) -> PoolConfig:
        return PoolConfig(
            composition=composition,
            model=self.model,
            block_size=block_size,
            cache_blocks_per_gpu=self.cache_blocks_per_gpu,
            t_ext_s=self.t_ext_s,
            slo=self.slo,
        )


@dataclass(frozen=True)
class PolicySpec:
    kind: str
    composition: Composition | None = None

    @property
    def label(self) -> str:
        return self.kind if self.composition is None else f"{self.kind}:{self.composition}"
