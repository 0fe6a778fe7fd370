"""Policy kinds that ``vertumnus simulate --compare`` knows, and how to build each.

A kind maps to a builder ``(spec, trace, settings) -> Simulation``. Fixed-pool
kinds take the composition from the spec (``KIND:COMPOSITION``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from vertumnus.core.cachemanager import CacheManager
from vertumnus.core.policies import peers
from vertumnus.core.policies.base import Policy
from vertumnus.core.policies.simple import CacheFirst, LeastWork, LengthOnly, RoundRobin
from vertumnus.core.policies.vertumnus import CostModelPolicy
from vertumnus.sim.cachesim import attach_cache_manager
from vertumnus.sim.engine import PoolConfig, Simulation
from vertumnus.sim.reconfig import AdaptiveOptions, build_adaptive
from vertumnus.sim.settings import PolicySpec, RunSettings
from vertumnus.sim.traces import Trace

Builder = Callable[[PolicySpec, Trace, RunSettings], Simulation]


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


def _with_cache_manager(make_policy: Callable[[RunSettings], Policy]) -> Builder:
    """A fixed composition whose placements also feed the global prefix-cache manager."""

    def build(spec: PolicySpec, trace: Trace, settings: RunSettings) -> Simulation:
        assert spec.composition is not None
        sim = Simulation(
            settings.pool(spec.composition, trace.block_size),
            make_policy(settings),
            cache_manager=CacheManager(),
        )
        attach_cache_manager(sim)
        return sim

    return build


def _adaptive(spec: PolicySpec, trace: Trace, settings: RunSettings) -> Simulation:
    options = AdaptiveOptions(
        gpus=settings.gpus,
        initial=spec.composition,
        control=settings.planner,
        placement=settings.placement,
        cache_blocks_per_gpu=settings.cache_blocks_per_gpu,
        t_ext_s=settings.t_ext_s,
        slo=settings.slo,
    )

    def make_sim(pool: PoolConfig) -> Simulation:
        return Simulation(pool, CostModelPolicy(settings.placement), cache_manager=CacheManager())

    sim = build_adaptive(trace, settings.model, options, make_sim)
    attach_cache_manager(sim)
    return sim


def _cost_model(s: RunSettings) -> Policy:
    return CostModelPolicy(s.placement)


KINDS: Mapping[str, Kind] = MappingProxyType(
    {
        # Vertumnus
        "vertumnus": Kind(
            _with_cache_manager(_cost_model),
            "cost-model placement (design.md section 3) + global prefix-cache manager (section 6)",
        ),
        "vertumnus-nocm": Kind(
            _fixed(_cost_model), "cost-model placement, worker-local LRU caches only"
        ),
        "vertumnus-adaptive": Kind(
            _adaptive,
            "split/merge by window demand, cost model + cache manager; starts from the planner's "
            "pick, or from KIND:COMPOSITION if given (of --gpus GPUs)",
            needs_composition=False,
        ),
        # simple baselines
        "round-robin": Kind(_fixed(lambda s: RoundRobin()), "next worker in turn"),
        "least-work": Kind(
            _fixed(lambda s: LeastWork()), "least outstanding predicted work, cache-blind"
        ),
        "length-only": Kind(
            _fixed(lambda s: LengthOnly()),
            "prompts over 32K tokens to the largest degree, the rest to the smallest",
        ),
        "cache-first": Kind(
            _fixed(lambda s: CacheFirst()), "longest cached prefix, then least work"
        ),
        # peer routers, re-implemented from their public source (core/policies/peers/README.md)
        "least-requests": Kind(
            _fixed(lambda s: peers.LeastRequests()), "fewest in-flight requests"
        ),
        "sglang-cache-aware": Kind(
            _fixed(lambda s: peers.SGLangCacheAware(rng=random.Random(s.seed))),
            "SGLang router cache_aware: approximate radix trees + balance thresholds",
        ),
        "llm-d": Kind(
            _fixed(lambda s: peers.LLMD(rng=random.Random(s.seed))),
            "llm-d inference scheduler: prefix (approximate) + queue + kv-cache scorers",
        ),
        "llm-d-precise": Kind(
            _fixed(lambda s: peers.LLMD(mode="precise", rng=random.Random(s.seed))),
            "llm-d with the precise (KV-event) prefix scorer",
        ),
        "dynamo-kv": Kind(
            _fixed(lambda s: peers.DynamoKV(rng=random.Random(s.seed))),
            "NVIDIA Dynamo KV router: overlap-weighted prefill blocks + decode blocks",
        ),
        "preble": Kind(
            _fixed(lambda s: peers.Preble()), "Preble E2: exploit long matches, explore by load"
        ),
        "aibrix-conductor": Kind(
            _fixed(lambda s: peers.AIBrixConductor()),
            "AIBrix prefill scorer: estimated TTFT per pod",
        ),
        "vllm-kvaware": Kind(
            _fixed(lambda s: peers.VLLMKvaware()),
            "vLLM production-stack kvaware: longest match or lowest load",
        ),
    }
)
"""Every policy kind ``--compare`` accepts, by name (read-only)."""
