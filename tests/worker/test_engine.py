"""The engine over real gloo process groups: exactness, regrouping, block copies, errors.

One pool of 4 rank processes (float64, the seeded tiny model) is shared by
the module and regrouped by the tests, as the operator would.
"""

from __future__ import annotations

import pytest
import torch
from vertumnus.worker.blocks import block_keys
from vertumnus.worker.engine import Engine, InvalidRequest, NotReady
from vertumnus.worker.rank import RankSpec
from vertumnus.worker.reference import reference_hidden
from vertumnus.worker.verify import run_verify

from .conftest import random_tokens

BLOCK = 8


@pytest.fixture(scope="module")
def engine():
    spec = RankSpec(dtype="float64", block_size=BLOCK, num_blocks=64, seed=7)
    with Engine(4, [4], spec, max_tokens=512) as e:
        yield e


def regroup(engine: Engine, degrees: list[int]) -> float:
    for w in list(engine.workers):
        engine.drain(w)
    return engine.switch_epoch(engine.epoch + 1, degrees)


def test_verify_degrees_1_2_4_with_unaligned_prefix_and_odd_batch():
    report = run_verify([1, 2, 4], tokens=37, prefix=45, block_size=BLOCK, seed=3)
    assert report["passed"], report
    for degree in ("2", "4"):
        entry = report["degrees"][degree]
        assert entry["max_abs_diff"] <= 1e-9
        assert entry["prefix_max_abs_diff"] <= 1e-9
        assert entry["cached_tokens"] == [40, 40, 40, 40]  # 45 tokens = 5 whole blocks
    assert report["batch_lengths"] == [37, 13, 3, 1]


def test_cp4_batch_matches_reference(engine, tiny64):
    regroup(engine, [4])
    batch = [random_tokens(n, seed=100 + n) for n in (29, 8, 1, 50)]
    futures = [engine.submit(0, f"r{i}", t, return_hidden=True) for i, t in enumerate(batch)]
    for f, tokens in zip(futures, batch, strict=True):
        out = f.result()
        ref = reference_hidden(tiny64, tokens)
        assert (out.hidden - ref).abs().max().item() < 1e-9
        assert out.first_token == int(tiny64.logits(ref[-1]).argmax())
        assert out.degree == 4 and out.epoch == engine.epoch


def test_regroup_cp4_to_2xcp2_to_cp4_keeps_weights_and_prefixes(engine, tiny64):
    regroup(engine, [4])
    prompts = [random_tokens(64, seed=200 + i) for i in range(3)]
    before = [engine.prefill(0, f"p{i}", p) for i, p in enumerate(prompts)]
    assert all(o.cached_tokens == 0 for o in before)

    split_s = regroup(engine, [2, 2])
    assert [(s.first, s.degree) for s in engine.grouping()] == [(0, 2), (2, 2)]
    _, served = engine.list_blocks(0)
    keys2 = block_keys(prompts[2], BLOCK)
    assert sorted(j for j, k in enumerate(keys2) if k in served) == [0, 1, 4, 5]  # positions 0, 1 mod 4
    # Under CP2 each child keeps the blocks its ranks held: ranks 0,1 own positions
    # 0,1 mod 4, so the prefix is whole only up to block 2 until a copy arrives.
    out = engine.prefill(0, "half", prompts[0])
    assert out.cached_tokens == 2 * BLOCK and out.first_token == before[0].first_token
    report = engine.copy_blocks(2, 0, block_keys(prompts[1], BLOCK))
    assert report.copied_blocks > 0 and report.bytes == report.copied_blocks * engine.block_bytes
    out = engine.prefill(0, "copied", prompts[1])
    assert out.cached_tokens == 63 and out.first_token == before[1].first_token

    merge_s = regroup(engine, [4])
    after = [engine.prefill(0, f"again{i}", p, return_hidden=True) for i, p in enumerate(prompts)]
    assert [o.first_token for o in after] == [o.first_token for o in before]
    assert all(o.cached_tokens == 63 for o in after)  # whole prefixes reused after the merge
    for o, p in zip(after, prompts, strict=True):
        assert (o.hidden - reference_hidden(tiny64, p)[63:]).abs().max().item() < 1e-9
    assert split_s < 5 and merge_s < 5


@pytest.mark.parametrize("path", [(2, 1, 1)], ids=["cp2-cp1"])
def test_block_copies_round_trip_byte_exact(engine, path):
    regroup(engine, list(path))  # workers 0 (CP2), 2 (CP1), 3 (CP1)
    prompt = random_tokens(80, seed=300)
    keys = block_keys(prompt, BLOCK)
    engine.prefill(0, "src", prompt)
    original = engine.read_blocks(0, keys)
    assert set(original) == set(keys)

    inter = engine.copy_blocks(0, 2, keys)  # CP2 -> CP1: re-partitioned
    assert inter.copied_blocks == len(keys) and inter.skipped_blocks == 0
    intra = engine.copy_blocks(2, 3, keys)  # CP1 -> CP1
    assert intra.copied_blocks == len(keys)
    for worker in (2, 3):
        copy = engine.read_blocks(worker, keys)
        assert all(torch.equal(copy[k], original[k]) for k in keys)

    again = engine.copy_blocks(0, 2, keys)  # nothing missing: nothing moves
    assert again.copied_blocks == 0 and again.skipped_blocks == len(keys)

    engine.evict_blocks(0, keys[3:])
    back = engine.copy_blocks(3, 0, keys)  # CP1 -> CP2: only the evicted blocks
    assert back.copied_blocks == len(keys) - 3
    restored = engine.read_blocks(0, keys)
    assert all(torch.equal(restored[k], original[k]) for k in keys)
    assert engine.prefill(0, "reuse", prompt).cached_tokens == 79


def test_bad_requests_are_refused_and_the_engine_keeps_serving(engine):
    regroup(engine, [2, 2])
    with pytest.raises(InvalidRequest, match="token_ids is empty"):
        engine.prefill(0, "empty", [])
    with pytest.raises(InvalidRequest, match="513 tokens exceed the engine maximum of 512"):
        engine.prefill(0, "long", [1] * 513)
    with pytest.raises(InvalidRequest, match="token id 999 outside the vocabulary"):
        engine.prefill(0, "vocab", [1, 999])
    lacking = block_keys(random_tokens(32, seed=400), BLOCK)
    with pytest.raises(NotReady, match="source worker 2 lacks 4 of the 4 requested blocks"):
        engine.copy_blocks(2, 0, lacking)
    with pytest.raises(NotReady, match="no worker starts at rank 1"):
        engine.prefill(1, "nobody", [1, 2])
    with pytest.raises(NotReady, match="must be drained"):
        engine.switch_epoch(engine.epoch + 1, [4])
    with pytest.raises(NotReady, match="not newer"):
        engine.switch_epoch(engine.epoch, [2, 2])
    with pytest.raises(ValueError, match="cannot start at rank 1"):
        engine.switch_epoch(engine.epoch + 1, [1, 2, 1])
    engine.drain(2)
    with pytest.raises(NotReady, match="draining"):
        engine.prefill(2, "drained", [1, 2])
    engine.resume(2)
    assert engine.prefill(2, "fine", [1, 2, 3]).first_token >= 0
    assert engine.prefill(0, "fine", [1, 2, 3]).first_token >= 0


def test_cache_events_report_stored_and_removed_blocks(engine):
    regroup(engine, [4])
    events = engine.subscribe()
    try:
        prompt = random_tokens(40, seed=500)
        keys = block_keys(prompt, BLOCK)
        engine.prefill(0, "ev", prompt)
        stored = [events.get(timeout=5) for _ in range(4)]  # 5 blocks over 4 ranks
        assert {e.kind for e in stored} == {"stored"} and {e.worker for e in stored} == {0}
        by_rank = {e.rank: e for e in stored}
        assert by_rank[0].block_keys == (keys[0], keys[4]) and by_rank[0].positions == (0, 4)
        assert by_rank[3].block_keys == (keys[3],)
        engine.evict_blocks(0, keys[4:])
        removed = events.get(timeout=5)
        assert (removed.kind, removed.block_keys, removed.rank) == ("removed", (keys[4],), 0)
    finally:
        engine.unsubscribe(events)
