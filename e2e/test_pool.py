"""The pool end to end, with real processes: CP engines on CPU ranks, the router, real gRPC clients.

Every fault test counts requests in and out and says what was lost (nothing).
Run with ``python -m pytest e2e/test_pool.py`` (no Kubernetes needed).
"""

from __future__ import annotations

import asyncio
import time

import e2e_pool_support as ps
import grpc
import pytest

from vertumnus._proto import pool_pb2, pool_pb2_grpc
from vertumnus.core import planner
from vertumnus.core import transition as tr
from vertumnus.core.control import Controller
from vertumnus.core.keys import token_block_keys
from vertumnus.core.lattice import Layout, Slot
from vertumnus.operator.controller import feed
from vertumnus.operator.events import MemoryEvents
from vertumnus.operator.record import MemoryStore, Record
from vertumnus.operator.routerapi import RouterAdmin
from vertumnus.operator.transitions import TransitionRunner
from vertumnus.profiles import load_capacity, load_model
from vertumnus.router.serve import start_router
from vertumnus.router.settings import RouterSettings


@pytest.fixture(scope="module")
def engine(tmp_path_factory):  # type: ignore[no-untyped-def]
    """One engine of 4 ranks: workers 0 (CP2, ranks 0-1), 2 (CP1) and 3 (CP1)."""
    e = ps.Engine(4, [2, 1, 1], tmp_path_factory.mktemp("engine") / "engine.log").start()
    yield e
    e.stop()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A single-rank engine: the first tokens every degree must reproduce."""
    e = ps.Engine(1, [1], tmp_path_factory.mktemp("ref") / "ref.log").start()
    yield e
    e.stop()


def settings(**kw) -> RouterSettings:  # type: ignore[no-untyped-def]
    base = dict(listen=f"127.0.0.1:{ps.free_base(1)}", metrics_listen="", profile="cpu-tiny")
    base.update(kw)
    return RouterSettings(**base)


async def _send(stub, rid: str, tokens, timeout: float = 120.0):  # type: ignore[no-untyped-def]
    return await stub.Prefill(
        pool_pb2.PrefillRequest(request_id=rid, token_ids=tokens), timeout=timeout
    )


async def _queued_burst(router, stub, prefix: str, items) -> list[asyncio.Task]:  # type: ignore[no-untyped-def]
    """Send every prompt at once; return once the router has admitted them all (placed,
    or already answered: the first can finish before the last arrives), as the tasks
    that wait for their answers."""
    sent = [asyncio.create_task(_send(stub, f"{prefix}{i}", t)) for i, t in enumerate(items)]
    deadline = time.monotonic() + 60.0
    while router.in_flight() + _answered(router) < len(items):
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the router admitted {router.in_flight() + _answered(router):.0f} "
                f"of {len(items)} requests in 60 s"
            )
        await asyncio.sleep(0.002)
    return sent


def _answered(router) -> float:  # type: ignore[no-untyped-def]
    """Requests the router has answered, whatever the outcome."""
    return sum(
        s.value
        for m in router.metrics.registry.collect()
        if m.name == "vertumnus_router_requests"
        for s in m.samples
        if s.name == "vertumnus_router_requests_total"
    )


def _moved(router) -> float | None:  # type: ignore[no-untyped-def]
    """The router's count of queued requests placed on another worker."""
    return router.metrics.registry.get_sample_value("vertumnus_router_requests_moved_total")


def test_first_tokens_through_the_router_equal_a_single_rank_engines(engine, reference) -> None:
    items = ps.prompts(12, seed=1)

    async def scenario():  # type: ignore[no-untyped-def]
        running = await start_router(settings(), [engine.address])
        try:
            async with grpc.aio.insecure_channel(running.address) as ch:
                stub = pool_pb2_grpc.PrefillStub(ch)
                first = [await _send(stub, f"a{i}", t) for i, t in enumerate(items)]
                # again: now with cached prefixes on whichever workers hold them
                again = await asyncio.gather(
                    *(_send(stub, f"b{i}", t) for i, t in enumerate(items))
                )
            return first, again
        finally:
            await running.stop()

    first, again = asyncio.run(scenario())
    want = [reference.first_token(0, t, f"ref{i}") for i, t in enumerate(items)]
    assert [r.first_token_id for r in first] == want
    assert [r.first_token_id for r in again] == want
    assert {r.degree for r in [*first, *again]} >= {1, 2}  # both degrees served some
    assert sum(r.cached_tokens for r in again) > 0


def test_bad_requests_are_refused_naming_the_field(engine) -> None:
    async def scenario():  # type: ignore[no-untyped-def]
        running = await start_router(settings(), [engine.address])
        out = {}
        try:
            async with grpc.aio.insecure_channel(running.address) as ch:
                stub = pool_pb2_grpc.PrefillStub(ch)
                admin = pool_pb2_grpc.AdminStub(ch)
                cases = {
                    "empty": ("e1", []),
                    "vocab": ("e2", [1, 2, 999]),
                    "negative": ("e3", [-1]),
                    "id": ("", [1, 2]),
                    "id-chars": ("a b", [1, 2]),
                    "long": ("e4", [1] * 2049),
                }
                for name, (rid, toks) in cases.items():
                    try:
                        await _send(stub, rid, toks)
                    except grpc.aio.AioRpcError as e:
                        out[name] = (e.code(), e.details())
                for name, call in {
                    "drain-unknown": admin.Drain(pool_pb2.DrainRequest(worker=77)),
                    "split-unknown": admin.Reconfigure(pool_pb2.ReconfigureRequest(split=77)),
                    "no-op": admin.Reconfigure(pool_pb2.ReconfigureRequest()),
                }.items():
                    try:
                        await call
                    except grpc.aio.AioRpcError as e:
                        out[name] = (e.code(), e.details())
                # The router still serves.
                ok = await _send(stub, "fine", [1, 2, 3])
        finally:
            await running.stop()
        # A router whose transitions an operator runs refuses to split behind its back.
        operated = await start_router(settings(external_controller=True), [engine.address])
        try:
            async with grpc.aio.insecure_channel(operated.address) as ch:
                admin = pool_pb2_grpc.AdminStub(ch)
                worker = (await admin.GetPool(pool_pb2.GetPoolRequest())).workers[0].worker
                try:
                    await admin.Reconfigure(pool_pb2.ReconfigureRequest(split=worker))
                except grpc.aio.AioRpcError as e:
                    out["split-operated"] = (e.code(), e.details())
        finally:
            await operated.stop()
        return out, ok

    out, ok = asyncio.run(scenario())
    bad = grpc.StatusCode.INVALID_ARGUMENT
    assert out["empty"] == (bad, "token_ids: empty (request e1)")
    assert out["vocab"] == (
        bad,
        "token_ids[2]: 999 is outside the vocabulary [0, 256) (request e2)",
    )
    assert out["negative"][0] == bad and "token_ids[0]: -1" in out["negative"][1]
    assert out["id"][0] == bad and out["id"][1].startswith("request_id:")
    assert out["id-chars"][0] == bad and "request_id:" in out["id-chars"][1]
    assert out["long"] == (
        bad,
        "token_ids: 2049 tokens, more than the pool's maximum of 2048 (request e4)",
    )
    assert out["drain-unknown"] == (grpc.StatusCode.NOT_FOUND, "worker 77 is not in the pool")
    assert out["split-unknown"] == (
        grpc.StatusCode.NOT_FOUND,
        "split: worker 77 is not in the pool",
    )
    assert out["split-operated"][0] == grpc.StatusCode.FAILED_PRECONDITION
    assert "operator" in out["split-operated"][1]
    assert out["no-op"][0] == bad
    assert ok.first_token_id >= 0


def test_overload_is_refused_with_resource_exhausted_and_nothing_is_lost(engine) -> None:
    items = ps.prompts(60, seed=2, extra=200)

    async def scenario():  # type: ignore[no-untyped-def]
        running = await start_router(settings(admission_limit=4), [engine.address])
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, running.router.in_flight())
                await asyncio.sleep(0.001)

        watcher = asyncio.create_task(watch())
        try:
            async with grpc.aio.insecure_channel(running.address) as ch:
                stub = pool_pb2_grpc.PrefillStub(ch)
                results = await asyncio.gather(
                    *(_send(stub, f"o{i}", t) for i, t in enumerate(items)), return_exceptions=True
                )
            left = running.router.in_flight()
        finally:
            watcher.cancel()
            await running.stop()
        return results, peak, left

    results, peak, left = asyncio.run(scenario())
    ok = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(ok) + len(refused) == len(items)  # every request answered, one way or the other
    assert refused and all(r.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for r in refused)
    assert "admission limit" in refused[0].details()
    assert len(ok) >= 4 and peak <= 4 and left == 0


def test_splits_and_merges_under_steady_load_lose_no_request_and_serve_none_twice(engine) -> None:
    items = ps.prompts(240, seed=3)

    async def scenario():  # type: ignore[no-untyped-def]
        running = await start_router(settings(), [engine.address])
        router = running.router
        served: list[str] = []
        try:
            async with grpc.aio.insecure_channel(running.address) as ch:
                stub = pool_pb2_grpc.PrefillStub(ch)

                async def client(i: int, tokens) -> None:  # type: ignore[no-untyped-def]
                    await asyncio.sleep(i * 0.04)  # ~25 requests/s, open loop
                    r = await _send(stub, f"s{i}", tokens)
                    served.append(r.request_id)

                async def reconfigure() -> None:
                    target = 0
                    for _ in range(3):  # 3 splits and 3 merges of worker `target` (CP2)
                        await asyncio.sleep(1.0)
                        commit = await router.reconfigure(planner.Split(target))
                        await asyncio.sleep(1.0)
                        merged = await router.reconfigure(planner.Merge(tuple(commit.new_ids)))
                        target = merged.new_ids[0]

                await asyncio.gather(reconfigure(), *(client(i, t) for i, t in enumerate(items)))
            return served, list(router.transitions_done), router.pool.epoch
        finally:
            await running.stop()

    served, transitions, epoch = asyncio.run(scenario())
    assert sorted(served) == sorted(f"s{i}" for i in range(len(items)))  # none lost, none twice
    assert [t["kind"] for t in transitions] == ["split", "merge"] * 3
    assert epoch == 1 + 6
    for t in transitions:
        assert t["switch_s"] < 1.0 and t["total_s"] < 30.0


def test_a_commit_moves_what_queued_during_the_split_to_the_new_workers(tmp_path) -> None:
    # Worker 0 (CP2) splits while a burst of requests waits: the drain sends its
    # queue to workers 2 and 3 (CP1), and at the commit the router places what
    # still waits there again, so the two new CP1 workers take a share.
    e = ps.Engine(4, [2, 1, 1], tmp_path / "e.log").start()
    items = ps.prompts(40, seed=21, extra=600)
    try:

        async def scenario():  # type: ignore[no-untyped-def]
            running = await start_router(settings(), [e.address])
            router = running.router
            try:
                async with grpc.aio.insecure_channel(running.address) as ch:
                    stub = pool_pb2_grpc.PrefillStub(ch)
                    sent = await _queued_burst(router, stub, "m", items)
                    commit = await router.reconfigure(planner.Split(0))
                    answers = await asyncio.gather(*sent)
                moved = _moved(router)
                assert router.transitions_done[-1]["moved"] == moved
                return answers, commit, moved, router.in_flight()
            finally:
                await running.stop()

        answers, commit, moved, left = asyncio.run(scenario())
    finally:
        e.stop()
    assert sorted(r.request_id for r in answers) == sorted(f"m{i}" for i in range(len(items)))
    assert left == 0 and all(r.attempts == 1 for r in answers)  # moved, never retried
    assert moved and moved > 0
    by_new = [r for r in answers if r.worker in commit.new_ids]
    # Every request was in the router before the split began; the new workers
    # served the ones the commit moved to them.
    assert len(by_new) >= moved * 0.5 and by_new
    assert {r.epoch for r in by_new} == {commit.epoch}


def test_a_resumed_worker_takes_a_share_of_the_queue_built_without_it(tmp_path) -> None:
    # Worker 0 is drained (as an operator does before a split it then abandons);
    # a burst queues at worker 1. When worker 0 resumes, the router places what
    # still waits at worker 1 again, and worker 0 takes a share.
    e = ps.Engine(2, [1, 1], tmp_path / "e.log", worker_ids=[0, 1]).start()
    items = ps.prompts(30, seed=22, extra=600)
    try:

        async def scenario():  # type: ignore[no-untyped-def]
            running = await start_router(settings(), [e.address])
            router = running.router
            try:
                await router.drain(0, wait=False)
                async with grpc.aio.insecure_channel(running.address) as ch:
                    stub = pool_pb2_grpc.PrefillStub(ch)
                    sent = await _queued_burst(router, stub, "q", items)
                    await router.drain(0, resume=True)
                    answers = await asyncio.gather(*sent)
                moved = _moved(router)
                return answers, moved, router.in_flight()
            finally:
                await running.stop()

        answers, moved, left = asyncio.run(scenario())
    finally:
        e.stop()
    assert sorted(r.request_id for r in answers) == sorted(f"q{i}" for i in range(len(items)))
    assert left == 0 and all(r.attempts == 1 for r in answers)
    assert moved and moved > 0
    assert sum(1 for r in answers if r.worker == 0) >= 0.5 * moved


def test_a_killed_engines_requests_are_placed_again_and_complete(tmp_path) -> None:
    a = ps.Engine(2, [2], tmp_path / "a.log", worker_ids=[0]).start()
    b = ps.Engine(2, [1, 1], tmp_path / "b.log", worker_ids=[10, 11]).start()
    items = ps.prompts(120, seed=4, extra=600)
    try:

        async def scenario():  # type: ignore[no-untyped-def]
            running = await start_router(
                settings(worker_forget_s=1.0, worker_retry_s=0.2), [a.address, b.address]
            )
            router = running.router
            answers: dict[str, object] = {}
            try:
                async with grpc.aio.insecure_channel(running.address) as ch:
                    stub = pool_pb2_grpc.PrefillStub(ch)

                    async def client(i: int, tokens) -> None:  # type: ignore[no-untyped-def]
                        # All within ~0.25 s, far faster than B alone serves, so a
                        # queue forms on however quick a machine (at 0.01 s apart a
                        # quick one kept up, and B was idle when killed).
                        await asyncio.sleep(i * 0.002)
                        try:
                            answers[f"k{i}"] = await _send(stub, f"k{i}", tokens)
                        except grpc.aio.AioRpcError as e:
                            answers[f"k{i}"] = e

                    async def crash() -> None:
                        # Only B serves at first (A drained), so it builds a queue;
                        # then A admits again and B dies while it runs requests.
                        await router.drain(0, wait=False)
                        busy = [router.workers[w] for w in (10, 11)]
                        for _ in range(20_000):  # at most ~10 s
                            if any(w.running is not None and w.queue for w in busy):
                                break
                            await asyncio.sleep(0.0005)
                        else:
                            raise AssertionError("B never held a queue: nothing to kill it under")
                        await router.drain(0, resume=True)
                        b.kill()

                    await asyncio.gather(crash(), *(client(i, t) for i, t in enumerate(items)))
                await asyncio.sleep(1.5)  # past worker_forget_s
                held = {w: len(router.store.worker_keys(w)) for w in (10, 11)}
                return answers, held
            finally:
                await running.stop()

        answers, held = asyncio.run(scenario())
    finally:
        b.kill()
        a.stop()
    errors = {k: v for k, v in answers.items() if isinstance(v, BaseException)}
    assert not errors, errors  # nothing lost: every request completed somewhere
    assert len(answers) == len(items)
    replaced = [r for r in answers.values() if r.attempts > 1]  # type: ignore[union-attr]
    assert replaced and all(r.worker == 0 for r in replaced)  # type: ignore[union-attr]
    late = [answers[f"k{i}"] for i in range(len(items) - 20, len(items))]
    assert all(r.worker == 0 for r in late)  # type: ignore[union-attr]
    assert held == {10: 0, 11: 0}  # the dead engine's workers left the index


def test_flush_and_restart_of_an_engine_keep_the_index_true(tmp_path) -> None:
    e = ps.Engine(2, [1, 1], tmp_path / "e.log", worker_ids=[0, 1]).start()
    items = ps.prompts(16, seed=5)
    try:

        async def scenario():  # type: ignore[no-untyped-def]
            running = await start_router(settings(worker_retry_s=0.2), [e.address])
            router = running.router
            try:
                async with grpc.aio.insecure_channel(running.address) as ch:
                    stub = pool_pb2_grpc.PrefillStub(ch)
                    for i, t in enumerate(items):
                        await _send(stub, f"f{i}", t)
                    await asyncio.sleep(0.5)
                    before = {w: set(router.store.worker_keys(w)) for w in (0, 1)}
                    truth = {w: e.served(w) for w in (0, 1)}
                    e.flush(0)  # CLEARED: worker 0's entries must go
                    await asyncio.sleep(0.5)
                    flushed = set(router.store.worker_keys(0))
                    # A restarted engine (new incarnation) with an empty cache.
                    e.kill()
                    e.start()
                    await asyncio.sleep(3.0)
                    restarted = {w: set(router.store.worker_keys(w)) for w in (0, 1)}
                    r = await _send(stub, "after", items[0])
                    counts = {w: f.counts for w, f in router.followers.items()}
                return before, truth, flushed, restarted, r, counts
            finally:
                await running.stop()

        before, truth, flushed, restarted, r, counts = asyncio.run(scenario())
    finally:
        e.stop()
    assert before == truth and before[0]  # the index was exactly the workers' contents
    assert flushed == set()
    assert restarted == {0: set(), 1: set()}  # stale entries of the old incarnation dropped
    assert r.cached_tokens == 0  # nothing cached after the restart, and the router knew it
    assert counts[0].drops >= 2 and counts[1].drops >= 1  # the clear and the restart, counted


def test_the_routers_controller_runs_the_what_if_check_on_real_requests(tmp_path) -> None:
    """The router's own controller (``vertumnus up``) feeds the check the requests it
    placed: each window with enough of them gets a verdict, and whatever it decides,
    every request is answered once. With ``learn_capacity`` it also turns the
    requests' TTFTs into capacity samples and exports the κ its rules read; with
    ``shadow`` its shadow pools, sized as the engine's caches, serve the requests."""
    e = ps.Engine(2, [2], tmp_path / "engine.log").start()
    control = planner.PlannerSettings(
        window_s=1.0,
        domain_size=2,
        degrees=(1, 2),
        min_requests=5,
        learn_capacity=True,
        shadow=True,
    )

    async def scenario():  # type: ignore[no-untyped-def]
        running = await start_router(settings(controller=control), [e.address])
        try:
            async with grpc.aio.insecure_channel(running.address) as ch:
                stub = pool_pb2_grpc.PrefillStub(ch)
                answers = []
                for burst in range(4):  # four windows' worth of short bursts
                    calls = [
                        _send(stub, f"w{burst}-{i}", [(7 * i + j) % 200 + 1 for j in range(24)])
                        for i in range(12)
                    ]
                    answers += await asyncio.gather(*calls)
                    await asyncio.sleep(1.0)
            registry = running.router.metrics.registry
            verdicts = {
                s.labels["verdict"]: s.value
                for m in registry.collect()
                if m.name == "vertumnus_controller_whatif"
                for s in m.samples
                if s.name.endswith("_total")
            }
            kappa = {
                s.labels["degree"]: s.value
                for m in registry.collect()
                if m.name == "vertumnus_controller_kappa"
                for s in m.samples
            }
            controller = running.router.controller
            assert controller is not None and controller.shadows is not None
            blocks = running.router.engine_info[0].cache_blocks_per_rank
            assert controller.shadows.cache_blocks_per_gpu == blocks > 0
            served = {str(c): len(s.ttfts) for c, s in controller.shadows.shadows.items()}
            assert len(served) > 1 and all(n > 0 for n in served.values()), served
            return answers, verdicts, kappa, controller.learner.samples  # type: ignore[union-attr]
        finally:
            await running.stop()

    try:
        answers, verdicts, kappa, samples = asyncio.run(scenario())
    finally:
        e.stop()
    assert len(answers) == 48 and all(a.first_token_id >= 0 for a in answers)
    assert samples >= 2  # windows whose requests all finished became samples
    shipped = load_capacity("cpu-tiny").kappa_per_s
    assert set(kappa) == {str(d) for d in shipped} and all(k > 0 for k in kappa.values())
    assert sum(verdicts.values()) >= 2, verdicts  # windows with >= 5 requests were checked
    assert set(verdicts) <= {"agree", "extend", "veto", "trigger", "wait", "stay", "shadow-veto"}


def test_an_operator_run_pools_router_reports_capacity_sums_the_controller_learns_from(
    engine,
) -> None:
    """Without a controller of its own the router reports, with every ``TakeWindow``, its
    capacity sums per (hop, degree): the placements of the hop and the completions since
    (each against its τ on the worker's degree), and it counts long requests by its own
    ``long_threshold``. It also lists the hop's first placements one by one (arrival
    offset, length, cached tokens, block keys). The operator's client sums the
    replicas; the operator's controller turns the sums into κ samples and replays the
    listed placements in its what-if check."""
    items = ps.prompts(12, seed=4)
    threshold = sorted(len(t) for t in items)[8]  # three or so of the twelve are "long"

    async def scenario():  # type: ignore[no-untyped-def]
        running = await start_router(settings(long_threshold=threshold), [engine.address])
        admin = RouterAdmin([running.address], "no-token-needed")
        try:
            async with grpc.aio.insecure_channel(running.address) as ch:
                stub = pool_pb2_grpc.PrefillStub(ch)
                await asyncio.gather(*(_send(stub, f"c{i}", t) for i, t in enumerate(items)))
            first = await admin.take_window(1)
            again = await admin.take_window(1)  # a retried take answers the same
            second = await admin.take_window(2)
            layout = running.router.pool.layout  # type: ignore[union-attr]
            return first, again, second, layout
        finally:
            await admin.close()
            await running.stop()

    first, again, second, layout = asyncio.run(scenario())
    assert first.capacity == again.capacity
    assert first.long_requests == sum(len(t) > threshold for t in items) > 0
    assert sum(p.requests for p in first.capacity) == 12
    assert sum(p.done for p in first.capacity) == 12  # all answered within the hop
    assert all(p.hop == 1 and 0 <= p.met_tokens <= p.tokens for p in first.capacity)
    assert {p.degree for p in first.capacity} <= {s.degree for s in layout.slots}
    assert second.capacity == []
    # The listed placements: every request once, with its own length and block keys.
    assert first.placed == again.placed and second.placed == []
    assert first.placed_left_out == 0
    assert sorted(length for _, length, _, _, _ in first.placed) == sorted(len(t) for t in items)
    block = engine.block_size
    assert sorted(keys for _, _, _, keys, _ in first.placed) == sorted(
        token_block_keys(t, block) for t in items
    )
    assert all(
        offset >= 0 and 0 <= cached < length for offset, length, cached, _, _ in first.placed
    )
    # ... each on one of the pool's workers (whatif_held starts the replays there).
    assert {worker for *_, worker in first.placed} <= {s.worker for s in layout.slots}
    degrees = tuple(d for d in (1, 2, 4, 8) if d <= layout.domain_size)
    ps_ = planner.PlannerSettings(
        window_s=1.0,
        check_hops=1,
        learn_capacity=True,
        min_requests=5,
        domain_size=layout.domain_size,
        degrees=degrees,
    )
    ctl = Controller(
        planner.initial_state(layout),
        load_capacity("cpu-tiny"),
        ps_,
        load_model("cpu-tiny"),
        None,
        block,
    )
    tick = feed(ctl, first, layout, in_flight=False)
    assert ctl.learner is not None and ctl.learner.samples == len(
        {p.degree for p in first.capacity}
    )
    assert tick is not None and tick.whatif is not None
    assert tick.whatif.current.requests == 12


def test_an_operator_drains_again_at_a_router_restarted_between_drain_and_switch(
    tmp_path,
) -> None:
    # The operator drained worker 0 for a split and recorded its Switching phase; then the
    # router restarted. It rebuilt its workers from the engine, so worker 0 serves there
    # again, and it refuses the switch until that worker is drained. The operator's runner,
    # resumed from the record, drains it again and completes the split.
    e = ps.Engine(4, [4], tmp_path / "e.log", worker_ids=[0]).start()
    r = ps.RouterProcess([e.address], tmp_path / "r.log").start()
    try:
        seen = ps.pool(r.address)
        layout = Layout(
            tuple(Slot(w.worker, w.degree, w.domain, w.offset) for w in seen.workers), 4
        )
        pool, t, _ = tr.begin(tr.initial_pool(layout, seen.epoch), planner.Split(0, "by hand"))

        async def drain() -> bool:
            admin = RouterAdmin([r.address], "no-token-needed")
            try:
                return await admin.drain(0, 30.0)
            finally:
                await admin.close()

        assert asyncio.run(drain())
        pool, _ = tr.drained(pool, t.id, 0)
        store = MemoryStore(Record(pool))
        r.stop()
        r.start()
        assert ps.pool(r.address).workers[0].state == pool_pb2.WorkerStatus.SERVING
        with grpc.insecure_channel(r.address) as ch:  # the router's side of the contract
            switch = pool_pb2.SwitchRequest(
                epoch=seen.epoch + 1,
                domain=0,
                grouping=[
                    pool_pb2.Slot(worker=w, degree=2, domain=0, offset=o)
                    for w, o in ((1, 0), (2, 2))
                ],
                removed=[0],
                kind="split",
            )
            with pytest.raises(grpc.RpcError) as refused:
                pool_pb2_grpc.AdminStub(ch).Switch(switch, timeout=30)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "not drained" in (refused.value.details() or "")

        async def resumed() -> Record:
            admin = RouterAdmin([r.address], "no-token-needed")
            events = MemoryEvents()

            async def annotate(domain, grouping, epoch) -> None:  # type: ignore[no-untyped-def]
                pass

            runner = TransitionRunner(
                store.last, store, lambda: admin, events, annotate, retry_s=0.05
            )
            try:
                assert len(runner.resume()) == 1
                await asyncio.wait_for(runner.wait(), 60.0)
            finally:
                await admin.close()
            assert events.reasons() == ["Committed"]
            return store.last

        final = asyncio.run(resumed())
        assert final.pool.transitions == () and final.pool.epoch == seen.epoch + 1
        after = ps.pool(r.address)
        assert after.composition == str(final.pool.layout.composition) == "2xCP2"
        assert after.epoch == seen.epoch + 1
    finally:
        r.stop()
        e.stop()
