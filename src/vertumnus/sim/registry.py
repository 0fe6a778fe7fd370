"""Policy kinds that ``vertumnus simulate --compare`` knows, and how to build each.

A kind maps to a builder ``(spec, trace, settings) -> Simulation``. Fixed-pool
kinds take the composition from the spec (``KIND:COMPOSITION``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vertumnus.core.policies.base import Policy
from vertumnus.core.policies.simple import CacheFirst, LeastWork, LengthOnly, RoundRobin
from vertumnus.core.policies.vertumnus import CostModelPolicy
from vertumnus.sim.engine import Simulation
from vertumnus.sim.traces import Trace

if TYPE_CHECKING:
    from vertumnus.sim.runner import PolicySpec, RunSettings

Builder = Callable[["PolicySpec", Trace, "RunSettings"], Simulation]


@dataclass(frozen=True)
class Kind:
    build: Builder
    description: str
    needs_composition: bool = True


def _fixed(make_policy: Callable[[RunSettings], Policy]) -> Builder:
    """A builder for a fixed composition served by one placement policy."""

    def build(spec: PolicySpec, trace: Trace, settings: RunSettings) -> Simulation:
        assert spec.composition is not None
        return Simulation(settings.pool(spec.composition, trace.block_size), make_policy(settings))

    return build


KINDS: dict[str, Kind] = {
    "vertumnus": Kind(
        _fixed(lambda s: CostModelPolicy(s.placement)),
        "CP-aware cost-model placement (design.md section 3)",
    ),
    "round-robin": Kind(_fixed(lambda s: RoundRobin()), "next worker in turn"),
    "least-work": Kind(_fixed(lambda s: LeastWork()), "least outstanding predicted work, cache-blind"),
    "length-only": Kind(
        _fixed(lambda s: LengthOnly()), "prompts over 32K tokens to the largest degree, the rest to the smallest"
    ),
    "cache-first": Kind(_fixed(lambda s: CacheFirst()), "longest cached prefix, then least work"),
}
