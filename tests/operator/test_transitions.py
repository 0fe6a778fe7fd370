"""Transition execution against the stand-in router (real gRPC on loopback).

Pins the recording discipline: every phase is recorded before its RPCs go out; a runner
rebuilt from any record (an operator restarted at any phase) completes each transition
exactly once, with the worker ids and epoch allocated the first time.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from vertumnus.core import planner
from vertumnus.core import transition as tr
from vertumnus.core.control import Controller
from vertumnus.core.lattice import layout_for
from vertumnus.core.types import Composition
from vertumnus.operator.events import MemoryEvents
from vertumnus.operator.metrics import OperatorMetrics
from vertumnus.operator.record import MemoryStore, Record
from vertumnus.operator.routerapi import RouterAdmin, Window
from vertumnus.operator.transitions import TransitionRunner
from vertumnus.profiles import load_capacity, load_model

from .fake_router import FakeRouter
from .promtext import scrape, series, value

CAPACITY = load_capacity("qwen3-30b-a3b/h200")


def _layout(text: str):
    return layout_for(Composition.parse(text), 8)


class Pods:
    """The domain pods' annotations, as the annotator writes them."""

    def __init__(self) -> None:
        self.grouping: dict[int, tuple] = {}
        self.calls = 0

    async def annotate(self, domain, grouping, epoch):
        self.calls += 1
        self.grouping[domain] = (epoch, tuple(grouping))


def _runner(record, store, router, events, pods, controller=None, metrics=None):
    admin = RouterAdmin([router.address], "tok")
    return TransitionRunner(
        record,
        store,
        lambda: admin,
        events,
        pods.annotate,
        controller=controller,
        retry_s=0.01,
        metrics=metrics,
    ), admin


@pytest.fixture
def router():
    with FakeRouter() as r:
        yield r


def _fresh(text: str) -> tuple[Record, MemoryStore]:
    record = Record(tr.initial_pool(_layout(text)))
    return record, MemoryStore(record)


def _rules_controller(layout):
    """A controller on ``layout`` with 1 s windows, the rules only (no model)."""
    return Controller(
        planner.initial_state(layout),
        CAPACITY,
        planner.PlannerSettings(window_s=1.0, domain_size=8, degrees=(4, 8), check_hops=1),
    )


def test_a_pinned_split_is_recorded_before_each_phase(router):
    record, store = _fresh("2xCP8")
    router.set_layout([(s.worker, s.degree, s.domain, s.offset) for s in record.pool.layout.slots])
    seen = {}
    router.on_drain = lambda w: seen.setdefault("drain", store.last.pool.transitions[0].phase)
    router.on_switch = lambda req: seen.setdefault("switch", store.last.pool.transitions[0].phase)
    events, pods = MemoryEvents(), Pods()

    async def go():
        runner, admin = _runner(record, store, router, events, pods)
        op = await runner.pin(Composition.parse("2xCP4+1xCP8"), (4, 8))
        assert op == planner.Split(1, "pinned composition")  # domain 0 already matches
        await runner.wait()
        await admin.close()
        return runner

    runner = asyncio.run(go())
    assert seen == {"drain": tr.Phase.DRAINING, "switch": tr.Phase.SWITCHING}
    assert [r.pool.transitions[0].phase for r in store.records[1:3]] == [
        tr.Phase.DRAINING,
        tr.Phase.SWITCHING,
    ]
    final = store.last
    assert final.pool.transitions == () and final.pool.epoch == 2
    assert str(final.pool.layout.composition) == "2xCP4+1xCP8"
    assert router.composition() == "2xCP4+1xCP8"
    assert [(s.epoch, s.domain, s.removed, s.kind) for s in router.applied] == [
        (2, 1, (1,), "split")
    ]
    assert pods.grouping[1][0] == 2 and [s.worker for s in pods.grouping[1][1]] == [2, 3]
    assert events.reasons() == ["Draining", "Switching", "Committed"]
    assert runner.record.last_transition["added"] == [2, 3]
    assert runner.record.last_transition["switchSeconds"] >= 0


@pytest.mark.parametrize("crash_after", [1, 2])
def test_a_restart_at_any_recorded_phase_completes_exactly_once(router, crash_after):
    """Run a merge until ``crash_after`` records exist (1: Draining, 2: Switching), drop the
    runner as a killed operator would, rebuild from the last record, resume."""
    record, store = _fresh("4xCP4")
    router.set_layout([(s.worker, s.degree, s.domain, s.offset) for s in record.pool.layout.slots])
    events, pods = MemoryEvents(), Pods()
    if crash_after == 1:
        router.hold_drains()
    else:  # the operator dies while the router works on the switch, which then takes effect
        router.hold_switches()

    async def first_life():
        runner, admin = _runner(record, store, router, events, pods)
        await runner.pin(Composition.parse("2xCP4+1xCP8"), (4, 8))
        # Until the phase is recorded *and* the router is at work on its call (the
        # record is written before the call is sent: on a loaded machine the call
        # may not have arrived yet).
        at_router: list = router.drains  # logged on arrival (a switch only once done)
        if crash_after == 2:
            at_router = []
            router.on_switch = at_router.append
        for _ in range(1000):
            if len(store.records) > crash_after and at_router:
                break
            await asyncio.sleep(0.01)
        await runner.close()
        await admin.close()

    asyncio.run(first_life())
    assert store.last.pool.transitions[0].phase is (
        tr.Phase.DRAINING if crash_after == 1 else tr.Phase.SWITCHING
    )
    router.on_switch = None
    router.release_drains()
    router.release_switches()

    async def second_life():
        runner, admin = _runner(store.last, store, router, events, pods)
        actions = runner.resume()
        assert len(actions) == 1
        await runner.wait()
        await admin.close()

    asyncio.run(second_life())
    final = store.last
    assert final.pool.transitions == () and final.pool.epoch == 2
    assert [s.worker for s in final.pool.layout.slots] == [
        0,
        1,
        4,
    ]  # the id allocated at the first begin
    assert len(router.applied) == 1 and router.applied[0].epoch == 2
    assert len(router.switches) == crash_after  # after a crash in Switching: one repeat
    assert events.reasons().count("Committed") == 1
    assert router.composition() == "2xCP4+1xCP8"


def test_the_controller_splits_under_load_and_merges_back(router):
    layout = _layout("2xCP8")
    settings = planner.PlannerSettings(window_s=1.0, domain_size=8, degrees=(4, 8), check_hops=1)
    controller = Controller(planner.initial_state(layout), CAPACITY, settings)
    record, store = _fresh("2xCP8")
    router.set_layout([(s.worker, s.degree, s.domain, s.offset) for s in layout.slots])
    events, pods = MemoryEvents(), Pods()
    metrics = OperatorMetrics()
    looks = 0

    async def go():
        nonlocal looks
        runner, admin = _runner(
            record, store, router, events, pods, controller, metrics.pool("ns", "elastic")
        )
        hop = 0

        async def hops(n, demand, requests, long_n, long_d):
            nonlocal hop, looks
            for _ in range(n):
                hop += 1
                router.set_demand(demand, requests, long_n, long_d)
                looks += await runner.decide(await admin.take_window(hop)) is not None
                await runner.wait()

        await hops(6, 3.0, 30, 0, 0.0)
        split = str(runner.record.pool.layout.composition)
        await hops(12, 0.1, 30, 30, 0.1)
        merged = str(runner.record.pool.layout.composition)
        await admin.close()
        return split, merged

    split, merged = asyncio.run(go())
    assert split == "4xCP4"
    assert merged == "2xCP8"
    reasons = events.reasons()
    assert reasons.count("Committed") == 4 and "Split" in reasons and "Merge" in reasons
    assert store.last.controller is not None and store.last.controller.pending == ()
    assert store.last.hop == 18
    # What Prometheus reads: every look timed, each commit counted with its recorded parts.
    s = scrape(metrics)
    at = {"namespace": "ns", "pool": "elastic"}
    assert looks > 0 and value(s, "vertumnus_controller_decision_seconds_count", **at) == looks
    assert value(s, "vertumnus_reconfigurations_total", **at, kind="split") == 2
    assert value(s, "vertumnus_reconfigurations_total", **at, kind="merge") == 2
    assert value(s, "vertumnus_reconfiguration_total_seconds_count", **at, kind="merge") == 2
    assert value(s, "vertumnus_reconfiguration_total_seconds_sum", **at, kind="merge") > 0
    assert value(s, "vertumnus_controller_kappa", **at, degree="8") > 0


def _listing_pool(router, **settings):
    """A ``4xCP4`` pool whose controller has the prefill model (1 s windows, one look
    each, ``settings`` over them), and a router that lists 12 placements every hop:
    (controller, record, store)."""
    layout = _layout("4xCP4")
    ps = planner.PlannerSettings(
        window_s=1.0, domain_size=8, degrees=(4, 8), check_hops=1, min_requests=4, **settings
    )
    controller = Controller(planner.initial_state(layout), CAPACITY, ps, load_model(), None, 16)
    record, store = _fresh("4xCP4")
    router.set_layout([(s.worker, s.degree, s.domain, s.offset) for s in layout.slots])
    router.set_demand(0.5, 12)
    router.set_placed([(i / 12, 6000, 0, tuple(range(100 * i, 100 * i + 375))) for i in range(12)])
    return controller, record, store


def test_the_runner_records_the_what_if_check_of_the_listed_placements(router):
    controller, record, store = _listing_pool(router)
    events, pods = MemoryEvents(), Pods()
    metrics = OperatorMetrics()

    async def go():
        runner, admin = _runner(
            record, store, router, events, pods, controller, metrics.pool("ns", "p")
        )
        for hop in (1, 2):
            await runner.decide(await admin.take_window(hop))
            await runner.wait()
        await admin.close()

    asyncio.run(go())
    check = store.last.last_check
    assert check is not None and check["hop"] == 2
    assert check["verdict"] in ("agree", "extend", "veto", "trigger", "wait", "stay", "damped")
    assert check["current"]["composition"] == "4xCP4" and check["current"]["mean_s"] > 0
    assert check["candidates"], "the neighbours along the split and merge paths"
    # The controller's memory is recorded with the planner's state at every hop.
    assert store.last.memory == controller.memory()
    assert store.last.memory.evaluations == 2
    s = scrape(metrics)
    verdicts = series(s, "vertumnus_controller_whatif_total")
    assert sum(value(s, "vertumnus_controller_whatif_total", **v) for v in verdicts) == 2
    assert (
        value(
            s,
            "vertumnus_controller_whatif_total",
            namespace="ns",
            pool="p",
            verdict=check["verdict"],
        )
        >= 1
    )


def test_the_runner_records_the_shadow_pools_comparisons(router):
    """With the routers reporting their workers' cache size, the listed placements feed
    the shadow pools, and ``status.lastCheck`` carries their comparisons."""
    controller, record, store = _listing_pool(router, shadow_warmup_s=0.0)
    router.cache_blocks_per_gpu = 4000
    events, pods = MemoryEvents(), Pods()

    async def go():
        runner, admin = _runner(record, store, router, events, pods, controller)
        for hop in (1, 2, 3):
            await runner.decide(await admin.take_window(hop))
            await runner.wait()
        await admin.close()

    asyncio.run(go())
    assert controller.shadows is not None and controller.shadows.cache_blocks_per_gpu == 4000
    check = store.last.last_check
    assert check is not None and check["hop"] == 3
    compared = {c["composition"]: c for c in check["shadow"]}
    # The neighbours along the split and merge paths, each on the 12 requests of each
    # hop since they began (at the first hop's look).
    assert compared and "4xCP4" not in compared
    assert all(c["requests"] == 24 and c["span_s"] > 0 for c in compared.values()), compared


class Ticks:
    """A monotonic clock the test moves."""

    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_look_that_decides_nothing_is_recorded_at_most_every_record_looks_s(router):
    """Each write is a PATCH of the status; a look comes every 2.5 s. A look that
    decides nothing waits up to ``record_looks_s`` (its hop goes on in memory, so the
    next take is the next hop); a look that changes a streak, or starts a split, is
    recorded at once, the split before anything goes out; a stopping pool flushes."""
    layout = _layout("2xCP8")
    controller = _rules_controller(layout)
    record, store = _fresh("2xCP8")
    router.set_layout([(s.worker, s.degree, s.domain, s.offset) for s in layout.slots])
    ticks = Ticks()
    pods = Pods()

    async def go():
        admin = RouterAdmin([router.address], "tok")
        runner = TransitionRunner(
            record,
            store,
            lambda: admin,
            MemoryEvents(),
            pods.annotate,
            controller=controller,
            retry_s=0.01,
            record_looks_s=30.0,
            monotonic=ticks,
        )

        async def look(hop, at):
            ticks.now = at
            tick = await runner.decide(await admin.take_window(hop))
            await runner.wait()
            return tick

        router.set_demand(0.5, 10)  # light and steady: the rules ask for nothing
        await look(1, 1.0)  # no memory recorded yet: written
        assert len(store.records) == 2 and store.last.hop == 1
        for hop in range(2, 12):
            await look(hop, float(hop))
        assert len(store.records) == 2 and store.last.hop == 1
        assert runner.record.hop == 11 and runner.unrecorded
        assert [hop for hop, _ in router.takes] == list(range(1, 12))
        await look(12, 31.0)  # 30 s since the last write
        assert len(store.records) == 3 and store.last.hop == 12 and not runner.unrecorded
        assert store.last.memory == controller.memory() and store.last.memory.evaluations == 12
        assert store.last.last_check is None  # the rules alone: no what-if check to show

        await look(13, 32.0)
        assert len(store.records) == 3 and runner.unrecorded
        await runner.flush()  # the operator stops
        assert len(store.records) == 4 and store.last.hop == 13 and not runner.unrecorded
        await runner.flush()
        assert len(store.records) == 4  # nothing new

        router.set_demand(3.0, 30)  # over capacity: the rules' split streak starts
        await look(14, 33.0)
        assert controller.state.split_streak == 1
        assert len(store.records) == 5 and store.last.controller == controller.state
        for hop in range(15, 21):
            tick = await look(hop, 33.0 + hop)
            if tick is not None and tick.ops:
                break
        assert tick is not None and tick.ops, "the split began"
        # Recorded in Draining, at the look that began it, before the drain went out.
        began = next(r for r in store.records if r.pool.transitions)
        assert began.hop == hop and began.pool.transitions[0].phase == tr.Phase.DRAINING
        await admin.close()

    asyncio.run(go())
    assert str(store.last.pool.layout.composition) != "2xCP8"


def test_a_restarted_operators_controller_takes_its_memory_from_the_record():
    """PoolRuntime builds the controller from the record: the planner's state and the
    controller's memory as recorded; after a reshaping by hand, the planner starts over
    and the memory keeps only what happened (flaps, the last move)."""
    from vertumnus.core.memory import Memory
    from vertumnus.operator import crd
    from vertumnus.operator.pool import PoolRuntime

    spec = crd.parse_spec({"gpus": 16, "engine": {"image": "img"}})
    layout = _layout("2xCP8")
    memory = Memory(
        evaluations=90,
        flaps=(40, 77),
        last_move=("split", 77),
        streak=("merge", 1),
        lean=("merge", (0.01,)),
        goal=None,
    )
    record = Record(tr.initial_pool(layout), planner.initial_state(layout), memory, hop=90)
    runtime = PoolRuntime(None, "p", "ns", "uid", admin_key=b"k" * 32)
    restored = runtime._controller(record, spec, CAPACITY)
    assert restored is not None and restored.memory() == memory
    assert restored.state == record.controller
    # The pool was reshaped by hand since (its layout is not the planner's).
    reshaped = Record(tr.initial_pool(_layout("4xCP4")), record.controller, memory, hop=90)
    again = runtime._controller(reshaped, spec, CAPACITY)
    assert again is not None and again.state == planner.initial_state(_layout("4xCP4"))
    assert again.memory() == memory.without_plans()
    assert again.memory().flaps == (40, 77) and again.memory().streak == ("", 0)


def test_a_window_is_summed_over_replicas():
    with FakeRouter() as a, FakeRouter() as b:
        a.set_demand(1.0, 10, 2, 0.5)
        b.set_demand(2.0, 5, 1, 1.0)
        a.cache_blocks_per_gpu, b.cache_blocks_per_gpu = 900, 800

        async def go() -> Window:
            admin = RouterAdmin([a.address, b.address], "tok")
            w = await admin.take_window(7)
            again = await admin.take_window(7)
            await admin.close()
            assert again == w  # a repeated hop answers the same
            return w

        w = asyncio.run(go())
    assert (w.demand_s, w.requests, w.long_requests, w.long_demand_s, w.replicas) == (
        3.0,
        15,
        3,
        1.5,
        2,
    )
    assert w.cache_blocks_per_gpu == 800  # the least: a shadow never holds more than a worker


def test_an_operation_by_hand_restarts_the_planner_from_the_new_layout(router):
    layout = _layout("2xCP8")
    controller = _rules_controller(layout)
    record, store = _fresh("2xCP8")
    router.set_layout([(s.worker, s.degree, s.domain, s.offset) for s in layout.slots])
    events, pods = MemoryEvents(), Pods()

    async def go():
        runner, admin = _runner(record, store, router, events, pods, controller)
        assert not await runner.manual(planner.Split(7))  # no such worker: refused, said
        assert await runner.manual(planner.Split(1, "by hand"))
        await runner.wait()
        await admin.close()

    asyncio.run(go())
    assert events.events[0][:2] == ("Warning", "TransitionRefused")
    assert "worker 7 is not in the pool" in events.events[0][2]
    assert str(store.last.pool.layout.composition) == "2xCP4+1xCP8"
    assert controller.state.layout == store.last.pool.layout and controller.state.pending == ()
    assert store.last.controller == controller.state


def test_a_failed_worker_is_replaced_in_its_place_and_the_planner_starts_over(router):
    """A router reports worker 1 FAILED: the runner drains it, switches the domain to a
    new worker of the same degree at the same GPUs (kind ``replace``), commits, and the
    planner restarts from the new layout."""
    layout = _layout("2xCP4+1xCP8")
    controller = _rules_controller(layout)
    record, store = _fresh("2xCP4+1xCP8")
    router.set_layout([(s.worker, s.degree, s.domain, s.offset) for s in layout.slots])
    failed = next(s for s in layout.slots if s.degree == 4 and s.offset == 4)
    router.fail_worker(failed.worker, "its SGLang server (pid 9) exited with code 7")
    events, pods = MemoryEvents(), Pods()

    async def go():
        runner, admin = _runner(record, store, router, events, pods, controller)
        reported = await admin.failed_workers()
        assert await runner.replace(failed.worker, reported[failed.worker])
        await runner.wait()
        await admin.close()
        return reported

    reported = asyncio.run(go())
    assert reported == {failed.worker: "its SGLang server (pid 9) exited with code 7"}
    (switch,) = router.applied
    assert switch.kind == "replace" and switch.removed == (failed.worker,)
    new = record.pool.next_worker
    assert (new, 4, failed.domain, 4) in switch.grouping
    assert [w for w, _ in router.drains] == [failed.worker]
    last = store.last.last_transition
    assert last["kind"] == "replace" and last["removed"] == [failed.worker]
    assert last["added"] == [new] and "exited with code 7" in last["reason"]
    assert str(store.last.pool.layout.composition) == "2xCP4+1xCP8"
    assert store.last.pool.layout.slot(new).offset == 4
    assert controller.state.layout == store.last.pool.layout and controller.state.pending == ()
    assert failed.worker not in router.workers and not router.workers[new].failure
    assert pods.grouping[failed.domain][0] == 2  # the pod's annotations follow


def test_replacements_of_one_place_back_off_and_start_over():
    from vertumnus.core.lattice import Slot
    from vertumnus.operator.repairs import Repairs

    r = Repairs(base_s=30.0, max_s=120.0, reset_s=1000.0, every_s=2.0)
    place, other = Slot(1, 4, 0, 4), Slot(5, 4, 1, 0)
    assert r.due(0.0) and not r.due(1.0) and r.due(2.0)
    assert r.may_replace(place, 0.0)
    r.replaced(place, 0.0)
    # The new worker in the same place (a new id) failed again: 30 s, then 60, 120, 120.
    same_place = Slot(9, 4, 0, 4)
    assert not r.may_replace(same_place, 29.0) and r.may_replace(same_place, 30.0)
    assert r.may_replace(other, 1.0)  # another place is not held back
    r.replaced(same_place, 30.0)
    assert not r.may_replace(place, 89.0) and r.may_replace(place, 90.0)
    r.replaced(place, 90.0)
    assert not r.may_replace(place, 209.0) and r.may_replace(place, 210.0)
    r.replaced(place, 210.0)
    assert not r.may_replace(place, 329.0) and r.may_replace(place, 330.0)  # at most 120 s
    assert r.may_replace(place, 210.0 + 1001.0)  # not replaced for reset_s: starts over
    r.seen({9: (same_place, "exited with code 7")})
    (problem,) = r.problems()
    assert problem.reason == "WorkerFailed" and "worker 9 (CP4, domain 0)" in problem.message
    r.seen({})
    assert r.problems() == []


@contextlib.contextmanager
def _two_replicas(composition: str):  # type: ignore[no-untyped-def]
    """Two stand-in router replicas serving a fresh pool of ``composition``: (a, b, its
    record, its store)."""
    with FakeRouter() as a, FakeRouter() as b:
        record, store = _fresh(composition)
        slots = [(s.worker, s.degree, s.domain, s.offset) for s in record.pool.layout.slots]
        a.set_layout(slots)
        b.set_layout(slots)
        yield a, b, record, store


def test_a_router_restarted_between_the_drain_and_the_switch_is_drained_again():
    # Two router replicas. Replica b restarts after the drain, before the switch reaches
    # it: it rebuilt its workers from the engines, so the leaving worker serves there again
    # and b refuses the switch (FAILED_PRECONDITION, as the router does). The runner drains
    # it again and the switch goes through; retrying the switch alone would never end.
    with _two_replicas("2xCP8") as (a, b, record, store):
        restarted: list[int] = []

        def restart_once(request) -> None:  # type: ignore[no-untyped-def]
            if not restarted:
                restarted.append(request.epoch)
                b.restart()

        b.on_switch = restart_once
        events, pods = MemoryEvents(), Pods()

        async def go() -> None:
            admin = RouterAdmin([a.address, b.address], "tok")
            runner = TransitionRunner(
                record, store, lambda: admin, events, pods.annotate, retry_s=0.01
            )
            assert await runner.manual(planner.Split(1, "by hand"))
            await asyncio.wait_for(runner.wait(), 10.0)
            await admin.close()

        asyncio.run(go())
        assert restarted == [2]
        assert [w for w, _ in b.drains] == [1, 1]  # drained, restarted, drained again
        assert str(store.last.pool.layout.composition) == "2xCP4+1xCP8"
        assert a.composition() == b.composition() == "2xCP4+1xCP8"
        assert events.reasons() == ["Draining", "Switching", "Committed"]


def test_the_workers_a_merge_removes_are_drained_again_together():
    # As above, for a merge: both leaving workers serve again at the restarted replica,
    # and each drain waits for its running prefill, so they are sent together. Replica
    # b holds its drains after the restart: both must arrive while held.
    with _two_replicas("2xCP4+1xCP8") as (a, b, record, store):
        pair = tuple(s.worker for s in record.pool.layout.slots if s.degree == 4)
        restarted: list[int] = []

        def restart_once(request) -> None:  # type: ignore[no-untyped-def]
            if not restarted:
                restarted.append(len(b.drains))
                b.hold_drains()
                b.restart()

        b.on_switch = restart_once
        events, pods = MemoryEvents(), Pods()

        async def go() -> list[int]:
            admin = RouterAdmin([a.address, b.address], "tok")
            runner = TransitionRunner(
                record, store, lambda: admin, events, pods.annotate, retry_s=0.01
            )
            assert await runner.manual(planner.Merge(pair, "by hand"))  # type: ignore[arg-type]
            for _ in range(500):
                again = [w for w, _ in b.drains[restarted[0] :]] if restarted else []
                if len(again) == 2:
                    break
                await asyncio.sleep(0.01)
            b.release_drains()
            await asyncio.wait_for(runner.wait(), 10.0)
            await admin.close()
            return again

        again = asyncio.run(go())
        assert sorted(again) == sorted(pair)  # both sent before either was answered
        assert str(store.last.pool.layout.composition) == "2xCP8"
        assert a.composition() == b.composition() == "2xCP8"


def test_placed_rows_read_packed_columns_and_an_older_routers_messages_alike():
    """A router sends a hop's placements as packed columns; one from before sent a message
    per placement, and one from before whatif_held no workers. The operator reads any of
    them (or both) into the same rows, with worker -1 where none was sent, and refuses
    columns whose key counts or workers do not add up."""
    from vertumnus._proto import pool_pb2
    from vertumnus.operator.routerapi import placed_rows

    rows = [(0.5, 32, 16, (1, 2), -1), (0.75, 48, 0, (3, 4, 5), -1), (1.0, 8, 0, (), -1)]
    old = pool_pb2.WindowReport(
        placed=[
            pool_pb2.PlacedRequest(offset_seconds=o, length=n, cached_tokens=c, block_keys=k)
            for o, n, c, k, _ in rows
        ]
    )
    new = pool_pb2.WindowReport(
        placed_columns=pool_pb2.PlacedColumns(
            offset_seconds=[r[0] for r in rows],
            length=[r[1] for r in rows],
            cached_tokens=[r[2] for r in rows],
            key_counts=[len(r[3]) for r in rows],
            block_keys=[k for r in rows for k in r[3]],
        )
    )
    assert placed_rows(old) == placed_rows(new) == rows
    both = pool_pb2.WindowReport(placed=old.placed, placed_columns=new.placed_columns)
    assert placed_rows(both) == rows + rows
    new.placed_columns.worker.extend([3, 0, 3])
    assert [r[4] for r in placed_rows(new)] == [3, 0, 3]
    new.placed_columns.worker.append(1)
    with pytest.raises(ValueError, match="4 workers for 3 rows"):
        placed_rows(new)
    del new.placed_columns.worker[:]
    new.placed_columns.block_keys.append(9)
    with pytest.raises(ValueError, match="key counts sum to 5, there are 6 keys"):
        placed_rows(new)
