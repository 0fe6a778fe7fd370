"""The simulator: conservation, exact timing of a lone request, determinism."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vertumnus.core.keys import chain_block_hashes
from vertumnus.core.policies.simple import CacheFirst, LeastWork, LengthOnly, RoundRobin
from vertumnus.core.policies.vertumnus import CostModelPolicy
from vertumnus.core.types import Composition, Request
from vertumnus.sim.engine import PoolConfig, Simulation
from vertumnus.sim.registry import KINDS
from vertumnus.sim.runner import PolicySpec, RunSettings, run_policy
from vertumnus.sim.traces import load_trace

POLICIES = [CostModelPolicy, RoundRobin, LeastWork, LengthOnly, CacheFirst]


def pool(model, comp="2xCP4+1xCP8", **kw):
    return PoolConfig(Composition.parse(comp), model, block_size=512, **kw)


def test_lone_request_ttft_is_service_plus_t_ext(model):
    req = Request(0, 3.0, 20000, chain_block_hashes(range(40)))
    sim = Simulation(pool(model, "CP8", t_ext_s=0.07), CostModelPolicy())
    (c,) = sim.run([req]).completions
    assert c.ttft_s == pytest.approx(model.predict(8, 20000, 0) + 0.07, rel=1e-12)
    assert c.cached_tokens == 0


def test_second_request_reuses_the_prefix(model):
    blocks = list(range(10))
    a = Request(0, 0.0, 5000, chain_block_hashes(blocks))
    b = Request(1, 100.0, 5120, chain_block_hashes(blocks + [99]))
    sim = Simulation(pool(model, "CP4", t_ext_s=0.0), CostModelPolicy())
    ca, cb = sim.run([a, b]).completions
    assert cb.cached_tokens == min(10 * 512, 5120 - 1)
    assert cb.ttft_s == pytest.approx(model.predict(4, 5120 - cb.cached_tokens, cb.cached_tokens))


def test_queueing_adds_the_wait(model):
    r0 = Request(0, 0.0, 8000, chain_block_hashes([1] * 1 + list(range(100, 115))))
    r1 = Request(1, 0.0, 8000, chain_block_hashes(list(range(200, 216))))
    sim = Simulation(pool(model, "CP2", t_ext_s=0.0), CostModelPolicy())
    c0, c1 = sim.run([r0, r1]).completions
    e = model.predict(2, 8000, 0)
    assert c0.ttft_s == pytest.approx(e)
    assert c1.ttft_s == pytest.approx(2 * e)


def random_requests(draw_lengths, arrivals):
    reqs = []
    t = 0.0
    for i, (length, gap, family) in enumerate(
        zip(draw_lengths, arrivals[0], arrivals[1], strict=False)
    ):
        t += gap
        nblocks = -(-length // 512)
        reqs.append(
            Request(
                i,
                t,
                length,
                chain_block_hashes([family] * 2 + list(range(i * 1000, i * 1000 + nblocks - 2))),
            )
        )
    return reqs


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(1, 140000), min_size=1, max_size=60),
    st.lists(st.floats(0, 2), min_size=60, max_size=60),
    st.lists(st.integers(0, 3), min_size=60, max_size=60),
    st.sampled_from(POLICIES),
)
def test_every_request_completes_exactly_once(model, lengths, gaps, families, policy):
    reqs = random_requests(lengths, (gaps, families))
    res = Simulation(pool(model, cache_blocks_per_gpu=20), policy()).run(reqs)
    done = sorted(c.request_id for c in res.completions)
    # 140000 > 131072 tokens: too long for a CP1 worker but fits CP4/CP8, so nothing is rejected
    assert done == [r.id for r in reqs]
    assert res.rejected == []
    assert all(
        c.ttft_s >= model.predict(c.degree, c.length - c.cached_tokens, c.cached_tokens)
        for c in res.completions
    )


def test_too_long_for_every_worker_is_rejected_not_lost(model):
    reqs = [Request(0, 0.0, 200_000, chain_block_hashes(range(391))), Request(1, 0.0, 1000, (1, 2))]
    res = Simulation(pool(model, "CP1"), LeastWork()).run(reqs)
    assert res.rejected == [0]
    assert [c.request_id for c in res.completions] == [1]


def test_same_seed_same_results(model):
    trace = load_trace("synthetic:duration_s=60", seed=3)
    settings_ = RunSettings(model=model)
    runs = [
        run_policy(PolicySpec("vertumnus", Composition.parse("4xCP4+3xCP8")), trace, settings_)
        for _ in range(2)
    ]
    assert runs[0].result.completions == runs[1].result.completions
    other = load_trace("synthetic:duration_s=60", seed=4)
    assert (
        run_policy(
            PolicySpec("vertumnus", Composition.parse("4xCP4+3xCP8")), other, settings_
        ).result.completions
        != runs[0].result.completions
    )


def test_every_registered_fixed_kind_runs(model):
    trace = load_trace("synthetic:duration_s=30", seed=1)
    for kind, k in KINDS.items():
        if not k.needs_composition:
            continue
        run = run_policy(
            PolicySpec(kind, Composition.parse("2xCP4+1xCP8")), trace, RunSettings(model=model)
        )
        assert len(run.result.completions) == len(trace), kind
