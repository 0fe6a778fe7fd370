"""The engine over real gloo process groups: exactness, regrouping, ids, epochs, copies, errors.

One pool of 4 rank processes (float64, the seeded tiny model) is shared by
the module and regrouped by the tests, as the operator would. Degree lists
give the default ids (first ranks); explicit Slots give pool-level ids.
"""

from __future__ import annotations

import pytest
import torch

from vertumnus.core.lattice import Slot
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


def regroup(engine: Engine, grouping: list[int] | list[Slot]) -> float:
    for w in list(engine.workers):
        engine.drain(w)
    return engine.switch_epoch(engine.epoch + 1, grouping).seconds


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
    assert engine.grouping() == [Slot(0, 2, 0, 0), Slot(2, 2, 0, 2)]  # default ids: first ranks
    served = {b.key for b in engine.list_blocks(0).served}
    keys2 = block_keys(prompts[2], BLOCK)
    assert sorted(j for j, k in enumerate(keys2) if k in served) == [
        0,
        1,
        4,
        5,
    ]  # positions 0, 1 mod 4
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


def test_a_merge_reconciles_a_prefix_one_half_held_by_copying_between_its_own_ranks(engine, tiny64):
    regroup(engine, [2, 2])
    prompt = random_tokens(64, seed=901)  # a prompt of its own: the engine is shared
    first = engine.prefill(2, "right-half", prompt)  # cached on ranks 2, 3 only
    assert first.cached_tokens == 0
    regroup(engine, [4])
    keys = block_keys(prompt, BLOCK)
    served = {b.key for b in engine.list_blocks(0).served}
    # Under CP4 rank r owns positions r mod 4: ranks 2, 3 hold positions 0..7 for
    # the CP2 geometry (their own 0, 1 mod 2), i.e. owners only for 2, 3 mod 4.
    assert sorted(j for j, k in enumerate(keys) if k in served) == [2, 3, 6, 7]
    report = engine.copy_blocks(0, 0, keys)  # source == destination: its own ranks
    assert report.copied_blocks == 4 and report.skipped_blocks == 4
    out = engine.prefill(0, "reconciled", prompt, return_hidden=True)
    assert out.cached_tokens == 63 and out.first_token == first.first_token
    assert (out.hidden - reference_hidden(tiny64, prompt)[63:]).abs().max().item() < 1e-9


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
    with pytest.raises(
        NotReady, match=r"no worker 1 in epoch \d+; workers: \[0: CP2 at rank 0, 2: CP2 at rank 2\]"
    ):
        engine.prefill(1, "nobody", [1, 2])
    with pytest.raises(
        NotReady, match=r"worker 0 \(CP2, ranks 0-1\), worker 2 \(CP2, ranks 2-3\) must be drained"
    ):
        engine.switch_epoch(engine.epoch + 1, [4])
    with pytest.raises(ValueError, match="cannot start at rank 1"):
        engine.switch_epoch(engine.epoch + 1, [1, 2, 1])
    engine.drain(2)
    with pytest.raises(NotReady, match="draining"):
        engine.prefill(2, "drained", [1, 2])
    engine.resume(2)
    assert engine.prefill(2, "fine", [1, 2, 3]).first_token >= 0
    assert engine.prefill(0, "fine", [1, 2, 3]).first_token >= 0


def test_explicit_ids_are_the_workers_names_and_epochs_are_idempotent(engine):
    regroup(engine, [2, 2])
    prompt = random_tokens(33, seed=600)
    first = engine.prefill(0, "before", prompt)
    ids = [Slot(21, 2, 0, 2), Slot(20, 2, 0, 0)]  # same geometry, new pool-level ids
    epoch = engine.epoch + 1
    regroup(engine, ids)
    assert engine.grouping() == [Slot(20, 2, 0, 0), Slot(21, 2, 0, 2)] and engine.epoch == epoch
    assert engine.worker_at(0).slot.worker == 20 and engine.worker_at(1) is None
    assert engine.worker_of(1).slot.worker == 20
    out = engine.prefill(20, "after", prompt)
    assert (out.worker, out.epoch, out.first_token) == (20, epoch, first.first_token)
    assert out.cached_tokens == 32  # the blocks stayed on the ranks
    with pytest.raises(NotReady, match="no worker 0 in epoch"):
        engine.prefill(0, "old-id", prompt)

    # a controller resuming after a restart commits the same epoch again: nothing changes
    again = engine.switch_epoch(epoch, list(reversed(ids)))
    assert again.unchanged and again.epoch == epoch and not engine.worker(20).draining
    assert engine.prefill(21, "still", [1, 2, 3]).epoch == epoch
    with pytest.raises(
        NotReady, match=rf"epoch {epoch - 1} is older than the current epoch {epoch}"
    ):
        engine.switch_epoch(epoch - 1, ids)
    with pytest.raises(
        NotReady,
        match=rf"epoch {epoch} is already in force with grouping \[20: CP2 at rank 0, 21: CP2 at rank 2\]; "
        r"grouping \[20: CP4 at rank 0\] needs a newer epoch",
    ):
        engine.switch_epoch(epoch, [Slot(20, 4, 0, 0)])

    # a worker kept unchanged keeps serving while its neighbour regroups
    engine.drain(21)
    report = engine.switch_epoch(
        epoch + 1, [Slot(20, 2, 0, 0), Slot(22, 1, 0, 2), Slot(23, 1, 0, 3)]
    )
    assert not report.unchanged
    assert engine.prefill(20, "kept", prompt).cached_tokens == 32
    assert engine.prefill(22, "new", [4, 5, 6]).degree == 1
